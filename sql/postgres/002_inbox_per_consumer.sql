-- txbox schema 2 for PostgreSQL: the inbox deduplicates per consumer.
--
-- `inbox_consumed` was keyed by the event id alone, so a second consumer of the
-- same event in the same database (billing and shipping) saw a duplicate and never
-- ran. The key becomes (event_id, consumer): the event id first, so the cleanup,
-- which deletes by event id, finds its rows by the key. Rows recorded before this
-- upgrade do not say which consumer recorded them: they get the consumer '*',
-- which every consumer treats as its own, so no event is handled twice across the
-- upgrade. The column then has no default: a 0.1 process still writing to the
-- table fails loudly instead of recording ids for every consumer.
--
-- `migrate` applies this file once, after 001, in one transaction. By hand: replace
-- `{prefix}` and run it once with psql, after 001_schema.sql.
ALTER TABLE {prefix}inbox_consumed ADD COLUMN consumer varchar(100) NOT NULL DEFAULT '*';
ALTER TABLE {prefix}inbox_consumed ALTER COLUMN consumer DROP DEFAULT;
ALTER TABLE {prefix}inbox_consumed DROP CONSTRAINT {prefix}inbox_consumed_pkey;
ALTER TABLE {prefix}inbox_consumed ADD PRIMARY KEY (event_id, consumer);
INSERT INTO {prefix}txbox_schema_version (version) VALUES (2);
