-- txbox schema 2 for Oracle: the inbox deduplicates per consumer.
--
-- `inbox_consumed` was keyed by the event id alone, so a second consumer of the
-- same event in the same database (billing and shipping) saw a duplicate and never
-- ran. The key becomes (event_id, consumer): the event id first, so the cleanup,
-- which deletes by event id, finds its rows by the key. Rows recorded before this
-- upgrade do not say which consumer recorded them: they get the consumer '*',
-- which every consumer treats as its own, so no event is handled twice across the
-- upgrade. ('*' and not '': Oracle stores an empty string as NULL.) The column
-- then has no default: a 0.1 process still writing to the table fails loudly
-- instead of recording ids for every consumer.
--
-- Oracle commits each DDL statement on its own. `migrate` applies this file once,
-- after 001; a run that stopped half-way is resumed (an error that says a change
-- is there already is passed over). DDL waits for no lock by default
-- (DDL_LOCK_TIMEOUT): run it while no consumer writes to the inbox, or run
-- `migrate` again after ORA-00054. By hand: replace `{prefix}` and run it once,
-- after 001_schema.sql, then COMMIT.
ALTER TABLE {prefix}inbox_consumed ADD (consumer VARCHAR2(100) DEFAULT '*' NOT NULL);
ALTER TABLE {prefix}inbox_consumed DROP PRIMARY KEY DROP INDEX;
ALTER TABLE {prefix}inbox_consumed ADD PRIMARY KEY (event_id, consumer);
ALTER TABLE {prefix}inbox_consumed MODIFY (consumer DEFAULT NULL);
INSERT INTO {prefix}txbox_schema_version (version) VALUES (2);
