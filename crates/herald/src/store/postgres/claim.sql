-- The claim (store/postgres/queue.rs, `Queue::claim`): one statement, so
-- one round trip. Parameters, bound by `ClaimArgs::bind` in this order:
--   $1 now (ms)            $2 saturated endpoints   $3 window (rows read)
--   $4 busy endpoints      $5 their claimed counts  $6 cap per endpoint
--   $7 limit (rows taken)  $8 lease end (ms)        $9 lease token
--   $10 throttle horizon (µs)  $11 now (µs)         $12 retry share
--   $13 park rows due before this (ms)   $14 rows parked per claim at most
--   $15 throttle drift (µs)  $16 room of an endpoint not listed in $4
-- The design, with the reasons: docs/design/postgres.md and
-- docs/design/throttle-and-fifo.md. The named parts:
--
-- The claim: one statement, so one round trip and no explicit
-- transaction: the row locks last only while it runs. SKIP LOCKED: rows
-- another claimer is taking right now are left to it; this claim takes
-- the next ones instead of waiting. Of the due rows, each endpoint gets
-- no more than its room, earliest first, and `limit` in all.
--
-- Held deliveries are not in `deliveries_due`; the ones of a disabled
-- endpoint the window still meets (made pending after it was disabled, or
-- delivering under a lease that expired: their process died) are held
-- here, pending again, so no claim meets them again; left there, enough of
-- them filled the window (`LIMIT $3`) and no claim took anything. Holding takes a
-- share lock on their endpoint, as enabling it takes a stronger one: the
-- two never cross, so a delivery held here is always one enabling will
-- see; an endpoint locked by someone else is left for a later claim
-- (SKIP LOCKED). That lock's list is one `ARRAY(…)`, read once: as an
-- `IN (…)` the planner re-ran it, lock and all, for each due row.
--
-- Throttled and FIFO endpoints: `full_thr` are the throttled
-- ones with no send slot left within the horizon, `fifo_heads` the first
-- live delivery of each enabled FIFO endpoint in its queue; the due scan
-- passes their other rows without counting them (rows never queued yet,
-- `queued_at IS NULL`, go in: they are given their place here). Of a FIFO
-- endpoint only its head is taken, one per claim (a delivering head is
-- not due; while it is in flight, `busy`, a row never queued that would
-- come before it, such as a scheduled message fallen due that was created
-- earlier, neither becomes the head nor is queued or parked: it takes its
-- place once that attempt is over, so one request is ever open), and
-- only by the claim holding the endpoint's row
-- (`fifo_locked`, SKIP LOCKED): a concurrent claim's head is not committed
-- yet, so another claim would take the next row for the head. The lock
-- comes after the statement's snapshot, so it may follow another claim's
-- commit the snapshot does not show; every claim that changes a FIFO
-- endpoint's rows moves its `fifo_turns` on (`turned`, which also moves
-- `fifo_last` past the queue places it gave, so ingest never places a new
-- delivery before one in flight: migration 0021), and `fifo_mine`
-- keeps only the endpoints whose locked (newest) row has the `fifo_turns`
-- the snapshot saw (migration 0020). A claim locks only the FIFO
-- endpoints with work in reach (`fifo_live`): those among the first due
-- rows (`waiting`, the window the due scan reads) and those noted in
-- `parked_endpoints`; and the due scan tells a FIFO endpoint's row by a
-- key lookup of its endpoint, not by a list of every FIFO endpoint. None of it runs when no endpoint is FIFO
-- (`any_fifo`, one probe of `endpoints_fifo`). Whatever `fifo_live` holds,
-- a FIFO endpoint outside `fifo_mine` has none of its rows taken, queued
-- or parked; one whose rows lie past the window waits, as they would in
-- the due scan, until the rows ahead are taken or parked. An idle FIFO
-- endpoint's `parked_endpoints` entry is forgotten like any other's; of a
-- throttled one only as many as its slots, which this claim reserves by
-- moving its `endpoint_throttle` row on, locked with SKIP LOCKED (another
-- claim moving it: none this time).
--
-- Retries take at most `retry_share` of the slots while first attempts
-- wait too: when the due head holds more retries than
-- that, `fresh` also reads the newest due first attempts (the other end
-- of `deliveries_due`; a one-time filter, so nothing is read otherwise),
-- and `picked` takes retries past their share last.
--
-- Parking (SQLite's walk does the same): the due scan
-- reads past every pending row of an endpoint without room (saturated,
-- which includes an open breaker; throttled without a slot; a FIFO
-- endpoint's rows behind its head). `to_park` takes those due for over
-- `PARK_AFTER_MS`, at most `PASSED_PER_CLAIM`, out of `deliveries_due`
-- (`parked`) and notes their endpoint in `parked_endpoints`, so later
-- claims no longer read them. It reads only the part of the index the
-- due scan read (up to the last row of its window, `bound`), so it costs
-- at most what the due scan did, and nothing when no endpoint lacks room
-- (a one-time filter). Its endpoints are locked first (KEY SHARE, SKIP
-- LOCKED, for the foreign key of `parked_endpoints`: endpoints before
-- deliveries, the lock order, so deleting one cannot deadlock with it);
-- rows of a FIFO or throttled endpoint get their queue place as they are
-- parked, so the FIFO head is still found among them.
--
-- Unparking, in the same statement: `unparked` reads, of each endpoint
-- in `parked_endpoints` that is enabled and has room, as many parked
-- rows as that room, oldest first (a FIFO endpoint: its head, if parked
-- and the endpoint's row is this claim's), and they join the due rows,
-- so the claim takes them directly; those it does not take stay parked
-- for the next claim. Taking them here, rather than in a statement run
-- first, keeps the claim one round trip: the statement sees one
-- snapshot, so rows unparked by an earlier part of it would be invisible
-- to its due scan. An endpoint with room and no parked row left but those
-- taken is forgotten (`forgot`), unless a claim parked rows of it since
-- this one's snapshot: the row lock on its `parked_endpoints` entry
-- re-reads `parks`, which every parking claim moves on (SKIP LOCKED: one
-- parking right now keeps it). Several workers can so park and unpark the
-- same endpoint: every row is locked by the one claim that moves it, none
-- is parked without its endpoint noted, and a FIFO endpoint's head is
-- found among parked rows too.

WITH full_thr AS MATERIALIZED (
         SELECT t.endpoint_id FROM endpoint_throttle t JOIN endpoints e ON e.id = t.endpoint_id
         WHERE t.tat_us >= $10 AND e.rate_limit > 0),
     any_fifo AS MATERIALIZED (
         SELECT EXISTS (SELECT 1 FROM endpoints e WHERE e.ordering = 'fifo' AND NOT e.disabled) AS yes),
     waiting AS MATERIALIZED (
         SELECT d.endpoint_id FROM deliveries d
         WHERE (SELECT yes FROM any_fifo)
           AND d.state < 2 AND NOT d.held AND NOT d.parked AND d.next_attempt_at <= $1
           AND d.endpoint_id <> ALL($2::text[])
           AND d.endpoint_id NOT IN (SELECT endpoint_id FROM full_thr)
         ORDER BY d.next_attempt_at LIMIT $3),
     fifo_live AS MATERIALIZED (
         SELECT e.id, e.fifo_turns FROM endpoints e
         WHERE e.id = ANY (ARRAY(SELECT endpoint_id FROM waiting
                                 UNION SELECT endpoint_id FROM parked_endpoints))
           AND e.ordering = 'fifo' AND NOT e.disabled),
     fifo_locked AS MATERIALIZED (
         SELECT e.id, e.fifo_turns FROM endpoints e WHERE e.id = ANY (ARRAY(SELECT id FROM fifo_live))
         FOR NO KEY UPDATE SKIP LOCKED),
     fifo_mine AS MATERIALIZED (
         SELECT l.id FROM fifo_locked l JOIN fifo_live f ON f.id = l.id AND f.fifo_turns = l.fifo_turns),
     fifo_heads AS MATERIALIZED (
         SELECT f.id AS endpoint_id, h.id, h.queued_at AS k, h.msg_id, h.parked,
                h.state = 1 AND h.next_attempt_at > $1 AS busy
         FROM fifo_mine f CROSS JOIN LATERAL (
             SELECT x.id, x.queued_at, x.msg_id, x.parked, x.state, x.next_attempt_at FROM deliveries x
             WHERE x.endpoint_id = f.id AND x.queued_at IS NOT NULL AND x.state < 2
             ORDER BY x.queued_at, x.msg_id LIMIT 1) h),
     due_head AS MATERIALIZED (
         SELECT d.id, d.endpoint_id, d.next_attempt_at, d.state, d.msg_id, d.queued_at, d.updated_at,
                d.attempts
         FROM deliveries d
         WHERE d.state < 2 AND NOT d.held AND NOT d.parked AND d.next_attempt_at <= $1
           AND d.endpoint_id <> ALL($2::text[])
           AND d.endpoint_id NOT IN (SELECT endpoint_id FROM full_thr)
           AND (CASE WHEN NOT (SELECT yes FROM any_fifo) THEN TRUE
                     WHEN d.endpoint_id IN (SELECT id FROM fifo_mine)
                     THEN d.queued_at IS NULL OR d.id IN (SELECT id FROM fifo_heads)
                     ELSE NOT (SELECT e.ordering = 'fifo' AND NOT e.disabled
                               FROM endpoints e WHERE e.id = d.endpoint_id) END)
         ORDER BY d.next_attempt_at LIMIT $3
         FOR UPDATE OF d SKIP LOCKED),
     fresh AS MATERIALIZED (
         SELECT d.id, d.endpoint_id, d.next_attempt_at, d.state, d.msg_id, d.queued_at, d.updated_at,
                d.attempts
         FROM deliveries d
         WHERE (SELECT COUNT(*) FROM due_head WHERE attempts > 0) > $12
           AND d.state < 2 AND NOT d.held AND NOT d.parked AND d.next_attempt_at <= $1 AND d.state = 0
           AND d.attempts = 0 AND d.endpoint_id <> ALL($2::text[])
           AND (CASE WHEN NOT (SELECT yes FROM any_fifo) THEN TRUE
                     ELSE NOT (SELECT e.ordering = 'fifo' AND NOT e.disabled
                               FROM endpoints e WHERE e.id = d.endpoint_id) END)
           AND d.endpoint_id NOT IN (SELECT endpoint_id FROM endpoint_throttle)
         ORDER BY d.next_attempt_at DESC LIMIT $3
         FOR UPDATE OF d SKIP LOCKED),
     room_of AS MATERIALIZED (
         SELECT b.endpoint_id, b.n FROM UNNEST($4::text[], $5::int8[]) AS b(endpoint_id, n)),
     parked_eps AS MATERIALIZED (
         SELECT p.endpoint_id, p.parks, e.ordering = 'fifo' AS fifo,
                LEAST(COALESCE($6 - b.n, $16), $7) AS room
         FROM parked_endpoints p JOIN endpoints e ON e.id = p.endpoint_id
         LEFT JOIN room_of b ON b.endpoint_id = p.endpoint_id
         WHERE e.id = ANY (ARRAY(SELECT endpoint_id FROM parked_endpoints))
           AND NOT e.disabled AND COALESCE($6 - b.n, $16) > 0
           AND p.endpoint_id <> ALL($2::text[])
           AND p.endpoint_id NOT IN (SELECT endpoint_id FROM full_thr)),
     unparked AS MATERIALIZED (
         SELECT u.* FROM (SELECT * FROM parked_eps WHERE NOT fifo) pe CROSS JOIN LATERAL (
             SELECT d.id, d.endpoint_id, d.next_attempt_at, d.state, d.msg_id, d.queued_at, d.updated_at,
                    d.attempts
             FROM deliveries d
             WHERE d.parked AND d.endpoint_id = pe.endpoint_id AND d.state = 0 AND NOT d.held
             ORDER BY d.next_attempt_at LIMIT pe.room
             FOR UPDATE OF d SKIP LOCKED) u),
     unparked_heads AS MATERIALIZED (
         SELECT d.id, d.endpoint_id, d.next_attempt_at, d.state, d.msg_id, d.queued_at, d.updated_at,
                d.attempts
         FROM deliveries d
         WHERE d.id = ANY (ARRAY(SELECT h.id FROM fifo_heads h JOIN parked_eps pe ON pe.endpoint_id = h.endpoint_id
                                 WHERE h.parked))
           AND d.parked AND d.state = 0 AND NOT d.held
         FOR UPDATE OF d SKIP LOCKED),
     due AS MATERIALIZED (
         SELECT * FROM due_head UNION SELECT * FROM fresh
         UNION SELECT * FROM unparked UNION SELECT * FROM unparked_heads),
     eps AS MATERIALIZED (
         SELECT e.id, e.disabled, e.ordering = 'fifo' AS fifo,
                CASE WHEN e.rate_limit > 0 THEN e.rate_limit::int8 END AS rate
         FROM endpoints e WHERE e.id = ANY (ARRAY(SELECT endpoint_id FROM due))),
     off AS MATERIALIZED (SELECT id FROM eps WHERE disabled),
     held AS (
         UPDATE deliveries d SET held = TRUE, state = 0, lease_token = NULL FROM due
         WHERE d.id = due.id
           AND due.endpoint_id = ANY (ARRAY(
               SELECT e.id FROM endpoints e WHERE e.id = ANY (ARRAY(SELECT id FROM off)) AND e.disabled
               FOR SHARE SKIP LOCKED))),
     heads AS MATERIALIZED (
         SELECT DISTINCT ON (c.endpoint_id) c.endpoint_id, c.id FROM (
             SELECT endpoint_id, id, k, msg_id FROM fifo_heads
             UNION ALL
             SELECT due.endpoint_id, due.id, due.updated_at, due.msg_id FROM due
             JOIN eps ON eps.id = due.endpoint_id
             WHERE eps.fifo AND NOT eps.disabled AND due.queued_at IS NULL
               AND due.endpoint_id NOT IN (SELECT endpoint_id FROM fifo_heads WHERE busy)) c
         ORDER BY c.endpoint_id, c.k, c.msg_id),
     thr AS MATERIALIZED (
         SELECT t.endpoint_id, GREATEST(t.tat_us, $11) AS base,
                GREATEST((1000000 + eps.rate - 1) / eps.rate, (1000000 + $15 + eps.rate) / (eps.rate + 1)) AS step
         FROM endpoint_throttle t JOIN eps ON eps.id = t.endpoint_id
         WHERE eps.rate IS NOT NULL AND NOT eps.disabled
         FOR UPDATE OF t SKIP LOCKED),
     ranked AS (
         SELECT due.id, due.next_attempt_at, due.endpoint_id, due.updated_at,
                (eps.fifo OR eps.rate IS NOT NULL) AS queues, eps.fifo,
                (due.attempts > 0 AND NOT eps.fifo AND eps.rate IS NULL) AS retry,
                row_number() OVER (PARTITION BY due.endpoint_id ORDER BY due.next_attempt_at, due.id) AS nth,
                row_number() OVER (PARTITION BY (due.attempts > 0) ORDER BY due.next_attempt_at, due.id) AS kth
         FROM due JOIN eps ON eps.id = due.endpoint_id
         WHERE NOT eps.disabled
           AND (NOT eps.fifo OR due.id IN (SELECT id FROM heads))
           AND (eps.rate IS NULL OR due.endpoint_id IN (SELECT endpoint_id FROM thr))),
     picked AS MATERIALIZED (
         SELECT r.id, r.next_attempt_at, r.endpoint_id, r.nth, r.updated_at, r.queues, thr.base, thr.step
         FROM ranked r
         LEFT JOIN room_of b ON b.endpoint_id = r.endpoint_id
         LEFT JOIN thr ON thr.endpoint_id = r.endpoint_id
         WHERE r.nth <= COALESCE($6 - b.n, $16)
           AND (NOT r.fifo OR r.nth <= 1)
           AND (thr.base IS NULL OR thr.base + (r.nth - 1) * thr.step < $10)
         ORDER BY (r.retry AND r.kth > $12), r.next_attempt_at, r.id LIMIT $7),
     to_queue AS MATERIALIZED (
         SELECT due.id, due.updated_at FROM due JOIN eps ON eps.id = due.endpoint_id
         WHERE due.queued_at IS NULL AND NOT eps.disabled
           AND (eps.fifo OR eps.rate IS NOT NULL) AND due.id NOT IN (SELECT id FROM picked)
           AND NOT EXISTS (SELECT 1 FROM fifo_heads h WHERE h.endpoint_id = due.endpoint_id AND h.busy
                             AND (due.updated_at, due.msg_id) < (h.k, h.msg_id))),
     queued AS (
         UPDATE deliveries d SET queued_at = q.updated_at FROM to_queue q WHERE d.id = q.id
         RETURNING d.endpoint_id),
     advanced AS (
         UPDATE endpoint_throttle t SET tat_us = c.base + c.n * c.step
         FROM (SELECT endpoint_id, MAX(base) AS base, MAX(step) AS step, COUNT(*) AS n FROM picked
               WHERE base IS NOT NULL GROUP BY endpoint_id) c
         WHERE t.endpoint_id = c.endpoint_id),
     bound AS MATERIALIZED (
         SELECT CASE WHEN COUNT(*) >= $3 THEN MAX(next_attempt_at) ELSE $1 END AS until FROM due_head),
     no_room AS MATERIALIZED (
         SELECT e.id, (e.id = ANY($2::text[]) OR e.id IN (SELECT endpoint_id FROM full_thr)) AS stuck,
                (e.ordering = 'fifo' OR COALESCE(e.rate_limit, 0) > 0) AS queues,
                e.ordering = 'fifo' AS fifo
         FROM endpoints e
         WHERE e.id IN (SELECT unnest($2::text[]) UNION SELECT endpoint_id FROM full_thr
                        UNION SELECT id FROM fifo_mine)
           AND NOT e.disabled
         FOR KEY SHARE OF e SKIP LOCKED),
     to_park AS MATERIALIZED (
         SELECT d.id, d.endpoint_id FROM deliveries d
         WHERE EXISTS (SELECT 1 FROM no_room)
           AND d.state < 2 AND NOT d.held AND NOT d.parked AND d.state = 0
           AND d.next_attempt_at <= LEAST($13, (SELECT until FROM bound))
           AND d.endpoint_id IN (SELECT id FROM no_room)
           AND (d.endpoint_id IN (SELECT id FROM no_room WHERE stuck)
                OR (d.queued_at IS NOT NULL AND d.id NOT IN (SELECT id FROM fifo_heads)))
           AND (d.queued_at IS NOT NULL OR d.endpoint_id NOT IN (SELECT id FROM no_room WHERE fifo)
                OR NOT EXISTS (
                    SELECT 1 FROM (SELECT x.state, x.next_attempt_at, x.queued_at, x.msg_id FROM deliveries x
                                   WHERE x.endpoint_id = d.endpoint_id AND x.queued_at IS NOT NULL
                                     AND x.state < 2 ORDER BY x.queued_at, x.msg_id LIMIT 1) h
                    WHERE h.state = 1 AND h.next_attempt_at > $1
                      AND (d.updated_at, d.msg_id) < (h.queued_at, h.msg_id)))
         ORDER BY d.next_attempt_at LIMIT $14
         FOR UPDATE OF d SKIP LOCKED),
     parked_now AS (
         UPDATE deliveries d SET parked = TRUE,
                queued_at = CASE WHEN n.queues THEN COALESCE(d.queued_at, d.updated_at) ELSE d.queued_at END
         FROM to_park p JOIN no_room n ON n.id = p.endpoint_id
         WHERE d.id = p.id
         RETURNING d.endpoint_id),
     turned AS (
         UPDATE endpoints e SET fifo_turns = e.fifo_turns + 1,
                fifo_last = GREATEST(e.fifo_last, COALESCE((SELECT MAX(x.updated_at) FROM due x
                                                            WHERE x.endpoint_id = e.id AND x.queued_at IS NULL), 0))
         WHERE e.id IN (SELECT id FROM fifo_mine)
           AND e.id IN (SELECT endpoint_id FROM picked UNION SELECT endpoint_id FROM queued
                        UNION SELECT endpoint_id FROM parked_now)),
     remembered AS (
         INSERT INTO parked_endpoints AS p (endpoint_id)
         SELECT DISTINCT endpoint_id FROM parked_now ORDER BY endpoint_id
         ON CONFLICT (endpoint_id) DO UPDATE SET parks = p.parks + 1),
     forgot AS (
         DELETE FROM parked_endpoints p USING (
             SELECT q.endpoint_id FROM parked_endpoints q
             JOIN parked_eps pe ON pe.endpoint_id = q.endpoint_id AND pe.parks = q.parks
             WHERE (NOT pe.fifo OR pe.endpoint_id IN (SELECT id FROM fifo_mine))
               AND pe.endpoint_id NOT IN (SELECT endpoint_id FROM to_park)
               AND (SELECT d.id FROM deliveries d
                    WHERE d.parked AND d.endpoint_id = pe.endpoint_id
                      AND d.id NOT IN (SELECT id FROM picked)
                    ORDER BY d.next_attempt_at LIMIT 1) IS NULL
             FOR UPDATE OF q SKIP LOCKED) f
         WHERE p.endpoint_id = f.endpoint_id)
     UPDATE deliveries d SET state = 1, next_attempt_at = $8, lease_token = $9, updated_at = $1, parked = FALSE,
            queued_at = COALESCE(d.queued_at, CASE WHEN p.queues THEN p.updated_at END)
     FROM picked p, messages m, endpoints e
     WHERE d.id = p.id AND m.id = d.msg_id AND e.id = d.endpoint_id
     RETURNING p.next_attempt_at AS due_at,
               CASE WHEN p.base IS NOT NULL THEN (p.base + (p.nth - 1) * p.step + 999) / 1000 END AS send_at,
               d.id, d.msg_id, d.app_id, d.endpoint_id, d.attempts,
               d.cycle_started_at, d.cycle_base, d.manual, m.event_type, m.payload, m.traceparent,
               e.url, e.secret, e.old_secrets, e.headers, e.rate_limit::int8 AS rate_limit,
               e.ordering = 'fifo' AS ordered
