-- A full endpoint's due deliveries are parked: kept out of the claim index
-- until the endpoint has room again, so that a stuck endpoint's backlog is
-- not scanned past by every claim. Parked rows are still pending.
ALTER TABLE deliveries ADD COLUMN parked INTEGER NOT NULL DEFAULT 0;
DROP INDEX deliveries_due;
CREATE INDEX deliveries_due ON deliveries(next_attempt_at) WHERE state < 2 AND parked = 0;
CREATE INDEX deliveries_parked ON deliveries(endpoint_id, next_attempt_at) WHERE parked = 1;
-- Endpoints that may have parked deliveries.
CREATE TABLE parked_endpoints (endpoint_id TEXT PRIMARY KEY) STRICT;
