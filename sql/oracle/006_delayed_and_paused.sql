-- txbox schema 6 for Oracle: delayed events and paused event types.
-- (Untested here: Oracle cannot run on the project's machines.)
--
--  - `outbox_events_due_idx`: a type's events by status and due time. A
--    poller that finds nothing to claim asks when its type's next event is
--    due (`NewEvent::deliver_after`, a retry's backoff) and sleeps until then.
--  - `outbox_paused_types`: the event types paused by an operator
--    (`txbox pause TYPE`, `Pauses::pause`); every relay's claims skip them.
CREATE TABLE {prefix}outbox_paused_types (
    event_type VARCHAR2(255) NOT NULL PRIMARY KEY,
    paused_at  TIMESTAMP WITH TIME ZONE NOT NULL
);
CREATE INDEX {prefix}outbox_events_due_idx
    ON {prefix}outbox_events (event_type, status, next_attempt_at) ONLINE;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (6);
