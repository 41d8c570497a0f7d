-- An endpoint's attempts by `status` (reads at scale, 0016) without an
-- index entry per successful attempt: on SQLite's single writer every index
-- of `attempts` is paid by each delivery (callgrind: about 1 % of all
-- instructions of a delivery). The failures, the rare status of a healthy
-- endpoint, get an index of their own; a filter on successes walks
-- `attempts_by_endpoint` newest first and stops after a page, passing only
-- the failures in between (so it is slow only for an endpoint that has
-- failed for a long run of attempts since its last success).
DROP INDEX attempts_by_endpoint_success;
CREATE INDEX attempts_failed_by_endpoint ON attempts(endpoint_id, id) WHERE success = 0;
