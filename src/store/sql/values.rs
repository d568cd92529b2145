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

/// A column's value read as a Rust type by [`Row::get`]: `None` when the value
/// is not one (never a default in its place). `Option<T>` reads NULL as `None`;
/// every other type refuses it.
pub(crate) trait FromVal: Sized {
    /// What the type is called in an error ("a whole number").
    const EXPECTED: &'static str;
    /// The value as this type, or `None`.
    fn from_val(v: &Val) -> Option<Self>;
}

impl FromVal for String {
    const EXPECTED: &'static str = "text";
    fn from_val(v: &Val) -> Option<Self> {
        match v {
            Val::Null => None,
            Val::Text(s) => Some(s.clone()),
            Val::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Val::Int(n) => Some(n.to_string()),
            Val::Float(f) => Some(f.to_string()),
            Val::Id(u) => Some(u.to_string()),
        }
    }
}

impl FromVal for i64 {
    const EXPECTED: &'static str = "a whole number";
    fn from_val(v: &Val) -> Option<Self> {
        #[allow(clippy::cast_possible_truncation)]
        let whole = |f: f64| (f.is_finite() && f.fract() == 0.0).then_some(f as i64);
        // whole numbers as such; "3.0" and the like through a float
        let parsed = |s: &str| {
            let s = s.trim();
            s.parse::<i64>()
                .ok()
                .or_else(|| s.parse::<f64>().ok().and_then(whole))
        };
        match v {
            Val::Int(n) => Some(*n),
            Val::Float(f) => whole(*f),
            Val::Text(s) => parsed(s),
            Val::Bytes(b) => std::str::from_utf8(b).ok().and_then(parsed),
            Val::Null | Val::Id(_) => None,
        }
    }
}

/// A count: a whole number from 0 up.
impl FromVal for u64 {
    const EXPECTED: &'static str = "a count";
    fn from_val(v: &Val) -> Option<Self> {
        i64::from_val(v).and_then(|n| u64::try_from(n).ok())
    }
}

/// A count of attempts: a whole number from 0 up that fits a `u32`.
impl FromVal for u32 {
    const EXPECTED: &'static str = "a count of attempts";
    fn from_val(v: &Val) -> Option<Self> {
        i64::from_val(v).and_then(|n| u32::try_from(n).ok())
    }
}

impl FromVal for f64 {
    const EXPECTED: &'static str = "a number";
    fn from_val(v: &Val) -> Option<Self> {
        match v {
            #[allow(clippy::cast_precision_loss)]
            Val::Int(n) => Some(*n as f64),
            Val::Float(f) => Some(*f),
            Val::Text(s) => s.trim().parse().ok(),
            Val::Bytes(b) => std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.trim().parse().ok()),
            Val::Null | Val::Id(_) => None,
        }
    }
}

impl FromVal for EventId {
    const EXPECTED: &'static str = "an event id";
    fn from_val(v: &Val) -> Option<Self> {
        match v {
            Val::Id(u) => Some(EventId::from_uuid(*u)),
            Val::Bytes(b) if b.len() == 16 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(b);
                Some(EventId::from_uuid(Uuid::from_bytes(a)))
            }
            Val::Text(s) => s.parse().ok(),
            Val::Bytes(b) => String::from_utf8_lossy(b).parse().ok(),
            Val::Null | Val::Int(_) | Val::Float(_) => None,
        }
    }
}

impl<T: FromVal> FromVal for Option<T> {
    const EXPECTED: &'static str = T::EXPECTED;
    fn from_val(v: &Val) -> Option<Self> {
        match v {
            Val::Null => Some(None),
            v => T::from_val(v).map(Some),
        }
    }
}

impl Row {
    /// Column `i` (NULL past the row's end).
    pub(crate) fn val(&self, i: usize) -> &Val {
        self.0.get(i).unwrap_or(&Val::Null)
    }

    /// Column `i` as a `T`: an error naming the column, what it expected and
    /// what it found when the value is not one.
    pub(crate) fn get<T: FromVal>(&self, i: usize) -> Result<T> {
        let v = self.val(i);
        T::from_val(v).ok_or_else(|| unexpected(i, T::EXPECTED, v))
    }

    /// Column `i` as text, moved out of the row when it is text (no copy).
    pub(crate) fn take_text(&mut self, i: usize) -> Result<Option<String>> {
        match self.0.get_mut(i) {
            Some(Val::Text(s)) => Ok(Some(std::mem::take(s))),
            _ => self.get(i),
        }
    }

    /// Column `i` as bytes, moved out of the row (text as its UTF-8).
    pub(crate) fn take_bytes(&mut self, i: usize) -> Result<Option<Vec<u8>>> {
        match self.0.get_mut(i) {
            Some(Val::Bytes(b)) => Ok(Some(std::mem::take(b))),
            Some(Val::Text(s)) => Ok(Some(std::mem::take(s).into_bytes())),
            _ => Ok(self.get::<Option<String>>(i)?.map(String::into_bytes)),
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
                    _ => Err(unexpected(
                        i,
                        "a bytea in hex format",
                        &Val::Text(s.chars().take(40).collect::<String>() + "..."),
                    )),
                };
            }
        }
        self.take_bytes(i)
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
    /// Like `query`, fetching at most `max` rows: Oracle limits a `FOR UPDATE SKIP
    /// LOCKED` select by what it fetches (its rows are locked as they are fetched).
    fn query_max(&mut self, sql: &str, params: &[Val], max: usize) -> Result<Vec<Row>> {
        let mut rows = self.query(sql, params)?;
        rows.truncate(max);
        Ok(rows)
    }
}

/// A connection that also runs scripts: what a held claim keeps
/// ([`Sessions::get_owned`]).
pub trait ScriptConn: Conn {
    /// Runs statements without parameters in one round trip (values written into
    /// the SQL as literals); returns every row they returned, as text, and each
    /// statement's affected-row count.
    fn script(&mut self, sql: &str) -> Result<Script>;
}

/// What [`ScriptConn::script`] returns.
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
        }
        $(impl sql::ScriptConn for $t {
            fn script(&mut self, sql: &str) -> Result<sql::Script> {
                $script(self, sql)
            }
        })?
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
    fn query_max(&mut self, sql: &str, params: &[Val], max: usize) -> Result<Vec<Row>> {
        self.0.query_max(sql, params, max)
    }
}

#[cfg(feature = "postgres")]
impl<T> ScriptConn for Held<T>
where
    T: std::ops::DerefMut,
    T::Target: ScriptConn,
{
    fn script(&mut self, sql: &str) -> Result<Script> {
        self.0.script(sql)
    }
}

/// Hands out connections: the driver side of a [`Dialect`]. Public in this
/// private module only, so that no type outside txbox can implement it.
pub trait Driver: Send + Sync + 'static {
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
    /// What only some drivers can do (connections of their own that run
    /// scripts, commit notifications); `None`, the default: nothing of it.
    /// It is `Some` exactly where the dialect's statements have
    /// [`Catalog::hold_claim`] and [`Catalog::wake`], from which
    /// [`SqlStore::capabilities`](crate::store::SqlStore::capabilities) is
    /// read: the conformance suite asserts on every dialect that a store does
    /// what its capabilities say.
    fn sessions(&self) -> Option<&dyn Sessions> {
        None
    }
    /// The most connections the pool opens, when it has a bound.
    fn max_size(&self) -> Option<usize> {
        None
    }
}

/// The sessions of a driver that keeps connections of its own: a held
/// claim's open transaction and the listener's `LISTEN` (PostgreSQL).
pub trait Sessions {
    /// A connection that may outlive the call (a held claim keeps one).
    fn get_owned(&self) -> Result<Box<dyn ScriptConn + Send>>;
    /// Commit notifications on `channel` (the outbox table's name), on a
    /// connection of their own.
    fn listen(&self, channel: &str) -> Result<Box<dyn crate::store::Notifications>>;
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
pub trait Dialect: Driver {}

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
        assert_eq!(r.get::<i64>(0).unwrap(), 3);
        assert_eq!(r.get::<i64>(1).unwrap(), 4);
        assert_eq!(r.get::<i64>(5).unwrap(), -7);
        assert_eq!(r.get::<Option<i64>>(3).unwrap(), None);
        for (i, found) in [(2, "Text(\"x\")"), (3, "Null"), (4, "Float(2.5)")] {
            let e = r.get::<i64>(i).unwrap_err().to_string();
            assert!(
                e.contains(&format!("column {i}")) && e.contains(found),
                "{e}"
            );
        }
        assert!(r.get::<u64>(5).unwrap_err().to_string().contains("a count"));
        assert!(r.get::<Option<f64>>(2).is_err());
        assert!(r.get::<String>(3).is_err());
        assert!(r.get::<String>(7).is_err(), "a column past the row's end");

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
        let bad_id = Row(vec![Val::Text("not-an-id".into())])
            .get::<crate::event::EventId>(0)
            .unwrap_err();
        assert!(bad_id.to_string().contains("column 0"), "{bad_id}");
    }
}
