-- Issue 13: enforced throttleRate and ordered (FIFO) endpoints.
--
-- ordering: 'none' or 'fifo'. A FIFO endpoint gets one request at a time,
-- its live deliveries in queue order (queued_at, msg_id).
ALTER TABLE endpoints ADD COLUMN ordering TEXT NOT NULL DEFAULT 'none';
-- The few throttled endpoints, for herald_throttle_waiting.
CREATE INDEX endpoints_throttled ON endpoints(id) WHERE rate_limit > 0;
-- A delivery's place in its FIFO endpoint's queue (for a throttled
-- endpoint: that it waits for a send slot). NULL until a claim first
-- meets it (it then becomes its updated_at: its creation, or the
-- replay or resend that made it pending again, which clears it), so no
-- insert path needs to know, and only FIFO and throttled endpoints' rows
-- are in the index below.
ALTER TABLE deliveries ADD COLUMN queued_at BIGINT;
CREATE INDEX deliveries_fifo ON deliveries(endpoint_id, queued_at, msg_id)
  WHERE queued_at IS NOT NULL AND state < 2;
-- The throttle's theoretical arrival time (GCRA), in MICROseconds, per
-- throttled endpoint. Only claims touch this table (never the completer,
-- which locks endpoint rows), each locking the rows it moves on with
-- SKIP LOCKED, so claims on several workers never wait for each other
-- and never reserve the same slot. A row exists for every endpoint with
-- a rate (kept so by the trigger), so there is never a first claim that
-- two workers could both make.
CREATE TABLE endpoint_throttle (
    endpoint_id TEXT PRIMARY KEY REFERENCES endpoints(id) ON DELETE CASCADE,
    tat_us      BIGINT NOT NULL DEFAULT 0
);
INSERT INTO endpoint_throttle (endpoint_id)
  SELECT id FROM endpoints WHERE rate_limit > 0;
CREATE FUNCTION herald_endpoint_throttle_row() RETURNS trigger
LANGUAGE plpgsql
SET search_path FROM CURRENT
AS $$
BEGIN
  IF NEW.rate_limit > 0 THEN
    INSERT INTO endpoint_throttle (endpoint_id) VALUES (NEW.id) ON CONFLICT DO NOTHING;
  END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER endpoint_throttle_row AFTER INSERT OR UPDATE OF rate_limit ON endpoints
  FOR EACH ROW EXECUTE FUNCTION herald_endpoint_throttle_row();
