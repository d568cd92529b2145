-- txbox schema 4 for PostgreSQL: events of one key in order (`ordering = "key"`).
--
-- An event of an ordered type is claimed only when no earlier event of its key
-- is still pending, in process or failed, and (with `on_poison = "block"`) no
-- earlier dead letter of its key waits for an operator. The claim looks that up
-- per candidate row in these two indexes: only rows with a key, and only while
-- they can hold their key back, so sent events and events without a key cost
-- them nothing.
--
-- The indexes are built CONCURRENTLY: writers go on while they build (they
-- wait for transactions that were open when they started, not the other way
-- round). A build that stopped (a lock timeout, a crash) leaves an INVALID
-- index that `migrate` drops and builds again before it records the version.
--
-- `migrate` applies this file once, after 003, each statement on its own. By
-- hand: replace `{prefix}` and run it once with psql, after 003, not in one
-- transaction (no `-1`: CREATE INDEX CONCURRENTLY cannot run in one).
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}outbox_key_idx
    ON {prefix}outbox_events (event_type, event_key, id)
    WHERE event_key IS NOT NULL AND status IN ('PENDING', 'IN_PROCESS', 'FAILED');
CREATE INDEX CONCURRENTLY IF NOT EXISTS {prefix}dead_letters_key_idx
    ON {prefix}outbox_dead_letters (event_type, event_key, id)
    WHERE event_key IS NOT NULL AND status IN ('DEAD', 'RETRY');
INSERT INTO {prefix}txbox_schema_version (version) VALUES (4);
