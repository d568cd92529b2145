//! The prepared publish on PostgreSQL (feature `postgres`): [`PgPrepared`].

use postgres::types::{ToSql, Type};
use postgres::GenericClient;

use crate::error::{Error, Result};
use crate::event::{EventId, NewEvent};
use crate::store::postgres::{typed, PgDialect};
use crate::store::sql;
use crate::tables::Tables;

/// The outbox's one-event `INSERT`, prepared once on one connection, for a service
/// that keeps its connection (a worker thread's own `postgres::Client`): each event
/// then costs the database no parsing or planning. It is not a second publisher:
/// [`PgPrepared::on`] wraps a transaction of that connection, and
/// [`Outbox::publish`](crate::Outbox::publish) and
/// [`Outbox::publish_all`](crate::Outbox::publish_all) write through the wrapper
/// as through the transaction itself. For a connection from an r2d2 pool,
/// [`Outbox::prepare_pg_pooled`](crate::Outbox::prepare_pg_pooled) keeps the
/// statement with the pooled connection.
///
/// It works only with transactions of the client it was prepared on, and only
/// while that session lasts. Used on another connection (or after a pooler reset
/// the session), the database refuses the statement: the error says so, and the
/// transaction is aborted, so roll it back.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let config = txbox::Config::builder().event("order-created", |e| e).build()?;
/// let outbox = txbox::Outbox::new(&config)?;
/// let mut client = postgres::Client::connect("postgres://postgres@127.0.0.1/test", postgres::NoTls)?;
/// let prepared = outbox.prepare_pg(&mut client)?;
/// for order in 0..3 {
///     let mut tx = client.transaction()?;
///     tx.execute("INSERT INTO orders (id) VALUES ($1)", &[&order])?;
///     let event = serde_json::json!({ "id": order });
///     outbox.publish(&mut prepared.on(&mut tx), "order-created", &event)?;
///     tx.commit()?;
/// }
/// # Ok(())
/// # }
/// ```
pub struct PgPrepared {
    /// The outbox table the statement writes to.
    table: String,
    insert: Kept,
}

/// A prepared one-event `INSERT`, and whether its connection turned out not to know
/// it (then a pooled connection prepares it again).
#[derive(Clone)]
struct Kept {
    statement: postgres::Statement,
    unknown: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Kept {
    fn new(statement: postgres::Statement) -> Self {
        Kept {
            statement,
            unknown: Default::default(),
        }
    }
}

impl std::fmt::Debug for PgPrepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PgPrepared")
            .field("table", &self.table)
            .finish_non_exhaustive()
    }
}

/// The statements [`crate::Outbox::prepare_pg_pooled`] prepared on one pooled
/// connection, by outbox table (r2d2 connection extension).
#[derive(Default)]
struct PreparedInserts(std::collections::HashMap<String, Kept>);

impl crate::Outbox {
    /// Prepares this outbox's one-event `INSERT` on `client` (one round trip):
    /// see [`PgPrepared`].
    pub fn prepare_pg(&self, client: &mut impl GenericClient) -> Result<PgPrepared> {
        let sql = self.insert_one()?;
        Ok(PgPrepared {
            table: self.tables().outbox.clone(),
            insert: Kept::new(client.prepare_typed(&sql, &INSERT_ONE_TYPES)?),
        })
    }

    /// [`Outbox::prepare_pg`](crate::Outbox::prepare_pg) for a connection from an
    /// r2d2 pool (such as [`PgStore::pool`](crate::PgStore::pool)): the statement is prepared on the
    /// connection's first use and kept with it in the pool, so later check-outs of
    /// the same connection find it without a round trip. Should the connection have
    /// lost it (`DISCARD ALL`), the publish that finds out fails and the next call
    /// prepares it again.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let config = txbox::Config::builder().event("order-created", |e| e).build()?;
    /// # let store = txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", &txbox::Config::builder().build()?)?;
    /// let outbox = txbox::Outbox::new(&config)?;
    /// let mut conn = store.pool().get()?;
    /// let prepared = outbox.prepare_pg_pooled(&mut conn)?;
    /// let mut tx = conn.transaction()?;
    /// outbox.publish(&mut prepared.on(&mut tx), "order-created", &serde_json::json!({ "id": 7 }))?;
    /// tx.commit()?;
    /// # Ok(())
    /// # }
    /// ```
    pub fn prepare_pg_pooled<M>(&self, conn: &mut r2d2::PooledConnection<M>) -> Result<PgPrepared>
    where
        M: r2d2::ManageConnection<Connection = postgres::Client>,
    {
        // by the outbox table: a check-out that finds it builds no SQL
        let table = self.tables().outbox.as_str();
        let kept = r2d2::PooledConnection::extensions(conn)
            .get::<PreparedInserts>()
            .and_then(|p| p.0.get(table))
            .filter(|k| !k.unknown.load(std::sync::atomic::Ordering::Relaxed))
            .cloned();
        let insert = match kept {
            Some(insert) => insert,
            None => {
                let insert = Kept::new(conn.prepare_typed(&self.insert_one()?, &INSERT_ONE_TYPES)?);
                let extensions = r2d2::PooledConnection::extensions_mut(conn);
                let mut prepared = extensions.remove::<PreparedInserts>().unwrap_or_default();
                prepared.0.insert(table.to_owned(), insert.clone());
                extensions.insert(prepared);
                insert
            }
        };
        Ok(PgPrepared {
            table: table.to_owned(),
            insert,
        })
    }

    /// The dialect's `INSERT` of one event into this outbox's table.
    fn insert_one(&self) -> Result<String> {
        let d = <PgDialect as sql::Driver>::cached(self.tables())?;
        // PostgreSQL's placeholders are the statement's own (`$n`)
        Ok(sql::insert_one(d, sql::Shape::default())
            .template()
            .to_owned())
    }
}

/// The parameter types of the one-event `INSERT`, as [`typed`] passes
/// [`sql::push_event_values`] without bytes: id, type, key, headers, payload.
const INSERT_ONE_TYPES: [Type; 5] = [Type::UUID, Type::TEXT, Type::TEXT, Type::TEXT, Type::TEXT];

impl PgPrepared {
    /// `tx`, a transaction of the client this statement was prepared on, with
    /// the statement: publish on it as on `tx`. Events of one call go through
    /// the prepared statement one at a time; several go as one statement.
    pub fn on<'p, 't, 'c>(
        &'p self,
        tx: &'t mut postgres::Transaction<'c>,
    ) -> PgPreparedTx<'p, 't, 'c> {
        PgPreparedTx { tx, prepared: self }
    }
}

/// A transaction with a [`PgPrepared`] statement ([`PgPrepared::on`]): a
/// [`Transaction`](crate::Transaction) that `publish` writes through.
pub struct PgPreparedTx<'p, 't, 'c> {
    tx: &'t mut postgres::Transaction<'c>,
    prepared: &'p PgPrepared,
}

impl crate::transaction::sealed::Sealed for PgPreparedTx<'_, '_, '_> {}

impl crate::transaction::Transaction for PgPreparedTx<'_, '_, '_> {
    fn insert_new_ids(
        &mut self,
        tables: &Tables,
        consumer: &str,
        ids: &[EventId],
    ) -> Result<Vec<EventId>> {
        self.tx.insert_new_ids(tables, consumer, ids)
    }

    fn insert_events(&mut self, tables: &Tables, events: &[NewEvent]) -> Result<()> {
        // several events go as one statement; another outbox's table has no
        // statement prepared here; the prepared one writes JSON payloads due
        // at once only
        let ([e], true, None, None) = (
            events,
            tables.outbox == self.prepared.table,
            events.first().and_then(NewEvent::content_type),
            events.first().and_then(NewEvent::delay),
        ) else {
            return self.tx.insert_events(tables, events);
        };
        let mut values = Vec::with_capacity(5);
        sql::push_event_values(e, sql::Shape::default(), &mut values);
        // the driver's error as it is (inside Ok), to tell a statement unknown here
        let executed = typed(&values, |p| {
            let params: Vec<&(dyn ToSql + Sync)> = p.iter().map(|(v, _)| *v).collect();
            Ok(self.tx.execute(&self.prepared.insert.statement, &params))
        })?;
        match executed {
            Ok(_) => Ok(()),
            Err(err)
                if err.code() == Some(&postgres::error::SqlState::INVALID_SQL_STATEMENT_NAME) =>
            {
                self.prepared
                    .insert
                    .unknown
                    .store(true, std::sync::atomic::Ordering::Relaxed);
                // the next transaction prepares it again: roll back, run again
                Err(Error::database(
                    crate::DatabaseErrorKind::Retryable,
                    format!(
                        "PgPrepared: this transaction's connection does not know the prepared \
                         statement (a transaction of another client, or a session that was \
                         reset); the transaction is aborted, roll it back: {}",
                        crate::error::PgError(err)
                    ),
                ))
            }
            Err(err) => Err(err.into()),
        }
    }
}
