-- txbox schema 3 for PostgreSQL: a commit that published events wakes the relay.
--
-- After every INSERT into the outbox (one publish, a batch, a dead letter sent
-- back), a statement-level trigger sends `NOTIFY <outbox table>, '<event type>'`
-- once per event type of the statement. PostgreSQL delivers a notification only
-- when its transaction commits, and folds the same channel and payload sent
-- twice in one transaction into one: a rolled-back publish wakes nobody, and a
-- transaction that publishes 1,000 events of one type wakes its poller once.
-- Only rows due now notify (a held claim's write-back of a failed event, due
-- later or FAILED, wakes nobody). The relay's listener (`LISTEN <outbox table>`)
-- wakes the poller of that type; polling stays the safety net. To turn the
-- notifications off for the whole table (NOTIFY serializes the commits of
-- every notifying transaction of the cluster): `ALTER TABLE <outbox table>
-- DISABLE TRIGGER <prefix>outbox_events_notify`.
--
-- `migrate` applies this file once, after 002, in one transaction. By hand:
-- replace `{prefix}` and run it once with psql, after 002.
CREATE OR REPLACE FUNCTION {prefix}txbox_notify() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_notify(TG_TABLE_NAME, t.event_type)
    FROM (SELECT DISTINCT event_type FROM new_events
          WHERE status = 'PENDING' AND next_attempt_at <= now()) AS t;
    RETURN NULL;
END
$$;
CREATE TRIGGER {prefix}outbox_events_notify AFTER INSERT ON {prefix}outbox_events
    REFERENCING NEW TABLE AS new_events
    FOR EACH STATEMENT EXECUTE FUNCTION {prefix}txbox_notify();
INSERT INTO {prefix}txbox_schema_version (version) VALUES (3);
