-- txbox schema 2 for SQLite: the inbox deduplicates per consumer.
--
-- `inbox_consumed` was keyed by the event id alone, so a second consumer of the
-- same event in the same database (billing and shipping) saw a duplicate and never
-- ran. The key becomes (event_id, consumer): the event id first, so the cleanup,
-- which deletes by event id, finds its rows by the key. Rows recorded before this
-- upgrade do not say which consumer recorded them: they get the consumer '*',
-- which every consumer treats as its own, so no event is handled twice across the
-- upgrade.
--
-- SQLite cannot change a primary key in place: the table is copied into a new one.
-- `migrate` applies this file once, after 001, in one transaction. By hand: replace
-- `{prefix}` and run it once inside BEGIN ... COMMIT, after 001_schema.sql.
CREATE TABLE {prefix}inbox_consumed_v2 (
    consumer    TEXT NOT NULL,
    event_id    TEXT NOT NULL,
    consumed_at TEXT NOT NULL,
    PRIMARY KEY (event_id, consumer)
);
INSERT INTO {prefix}inbox_consumed_v2 (consumer, event_id, consumed_at)
    SELECT '*', event_id, consumed_at FROM {prefix}inbox_consumed;
DROP TABLE {prefix}inbox_consumed;
ALTER TABLE {prefix}inbox_consumed_v2 RENAME TO {prefix}inbox_consumed;
CREATE INDEX {prefix}inbox_consumed_at_idx ON {prefix}inbox_consumed (consumed_at);
INSERT INTO {prefix}txbox_schema_version (version) VALUES (2);
