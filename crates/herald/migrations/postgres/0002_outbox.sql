-- The transactional outbox: an application sharing Herald's PostgreSQL
-- calls send_message() inside its own transaction, beside its own writes,
-- so the message (and its deliveries) exists exactly when, and only if,
-- that transaction commits.
--
-- Everything here is created in Herald's schema (the search_path this runs
-- under) and pinned to it with SET search_path FROM CURRENT, so the
-- functions find Herald's tables whatever the caller's search_path is.
-- They run with the caller's privileges (SECURITY INVOKER): the caller
-- needs to be allowed to write Herald's tables.

-- The NOTIFY channel that wakes every Herald process on this schema:
-- `herald_wake_<schema>`, or, when that would not fit in a channel name
-- (63 bytes), `herald_wake_` and the first 51 hex digits of the schema
-- name's SHA-256. PostgresStore reads the name from here when it opens, so
-- the SQL and the Rust side cannot disagree.
CREATE FUNCTION herald_wake_channel() RETURNS text
LANGUAGE sql STABLE
SET search_path FROM CURRENT
AS $$
    SELECT CASE
        WHEN octet_length('herald_wake_' || current_schema()) <= 63
            THEN 'herald_wake_' || current_schema()
        ELSE 'herald_wake_' || left(encode(sha256(convert_to(current_schema(), 'UTF8')), 'hex'), 51)
    END
$$;

-- Now, in Unix milliseconds: the clock, not the transaction's start, so a
-- long transaction still gets ids near the time it writes them.
CREATE FUNCTION herald_now_ms() RETURNS bigint
LANGUAGE sql VOLATILE
AS $$
    SELECT floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint
$$;

-- n random bytes. gen_random_uuid() is built in since PostgreSQL 13 and
-- draws from the same strong source as pgcrypto's gen_random_bytes(), with
-- no extension to install; a version 4 UUID has 14 whole random bytes (the
-- version and variant bits take parts of bytes 6 and 8). Older servers
-- fall back to random(), which is enough for unique ids.
DO $do$
BEGIN
    IF to_regprocedure('pg_catalog.gen_random_uuid()') IS NOT NULL THEN
        CREATE FUNCTION herald_random_bytes(n integer) RETURNS bytea
        LANGUAGE sql VOLATILE
        AS $f$
            SELECT substring(string_agg(substring(u FROM 1 FOR 6)
                                        || substring(u FROM 8 FOR 1)
                                        || substring(u FROM 10 FOR 7), ''::bytea)
                             FROM 1 FOR n)
            FROM (SELECT uuid_send(gen_random_uuid()) AS u
                  FROM generate_series(1, (n + 13) / 14)) AS uuids
        $f$;
    ELSE
        CREATE FUNCTION herald_random_bytes(n integer) RETURNS bytea
        LANGUAGE sql VOLATILE
        AS $f$
            SELECT string_agg(set_byte('\x00'::bytea, 0, floor(random() * 256)::integer), ''::bytea)
            FROM generate_series(1, n)
        $f$;
    END IF;
END
$do$;

-- A ULID as 26 characters of Crockford base32, as herald::ids parses:
-- 48 bits of Unix milliseconds (`ms`, default now: 10 characters of 5 bits,
-- the first holding the top 3) then 80 random bits (16 characters).
-- Unlike the ids Herald makes in-process, two made in the same millisecond
-- do not sort in the order they were made.
CREATE FUNCTION herald_ulid(ms bigint DEFAULT NULL) RETURNS text
LANGUAGE sql VOLATILE
SET search_path FROM CURRENT
AS $$
    WITH t AS (SELECT coalesce(ms, herald_now_ms()) AS ms, herald_random_bytes(16) AS r)
    SELECT string_agg(substr('0123456789ABCDEFGHJKMNPQRSTVWXYZ', digit.v + 1, 1), '' ORDER BY digit.i)
    FROM t, LATERAL (
        SELECT i, ((t.ms >> (45 - 5 * i)) & 31)::integer AS v FROM generate_series(0, 9) AS i
        UNION ALL
        SELECT 10 + i, get_byte(t.r, i) & 31 FROM generate_series(0, 15) AS i
    ) AS digit
$$;

-- Queues a message as Herald's API would: `app` is an application's id or
-- uid; the message is fanned out to every enabled endpoint subscribed to
-- `event_type`, due now, and the Herald processes are woken when the
-- transaction commits. Returns the message id (`msg_…`).
--
-- Errors: an unknown app raises no_data_found (P0002); a repeated
-- `event_id` in the app raises unique_violation (23505) on
-- messages_app_id_event_id_key; arguments the API would refuse raise
-- invalid_parameter_value (22023) or null_value_not_allowed (22004). Any
-- error aborts the caller's transaction (use a savepoint to go on).
CREATE FUNCTION send_message(app text, event_type text, payload jsonb, event_id text DEFAULT NULL)
RETURNS text
LANGUAGE plpgsql VOLATILE
SET search_path FROM CURRENT
AS $$
DECLARE
    v_app_id text;
    v_now bigint;
    v_msg_id text;
    v_payload text;
    v_fanned integer;
BEGIN
    IF send_message.app IS NULL OR send_message.event_type IS NULL OR send_message.payload IS NULL THEN
        RAISE EXCEPTION 'herald send_message: app, event_type and payload must not be NULL'
            USING ERRCODE = 'null_value_not_allowed';
    END IF;
    -- The API's rules (api::valid_uid, the eventId length, MAX_PAYLOAD_BYTES).
    IF send_message.event_type !~ '^[A-Za-z0-9._-]+$' OR length(send_message.event_type) > 256 THEN
        RAISE EXCEPTION 'herald send_message: event_type "%" must be 1-256 characters of letters, digits, ''-'', ''_'' or ''.''',
            left(send_message.event_type, 80)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF send_message.event_id IS NOT NULL
       AND (send_message.event_id = '' OR octet_length(send_message.event_id) > 256) THEN
        RAISE EXCEPTION 'herald send_message: event_id must be 1-256 bytes'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    v_payload := send_message.payload::text;
    IF octet_length(v_payload) > 1048576 THEN
        RAISE EXCEPTION 'herald send_message: payload is % bytes; the limit is 1048576', octet_length(v_payload)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- KEY SHARE: the app cannot be deleted under the message.
    SELECT a.id INTO v_app_id
    FROM applications a
    WHERE a.id = send_message.app OR a.uid = send_message.app
    ORDER BY a.id = send_message.app DESC
    LIMIT 1
    FOR KEY SHARE;
    IF v_app_id IS NULL THEN
        RAISE EXCEPTION 'herald send_message: no application with id or uid "%"', send_message.app
            USING ERRCODE = 'no_data_found';
    END IF;

    v_now := herald_now_ms();
    v_msg_id := 'msg_' || herald_ulid(v_now);
    -- A repeated event_id in the app violates messages_app_id_event_id_key
    -- (after waiting for a concurrent transaction holding the same one).
    INSERT INTO messages (id, app_id, event_type, event_id, payload, created_at)
    VALUES (v_msg_id, v_app_id, send_message.event_type, send_message.event_id, v_payload, v_now);

    -- One delivery per enabled, subscribed endpoint, as insert_messages
    -- makes them. KEY SHARE keeps the endpoints from being deleted under
    -- the new deliveries; one deleted meanwhile is skipped.
    INSERT INTO deliveries (id, msg_id, endpoint_id, app_id, state, next_attempt_at,
                            cycle_started_at, created_at, updated_at)
    SELECT 'dlv_' || herald_ulid(v_now), v_msg_id, e.id, v_app_id, 0, v_now, v_now, v_now, v_now
    FROM (SELECT ep.id FROM endpoints ep
          WHERE ep.app_id = v_app_id
            AND NOT ep.disabled
            AND (ep.filter_types IS NULL OR ep.filter_types ? send_message.event_type)
          ORDER BY ep.id
          FOR KEY SHARE) AS e;
    GET DIAGNOSTICS v_fanned = ROW_COUNT;

    IF v_fanned > 0 THEN
        -- Sent on commit only, once per transaction however many calls.
        PERFORM pg_notify(herald_wake_channel(), '');
    END IF;
    RETURN v_msg_id;
END
$$;
