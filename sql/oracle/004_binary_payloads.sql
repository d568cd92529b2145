-- txbox schema 4 for Oracle: binary payloads (`Outbox::publish_bytes`).
--
-- An event published as raw bytes (protobuf, Avro, ...) keeps them in
-- `payload_bytes` with its `content_type`; its text `payload` is empty, which
-- Oracle stores as NULL, so the text column now allows NULL. A JSON event
-- leaves both new columns NULL, so the JSON path writes what it wrote before.
--
-- `migrate` applies this file once, after 003 (a column that is there already,
-- or one that allows NULL already, is passed over). By hand: replace
-- `{prefix}` and run it once, after 003.
ALTER TABLE {prefix}outbox_events ADD (payload_bytes BLOB NULL, content_type VARCHAR2(255) NULL);
ALTER TABLE {prefix}outbox_dead_letters ADD (payload_bytes BLOB NULL, content_type VARCHAR2(255) NULL);
ALTER TABLE {prefix}outbox_events MODIFY (payload NULL);
ALTER TABLE {prefix}outbox_dead_letters MODIFY (payload NULL);
INSERT INTO {prefix}txbox_schema_version (version) VALUES (4);
