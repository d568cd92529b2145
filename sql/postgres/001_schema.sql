-- txbox schema for PostgreSQL (>= 11).
--
-- `{prefix}` stands for the table prefix from the configuration (`table_prefix`,
-- empty by default). txbox's `migrate` applies this very file, with the prefix
-- substituted, and every statement is idempotent: running it twice is fine.
-- A DBA can apply it by hand instead: replace `{prefix}` and run it with psql.
--
-- All timestamps are `timestamptz` and are set from the database clock (`now()`),
-- so relays on several hosts agree on time.

-- The outbox. One row per event, written in the caller's transaction.
-- status: PENDING -> IN_PROCESS -> PROCESSED
--         IN_PROCESS -> PENDING (retry left) | FAILED (retries used up); FAILED -> dead letters
CREATE TABLE IF NOT EXISTS {prefix}outbox_events (
    id              uuid         PRIMARY KEY,              -- UUIDv7: time ordered
    event_type      varchar(255) NOT NULL,
    event_key       varchar(255) NULL,                     -- Kafka record key / routing hint
    headers         jsonb        NOT NULL DEFAULT '{}',    -- user headers, string -> string
    payload         text         NOT NULL,                 -- serialized JSON, stored verbatim
    status          varchar(16)  NOT NULL DEFAULT 'PENDING'
                    CHECK (status IN ('PENDING', 'IN_PROCESS', 'PROCESSED', 'FAILED')),
    attempts        integer      NOT NULL DEFAULT 0,       -- failed send attempts so far
    next_attempt_at timestamptz  NOT NULL DEFAULT now(),   -- not claimed before this time
    claim_token     uuid         NULL,                     -- set by the claim that holds the row
    lease_until     timestamptz  NULL,                     -- claim expiry; recovery resets after it
    last_error      text         NULL,                     -- why the last send failed
    created_at      timestamptz  NOT NULL DEFAULT now(),
    processed_at    timestamptz  NULL                      -- when the broker acked it
);

-- Claim: pending rows of one type, oldest first.
CREATE INDEX IF NOT EXISTS {prefix}outbox_events_pending_idx
    ON {prefix}outbox_events (event_type, id) WHERE status = 'PENDING';
-- Stuck recovery: in-process rows by lease expiry.
CREATE INDEX IF NOT EXISTS {prefix}outbox_events_in_process_idx
    ON {prefix}outbox_events (lease_until) WHERE status = 'IN_PROCESS';
-- Cleanup: processed rows by age.
CREATE INDEX IF NOT EXISTS {prefix}outbox_events_processed_idx
    ON {prefix}outbox_events (processed_at) WHERE status = 'PROCESSED';
-- Move to the dead letters.
CREATE INDEX IF NOT EXISTS {prefix}outbox_events_failed_idx
    ON {prefix}outbox_events (id) WHERE status = 'FAILED';

-- Dead letters: events that used up their retries, moved here in one transaction.
-- status: DEAD (waiting for an operator) | RETRY (an operator asked for a retry; the
-- DLQ retry thread moves it back to the outbox) | RESOLVED (handled; cleaned up by TTL)
CREATE TABLE IF NOT EXISTS {prefix}outbox_dead_letters (
    id           uuid         PRIMARY KEY,
    event_type   varchar(255) NOT NULL,
    event_key    varchar(255) NULL,
    headers      jsonb        NOT NULL DEFAULT '{}',
    payload      text         NOT NULL,
    attempts     integer      NOT NULL,
    last_error   text         NULL,
    status       varchar(16)  NOT NULL DEFAULT 'DEAD'
                 CHECK (status IN ('DEAD', 'RETRY', 'RESOLVED')),
    created_at   timestamptz  NOT NULL,                    -- when the event was published
    moved_at     timestamptz  NOT NULL DEFAULT now(),      -- when it became a dead letter
    updated_at   timestamptz  NOT NULL DEFAULT now()       -- last status change
);

CREATE INDEX IF NOT EXISTS {prefix}outbox_dead_letters_list_idx
    ON {prefix}outbox_dead_letters (moved_at, id);
CREATE INDEX IF NOT EXISTS {prefix}outbox_dead_letters_retry_idx
    ON {prefix}outbox_dead_letters (id) WHERE status = 'RETRY';
CREATE INDEX IF NOT EXISTS {prefix}outbox_dead_letters_resolved_idx
    ON {prefix}outbox_dead_letters (updated_at) WHERE status = 'RESOLVED';

-- Inbox: ids of consumed events; the primary key decides duplicates.
CREATE TABLE IF NOT EXISTS {prefix}inbox_consumed (
    event_id    uuid        PRIMARY KEY,
    consumed_at timestamptz NOT NULL DEFAULT now()
);

CREATE INDEX IF NOT EXISTS {prefix}inbox_consumed_at_idx
    ON {prefix}inbox_consumed (consumed_at);

-- Lease locks for jobs that must run on one instance at a time (cleanup).
CREATE TABLE IF NOT EXISTS {prefix}job_locks (
    name         varchar(128) PRIMARY KEY,
    owner        uuid         NOT NULL,
    locked_at    timestamptz  NOT NULL DEFAULT now(),
    locked_until timestamptz  NOT NULL
);

-- Schema versions applied after this file: each later file (002_...sql on) records
-- its number here as its last statement, and `migrate` applies a file only when its
-- number is not here yet. This file is the baseline and records nothing.
CREATE TABLE IF NOT EXISTS {prefix}txbox_schema_version (
    version    integer     PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
