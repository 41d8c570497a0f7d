-- Herald's PostgreSQL schema: the same tables as migrations/sqlite/, in
-- PostgreSQL types. Times are Unix milliseconds (BIGINT). Ids are prefixed
-- ULIDs, so ordering by id is ordering by creation time: id columns use the
-- "C" collation so that holds whatever the database's default collation.
-- No schema-qualified names: this runs under the store's search_path.

CREATE TABLE settings (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);

CREATE TABLE applications (
    id         TEXT COLLATE "C" PRIMARY KEY,
    uid        TEXT UNIQUE,
    name       TEXT NOT NULL,
    rate_limit INTEGER,
    metadata   JSONB NOT NULL DEFAULT '{}',
    created_at BIGINT NOT NULL,
    updated_at BIGINT NOT NULL
);

CREATE TABLE endpoints (
    id           TEXT COLLATE "C" PRIMARY KEY,
    app_id       TEXT COLLATE "C" NOT NULL REFERENCES applications(id) ON DELETE CASCADE,
    uid          TEXT,
    url          TEXT NOT NULL,
    description  TEXT NOT NULL DEFAULT '',
    filter_types JSONB,           -- JSON array, NULL = every event type
    disabled     BOOLEAN NOT NULL DEFAULT FALSE,
    rate_limit   INTEGER,
    metadata     JSONB NOT NULL DEFAULT '{}',
    secret       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL,
    UNIQUE (app_id, uid)
);
CREATE INDEX endpoints_by_app ON endpoints(app_id, id);
-- The claim skips disabled endpoints; this keeps that lookup off a full scan.
CREATE INDEX endpoints_disabled ON endpoints(id) WHERE disabled;

CREATE TABLE messages (
    id         TEXT COLLATE "C" PRIMARY KEY,
    app_id     TEXT COLLATE "C" NOT NULL REFERENCES applications(id) ON DELETE CASCADE,
    event_type TEXT NOT NULL,
    event_id   TEXT,
    payload    TEXT NOT NULL,
    created_at BIGINT NOT NULL,
    UNIQUE (app_id, event_id)
);
-- Retention walks old messages oldest first.
CREATE INDEX messages_by_age ON messages(created_at);

-- state: 0 pending, 1 delivering, 2 delivered, 3 dead.
-- For a delivering row next_attempt_at is the lease's end, so one index
-- serves both "due" and "lease expired" (the crash path).
CREATE TABLE deliveries (
    id               TEXT COLLATE "C" PRIMARY KEY,
    msg_id           TEXT COLLATE "C" NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
    endpoint_id      TEXT COLLATE "C" NOT NULL REFERENCES endpoints(id) ON DELETE CASCADE,
    app_id           TEXT COLLATE "C" NOT NULL,
    state            SMALLINT NOT NULL,
    attempts         INTEGER NOT NULL DEFAULT 0,
    next_attempt_at  BIGINT NOT NULL,
    lease_token      TEXT,
    cycle_started_at BIGINT NOT NULL,
    cycle_base       INTEGER NOT NULL DEFAULT 0,
    manual           BOOLEAN NOT NULL DEFAULT FALSE,
    dead_reason      TEXT,
    last_status      INTEGER,
    last_error       TEXT,
    created_at       BIGINT NOT NULL,
    updated_at       BIGINT NOT NULL
);
-- The claim index holds live rows only: finished deliveries leave it, so a
-- growing history does not slow the claim.
CREATE INDEX deliveries_due ON deliveries(next_attempt_at) WHERE state < 2;
CREATE INDEX deliveries_by_msg ON deliveries(msg_id);
CREATE INDEX deliveries_by_endpoint ON deliveries(endpoint_id, msg_id);
CREATE INDEX deliveries_dead ON deliveries(app_id, id) WHERE state = 3;
-- Retention finds dead deliveries past their own retention by age.
CREATE INDEX deliveries_dead_by_age ON deliveries(updated_at) WHERE state = 3;

CREATE TABLE attempts (
    id             TEXT COLLATE "C" PRIMARY KEY,
    delivery_id    TEXT COLLATE "C" NOT NULL,
    msg_id         TEXT COLLATE "C" NOT NULL,
    endpoint_id    TEXT COLLATE "C" NOT NULL,
    app_id         TEXT COLLATE "C" NOT NULL,
    url            TEXT NOT NULL,
    attempt_number INTEGER NOT NULL,
    started_at     BIGINT NOT NULL,
    duration_ms    BIGINT NOT NULL,
    status_code    INTEGER,
    response       TEXT NOT NULL DEFAULT '',
    error          TEXT,
    success        BOOLEAN NOT NULL,
    manual         BOOLEAN NOT NULL
);
CREATE INDEX attempts_by_msg ON attempts(msg_id, id);
CREATE INDEX attempts_by_endpoint ON attempts(endpoint_id, id);
