-- txbox schema 8 for PostgreSQL: the wake-up on commit takes one lock per
-- commit, not two.
--
-- Schema 6's trigger took a shared advisory lock of the event type in every
-- publishing commit ("a publisher of the type is committing"), which the
-- relay's listener asked about before waking a poller again for the commits
-- that skipped their notification. Every publisher took and released it on
-- one hot key: measured on 2 cores, 8 publishers, it cost about a tenth of
-- each commit's CPU time, where a trigger that does nothing costs 1-2 %.
--
-- The listener no longer needs it. It notes the transactions that are in
-- progress (`pg_current_snapshot()`) when a notification arrives and when it
-- ends a hold, and wakes the poller again as they end: each commit that
-- skipped its notification was one of them. The trigger keeps the rest of
-- schema 6 (see 006_rationed_wake.sql): `txbox.wake = 'off'`, one notifying
-- commit per event type in flight (the type's advisory lock, tried without
-- waiting; a commit that does not get it skips its notification cheaply),
-- the quiet types, the queue limit.
--
-- Locks: CREATE OR REPLACE FUNCTION locks no table; publishers go on.
--
-- `migrate` applies this file once, after 007. By hand: replace `{prefix}`
-- and run it once with psql, after 007.
CREATE OR REPLACE FUNCTION {prefix}txbox_wake() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    seen text;
    mark text;
BEGIN
    IF current_setting('txbox.wake', true) = 'off' THEN
        RETURN NULL;
    END IF;
    -- one notifying commit of the type in flight, or the listener holds it
    IF NOT pg_try_advisory_xact_lock(hashtext(TG_TABLE_NAME), hashtext(NEW.event_type)) THEN
        RETURN NULL;
    END IF;
    -- once per transaction and type
    seen := coalesce(current_setting('txbox.notified', true), '');
    mark := E'\n' || TG_TABLE_NAME || ' ' || NEW.event_type || E'\n';
    IF strpos(seen, mark) > 0 THEN
        RETURN NULL;
    END IF;
    PERFORM set_config('txbox.notified', seen || mark, true);
    IF pg_notification_queue_usage() >= (CASE
            WHEN current_setting('txbox.queue_limit', true) ~ '^[0-9]*[.]?[0-9]+$'
            THEN current_setting('txbox.queue_limit', true)::float8
            ELSE 0.5 END)
        OR EXISTS (SELECT 1 FROM {prefix}outbox_quiet_types q WHERE q.event_type = NEW.event_type) THEN
        RETURN NULL;
    END IF;
    PERFORM pg_notify(TG_TABLE_NAME, NEW.event_type);
    RETURN NULL;
END
$$;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (8);
