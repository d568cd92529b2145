//! One fixture over every SQL dialect, so the conformance suite runs unchanged on each.

use std::sync::Arc;
use txbox::FullStore;

use txbox::{Config, EventId, Outbox};

/// The dialects the suite runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Postgres,
    #[cfg(feature = "mysql")]
    MySql,
    #[cfg(feature = "sqlite")]
    Sqlite,
    #[cfg(feature = "oracle")]
    Oracle,
}

impl Backend {
    /// Whether its ordered claims walk the keys (PostgreSQL, SQLite); the
    /// others read due events in id order.
    #[allow(dead_code)]
    pub fn walks_keys(self) -> bool {
        match self {
            Backend::Postgres => true,
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => true,
            #[allow(unreachable_patterns)]
            _ => false,
        }
    }
}

/// `oracle://user:password@host:port/service`, only when set.
#[cfg(feature = "oracle")]
pub fn oracle_url() -> Option<String> {
    std::env::var("TXBOX_ORACLE_URL")
        .ok()
        .filter(|u| !u.is_empty())
}

/// A plain Oracle connection (autocommit off) from `TXBOX_ORACLE_URL`.
#[cfg(feature = "oracle")]
pub fn oracle_connection() -> oracle::Connection {
    let url = oracle_url().expect("TXBOX_ORACLE_URL");
    let rest = url.trim_start_matches("oracle://");
    let (cred, target) = rest.split_once('@').expect("user:password@target");
    let (user, password) = cred.split_once(':').expect("user:password");
    oracle::Connection::connect(user, password, format!("//{target}")).expect("oracle connect")
}

pub fn mysql_url() -> String {
    std::env::var("TXBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// Every table of a prefix.
pub const TABLES: [&str; 6] = [
    "outbox_events",
    "outbox_dead_letters",
    "inbox_consumed",
    "job_locks",
    "txbox_schema_version",
    "outbox_paused_types",
];

/// A fresh set of tables on one backend, and a way to write to it as an application would.
pub struct Fixture {
    pub backend: Backend,
    pub prefix: String,
    pub store: Arc<dyn FullStore>,
    sqlite_path: std::path::PathBuf,
}

impl Fixture {
    /// The SQLite database file (the SQLite backend's).
    pub fn sqlite_path(&self) -> &std::path::Path {
        &self.sqlite_path
    }

    /// Drops and migrates the tables of `prefix`; `None` (printed) when the database
    /// is not reachable outside CI.
    pub fn new(backend: Backend, prefix: &str) -> Option<Fixture> {
        match backend {
            Backend::Postgres => {
                let mut c = super::client()?;
                for t in TABLES.iter().chain(&["outbox_quiet_types"]) {
                    c.batch_execute(&format!("DROP TABLE IF EXISTS {prefix}{t}"))
                        .unwrap();
                }
            }
            #[cfg(feature = "mysql")]
            Backend::MySql => {
                use mysql::prelude::Queryable;
                if !super::service_up("MariaDB", "127.0.0.1:3306") {
                    return None;
                }
                let pool = mysql::Pool::new(mysql_url().as_str()).unwrap();
                let mut c = pool.get_conn().unwrap();
                for t in TABLES {
                    c.query_drop(format!("DROP TABLE IF EXISTS {prefix}{t}"))
                        .unwrap();
                }
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                for suffix in ["", "-wal", "-shm"] {
                    let path = sqlite_path(prefix).display().to_string();
                    let _ = std::fs::remove_file(format!("{path}{suffix}"));
                }
            }
            #[cfg(feature = "oracle")]
            Backend::Oracle => {
                if oracle_url().is_none() {
                    // Oracle cannot run on the project's machines: skipped even in CI
                    eprintln!("SKIPPED: Oracle: TXBOX_ORACLE_URL is not set");
                    return None;
                }
                let c = oracle_connection();
                for t in TABLES {
                    c.execute(
                        &format!("BEGIN EXECUTE IMMEDIATE 'DROP TABLE {prefix}{t}'; EXCEPTION WHEN OTHERS THEN NULL; END;"),
                        &[],
                    )
                    .unwrap();
                }
            }
        }
        let fx = Fixture::new_existing(backend, prefix);
        fx.store.migrate().unwrap();
        Some(fx)
    }

    /// Drops the tables of `prefix` and creates them as txbox 0.1 did: the baseline
    /// schema (`001_schema.sql`) without the version table, which 0.1 did not have.
    /// Then records `old_ids` in its inbox as 0.1 did (keyed by the event id alone).
    /// `None` on Oracle, which cannot run here.
    pub fn schema_v1(backend: Backend, prefix: &str, old_ids: &[EventId]) -> Option<Fixture> {
        let statements = |sql: &str| -> Vec<String> {
            sql.replace("{prefix}", prefix)
                .lines()
                .map(|l| l.split("--").next().unwrap_or_default())
                .collect::<Vec<_>>()
                .join("\n")
                .split(';')
                .map(str::trim)
                // 0.1 had no version table
                .filter(|s| !s.is_empty() && !s.contains("txbox_schema_version"))
                .map(String::from)
                .collect()
        };
        let fx = Fixture::new(backend, prefix)?;
        match backend {
            Backend::Postgres => {
                let mut c = super::client()?;
                for t in TABLES {
                    c.batch_execute(&format!("DROP TABLE {prefix}{t}")).unwrap();
                }
                for s in statements(include_str!("../../sql/postgres/001_schema.sql")) {
                    c.batch_execute(&s).unwrap();
                }
                for id in old_ids {
                    c.execute(
                        &format!("INSERT INTO {prefix}inbox_consumed (event_id) VALUES ($1)"),
                        &[&id.as_uuid()],
                    )
                    .unwrap();
                }
            }
            #[cfg(feature = "mysql")]
            Backend::MySql => {
                use mysql::prelude::Queryable;
                let pool = mysql::Pool::new(mysql_url().as_str()).unwrap();
                let mut c = pool.get_conn().unwrap();
                for t in TABLES {
                    c.query_drop(format!("DROP TABLE {prefix}{t}")).unwrap();
                }
                for s in statements(include_str!("../../sql/mysql/001_schema.sql")) {
                    c.query_drop(s).unwrap();
                }
                for id in old_ids {
                    c.exec_drop(
                        format!("INSERT INTO {prefix}inbox_consumed (event_id, consumed_at) VALUES (?, UTC_TIMESTAMP(6))"),
                        (id.as_uuid().as_bytes().to_vec(),),
                    )
                    .unwrap();
                }
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                let c = txbox::SqliteStore::connection(&fx.sqlite_path).unwrap();
                for t in TABLES {
                    c.execute_batch(&format!("DROP TABLE {prefix}{t}")).unwrap();
                }
                for s in statements(include_str!("../../sql/sqlite/001_schema.sql")) {
                    c.execute_batch(&s).unwrap();
                }
                for id in old_ids {
                    c.execute(
                        &format!("INSERT INTO {prefix}inbox_consumed (event_id, consumed_at) VALUES (?1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"),
                        [id.to_string()],
                    )
                    .unwrap();
                }
            }
            #[cfg(feature = "oracle")]
            Backend::Oracle => return None,
        }
        Some(fx)
    }

    /// Runs one statement of this backend's SQL on a connection of its own.
    #[allow(dead_code)]
    pub fn execute(&self, sql: &str) {
        self.execute_all(&[sql]);
    }

    /// Runs statements in order, each on its own (autocommit), on one
    /// connection of its own (session variables carry over).
    #[allow(dead_code)]
    pub fn execute_all(&self, statements: &[impl AsRef<str>]) {
        let all = statements.iter().map(AsRef::as_ref);
        match self.backend {
            Backend::Postgres => {
                let mut c = super::client().unwrap();
                for sql in all {
                    c.batch_execute(sql)
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
            #[cfg(feature = "mysql")]
            Backend::MySql => {
                use mysql::prelude::Queryable;
                let pool = mysql::Pool::new(mysql_url().as_str()).unwrap();
                let mut c = pool.get_conn().unwrap();
                for sql in all {
                    c.query_drop(sql).unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                let c = txbox::SqliteStore::connection(&self.sqlite_path).unwrap();
                for sql in all {
                    c.execute_batch(sql)
                        .unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
            #[cfg(feature = "oracle")]
            Backend::Oracle => {
                let c = oracle_connection();
                for sql in all {
                    c.execute(sql, &[]).unwrap_or_else(|e| panic!("{sql}: {e}"));
                }
            }
        }
    }

    /// A fixture on tables that already exist (no drop, no migrate).
    pub fn new_existing(backend: Backend, prefix: &str) -> Fixture {
        let sqlite_path = sqlite_path(prefix);
        let store = open_store(backend, prefix, &sqlite_path);
        Fixture {
            backend,
            prefix: prefix.to_string(),
            store,
            sqlite_path,
        }
    }

    /// A store on these tables opened with `config` (its observer, its
    /// settings), which must name the fixture's prefix.
    #[allow(dead_code)]
    pub fn store_with(&self, config: &Config) -> Arc<dyn FullStore> {
        assert_eq!(config.table_prefix(), self.prefix);
        open_store_with(self.backend, config, &self.sqlite_path)
    }

    /// Another store instance on the same tables (another relay process would have one).
    pub fn another_store(&self) -> Arc<dyn FullStore> {
        open_store(self.backend, &self.prefix, &self.sqlite_path)
    }

    /// Publishes `n` events (payloads 0..n) of `event_type` in one business
    /// transaction, committed or rolled back.
    pub fn publish(
        &self,
        config: &Config,
        event_type: &str,
        n: usize,
        commit: bool,
    ) -> Vec<EventId> {
        let outbox = Outbox::new(config).unwrap();
        self.in_tx(
            |tx| {
                outbox
                    .publish_all(tx, txbox::NewEvent::batch(event_type, 0..n).unwrap())
                    .unwrap()
            },
            |_| commit,
        )
    }

    /// Publishes `events` in one committed business transaction of this backend.
    pub fn publish_events(&self, config: &Config, events: Vec<txbox::NewEvent>) -> Vec<EventId> {
        let outbox = Outbox::new(config).unwrap();
        self.in_tx(|tx| outbox.publish_all(tx, events).unwrap(), |_| true)
    }

    /// Runs `f` with the inbox on a business transaction of this backend, and commits
    /// when it returns `Ok`.
    pub fn inbox_tx<T>(
        &self,
        inbox: &txbox::Inbox,
        id: EventId,
        ok: bool,
    ) -> txbox::Result<txbox::Handled<T>>
    where
        T: Default,
    {
        self.in_tx(|tx| inbox.handle_in(tx, id, handler(ok)), |r| r.is_ok())
    }

    /// Runs `body` in a business transaction of this backend, as an application
    /// would, and commits it when `commit` says so about the result (else rolls back).
    pub fn in_tx<R>(
        &self,
        body: impl FnOnce(&mut dyn txbox::Transaction) -> R,
        commit: impl FnOnce(&R) -> bool,
    ) -> R {
        match self.backend {
            Backend::Postgres => {
                let mut c = super::client().unwrap();
                let mut tx = c.transaction().unwrap();
                let r = body(&mut tx);
                if commit(&r) {
                    tx.commit().unwrap()
                } else {
                    tx.rollback().unwrap()
                }
                r
            }
            #[cfg(feature = "mysql")]
            Backend::MySql => {
                let pool = mysql::Pool::new(mysql_url().as_str()).unwrap();
                let mut c = pool.get_conn().unwrap();
                let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
                let r = body(&mut tx);
                if commit(&r) {
                    tx.commit().unwrap()
                } else {
                    tx.rollback().unwrap()
                }
                r
            }
            #[cfg(feature = "sqlite")]
            Backend::Sqlite => {
                let mut c = txbox::SqliteStore::connection(&self.sqlite_path).unwrap();
                let mut tx = c
                    .transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)
                    .unwrap();
                let r = body(&mut tx);
                if commit(&r) {
                    tx.commit().unwrap()
                } else {
                    tx.rollback().unwrap()
                }
                r
            }
            #[cfg(feature = "oracle")]
            Backend::Oracle => {
                let mut c = oracle_connection();
                let r = body(&mut c);
                if commit(&r) {
                    c.commit().unwrap()
                } else {
                    c.rollback().unwrap()
                }
                r
            }
        }
    }

    /// Outbox rows per status, through the store's own status query.
    pub fn counts(&self, event_type: &str) -> txbox::TypeStatus {
        self.store
            .status()
            .unwrap()
            .into_iter()
            .find(|s| s.event_type == event_type)
            .unwrap_or_default()
    }
}

fn handler<Tx: ?Sized, T: Default>(ok: bool) -> impl FnOnce(&mut Tx) -> txbox::Result<T> {
    move |_| {
        if ok {
            Ok(T::default())
        } else {
            Err(txbox::Error::InvalidInput("handler failed".into()))
        }
    }
}

/// The SQLite database file of `prefix`'s tables.
fn sqlite_path(prefix: &str) -> std::path::PathBuf {
    std::env::temp_dir().join(format!("txbox-test-{prefix}.db"))
}

fn open_store(backend: Backend, prefix: &str, sqlite_path: &std::path::Path) -> Arc<dyn FullStore> {
    open_store_with(backend, &super::prefix_config(prefix), sqlite_path)
}

fn open_store_with(
    backend: Backend,
    cfg: &Config,
    sqlite_path: &std::path::Path,
) -> Arc<dyn FullStore> {
    let _ = sqlite_path;
    match backend {
        Backend::Postgres => Arc::new(txbox::PgStore::connect(&super::pg_url(), cfg).unwrap()),
        #[cfg(feature = "mysql")]
        Backend::MySql => Arc::new(txbox::MySqlStore::connect(&mysql_url(), cfg).unwrap()),
        #[cfg(feature = "sqlite")]
        Backend::Sqlite => {
            Arc::new(txbox::SqliteStore::connect(&sqlite_path.to_string_lossy(), cfg).unwrap())
        }
        #[cfg(feature = "oracle")]
        Backend::Oracle => {
            Arc::new(txbox::OracleStore::connect(&oracle_url().unwrap_or_default(), cfg).unwrap())
        }
    }
}
