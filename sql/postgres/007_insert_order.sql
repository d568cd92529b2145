-- txbox schema 7 for PostgreSQL: a key's events go out in the order the
-- database inserted them.
--
-- Until schema 6 a key's order was its events' ids: UUIDv7 from the clock of
-- the process that published them, so two publishers whose clocks differ
-- could put a key's later event before its earlier one. From schema 7 on the
-- database numbers each event at insert (`seq`, from a sequence), and the
-- ordering rule and the key walk compare those numbers.
--
-- The events there already keep the order they had: those that can still
-- hold a key back (pending, in process, failed) are numbered below every new
-- one, in id order (from -6e18 on, those published while the upgrade ran
-- from -3e18 on); the dead letters below those, in id
-- order from -9e18 on (an event of a key still in the outbox was published
-- after its dead letters), and so is a dead letter that a relay of an
-- earlier version moves during a rolling upgrade; sent events get none (no
-- rule looks at them). A dead letter keeps its event's number, and an event
-- retried from the dead letters gets it back.
--
-- A role that publishes needs the sequence too:
-- `GRANT USAGE, SELECT ON SEQUENCE {prefix}outbox_events_seq TO <role>`.
--
-- `migrate` applies this file once, after 006, in four steps, each part up
-- to a COMMIT in a transaction of its own:
-- 1. the column, without a default: a moment's lock of the outbox;
-- 2. the numbering of the events there: it locks only their rows, so
--    publishes go on (their events still get no number) and a relay of the
--    earlier version skips those rows meanwhile;
-- 3. the default, and the numbering of the events published during 2, after
--    the others: a moment's lock again;
-- 4. the key indexes by insert order, built CONCURRENTLY (an INVALID one
--    left by a build that stopped is dropped and built again); then the
--    version.
-- Each step can be run again: a migration that stopped goes on from where it
-- is. By hand: replace `{prefix}` and run it once with psql, after 006, as it
-- is (no `-1`), or each part before a COMMIT between BEGIN and COMMIT.
-- 1. the column
CREATE SEQUENCE IF NOT EXISTS {prefix}outbox_events_seq;
ALTER TABLE {prefix}outbox_events ADD COLUMN IF NOT EXISTS seq bigint;
ALTER TABLE {prefix}outbox_dead_letters ADD COLUMN IF NOT EXISTS seq bigint;
ALTER SEQUENCE {prefix}outbox_events_seq OWNED BY {prefix}outbox_events.seq;
COMMIT;
-- 2. the events there, from -6e18 on, after any a stopped run numbered
-- (the partial status indexes find them)
UPDATE {prefix}outbox_events o SET seq = n.seq
FROM (SELECT id, row_number() OVER (ORDER BY id) + COALESCE(
          (SELECT max(seq) FROM {prefix}outbox_events
           WHERE (status = 'PENDING' OR status = 'IN_PROCESS' OR status = 'FAILED')
             AND seq < -3000000000000000000 AND seq > -8000000000000000000),
          -6000000000000000000) AS seq
      FROM {prefix}outbox_events
      WHERE (status = 'PENDING' OR status = 'IN_PROCESS' OR status = 'FAILED') AND seq IS NULL) n
WHERE o.id = n.id AND o.seq IS NULL;
UPDATE {prefix}outbox_dead_letters d SET seq = n.seq
FROM (SELECT id, row_number() OVER (ORDER BY id) + COALESCE(
          (SELECT max(seq) FROM {prefix}outbox_dead_letters WHERE seq < -8000000000000000000),
          -9000000000000000000) AS seq
      FROM {prefix}outbox_dead_letters WHERE seq IS NULL) n
WHERE d.id = n.id AND d.seq IS NULL;
COMMIT;
-- 3. the default; the events published during 2, after those of 2 (from
-- -3e18 on: no look for the highest number while the table is locked)
-- (the outbox first, as a relay locks them: no deadlock with its moves)
ALTER TABLE {prefix}outbox_events
    ALTER COLUMN seq SET DEFAULT nextval('{prefix}outbox_events_seq');
ALTER TABLE {prefix}outbox_dead_letters ALTER COLUMN seq SET DEFAULT -9000000000000000000;
UPDATE {prefix}outbox_events o SET seq = n.seq
FROM (SELECT id, row_number() OVER (ORDER BY id) - 3000000000000000000 AS seq
      FROM {prefix}outbox_events
      WHERE (status = 'PENDING' OR status = 'IN_PROCESS' OR status = 'FAILED') AND seq IS NULL) n
WHERE o.id = n.id AND o.seq IS NULL;
UPDATE {prefix}outbox_dead_letters d SET seq = n.seq
FROM (SELECT id, row_number() OVER (ORDER BY id) + COALESCE(
          (SELECT max(seq) FROM {prefix}outbox_dead_letters WHERE seq < -8000000000000000000),
          -9000000000000000000) AS seq
      FROM {prefix}outbox_dead_letters WHERE seq IS NULL) n
WHERE d.id = n.id AND d.seq IS NULL;
COMMIT;
-- 4. the key indexes of schema 4, by insert order instead of id
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}outbox_key_seq_idx
    ON {prefix}outbox_events (event_type, event_key, seq)
    WHERE event_key IS NOT NULL AND status IN ('PENDING', 'IN_PROCESS', 'FAILED');
DROP INDEX CONCURRENTLY IF EXISTS {prefix}outbox_key_idx;
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}dead_letters_key_seq_idx
    ON {prefix}outbox_dead_letters (event_type, event_key, seq)
    WHERE event_key IS NOT NULL AND status IN ('DEAD', 'RETRY');
DROP INDEX CONCURRENTLY IF EXISTS {prefix}dead_letters_key_idx;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (7);
