-- Held deliveries (pending, of a disabled endpoint) are set aside as
-- parked = 2: out of the claim index like a full endpoint's parked rows
-- (parked = 1), but given back only when their endpoint is enabled, and
-- aged out by retention once their cycle is past the age cap, found
-- through this index (per disabled endpoint, oldest cycle first).
UPDATE deliveries SET parked = 2
 WHERE state = 0 AND endpoint_id IN (SELECT id FROM endpoints WHERE disabled = 1);
DELETE FROM parked_endpoints WHERE endpoint_id IN (SELECT id FROM endpoints WHERE disabled = 1);
CREATE INDEX deliveries_held ON deliveries(endpoint_id, cycle_started_at) WHERE parked = 2;
