//! Oracle: this dialect's statements, its connection adapter, the [`OracleStore`],
//! and `publish` / the inbox on an `oracle::Connection` inside a transaction.
//!
//! - Claims use `FOR UPDATE SKIP LOCKED` limited by what they fetch (fetch array
//!   size = batch size), not `FETCH FIRST`, which makes concurrent pollers come back
//!   empty.
//! - `{ids}` lists are chunked at 1000 (Oracle's IN-list limit).
//! - The inbox insert treats a unique-key violation (ORA-00001) as a duplicate.
//! - The store's pooled connections run in autocommit except inside txbox's own
//!   transactions; your connection must not (publish checks it).
//!
//! No Oracle server or client can run on this project's CI machines: the feature is
//! built and linted there, and the conformance suite runs against Oracle when
//! `TXBOX_ORACLE_URL` is set.

use oracle::sql_type::{OracleType, ToSql};

use super::sql::{self, Catalog, Conn, Row, SqlStore, Style, Val};
use super::Tables;
use crate::error::DatabaseErrorKind;
use crate::error::{Error, Result};
use crate::event::{EventId, NewEvent};

/// The schema, embedded: the same file a DBA reads in `sql/oracle/`.
pub(crate) const SCHEMA: &str = include_str!("../../sql/oracle/001_schema.sql");
/// Schema version 2: the inbox keyed by (consumer, event id).
pub(crate) const SCHEMA_2: &str = include_str!("../../sql/oracle/002_inbox_per_consumer.sql");
/// Schema version 3: the indexes of per-key ordering.
pub(crate) const SCHEMA_3: &str = include_str!("../../sql/oracle/003_ordered_keys.sql");
pub(crate) const SCHEMA_4: &str = include_str!("../../sql/oracle/004_binary_payloads.sql");
pub(crate) const SCHEMA_5: &str = include_str!("../../sql/oracle/005_insert_order.sql");
/// Schema version 6: the due-time index (delayed events) and the paused
/// event types.
pub(crate) const SCHEMA_6: &str = include_str!("../../sql/oracle/006_delayed_and_paused.sql");

const NOW: &str = "SYSTIMESTAMP";
const TS: &str = "'YYYY-MM-DD\"T\"HH24:MI:SS.FF6\"Z\"'";

fn plus(ms_param: &str) -> String {
    format!("SYSTIMESTAMP + NUMTODSINTERVAL({ms_param} / 1000, 'SECOND')")
}

pub(crate) fn catalog(t: &Tables) -> Catalog {
    let (o, d, l, i) = (&t.outbox, &t.dlq, &t.locks, &t.inbox);
    let dlq_columns = format!(
        "id, event_type, event_key, headers, payload, attempts, last_error, status, \
         TO_CHAR(SYS_EXTRACT_UTC(created_at), {TS}), TO_CHAR(SYS_EXTRACT_UTC(moved_at), {TS}), payload_bytes, content_type"
    );
    let filter = "($1 IS NULL OR event_type = $1) AND ($2 IS NULL OR status = $2)";
    let count = |s: &str| format!("SUM(CASE WHEN status = '{s}' THEN 1 ELSE 0 END)");
    Catalog {
        style: Style::Colon,
        begin: "BEGIN",
        schema: &[SCHEMA, SCHEMA_2, SCHEMA_3, SCHEMA_4, SCHEMA_5, SCHEMA_6],
        transactional_ddl: false,
        online_index: None,
        migrate_lock: None,
        lock_timeout: Some(sql::LockTimeout {
            set: |d| {
                let s = d.as_secs().clamp(1, 1_000_000);
                format!("ALTER SESSION SET DDL_LOCK_TIMEOUT = {s}")
            },
            reset: Some("ALTER SESSION SET DDL_LOCK_TIMEOUT = 0"),
        }),
        // name used, index exists, column exists, column allows NULL already,
        // no primary key to drop, one primary key only, the version recorded
        // already, no index to drop
        exists_errors: &[955, 1408, 1430, 1451, 2441, 2260, 1, 1418],
        error_code,
        version_table: format!(
            "SELECT 1 FROM user_tables WHERE table_name = UPPER('{}')",
            t.schema_version
        ).into(),
        ping: "SELECT 1 FROM DUAL".into(),
        insert_mark: format!("SELECT COALESCE(MAX(seq), 0) FROM {o}").into(),
        max_ids: 1000,
        // no hint: the planner finds the key index on its own; no key walk
        // (untested here), the ordered claims read due events in id order
        common: sql::common(
            t,
            NOW,
            " FROM dual",
            plus,
            sql::IDS_IN,
            &sql::KeyLookup::plain(None),
        ),
        claim_returning: None,
        floors: None,
        publish_plus: None,
        hold_claim: None,
        wake: None,
        compact: None,
        // no row limit in SQL: the fetch size limits it ($2 is not bound)
        next_due: format!(
            "SELECT EXTRACT(DAY FROM w) * 86400000 + EXTRACT(HOUR FROM w) * 3600000 \
               + EXTRACT(MINUTE FROM w) * 60000 + EXTRACT(SECOND FROM w) * 1000 \
             FROM (SELECT MIN(next_attempt_at) - {NOW} AS w FROM {o} \
               WHERE event_type = $1 AND status = 'PENDING' \
               AND NOT EXISTS (SELECT 1 FROM {} WHERE event_type = $1))",
            t.paused
        )
        .into(),
        claim_select: format!(
            "SELECT id, event_type, event_key, headers, payload, attempts, payload_bytes, content_type FROM {o} \
             WHERE event_type = $1 AND id > $2 AND status = 'PENDING' AND next_attempt_at <= {NOW} {{order}} \
             ORDER BY id FOR UPDATE SKIP LOCKED"
        ).into(),
        select_expired: format!("SELECT id FROM {o} WHERE status = 'IN_PROCESS' AND lease_until < {NOW} FOR UPDATE SKIP LOCKED").into(),
        select_processed: format!(
            "SELECT id FROM {o} WHERE status = 'PROCESSED' AND processed_at < {} FOR UPDATE SKIP LOCKED",
            sql::ago(plus, "$2")
        ).into(),
        select_failed: format!("SELECT id FROM {o} WHERE status = 'FAILED' ORDER BY id FOR UPDATE SKIP LOCKED").into(),
        select_retry: format!("SELECT id FROM {d} WHERE status = 'RETRY' ORDER BY id FOR UPDATE SKIP LOCKED").into(),
        select_resolved: format!(
            "SELECT id FROM {d} WHERE status = 'RESOLVED' AND updated_at < {} FOR UPDATE SKIP LOCKED",
            sql::ago(plus, "$2")
        ).into(),
        select_inbox_expired: format!("SELECT event_id FROM {i} WHERE consumed_at < {} FOR UPDATE SKIP LOCKED", sql::ago(plus, "$2")).into(),
        lock_insert: format!(
            "MERGE INTO {l} t USING (SELECT $1 AS name FROM dual) s ON (t.name = s.name) \
             WHEN NOT MATCHED THEN INSERT (name, owner, locked_at, locked_until) \
             VALUES ($1, $2, {NOW}, {NOW} - INTERVAL '1' SECOND)"
        ).into(),
        dlq_list: format!(
            "SELECT {dlq_columns} FROM {d} WHERE {filter} ORDER BY moved_at, id \
             OFFSET $4 ROWS FETCH NEXT $3 ROWS ONLY"
        ).into(),
        dlq_count: format!("SELECT COUNT(*) FROM {d} WHERE {filter}").into(),
        dlq_get: format!("SELECT {dlq_columns} FROM {d} WHERE id = $1").into(),
        dlq_lock: format!("SELECT id FROM {d} WHERE id = $1 FOR UPDATE SKIP LOCKED").into(),
        status: format!(
            "SELECT event_type, {}, {}, {}, \
               (CAST(SYS_EXTRACT_UTC({NOW}) AS DATE) \
                 - CAST(SYS_EXTRACT_UTC(MIN(CASE WHEN status = 'PENDING' THEN created_at END)) AS DATE)) * 86400 \
             FROM {o} WHERE status IN ('PENDING', 'IN_PROCESS', 'FAILED') GROUP BY event_type ORDER BY event_type",
            count("PENDING"),
            count("IN_PROCESS"),
            count("FAILED")
        ).into(),
        inbox_insert: format!(
            "INSERT INTO {i} (consumer, event_id, consumed_at) SELECT $1, $2, {NOW} FROM dual \
             WHERE NOT EXISTS (SELECT 1 FROM {i} WHERE consumer = '*' AND event_id = $2)"
        ).into(),
        inbox_legacy: None,
        insert_events: "INSERT ALL ".into(),
        insert_event_row: format!(
            "INTO {o} (id, event_type, event_key, headers, payload{{bytes_columns}}, next_attempt_at, created_at) \
             VALUES ($1, $2, $3, $4, $5{{bytes_values}}, {{due}}, {NOW})"
        ),
        insert_bytes_values: ", $6, $7",
        insert_events_sep: " ",
        insert_events_suffix: " SELECT 1 FROM dual",
        // INSERT ALL takes the identity's next number once per statement
        insert_rows_max: 1,
        insert_one: Default::default(),
    }
}

/// Oracle's ORA number of a database error.
fn error_code(e: &Error) -> Option<i64> {
    match e {
        Error::Database { source, .. } => source
            .downcast_ref::<oracle::Error>()?
            .db_error()
            .map(|d| i64::from(d.code())),
        _ => None,
    }
}

fn err(e: oracle::Error) -> Error {
    match e.db_error().map(|d| d.code()) {
        Some(1) => Error::database(DatabaseErrorKind::UniqueViolation, e),
        // a deadlock; a lock not had within DDL_LOCK_TIMEOUT (or NOWAIT), an
        // object's lock not had in time
        Some(60 | 54 | 4021) => Error::database(DatabaseErrorKind::Retryable, e),
        _ => Error::database(DatabaseErrorKind::Other, e),
    }
}

fn bind(vals: &[Val]) -> Vec<Box<dyn ToSql>> {
    vals.iter()
        .map(|v| -> Box<dyn ToSql> {
            match v {
                Val::Null => Box::new(Option::<String>::None),
                Val::Int(n) => Box::new(*n),
                Val::Float(f) => Box::new(*f),
                Val::Text(s) => Box::new(s.clone()),
                Val::Id(u) => Box::new(u.as_bytes().to_vec()),
                Val::Bytes(b) => Box::new(b.clone()),
            }
        })
        .collect()
}

fn row(r: &oracle::Row) -> Result<Row> {
    r.sql_values()
        .iter()
        .map(|v| {
            if v.is_null().map_err(err)? {
                return Ok(Val::Null);
            }
            Ok(match v.oracle_type().map_err(err)? {
                OracleType::Raw(_) | OracleType::BLOB => {
                    Val::Bytes(v.get::<Vec<u8>>().map_err(err)?)
                }
                // numbers and text alike: Row reads numbers from their text
                _ => Val::Text(v.get::<String>().map_err(err)?),
            })
        })
        .collect::<Result<Vec<_>>>()
        .map(Row)
}

fn fetch(conn: &oracle::Connection, sql: &str, params: &[Val], max: usize) -> Result<Vec<Row>> {
    // one array holds the whole limit (maintenance takes up to 100,000 rows):
    // a second fetch would lock rows past it
    let size = max.clamp(1, 100_000) as u32;
    let mut stmt = conn
        .statement(sql)
        .fetch_array_size(size)
        .prefetch_rows(size)
        .build()
        .map_err(err)?;
    let owned = bind(params);
    let refs: Vec<&dyn ToSql> = owned.iter().map(|b| b.as_ref()).collect();
    let rows = stmt.query(&refs).map_err(err)?;
    let mut out = Vec::new();
    if max == 0 {
        return Ok(out);
    }
    for r in rows {
        out.push(row(&r.map_err(err)?)?);
        if out.len() >= max {
            // no further `next()`: it would fetch (and, with SKIP LOCKED, lock)
            // another array of rows that this claim does not take and other
            // instances would then skip
            break;
        }
    }
    Ok(out)
}

impl Conn for oracle::Connection {
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
        fetch(self, sql, params, usize::MAX)
    }

    fn query_max(&mut self, sql: &str, params: &[Val], max: usize) -> Result<Vec<Row>> {
        fetch(self, sql, params, max)
    }

    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        let owned = bind(params);
        let refs: Vec<&dyn ToSql> = owned.iter().map(|b| b.as_ref()).collect();
        let stmt = oracle::Connection::execute(self, sql, &refs).map_err(err)?;
        stmt.row_count().map_err(err)
    }

    /// Transaction control maps to the driver: BEGIN turns autocommit off until
    /// COMMIT or ROLLBACK.
    fn batch(&mut self, sql: &str) -> Result<()> {
        match sql {
            "" => Ok(()),
            "BEGIN" => {
                self.set_autocommit(false);
                Ok(())
            }
            "COMMIT" => {
                let r = self.commit().map_err(err);
                self.set_autocommit(true);
                r
            }
            "ROLLBACK" => {
                let r = self.rollback().map_err(err);
                self.set_autocommit(true);
                r
            }
            other => oracle::Connection::execute(self, other, &[])
                .map(|_| ())
                .map_err(err),
        }
    }
}

/// The Oracle dialect of [`SqlStore`]: a session pool of the `oracle` crate.
pub struct OracleDialect(oracle::pool::Pool);

impl sql::Driver for OracleDialect {
    const SLOT: usize = 3;
    fn catalog(tables: &Tables) -> Catalog {
        catalog(tables)
    }
    fn get(&self) -> Result<Box<dyn Conn + '_>> {
        let mut conn = self.0.get().map_err(err)?;
        conn.set_autocommit(true);
        Ok(Box::new(conn))
    }
}

impl sql::Dialect for OracleDialect {}

/// The Oracle store on a session pool of the `oracle` crate (Oracle's client
/// library `libclntsh` is loaded at run time).
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// let config = txbox::Config::builder().build()?;
/// let store = txbox::OracleStore::connect("oracle://scott:tiger@db-host:1521/FREEPDB1", &config)?;
/// txbox::Store::migrate(&store)?;
/// # Ok(()) }
/// ```
pub type OracleStore = SqlStore<OracleDialect>;

impl SqlStore<OracleDialect> {
    /// A pool of up to 16 sessions on `oracle://user:password@host:port/service`
    /// (as `TXBOX_ORACLE_URL` holds it) for the tables of `config`.
    pub fn connect(url: &str, config: &crate::Config) -> Result<Self> {
        let (user, password, target) = parse_url(url)?;
        let pool = oracle::pool::PoolBuilder::new(user, password, format!("//{target}"))
            .max_connections(16)
            .build()
            .map_err(err)?;
        SqlStore::with_pool(OracleDialect(pool), config)
    }
}

/// `oracle://user:password@host:port/service` as (user, password, target). The
/// target follows the last `@`, so a password may hold `@` (and `:`) as it is.
fn parse_url(url: &str) -> Result<(&str, &str, &str)> {
    let bad = || {
        Error::config(
            "database url",
            "oracle: expected oracle://user:password@host:port/service",
        )
    };
    let rest = url.strip_prefix("oracle://").ok_or_else(bad)?;
    let (cred, target) = rest.rsplit_once('@').ok_or_else(bad)?;
    let (user, password) = cred.split_once(':').ok_or_else(bad)?;
    if user.is_empty() || target.is_empty() {
        return Err(bad());
    }
    Ok((user, password, target))
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    #[test]
    fn a_password_may_hold_at_signs_and_colons() {
        assert_eq!(
            parse_url("oracle://scott:p@ss:w@rd@db.example:1521/ORCL").unwrap(),
            ("scott", "p@ss:w@rd", "db.example:1521/ORCL")
        );
        assert_eq!(
            parse_url("oracle://scott:tiger@db:1521/ORCL").unwrap(),
            ("scott", "tiger", "db:1521/ORCL")
        );
        for bad in [
            "oracle://scott@db/x",
            "oracle://:pw@db/x",
            "postgres://a:b@c/d",
            "oracle://a:b@",
        ] {
            let err = parse_url(bad).unwrap_err().to_string();
            assert!(!err.contains("pw") && !err.contains(":b@"), "{err}");
        }
    }
}

fn in_transaction(conn: &oracle::Connection) -> Result<()> {
    if conn.autocommit() {
        return Err(Error::Misuse(
            "the oracle connection has autocommit on: publish needs a transaction (autocommit off)"
                .into(),
        ));
    }
    Ok(())
}

sql::transaction_impls!(oracle::Connection, OracleDialect, in_transaction);
