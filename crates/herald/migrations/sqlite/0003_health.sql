-- Endpoint health. The streak columns are kept current by every batch of
-- outcomes, so reading an endpoint's health never scans its attempts.
ALTER TABLE endpoints ADD COLUMN fail_streak INTEGER NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN streak_started_at INTEGER;   -- first failure of the streak
ALTER TABLE endpoints ADD COLUMN last_success_at INTEGER;
ALTER TABLE endpoints ADD COLUMN last_error TEXT;
ALTER TABLE endpoints ADD COLUMN last_error_at INTEGER;
ALTER TABLE endpoints ADD COLUMN disabled_reason TEXT;
ALTER TABLE endpoints ADD COLUMN disabled_at INTEGER;
-- 'auto' (Herald disabled it: new messages are still routed to it and held)
-- or 'operator' (API, dashboard, CLI: nothing new is routed while disabled).
ALTER TABLE endpoints ADD COLUMN disabled_by TEXT;
-- The dashboard lists failing endpoints first.
CREATE INDEX endpoints_by_streak ON endpoints(fail_streak DESC, id);

-- Attempt counts and a latency histogram per endpoint per 5-minute bucket:
-- the 1 h and 24 h figures read at most 288 rows per endpoint.
-- h0..h11 count attempts whose duration is at most 10, 25, 50, 100, 250,
-- 500, 1000, 2500, 5000, 10000, 30000 ms, and above (h11).
CREATE TABLE endpoint_stats (
    endpoint_id TEXT NOT NULL,
    bucket      INTEGER NOT NULL,   -- start of the 5-minute bucket, ms
    attempts    INTEGER NOT NULL DEFAULT 0,
    successes   INTEGER NOT NULL DEFAULT 0,
    failures    INTEGER NOT NULL DEFAULT 0,
    latency_sum INTEGER NOT NULL DEFAULT 0,
    h0 INTEGER NOT NULL DEFAULT 0, h1 INTEGER NOT NULL DEFAULT 0, h2 INTEGER NOT NULL DEFAULT 0,
    h3 INTEGER NOT NULL DEFAULT 0, h4 INTEGER NOT NULL DEFAULT 0, h5 INTEGER NOT NULL DEFAULT 0,
    h6 INTEGER NOT NULL DEFAULT 0, h7 INTEGER NOT NULL DEFAULT 0, h8 INTEGER NOT NULL DEFAULT 0,
    h9 INTEGER NOT NULL DEFAULT 0, h10 INTEGER NOT NULL DEFAULT 0, h11 INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint_id, bucket)
) STRICT;
-- Retention drops old buckets by age.
CREATE INDEX endpoint_stats_by_age ON endpoint_stats(bucket);
-- Dead letters across applications, newest first (dashboard and CLI).
CREATE INDEX deliveries_dead_all ON deliveries(id) WHERE state = 3;
