-- txbox schema 5 for PostgreSQL: binary payloads (`Outbox::publish_bytes`).
--
-- An event published as raw bytes (protobuf, Avro, ...) keeps them in
-- `payload_bytes` with its `content_type`; its text `payload` is empty. A JSON
-- event leaves both NULL, so the JSON path writes what it wrote before. Adding
-- NULL columns rewrites no row.
--
-- `migrate` applies this file once, after 004, in one transaction. By hand:
-- replace `{prefix}` and run it once with psql, after 004.
ALTER TABLE {prefix}outbox_events
    ADD COLUMN IF NOT EXISTS payload_bytes bytea NULL,
    ADD COLUMN IF NOT EXISTS content_type text NULL;
ALTER TABLE {prefix}outbox_dead_letters
    ADD COLUMN IF NOT EXISTS payload_bytes bytea NULL,
    ADD COLUMN IF NOT EXISTS content_type text NULL;
INSERT INTO {prefix}txbox_schema_version (version) VALUES (5);
