-- The kept delivery counts (0016) without a table write per delivery
-- change: the triggers hand each change to herald_count(endpoint, state,
-- held, delta), a function the writer registers (store/sqlite/counts.rs)
-- that folds the changes in memory; the writer upserts their net sum per
-- (endpoint, state, held) into delivery_counts just before it commits, in
-- the same transaction, and drops a rolled-back job's share. The table,
-- its meaning and the endpoint-deletion trigger stay as 0016 made them.
DROP TRIGGER delivery_counts_insert;
DROP TRIGGER delivery_counts_update;
DROP TRIGGER delivery_counts_delete;

CREATE TRIGGER delivery_counts_insert AFTER INSERT ON deliveries
BEGIN
    SELECT herald_count(new.endpoint_id, new.state, new.parked = 2, 1);
END;

CREATE TRIGGER delivery_counts_update AFTER UPDATE OF state, parked ON deliveries
WHEN old.state != new.state OR (old.parked = 2) != (new.parked = 2)
BEGIN
    SELECT herald_count(old.endpoint_id, old.state, old.parked = 2, -1),
           herald_count(new.endpoint_id, new.state, new.parked = 2, 1);
END;

CREATE TRIGGER delivery_counts_delete AFTER DELETE ON deliveries
BEGIN
    SELECT herald_count(old.endpoint_id, old.state, old.parked = 2, -1);
END;
