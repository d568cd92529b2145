//! Values, rows, connections and pools: what the drivers adapt to.

use super::Catalog;
use crate::error::{Error, Result};
use crate::event::EventId;
use crate::store::Tables;
use uuid::Uuid;

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
            v @ Val::Text(s) => s.parse().map_err(|_| unexpected(i, "an event id", v)),
            v @ Val::Bytes(b) => String::from_utf8_lossy(b)
                .parse()
                .map_err(|_| unexpected(i, "an event id", v)),
            other => Err(unexpected(i, "an event id", other)),
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

    /// Column `i` as text, an error when it is NULL.
    pub(crate) fn text(&self, i: usize) -> Result<String> {
        self.opt_text(i).ok_or_else(|| missing(i))
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

    /// Column `i` as a whole number, an error when it is NULL or anything
    /// else (never read as 0).
    pub(crate) fn int(&self, i: usize) -> Result<i64> {
        self.opt_int(i)?.ok_or_else(|| missing(i))
    }

    /// Column `i` as a count: a whole number from 0 up.
    pub(crate) fn count(&self, i: usize) -> Result<u64> {
        let n = self.int(i)?;
        u64::try_from(n).map_err(|_| unexpected(i, "a count", &Val::Int(n)))
    }

    /// Column `i` as a whole number, `None` for NULL; an error for a value
    /// that is no whole number.
    pub(crate) fn opt_int(&self, i: usize) -> Result<Option<i64>> {
        let v = self.get(i);
        #[allow(clippy::cast_possible_truncation)]
        let whole = |f: f64| (f.is_finite() && f.fract() == 0.0).then_some(f as i64);
        // whole numbers as such; "3.0" and the like through a float
        let parsed = |s: &str| {
            let s = s.trim();
            s.parse::<i64>()
                .ok()
                .or_else(|| s.parse::<f64>().ok().and_then(whole))
        };
        let n = match v {
            Val::Null => return Ok(None),
            Val::Int(n) => Some(*n),
            Val::Float(f) => whole(*f),
            Val::Text(s) => parsed(s),
            Val::Bytes(b) => std::str::from_utf8(b).ok().and_then(parsed),
            Val::Id(_) => None,
        };
        n.map(Some)
            .ok_or_else(|| unexpected(i, "a whole number", v))
    }

    /// Column `i` as a number, `None` for NULL; an error for a value that is
    /// no number.
    pub(crate) fn opt_float(&self, i: usize) -> Result<Option<f64>> {
        let v = self.get(i);
        let f = match v {
            Val::Null => return Ok(None),
            #[allow(clippy::cast_precision_loss)]
            Val::Int(n) => Some(*n as f64),
            Val::Float(f) => Some(*f),
            Val::Text(s) => s.trim().parse().ok(),
            Val::Bytes(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.trim().parse().ok()),
            Val::Id(_) => None,
        };
        f.map(Some).ok_or_else(|| unexpected(i, "a number", v))
    }
}

/// A column whose value is not what txbox's statement expects there (a
/// schema changed by hand, a driver that maps a type another way): an error
/// naming the column and what it held, never a default read in its place.
pub(crate) fn unexpected(i: usize, expected: &str, found: &Val) -> Error {
    Error::database(
        crate::error::DatabaseErrorKind::Other,
        format!("column {i} of a row: expected {expected}, found {found:?}"),
    )
}

/// A column that is NULL where txbox's statement expects a value.
pub(crate) fn missing(i: usize) -> Error {
    unexpected(i, "a value", &Val::Null)
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
        Err(Error::Internal(
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
    /// Where the dialect's statements are kept with a [`Tables`]: `0` to
    /// `Shared::SLOTS - 1`, one per dialect.
    const SLOT: usize;
    /// The dialect's statements for `tables`.
    fn catalog(tables: &Tables) -> Catalog;
    /// The statements for `tables`, built the first time and kept with them.
    fn cached(tables: &Tables) -> Result<&std::sync::Arc<Catalog>>
    where
        Self: Sized,
    {
        tables
            .shared
            .get(Self::SLOT, || std::sync::Arc::new(Self::catalog(tables)))
    }
    fn get(&self) -> Result<Box<dyn Conn + '_>>;
    /// A connection that may outlive the call (a held claim keeps one). Pools of
    /// dialects with [`Catalog::hold_claim`] implement it.
    fn get_owned(&self) -> Result<Box<dyn Conn + Send>> {
        Err(Error::Internal(
            "this store cannot hand out a connection of its own".into(),
        ))
    }
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

/// A SQL dialect [`SqlStore`](crate::store::SqlStore) runs on: [`PgDialect`](crate::store::PgDialect),
/// [`MySqlDialect`](crate::store::MySqlDialect), [`SqliteDialect`](crate::store::SqliteDialect)
/// or [`OracleDialect`](crate::store::OracleDialect), each the driver's connection pool
/// and its SQL. Sealed: txbox implements it for these four only.
pub trait Dialect: Backend {}

#[cfg(test)]
mod tests {
    use super::{Row, Val};
    use crate::store::sql::{dead_letter, event_row};

    /// A value that is not what the statement expects is an error naming the
    /// column and what it held: never 0, an empty map, DEAD or a default id.
    #[test]
    fn rows_read_strictly() {
        let r = Row(vec![
            Val::Text("3".into()),
            Val::Float(4.0),
            Val::Text("x".into()),
            Val::Null,
            Val::Float(2.5),
            Val::Bytes(b"-7".to_vec()),
        ]);
        assert_eq!(r.int(0).unwrap(), 3);
        assert_eq!(r.int(1).unwrap(), 4);
        assert_eq!(r.int(5).unwrap(), -7);
        assert_eq!(r.opt_int(3).unwrap(), None);
        for (i, found) in [(2, "Text(\"x\")"), (3, "Null"), (4, "Float(2.5)")] {
            let e = r.int(i).unwrap_err().to_string();
            assert!(
                e.contains(&format!("column {i}")) && e.contains(found),
                "{e}"
            );
        }
        assert!(r.count(5).unwrap_err().to_string().contains("a count"));
        assert!(r.opt_float(2).is_err());
        assert!(r.text(3).is_err());
        assert!(r.text(7).is_err(), "a column past the row's end");

        let id = uuid::Uuid::now_v7();
        let event = |headers: Val, attempts: Val| {
            Row(vec![
                Val::Id(id),
                Val::Text("t".into()),
                Val::Null,
                headers,
                Val::Text("{}".into()),
                attempts,
                Val::Null,
                Val::Null,
            ])
        };
        assert!(event_row(&mut event(Val::Text("{}".into()), Val::Int(0))).is_ok());
        // a claimed event with unreadable headers is marked, for the relay to
        // fail it alone: an error would fail its whole batch at every claim
        let e = event_row(&mut event(Val::Text("not json".into()), Val::Int(0))).unwrap();
        let why = &e.headers[crate::store::HEADER_DEFECT];
        assert!(
            why.contains("no JSON object") && why.contains("not json"),
            "{why}"
        );
        assert_eq!(e.headers.len(), 1);
        let e = event_row(&mut event(Val::Text("{}".into()), Val::Int(-1)));
        assert!(e.unwrap_err().to_string().contains("attempts"));
        let dead = |status: &str| {
            let mut r = Row(vec![
                Val::Id(id),
                Val::Text("t".into()),
                Val::Null,
                Val::Text("{}".into()),
                Val::Text("{}".into()),
                Val::Int(1),
                Val::Null,
                Val::Text(status.into()),
                Val::Text("2026-12-01T00:00:00Z".into()),
                Val::Text("2026-12-01T00:00:00Z".into()),
                Val::Null,
                Val::Null,
            ]);
            dead_letter(&mut r)
        };
        assert!(dead("RETRY").is_ok());
        let e = dead("LOST").unwrap_err().to_string();
        assert!(e.contains("column 7") && e.contains("LOST"), "{e}");
        let bad_id = Row(vec![Val::Text("not-an-id".into())]).id(0).unwrap_err();
        assert!(bad_id.to_string().contains("column 0"), "{bad_id}");
    }
}
