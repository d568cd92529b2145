-- txbox schema for MySQL 8.0+ / MariaDB 10.6+ (SKIP LOCKED).
--
-- `{prefix}` stands for the table prefix from the configuration (empty by default).
-- txbox's `migrate` applies this very file with the prefix substituted; every
-- statement is idempotent. Ids are UUIDs as BINARY(16); timestamps are DATETIME(6)
-- in UTC, always written with UTC_TIMESTAMP(6) from the database clock.

CREATE TABLE IF NOT EXISTS {prefix}outbox_events (
    id              BINARY(16)   NOT NULL PRIMARY KEY,     -- UUIDv7: time ordered
    event_type      VARCHAR(255) NOT NULL,
    event_key       VARCHAR(255) NULL,
    headers         LONGTEXT     NOT NULL,                 -- JSON object, string -> string
    payload         LONGTEXT     NOT NULL,                 -- serialized JSON, stored verbatim
    status          VARCHAR(16)  NOT NULL DEFAULT 'PENDING',
    attempts        INT          NOT NULL DEFAULT 0,
    next_attempt_at DATETIME(6)  NOT NULL,
    claim_token     BINARY(16)   NULL,
    lease_until     DATETIME(6)  NULL,
    last_error      TEXT         NULL,
    created_at      DATETIME(6)  NOT NULL,
    processed_at    DATETIME(6)  NULL,
    INDEX {prefix}outbox_events_claim_idx (event_type, status, id),
    INDEX {prefix}outbox_events_lease_idx (status, lease_until),
    INDEX {prefix}outbox_events_processed_idx (status, processed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}outbox_dead_letters (
    id          BINARY(16)   NOT NULL PRIMARY KEY,
    event_type  VARCHAR(255) NOT NULL,
    event_key   VARCHAR(255) NULL,
    headers     LONGTEXT     NOT NULL,
    payload     LONGTEXT     NOT NULL,
    attempts    INT          NOT NULL,
    last_error  TEXT         NULL,
    status      VARCHAR(16)  NOT NULL DEFAULT 'DEAD',      -- DEAD | RETRY | RESOLVED
    created_at  DATETIME(6)  NOT NULL,
    moved_at    DATETIME(6)  NOT NULL,
    updated_at  DATETIME(6)  NOT NULL,
    INDEX {prefix}outbox_dead_letters_list_idx (moved_at, id),
    INDEX {prefix}outbox_dead_letters_status_idx (status, updated_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}inbox_consumed (
    event_id    BINARY(16)  NOT NULL PRIMARY KEY,
    consumed_at DATETIME(6) NOT NULL,
    INDEX {prefix}inbox_consumed_at_idx (consumed_at)
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

CREATE TABLE IF NOT EXISTS {prefix}job_locks (
    name         VARCHAR(128) NOT NULL PRIMARY KEY,
    owner        BINARY(16)   NOT NULL,
    locked_at    DATETIME(6)  NOT NULL,
    locked_until DATETIME(6)  NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;

-- Schema versions applied after this file: each later file (002_...sql on) records
-- its number here as its last statement, and `migrate` applies a file only when its
-- number is not here yet. This file is the baseline and records nothing.
CREATE TABLE IF NOT EXISTS {prefix}txbox_schema_version (
    version    INT         NOT NULL PRIMARY KEY,
    applied_at DATETIME(6) NOT NULL
) ENGINE = InnoDB DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin;
