-- Ordered endpoints on several workers (issue 13): a claim reads one
-- snapshot, then locks the FIFO endpoints' rows (SKIP LOCKED). A claim
-- whose snapshot is older than another claim's commit, but whose lock
-- comes after it, would see that claim's head still unclaimed and its
-- own view of the queue out of date, and could take the delivery behind
-- the head. Every claim that changes a FIFO endpoint's deliveries moves
-- its `fifo_turns` on; the row lock returns the newest row, the snapshot
-- the one it saw, and a claim acts only on the endpoints where the two
-- agree (the others wait for its next claim).
ALTER TABLE endpoints ADD COLUMN fifo_turns BIGINT NOT NULL DEFAULT 0;
-- The few FIFO endpoints, for the claim, without reading every endpoint.
CREATE INDEX endpoints_fifo ON endpoints(id) WHERE ordering = 'fifo' AND NOT disabled;
