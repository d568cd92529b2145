-- txbox schema 9 for PostgreSQL: delayed events and paused event types.
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
CREATE OR REPLACE FUNCTION {prefix}txbox_wake() RETURNS trigger LANGUAGE plpgsql AS $$ DECLARE seen text; mark text; BEGIN IF NEW.status <> 'PENDING' OR current_setting('txbox.wake', true) = 'off' THEN RETURN NULL; END IF; PERFORM pg_advisory_xact_lock_shared(hashtextextended(TG_TABLE_NAME || ' ' || NEW.event_type, 0)); IF NOT pg_try_advisory_xact_lock(hashtext(TG_TABLE_NAME), hashtext(NEW.event_type)) THEN RETURN NULL; END IF; seen := coalesce(current_setting('txbox.notified', true), ''); mark := E'\n' || TG_TABLE_NAME || ' ' || NEW.event_type || E'\n'; IF strpos(seen, mark) > 0 THEN RETURN NULL; END IF; PERFORM set_config('txbox.notified', seen || mark, true); IF pg_notification_queue_usage() >= (CASE WHEN current_setting('txbox.queue_limit', true) ~ '^[0-9]*[.]?[0-9]+$' THEN current_setting('txbox.queue_limit', true)::float8 ELSE 0.5 END) OR EXISTS (SELECT 1 FROM {prefix}outbox_quiet_types q WHERE q.event_type = NEW.event_type) THEN RETURN NULL; END IF; PERFORM pg_notify(TG_TABLE_NAME, NEW.event_type); RETURN NULL; END $$;
COMMIT;
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}outbox_events_due_idx
    ON {prefix}outbox_events (event_type, next_attempt_at)
    WHERE status = 'PENDING';
INSERT INTO {prefix}txbox_schema_version (version) VALUES (9);
