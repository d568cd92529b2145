-- txbox schema for SQLite 3.35+ (the embedded default for one-host jobs).
--
-- `{prefix}` stands for the table prefix from the configuration (empty by default).
-- txbox's `migrate` applies this very file with the prefix substituted; every
-- statement is idempotent. Ids are UUID text; timestamps are ISO 8601 UTC text with
-- milliseconds (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')), which sort as they compare.

CREATE TABLE IF NOT EXISTS {prefix}outbox_events (
    id              TEXT    NOT NULL PRIMARY KEY,
    event_type      TEXT    NOT NULL,
    event_key       TEXT    NULL,
    headers         TEXT    NOT NULL DEFAULT '{}',
    payload         TEXT    NOT NULL,
    status          TEXT    NOT NULL DEFAULT 'PENDING',
    attempts        INTEGER NOT NULL DEFAULT 0,
    next_attempt_at TEXT    NOT NULL,
    claim_token     TEXT    NULL,
    lease_until     TEXT    NULL,
    last_error      TEXT    NULL,
    created_at      TEXT    NOT NULL,
    processed_at    TEXT    NULL
);

CREATE INDEX IF NOT EXISTS {prefix}outbox_events_pending_idx
    ON {prefix}outbox_events (event_type, id) WHERE status = 'PENDING';
CREATE INDEX IF NOT EXISTS {prefix}outbox_events_in_process_idx
    ON {prefix}outbox_events (lease_until) WHERE status = 'IN_PROCESS';
CREATE INDEX IF NOT EXISTS {prefix}outbox_events_processed_idx
    ON {prefix}outbox_events (processed_at) WHERE status = 'PROCESSED';
CREATE INDEX IF NOT EXISTS {prefix}outbox_events_failed_idx
    ON {prefix}outbox_events (id) WHERE status = 'FAILED';

CREATE TABLE IF NOT EXISTS {prefix}outbox_dead_letters (
    id          TEXT    NOT NULL PRIMARY KEY,
    event_type  TEXT    NOT NULL,
    event_key   TEXT    NULL,
    headers     TEXT    NOT NULL DEFAULT '{}',
    payload     TEXT    NOT NULL,
    attempts    INTEGER NOT NULL,
    last_error  TEXT    NULL,
    status      TEXT    NOT NULL DEFAULT 'DEAD',           -- DEAD | RETRY | RESOLVED
    created_at  TEXT    NOT NULL,
    moved_at    TEXT    NOT NULL,
    updated_at  TEXT    NOT NULL
);

CREATE INDEX IF NOT EXISTS {prefix}outbox_dead_letters_list_idx
    ON {prefix}outbox_dead_letters (moved_at, id);
CREATE INDEX IF NOT EXISTS {prefix}outbox_dead_letters_status_idx
    ON {prefix}outbox_dead_letters (status, updated_at);

CREATE TABLE IF NOT EXISTS {prefix}inbox_consumed (
    event_id    TEXT NOT NULL PRIMARY KEY,
    consumed_at TEXT NOT NULL
);

CREATE INDEX IF NOT EXISTS {prefix}inbox_consumed_at_idx
    ON {prefix}inbox_consumed (consumed_at);

CREATE TABLE IF NOT EXISTS {prefix}job_locks (
    name         TEXT NOT NULL PRIMARY KEY,
    owner        TEXT NOT NULL,
    locked_at    TEXT NOT NULL,
    locked_until TEXT NOT NULL
);

-- Schema versions applied after this file: each later file (002_...sql on) records
-- its number here as its last statement, and `migrate` applies a file only when its
-- number is not here yet. This file is the baseline and records nothing.
CREATE TABLE IF NOT EXISTS {prefix}txbox_schema_version (
    version    INTEGER NOT NULL PRIMARY KEY,
    applied_at TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
);
