-- Herald's SQLite schema. Times are Unix milliseconds. Ids are prefixed
-- ULIDs, so ordering by id is ordering by creation time.

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
) STRICT;

CREATE TABLE applications (
    id         TEXT PRIMARY KEY,
    uid        TEXT UNIQUE,
    name       TEXT NOT NULL,
    rate_limit INTEGER,
    metadata   TEXT NOT NULL DEFAULT '{}',
    created_at INTEGER NOT NULL,
    updated_at INTEGER NOT NULL
) STRICT;

CREATE TABLE endpoints (
    id           TEXT PRIMARY KEY,
    app_id       TEXT NOT NULL REFERENCES applications(id) ON DELETE CASCADE,
    uid          TEXT,
    url          TEXT NOT NULL,
    description  TEXT NOT NULL DEFAULT '',
    filter_types TEXT,            -- JSON array, NULL = every event type
    disabled     INTEGER NOT NULL DEFAULT 0,
    rate_limit   INTEGER,
    metadata     TEXT NOT NULL DEFAULT '{}',
    secret       TEXT NOT NULL,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL,
    UNIQUE (app_id, uid)
) STRICT;
CREATE INDEX endpoints_by_app ON endpoints(app_id, id);
-- The claim skips disabled endpoints; this keeps that lookup off a full scan.
CREATE INDEX endpoints_disabled ON endpoints(id) WHERE disabled = 1;

CREATE TABLE messages (
    id         TEXT PRIMARY KEY,
    app_id     TEXT NOT NULL REFERENCES applications(id) ON DELETE CASCADE,
    event_type TEXT NOT NULL,
    event_id   TEXT,
    payload    TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    UNIQUE (app_id, event_id)
) STRICT;
-- Retention walks old messages oldest first.
CREATE INDEX messages_by_age ON messages(created_at);

-- state: 0 pending, 1 delivering, 2 delivered, 3 dead.
-- For a delivering row next_attempt_at is the lease's end, so one index
-- serves both "due" and "lease expired" (the crash path).
CREATE TABLE deliveries (
    id               TEXT PRIMARY KEY,
    msg_id           TEXT NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    endpoint_id      TEXT NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    app_id           TEXT NOT NULL,
    state            INTEGER NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  INTEGER NOT NULL,
    lease_token      TEXT,
    cycle_started_at INTEGER NOT NULL,
    cycle_base       INTEGER NOT NULL DEFAULT 0,
    manual           INTEGER NOT NULL DEFAULT 0,
    dead_reason      TEXT,
    last_status      INTEGER,
    last_error       TEXT,
    created_at       INTEGER NOT NULL,
    updated_at       INTEGER NOT NULL
) STRICT;
-- The claim index holds live rows only: finished deliveries leave it, so a
-- growing history does not slow the claim.
CREATE INDEX deliveries_due ON deliveries(next_attempt_at) WHERE state < 2;
CREATE INDEX deliveries_by_msg ON deliveries(msg_id);
CREATE INDEX deliveries_by_endpoint ON deliveries(endpoint_id, msg_id);
CREATE INDEX deliveries_dead ON deliveries(app_id, id) WHERE state = 3;
-- Retention finds dead deliveries past their own retention by age.
CREATE INDEX deliveries_dead_by_age ON deliveries(updated_at) WHERE state = 3;

CREATE TABLE attempts (
    id             TEXT PRIMARY KEY,
    delivery_id    TEXT NOT NULL,
    msg_id         TEXT NOT NULL,
    endpoint_id    TEXT NOT NULL,
    app_id         TEXT NOT NULL,
    url            TEXT NOT NULL,
    attempt_number INTEGER NOT NULL,
    started_at     INTEGER NOT NULL,
    duration_ms    INTEGER NOT NULL,
    status_code    INTEGER,
    response       TEXT NOT NULL DEFAULT '',
    error          TEXT,
    success        INTEGER NOT NULL,
    manual         INTEGER NOT NULL
) STRICT;
CREATE INDEX attempts_by_msg ON attempts(msg_id, id);
CREATE INDEX attempts_by_endpoint ON attempts(endpoint_id, id);
