-- txbox schema for Oracle 12c+ (SKIP LOCKED).
--
-- `{prefix}` stands for the table prefix from the configuration (empty by default).
-- txbox's `migrate` applies this very file with the prefix substituted; an object
-- that already exists (ORA-00955, ORA-01408) is skipped, so running it twice is fine.
-- Ids are RAW(16); timestamps are TIMESTAMP WITH TIME ZONE from SYSTIMESTAMP.

CREATE TABLE {prefix}outbox_events (
    id              RAW(16)        NOT NULL PRIMARY KEY,
    event_type      VARCHAR2(255)  NOT NULL,
    event_key       VARCHAR2(255)  NULL,
    headers         CLOB           NOT NULL,
    payload         CLOB           NOT NULL,
    status          VARCHAR2(16)   DEFAULT 'PENDING' NOT NULL,
    attempts        NUMBER(10)     DEFAULT 0 NOT NULL,
    next_attempt_at TIMESTAMP WITH TIME ZONE NOT NULL,
    claim_token     RAW(16)        NULL,
    lease_until     TIMESTAMP WITH TIME ZONE NULL,
    last_error      VARCHAR2(4000) NULL,
    created_at      TIMESTAMP WITH TIME ZONE NOT NULL,
    processed_at    TIMESTAMP WITH TIME ZONE NULL
);

CREATE INDEX {prefix}outbox_events_claim_idx ON {prefix}outbox_events (event_type, status, id);
CREATE INDEX {prefix}outbox_events_lease_idx ON {prefix}outbox_events (status, lease_until);
CREATE INDEX {prefix}outbox_events_done_idx ON {prefix}outbox_events (status, processed_at);

CREATE TABLE {prefix}outbox_dead_letters (
    id          RAW(16)        NOT NULL PRIMARY KEY,
    event_type  VARCHAR2(255)  NOT NULL,
    event_key   VARCHAR2(255)  NULL,
    headers     CLOB           NOT NULL,
    payload     CLOB           NOT NULL,
    attempts    NUMBER(10)     NOT NULL,
    last_error  VARCHAR2(4000) NULL,
    status      VARCHAR2(16)   DEFAULT 'DEAD' NOT NULL,
    created_at  TIMESTAMP WITH TIME ZONE NOT NULL,
    moved_at    TIMESTAMP WITH TIME ZONE NOT NULL,
    updated_at  TIMESTAMP WITH TIME ZONE NOT NULL
);

CREATE INDEX {prefix}outbox_dlq_list_idx ON {prefix}outbox_dead_letters (moved_at, id);
CREATE INDEX {prefix}outbox_dlq_status_idx ON {prefix}outbox_dead_letters (status, updated_at);

CREATE TABLE {prefix}inbox_consumed (
    event_id    RAW(16) NOT NULL PRIMARY KEY,
    consumed_at TIMESTAMP WITH TIME ZONE NOT NULL
);

CREATE INDEX {prefix}inbox_consumed_at_idx ON {prefix}inbox_consumed (consumed_at);

CREATE TABLE {prefix}job_locks (
    name         VARCHAR2(128) NOT NULL PRIMARY KEY,
    owner        RAW(16)       NOT NULL,
    locked_at    TIMESTAMP WITH TIME ZONE NOT NULL,
    locked_until TIMESTAMP WITH TIME ZONE NOT NULL
);

-- Schema versions applied after this file: each later file (002_...sql on) records
-- its number here as its last statement, and `migrate` applies a file only when its
-- number is not here yet. This file is the baseline and records nothing.
CREATE TABLE {prefix}txbox_schema_version (
    version    NUMBER(10) NOT NULL PRIMARY KEY,
    applied_at TIMESTAMP WITH TIME ZONE DEFAULT SYSTIMESTAMP NOT NULL
);
