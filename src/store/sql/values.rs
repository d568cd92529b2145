//! Values, rows, connections and pools: what the drivers adapt to.

#![allow(clippy::wildcard_imports)]
use super::*;

/// A parameter or column value.
#[derive(Debug, Clone, PartialEq)]
pub enum Val {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    Id(Uuid),
    Bytes(Vec<u8>),
}

impl From<&str> for Val {
    fn from(s: &str) -> Self {
        Val::Text(s.to_string())
    }
}

impl From<Option<&str>> for Val {
    fn from(s: Option<&str>) -> Self {
        s.map_or(Val::Null, Val::from)
    }
}

/// One result row.
#[derive(Debug, Clone)]
pub struct Row(pub(crate) Vec<Val>);

impl Row {
    pub(crate) fn get(&self, i: usize) -> &Val {
        self.0.get(i).unwrap_or(&Val::Null)
    }

    pub(crate) fn id(&self, i: usize) -> Result<EventId> {
        match self.get(i) {
            Val::Id(u) => Ok(EventId::from_uuid(*u)),
            Val::Bytes(b) if b.len() == 16 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(b);
                Ok(EventId::from_uuid(Uuid::from_bytes(a)))
            }
            Val::Text(s) => Ok(s.parse()?),
            Val::Bytes(b) => Ok(String::from_utf8_lossy(b).parse()?),
            other => Err(Error::database(
                crate::error::DatabaseErrorKind::Other,
                format!("expected an id in column {i}, got {other:?}"),
            )),
        }
    }

    pub(crate) fn opt_text(&self, i: usize) -> Option<String> {
        match self.get(i) {
            Val::Null => None,
            Val::Text(s) => Some(s.clone()),
            Val::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Val::Int(n) => Some(n.to_string()),
            Val::Float(f) => Some(f.to_string()),
            Val::Id(u) => Some(u.to_string()),
        }
    }

    pub(crate) fn text(&self, i: usize) -> String {
        self.opt_text(i).unwrap_or_default()
    }

    /// Column `i` as text, moved out of the row when it is text (no copy).
    pub(crate) fn take_text(&mut self, i: usize) -> Option<String> {
        match self.0.get_mut(i) {
            Some(Val::Text(s)) => Some(std::mem::take(s)),
            _ => self.opt_text(i),
        }
    }

    /// Column `i` as bytes, moved out of the row (text as its UTF-8).
    pub(crate) fn take_bytes(&mut self, i: usize) -> Option<Vec<u8>> {
        match self.0.get_mut(i) {
            Some(Val::Bytes(b)) => Some(std::mem::take(b)),
            Some(Val::Text(s)) => Some(std::mem::take(s).into_bytes()),
            _ => self.opt_text(i).map(String::into_bytes),
        }
    }

    /// Binary column `i`, moved out of the row. Read as text (PostgreSQL's
    /// scripts return every value as text) a `bytea` is `\x` and its hex digits.
    pub(crate) fn take_blob(&mut self, i: usize) -> Result<Option<Vec<u8>>> {
        if let Some(Val::Text(s)) = self.0.get(i) {
            if let Some(hex) = s.strip_prefix("\\x") {
                let byte = |k: usize| u8::from_str_radix(hex.get(2 * k..2 * k + 2)?, 16).ok();
                return match (0..hex.len() / 2).map(byte).collect::<Option<Vec<u8>>>() {
                    Some(b) if hex.len() % 2 == 0 => Ok(Some(b)),
                    _ => Err(Error::database(
                        crate::error::DatabaseErrorKind::Other,
                        format!("column {i}: not a bytea in hex format"),
                    )),
                };
            }
        }
        Ok(self.take_bytes(i))
    }

    pub(crate) fn int(&self, i: usize) -> i64 {
        match self.get(i) {
            Val::Int(n) => *n,
            Val::Float(f) => *f as i64,
            Val::Text(s) => {
                let s = s.trim();
                // whole numbers as such; "3.0" and the like through a float
                s.parse::<i64>()
                    .or_else(|_| s.parse::<f64>().map(|f| f as i64))
                    .unwrap_or(0)
            }
            Val::Bytes(b) => String::from_utf8_lossy(b)
                .trim()
                .parse::<f64>()
                .map(|f| f as i64)
                .unwrap_or(0),
            _ => 0,
        }
    }

    pub(crate) fn opt_float(&self, i: usize) -> Option<f64> {
        match self.get(i) {
            Val::Null => None,
            Val::Int(n) => Some(*n as f64),
            Val::Float(f) => Some(*f),
            Val::Text(s) => s.trim().parse().ok(),
            Val::Bytes(b) => String::from_utf8_lossy(b).trim().parse().ok(),
            Val::Id(_) => None,
        }
    }
}

/// One database connection of a driver.
pub trait Conn {
    /// Runs a query with parameters (already in the driver's placeholder style).
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>>;
    /// Runs a statement with parameters; returns the affected row count.
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64>;
    /// Runs statements without parameters (transaction control, DDL).
    fn batch(&mut self, sql: &str) -> Result<()>;
    /// Runs statements without parameters in one round trip (values written into
    /// the SQL as literals); returns every row they returned, as text, and each
    /// statement's affected-row count. Only drivers whose dialect holds claims have
    /// it.
    fn script(&mut self, sql: &str) -> Result<Script> {
        let _ = sql;
        Err(Error::InvalidInput(
            "this driver cannot run a statement script".into(),
        ))
    }
    /// Like `query`, fetching at most `max` rows: Oracle limits a `FOR UPDATE SKIP
    /// LOCKED` select by what it fetches (its rows are locked as they are fetched).
    fn query_max(&mut self, sql: &str, params: &[Val], max: usize) -> Result<Vec<Row>> {
        let mut rows = self.query(sql, params)?;
        rows.truncate(max);
        Ok(rows)
    }
}

/// What [`Conn::script`] returns.
#[derive(Debug, Default)]
pub struct Script {
    /// The rows of every statement, in order, each value as text (or null).
    pub rows: Vec<Row>,
    /// The affected-row count of each statement, in order.
    pub counts: Vec<u64>,
}

/// Implements [`Conn`] for driver types (a client and its transaction, say) whose
/// query, execute and batch (and optionally script) are the same functions.
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
macro_rules! conn_impls {
    ($query:path, $execute:path, $batch:path $(, $script:path)?;) => {};
    ($query:path, $execute:path, $batch:path $(, $script:path)?; $t:ty $(, $rest:ty)* $(,)?) => {
        impl sql::Conn for $t {
            fn query(&mut self, sql: &str, params: &[sql::Val]) -> Result<Vec<sql::Row>> {
                $query(self, sql, params)
            }
            fn execute(&mut self, sql: &str, params: &[sql::Val]) -> Result<u64> {
                $execute(self, sql, params)
            }
            fn batch(&mut self, sql: &str) -> Result<()> {
                $batch(self, sql)
            }
            $(fn script(&mut self, sql: &str) -> Result<sql::Script> {
                $script(self, sql)
            })?
        }
        sql::conn_impls!($query, $execute, $batch $(, $script)?; $($rest),*);
    };
}
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "postgres"))]
pub(crate) use conn_impls;
/// A pooled or locked connection, used through the connection it dereferences to.
#[cfg(any(feature = "sqlite", feature = "postgres"))]
pub(crate) struct Held<T>(pub(crate) T);

#[cfg(any(feature = "sqlite", feature = "postgres"))]
impl<T> Conn for Held<T>
where
    T: std::ops::DerefMut,
    T::Target: Conn,
{
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
        self.0.query(sql, params)
    }
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        self.0.execute(sql, params)
    }
    fn batch(&mut self, sql: &str) -> Result<()> {
        self.0.batch(sql)
    }
    fn script(&mut self, sql: &str) -> Result<Script> {
        self.0.script(sql)
    }
    fn query_max(&mut self, sql: &str, params: &[Val], max: usize) -> Result<Vec<Row>> {
        self.0.query_max(sql, params, max)
    }
}

/// Hands out connections: the driver side of a [`Dialect`]. Public in this
/// private module only, so that no type outside txbox can implement it.
pub trait Backend: Send + Sync + 'static {
    /// The dialect's name: its statements are built once per table prefix
    /// under it.
    const NAME: &'static str;
    /// The dialect's statements for `tables`.
    fn catalog(tables: &Tables) -> Catalog;
    /// The statements for `tables`, built once per prefix.
    fn cached(tables: &Tables) -> std::sync::Arc<Catalog>
    where
        Self: Sized,
    {
        cached(Self::NAME, tables, Self::catalog)
    }
    fn get(&self) -> Result<Box<dyn Conn + '_>>;
    /// A connection that may outlive the call (a held claim keeps one). Pools of
    /// dialects with [`Catalog::hold_claim`] implement it.
    fn get_owned(&self) -> Result<Box<dyn Conn + Send>> {
        Err(Error::InvalidInput(
            "this store cannot hand out a connection of its own".into(),
        ))
    }
    /// Whether [`Backend::listen`] works.
    const NOTIFIES: bool = false;
    /// Commit notifications on `channel` (the outbox table's name), on a
    /// connection of their own.
    fn listen(&self, channel: &str) -> Result<Box<dyn crate::store::Notifications>> {
        let _ = channel;
        Err(Error::Unsupported {
            what: "commit notifications".into(),
            why: "only PostgreSQL has them; wake the relay with a RelayWaker".into(),
        })
    }
    /// The most connections the pool opens, when it has a bound.
    fn max_size(&self) -> Option<usize> {
        None
    }
}

/// How a driver writes placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// `$1` (PostgreSQL)
    Dollar,
    /// `?`, in order of appearance (MySQL)
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Question,
    /// `?1` (SQLite)
    QuestionNumbered,
    /// `:1`, `:2`, ... in order of appearance (Oracle)
    #[cfg_attr(not(feature = "oracle"), allow(dead_code))]
    Colon,
}

/// A SQL dialect [`SqlStore`] runs on: [`PgDialect`](crate::PgDialect),
/// [`MySqlDialect`](crate::MySqlDialect), [`SqliteDialect`](crate::SqliteDialect)
/// or [`OracleDialect`](crate::OracleDialect), each the driver's connection pool
/// and its SQL. Sealed: txbox implements it for these four only.
pub trait Dialect: Backend {}
