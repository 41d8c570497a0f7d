-- Issue 13: enforced throttleRate and ordered (FIFO) endpoints.
--
-- ordering: 'none' or 'fifo'. A FIFO endpoint gets one request at a time,
-- its live deliveries in queue order (queued_at, msg_id).
ALTER TABLE endpoints ADD COLUMN ordering TEXT NOT NULL DEFAULT 'none';
-- The throttle's theoretical arrival time (GCRA), in MICROseconds: the
-- earliest time the next request to the endpoint may be sent. Each claim
-- reserves the send slots of a throttled endpoint within a short horizon
-- and moves it on by 1/rate per delivery claimed.
ALTER TABLE endpoints ADD COLUMN throttle_tat INTEGER NOT NULL DEFAULT 0;
-- The few throttled endpoints, for herald_throttle_waiting.
CREATE INDEX endpoints_throttled ON endpoints(id) WHERE rate_limit > 0;
-- A delivery's place in its FIFO endpoint's queue (for a throttled
-- endpoint: that it waits for a send slot). NULL until a claim first
-- meets it (it then becomes its updated_at: its creation, or the
-- replay or resend that made it pending again, which clears it), so no
-- insert path needs to know, and only FIFO and throttled endpoints' rows
-- are in the index below.
ALTER TABLE deliveries ADD COLUMN queued_at INTEGER;
CREATE INDEX deliveries_fifo ON deliveries(endpoint_id, queued_at, msg_id)
  WHERE queued_at IS NOT NULL AND state < 2;
