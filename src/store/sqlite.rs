//! SQLite, the embedded default for one-host batch jobs: this dialect's statements,
//! its connection adapter, the [`SqliteStore`], and `publish` / the inbox on
//! `rusqlite::Transaction`.
//!
//! SQLite has one writer at a time: every transaction here is `BEGIN IMMEDIATE`, so a
//! claim holds the write lock from its select to its update, and several relay
//! threads in one process never claim the same event. No SKIP LOCKED is needed. The
//! store keeps one connection (WAL mode, 5 s busy timeout); your own connection
//! publishes beside it.

use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use rusqlite::types::{Value, ValueRef};

use super::sql::{self, Catalog, Conn, Row, SqlStore, Style, Val};
use super::Tables;
use crate::error::{Error, Result};
use crate::event::{EventId, NewEvent};

/// The schema, embedded: the same file a DBA reads in `sql/sqlite/`.
pub(crate) const SCHEMA: &str = include_str!("../../sql/sqlite/001_schema.sql");
/// Schema version 2: the inbox keyed by (consumer, event id).
pub(crate) const SCHEMA_2: &str = include_str!("../../sql/sqlite/002_inbox_per_consumer.sql");
/// Schema version 3: the indexes of per-key ordering.
pub(crate) const SCHEMA_3: &str = include_str!("../../sql/sqlite/003_ordered_keys.sql");
pub(crate) const SCHEMA_4: &str = include_str!("../../sql/sqlite/004_binary_payloads.sql");
pub(crate) const SCHEMA_5: &str = include_str!("../../sql/sqlite/005_insert_order.sql");
/// Schema version 6: the due-time index (delayed events) and the paused
/// event types.
pub(crate) const SCHEMA_6: &str = include_str!("../../sql/sqlite/006_delayed_and_paused.sql");

const NOW: &str = "strftime('%Y-%m-%dT%H:%M:%fZ', 'now')";

fn plus(ms_param: &str) -> String {
    // a signed number of seconds is a modifier of its own
    format!("strftime('%Y-%m-%dT%H:%M:%fZ', 'now', ({ms_param} / 1000.0) || ' seconds')")
}

pub(crate) fn catalog(t: &Tables) -> Catalog {
    let (o, d, l, i) = (&t.outbox, &t.dlq, &t.locks, &t.inbox);
    let dlq_columns =
        "id, event_type, event_key, headers, payload, attempts, last_error, status, created_at, moved_at, \
         payload_bytes, content_type";
    let filter = "($1 IS NULL OR event_type = $1) AND ($2 IS NULL OR status = $2)";
    Catalog {
        style: Style::QuestionNumbered,
        begin: "BEGIN IMMEDIATE",
        schema: &[SCHEMA, SCHEMA_2, SCHEMA_3, SCHEMA_4, SCHEMA_5, SCHEMA_6],
        transactional_ddl: true,
        online_index: None,
        migrate_lock: None,
        lock_timeout: None,
        exists_errors: &[],
        error_code: |_| None,
        version_table: format!(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '{}'",
            t.schema_version
        ).into(),
        ping: "SELECT 1".into(),
        // the counter the insert trigger advances
        insert_mark: format!("SELECT n FROM {}outbox_seq", t.prefix).into(),
        max_ids: 500,
        common: sql::common(
            t,
            NOW,
            "",
            plus,
            sql::IDS_IN,
            &sql::KeyLookup::plain(Some(sql::WalkStyle {
                within: sql::within_in,
                null_id: "NULL",
            })),
        ),
        claim_returning: None,
        floors: None,
        publish_plus: None,
        hold_claim: None,
        wake: None,
        compact: None,
        next_due: format!(
            "SELECT (julianday(MIN(next_attempt_at)) - julianday('now')) * 86400000.0 FROM {o} \
             WHERE event_type = $1 AND status = 'PENDING' \
               AND NOT EXISTS (SELECT 1 FROM {} WHERE event_type = $1)",
            t.paused
        )
        .into(),
        claim_select: format!(
            "SELECT id, event_type, event_key, headers, payload, attempts, payload_bytes, content_type FROM {o} \
             WHERE event_type = $1 AND id > $2 AND status = 'PENDING' AND next_attempt_at <= {NOW} {{order}} \
             ORDER BY id LIMIT $3"
        ).into(),
        select_expired: format!("SELECT id FROM {o} WHERE status = 'IN_PROCESS' AND lease_until < {NOW} LIMIT $1").into(),
        select_processed: format!(
            "SELECT id FROM {o} WHERE status = 'PROCESSED' AND processed_at < {} LIMIT $1",
            sql::ago(plus, "$2")
        ).into(),
        select_failed: format!("SELECT id FROM {o} WHERE status = 'FAILED' ORDER BY id LIMIT $1").into(),
        select_retry: format!("SELECT id FROM {d} WHERE status = 'RETRY' ORDER BY id LIMIT $1").into(),
        select_resolved: format!(
            "SELECT id FROM {d} WHERE status = 'RESOLVED' AND updated_at < {} LIMIT $1",
            sql::ago(plus, "$2")
        ).into(),
        select_inbox_expired: format!("SELECT event_id FROM {i} WHERE consumed_at < {} LIMIT $1", sql::ago(plus, "$2")).into(),
        lock_insert: format!(
            "INSERT OR IGNORE INTO {l} (name, owner, locked_at, locked_until) \
             VALUES ($1, $2, {NOW}, strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-1 seconds'))"
        ).into(),
        dlq_list: format!("SELECT {dlq_columns} FROM {d} WHERE {filter} ORDER BY moved_at, id LIMIT $3 OFFSET $4").into(),
        dlq_count: format!("SELECT COUNT(*) FROM {d} WHERE {filter}").into(),
        dlq_get: format!("SELECT {dlq_columns} FROM {d} WHERE id = $1").into(),
        dlq_lock: format!("SELECT id FROM {d} WHERE id = $1").into(),
        status: format!(
            "SELECT event_type, SUM(status = 'PENDING'), SUM(status = 'IN_PROCESS'), SUM(status = 'FAILED'), \
               (julianday('now') - julianday(MIN(CASE WHEN status = 'PENDING' THEN created_at END))) * 86400.0 \
             FROM {o} WHERE status IN ('PENDING', 'IN_PROCESS', 'FAILED') GROUP BY event_type ORDER BY event_type"
        ).into(),
        inbox_insert: format!(
            "INSERT OR IGNORE INTO {i} (consumer, event_id, consumed_at) SELECT $1, $2, {NOW} \
             WHERE NOT EXISTS (SELECT 1 FROM {i} WHERE consumer = '*' AND event_id = $2)"
        ).into(),
        inbox_legacy: None,
        insert_events: format!(
            "INSERT INTO {o} (id, event_type, event_key, headers, payload{{bytes_columns}}, next_attempt_at, created_at) VALUES "
        ),
        insert_event_row: "($1, $2, $3, $4, $5{bytes_values}, {due}, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))".into(),
        insert_bytes_values: ", $6, $7",
        insert_events_sep: ", ",
        insert_events_suffix: "",
        insert_rows_max: usize::MAX,
        insert_one: Default::default(),
    }
}

fn err(e: rusqlite::Error) -> Error {
    Error::database(crate::error::DatabaseErrorKind::Other, e)
}

fn value(v: &Val) -> Value {
    match v {
        Val::Null => Value::Null,
        Val::Int(n) => Value::Integer(*n),
        Val::Float(f) => Value::Real(*f),
        Val::Text(s) => Value::Text(s.clone()),
        Val::Id(u) => Value::Text(u.hyphenated().to_string()),
        Val::Bytes(b) => Value::Blob(b.clone()),
    }
}

fn lite_execute(conn: &rusqlite::Connection, sql: &str, params: &[Val]) -> Result<u64> {
    let mut stmt = conn.prepare_cached(sql).map_err(err)?;
    Ok(stmt
        .execute(rusqlite::params_from_iter(params.iter().map(value)))
        .map_err(err)? as u64)
}

fn lite_batch(conn: &rusqlite::Connection, sql: &str) -> Result<()> {
    conn.execute_batch(sql).map_err(err)
}

// a Transaction derefs to its Connection
sql::conn_impls!(lite_query, lite_execute, lite_batch; rusqlite::Connection, rusqlite::Transaction<'_>);

fn lite_query(conn: &rusqlite::Connection, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
    let mut stmt = conn.prepare_cached(sql).map_err(err)?;
    let n = stmt.column_count();
    let rows = stmt
        .query_map(rusqlite::params_from_iter(params.iter().map(value)), |r| {
            (0..n)
                .map(|i| {
                    Ok(match r.get_ref(i)? {
                        ValueRef::Null => Val::Null,
                        ValueRef::Integer(n) => Val::Int(n),
                        ValueRef::Real(f) => Val::Float(f),
                        ValueRef::Text(t) => Val::Text(String::from_utf8_lossy(t).into_owned()),
                        ValueRef::Blob(b) => Val::Bytes(b.to_vec()),
                    })
                })
                .collect::<rusqlite::Result<Vec<_>>>()
                .map(Row)
        })
        .map_err(err)?;
    rows.collect::<rusqlite::Result<Vec<_>>>().map_err(err)
}

/// The SQLite dialect of [`SqlStore`]: one connection behind a mutex (SQLite has
/// one writer at a time anyway).
pub struct SqliteDialect(Mutex<rusqlite::Connection>);

impl sql::Driver for SqliteDialect {
    const SLOT: usize = 2;
    fn catalog(tables: &Tables) -> Catalog {
        catalog(tables)
    }
    fn get(&self) -> Result<Box<dyn Conn + '_>> {
        Ok(Box::new(sql::Held(
            self.0.lock().unwrap_or_else(|p| p.into_inner()),
        )))
    }
}

impl sql::Dialect for SqliteDialect {}

/// The SQLite store on a database file.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// let config = txbox::Config::builder().build()?;
/// let store = txbox::SqliteStore::connect("sqlite:outbox.db", &config)?;
/// txbox::Store::migrate(&store)?;
/// let mut conn = txbox::SqliteStore::connection("outbox.db")?; // for your transactions
/// # Ok(()) }
/// ```
pub type SqliteStore = SqlStore<SqliteDialect>;

impl SqlStore<SqliteDialect> {
    /// Opens (or creates) the database file `url` names (`sqlite:PATH`,
    /// `sqlite://PATH` or the path alone) for the tables of `config`.
    pub fn connect(url: &str, config: &crate::Config) -> Result<Self> {
        let path = url.strip_prefix("sqlite:").unwrap_or(url);
        let path = path.strip_prefix("//").unwrap_or(path);
        if path.is_empty() {
            return Err(Error::config("database url", "sqlite: needs a file path"));
        }
        let conn = Self::connection(path)?;
        SqlStore::with_pool(SqliteDialect(Mutex::new(conn)), config)
    }

    /// A connection set up as txbox expects (WAL, 5 s busy timeout), for your own
    /// transactions: begin them with `transaction_with_behavior(Immediate)`.
    pub fn connection(path: impl AsRef<Path>) -> Result<rusqlite::Connection> {
        let conn = rusqlite::Connection::open(path).map_err(err)?;
        conn.busy_timeout(Duration::from_secs(5)).map_err(err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(err)?;
        Ok(conn)
    }
}

sql::transaction_impls!(rusqlite::Transaction<'_>, SqliteDialect);
