-- txbox schema 5 for SQLite: a key's events go out in the order the database
-- inserted them.
--
-- Until schema 4 a key's order was its events' ids: UUIDv7 from the clock of
-- the process that published them, so two publishers whose clocks differ
-- could put a key's later event before its earlier one. From schema 5 on the
-- database numbers each event at insert (`seq`, from the counter in
-- `outbox_seq`, which a trigger advances per row: unlike the rowid, a number
-- is never given twice, even after the newest row is deleted), and the
-- ordering rule and the key walk compare those numbers.
--
-- The events there already keep the order they had: those that can still
-- hold a key back (pending, in process, failed) are numbered below every new
-- one, in id order (-N to -1); the dead letters below those, in id order from
-- -9e18 on (an event of a key still in the outbox was published after its
-- dead letters), and so is a dead letter that a relay of an earlier version
-- moves (the column's default); sent events get none (no rule looks at
-- them). A dead letter keeps its event's number, and an event retried from
-- the dead letters gets it back.
--
-- `migrate` applies this file once, after 004, in one transaction. By hand:
-- replace `{prefix}` and run it once, after 004.
ALTER TABLE {prefix}outbox_events ADD COLUMN seq INTEGER;
ALTER TABLE {prefix}outbox_dead_letters ADD COLUMN seq INTEGER DEFAULT -9000000000000000000;
CREATE TABLE IF NOT EXISTS {prefix}outbox_seq (n INTEGER NOT NULL);
INSERT INTO {prefix}outbox_seq (n) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM {prefix}outbox_seq);
UPDATE {prefix}outbox_events SET seq = n.seq
FROM (SELECT id, row_number() OVER (ORDER BY id) - count(*) OVER () - 1 AS seq
      FROM {prefix}outbox_events WHERE status IN ('PENDING', 'IN_PROCESS', 'FAILED')) n
WHERE {prefix}outbox_events.id = n.id;
UPDATE {prefix}outbox_dead_letters SET seq = n.seq
FROM (SELECT id, -9000000000000000000 + row_number() OVER (ORDER BY id) AS seq
      FROM {prefix}outbox_dead_letters) n
WHERE {prefix}outbox_dead_letters.id = n.id;
CREATE TRIGGER IF NOT EXISTS {prefix}outbox_events_seq AFTER INSERT ON {prefix}outbox_events
FOR EACH ROW WHEN NEW.seq IS NULL
BEGIN UPDATE {prefix}outbox_seq SET n = n + 1; UPDATE {prefix}outbox_events SET seq = (SELECT n FROM {prefix}outbox_seq) WHERE id = NEW.id; END;
-- the key indexes of schema 3, by insert order instead of id
CREATE INDEX IF NOT EXISTS {prefix}outbox_key_seq_idx
    ON {prefix}outbox_events (event_type, event_key, seq)
    WHERE event_key IS NOT NULL AND status IN ('PENDING', 'IN_PROCESS', 'FAILED');
DROP INDEX IF EXISTS {prefix}outbox_key_idx;
CREATE INDEX IF NOT EXISTS {prefix}dead_letters_key_seq_idx
    ON {prefix}outbox_dead_letters (event_type, event_key, seq)
    WHERE event_key IS NOT NULL AND status IN ('DEAD', 'RETRY');
DROP INDEX IF EXISTS {prefix}dead_letters_key_idx;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (5);
