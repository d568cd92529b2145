-- txbox schema 5 for MySQL/MariaDB: a key's events go out in the order the
-- database inserted them.
--
-- Until schema 4 a key's order was its events' ids: UUIDv7 from the clock of
-- the process that published them, so two publishers whose clocks differ
-- could put a key's later event before its earlier one. From schema 5 on the
-- database numbers each event at insert (`seq`, AUTO_INCREMENT), and the
-- ordering rule compares those numbers.
--
-- The events there already are numbered in id order, the order they had (the
-- column change rebuilds the table, in primary key order); the dead letters
-- below all of them, in id order from -9e18 on (an event of a key still in
-- the outbox was published after its dead letters), and so is a dead letter
-- that a relay of an earlier version moves during a rolling upgrade (the
-- column's default). A dead letter keeps its event's number, and an event
-- retried from the dead letters gets it back.
--
-- The key indexes of schema 3 stay until a later schema drops them: relays of
-- the earlier version name them in their claims while a rolling upgrade runs.
--
-- The same rebuild makes the tables utf8mb4 with a binary collation, whatever
-- the server's default when they were made (upstream MariaDB's was latin1
-- through 11.5: a payload in another script was refused or stored as `?`),
-- and text compared byte for byte (an event type `Order` is not `order`). A
-- key that schema 3 turned into the bytes of its latin1 text (not UTF-8)
-- becomes the UTF-8 of that text first, so it stays one key with the same
-- key published since.
--
-- `migrate` applies this file once, after 004 (a column or index that is
-- there already is passed over). The outbox's change rebuilds the table,
-- which takes no writes meanwhile. By hand: replace `{prefix}` and run it
-- once, after 004.
-- (only where the outbox was latin1: elsewhere no key needs it, and the scan
-- would hold every row it reads)
SET @latin1 = (SELECT COUNT(*) > 0 FROM information_schema.TABLES
    WHERE table_schema = DATABASE() AND table_name = '{prefix}outbox_events'
      AND table_collation LIKE 'latin1%');
SET @s = IF(@latin1, 'UPDATE {prefix}outbox_events SET event_key = CONVERT(CONVERT(event_key USING latin1) USING utf8mb4) WHERE event_key IS NOT NULL AND HEX(event_key) NOT REGEXP ''^([0-7][0-9A-F]|(C[2-9A-F]|D[0-9A-F])[89AB][0-9A-F]|E[0-9A-F]([89AB][0-9A-F]){2}|F[0-4]([89AB][0-9A-F]){3})*$''', 'DO 0');
PREPARE txbox_fix FROM @s;
EXECUTE txbox_fix;
DEALLOCATE PREPARE txbox_fix;
SET @s = IF(@latin1, 'UPDATE {prefix}outbox_dead_letters SET event_key = CONVERT(CONVERT(event_key USING latin1) USING utf8mb4) WHERE event_key IS NOT NULL AND HEX(event_key) NOT REGEXP ''^([0-7][0-9A-F]|(C[2-9A-F]|D[0-9A-F])[89AB][0-9A-F]|E[0-9A-F]([89AB][0-9A-F]){2}|F[0-4]([89AB][0-9A-F]){3})*$''', 'DO 0');
PREPARE txbox_fix FROM @s;
EXECUTE txbox_fix;
DEALLOCATE PREPARE txbox_fix;
ALTER TABLE {prefix}outbox_events
    ADD COLUMN seq BIGINT NOT NULL AUTO_INCREMENT,
    ADD KEY {prefix}outbox_seq_idx (seq),
    CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE {prefix}outbox_dead_letters
    ADD COLUMN seq BIGINT NULL DEFAULT -9000000000000000000,
    CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
ALTER TABLE {prefix}job_locks CONVERT TO CHARACTER SET utf8mb4 COLLATE utf8mb4_bin;
-- their text columns are utf8mb4 already (or none): new columns follow
ALTER TABLE {prefix}inbox_consumed DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
ALTER TABLE {prefix}txbox_schema_version DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
-- numbered after any a resumed run numbered before
SET @base = (SELECT COALESCE(MAX(seq), -9000000000000000000) FROM {prefix}outbox_dead_letters
    WHERE seq < -8000000000000000000);
UPDATE {prefix}outbox_dead_letters d
    JOIN (SELECT id, ROW_NUMBER() OVER (ORDER BY id) AS n FROM {prefix}outbox_dead_letters
          WHERE seq = -9000000000000000000) r
    ON d.id = r.id
    SET d.seq = @base + r.n;
-- the key indexes of schema 3, by insert order instead of id
-- built online (ALGORITHM = INPLACE, LOCK = NONE): writes go on while the
-- index builds; a server that cannot build one so refuses instead of locking
-- the table
CREATE INDEX {prefix}outbox_key_seq_idx
    ON {prefix}outbox_events (event_type, event_key, status, seq)
    ALGORITHM = INPLACE LOCK = NONE;
CREATE INDEX {prefix}dead_letters_key_seq_idx
    ON {prefix}outbox_dead_letters (event_type, event_key, status, seq)
    ALGORITHM = INPLACE LOCK = NONE;
INSERT INTO {prefix}txbox_schema_version (version, applied_at) VALUES (5, UTC_TIMESTAMP(6));
