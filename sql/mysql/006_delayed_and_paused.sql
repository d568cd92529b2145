-- txbox schema 6 for MySQL/MariaDB: delayed events and paused event types.
--
--  - `outbox_events_due_idx`: a type's events by status and due time. A
--    poller that finds nothing to claim asks when its type's next event is
--    due (`NewEvent::deliver_after`, a retry's backoff) and sleeps until then,
--    one look-up in this index instead of a claim.
--  - `outbox_paused_types`: the event types paused by an operator
--    (`txbox pause TYPE`, `Pauses::pause`); every relay's claims skip them.
--
-- Locks: the table is new; the index is built online (ALGORITHM = INPLACE,
-- LOCK = NONE): writes go on while it builds.
CREATE TABLE IF NOT EXISTS {prefix}outbox_paused_types (
    event_type VARCHAR(255) NOT NULL PRIMARY KEY,
    paused_at  DATETIME(6)  NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
CREATE INDEX {prefix}outbox_events_due_idx
    ON {prefix}outbox_events (event_type, status, next_attempt_at)
    ALGORITHM = INPLACE LOCK = NONE;
INSERT INTO {prefix}txbox_schema_version (version, applied_at) VALUES (6, UTC_TIMESTAMP(6));
