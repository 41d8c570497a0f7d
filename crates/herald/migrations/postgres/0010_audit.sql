-- The audit log: every change made by a person or a token (see
-- store/audit.rs). No foreign key on app_id: an entry outlives what it
-- names (an application's deletion is itself an entry). `details` is a
-- small JSON object of counts and field names, never a secret.
CREATE TABLE audit_log (
    id TEXT PRIMARY KEY,
    at BIGINT NOT NULL,
    actor_kind TEXT NOT NULL,
    actor_id TEXT NOT NULL,
    action TEXT NOT NULL,
    app_id TEXT,
    target TEXT NOT NULL,
    source TEXT NOT NULL,
    details TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX audit_log_at ON audit_log (at);
CREATE INDEX audit_log_app_at ON audit_log (app_id, at);
