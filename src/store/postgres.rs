//! PostgreSQL: the statements of this dialect, its connection adapter, the
//! [`PgStore`], and `publish` / the inbox on `postgres::Transaction`.
//!
//! Every statement is sent with its parameter types (`query_typed`): one round trip,
//! no separate prepare.

use std::time::Duration;

use postgres::tls::{MakeTlsConnect, TlsConnect};
use postgres::types::{ToSql, Type};
use postgres::{GenericClient, Socket};
use r2d2_postgres::PostgresConnectionManager;

use super::sql::{self, Catalog, Conn, Row, SqlStore, Style, Val};
use super::Tables;
use crate::error::{Error, Result};
use crate::event::{EventId, NewEvent};

mod listen;
mod url;

pub use url::pg_config;
use url::pg_hosts;

/// The schema, embedded: the same file a DBA reads in `sql/postgres/`.
pub(crate) const SCHEMA: &str = include_str!("../../sql/postgres/001_schema.sql");
/// Schema version 2: the inbox keyed by (consumer, event id).
pub(crate) const SCHEMA_2: &str = include_str!("../../sql/postgres/002_inbox_per_consumer.sql");
/// Schema version 3: a commit that published events notifies the relay.
pub(crate) const SCHEMA_3: &str = include_str!("../../sql/postgres/003_notify_on_commit.sql");
/// Schema version 4: the indexes of per-key ordering.
pub(crate) const SCHEMA_4: &str = include_str!("../../sql/postgres/004_ordered_keys.sql");
/// Schema version 5: binary payloads.
pub(crate) const SCHEMA_5: &str = include_str!("../../sql/postgres/005_binary_payloads.sql");
/// Schema version 6: the wake-up on commit rationed (one notifying commit per
/// event type in flight), per type, and off for a session (`txbox.wake`).
pub(crate) const SCHEMA_6: &str = include_str!("../../sql/postgres/006_rationed_wake.sql");
/// Schema version 7: the database numbers the events at insert (`seq`).
pub(crate) const SCHEMA_7: &str = include_str!("../../sql/postgres/007_insert_order.sql");
/// Schema version 8: the wake-up's trigger asks whether a row is due in its
/// function, not in a WHEN clause built at every INSERT.
pub(crate) const SCHEMA_8: &str = include_str!("../../sql/postgres/008_lean_wake.sql");
/// Schema version 9: the pending events' due-time index (delayed events) and
/// the paused event types.
pub(crate) const SCHEMA_9: &str = include_str!("../../sql/postgres/009_delayed_and_paused.sql");
/// Schema version 10: claims from a floor (the pending events in insert
/// order, those due after their insert apart), numbers taken after the
/// transaction's id.
pub(crate) const SCHEMA_10: &str = include_str!("../../sql/postgres/010_flat_claims.sql");

/// A connection pool of the `postgres` crate, as [`PgStore`] uses it: TLS
/// through `T`, txbox's own ([`PgTls`], what [`PgStore::connect`] makes) unless
/// you give [`PgStore::from_pool`] a pool of another connector (`postgres::NoTls`,
/// `postgres-openssl`'s, a rustls one).
pub type PgPool<T = PgTls> = r2d2::Pool<PostgresConnectionManager<T>>;

/// The TLS connector of the pools txbox makes (`postgres-native-tls`): made by
/// [`pg_config`] from a connection string's `sslmode` and `sslrootcert`.
pub type PgTls = postgres_native_tls::MakeTlsConnector;

/// What a pool's TLS connector must be for a [`PgStore`]: any `postgres`
/// connector whose connections can move between threads (`NoTls`, [`PgTls`],
/// `postgres-openssl`'s, ...). Implemented for every such type.
pub trait PgConnector:
    MakeTlsConnect<Socket, Stream: Send, TlsConnect: Send + TlsConnect<Socket, Future: Send>>
    + Clone
    + Send
    + Sync
    + 'static
{
}

impl<T> PgConnector for T
where
    T: MakeTlsConnect<Socket> + Clone + Send + Sync + 'static,
    T::Stream: Send,
    T::TlsConnect: Send,
    <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
{
}

const TS: &str = "'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'";

fn plus(ms_param: &str) -> String {
    format!("now() + {ms_param} * interval '1 millisecond'")
}

pub(crate) fn catalog(t: &Tables) -> Catalog {
    let (o, d, l, i) = (&t.outbox, &t.dlq, &t.locks, &t.inbox);
    let q = format!("{}outbox_quiet_types", t.prefix);
    let dlq_columns = format!(
        "id, event_type, event_key, headers::text, payload, attempts, last_error, status, \
         to_char(created_at AT TIME ZONE 'UTC', {TS}), to_char(moved_at AT TIME ZONE 'UTC', {TS}), payload_bytes, content_type"
    );
    let filter = "($1::text IS NULL OR event_type = $1) AND ($2::text IS NULL OR status = $2)";
    // what every claim takes: due PENDING rows of type $1 above an id, in insert
    // order (the pending index's, schema 10), skipping rows another claim holds;
    // and what it returns of them
    let due = |after: &str, limit: &str| {
        format!(
            "FROM {o} WHERE event_type = $1 AND id > {after} AND status = 'PENDING' \
             AND next_attempt_at <= now() {{order}} ORDER BY seq LIMIT {limit} FOR UPDATE SKIP LOCKED"
        )
    };
    let paused = &t.paused;
    // the insert sequence's last number: every row inserted so far has it or less
    let last_number = "CASE WHEN is_called THEN last_value ELSE last_value - 1 END";
    let seq = format!("{}outbox_events_seq", t.prefix);
    let claimed =
        "id, event_type, event_key, headers::text, payload, attempts, payload_bytes, content_type";
    Catalog {
        style: Style::Dollar,
        begin: "BEGIN",
        schema: &[
            SCHEMA, SCHEMA_2, SCHEMA_3, SCHEMA_4, SCHEMA_5, SCHEMA_6, SCHEMA_7, SCHEMA_8, SCHEMA_9,
            SCHEMA_10,
        ],
        transactional_ddl: true,
        online_index: Some(sql::OnlineIndex {
            build: "CREATE INDEX CONCURRENTLY IF NOT EXISTS",
            drop: "DROP INDEX CONCURRENTLY",
            word: " CONCURRENTLY",
            invalid: |name| {
                format!(
                    "SELECT 1 FROM pg_index WHERE indexrelid = to_regclass('{name}') \
                     AND NOT indisvalid"
                )
            },
            existing: format!("SELECT 1 WHERE to_regclass('{o}') IS NOT NULL").into(),
        }),
        // the session's (an upgrade runs in several transactions: the index
        // builds run outside any)
        migrate_lock: Some(sql::MigrateLock {
            take: |_| {
                "SELECT CASE WHEN pg_try_advisory_lock(hashtext('txbox-migrate')) THEN 1 ELSE 0 END"
                    .into()
            },
            release: Some("SELECT pg_advisory_unlock(hashtext('txbox-migrate'))"),
            poll: true,
        }),
        lock_timeout: Some(sql::LockTimeout {
            set: |d| format!("SET lock_timeout = {}", d.as_millis().max(1)),
            reset: Some("RESET lock_timeout"),
        }),
        exists_errors: &[],
        error_code: |_| None,
        version_table: format!("SELECT 1 WHERE to_regclass('{}') IS NOT NULL", t.schema_version).into(),
        ping: "SELECT 1".into(),
        insert_mark: format!("SELECT {last_number} FROM {seq}").into(),
        max_ids: 1000,
        // the ids through a sub-select, whose size the planner cannot see: given
        // 200 ids outright, it seq-scans a table that was never analyzed (a fresh or
        // fast-grown one) instead of looking them up in the primary key
        common: sql::common(
            t,
            "now()",
            "",
            plus,
            "id = ANY(ARRAY(SELECT unnest(ARRAY[{ids}])))",
            // `OFFSET 0` keeps an ordered claim's key look-up a sub-plan run per
            // candidate with the key in its index condition; pulled up into an
            // anti-join on a never-analyzed table it read every row of the type
            // per candidate (367 ms for one claim over 10,000 rows, 1 ms so)
            &sql::KeyLookup {
                hint: |_| String::new(),
                tail: " OFFSET 0",
                // the candidates as an array: looked up in the primary key, not
                // a filter on a scan of every pending row in id order
                walk: Some(sql::WalkStyle {
                    within: |q| format!("= ANY(ARRAY({q}))"),
                    null_id: "NULL::uuid",
                }),
            },
        ),
        claim_returning: Some(format!(
            // the ids as an array, not a join: a join lets the planner hash the whole
            // table, while `= ANY` looks each id up in the primary key
            "UPDATE {o} SET status = 'IN_PROCESS', claim_token = $3, \
               lease_until = now() + $4 * interval '1 millisecond' \
             WHERE id = ANY(ARRAY(SELECT id {})) RETURNING {claimed}",
            due("$5", "$2")
        )).map(Into::into),
        // an unordered claim from the floor $5: the events due that wait below
        // it (their due time after their insert), then those above it in
        // insert order; each part locks what it takes. An event due at its
        // insert is due whatever this statement's `now()` says: that is its
        // transaction's start, which may come before the start of a
        // publisher's transaction that commits before the claim's snapshot
        // is taken (the statement is planned in between); filtered out, such
        // an event would be left below the floor with no entry in the index
        // of those that wait
        floors: Some(sql::FloorSql {
            since: 10,
            // the snapshot is the statement's, taken before the sequence is read;
            // the transaction's id is taken after (its commit waits for no
            // flush: a tick lost in a crash is no loss)
            tick: format!(
                "SELECT set_config('synchronous_commit', 'off', true), {last_number}, \
                   txid_snapshot_xmin(txid_current_snapshot()), txid_current() FROM {seq}"
            ).into(),
            // the claimed rows, then one row (no id) that says whether the
            // type was paused on the claim's own snapshot
            claim: format!(
                "WITH claimed AS (UPDATE {o} SET status = 'IN_PROCESS', claim_token = $3, \
                   lease_until = now() + $4 * interval '1 millisecond' \
                 WHERE id = ANY(ARRAY(SELECT id FROM ( \
                   SELECT * FROM (SELECT id FROM {o} WHERE event_type = $1 AND status = 'PENDING' \
                     AND next_attempt_at > created_at AND next_attempt_at <= now() AND seq <= $5 {{order}}\
                     ORDER BY next_attempt_at LIMIT $2 FOR UPDATE SKIP LOCKED) waited \
                   UNION ALL SELECT * FROM (SELECT id FROM {o} WHERE event_type = $1 AND seq > $5 \
                     AND status = 'PENDING' AND (next_attempt_at <= created_at OR next_attempt_at <= now()) {{order}}\
                     ORDER BY seq LIMIT $2 FOR UPDATE SKIP LOCKED) fresh \
                 ) c LIMIT $2)) RETURNING {claimed}, seq) \
                 SELECT *, 0::int8 FROM claimed UNION ALL \
                 SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, \
                   CASE WHEN EXISTS (SELECT 1 FROM {paused} WHERE event_type = $1) THEN 1 ELSE 0 END::int8"
            ).into(),
            next_due: format!(
                "SELECT CASE WHEN EXISTS (SELECT 1 FROM {paused} WHERE event_type = $1) THEN NULL ELSE \
                   (extract(epoch FROM least( \
                     (SELECT min(next_attempt_at) FROM {o} WHERE event_type = $1 AND status = 'PENDING' \
                        AND next_attempt_at > created_at), \
                     (SELECT min(next_attempt_at) FROM {o} WHERE event_type = $1 AND status = 'PENDING' \
                        AND seq > $2)) - now()) * 1000)::float8 END"
            ).into(),
            sweep: format!(
                "UPDATE {o} SET next_attempt_at = greatest(now(), created_at + interval '1 microsecond') \
                 WHERE id = ANY(ARRAY(SELECT id FROM {o} WHERE event_type = $1 AND status = 'PENDING' \
                   AND seq <= $2 AND next_attempt_at <= created_at LIMIT $3 FOR UPDATE SKIP LOCKED))"
            ).into(),
        }),
        // a delay counts from the publish call: `now()` is the transaction's
        // start, which may be minutes before
        // (an event of the same insert without a delay is due at `now()`,
        // as any other: due at its insert)
        publish_plus: Some(|ms_param| {
            format!(
                "CASE WHEN {ms_param} <= 0 THEN now() \
                 ELSE statement_timestamp() + {ms_param} * interval '1 millisecond' END"
            )
        }),
        hold_claim: Some(sql::HoldClaim {
            // the script's rows come back as text: a binary payload as `\x` and
            // its hex digits, whatever the server's `bytea_output` says
            open: "BEGIN; SET LOCAL idle_in_transaction_session_timeout = {ms}; \
                   SET LOCAL bytea_output = 'hex'",
            probe: format!(
                "SELECT 1 FROM {o} WHERE event_type = $1 AND status = 'PENDING' \
                 AND next_attempt_at <= now() {{order}} LIMIT 1"
            ).into(),
            literal,
            claim_delete: format!(
                "DELETE FROM {o} WHERE id = ANY(ARRAY(SELECT id {})) \
                 RETURNING {claimed}, to_char(created_at AT TIME ZONE 'UTC', {TS}), seq",
                due("$2", "$3")
            ).into(),
            restore: format!(
                "INSERT INTO {o} (id, event_type, event_key, headers, payload, status, attempts, \
                   next_attempt_at, last_error, created_at, payload_bytes, content_type, seq) \
                 VALUES ($4, $5, $6, $7::jsonb, $8, $1, $9, {}, $3, $10::timestamptz, $11::bytea, $12, $13)",
                plus("$2")
            ).into(),
        }),
        wake: Some(sql::WakeSql {
            quiet: format!(
                "INSERT INTO {q} (event_type) VALUES ($1) ON CONFLICT (event_type) DO NOTHING"
            ).into(),
            loud: format!("DELETE FROM {q} WHERE event_type = $1").into(),
            queue_usage: "SELECT pg_notification_queue_usage()::float8".into(),
            // the channel the listeners listen on, the trigger's
            nudge: format!("SELECT pg_notify('{o}', $1)").into(),
        }),
        // CLUSTER: VACUUM FULL's rewrite, but allowed in a transaction (whose
        // SET LOCAL bounds its lock wait and its time)
        compact: Some(sql::CompactSql {
            measure: format!(
                "SELECT c.relpages::bigint, c.reltuples::float8, \
                   pg_total_relation_size(c.oid)::bigint \
                 FROM pg_class c WHERE c.oid = '{o}'::regclass"
            )
            .into(),
            // the session's idle time in it too: a link lost after the
            // rewrite must not leave the table locked until the server
            // notices (its keepalives: hours by default)
            bound: "SELECT set_config('lock_timeout', $1, true), \
                    set_config('statement_timeout', $1, true), \
                    set_config('idle_in_transaction_session_timeout', $1, true)"
                .into(),
            not_owner: |e| {
                let crate::Error::Database { source, .. } = e else {
                    return false;
                };
                source
                    .downcast_ref::<crate::error::PgError>()
                    .and_then(|pg| pg.0.code())
                    .is_some_and(|c| *c == postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
            },
            rewrite: format!("CLUSTER {o} USING {o}_pkey").into(),
        }),
        claim_select: format!("SELECT {claimed} {}", due("$2", "$3")).into(),
        next_due: format!(
            "SELECT (extract(epoch FROM min(next_attempt_at) - now()) * 1000)::float8 FROM {o} \
             WHERE event_type = $1 AND status = 'PENDING' \
               AND NOT EXISTS (SELECT 1 FROM {} WHERE event_type = $1)",
            t.paused
        )
        .into(),
        select_expired: format!(
            "SELECT id FROM {o} WHERE status = 'IN_PROCESS' AND lease_until < now() LIMIT $1 FOR UPDATE SKIP LOCKED"
        ).into(),
        select_processed: format!(
            "SELECT id FROM {o} WHERE status = 'PROCESSED' \
             AND processed_at < now() - $2 * interval '1 millisecond' LIMIT $1 FOR UPDATE SKIP LOCKED"
        ).into(),
        select_failed: format!(
            "SELECT id FROM {o} WHERE status = 'FAILED' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED"
        ).into(),
        select_retry: format!("SELECT id FROM {d} WHERE status = 'RETRY' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED").into(),
        select_resolved: format!(
            "SELECT id FROM {d} WHERE status = 'RESOLVED' \
             AND updated_at < now() - $2 * interval '1 millisecond' LIMIT $1 FOR UPDATE SKIP LOCKED"
        ).into(),
        select_inbox_expired: format!(
            "SELECT event_id FROM {i} WHERE consumed_at < now() - $2 * interval '1 millisecond' \
             LIMIT $1 FOR UPDATE SKIP LOCKED"
        ).into(),
        lock_insert: format!(
            "INSERT INTO {l} (name, owner, locked_at, locked_until) \
             VALUES ($1, $2, now(), now() - interval '1 second') ON CONFLICT (name) DO NOTHING"
        ).into(),
        dlq_list: format!("SELECT {dlq_columns} FROM {d} WHERE {filter} ORDER BY moved_at, id LIMIT $3 OFFSET $4").into(),
        dlq_count: format!("SELECT count(*) FROM {d} WHERE {filter}").into(),
        dlq_get: format!("SELECT {dlq_columns} FROM {d} WHERE id = $1").into(),
        dlq_lock: format!("SELECT id FROM {d} WHERE id = $1 FOR UPDATE SKIP LOCKED").into(),
        // one grouped scan per partial index; PROCESSED rows are never read
        status: format!(
            "SELECT event_type, sum(p)::int8, sum(i)::int8, sum(f)::int8, \
               extract(epoch FROM now() - min(oldest))::float8 FROM ( \
               SELECT event_type, count(*) AS p, 0 AS i, 0 AS f, min(created_at) AS oldest \
                 FROM {o} WHERE status = 'PENDING' GROUP BY event_type \
               UNION ALL SELECT event_type, 0, count(*), 0, NULL FROM {o} WHERE status = 'IN_PROCESS' GROUP BY event_type \
               UNION ALL SELECT event_type, 0, 0, count(*), NULL FROM {o} WHERE status = 'FAILED' GROUP BY event_type \
             ) s GROUP BY event_type ORDER BY event_type"
        ).into(),
        inbox_insert: format!(
            "INSERT INTO {i} (consumer, event_id) SELECT $1, $2 \
             WHERE NOT EXISTS (SELECT 1 FROM {i} WHERE consumer = '*' AND event_id = $2) \
             ON CONFLICT (consumer, event_id) DO NOTHING"
        ).into(),
        inbox_legacy: None,
        insert_events: format!(
            "INSERT INTO {o} (id, event_type, event_key, headers, payload{{bytes_columns}}, next_attempt_at) VALUES "
        ),
        insert_event_row: "($1, $2, $3, $4::jsonb, $5{bytes_values}, {due})".into(),
        insert_bytes_values: ", $6::bytea, $7",
        insert_events_sep: ", ",
        insert_events_suffix: "",
        insert_rows_max: usize::MAX,
        insert_one: Default::default(),
    }
}

/// Runs a typed statement on any `postgres` client or transaction.
pub(crate) fn typed<T>(
    params: &[Val],
    f: impl FnOnce(&[(&(dyn ToSql + Sync), Type)]) -> std::result::Result<T, postgres::Error>,
) -> Result<T> {
    // borrowed, not copied: payloads are passed as they are
    static NULL: Option<String> = None;
    let refs: Vec<(&(dyn ToSql + Sync), Type)> = params
        .iter()
        .map(|v| -> (&(dyn ToSql + Sync), Type) {
            match v {
                Val::Null => (&NULL, Type::TEXT),
                Val::Int(n) => (n, Type::INT8),
                Val::Float(f) => (f, Type::FLOAT8),
                Val::Text(s) => (s, Type::TEXT),
                Val::Id(u) => (u, Type::UUID),
                Val::Bytes(b) => (b, Type::BYTEA),
            }
        })
        .collect();
    Ok(f(&refs)?)
}

fn row(r: &postgres::Row) -> Row {
    let vals = r
        .columns()
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let t = c.type_();
            let v = if *t == Type::UUID {
                r.get::<_, Option<uuid::Uuid>>(i).map(Val::Id)
            } else if *t == Type::INT8 {
                r.get::<_, Option<i64>>(i).map(Val::Int)
            } else if *t == Type::INT4 {
                r.get::<_, Option<i32>>(i).map(|n| Val::Int(n.into()))
            } else if *t == Type::INT2 {
                r.get::<_, Option<i16>>(i).map(|n| Val::Int(n.into()))
            } else if *t == Type::FLOAT8 {
                r.get::<_, Option<f64>>(i).map(Val::Float)
            } else if *t == Type::BYTEA {
                r.get::<_, Option<Vec<u8>>>(i).map(Val::Bytes)
            } else {
                r.try_get::<_, Option<String>>(i)
                    .ok()
                    .flatten()
                    .map(Val::Text)
            };
            v.unwrap_or(Val::Null)
        })
        .collect();
    Row(vals)
}

fn pg_query(c: &mut impl GenericClient, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
    let rows = typed(params, |p| c.query_typed(sql, p))?;
    Ok(rows.iter().map(row).collect())
}

fn pg_execute(c: &mut impl GenericClient, sql: &str, params: &[Val]) -> Result<u64> {
    typed(params, |p| c.execute_typed(sql, p))
}

fn pg_batch(c: &mut impl GenericClient, sql: &str) -> Result<()> {
    Ok(c.batch_execute(sql)?)
}

fn pg_script(c: &mut impl GenericClient, sql: &str) -> Result<sql::Script> {
    let mut out = sql::Script::default();
    for message in c.simple_query(sql)? {
        match message {
            postgres::SimpleQueryMessage::Row(r) => out.rows.push(Row((0..r.len())
                .map(|i| r.get(i).map_or(Val::Null, |v| Val::Text(v.to_owned())))
                .collect())),
            postgres::SimpleQueryMessage::CommandComplete(n) => out.counts.push(n),
            _ => {}
        }
    }
    Ok(out)
}

/// A value as a PostgreSQL literal. Text is an escape string (`E'...'`), whose
/// meaning does not depend on `standard_conforming_strings`: backslashes and quotes
/// are escaped, and PostgreSQL text cannot hold a NUL.
fn literal(v: &Val) -> String {
    match v {
        Val::Null => "NULL".into(),
        Val::Int(n) => n.to_string(),
        Val::Float(f) => format!("'{f:?}'::float8"),
        Val::Text(s) => format!("E'{}'", s.replace('\\', "\\\\").replace('\'', "''")),
        Val::Id(u) => format!("'{u}'::uuid"),
        Val::Bytes(b) => {
            let hex: String = b.iter().map(|x| format!("{x:02x}")).collect();
            format!("E'\\\\x{hex}'::bytea")
        }
    }
}

sql::conn_impls!(pg_query, pg_execute, pg_batch, pg_script; postgres::Client, postgres::Transaction<'_>);

/// The PostgreSQL dialect of [`SqlStore`]: an r2d2 pool of `postgres` clients,
/// whose connections use the TLS connector `T`.
pub struct PgDialect<T: PgConnector = PgTls>(
    PgPool<T>,
    std::sync::Arc<std::sync::Mutex<Option<listen::ListenerSession>>>,
);

/// A pooled connection that answered this recently is handed out again without a
/// test. r2d2 tests every check-out with a round trip of its own, which doubled
/// the round trips of every store call (a poller's claim and finish among
/// them); like HikariCP's "alive bypass", txbox tests only a connection that
/// has not answered for longer than this. One that died within the window
/// fails its next statement once, and the pool drops it.
const TESTED_WITHIN: Duration = Duration::from_millis(500);

/// When this pooled connection last answered: its last statement's end, or its
/// test (r2d2 connection extension). Counted from the check-out instead, a
/// statement longer than the window (a database 200 ms away: a round trip is
/// 400 ms) had the next call test the connection again: two round trips per
/// store call on the slow link where one is dearest.
struct Answered(std::time::Instant);

/// A pooled connection that notes when each statement on it succeeded, and
/// forgets it as soon as one fails: its next check-out tests it, and a dead
/// one is dropped then, not handed out again for the rest of the window.
struct Checked<T: PgConnector>(r2d2::PooledConnection<PostgresConnectionManager<T>>);

impl<T: PgConnector> Checked<T> {
    fn watch<R>(&mut self, r: Result<R>) -> Result<R> {
        let seen = r2d2::PooledConnection::extensions_mut(&mut self.0);
        match r {
            Ok(_) => drop(seen.insert(Answered(std::time::Instant::now()))),
            Err(_) => drop(seen.remove::<Answered>()),
        }
        r
    }
}

impl<T: PgConnector> Conn for Checked<T> {
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
        let r = pg_query(&mut *self.0, sql, params);
        self.watch(r)
    }
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        let r = pg_execute(&mut *self.0, sql, params);
        self.watch(r)
    }
    fn batch(&mut self, sql: &str) -> Result<()> {
        let r = pg_batch(&mut *self.0, sql);
        self.watch(r)
    }
}

impl<T: PgConnector> sql::ScriptConn for Checked<T> {
    fn script(&mut self, sql: &str) -> Result<sql::Script> {
        let r = pg_script(&mut *self.0, sql);
        self.watch(r)
    }
}

impl<T: PgConnector> sql::Dialect for PgDialect<T> {}

impl<T: PgConnector> sql::Driver for PgDialect<T> {
    const SLOT: usize = 0;
    fn catalog(tables: &Tables) -> Catalog {
        catalog(tables)
    }
    fn get(&self) -> Result<Box<dyn Conn + '_>> {
        Ok(sql::Sessions::get_owned(self)?)
    }

    fn max_size(&self) -> Option<usize> {
        Some(self.0.max_size() as usize)
    }

    fn sessions(&self) -> Option<&dyn sql::Sessions> {
        Some(self)
    }
}

impl<T: PgConnector> sql::Sessions for PgDialect<T> {
    fn listen(&self, channel: &str) -> Result<Box<dyn crate::store::Notifications>> {
        listen::listen(&self.0, &self.1, channel)
    }

    fn get_owned(&self) -> Result<Box<dyn sql::ScriptConn + Send>> {
        if self.0.test_on_check_out() {
            // a pool of the caller's (`from_pool`) that tests by itself
            return Ok(Box::new(sql::Held(self.0.get()?)));
        }
        // a connection that fails its test is kept out of the pool while the next
        // try takes another (the pool drops it when it comes back closed), short of
        // the pool's last place: after a restart of the database every idle
        // connection is dead, and one call goes through them all
        let mut dead = Vec::new();
        loop {
            let mut c = self.0.get()?;
            let now = std::time::Instant::now();
            let recent = r2d2::PooledConnection::extensions(&c)
                .get::<Answered>()
                .is_some_and(|t| now.duration_since(t.0) < TESTED_WITHIN);
            let tested = if recent {
                Ok(())
            } else {
                c.simple_query("").map(drop)
            };
            match tested {
                Ok(()) => {
                    if !recent {
                        r2d2::PooledConnection::extensions_mut(&mut c).insert(Answered(now));
                    }
                    return Ok(Box::new(Checked(c)));
                }
                Err(e) if dead.len() + 2 > self.0.max_size() as usize => return Err(e.into()),
                Err(_) => dead.push(c),
            }
        }
    }
}

/// The PostgreSQL store: a connection pool and this dialect's SQL. `T` is the
/// pool's TLS connector ([`PgTls`] for a store from [`PgStore::connect`]).
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// let config = txbox::Config::builder().table_prefix("shop_").build()?;
/// let store = txbox::PgStore::connect("postgres://postgres@127.0.0.1:5432/test", &config)?;
/// txbox::Store::migrate(&store)?;
/// # Ok(()) }
/// ```
pub type PgStore<T = PgTls> = SqlStore<PgDialect<T>>;

#[derive(Debug)]
struct LogErrors;

impl r2d2::HandleError<postgres::Error> for LogErrors {
    fn handle_error(&self, error: postgres::Error) {
        log::warn!(
            "txbox: database connection failed: {}",
            crate::error::PgError(error)
        );
    }
}

impl SqlStore<PgDialect> {
    /// Connects a pool of up to 16 connections to `url`
    /// (`postgres://user:password@host:port/database?options` or the key=value
    /// form) for the tables of `config`, with TLS as the string's `sslmode`
    /// asks ([`pg_config`]): TLS when the server offers it by default (`prefer`),
    /// `require`, `verify-ca` or `verify-full` with `sslrootcert`. The first
    /// connection is opened here: a server that cannot be reached, a certificate
    /// that does not verify or a login that is refused is an error now,
    /// [`Error::Connect`] naming the host. For another pool size, give your own
    /// pool to [`PgStore::from_pool`].
    pub fn connect(url: &str, config: &crate::Config) -> Result<Self> {
        let (pg, tls) = pg_config(url)?;
        let manager = PostgresConnectionManager::new(pg.clone(), tls.clone());
        // one connection first, for its error: the pool only retries until its
        // timeout and then says it timed out
        first_connection(&pg, tls)?;
        let pool = r2d2::Pool::builder()
            .max_size(16)
            .min_idle(Some(1))
            // tested by `PgDialect::get` when unused for a while, not on every check-out
            .test_on_check_out(false)
            .connection_timeout(Duration::from_secs(10))
            .error_handler(Box::new(LogErrors))
            .build(manager)?;
        Self::from_pool(pool, config)
    }
}

/// Opens one connection and closes it, within the connect timeout for each
/// host: the driver's `connect_timeout` bounds the TCP connect only, and a
/// server (or a proxy with no backend) that accepts and never answers would
/// hold the TLS request or the login forever. On a thread of its own, left
/// behind when the time is up: it ends when the connection does (the far
/// side closing it, or `tcp_user_timeout` where the far side is gone; a live
/// server that never answers keeps it, one thread per failed `connect`).
/// The error is [`Error::Connect`], with the driver's error when there is one.
fn first_connection(pg: &postgres::Config, tls: PgTls) -> Result<()> {
    let failed = |reason: String, source: Option<crate::Cause>| Error::Connect {
        to: format!("PostgreSQL at {}", pg_hosts(pg)),
        reason,
        source,
    };
    let per_host = pg
        .get_connect_timeout()
        .copied()
        .unwrap_or(Duration::from_secs(10));
    let limit = per_host * u32::try_from(pg.get_hosts().len().max(1)).unwrap_or(u32::MAX);
    let (tx, rx) = std::sync::mpsc::channel();
    let to = pg.clone();
    std::thread::Builder::new()
        .name("txbox-pg-connect".into())
        .spawn(move || {
            let _ = tx.send(to.connect(tls).map(drop));
        })
        .map_err(|e| failed(format!("no thread for the connection: {e}"), None))?;
    match rx.recv_timeout(limit) {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => {
            let e = crate::error::PgError(e);
            Err(failed(e.to_string(), Some(Box::new(e))))
        }
        Err(_) => Err(failed(
            format!(
                "no answer within {limit:?} (connect_timeout): the server took the \
                 connection and did not answer its TLS request or login"
            ),
            None,
        )),
    }
}

impl<T: PgConnector> SqlStore<PgDialect<T>> {
    /// A store over an existing pool, for the tables of `config`: a pool of
    /// txbox's TLS connector (from [`pg_config`]) or of any other (`NoTls`,
    /// `postgres-openssl`). A relay uses one connection per thread at most
    /// (and one per batch in flight with held claims).
    pub fn from_pool(pool: PgPool<T>, config: &crate::Config) -> Result<Self> {
        SqlStore::with_pool(PgDialect(pool, Default::default()), config)
    }

    /// The pool, e.g. to run business transactions on the same connections.
    ///
    /// A pool made by [`PgStore::connect`] does not test every check-out (r2d2's
    /// default costs a round trip each time): txbox's own calls test a connection
    /// that sat unused for 500 ms, and a dead connection that your code takes from
    /// the pool fails its first statement and is dropped when it comes back. A pool
    /// given to [`PgStore::from_pool`] keeps its own setting.
    pub fn pool(&self) -> &PgPool<T> {
        &self.pool.0
    }
}

sql::transaction_impls!(postgres::Transaction<'_>, PgDialect);
