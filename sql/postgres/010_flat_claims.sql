-- txbox schema 10 for PostgreSQL: claims that a long transaction cannot slow down.
--
-- A transaction that stays open (an analytics query in REPEATABLE READ,
-- `pg_dump`, an idle session, a replication slot) holds the xmin horizon:
-- VACUUM removes no row version younger than it, and no index entry of one
-- can be marked dead. Each event leaves such versions behind (its claim and
-- its send each write a new one), and a claim that scans a type's pending
-- events from the lowest one walks all of them: measured, 2.4 -> 123 ms per
-- claim after 8 minutes at 1,000 events/s. From this version on a claim
-- starts at a floor instead:
--
--  - `outbox_events_fresh_idx`: a type's pending events in the database's
--    insert order (`seq`). The relay's claims read it from a floor, the
--    highest number below which every event is known to be committed or
--    rolled back (see `txbox_next_seq`), sent, or waiting in the index
--    below; a claim reads only the entries above it. (`outbox_events_pending_idx`,
--    by id, stays: the key walk of ordered types reads it, and so do
--    relays of 0.3 during a rolling upgrade.)
--  - `outbox_events_later_idx`: the pending events whose due time is after
--    their insert: delayed events, retries waiting for their backoff, events
--    released after a broker outage or recovered after a lease, dead letters
--    sent back. An event due at once has no entry here, so this index holds
--    only what waits, and the claims read it beside the floor's. With the
--    floor's index it answers "when is the next event due" too, so schema 9's
--    `outbox_events_due_idx` (an entry for every event) goes: a publish
--    writes as many index entries as in 0.3.
--  - `txbox_next_seq()`: the default of `seq`. It gives the transaction its
--    id before it takes the number, so that "every transaction that took a
--    number up to N has ended" can be read off snapshots: the relay reads
--    the sequence's last number N, then takes a transaction id X of its own;
--    once a snapshot has no transaction older than X running, N is settled,
--    and a claim after it sees every event up to N. A transaction that
--    commits late (one that took its number minutes before) keeps the floor
--    below its number until it ends, so its events are claimed at its
--    commit, not skipped. A writing transaction that stays open keeps the
--    floor where it is meanwhile (set `idle_in_transaction_session_timeout`).
--    Stuck recovery makes due again the events another claim held locked
--    and gave back unchanged below the floor (its connection was lost).
--  - `txbox_publish()` refuses headers over 65,536 bytes (names and values,
--    and 8 per header), as `publish` does: a RabbitMQ frame cannot carry
--    more.
--
-- A relay of 0.3 still running during a rolling upgrade claims as before;
-- its stuck recovery leaves a recovered event due at its insert, which the
-- new relays' claims find only at their own recovery's next pass (once a
-- `recovery_interval`). A new relay on a schema older than 10 claims as 0.3
-- did until the schema is current (it asks every 30 s).
--
-- Locks: the function is new; setting the column's default takes the outbox
-- table's ACCESS EXCLUSIVE lock for a moment (no rows are read or written;
-- the wait is bounded by `maintenance.migrate_lock_timeout`); the indexes
-- are built and schema 9's due-time index dropped CONCURRENTLY, beside the
-- writers.
--
-- `migrate` applies this file once, after 009, each part up to a COMMIT or
-- an index build on its own. By hand: replace `{prefix}` and run it once
-- with psql, after 009, not in one transaction (no `-1`).
CREATE OR REPLACE FUNCTION {prefix}txbox_next_seq() RETURNS bigint LANGUAGE sql VOLATILE AS $$
    SELECT 0 * txid_current() + nextval('{prefix}outbox_events_seq')
$$;
ALTER TABLE {prefix}outbox_events ALTER COLUMN seq SET DEFAULT {prefix}txbox_next_seq();
CREATE OR REPLACE FUNCTION {prefix}txbox_publish(
    p_event_type text, p_payload json, p_event_key text DEFAULT NULL, p_headers jsonb DEFAULT '{}'
) RETURNS uuid LANGUAGE plpgsql AS $$
DECLARE
    new_id uuid := {prefix}txbox_uuid_v7();
BEGIN
    IF p_event_type IS NULL
       OR octet_length(p_event_type) NOT BETWEEN 1 AND 255
       OR p_event_type ~ '[[:cntrl:]]' THEN
        RAISE EXCEPTION
            'txbox_publish: the event type must be 1 to 255 bytes without control characters';
    END IF;
    IF p_payload IS NULL THEN
        RAISE EXCEPTION 'txbox_publish: the payload must not be NULL';
    END IF;
    IF octet_length(p_event_key) > 255 THEN
        RAISE EXCEPTION 'txbox_publish: the key must be at most 255 bytes';
    END IF;
    IF p_headers IS NOT NULL
       AND (jsonb_typeof(p_headers) <> 'object'
            OR EXISTS (SELECT 1 FROM jsonb_each(p_headers) h
                       WHERE jsonb_typeof(h.value) <> 'string'
                          OR octet_length(h.key) NOT BETWEEN 1 AND 255
                          OR h.key ~ '[[:cntrl:]]'
                          OR lower(h.key) LIKE 'txbox-%'
                          OR lower(h.key) = 'content-type')) THEN
        RAISE EXCEPTION
            'txbox_publish: the headers must be a JSON object of strings, names of 1 to 255 bytes, none reserved (txbox-*, content-type)';
    END IF;
    IF p_headers IS NOT NULL
       AND (SELECT coalesce(sum(octet_length(h.key) + octet_length(h.value) + 8), 0)
            FROM jsonb_each_text(p_headers) h) > 65536 THEN
        RAISE EXCEPTION 'txbox_publish: the headers are % bytes (names and values, and 8 per header), at most 65536',
            (SELECT sum(octet_length(h.key) + octet_length(h.value) + 8) FROM jsonb_each_text(p_headers) h);
    END IF;
    INSERT INTO {prefix}outbox_events (id, event_type, event_key, headers, payload, next_attempt_at)
    VALUES (new_id, p_event_type, p_event_key, coalesce(p_headers, '{}'), p_payload::text, now());
    RETURN new_id;
END
$$;
COMMIT;
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}outbox_events_fresh_idx
    ON {prefix}outbox_events (event_type, seq)
    WHERE status = 'PENDING';
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}outbox_events_later_idx
    ON {prefix}outbox_events (event_type, next_attempt_at)
    WHERE status = 'PENDING' AND next_attempt_at > created_at;
DROP INDEX CONCURRENTLY IF EXISTS {prefix}outbox_events_due_idx;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (10);
