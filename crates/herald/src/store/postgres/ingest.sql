-- Ingest (store/postgres/queue.rs, `PostgresStore::ingest`): a batch of
-- messages and the deliveries routing made for them, in one statement (one
-- implicit transaction). Parameters, bound in this order:
--   $1–$7   the messages: ids, app ids, event types, event ids, payloads,
--           created_at (ms), channels (JSON)
--   $8      the batch's applications   $9 the endpoints it fans out to
--   $10–$14 the deliveries: ids, message ids, endpoint ids, app ids,
--           created_at (ms)
--   $15     the wake-up channel (pg_notify)
--   $16–$18 the deliveries' states, due times (ms), lease tokens (those
--           ingest hands straight to its own dispatcher)
--   $19–$21 the messages' traceparent, tags (JSON), deliverAt (ms)
--   $22     the deliveries' cycle starts (ms: when each falls due)
--   $23     the messages' payload expiry (ms)
-- The named parts:
--
-- `a`, `e`: KEY SHARE on the apps and endpoints keeps them from being
-- deleted under the new rows. An endpoint is locked only once its app is
-- (`e` reads `a`), the order in which deleting an app takes them, so the
-- two cannot deadlock. One deleted in between is simply not locked, so its
-- messages are refused alone (NoSuchApp) or its deliveries left out,
-- never failing the batch on a foreign key.
--
-- `m`: messages go in in batch order, so that of two with the same
-- eventId the first is kept, as one at a time would.
--
-- `nv`: routing read the endpoints without locks: one disabled since is
-- judged again here, on the row as locked, by the rule routing applies
-- (disabled by a person: no delivery; by Herald: held, so never born
-- delivering).
--
-- `f`, `k`, `placed`: a FIFO endpoint's deliveries get their queue place
-- here, in the order the batches commit (`created_at` is taken before, in
-- the API process, so two processes' messages could commit in the other
-- order, and a claim took the later one first): its row is locked until
-- the commit (`f`, NO KEY UPDATE, in id order, after KEY SHARE as the lock
-- order says; claims skip it meanwhile), `fifo_last` read as locked (the
-- newest version, whoever committed before), the batch's places put after
-- it in message order (`k`: at least each message's `created_at`, so the
-- keys stay times, as those claims give) and it moved on (`placed`;
-- migration 0021). A scheduled message's (`deliverAt` ahead) gets none: a
-- head not due would hold the queue; it takes its place when a claim
-- meets it due.
--
-- `d`, and the answer: the deliveries, then one row per application found
-- (`a`), message stored (`m`) and delivery made (`d`, with its id when
-- ingest claimed it); workers are woken (`n`) when deliveries were made
-- pending.

WITH a AS MATERIALIZED (
        SELECT id FROM applications WHERE id = ANY($8::text[]) ORDER BY id FOR KEY SHARE),
    e AS MATERIALIZED (
        SELECT id, disabled, disabled_by FROM endpoints
        WHERE id = ANY($9::text[]) AND app_id IN (SELECT id FROM a)
        ORDER BY id FOR KEY SHARE),
    f AS MATERIALIZED (
        SELECT id, fifo_last FROM endpoints
        WHERE id = ANY (ARRAY(SELECT id FROM e)) AND ordering = 'fifo'
        ORDER BY id FOR NO KEY UPDATE),
    m AS (
        INSERT INTO messages (id, app_id, event_type, event_id, payload, created_at, channels, traceparent,
                              tags, deliver_at, payload_expires_at)
        SELECT id, app_id, event_type, event_id, payload, created_at, channels, traceparent, tags, deliver_at,
               payload_expires_at
        FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::int8[], $7::text[], $19::text[],
                    $20::text[], $21::int8[], $23::int8[])
             WITH ORDINALITY AS u(id, app_id, event_type, event_id, payload, created_at, channels, traceparent,
                                  tags, deliver_at, payload_expires_at, ord)
        WHERE u.app_id IN (SELECT id FROM a)
        ORDER BY ord
        ON CONFLICT DO NOTHING
        RETURNING id),
    nv AS MATERIALIZED (
        SELECT v.*, e.disabled FROM UNNEST($10::text[], $11::text[], $12::text[], $13::text[],
                    $14::int8[], $16::int2[], $17::int8[], $18::text[], $22::int8[])
             AS v(id, msg_id, endpoint_id, app_id, at, state, due, token, start)
             JOIN e ON e.id = v.endpoint_id
        WHERE v.msg_id IN (SELECT id FROM m)
          AND (NOT e.disabled OR e.disabled_by = 'auto')),
    k AS MATERIALIZED (
        SELECT v.id, v.endpoint_id, GREATEST(f.fifo_last + row_number() OVER (
                   PARTITION BY v.endpoint_id ORDER BY v.at, v.msg_id), v.at) AS place
        FROM nv v JOIN f ON f.id = v.endpoint_id WHERE v.start <= v.at),
    placed AS (
        UPDATE endpoints x SET fifo_last = k.last
        FROM (SELECT endpoint_id, MAX(place) AS last FROM k GROUP BY endpoint_id) k
        WHERE x.id = k.endpoint_id),
    d AS (
        INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at,
                                lease_token, cycle_started_at, created_at, updated_at, queued_at)
        SELECT v.id, v.msg_id, v.endpoint_id, v.app_id,
               CASE WHEN v.disabled THEN 0 ELSE v.state END,
               CASE WHEN v.disabled THEN v.start ELSE v.due END,
               CASE WHEN v.disabled THEN NULL ELSE v.token END, v.start, v.at, v.at, k.place
        FROM nv v LEFT JOIN k ON k.id = v.id
        RETURNING id, msg_id, state)
SELECT 'a' AS kind, id, NULL AS delivery FROM a
UNION ALL SELECT 'm', id, NULL FROM m
UNION ALL SELECT 'd', msg_id, CASE WHEN state = 1 THEN id END FROM d
UNION ALL SELECT 'n', NULL, NULL FROM (
    SELECT pg_notify($15, '') FROM (SELECT 1 FROM d WHERE state = 0 LIMIT 1) one) woken
