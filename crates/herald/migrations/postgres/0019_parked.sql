-- Parked deliveries (issue 13, item 5): a claim sets aside the pending
-- rows it passes because their endpoint has no room (saturated, a breaker
-- open, throttled without a slot, FIFO rows behind the head) once they
-- have been due for over a second, so later claims no longer read past
-- them; each claim gives endpoints with room back what they can take.
-- Parked rows are pending and not held: the delivery counts (0017, by
-- endpoint, state and held) do not change when a row is parked.
ALTER TABLE deliveries ADD COLUMN parked BOOLEAN NOT NULL DEFAULT FALSE;
-- The claim index without them, under its old name (plans and docs name it).
CREATE INDEX deliveries_due_unparked ON deliveries(next_attempt_at)
    WHERE state < 2 AND NOT held AND NOT parked;
DROP INDEX deliveries_due;
ALTER INDEX deliveries_due_unparked RENAME TO deliveries_due;
-- An endpoint's parked rows, oldest first: given back through this.
CREATE INDEX deliveries_parked ON deliveries(endpoint_id, next_attempt_at) WHERE parked;
-- Endpoints that may have parked deliveries. `parks` counts the claims that
-- parked some: a claim forgets an endpoint only if the count is still the
-- one it read (a row lock re-checks it), so rows parked by a concurrent
-- claim, which its snapshot cannot see, are never left with no entry.
CREATE TABLE parked_endpoints (
    endpoint_id TEXT PRIMARY KEY REFERENCES endpoints(id) ON DELETE CASCADE,
    parks       BIGINT NOT NULL DEFAULT 0
);
