-- The finding tools (dashboard messages page, portal message log): a
-- search by event type walks only that type's messages, newest first, in
-- one application or in all; a search by eventId without an application
-- is one index lookup (with one, UNIQUE (app_id, event_id) serves).
CREATE INDEX messages_by_app_type ON messages(app_id, event_type, id);
CREATE INDEX messages_by_type ON messages(event_type, id);
CREATE INDEX messages_by_event_id ON messages(event_id) WHERE event_id IS NOT NULL;

-- Reads at scale: attempts of an endpoint filtered by success walk only
-- the matching ones.
CREATE INDEX attempts_by_endpoint_success ON attempts(endpoint_id, success, id);

-- Deliveries counted by (endpoint, state, held), kept exact by
-- statement-level triggers with transition tables: every statement that
-- inserts, moves or deletes deliveries (ingest, claim, complete, release,
-- replay, resend, hold and unhold, retention, cascades) adds its net
-- change per (endpoint, state, held) in its own transaction, one upsert
-- per group, in key order (so two writers never wait on each other in a
-- cycle). Writers touching different endpoints never share a row.
CREATE TABLE delivery_counts (
    endpoint_id TEXT NOT NULL,
    state       SMALLINT NOT NULL,
    held        BOOLEAN NOT NULL,
    n           BIGINT NOT NULL,
    PRIMARY KEY (endpoint_id, state, held)
);
INSERT INTO delivery_counts (endpoint_id, state, held, n)
SELECT endpoint_id, state, held, count(*) FROM deliveries GROUP BY 1, 2, 3;

CREATE FUNCTION herald_delivery_counts_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO delivery_counts AS c (endpoint_id, state, held, n)
    SELECT endpoint_id, state, held, count(*) FROM new_rows
     GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (endpoint_id, state, held) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE FUNCTION herald_delivery_counts_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO delivery_counts AS c (endpoint_id, state, held, n)
    SELECT endpoint_id, state, held, sum(d) FROM (
        SELECT endpoint_id, state, held, -1 AS d FROM old_rows
        UNION ALL
        SELECT endpoint_id, state, held, 1 AS d FROM new_rows
    ) moves
     GROUP BY 1, 2, 3 HAVING sum(d) <> 0 ORDER BY 1, 2, 3
    ON CONFLICT (endpoint_id, state, held) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE FUNCTION herald_delivery_counts_delete() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO delivery_counts AS c (endpoint_id, state, held, n)
    SELECT endpoint_id, state, held, -count(*) FROM old_rows
     GROUP BY 1, 2, 3 ORDER BY 1, 2, 3
    ON CONFLICT (endpoint_id, state, held) DO UPDATE SET n = c.n + EXCLUDED.n;
    RETURN NULL;
END
$$;

CREATE FUNCTION herald_delivery_counts_endpoint_deleted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM delivery_counts WHERE endpoint_id IN (SELECT id FROM old_rows);
    RETURN NULL;
END
$$;

CREATE TRIGGER delivery_counts_insert AFTER INSERT ON deliveries
    REFERENCING NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION herald_delivery_counts_insert();
CREATE TRIGGER delivery_counts_update AFTER UPDATE ON deliveries
    REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
    FOR EACH STATEMENT EXECUTE FUNCTION herald_delivery_counts_update();
CREATE TRIGGER delivery_counts_delete AFTER DELETE ON deliveries
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION herald_delivery_counts_delete();
CREATE TRIGGER delivery_counts_endpoint_deleted AFTER DELETE ON endpoints
    REFERENCING OLD TABLE AS old_rows
    FOR EACH STATEMENT EXECUTE FUNCTION herald_delivery_counts_endpoint_deleted();
