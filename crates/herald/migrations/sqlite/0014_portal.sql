-- The customer portal (issue #12): application tokens made by
-- app-portal-access carry an expiry, capabilities and Svix's sessionId;
-- NULL in all three is an ordinary application token (never expires, may
-- do everything an application token may).
ALTER TABLE api_tokens ADD COLUMN expires_at INTEGER;
ALTER TABLE api_tokens ADD COLUMN capabilities TEXT;
ALTER TABLE api_tokens ADD COLUMN session_id TEXT;
ALTER TABLE api_tokens ADD COLUMN feature_flags TEXT NOT NULL DEFAULT '';
CREATE INDEX api_tokens_by_session ON api_tokens(app_id, session_id);

-- A portal link's one-time code (its SHA-256 only), bound to the token it
-- was minted with; taken (deleted) by the first exchange.
CREATE TABLE portal_codes (
    sha256     TEXT PRIMARY KEY,
    token_id   TEXT NOT NULL REFERENCES api_tokens(id) ON DELETE CASCADE,
    expires_at INTEGER NOT NULL
) STRICT;
CREATE INDEX portal_codes_by_token ON portal_codes(token_id);
CREATE INDEX portal_codes_by_expiry ON portal_codes(expires_at);

-- Browser sessions of the dashboard and the portal, by the SHA-256 of the
-- cookie. A portal session belongs to the token its link was minted with:
-- deleting the token ends it, and expiring tokens expires it too.
CREATE TABLE sessions (
    sha256       TEXT PRIMARY KEY,
    kind         TEXT NOT NULL,
    app_id       TEXT REFERENCES applications(id) ON DELETE CASCADE,
    token_id     TEXT REFERENCES api_tokens(id) ON DELETE CASCADE,
    capabilities TEXT,
    session_id   TEXT,
    theme        TEXT NOT NULL DEFAULT '',
    csrf         TEXT NOT NULL,
    flash        TEXT,
    created_at   INTEGER NOT NULL,
    expires_at   INTEGER NOT NULL
) STRICT;
CREATE INDEX sessions_by_token ON sessions(token_id);
CREATE INDEX sessions_by_expiry ON sessions(expires_at);
