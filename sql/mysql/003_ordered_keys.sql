-- txbox schema 3 for MySQL/MariaDB: events of one key in order (`ordering = "key"`).
--
-- An event of an ordered type is claimed only when no earlier event of its key
-- is still pending, in process or failed, and (with `on_poison = "block"`) no
-- earlier dead letter of its key waits for an operator. The claim looks that up
-- per candidate row in these two indexes. MySQL has no partial index: the
-- status comes before the id, so the lookup reads only the rows of the
-- statuses it asks for, not every sent event of the key.
--
-- The keys are compared byte for byte, as on the other databases: the
-- table's default collation folds case and accents (`Order-7` would wait for
-- `order-7`'s events), and even utf8mb4_bin ignores trailing spaces on
-- MariaDB. So the key becomes the bytes of its UTF-8 (up to 255 characters of
-- 4 bytes). Each column change rebuilds its table once.
--
-- `migrate` applies this file once, after 002 (an index that is there already
-- is passed over; the column changes can run again). By hand: replace
-- `{prefix}` and run it once, after 002.
ALTER TABLE {prefix}outbox_events
    MODIFY event_key VARBINARY(1020) NULL;
ALTER TABLE {prefix}outbox_dead_letters
    MODIFY event_key VARBINARY(1020) NULL;
-- built online (ALGORITHM = INPLACE, LOCK = NONE): writes go on while the
-- index builds; a server that cannot build one so refuses instead of locking
-- the table
CREATE INDEX {prefix}outbox_key_idx
    ON {prefix}outbox_events (event_type, event_key, status, id)
    ALGORITHM = INPLACE LOCK = NONE;
CREATE INDEX {prefix}dead_letters_key_idx
    ON {prefix}outbox_dead_letters (event_type, event_key, status, id)
    ALGORITHM = INPLACE LOCK = NONE;
INSERT INTO {prefix}txbox_schema_version (version, applied_at) VALUES (3, UTC_TIMESTAMP(6));
