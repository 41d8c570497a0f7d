-- Endpoint health. The streak columns are kept current by every batch of
-- outcomes, so reading an endpoint's health never scans its attempts.
ALTER TABLE endpoints ADD COLUMN fail_streak INTEGER NOT NULL DEFAULT 0;
ALTER TABLE endpoints ADD COLUMN streak_started_at BIGINT;   -- first failure of the streak
ALTER TABLE endpoints ADD COLUMN last_success_at BIGINT;
ALTER TABLE endpoints ADD COLUMN last_error TEXT;
ALTER TABLE endpoints ADD COLUMN last_error_at BIGINT;
ALTER TABLE endpoints ADD COLUMN disabled_reason TEXT;
ALTER TABLE endpoints ADD COLUMN disabled_at BIGINT;
-- 'auto' (Herald disabled it: new messages are still routed to it and held)
-- or 'operator' (API, dashboard, CLI: nothing new is routed while disabled).
ALTER TABLE endpoints ADD COLUMN disabled_by TEXT;
-- The dashboard lists failing endpoints first.
CREATE INDEX endpoints_by_streak ON endpoints(fail_streak DESC, id);

-- Attempt counts and a latency histogram per endpoint per 5-minute bucket:
-- the 1 h and 24 h figures read at most 288 rows per endpoint.
-- h0..h11 count attempts whose duration is at most 10, 25, 50, 100, 250,
-- 500, 1000, 2500, 5000, 10000, 30000 ms, and above (h11).
CREATE TABLE endpoint_stats (
    endpoint_id TEXT COLLATE "C" NOT NULL,
    bucket      BIGINT NOT NULL,   -- start of the 5-minute bucket, ms
    attempts    BIGINT NOT NULL DEFAULT 0,
    successes   BIGINT NOT NULL DEFAULT 0,
    failures    BIGINT NOT NULL DEFAULT 0,
    latency_sum BIGINT NOT NULL DEFAULT 0,
    h0 BIGINT NOT NULL DEFAULT 0, h1 BIGINT NOT NULL DEFAULT 0, h2 BIGINT NOT NULL DEFAULT 0,
    h3 BIGINT NOT NULL DEFAULT 0, h4 BIGINT NOT NULL DEFAULT 0, h5 BIGINT NOT NULL DEFAULT 0,
    h6 BIGINT NOT NULL DEFAULT 0, h7 BIGINT NOT NULL DEFAULT 0, h8 BIGINT NOT NULL DEFAULT 0,
    h9 BIGINT NOT NULL DEFAULT 0, h10 BIGINT NOT NULL DEFAULT 0, h11 BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (endpoint_id, bucket)
);
-- Retention drops old buckets by age.
CREATE INDEX endpoint_stats_by_age ON endpoint_stats(bucket);
-- Dead letters across applications, newest first (dashboard and CLI).
CREATE INDEX deliveries_dead_all ON deliveries(id) WHERE state = 3;

-- An auto-disabled endpoint still collects messages (held until it is
-- enabled again); one disabled by a person does not. Same as insert_messages.
CREATE OR REPLACE FUNCTION send_message(app text, event_type text, payload jsonb, event_id text DEFAULT NULL)
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
            AND (NOT ep.disabled OR ep.disabled_by = 'auto')
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
