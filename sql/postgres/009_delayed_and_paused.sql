-- txbox schema 9 for PostgreSQL: delayed events, paused event types, and
-- publishing from SQL.
--
--  - `outbox_events_due_idx`: a type's pending events by their due time. A
--    poller that finds nothing to claim asks when its type's next event is
--    due (`NewEvent::deliver_after`, a retry's backoff) and sleeps until then,
--    one look-up in this index instead of a claim.
--  - `outbox_paused_types`: the event types paused by an operator
--    (`txbox pause TYPE`, `Pauses::pause`); every relay's claims skip them.
--  - the wake-up on commit notifies for a PENDING event due later too (a
--    delayed one, a held claim's write-back of a retry): the woken poller
--    finds nothing to claim and asks when the next event is due, so it
--    sleeps until then instead of its polling delay (up to `polling.max`).
--    Schema 8's function returned early for such rows; the rationing is the
--    same (one notifying commit per type in flight).
--  - `txbox_publish(event_type, payload, event_key, headers)`: a service in
--    any language publishes inside its own transaction with one call,
--    writing what `Outbox::publish` writes (a UUIDv7 id made here from the
--    database's clock, the JSON payload as given, byte for byte: `json`,
--    not `jsonb`, which would reformat it; the headers as a JSON object of
--    strings, due now) and waking the relay the same way (the trigger).
--    It refuses what `publish` refuses (a type, key or header name out of
--    bounds, a reserved header). Returns the event id. `txbox_uuid_v7()`
--    makes the id (from md5 and random(): no pgcrypto before 13). The
--    caller's role needs INSERT on the outbox table, USAGE on its sequence
--    and SELECT on `outbox_quiet_types`, as any publisher's.
--
-- Locks: the table is new; the function is replaced (no table lock); the
-- index is built CONCURRENTLY, beside the writers (it waits for the
-- transactions open when it starts). Function bodies are written on one
-- line.
--
-- `migrate` applies this file once, after 008. By hand: replace `{prefix}`
-- and run it once with psql (not in a transaction block), after 008.
CREATE TABLE IF NOT EXISTS {prefix}outbox_paused_types (
    event_type varchar(255) PRIMARY KEY,
    paused_at  timestamptz  NOT NULL DEFAULT now()
);
CREATE OR REPLACE FUNCTION {prefix}txbox_wake() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    seen text;
    mark text;
BEGIN
    IF NEW.status <> 'PENDING' OR current_setting('txbox.wake', true) = 'off' THEN
        RETURN NULL;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(
        hashtextextended(TG_TABLE_NAME || ' ' || NEW.event_type, 0));
    IF NOT pg_try_advisory_xact_lock(hashtext(TG_TABLE_NAME), hashtext(NEW.event_type)) THEN
        RETURN NULL;
    END IF;
    seen := coalesce(current_setting('txbox.notified', true), '');
    mark := E'\n' || TG_TABLE_NAME || ' ' || NEW.event_type || E'\n';
    IF strpos(seen, mark) > 0 THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('txbox.notified', seen || mark, true);
    IF pg_notification_queue_usage() >= (CASE WHEN current_setting('txbox.queue_limit', true) ~ '^[0-9]*[.]?[0-9]+$'
                                              THEN current_setting('txbox.queue_limit', true)::float8
                                              ELSE 0.5 END)
       OR EXISTS (SELECT 1 FROM {prefix}outbox_quiet_types q
                  WHERE q.event_type = NEW.event_type) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify(TG_TABLE_NAME, NEW.event_type);
    RETURN NULL;
END
$$;
CREATE OR REPLACE FUNCTION {prefix}txbox_uuid_v7() RETURNS uuid LANGUAGE sql VOLATILE AS $$
    SELECT encode(
        set_bit(set_bit(set_bit(set_bit(set_bit(set_bit(
            -- 16 random bytes, the first 6 replaced by the milliseconds since the epoch
            overlay(decode(md5(random()::text || clock_timestamp()::text || random()::text), 'hex')
                    PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                    FROM 1 FOR 6),
            -- version 7 (0111 in bits 52-55), variant 10 (bits 70-71)
            55, 0), 54, 1), 53, 1), 52, 1), 71, 1), 70, 0),
        'hex')::uuid
$$;
-- a pre-release of 0.3 took the payload as jsonb (which reformats it)
DROP FUNCTION IF EXISTS {prefix}txbox_publish(text, jsonb, text, jsonb);
CREATE OR REPLACE FUNCTION {prefix}txbox_publish(
    p_event_type text, p_payload json, p_event_key text DEFAULT NULL, p_headers jsonb DEFAULT '{}'
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid := {prefix}txbox_uuid_v7();
BEGIN
    IF p_event_type IS NULL
       OR octet_length(p_event_type) NOT BETWEEN 1 AND 255
       OR p_event_type ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION
            'txbox_publish: the event type must be 1 to 255 bytes without control characters';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'txbox_publish: the payload must not be NULL';
    END IF;
    IF octet_length(p_event_key) > 255 THEN
        RAISE EXCEPTION 'txbox_publish: the key must be at most 255 bytes';
    END IF;
    IF p_headers IS NOT NULL
       AND (jsonb_typeof(p_headers) <> 'object'
            OR EXISTS (SELECT 1 FROM jsonb_each(p_headers) h
                       WHERE jsonb_typeof(h.value) <> 'string'
                          OR octet_length(h.key) NOT BETWEEN 1 AND 255
                          OR h.key ~ '[[:cntrl:]]'
                          OR lower(h.key) LIKE 'txbox-%'
                          OR lower(h.key) = 'content-type')) THEN
        RAISE EXCEPTION
            'txbox_publish: the headers must be a JSON object of strings, names of 1 to 255 bytes, none reserved (txbox-*, content-type)';
    END IF;
    INSERT INTO {prefix}outbox_events (id, event_type, event_key, headers, payload, next_attempt_at)
    VALUES (new_id, p_event_type, p_event_key, coalesce(p_headers, '{}'), p_payload::text, now());
    RETURN new_id;
END
$$;
COMMIT;
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}outbox_events_due_idx
    ON {prefix}outbox_events (event_type, next_attempt_at)
    WHERE status = 'PENDING';
INSERT INTO {prefix}txbox_schema_version (version) VALUES (9);
