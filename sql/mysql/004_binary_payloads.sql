-- txbox schema 4 for MySQL/MariaDB: binary payloads (`Outbox::publish_bytes`).
--
-- An event published as raw bytes (protobuf, Avro, ...) keeps them in
-- `payload_bytes` with its `content_type`; its text `payload` is empty. A JSON
-- event leaves both NULL, so the JSON path writes what it wrote before.
--
-- `migrate` applies this file once, after 003 (a column that is there already
-- is passed over). By hand: replace `{prefix}` and run it once, after 003.
ALTER TABLE {prefix}outbox_events ADD COLUMN payload_bytes LONGBLOB NULL;
ALTER TABLE {prefix}outbox_events ADD COLUMN content_type VARCHAR(255) NULL;
ALTER TABLE {prefix}outbox_dead_letters ADD COLUMN payload_bytes LONGBLOB NULL;
ALTER TABLE {prefix}outbox_dead_letters ADD COLUMN content_type VARCHAR(255) NULL;
INSERT INTO {prefix}txbox_schema_version (version, applied_at) VALUES (4, UTC_TIMESTAMP(6));
