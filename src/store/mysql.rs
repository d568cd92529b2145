//! MySQL / MariaDB: this dialect's statements, its connection adapter, the
//! [`MySqlStore`], and `publish` / the inbox on `mysql::Transaction`.
//!
//! Claims run at READ COMMITTED (set on every pooled connection): under REPEATABLE
//! READ, gap locks make concurrent pollers deadlock. A deadlock or lock-wait timeout
//! is retried, not reported as a failed batch.

use std::time::Duration;

use mysql::prelude::Queryable;
use mysql::{Params, Value};

use super::sql::{self, Catalog, Conn, Row, SqlStore, Style, Val};
use super::Tables;
use crate::error::DatabaseErrorKind;
use crate::error::{Error, Result};
use crate::event::{EventId, NewEvent};

/// The schema, embedded: the same file a DBA reads in `sql/mysql/`.
pub(crate) const SCHEMA: &str = include_str!("../../sql/mysql/001_schema.sql");
/// Schema version 2: the inbox keyed by (consumer, event id).
pub(crate) const SCHEMA_2: &str = include_str!("../../sql/mysql/002_inbox_per_consumer.sql");
/// Schema version 3: the indexes of per-key ordering.
pub(crate) const SCHEMA_3: &str = include_str!("../../sql/mysql/003_ordered_keys.sql");
pub(crate) const SCHEMA_4: &str = include_str!("../../sql/mysql/004_binary_payloads.sql");
pub(crate) const SCHEMA_5: &str = include_str!("../../sql/mysql/005_insert_order.sql");
/// Schema version 6: the due-time index (delayed events) and the paused
/// event types.
pub(crate) const SCHEMA_6: &str = include_str!("../../sql/mysql/006_delayed_and_paused.sql");

const NOW: &str = "UTC_TIMESTAMP(6)";
const TS: &str = "'%Y-%m-%dT%H:%i:%s.%fZ'";

fn plus(ms_param: &str) -> String {
    format!("{NOW} + INTERVAL ROUND({ms_param} * 1000) MICROSECOND")
}

pub(crate) fn catalog(t: &Tables) -> Catalog {
    let (o, d, l, i) = (&t.outbox, &t.dlq, &t.locks, &t.inbox);
    let dlq_columns = format!(
        "id, event_type, event_key, headers, payload, attempts, last_error, status, \
         DATE_FORMAT(created_at, {TS}), DATE_FORMAT(moved_at, {TS}), payload_bytes, content_type"
    );
    let filter = "($1 IS NULL OR event_type = $1) AND ($2 IS NULL OR status = $2)";
    Catalog {
        style: Style::Question,
        begin: "START TRANSACTION",
        schema: &[SCHEMA, SCHEMA_2, SCHEMA_3, SCHEMA_4, SCHEMA_5, SCHEMA_6],
        transactional_ddl: false,
        online_index: None,
        // one lock per database, whatever the prefix (as PostgreSQL's): DDL
        // commits on its own, and another migrator would rebuild a table again
        migrate_lock: Some(sql::MigrateLock {
            take: |d| {
                let s = d.as_secs().max(1);
                format!("SELECT GET_LOCK(CONCAT('txbox-migrate-', DATABASE()), {s})")
            },
            release: Some("DO RELEASE_LOCK(CONCAT('txbox-migrate-', DATABASE()))"),
            poll: false,
        }),
        // metadata locks, which DDL waits for behind open transactions, and
        // row locks, which an upgrade's UPDATE waits for
        lock_timeout: Some(sql::LockTimeout {
            set: |d| {
                let s = d.as_secs().max(1);
                format!("SET SESSION lock_wait_timeout = {s}, innodb_lock_wait_timeout = {s}")
            },
            reset: Some(
                "SET SESSION lock_wait_timeout = DEFAULT, innodb_lock_wait_timeout = DEFAULT",
            ),
        }),
        // duplicate index, duplicate column, the version recorded already, an
        // index dropped already
        exists_errors: &[1061, 1060, 1062, 1091],
        error_code,
        version_table: format!(
            "SELECT 1 FROM information_schema.TABLES WHERE table_schema = DATABASE() AND table_name = '{}'",
            t.schema_version
        ).into(),
        ping: "SELECT 1".into(),
        // the unique key's last entry
        insert_mark: format!("SELECT COALESCE(MAX(seq), 0) FROM {o}").into(),
        max_ids: 1000,
        // the look-up of an ordered claim picked the claim index, whose first
        // column alone matches, on a table InnoDB had not sampled yet: 5,000
        // rows read per candidate
        common: sql::common(
            t,
            NOW,
            " FROM DUAL",
            plus,
            sql::IDS_IN,
            &sql::KeyLookup {
                hint: |index| format!("FORCE INDEX ({index})"),
                tail: "",
                // no key walk: MariaDB reads a walk step's "next key after the
                // previous one" as every key index entry of the type (it seeks
                // no range on a value from the walk's previous row), and the
                // claim as a scan of the type's pending events with the walk a
                // filter; its ordered claims read due events in id order
                walk: None,
            },
        ),
        claim_returning: None,
        floors: None,
        publish_plus: None,
        hold_claim: None,
        wake: None,
        compact: None,
        next_due: format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, {NOW}, MIN(next_attempt_at)) / 1000.0 FROM {o} \
             WHERE event_type = $1 AND status = 'PENDING' \
               AND NOT EXISTS (SELECT 1 FROM {} WHERE event_type = $1)",
            t.paused
        )
        .into(),
        claim_select: format!(
            "SELECT id, event_type, event_key, headers, payload, attempts, payload_bytes, content_type FROM {o} \
             WHERE event_type = $1 AND id > $2 AND status = 'PENDING' AND next_attempt_at <= {NOW} {{order}} \
             ORDER BY id LIMIT $3 FOR UPDATE SKIP LOCKED"
        ).into(),
        select_expired: format!(
            "SELECT id FROM {o} WHERE status = 'IN_PROCESS' AND lease_until < {NOW} LIMIT $1 FOR UPDATE SKIP LOCKED"
        ).into(),
        select_processed: format!(
            "SELECT id FROM {o} WHERE status = 'PROCESSED' AND processed_at < {} LIMIT $1 FOR UPDATE SKIP LOCKED",
            sql::ago(plus, "$2")
        ).into(),
        select_failed: format!("SELECT id FROM {o} WHERE status = 'FAILED' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED").into(),
        select_retry: format!("SELECT id FROM {d} WHERE status = 'RETRY' ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED").into(),
        select_resolved: format!(
            "SELECT id FROM {d} WHERE status = 'RESOLVED' AND updated_at < {} LIMIT $1 FOR UPDATE SKIP LOCKED",
            sql::ago(plus, "$2")
        ).into(),
        select_inbox_expired: format!(
            "SELECT event_id FROM {i} WHERE consumed_at < {} LIMIT $1 FOR UPDATE SKIP LOCKED",
            sql::ago(plus, "$2")
        ).into(),
        lock_insert: format!(
            "INSERT IGNORE INTO {l} (name, owner, locked_at, locked_until) \
             VALUES ($1, $2, {NOW}, {NOW} - INTERVAL 1 SECOND)"
        ).into(),
        dlq_list: format!("SELECT {dlq_columns} FROM {d} WHERE {filter} ORDER BY moved_at, id LIMIT $3 OFFSET $4").into(),
        dlq_count: format!("SELECT COUNT(*) FROM {d} WHERE {filter}").into(),
        dlq_get: format!("SELECT {dlq_columns} FROM {d} WHERE id = $1").into(),
        dlq_lock: format!("SELECT id FROM {d} WHERE id = $1 FOR UPDATE SKIP LOCKED").into(),
        status: format!(
            "SELECT event_type, SUM(status = 'PENDING'), SUM(status = 'IN_PROCESS'), SUM(status = 'FAILED'), \
               TIMESTAMPDIFF(MICROSECOND, MIN(CASE WHEN status = 'PENDING' THEN created_at END), {NOW}) / 1e6 \
             FROM {o} WHERE status IN ('PENDING', 'IN_PROCESS', 'FAILED') GROUP BY event_type ORDER BY event_type"
        ).into(),
        inbox_insert: format!(
            "INSERT IGNORE INTO {i} (consumer, event_id, consumed_at) VALUES ($1, $2, {NOW})"
        ).into(),
        // no '*' row is written any more: a plain, non-locking read suffices
        inbox_legacy: Some(format!(
            "SELECT event_id FROM {i} WHERE consumer = '*' AND event_id IN ({{ids}})"
        )).map(Into::into),
        insert_events: format!(
            "INSERT INTO {o} (id, event_type, event_key, headers, payload{{bytes_columns}}, next_attempt_at, created_at) VALUES "
        ),
        insert_event_row: "($1, $2, $3, $4, $5{bytes_values}, {due}, UTC_TIMESTAMP(6))".into(),
        insert_bytes_values: ", $6, $7",
        insert_events_sep: ", ",
        insert_events_suffix: "",
        insert_rows_max: usize::MAX,
        insert_one: Default::default(),
    }
}

/// MySQL's error number of a database error.
fn error_code(e: &Error) -> Option<i64> {
    match e {
        Error::Database { source, .. } => match source.downcast_ref::<mysql::Error>()? {
            mysql::Error::MySqlError(m) => Some(i64::from(m.code)),
            _ => None,
        },
        _ => None,
    }
}

fn err(e: mysql::Error) -> Error {
    match &e {
        // deadlock, lock wait timeout
        mysql::Error::MySqlError(m) if m.code == 1213 || m.code == 1205 => {
            Error::database(DatabaseErrorKind::Retryable, e)
        }
        _ => Error::database(DatabaseErrorKind::Other, e),
    }
}

fn params(vals: &[Val]) -> Params {
    if vals.is_empty() {
        return Params::Empty;
    }
    Params::Positional(
        vals.iter()
            .map(|v| match v {
                Val::Null => Value::NULL,
                Val::Int(n) => Value::Int(*n),
                Val::Float(f) => Value::Double(*f),
                Val::Text(s) => Value::Bytes(s.clone().into_bytes()),
                Val::Id(u) => Value::Bytes(u.as_bytes().to_vec()),
                Val::Bytes(b) => Value::Bytes(b.clone()),
            })
            .collect(),
    )
}

fn row(r: mysql::Row) -> Row {
    Row(r
        .unwrap()
        .into_iter()
        .map(|v| match v {
            Value::NULL => Val::Null,
            Value::Bytes(b) => Val::Bytes(b),
            Value::Int(n) => Val::Int(n),
            Value::UInt(n) => Val::Int(n as i64),
            Value::Float(f) => Val::Float(f.into()),
            Value::Double(f) => Val::Float(f),
            other => Val::Text(other.as_sql(true)),
        })
        .collect())
}

fn my_query(c: &mut impl Queryable, sql: &str, vals: &[Val]) -> Result<Vec<Row>> {
    let rows: Vec<mysql::Row> = c.exec(sql, params(vals)).map_err(err)?;
    Ok(rows.into_iter().map(row).collect())
}

fn my_execute(c: &mut impl Queryable, sql: &str, vals: &[Val]) -> Result<u64> {
    let result = c.exec_iter(sql, params(vals)).map_err(err)?;
    Ok(result.affected_rows())
}

fn my_batch(c: &mut impl Queryable, sql: &str) -> Result<()> {
    c.query_drop(sql).map_err(err)
}

sql::conn_impls!(my_query, my_execute, my_batch; mysql::PooledConn, mysql::Transaction<'_>);

/// The MySQL / MariaDB dialect of [`SqlStore`]: a `mysql::Pool`.
pub struct MySqlDialect(mysql::Pool);

/// A pooled connection of the store's own calls. The driver's pool resets
/// each connection it takes back (`COM_RESET_CONNECTION`, the session's
/// settings again, every statement prepared anew: three round trips, and a
/// prepare in the next call); the store's connections hold no session state
/// of their own (their transactions end before they go back, even on a
/// panic: [`sql::transaction`]), so they go back without it, except one on
/// which a call failed short of the server's answer: a lost link fails its
/// reset and leaves the pool. Connections your code takes from
/// [`MySqlStore::pool`] are reset as the URL says (by default).
struct Own(mysql::PooledConn);

impl Own {
    fn watch<R>(&mut self, r: Result<R>) -> Result<R> {
        // an error the server answered with (a duplicate, a deadlock) leaves
        // the connection as it was
        if let Err(e) = &r {
            if error_code(e).is_none() {
                self.0.reset_connection(true);
            }
        }
        r
    }
}

impl Conn for Own {
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
        let r = my_query(&mut self.0, sql, params);
        self.watch(r)
    }
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        let r = my_execute(&mut self.0, sql, params);
        self.watch(r)
    }
    fn batch(&mut self, sql: &str) -> Result<()> {
        let r = my_batch(&mut self.0, sql);
        self.watch(r)
    }
}

impl sql::Driver for MySqlDialect {
    const SLOT: usize = 1;
    fn catalog(tables: &Tables) -> Catalog {
        catalog(tables)
    }
    fn get(&self) -> Result<Box<dyn Conn + '_>> {
        let mut conn = self.0.get_conn().map_err(err)?;
        conn.reset_connection(false);
        Ok(Box::new(Own(conn)))
    }
}

impl sql::Dialect for MySqlDialect {}

/// The MySQL / MariaDB store on its own `mysql::Pool`.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// let config = txbox::Config::builder().build()?;
/// let store = txbox::MySqlStore::connect("mysql://root@127.0.0.1:3306/test", &config)?;
/// txbox::Store::migrate(&store)?;
/// # Ok(()) }
/// ```
pub type MySqlStore = SqlStore<MySqlDialect>;

impl SqlStore<MySqlDialect> {
    /// Connects a pool (up to 16 connections) to `url`
    /// (`mysql://user:pass@host:port/db?options`, or `mariadb://`) for the
    /// tables of `config`.
    ///
    /// TLS: the `mysql` crate's own options (`root_cert_path`,
    /// `danger_skip_domain_validation`, `danger_accept_invalid_certs`,
    /// `pkcs12_path`, ...), and MySQL's `ssl_mode` as its clients spell it:
    /// `DISABLED` (the default), `REQUIRED` (encrypted, the certificate
    /// unchecked unless `root_cert_path` is given), `VERIFY_CA` (signed by
    /// a CA of `root_cert_path`, required), `VERIFY_IDENTITY` (signed by those
    /// or the system's CAs, and issued for the host). `PREFERRED` is refused: the driver cannot fall back to
    /// plaintext, and txbox does not guess.
    ///
    /// Timeouts, unless the URL sets them: `tcp_connect_timeout_ms` 10 s,
    /// `read_timeout_ms` and `write_timeout_ms` (read by txbox) 120 s,
    /// `tcp_keepalive_time_ms` 5 s then `tcp_keepalive_probe_interval_secs` 1 ×
    /// `tcp_keepalive_probe_count` 5, `tcp_user_timeout_ms` 10 s: a connection
    /// whose link drops everything is given up within 10 s, idle or in a call.
    ///
    /// The first connection is opened here: an unreachable server, a refused
    /// login or a certificate that does not verify is [`Error::Connect`] now.
    pub fn connect(url: &str, config: &crate::Config) -> Result<Self> {
        let url = match url.strip_prefix("mariadb:") {
            Some(rest) => format!("mysql:{rest}"),
            None => url.to_owned(),
        };
        let invalid = |e: &dyn std::fmt::Display| Error::config("database url", e.to_string());
        let mut parsed = url::Url::parse(&url).map_err(|e| invalid(&e))?;
        let mut ours = std::collections::BTreeMap::new();
        let kept: Vec<(String, String)> = parsed
            .query_pairs()
            .filter_map(|(k, v)| match k.as_ref() {
                "ssl_mode" | "read_timeout_ms" | "write_timeout_ms" => {
                    ours.insert(k.into_owned(), v.into_owned());
                    None
                }
                _ => Some((k.into_owned(), v.into_owned())),
            })
            .collect();
        parsed.set_query(None);
        if !kept.is_empty() {
            parsed.query_pairs_mut().extend_pairs(kept);
        }
        let opts = mysql::Opts::from_url(parsed.as_str()).map_err(|e| invalid(&e))?;
        let ms = |key: &str, default: u64| -> Result<Option<Duration>> {
            match ours.get(key) {
                None => Ok(Some(Duration::from_millis(default))),
                Some(v) => v
                    .parse::<u64>()
                    .map(|n| (n > 0).then(|| Duration::from_millis(n)))
                    .map_err(|_| invalid(&format!("{key}={v:?} is not a number of milliseconds"))),
            }
        };
        let (read, write) = (
            ms("read_timeout_ms", 120_000)?,
            ms("write_timeout_ms", 120_000)?,
        );
        let mut ssl = opts.get_ssl_opts().cloned();
        match ours.get("ssl_mode").map(|m| m.to_ascii_uppercase()).as_deref() {
            None => {}
            Some("DISABLED") if ssl.is_none() => {}
            Some("DISABLED") => return Err(invalid(&"ssl_mode=DISABLED with TLS options")),
            Some("VERIFY_CA") if ssl.as_ref().is_none_or(|s| s.root_cert_path().is_none()) => {
                return Err(invalid(&"ssl_mode=VERIFY_CA takes root_cert_path, a file of the CAs to trust"))
            }
            Some(m @ ("REQUIRED" | "VERIFY_CA" | "VERIFY_IDENTITY")) => {
                let s = ssl.take().unwrap_or_default();
                let unchecked = m == "REQUIRED" && s.root_cert_path().is_none();
                ssl = Some(
                    s.with_danger_accept_invalid_certs(unchecked)
                        .with_danger_skip_domain_validation(m != "VERIFY_IDENTITY"),
                );
            }
            Some(m) => {
                return Err(invalid(&format!(
                    "ssl_mode {m:?} is not supported: use DISABLED, REQUIRED, VERIFY_CA or VERIFY_IDENTITY"
                )))
            }
        }
        let to = format!(
            "MySQL at {}:{}",
            opts.get_ip_or_hostname(),
            opts.get_tcp_port()
        );
        let mut b = mysql::OptsBuilder::from_opts(opts.clone())
            .init(vec![
                "SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
            ])
            .read_timeout(read)
            .write_timeout(write)
            .tcp_connect_timeout(Some(
                opts.get_tcp_connect_timeout()
                    .unwrap_or(Duration::from_secs(10)),
            ))
            .tcp_keepalive_time_ms(Some(opts.get_tcp_keepalive_time_ms().unwrap_or(5_000)))
            .tcp_keepalive_probe_interval_secs(Some(
                opts.get_tcp_keepalive_probe_interval_secs().unwrap_or(1),
            ))
            .tcp_keepalive_probe_count(Some(opts.get_tcp_keepalive_probe_count().unwrap_or(5)))
            .tcp_user_timeout_ms(Some(opts.get_tcp_user_timeout_ms().unwrap_or(10_000)))
            .pool_opts(
                // the URL's `reset_connection` and `check_health` kept
                opts.get_pool_opts().clone().with_constraints(
                    mysql::PoolConstraints::new(1, 16)
                        .ok_or_else(|| Error::Internal("pool size 1 to 16".into()))?,
                ),
            );
        if ssl.is_some() {
            // asked for TLS: it is not traded for the server's local socket
            b = b.ssl_opts(ssl).prefer_socket(false);
        }
        let pool = mysql::Pool::new(b).map_err(|e| Error::Connect {
            to,
            reason: e.to_string(),
            source: Some(Box::new(e)),
        })?;
        SqlStore::with_pool(MySqlDialect(pool), config)
    }

    /// The pool, e.g. for business transactions and the inbox.
    pub fn pool(&self) -> &mysql::Pool {
        &self.pool.0
    }
}

sql::transaction_impls!(mysql::Transaction<'_>, MySqlDialect);

#[cfg(test)]
mod tests {
    use super::*;

    fn mysql_error(code: u16, message: &str) -> Error {
        let e = mysql::Error::MySqlError(mysql::MySqlError {
            state: "HY000".into(),
            message: message.into(),
            code,
        });
        Error::database(DatabaseErrorKind::Other, e)
    }

    /// "Already there" is the error's number, not a number in its text (a
    /// table prefix such as `t1062_` would otherwise pass any error over).
    #[test]
    fn migration_errors_are_told_by_their_number() {
        let exists = &catalog(&Tables::new("t1062_").unwrap()).exists_errors;
        let dup = mysql_error(1061, "Duplicate key name 't1062_outbox_key_seq_idx'");
        assert!(error_code(&dup).is_some_and(|c| exists.contains(&c)));
        let missing = mysql_error(1146, "Table 'test.t1062_outbox_events' doesn't exist");
        assert_eq!(error_code(&missing), Some(1146));
        assert!(!exists.contains(&1146));
        assert_eq!(error_code(&Error::InvalidInput("1062".into())), None);
    }
}
