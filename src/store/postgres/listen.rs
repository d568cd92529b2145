//! The PostgreSQL connection that listens for the relay: `LISTEN`, the
//! advisory lock of the rationed wake-up on commit (`sql/postgres/006_*.sql`,
//! `008_*.sql`), and the transactions the commits that skipped their
//! notification were among.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use r2d2_postgres::PostgresConnectionManager;

use super::{PgConnector, PgPool};
use crate::error::{Error, Result};
use crate::store::Settled;

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
    // the trigger's per-type lock, held by this session: the type's
    // commits skip their notification meanwhile
    let hold =
        format!("SELECT pg_try_advisory_lock(hashtext('{table}'), hashtext($1)), {SNAPSHOT}");
    let release = format!("SELECT pg_advisory_unlock(hashtext('{table}'), hashtext($1))");
    // named for whoever reads pg_stat_activity: the listening session's
    // last statement (a pooled connection's is not)
    let snapshot = format!("SELECT {SNAPSHOT} /* the listener of {table} */");
    // the commits that skipped before this LISTEN (beside a hold of a lost
    // session, or a notification that went to it) are among those in
    // progress now
    let now = in_progress(&conn.query_one(snapshot.as_str(), &[])?)?;
    Ok(Box::new(Listening {
        conn,
        pool: pool.clone(),
        hold,
        release,
        snapshot,
        witnesses: Witnesses::new(now),
        session: (session, remembered.clone()),
    }))
}

/// The transactions in progress, as the statement that reads it began
/// (`txid_current_snapshot`: PostgreSQL 11 has no `pg_current_snapshot`).
const SNAPSHOT: &str = "txid_current_snapshot()::text";
const IN_PROGRESS: &str = "SELECT txid_current_snapshot()::text";

/// The ids of the transactions in progress in the snapshot of column 0 or 1
/// of `row` (its last column): `xmin:xmax:xip,...`.
fn in_progress(row: &postgres::Row) -> Result<HashSet<i64>> {
    let text: String = row.try_get(row.len() - 1)?;
    let xip = text.rsplit(':').next().unwrap_or("");
    xip.split(',')
        .filter(|x| !x.is_empty())
        .map(|x| {
            x.parse().map_err(|_| {
                Error::Internal(format!(
                    "txid_current_snapshot() said {text:?}: not xmin:xmax:xip"
                ))
            })
        })
        .collect()
}

/// A commit that skipped its notification is in progress when the
/// notification it skipped beside arrives, or when the hold it skipped during
/// ends; the listener notes those transactions per event type (its witnesses)
/// and the type is settled once they have all ended. Transactions that
/// publish nothing are among them: a long one is given up after
/// [`WITNESS_FOR`], so a commit that skipped its notification and then took
/// longer to complete is sent at the next poll.
struct Witnesses {
    /// Per event type, its transactions in progress and since when.
    of: BTreeMap<String, HashMap<i64, Instant>>,
    /// Those in progress when the LISTEN began: every type's, once it is
    /// first asked about.
    first: HashMap<i64, Instant>,
}

/// How long the wait for the transactions in progress waits for a
/// connection of the pool.
const SNAPSHOT_WAIT: Duration = Duration::from_millis(100);

/// How long a witness transaction is waited for.
const WITNESS_FOR: Duration = Duration::from_secs(60);

impl Witnesses {
    fn new(first: HashSet<i64>) -> Self {
        let at = Instant::now();
        Witnesses {
            of: BTreeMap::new(),
            first: first.into_iter().map(|x| (x, at)).collect(),
        }
    }

    /// The witnesses of `event_type` (those of the LISTEN's start at first).
    fn of(&mut self, event_type: &str) -> &mut HashMap<i64, Instant> {
        if !self.of.contains_key(event_type) {
            let first = self.first.clone();
            self.of.insert(event_type.to_owned(), first);
        }
        self.of.entry(event_type.to_owned()).or_default()
    }

    /// Notes the transactions of `now` as witnesses of `event_type`.
    fn note(&mut self, event_type: &str, now: &HashSet<i64>) {
        let at = Instant::now();
        let w = self.of(event_type);
        for x in now {
            w.entry(*x).or_insert(at);
        }
    }

    /// Drops the witnesses of `event_type` that ended (not in `now`) or were
    /// waited for long enough, and says whether it is settled.
    fn settle(&mut self, event_type: &str, now: &HashSet<i64>) -> Settled {
        let w = self.of(event_type);
        let before = w.len();
        w.retain(|x, since| now.contains(x) && since.elapsed() < WITNESS_FOR);
        match (w.len(), before) {
            (0, _) => Settled::Yes,
            (left, before) if left < before => Settled::Partly,
            _ => Settled::No,
        }
    }

    /// Whether any type still waits (else no snapshot needs reading).
    fn waiting(&self, event_types: &[String]) -> bool {
        event_types.iter().any(|t| match self.of.get(t) {
            Some(w) => !w.is_empty(),
            None => !self.first.is_empty(),
        })
    }
}

/// A pooled connection that `LISTEN`s (it stays checked out while the relay runs),
/// and the query that tells whether publishers that left out their notification
/// are still committing ([`crate::store::Notifications::settled`]).
struct Listening<T: PgConnector> {
    conn: r2d2::PooledConnection<PostgresConnectionManager<T>>,
    /// Where the waits for the transactions in progress ask: a connection
    /// that goes silent blocks a query until the OS gives it up (or for good,
    /// behind a proxy that stopped forwarding), and the listening one is
    /// checked with a deadline instead ([`crate::store::Notifications::check`]).
    pool: PgPool<T>,
    hold: String,
    release: String,
    /// Reads the transactions in progress (on this connection: named, so
    /// that `pg_stat_activity` shows whose it is).
    snapshot: String,
    witnesses: Witnesses,
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
        if !self.conn.is_closed() {
            // and holds no type's notifications back
            let ended = self
                .conn
                .batch_execute("UNLISTEN *; SELECT pg_advisory_unlock_all()");
            if ended.is_ok() {
                let mut remembered = self.session.1.lock().unwrap_or_else(|p| p.into_inner());
                if remembered.as_ref() == Some(&self.session.0) {
                    *remembered = None;
                }
            }
            let _ = self.conn.notifications().iter().count();
        }
    }
}

impl<T: PgConnector> crate::store::Notifications for Listening<T> {
    fn next(&mut self, timeout: Duration) -> Result<Option<String>> {
        if self.conn.is_closed() {
            return Err(Error::database(
                crate::error::DatabaseErrorKind::Other,
                "the listening connection is closed",
            ));
        }
        use postgres::fallible_iterator::FallibleIterator;
        match self.conn.notifications().timeout_iter(timeout).next() {
            Ok(None) => Ok(None),
            Ok(Some(n)) => Ok(Some(n.payload().to_owned())),
            Err(e) => Err(e.into()),
        }
    }

    fn settled(&mut self, event_types: &[String]) -> Result<Vec<(String, Settled)>> {
        if !self.witnesses.waiting(event_types) {
            return Ok(event_types
                .iter()
                .map(|t| (t.clone(), Settled::Yes))
                .collect());
        }
        // a pool without a free connection now: asked again later
        let Ok(mut conn) = self.pool.get_timeout(SNAPSHOT_WAIT) else {
            return Ok(event_types
                .iter()
                .map(|t| (t.clone(), Settled::No))
                .collect());
        };
        let now = in_progress(&conn.query_one(IN_PROGRESS, &[])?)?;
        Ok(event_types
            .iter()
            .map(|t| (t.clone(), self.witnesses.settle(t, &now)))
            .collect())
    }

    fn check(&mut self, timeout: Duration) -> Result<()> {
        Ok(self.conn.is_valid(timeout)?)
    }

    fn hold(&mut self, event_type: &str) -> Result<(bool, Settled)> {
        let row = self.conn.query_one(self.hold.as_str(), &[&event_type])?;
        let now = in_progress(&row)?;
        self.witnesses.note(event_type, &now);
        Ok((row.try_get(0)?, self.witnesses.settle(event_type, &now)))
    }

    fn release(&mut self, event_type: &str) -> Result<Settled> {
        self.conn.query_one(self.release.as_str(), &[&event_type])?;
        // read after the unlock: a commit that skipped during the hold is in
        // progress in it, or visible already
        let now = in_progress(&self.conn.query_one(self.snapshot.as_str(), &[])?)?;
        self.witnesses.note(event_type, &now);
        Ok(self.witnesses.settle(event_type, &now))
    }
}
