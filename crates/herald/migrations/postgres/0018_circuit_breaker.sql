-- The per-endpoint circuit breaker (herald_policy::breaker): its state
-- (0 closed, 1 open, 2 half-open), since when, until when it is open, the
-- latest opening's cooldown, the process that won the half-open probe,
-- and the sliding window's two fixed-window counters.
ALTER TABLE endpoints ADD COLUMN circuit_state SMALLINT NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN circuit_since BIGINT;
ALTER TABLE endpoints ADD COLUMN circuit_until BIGINT;
ALTER TABLE endpoints ADD COLUMN circuit_cooldown_ms BIGINT NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN circuit_probe_by TEXT;
ALTER TABLE endpoints ADD COLUMN circuit_window_at BIGINT NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN circuit_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN circuit_failures INTEGER NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN circuit_prev_attempts INTEGER NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN circuit_prev_failures INTEGER NOT NULL DEFAULT 0;
-- The dispatchers' view reads the non-closed breakers only.
CREATE INDEX endpoints_circuit_broken ON endpoints(id) WHERE circuit_state <> 0;
