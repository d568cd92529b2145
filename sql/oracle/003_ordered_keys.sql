-- txbox schema 3 for Oracle: events of one key in order (`ordering = "key"`).
--
-- An event of an ordered type is claimed only when no earlier event of its key
-- is still pending, in process or failed, and (with `on_poison = "block"`) no
-- earlier dead letter of its key waits for an operator. The claim looks that up
-- per candidate row in these two indexes; the status comes before the id, so
-- the lookup reads only the rows of the statuses it asks for.
--
-- `migrate` applies this file once, after 002 (an index that is there already
-- is passed over). By hand: replace `{prefix}` and run it once, after 002.
CREATE INDEX {prefix}outbox_key_idx ON {prefix}outbox_events (event_type, event_key, status, id);
CREATE INDEX {prefix}dead_letters_key_idx ON {prefix}outbox_dead_letters (event_type, event_key, status, id);
INSERT INTO {prefix}txbox_schema_version (version) VALUES (3);
