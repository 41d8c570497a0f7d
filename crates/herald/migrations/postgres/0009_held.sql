-- Held deliveries (pending, of a disabled endpoint) leave the claim index:
-- every claim and every next_due_at walked past them, and an endpoint
-- nobody re-enables collects them without end. Disabling an endpoint
-- holds its pending deliveries, a claim holds those it meets (made
-- pending after the endpoint was disabled), enabling it lets them go.
-- Retention ages them out through deliveries_held (per disabled endpoint,
-- oldest cycle first), which enabling also uses to find them.
ALTER TABLE deliveries ADD COLUMN held BOOLEAN NOT NULL DEFAULT FALSE;
UPDATE deliveries d SET held = TRUE
  FROM endpoints e
 WHERE e.id = d.endpoint_id AND e.disabled AND d.state = 0;
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due ON deliveries(next_attempt_at) WHERE state < 2 AND NOT held;
CREATE INDEX deliveries_held ON deliveries(endpoint_id, cycle_started_at) WHERE held;
