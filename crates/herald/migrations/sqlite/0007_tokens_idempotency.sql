-- Application-scoped API tokens: only their SHA-256 is kept.
CREATE TABLE api_tokens (
    id         TEXT PRIMARY KEY,
    app_id     TEXT NOT NULL REFERENCES applications(id) ON DELETE CASCADE,
    sha256     TEXT NOT NULL UNIQUE,
    name       TEXT NOT NULL DEFAULT '',
    created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX api_tokens_by_app ON api_tokens(app_id, id);

-- Idempotency-Key records: the first response to a POST, replayed for a
-- repeat with the same key (per token) within 12 h. status 0 = the first
-- request is still running.
CREATE TABLE idempotency (
    scope        TEXT NOT NULL,
    key          TEXT NOT NULL,
    request_hash TEXT NOT NULL,
    status       INTEGER NOT NULL,
    body         TEXT NOT NULL DEFAULT '',
    created_at   INTEGER NOT NULL,
    PRIMARY KEY (scope, key)
) STRICT;
CREATE INDEX idempotency_by_age ON idempotency(created_at);
