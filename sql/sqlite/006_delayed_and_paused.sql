-- txbox schema 6 for SQLite: delayed events and paused event types.
--
--  - `outbox_events_due_idx`: a type's pending events by their due time. A
--    poller that finds nothing to claim asks when its type's next event is
--    due (`NewEvent::deliver_after`, a retry's backoff) and sleeps until then.
--  - `outbox_paused_types`: the event types paused by an operator
--    (`txbox pause TYPE`, `Pauses::pause`); every relay's claims skip them.
CREATE TABLE IF NOT EXISTS {prefix}outbox_paused_types (
    event_type TEXT NOT NULL PRIMARY KEY,
    paused_at  TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS {prefix}outbox_events_due_idx
    ON {prefix}outbox_events (event_type, next_attempt_at)
    WHERE status = 'PENDING';
INSERT INTO {prefix}txbox_schema_version (version) VALUES (6);
