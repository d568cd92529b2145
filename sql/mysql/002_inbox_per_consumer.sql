-- txbox schema 2 for MySQL/MariaDB: the inbox deduplicates per consumer.
--
-- `inbox_consumed` was keyed by the event id alone, so a second consumer of the
-- same event in the same database (billing and shipping) saw a duplicate and never
-- ran. The key becomes (event_id, consumer): the event id first, so the cleanup,
-- which deletes by event id, finds its rows by the key. Rows recorded before this
-- upgrade do not say which consumer recorded them: they get the consumer '*',
-- which every consumer treats as its own, so no event is handled twice across the
-- upgrade.
--
-- The consumer is compared byte for byte (utf8mb4_bin), as on the other
-- databases: the table's default collation would fold case, and `Billing` and
-- `billing` would share their ids. The column then has no default: a 0.1 process
-- still writing to the table no longer records ids for every consumer.
--
-- MySQL commits each DDL statement on its own: the key change is one statement,
-- so it happens whole or not at all. `migrate` applies this file once, after 001;
-- a run that stopped half-way is resumed (an error that says the change is there
-- already is passed over). By hand: replace `{prefix}` and run it once, after
-- 001_schema.sql.
ALTER TABLE {prefix}inbox_consumed
    ADD COLUMN consumer VARCHAR(100) CHARACTER SET utf8mb4 COLLATE utf8mb4_bin NOT NULL DEFAULT '*' FIRST,
    DROP PRIMARY KEY,
    ADD PRIMARY KEY (event_id, consumer);
ALTER TABLE {prefix}inbox_consumed ALTER COLUMN consumer DROP DEFAULT;
INSERT INTO {prefix}txbox_schema_version (version, applied_at) VALUES (2, UTC_TIMESTAMP(6));
