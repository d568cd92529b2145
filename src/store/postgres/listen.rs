//! The PostgreSQL connection that listens for the relay: `LISTEN`, and the
//! advisory locks of the rationed wake-up on commit (`sql/postgres/006_*.sql`, `008_*.sql`).
//!
//! The lock queries run on a helper thread and are given up after
//! [`ANSWER_WITHIN`]: the driver has no deadline for a query, and a connection
//! that goes silent while one is in flight (a proxy that stops forwarding, its
//! kernel still acknowledging the data) would hold the listener for good, and
//! with it, through a hold it could not release, the type's notifications.
//! Given up, the connection is lost: the relay listens again and ends this
//! session (its hold with it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use r2d2_postgres::PostgresConnectionManager;

use super::{PgConnector, PgPool};
use crate::error::{Error, Result};

/// The database session that listens for this store's relay: its backend pid
/// and start time (together they name one session; a pid alone is reused).
pub(super) type ListenerSession = (i32, String);

const THIS_SESSION: &str =
    "SELECT pid, backend_start::text FROM pg_stat_activity WHERE pid = pg_backend_pid()";

/// Listens on `channel` on a connection of `pool`; `remembered` is the
/// session that listened last for this store.
pub(super) fn listen<T: PgConnector>(
    pool: &PgPool<T>,
    remembered: &Arc<Mutex<Option<ListenerSession>>>,
    channel: &str,
) -> Result<Box<dyn crate::store::Notifications>> {
    // not the pool's whole connection timeout: a stop waits for this call
    let mut conn = pool.get_timeout(Duration::from_secs(1))?;
    // a session that listened before and was given up (gone silent)
    // may still hold a type's notifications back: it is ended first
    let previous = remembered.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some((pid, start)) = previous {
        let ended = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE pid = $1 AND backend_start::text = $2",
            &[&pid, &start],
        );
        match ended {
            Ok(1) => log::info!("txbox: ended the listener's lost session (pid {pid})"),
            Ok(_) => {}
            Err(e) => {
                log::warn!("txbox: cannot end the listener's lost session (pid {pid}): {e}")
            }
        }
    }
    // the channel is the outbox table's name, a checked identifier
    conn.batch_execute(&format!("LISTEN {channel}"))?;
    let row = conn.query_one(THIS_SESSION, &[])?;
    let session: ListenerSession = (row.try_get(0)?, row.try_get(1)?);
    *remembered.lock().unwrap_or_else(|p| p.into_inner()) = Some(session.clone());
    let table = channel.to_ascii_lowercase();
    // the trigger's "a publisher of the type is committing" lock: free
    // when none holds it; taken for the statement only (autocommit), so a
    // publisher that asks for it meanwhile waits a moment at most
    let committing = format!("pg_try_advisory_xact_lock(hashtextextended('{table} ' || $1, 0))");
    let settled = format!(
        "SELECT t, pg_try_advisory_xact_lock(hashtextextended('{table} ' || t, 0)) \
         FROM unnest($1::text[]) AS t"
    );
    // the trigger's per-type lock, held by this session: the type's
    // commits skip their notification meanwhile; each asks `settled` after
    // (a select list is computed left to right)
    let hold =
        format!("SELECT pg_try_advisory_lock(hashtext('{table}'), hashtext($1)), {committing}");
    let release =
        format!("SELECT pg_advisory_unlock(hashtext('{table}'), hashtext($1)), {committing}");
    let conn = Arc::new(Mutex::new(conn));
    let (asker, asked) = crossbeam_channel::unbounded::<Ask>();
    let on = conn.clone();
    std::thread::Builder::new()
        .name("txbox-listen-ask".into())
        .spawn(move || {
            // ends when the listening connection is dropped (or never, while
            // a query waits on a connection gone silent)
            for ask in asked {
                ask(&mut lock(&on));
            }
        })
        .map_err(|e| {
            Error::database(
                crate::error::DatabaseErrorKind::Other,
                format!("no thread for the listener's queries: {e}"),
            )
        })?;
    Ok(Box::new(Listening {
        conn,
        asker: Some(asker),
        settled: settled.into(),
        hold: hold.into(),
        release: release.into(),
        session: (session, remembered.clone()),
    }))
}

/// How long a lock query of the listener may take (as long as its check of a
/// quiet connection).
const ANSWER_WITHIN: Duration = Duration::from_secs(5);

type Pooled<T> = r2d2::PooledConnection<PostgresConnectionManager<T>>;
/// A query the helper thread runs on the listening connection.
type Ask = Box<dyn FnOnce(&mut postgres::Client) + Send>;

fn lock<T: PgConnector>(conn: &Mutex<Pooled<T>>) -> std::sync::MutexGuard<'_, Pooled<T>> {
    conn.lock().unwrap_or_else(|p| p.into_inner())
}

/// A pooled connection that `LISTEN`s (it stays checked out while the relay runs),
/// and the query that tells whether publishers that left out their notification
/// are still committing ([`crate::store::Notifications::settled`]).
struct Listening<T: PgConnector> {
    /// Shared with the helper thread that runs the lock queries.
    conn: Arc<Mutex<Pooled<T>>>,
    /// Hands the helper its queries; `None` once dropped (the helper ends).
    asker: Option<crossbeam_channel::Sender<Ask>>,
    settled: Arc<str>,
    hold: Arc<str>,
    release: Arc<str>,
    /// This session, and where the store remembers the listening one: a
    /// clean end forgets it, a lost one leaves it to be ended by the next.
    session: (
        ListenerSession,
        std::sync::Arc<std::sync::Mutex<Option<ListenerSession>>>,
    ),
}

/// Back in the pool, the connection listens no more, and what it received is
/// dropped (else it would pile up in a connection that serves other work).
impl<T: PgConnector> Drop for Listening<T> {
    fn drop(&mut self) {
        use postgres::fallible_iterator::FallibleIterator;
        drop(self.asker.take());
        // (waits for a query the helper is in: a lost connection is dropped
        // on a thread of its own)
        let mut conn = lock(&self.conn);
        if !conn.is_closed() {
            // and holds no type's notifications back
            let ended = conn.batch_execute("UNLISTEN *; SELECT pg_advisory_unlock_all()");
            if ended.is_ok() {
                let mut remembered = self.session.1.lock().unwrap_or_else(|p| p.into_inner());
                if remembered.as_ref() == Some(&self.session.0) {
                    *remembered = None;
                }
            }
            let _ = conn.notifications().iter().count();
        }
    }
}

impl<T: PgConnector> Listening<T> {
    /// Runs `query` on the helper thread and waits at most [`ANSWER_WITHIN`]
    /// for its answer: past that, an error (the connection is lost).
    fn ask<R: Send + 'static>(
        &self,
        query: impl FnOnce(&mut postgres::Client) -> Result<R> + Send + 'static,
    ) -> Result<R> {
        let lost = |why: &str| {
            Error::database(
                crate::error::DatabaseErrorKind::Other,
                format!("the listening connection {why}"),
            )
        };
        let (answer, answered) = crossbeam_channel::bounded(1);
        let ask: Ask = Box::new(move |c| {
            let _ = answer.send(query(c));
        });
        self.asker
            .as_ref()
            .ok_or_else(|| lost("is closed"))?
            .send(ask)
            .map_err(|_| lost("has no helper thread"))?;
        answered
            .recv_timeout(ANSWER_WITHIN)
            .map_err(|_| lost(&format!("did not answer within {ANSWER_WITHIN:?}")))?
    }
}

impl<T: PgConnector> crate::store::Notifications for Listening<T> {
    fn next(&mut self, timeout: Duration) -> Result<Option<String>> {
        let mut conn = lock(&self.conn);
        if conn.is_closed() {
            return Err(Error::database(
                crate::error::DatabaseErrorKind::Other,
                "the listening connection is closed",
            ));
        }
        use postgres::fallible_iterator::FallibleIterator;
        // no wait: what the driver has read already, without a timer (its
        // hidden runtime rounds a timer up to its next 1 ms tick, so a zero
        // `timeout_iter` cost each notification about a millisecond). A
        // notification still in the socket is read by the next wait.
        let got = if timeout.is_zero() {
            conn.notifications().iter().next()
        } else {
            conn.notifications().timeout_iter(timeout).next()
        };
        match got {
            Ok(None) => Ok(None),
            Ok(Some(n)) => Ok(Some(n.payload().to_owned())),
            Err(e) => Err(e.into()),
        }
    }

    fn settled(&mut self, event_types: &[String]) -> Result<Vec<(String, bool)>> {
        let (sql, types) = (self.settled.clone(), event_types.to_vec());
        self.ask(move |c| {
            let rows = c.query(&*sql, &[&types])?;
            rows.iter()
                .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                .collect()
        })
    }

    fn check(&mut self, timeout: Duration) -> Result<()> {
        Ok(lock(&self.conn).is_valid(timeout)?)
    }

    fn hold(&mut self, event_type: &str) -> Result<(bool, bool)> {
        let (sql, t) = (self.hold.clone(), event_type.to_owned());
        self.ask(move |c| {
            let row = c.query_one(&*sql, &[&t])?;
            Ok((row.try_get(0)?, row.try_get(1)?))
        })
    }

    fn release(&mut self, event_type: &str) -> Result<bool> {
        let (sql, t) = (self.release.clone(), event_type.to_owned());
        self.ask(move |c| {
            let row = c.query_one(&*sql, &[&t])?;
            Ok(row.try_get::<_, bool>(1)?)
        })
    }
}
