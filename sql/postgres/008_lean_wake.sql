-- txbox schema 8 for PostgreSQL: the wake-up's trigger costs each commit less.
--
-- Schema 6's trigger asked "is the row due now?" in its WHEN clause. For a
-- deferred (constraint) trigger PostgreSQL evaluates that clause at the
-- INSERT, building the expression for every statement: measured on one
-- session, it was about a third of the trigger's cost per commit (10.8 us
-- with it, 7.3 us without; bench/pg_wake_cost.py --cpu). The function asks
-- it now, with the rest of its decision; what it decides is unchanged (see
-- 006):
--  - a row that is not PENDING or not due yet (a held claim's write-back of a
--    failed event, an event due later) sends nothing;
--  - `txbox.wake = 'off'` (a transaction, session or role) sends nothing;
--  - every other commit holds the type's shared advisory lock to its end, and
--    notifies only if it takes the type's lock at once, the queue is under
--    `txbox.queue_limit` and the type is not in `outbox_quiet_types`.
--
-- The trigger's name and its state stay: one disabled by hand (`ALTER TABLE
-- <outbox table> DISABLE TRIGGER <prefix>outbox_events_wake`), or enabled for
-- REPLICA or ALWAYS, is made anew in that state; one dropped by hand stays
-- dropped.
--
-- Locks: DROP and CREATE TRIGGER take the outbox table's ACCESS EXCLUSIVE and
-- SHARE ROW EXCLUSIVE locks for a moment (no rows are read or written); the
-- wait for them is bounded by `maintenance.migrate_lock_timeout`.
--
-- `migrate` applies this file once, after 007, in one transaction. By hand:
-- replace `{prefix}` and run it once with psql, after 007.
CREATE OR REPLACE FUNCTION {prefix}txbox_wake() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    seen text;
    mark text;
BEGIN
    IF NEW.status <> 'PENDING'
       OR NEW.next_attempt_at > now()
       OR current_setting('txbox.wake', true) = 'off' THEN
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
DO $$
DECLARE
    state "char" := (SELECT tgenabled FROM pg_trigger
                     WHERE tgname = lower('{prefix}outbox_events_wake')
                       AND tgrelid = '{prefix}outbox_events'::regclass);
BEGIN
    IF state IS NULL THEN
        RETURN;
    END IF;
    DROP TRIGGER {prefix}outbox_events_wake ON {prefix}outbox_events;
    CREATE CONSTRAINT TRIGGER {prefix}outbox_events_wake AFTER INSERT ON {prefix}outbox_events
        DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {prefix}txbox_wake();
    IF state = 'D' THEN
        ALTER TABLE {prefix}outbox_events DISABLE TRIGGER {prefix}outbox_events_wake;
    ELSIF state = 'R' THEN
        ALTER TABLE {prefix}outbox_events ENABLE REPLICA TRIGGER {prefix}outbox_events_wake;
    ELSIF state = 'A' THEN
        ALTER TABLE {prefix}outbox_events ENABLE ALWAYS TRIGGER {prefix}outbox_events_wake;
    END IF;
END
$$;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (8);
