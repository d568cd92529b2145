-- txbox schema 3 for SQLite: events of one key in order (`ordering = "key"`).
--
-- An event of an ordered type is claimed only when no earlier event of its key
-- is still pending, in process or failed, and (with `on_poison = "block"`) no
-- earlier dead letter of its key waits for an operator. The claim looks that up
-- per candidate row in these two indexes: only rows with a key, and only while
-- they can hold their key back.
--
-- `migrate` applies this file once, after 002, in one transaction. By hand:
-- replace `{prefix}` and run it once, after 002.
CREATE INDEX IF NOT EXISTS {prefix}outbox_key_idx
    ON {prefix}outbox_events (event_type, event_key, id)
    WHERE event_key IS NOT NULL AND status IN ('PENDING', 'IN_PROCESS', 'FAILED');
CREATE INDEX IF NOT EXISTS {prefix}dead_letters_key_idx
    ON {prefix}outbox_dead_letters (event_type, event_key, id)
    WHERE event_key IS NOT NULL AND status IN ('DEAD', 'RETRY');
INSERT INTO {prefix}txbox_schema_version (version) VALUES (3);
