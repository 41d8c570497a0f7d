-- The event types an environment knows (Svix's catalogue). Endpoints'
-- filters must name existing ones; archived ones stay listed on request.
CREATE TABLE event_types (
    name         TEXT PRIMARY KEY,
    description  TEXT NOT NULL DEFAULT '',
    archived     INTEGER NOT NULL DEFAULT 0,
    deprecated   INTEGER NOT NULL DEFAULT 0,
    schemas      TEXT,            -- JSON object, as given
    feature_flag TEXT,
    group_name   TEXT,
    created_at   INTEGER NOT NULL,
    updated_at   INTEGER NOT NULL
) STRICT;
