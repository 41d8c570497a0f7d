-- The event types an environment knows (Svix's catalogue). Endpoints'
-- filters must name existing ones; archived ones stay listed on request.
CREATE TABLE event_types (
    name         TEXT COLLATE "C" PRIMARY KEY,
    description  TEXT NOT NULL DEFAULT '',
    archived     BOOLEAN NOT NULL DEFAULT FALSE,
    deprecated   BOOLEAN NOT NULL DEFAULT FALSE,
    schemas      TEXT,            -- JSON object, as given
    feature_flag TEXT,
    group_name   TEXT,
    created_at   BIGINT NOT NULL,
    updated_at   BIGINT NOT NULL
);
