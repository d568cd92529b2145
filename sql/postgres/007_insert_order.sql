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
-- one, in id order (-N to -1); the dead letters below those, in id order from
-- -9e18 on (an event of a key still in the outbox was published after its
-- dead letters), and so is a dead letter that a relay of an earlier version
-- moves during a rolling upgrade (the column's default); sent events get none
-- (no rule looks at them). A dead letter keeps its event's number, and an
-- event retried from the dead letters gets it back.
--
-- A role that publishes needs the sequence too:
-- `GRANT USAGE, SELECT ON SEQUENCE {prefix}outbox_events_seq TO <role>`.
--
-- `migrate` applies this file once, after 006: the column and the numbering
-- in one transaction, which holds the outbox table's lock while it numbers
-- the unsent events; then the key indexes by insert order, built
-- CONCURRENTLY (writers go on meanwhile; an INVALID one left by a build that
-- stopped is dropped and built again); then the version. By hand: replace
-- `{prefix}` and run it once with psql, after 006, not in one transaction as
-- a whole (no `-1`), the statements before the first CREATE INDEX in one
-- (BEGIN ... COMMIT).
CREATE SEQUENCE IF NOT EXISTS {prefix}outbox_events_seq;
ALTER TABLE {prefix}outbox_events ADD COLUMN IF NOT EXISTS seq bigint;
ALTER TABLE {prefix}outbox_dead_letters ADD COLUMN IF NOT EXISTS seq bigint;
ALTER SEQUENCE {prefix}outbox_events_seq OWNED BY {prefix}outbox_events.seq;
UPDATE {prefix}outbox_events o SET seq = n.seq
FROM (SELECT id, row_number() OVER (ORDER BY id) - count(*) OVER () - 1 AS seq
      FROM {prefix}outbox_events WHERE status IN ('PENDING', 'IN_PROCESS', 'FAILED')) n
WHERE o.id = n.id AND o.seq IS NULL;
UPDATE {prefix}outbox_dead_letters d SET seq = n.seq
FROM (SELECT id, -9000000000000000000 + row_number() OVER (ORDER BY id) AS seq
      FROM {prefix}outbox_dead_letters WHERE seq IS NULL) n
WHERE d.id = n.id;
ALTER TABLE {prefix}outbox_dead_letters ALTER COLUMN seq SET DEFAULT -9000000000000000000;
ALTER TABLE {prefix}outbox_events
    ALTER COLUMN seq SET DEFAULT nextval('{prefix}outbox_events_seq');
-- the key indexes of schema 4, by insert order instead of id
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}outbox_key_seq_idx
    ON {prefix}outbox_events (event_type, event_key, seq)
    WHERE event_key IS NOT NULL AND status IN ('PENDING', 'IN_PROCESS', 'FAILED');
DROP INDEX CONCURRENTLY IF EXISTS {prefix}outbox_key_idx;
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}dead_letters_key_seq_idx
    ON {prefix}outbox_dead_letters (event_type, event_key, seq)
    WHERE event_key IS NOT NULL AND status IN ('DEAD', 'RETRY');
DROP INDEX CONCURRENTLY IF EXISTS {prefix}dead_letters_key_idx;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (7);
