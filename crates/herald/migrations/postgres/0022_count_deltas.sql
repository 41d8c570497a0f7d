-- Kept delivery counts as appended deltas, folded later.
--
-- Until now the statement triggers of 0017 upserted `delivery_counts`
-- rows in the writer's own transaction. A caller's transaction around
-- `send_message` (the outbox: possibly long) then held those rows' locks
-- until it committed, and every claim, completion and API create that
-- moved a delivery of the same endpoint waited for it: one open outbox
-- transaction stopped a worker's deliveries. Now each statement only
-- appends its net change per (endpoint, state, held) to
-- `delivery_count_deltas`, a table without keys that no two writers ever
-- wait on; a Herald process folds committed deltas into `delivery_counts`
-- every second (`SKIP LOCKED`, so folders never wait on each other
-- either), and readers add the deltas not yet folded. A reader sees counts
-- and deliveries of one snapshot, as before.
--
-- Deleted endpoints: a delta of an endpoint that no longer exists is not
-- written (the cascade that deletes its deliveries runs after the endpoint
-- row is gone), the endpoint's trigger removes its folded rows and
-- deltas, and a fold drops any delta whose endpoint vanished meanwhile; so
-- no row describes a deleted endpoint (0017 left negative ones behind).
--
-- Expand only: the table is new, the functions keep their names and
-- triggers. A process of the previous release reads `delivery_counts`
-- alone: while it runs beside this one its figures trail by the deltas
-- not yet folded (a second at most).
CREATE TABLE delivery_count_deltas (
    endpoint_id TEXT NOT NULL,
    state       SMALLINT NOT NULL,
    held        BOOLEAN NOT NULL,
    n           BIGINT NOT NULL
);
CREATE INDEX delivery_count_deltas_by_endpoint ON delivery_count_deltas (endpoint_id);

CREATE OR REPLACE FUNCTION herald_delivery_counts_insert() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO delivery_count_deltas (endpoint_id, state, held, n)
    SELECT endpoint_id, state, held, count(*) FROM new_rows
     GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION herald_delivery_counts_update() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO delivery_count_deltas (endpoint_id, state, held, n)
    SELECT endpoint_id, state, held, sum(d) FROM (
        SELECT endpoint_id, state, held, -1 AS d FROM old_rows
        UNION ALL
        SELECT endpoint_id, state, held, 1 AS d FROM new_rows
    ) moves
     GROUP BY 1, 2, 3 HAVING sum(d) <> 0;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION herald_delivery_counts_delete() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    INSERT INTO delivery_count_deltas (endpoint_id, state, held, n)
    SELECT o.endpoint_id, o.state, o.held, -count(*) FROM old_rows o
     WHERE EXISTS (SELECT 1 FROM endpoints e WHERE e.id = o.endpoint_id)
     GROUP BY 1, 2, 3;
    RETURN NULL;
END
$$;

CREATE OR REPLACE FUNCTION herald_delivery_counts_endpoint_deleted() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
    DELETE FROM delivery_counts WHERE endpoint_id IN (SELECT id FROM old_rows);
    DELETE FROM delivery_count_deltas WHERE endpoint_id IN (SELECT id FROM old_rows);
    RETURN NULL;
END
$$;

-- The rows 0017's endpoint deletions left behind.
DELETE FROM delivery_counts c
 WHERE NOT EXISTS (SELECT 1 FROM endpoints e WHERE e.id = c.endpoint_id);
