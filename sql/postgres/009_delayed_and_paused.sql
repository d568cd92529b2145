-- txbox schema 9 for PostgreSQL: delayed events and paused event types.
--
--  - `outbox_events_due_idx`: a type's pending events by their due time. A
--    poller that finds nothing to claim asks when its type's next event is
--    due (`NewEvent::deliver_after`, a retry's backoff) and sleeps until then,
--    one look-up in this index instead of a claim.
--  - `outbox_paused_types`: the event types paused by an operator
--    (`txbox pause TYPE`, `Dlq::pause`); every relay's claims skip them.
--
-- Locks: the table is new; the index is built CONCURRENTLY, beside the
-- writers (it waits for the transactions open when it starts).
--
-- `migrate` applies this file once, after 008. By hand: replace `{prefix}`
-- and run it once with psql (not in a transaction block), after 008.
CREATE TABLE IF NOT EXISTS {prefix}outbox_paused_types (
    event_type varchar(255) PRIMARY KEY,
    paused_at  timestamptz  NOT NULL DEFAULT now()
);
COMMIT;
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}outbox_events_due_idx
    ON {prefix}outbox_events (event_type, next_attempt_at)
    WHERE status = 'PENDING';
INSERT INTO {prefix}txbox_schema_version (version) VALUES (9);
