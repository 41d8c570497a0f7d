-- An endpoint's attempts filtered by `status` must cost the same at 10 M
-- deliveries as at 10 thousand, whichever status (issue 13, reads at
-- scale). 0019's partial index of failures left a filter on successes
-- walking every failure since the endpoint's last success: 81 ms at 10 M
-- deliveries of a failing endpoint, linear in its attempts. The full
-- index, as on PostgreSQL, costs each attempt one index entry on the
-- single writer (callgrind: about 1 % of a delivery's instructions).
DROP INDEX attempts_failed_by_endpoint;
CREATE INDEX attempts_by_endpoint_success ON attempts(endpoint_id, success, id);
