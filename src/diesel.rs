//! Publish and consume inside a Diesel transaction (feature `diesel`, with
//! `postgres`, `mysql` or `sqlite` for the backends): the event rows, the
//! inbox's ids and the service's own Diesel queries commit together.
//!
//! [`transaction`] wraps Diesel's `Connection::transaction` and hands the
//! closure a [`Tx`]: the connection for the service's own queries
//! ([`Tx::conn`]) and a [`Transaction`](crate::Transaction) that
//! [`Outbox::publish`](crate::Outbox::publish) and
//! [`Inbox::handle_in`](crate::Inbox::handle_in) write into. A `Tx`
//! exists only inside a transaction, so publishing outside one does not
//! compile:
//!
//! ```compile_fail,E0277
//! # fn f(outbox: &txbox::Outbox, conn: &mut diesel::PgConnection) -> txbox::Result<()> {
//! outbox.publish(conn, "order-created", &1)?; // a plain connection is no Transaction
//! # Ok(()) }
//! ```
//!
//! ```no_run
//! # #[cfg(feature = "postgres")]
//! # fn main() -> txbox::Result<()> {
//! use diesel::prelude::*;
//! let config = txbox::Config::builder().event("order-placed", |e| e).build()?;
//! let outbox = txbox::Outbox::new(&config)?;
//! let mut conn = PgConnection::establish("postgres://postgres@127.0.0.1/test")?;
//! txbox::diesel::transaction(&mut conn, |tx| {
//!     diesel::sql_query("INSERT INTO orders (total) VALUES (42)").execute(tx.conn())?;
//!     outbox.publish(tx, "order-placed", &serde_json::json!({ "total": 42 }))?;
//!     Ok::<_, txbox::Error>(())
//! })?;
//! # Ok(()) }
//! # #[cfg(not(feature = "postgres"))]
//! # fn main() {}
//! ```
//!
//! A nested [`Tx::transaction`] is a savepoint: rolled back, it drops the
//! events published inside it and keeps the outer ones. Pooled connections
//! (`diesel::r2d2`) work the same way through `&mut *pooled` (the pooled
//! connection itself is refused at compile time). The relay keeps its own
//! pool ([`PgStore`](crate::PgStore) and the others); on PostgreSQL a Diesel
//! commit wakes it as any other does (the wake-up is a trigger).
//!
//! Two things Diesel leaves to the caller:
//! - **SQLite:** set a busy timeout on the connection (`PRAGMA busy_timeout =
//!   5000`), as txbox's own store does: a relay writes the same file, and
//!   without one a publish that meets its write fails at once with
//!   "database is locked" (a retryable [`Error::Database`]).
//! - A connection already inside a transaction (Diesel's
//!   `begin_test_transaction`, a panic caught while one was open) makes
//!   [`transaction`] a savepoint: nothing commits until the outer one does,
//!   so the relay sees nothing before.

use diesel::connection::{Connection, SimpleConnection};
use diesel::query_builder::BoxedSqlQuery;
use diesel::RunQueryDsl;

use crate::error::{DatabaseErrorKind, Error, Result};
use crate::store::sql::{self, Row, Val};

/// A Diesel connection inside a transaction that txbox writes into: made by
/// [`transaction`] (or [`Tx::transaction`], a savepoint) and only there.
pub struct Tx<'c, C> {
    conn: &'c mut C,
}

/// Runs `f` in a Diesel transaction on `conn` (`Connection::transaction`):
/// committed when `f` returns `Ok`, rolled back on `Err`, with the events
/// published and the inbox ids recorded in it. `E` is any error a Diesel
/// error converts into; [`txbox::Error`](crate::Error) does. `conn` is a
/// `PgConnection`, `MysqlConnection` or `SqliteConnection` ([`Backend`]).
pub fn transaction<C, T, E, F>(conn: &mut C, f: F) -> std::result::Result<T, E>
where
    C: Backend,
    E: From<diesel::result::Error>,
    F: FnOnce(&mut Tx<'_, C>) -> std::result::Result<T, E>,
{
    conn.transaction(|conn| f(&mut Tx { conn }))
}

/// A Diesel connection txbox publishes on: `PgConnection`,
/// `MysqlConnection`, `SqliteConnection` (by the features `postgres`,
/// `mysql`, `sqlite`). Sealed.
pub trait Backend: Connection + sealed::Sealed {}

mod sealed {
    pub trait Sealed {}
}

#[cfg(feature = "postgres")]
impl sealed::Sealed for diesel::PgConnection {}
#[cfg(feature = "postgres")]
impl Backend for diesel::PgConnection {}
#[cfg(feature = "mysql")]
impl sealed::Sealed for diesel::MysqlConnection {}
#[cfg(feature = "mysql")]
impl Backend for diesel::MysqlConnection {}
#[cfg(feature = "sqlite")]
impl sealed::Sealed for diesel::SqliteConnection {}
#[cfg(feature = "sqlite")]
impl Backend for diesel::SqliteConnection {}

impl<C: Backend> Tx<'_, C> {
    /// The connection, for the service's own Diesel queries in this
    /// transaction.
    pub fn conn(&mut self) -> &mut C {
        self.conn
    }

    /// A nested transaction (a savepoint): rolled back on `Err`, with the
    /// events published inside it, while the outer transaction goes on.
    pub fn transaction<T, E, F>(&mut self, f: F) -> std::result::Result<T, E>
    where
        E: From<diesel::result::Error>,
        F: FnOnce(&mut Tx<'_, C>) -> std::result::Result<T, E>,
    {
        self.conn.transaction(|conn| f(&mut Tx { conn }))
    }
}

/// A Diesel error as txbox's, of the kind the native drivers give: a unique
/// violation; retryable for a lost serialization, a deadlock, a lock wait
/// that timed out and SQLite's "database is locked" (Diesel names the first
/// only: the others are read off the database's message).
impl From<diesel::result::Error> for Error {
    fn from(e: diesel::result::Error) -> Self {
        use diesel::result::DatabaseErrorKind as D;
        let kind = match &e {
            diesel::result::Error::DatabaseError(D::UniqueViolation, _) => {
                DatabaseErrorKind::UniqueViolation
            }
            diesel::result::Error::DatabaseError(D::SerializationFailure, _) => {
                DatabaseErrorKind::Retryable
            }
            diesel::result::Error::DatabaseError(_, info) if transient(info.message()) => {
                DatabaseErrorKind::Retryable
            }
            _ => DatabaseErrorKind::Other,
        };
        Error::database(kind, e)
    }
}

/// Whether a database's error message says the same call may succeed when
/// tried again (PostgreSQL 40P01 and 55P03, MySQL 1205 and 1213, SQLite
/// BUSY).
fn transient(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    [
        "deadlock",
        "could not obtain lock",
        "lock wait timeout",
        "database is locked",
        "database table is locked",
    ]
    .iter()
    .any(|t| m.contains(t))
}

/// A connection that could not be established.
impl From<diesel::result::ConnectionError> for Error {
    fn from(e: diesel::result::ConnectionError) -> Self {
        Error::database(DatabaseErrorKind::Other, e)
    }
}

/// How one backend binds txbox's values, as its own driver does.
trait Binds: diesel::backend::Backend + Sized {
    /// `query` with `v` bound next.
    fn bind<'f>(
        query: BoxedSqlQuery<'f, Self, diesel::query_builder::SqlQuery>,
        v: &Val,
    ) -> BoxedSqlQuery<'f, Self, diesel::query_builder::SqlQuery>;
}

/// The values every backend binds alike (NULL, numbers, text, bytes); `id`
/// binds an id the backend's way.
macro_rules! binds {
    ($backend:ty, |$q:ident, $u:ident| $id:expr) => {
        impl Binds for $backend {
            fn bind<'f>(
                $q: BoxedSqlQuery<'f, Self, diesel::query_builder::SqlQuery>,
                v: &Val,
            ) -> BoxedSqlQuery<'f, Self, diesel::query_builder::SqlQuery> {
                use diesel::sql_types::{BigInt, Binary, Double, Nullable, Text};
                match v {
                    Val::Null => $q.bind::<Nullable<Text>, Option<String>>(None),
                    Val::Int(n) => $q.bind::<BigInt, _>(*n),
                    Val::Float(f) => $q.bind::<Double, _>(*f),
                    Val::Text(s) => $q.bind::<Text, _>(s.clone()),
                    Val::Bytes(b) => $q.bind::<Binary, _>(b.clone()),
                    Val::Id($u) => $id,
                }
            }
        }
    };
}

#[cfg(feature = "postgres")]
binds!(diesel::pg::Pg, |q, u| q
    .bind::<diesel::sql_types::Uuid, _>(*u));
#[cfg(feature = "mysql")]
binds!(diesel::mysql::Mysql, |q, u| q
    .bind::<diesel::sql_types::Binary, _>(u.as_bytes().to_vec()));
#[cfg(feature = "sqlite")]
binds!(diesel::sqlite::Sqlite, |q, u| q
    .bind::<diesel::sql_types::Text, _>(u.hyphenated().to_string()));

/// The one query txbox runs on a Diesel connection: the ids of an inbox
/// statement (MySQL/MariaDB's look-up of the ids recorded before the
/// per-consumer key).
#[derive(diesel::QueryableByName)]
struct IdRow {
    #[diesel(sql_type = diesel::sql_types::Binary)]
    event_id: Vec<u8>,
}

/// `sql` with `params` bound in order, for `C`'s backend.
fn bound<'f, C>(
    sql: &str,
    params: &[Val],
) -> BoxedSqlQuery<'f, C::Backend, diesel::query_builder::SqlQuery>
where
    C: Connection,
    C::Backend: Binds,
{
    params.iter().fold(
        diesel::sql_query(sql.to_owned()).into_boxed::<C::Backend>(),
        |q, v| <C::Backend as Binds>::bind(q, v),
    )
}

/// txbox's statements on a Diesel connection: what `publish` and the inbox run.
macro_rules! diesel_conn {
    ($conn:ty) => {
        impl sql::Conn for Tx<'_, $conn> {
            fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
                let rows: Vec<IdRow> = bound::<$conn>(sql, params).load(self.conn)?;
                Ok(rows
                    .into_iter()
                    .map(|r| Row(vec![Val::Bytes(r.event_id)]))
                    .collect())
            }
            fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
                Ok(bound::<$conn>(sql, params).execute(self.conn)? as u64)
            }
            fn batch(&mut self, sql: &str) -> Result<()> {
                Ok(self.conn.batch_execute(sql)?)
            }
        }
    };
}

#[cfg(feature = "postgres")]
mod pg {
    use super::*;
    use crate::event::{EventId, NewEvent};
    use crate::store::PgDialect;
    use crate::tables::Tables;
    diesel_conn!(diesel::PgConnection);
    sql::transaction_impls!(Tx<'_, diesel::PgConnection>, PgDialect);
}

#[cfg(feature = "mysql")]
mod my {
    use super::*;
    use crate::event::{EventId, NewEvent};
    use crate::store::MySqlDialect;
    use crate::tables::Tables;
    diesel_conn!(diesel::MysqlConnection);
    sql::transaction_impls!(Tx<'_, diesel::MysqlConnection>, MySqlDialect);
}

#[cfg(feature = "sqlite")]
mod lite {
    use super::*;
    use crate::event::{EventId, NewEvent};
    use crate::store::SqliteDialect;
    use crate::tables::Tables;
    diesel_conn!(diesel::SqliteConnection);
    sql::transaction_impls!(Tx<'_, diesel::SqliteConnection>, SqliteDialect);
}
