-- Completion (store/postgres/queue.rs, `complete_with_circuits`): after
-- the endpoint rows are locked and their breakers stepped, the rest of a
-- batch of finished attempts in one statement. Parameters, bound in this
-- order:
--   $1–$14  the attempts, in `attempts`' column order
--   $15–$23 the deliveries moved: ids, lease tokens, states, attempts,
--           next attempt (ms), dead reasons, last statuses, last errors,
--           now (ms)
--   $24–$30 per endpoint: ids, whether a success reset the streak,
--           failures, first failure (ms), last success (ms), last error,
--           its time (ms)
--   $31–$48 the stats buckets: endpoint ids, buckets, attempts,
--           successes, failures, latency sum, the 12 latency slots h0–h11
--   $49–$58 per endpoint (as $24): its circuit breaker as stepped
-- The named parts:
--
-- `logged`: the attempt log.
-- `moved`: the deliveries' next states; the lease token guard leaves a
-- re-claimed delivery to its new holder (its row is then not returned).
-- `counted`: each endpoint's stats buckets, added to.
-- `streaked`: each endpoint's failing streak, last success and error, and
-- its circuit breaker.
-- The answer: the endpoints as written (for auto-disable), then the
-- deliveries that moved, by lease token.

WITH logged AS (
        INSERT INTO attempts (id, delivery_id, msg_id, endpoint_id, app_id, url, attempt_number,
                              started_at, duration_ms, status_code, response, error, success, manual)
        SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                             $7::int4[], $8::int8[], $9::int8[], $10::int4[], $11::text[], $12::text[],
                             $13::bool[], $14::bool[])),
    moved AS (
        UPDATE deliveries SET state = v.state, attempts = v.attempts, next_attempt_at = v.next_at,
               lease_token = NULL, manual = FALSE, dead_reason = v.reason, last_status = v.status,
               last_error = v.error, updated_at = v.now
        FROM (SELECT * FROM UNNEST($15::text[], $16::text[], $17::int2[], $18::int4[], $19::int8[],
                                   $20::text[], $21::int4[], $22::text[], $23::int8[])
              AS u(id, tok, state, attempts, next_at, reason, status, error, now)) v
        WHERE deliveries.id = v.id AND deliveries.lease_token = v.tok
        RETURNING deliveries.id, v.tok),
    counted AS (
        INSERT INTO endpoint_stats (endpoint_id, bucket, attempts, successes, failures, latency_sum,
                                    h0, h1, h2, h3, h4, h5, h6, h7, h8, h9, h10, h11)
        SELECT * FROM UNNEST($31::text[], $32::int8[], $33::int8[], $34::int8[], $35::int8[], $36::int8[],
          $37::int8[], $38::int8[], $39::int8[], $40::int8[], $41::int8[], $42::int8[], $43::int8[],
          $44::int8[], $45::int8[], $46::int8[], $47::int8[], $48::int8[])
        ON CONFLICT (endpoint_id, bucket) DO UPDATE SET
          attempts = endpoint_stats.attempts + excluded.attempts,
          successes = endpoint_stats.successes + excluded.successes,
          failures = endpoint_stats.failures + excluded.failures,
          latency_sum = endpoint_stats.latency_sum + excluded.latency_sum,
          h0 = endpoint_stats.h0 + excluded.h0, h1 = endpoint_stats.h1 + excluded.h1,
          h2 = endpoint_stats.h2 + excluded.h2, h3 = endpoint_stats.h3 + excluded.h3,
          h4 = endpoint_stats.h4 + excluded.h4, h5 = endpoint_stats.h5 + excluded.h5,
          h6 = endpoint_stats.h6 + excluded.h6, h7 = endpoint_stats.h7 + excluded.h7,
          h8 = endpoint_stats.h8 + excluded.h8, h9 = endpoint_stats.h9 + excluded.h9,
          h10 = endpoint_stats.h10 + excluded.h10, h11 = endpoint_stats.h11 + excluded.h11),
    streaked AS (
        UPDATE endpoints e SET
          fail_streak = CASE WHEN v.reset THEN v.failures ELSE e.fail_streak + v.failures END,
          streak_started_at = CASE WHEN v.reset THEN v.first_fail ELSE COALESCE(e.streak_started_at, v.first_fail) END,
          last_success_at = CASE WHEN v.reset THEN GREATEST(COALESCE(e.last_success_at, 0), v.last_ok) ELSE e.last_success_at END,
          last_error = COALESCE(v.err, e.last_error), last_error_at = COALESCE(v.err_at, e.last_error_at),
          circuit_state = v.c_state, circuit_since = v.c_since, circuit_until = v.c_until,
          circuit_cooldown_ms = v.c_cooldown, circuit_probe_by = v.c_probe_by,
          circuit_window_at = v.c_window_at, circuit_attempts = v.c_attempts,
          circuit_failures = v.c_failures, circuit_prev_attempts = v.c_prev_attempts,
          circuit_prev_failures = v.c_prev_failures
        FROM UNNEST($24::text[], $25::bool[], $26::int4[], $27::int8[], $28::int8[], $29::text[], $30::int8[],
                    $49::int2[], $50::int8[], $51::int8[], $52::int8[], $53::text[], $54::int8[],
                    $55::int4[], $56::int4[], $57::int4[], $58::int4[])
             AS v(id, reset, failures, first_fail, last_ok, err, err_at,
                  c_state, c_since, c_until, c_cooldown, c_probe_by, c_window_at,
                  c_attempts, c_failures, c_prev_attempts, c_prev_failures)
        WHERE e.id = v.id
        RETURNING e.id, e.app_id, e.fail_streak, e.streak_started_at, e.disabled, v.failures AS batch_failures)
SELECT id, app_id, fail_streak, streak_started_at, disabled, batch_failures, NULL::text AS moved_tok
  FROM streaked
UNION ALL
SELECT id, NULL, NULL, NULL, NULL, NULL, tok FROM moved
