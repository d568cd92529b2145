-- txbox schema 4 for SQLite: binary payloads (`Outbox::publish_bytes`).
--
-- An event published as raw bytes (protobuf, Avro, ...) keeps them in
-- `payload_bytes` with its `content_type`; its text `payload` is empty. A JSON
-- event leaves both NULL, so the JSON path writes what it wrote before.
--
-- `migrate` applies this file once, after 003, in one transaction. By hand:
-- replace `{prefix}` and run it once, after 003.
ALTER TABLE {prefix}outbox_events ADD COLUMN payload_bytes BLOB NULL;
ALTER TABLE {prefix}outbox_events ADD COLUMN content_type TEXT NULL;
ALTER TABLE {prefix}outbox_dead_letters ADD COLUMN payload_bytes BLOB NULL;
ALTER TABLE {prefix}outbox_dead_letters ADD COLUMN content_type TEXT NULL;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (4);
