-- The finding tools (dashboard messages page, portal message log): a
-- search by event type in one application walks only that type's
-- messages, newest first; a search by eventId without an application is
-- one index lookup (with one, UNIQUE (app_id, event_id) serves). No index
-- by event type alone: on SQLite's single writer every index of messages
-- is paid by every ingest (callgrind: this one cost about 2 % of all
-- instructions of a delivery), for the operator's search by type across
-- every application, which walks messages newest first instead.
CREATE INDEX messages_by_app_type ON messages(app_id, event_type, id);
CREATE INDEX messages_by_event_id ON messages(event_id) WHERE event_id IS NOT NULL;

-- Reads at scale: attempts of an endpoint filtered by success walk only
-- the matching ones.
CREATE INDEX attempts_by_endpoint_success ON attempts(endpoint_id, success, id);

-- Deliveries counted by (endpoint, state, held), kept exact by triggers on
-- every path that inserts, moves or deletes a delivery (ingest, claim,
-- complete, release, replay, resend, hold and unhold, retention, cascades
-- from deleted messages, endpoints and applications), in the writer's own
-- transaction. The queue figures, /metrics and an endpoint's stats read
-- these rows instead of counting deliveries: their cost follows the
-- number of endpoints, not of deliveries.
CREATE TABLE delivery_counts (
    endpoint_id TEXT NOT NULL,
    state       INTEGER NOT NULL,
    held        INTEGER NOT NULL,
    n           INTEGER NOT NULL,
    PRIMARY KEY (endpoint_id, state, held)
) STRICT, WITHOUT ROWID;
INSERT INTO delivery_counts (endpoint_id, state, held, n)
SELECT endpoint_id, state, parked = 2, COUNT(*) FROM deliveries GROUP BY 1, 2, 3;

CREATE TRIGGER delivery_counts_insert AFTER INSERT ON deliveries
BEGIN
    INSERT INTO delivery_counts (endpoint_id, state, held, n)
    VALUES (new.endpoint_id, new.state, new.parked = 2, 1)
    ON CONFLICT (endpoint_id, state, held) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER delivery_counts_update AFTER UPDATE OF state, parked ON deliveries
WHEN old.state != new.state OR (old.parked = 2) != (new.parked = 2)
BEGIN
    UPDATE delivery_counts SET n = n - 1
     WHERE endpoint_id = old.endpoint_id AND state = old.state AND held = (old.parked = 2);
    INSERT INTO delivery_counts (endpoint_id, state, held, n)
    VALUES (new.endpoint_id, new.state, new.parked = 2, 1)
    ON CONFLICT (endpoint_id, state, held) DO UPDATE SET n = n + 1;
END;

CREATE TRIGGER delivery_counts_delete AFTER DELETE ON deliveries
BEGIN
    UPDATE delivery_counts SET n = n - 1
     WHERE endpoint_id = old.endpoint_id AND state = old.state AND held = (old.parked = 2);
END;

CREATE TRIGGER delivery_counts_endpoint_deleted AFTER DELETE ON endpoints
BEGIN
    DELETE FROM delivery_counts WHERE endpoint_id = old.id;
END;
