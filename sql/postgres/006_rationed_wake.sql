-- txbox schema 6 for PostgreSQL: the wake-up on commit no longer serializes the
-- publishers' commits.
--
-- PostgreSQL commits every transaction with a pending NOTIFY one at a time,
-- cluster-wide, holding a lock through the commit's WAL flush: with schema 3's
-- trigger (a NOTIFY from every publishing transaction) the commits of many
-- concurrent publishers could not be flushed together, and half of the
-- database's write throughput was gone at 8 writers.
--
-- Schema 6 rations the notifications. The trigger is deferred: it decides at
-- commit, once per transaction and event type, for events due now:
--  1. `SET txbox.wake = 'off'` (for a transaction, a session or a role) sends
--     nothing: a transaction that ends in PREPARE TRANSACTION (two-phase
--     commit) must, since PostgreSQL refuses to prepare after a NOTIFY;
--  2. it takes a shared advisory lock of the type (`hashtextextended('<outbox
--     table> <event type>', 0)`) until its commit is done: "a publisher of the
--     type is committing";
--  3. it notifies only if it gets the type's advisory lock
--     (`hashtext(<outbox table>)`, `hashtext(<event type>)`) at once: at most
--     one notifying commit per event type is in flight, and the others commit
--     without one (they group-commit);
--  4. nor when the type's wake-up is `poll` (a row in `outbox_quiet_types`,
--     written by the relay from its configuration) or the notification queue
--     is half full or more (`pg_notification_queue_usage()` at least
--     `txbox.queue_limit`, default 0.5: a listener that stopped reading holds
--     its tail; past that, the relay polls).
-- The relay's listener, woken by the notifying commit, takes the type's lock
-- of step 3 itself until the type's poller starts its next claim (at most 50
-- ms): while commits come faster than claims, they skip their notification.
-- It wakes the poller, and wakes it again as soon as no publisher holds the
-- shared lock of step 2 any more: the commits that skipped their notification
-- are visible by then.
--
-- The whole table's notifications off (migrate does not turn them on again):
-- `ALTER TABLE <outbox table> DISABLE TRIGGER <prefix>outbox_events_wake`.
-- A table whose schema 3 trigger was disabled gets the new trigger disabled.
--
-- Locks: CREATE and DROP TRIGGER take the outbox table's SHARE ROW EXCLUSIVE
-- and ACCESS EXCLUSIVE locks for a moment (no rows are read or written).
--
-- `migrate` applies this file once, after 005, in one transaction. By hand:
-- replace `{prefix}` and run it once with psql, after 005.
CREATE TABLE IF NOT EXISTS {prefix}outbox_quiet_types (
    event_type varchar(255) PRIMARY KEY                   -- its wake-up is `poll`: no NOTIFY
);
-- the trigger reads it in the publishers' sessions, whatever their role
GRANT SELECT ON {prefix}outbox_quiet_types TO PUBLIC;
CREATE OR REPLACE FUNCTION {prefix}txbox_wake() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    seen text;
    mark text;
BEGIN
    IF current_setting('txbox.wake', true) = 'off' THEN
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
CREATE CONSTRAINT TRIGGER {prefix}outbox_events_wake AFTER INSERT ON {prefix}outbox_events
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW
    WHEN (NEW.status = 'PENDING' AND NEW.next_attempt_at <= now())
    EXECUTE FUNCTION {prefix}txbox_wake();
DO $$
BEGIN
    IF EXISTS (SELECT 1 FROM pg_trigger
               WHERE tgname = lower('{prefix}outbox_events_notify')
                 AND tgrelid = '{prefix}outbox_events'::regclass AND tgenabled = 'D') THEN
        ALTER TABLE {prefix}outbox_events DISABLE TRIGGER {prefix}outbox_events_wake;
    END IF;
END
$$;
DROP TRIGGER IF EXISTS {prefix}outbox_events_notify ON {prefix}outbox_events;
DROP FUNCTION IF EXISTS {prefix}txbox_notify();
INSERT INTO {prefix}txbox_schema_version (version) VALUES (6);
