//! The storage side, for those who implement a store or read its rows: the
//! [`Store`] traits the relay and the admin API run on, the claim's argument
//! and result types ([`ClaimArgs`], [`HeldBatch`], [`Outcome`]), the table
//! names ([`Tables`]) and the SQL dialects. The crate root re-exports what an
//! application calls (the stores, [`FullStore`], [`TypeStatus`], the dead
//! letters' types). Each dialect only varies the SQL; the logic that decides
//! what to do with rows (retries, backoff, fencing) lives in the relay.

use std::sync::Arc;
use std::time::Duration;

use uuid::Uuid;

use crate::error::{Error, Result};
use crate::event::{Event, EventId};

mod claim;
mod dead_letter;
#[cfg(test)]
pub(crate) mod memory;
mod migration;
pub use crate::status::TypeStatus;
pub use crate::tables::Tables;
pub use claim::{ClaimArgs, HeldClaim};
pub use dead_letter::{BlockedKey, DeadLetter, DlqFilter, DlqStatus};
#[cfg(feature = "_sql")]
pub(crate) use migration::split_statements;
pub use migration::PendingMigration;
#[cfg(feature = "mysql")]
pub(crate) mod mysql;
#[cfg(feature = "oracle")]
pub(crate) mod oracle;
#[cfg(feature = "postgres")]
pub(crate) mod postgres;
#[cfg(feature = "_sql")]
pub(crate) mod sql;
#[cfg(feature = "sqlite")]
pub(crate) mod sqlite;

#[cfg(feature = "mysql")]
pub use mysql::{MySqlDialect, MySqlStore};
#[cfg(feature = "oracle")]
pub use oracle::{OracleDialect, OracleStore};
#[cfg(feature = "postgres")]
pub use postgres::{pg_config, PgConnector, PgDialect, PgPool, PgStore, PgTls};
#[cfg(feature = "_sql")]
pub use sql::{Dialect, SqlStore};
#[cfg(feature = "sqlite")]
pub use sqlite::{SqliteDialect, SqliteStore};

/// The header a store gives a claimed event whose row it cannot read as an
/// event (its headers are no JSON object: a row written by hand), with what is
/// wrong as its value. The relay fails such an event alone, as if the broker
/// had refused it (an attempt counted, FAILED with no retry left, then the
/// dead letters), without handing it to the sender, and sends the rest of its
/// batch. A store of your own can mark a row it cannot read the same way
/// instead of failing the whole claim. Reserved ([`crate::RESERVED_HEADER_PREFIX`]):
/// no published event carries it.
pub const HEADER_DEFECT: &str = "txbox-defect";

/// What became of one claimed event after the send.
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    /// The broker acked it: PROCESSED (kept for `processed_ttl`, then cleaned up).
    Sent,
    /// The broker acked it and processed rows are not kept (`processed_ttl` zero):
    /// the row is deleted at once, and nothing is left for the cleanup.
    SentDelete,
    /// The send failed and a retry is left: back to PENDING after `delay`, attempts + 1.
    Retry {
        /// Wait before the next attempt.
        delay: Duration,
        /// Why it failed.
        error: String,
    },
    /// The send failed and no retry is left: FAILED, attempts + 1.
    Failed {
        /// Why it failed.
        error: String,
    },
    /// The transport failed (the broker could not be reached, no confirm came):
    /// back to PENDING at once with no attempt counted, for an outage is not the
    /// event's fault.
    Release {
        /// Why the send failed.
        error: String,
    },
}

impl Outcome {
    /// The broker acked the event ([`Outcome::Sent`] or [`Outcome::SentDelete`]).
    pub fn is_sent(&self) -> bool {
        matches!(self, Outcome::Sent | Outcome::SentDelete)
    }
}

/// The error of a store that cannot hold a claim open.
#[cfg(feature = "_sql")]
pub(crate) fn cannot_hold_claims() -> Error {
    Error::Unsupported {
        what: "claim mode \"lock\"".into(),
        why: "it needs a store that can hold a claim open (PostgreSQL)".into(),
    }
}

/// A batch claimed by [`ClaimStore::claim_held`]: its rows stay PENDING, locked by a
/// transaction this value keeps open on a connection of its own. Dropping it
/// unfinished rolls the transaction back, which leaves the rows as they were.
pub trait HeldBatch: Send {
    /// Applies the outcomes of the claimed `events` in the held transaction (no
    /// token: the locks fence) and commits. Returns how many rows changed. On an
    /// error (the session was ended, the connection lost) every row is as it was
    /// before the claim: an event the broker acked is sent again.
    fn finish(self: Box<Self>, events: &[Event], outcomes: &[(EventId, Outcome)]) -> Result<u64>;

    /// Finishes like [`HeldBatch::finish`] and then claims `next` like
    /// [`ClaimStore::claim_held`] (without its idle probe) on the same connection,
    /// both in one round trip: a poller draining a backlog claims its next batch
    /// as it commits one. Returns the finish's count and the new claim, or `None`
    /// when this batch cannot claim (the default: it finishes only, and the
    /// caller claims through the store). On an error nothing was claimed, and the
    /// batch is either finished or as it was before its claim.
    fn finish_and_claim(
        self: Box<Self>,
        events: &[Event],
        outcomes: &[(EventId, Outcome)],
        next: &ClaimArgs<'_>,
    ) -> Result<(u64, Option<HeldClaim>)> {
        let _ = next;
        Ok((self.finish(events, outcomes)?, None))
    }
}

/// What every part of txbox needs of a store: its schema, a health check, its
/// tables and lease locks. The other store traits build on it, one per part of
/// txbox that uses a store: [`ClaimStore`] (the relay's pollers),
/// [`MaintenanceStore`] (recovery and cleanup), [`DeadLetterStore`] (the dead
/// letters) and [`InboxStore`] (the inbox). [`FullStore`] is all of them.
///
/// No method has a default, so a store that wraps another forwards each one or
/// does not compile. Every method is one short transaction (but for
/// [`ClaimStore::claim_held`], whose transaction lasts until its batch is
/// finished), and every method may be called from many threads.
pub trait Store: Send + Sync + 'static {
    /// Creates the tables and indexes if missing, and applies the schema
    /// versions not yet applied (idempotent).
    fn migrate(&self) -> Result<()>;

    /// What [`Store::migrate`] would run now, in order, with the SQL (the
    /// table prefix filled in): nothing on a current schema. For a DBA who
    /// applies the files by hand, and `txbox migrate --dry-run`. The default:
    /// not known ([`Error::Unsupported`]).
    fn pending_migrations(&self) -> Result<Vec<PendingMigration>> {
        Err(crate::Error::Unsupported {
            what: "listing pending migrations".into(),
            why: "this store does not say what its migrate runs".into(),
        })
    }

    /// Checks that the database answers (the admin endpoint's `/health`).
    fn ping(&self) -> Result<()>;

    /// The table prefix the store was opened with.
    /// [`Relay::start`](crate::Relay::start) refuses a configuration whose
    /// `table_prefix` differs: publisher and relay would use different tables.
    fn table_prefix(&self) -> &str;

    /// Takes or renews the lease lock `name` for `owner` for `lease`. True if held.
    fn try_lock(&self, name: &str, owner: Uuid, lease: Duration) -> Result<bool>;

    /// Releases the lock if `owner` holds it.
    fn unlock(&self, name: &str, owner: Uuid) -> Result<()>;
}

/// What a store can do beyond the claims under a lease every store makes, in
/// one place ([`ClaimStore::capabilities`]). A relay checks its configuration
/// against it at start: `claim = "lock"` needs [`held_claims`](Self::held_claims),
/// the wake-up on commit needs [`notifications`](Self::notifications). The
/// other two say how txbox's own SQL stores work, for a reader (a store of
/// your own can leave them false: the relay does not ask).
///
/// ```
/// let caps = txbox::store::Capabilities::default().held_claims(true);
/// assert!(caps.held_claims && !caps.notifications);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// [`ClaimStore::claim_held`] works: the rows stay locked in an open
    /// transaction while they are with the broker (`claim = "lock"`;
    /// PostgreSQL).
    pub held_claims: bool,
    /// [`ClaimStore::listen`] works: a relay starts a listener thread that
    /// wakes its pollers on commit (PostgreSQL).
    pub notifications: bool,
    /// An ordered type's claims walk its keys, each key's first due event a
    /// candidate (PostgreSQL, SQLite); without, they read due events in id
    /// order and skip those whose key is held back.
    pub key_walk: bool,
    /// DDL runs in a transaction, so a migration file is all or nothing
    /// (PostgreSQL, SQLite); elsewhere each DDL statement commits on its own.
    pub transactional_ddl: bool,
    /// An unordered type's claims start at a floor the store keeps
    /// (PostgreSQL): a long transaction that holds the database's snapshot
    /// does not make them walk the dead rows below it. A caller resuming a
    /// backlog passes no [`ClaimArgs::after`]: the floor resumes it.
    pub floor_claims: bool,
}

impl Capabilities {
    /// With claims from a floor or without.
    #[must_use]
    pub fn floor_claims(mut self, yes: bool) -> Self {
        self.floor_claims = yes;
        self
    }

    /// With held claims or without.
    #[must_use]
    pub fn held_claims(mut self, yes: bool) -> Self {
        self.held_claims = yes;
        self
    }

    /// With commit notifications or without.
    #[must_use]
    pub fn notifications(mut self, yes: bool) -> Self {
        self.notifications = yes;
        self
    }

    /// With a key walk or without.
    #[must_use]
    pub fn key_walk(mut self, yes: bool) -> Self {
        self.key_walk = yes;
        self
    }

    /// With transactional DDL or without.
    #[must_use]
    pub fn transactional_ddl(mut self, yes: bool) -> Self {
        self.transactional_ddl = yes;
        self
    }
}

/// Claiming and finishing batches: what the relay's pollers need.
pub trait ClaimStore: Store {
    /// Claims up to `args.limit` due PENDING events of `args.event_type` whose id
    /// is greater than `args.after` (when given), oldest first, in one statement
    /// with `FOR UPDATE SKIP LOCKED`: they become IN_PROCESS, stamped with `token`
    /// and a lease of `args.lease`. Returned sorted by id (with `destination`
    /// empty). While a poller drains a backlog it passes the last id of its
    /// previous full batch, so each claim starts where the last one ended instead
    /// of stepping over every row already sent. With `args.ordered`, only the
    /// first waiting event of each key is claimed.
    fn claim_after(&self, args: &ClaimArgs<'_>, token: Uuid) -> Result<Vec<Event>>;

    /// [`ClaimStore::claim_after`] from the lowest id, unordered.
    fn claim(
        &self,
        event_type: &str,
        limit: usize,
        lease: Duration,
        token: Uuid,
    ) -> Result<Vec<Event>> {
        self.claim_after(&ClaimArgs::new(event_type, limit, lease), token)
    }

    /// Finishes claimed events: only rows still IN_PROCESS under `token` change.
    /// Returns how many rows changed (fewer than given: the claim was lost).
    fn finish(&self, token: Uuid, outcomes: &[(EventId, Outcome)]) -> Result<u64>;

    /// Puts back to PENDING, due now and with no attempt counted, the rows
    /// still IN_PROCESS under any of `tokens`: claims whose answer was lost
    /// (the connection broke after the statement was sent, and it may have
    /// committed) go back as soon as the database answers again, not after
    /// their lease. Returns how many rows changed. The default: none (a
    /// store whose claims cannot outlive a lost answer).
    fn release_claims(&self, tokens: &[Uuid]) -> Result<u64> {
        let _ = tokens;
        Ok(0)
    }

    /// A mark at least as high as the number the database gave every event
    /// inserted so far (the outbox's insert order, `seq`), and lower than any
    /// it gives later: what [`ClaimArgs::upto`] takes. The default: `None`
    /// (a store without one; [`Relay::deliver_pending`](crate::Relay::deliver_pending)
    /// then stops by event ids, the publishers' clocks).
    fn insert_mark(&self) -> Result<Option<i64>> {
        Ok(None)
    }

    /// What this store can do beyond claiming under a lease: hold claims
    /// ([`ClaimStore::claim_held`]), notify on commit ([`ClaimStore::listen`]),
    /// walk the keys of an ordered type, migrate in one transaction.
    fn capabilities(&self) -> Capabilities;

    /// The most database connections the store's pool opens, when it has a
    /// bound. A relay with held claims needs one per batch in flight: it refuses
    /// to start when they cannot all be had.
    fn max_connections(&self) -> Option<usize>;

    /// Claims like [`ClaimStore::claim_after`] for [`ClaimMode::Lock`](crate::ClaimMode::Lock):
    /// locks the rows (`FOR UPDATE SKIP LOCKED`) in a transaction that stays open
    /// instead of stamping them, so they stay PENDING and other relays skip them
    /// while they are locked. The [`HeldBatch`] finishes them and commits. The
    /// database ends the session once the transaction idled for `lease`, which
    /// frees the rows. No [`HeldBatch`] when nothing was claimed. A store that
    /// cannot hold a claim open returns [`Error::Unsupported`].
    ///
    /// With [`ClaimArgs::delete_acked`] (`processed_ttl` zero, the finish's acked
    /// outcomes are [`Outcome::SentDelete`]) the claim deletes the rows in its
    /// transaction instead of only locking them, so a finish with every event
    /// acked is the commit alone, and the events not acked are written back.
    /// Until the commit other sessions see the rows as before, PENDING.
    fn claim_held(&self, args: &ClaimArgs<'_>) -> Result<HeldClaim>;

    /// Listens for commits that published events, on a connection of its own.
    /// A store without notifications returns [`Error::Unsupported`].
    fn listen(&self) -> Result<Box<dyn Notifications>>;

    /// How long until the earliest pending event of `event_type` is due, by
    /// the database's clock: `Duration::ZERO` when one is due now, `None` when
    /// none is pending. A poller whose last claim found nothing asks this
    /// instead of claiming again, and sleeps until the next event is due (a
    /// delayed one, a retry's backoff), at most its polling delay. The
    /// default says "maybe due now", and the poller claims as it would
    /// without.
    fn next_due(&self, event_type: &str) -> Result<Option<Duration>> {
        let _ = event_type;
        Ok(Some(Duration::ZERO))
    }

    /// Tells the database which event types' commits notify the relay, where
    /// commits notify (PostgreSQL): those of `notify` do, those of `quiet`
    /// (their wake-up is [`Wake::Poll`](crate::Wake::Poll)) send no
    /// notification. [`Relay::start`](crate::Relay::start) calls it with its
    /// configuration. The default does nothing.
    fn set_commit_wake(&self, notify: &[&str], quiet: &[&str]) -> Result<()> {
        let _ = (notify, quiet);
        Ok(())
    }

    /// How full the database's notification queue is, from 0 to 1, where
    /// commits notify (PostgreSQL's `pg_notification_queue_usage()`); `None`
    /// elsewhere (the default). A listener that stops reading (anywhere in the
    /// cluster) holds the queue's tail; at half full txbox's commits stop
    /// notifying and the relay relies on polling.
    fn notify_queue_usage(&self) -> Result<Option<f64>> {
        Ok(None)
    }
}

/// Commit notifications of a store ([`ClaimStore::listen`]): the event types of
/// the events each commit published.
pub trait Notifications: Send {
    /// Waits up to `timeout` for the next notification: the event type it names,
    /// or `None` when the time is up. An error means the connection is gone;
    /// the relay listens again (notifications sent meanwhile are lost, so it
    /// then wakes every poller once).
    fn next(&mut self, timeout: Duration) -> Result<Option<String>>;

    /// For each of `event_types`, whether no publisher of it is committing
    /// that left out its notification (another commit of its event type was
    /// notifying at that moment, or the type was [held](Notifications::hold)).
    /// Once a type's answer is true, every such commit of it is visible to the
    /// next claim. The default says true: a store whose every commit notifies.
    fn settled(&mut self, event_types: &[String]) -> Result<Vec<(String, bool)>> {
        Ok(event_types.iter().map(|t| (t.clone(), true)).collect())
    }

    /// Checks that the connection still answers, waiting at most `timeout`:
    /// the relay asks after a quiet spell, so a connection that went silent
    /// (a failover, a proxy that stopped forwarding) is found. The default
    /// says it does.
    fn check(&mut self, timeout: Duration) -> Result<()> {
        let _ = timeout;
        Ok(())
    }

    /// Holds back the notifications of `event_type`'s commits: while held, its
    /// commits skip their notification as they do while another commit of the
    /// type notifies (and [`Notifications::settled`] covers them). Returns
    /// whether it is held (not while a commit of the type is notifying) and
    /// whether it is [`settled`](Notifications::settled), asked right after.
    /// The relay holds a type from a notification until its poller's next
    /// claim starts: while commits come faster than claims, notifications
    /// bring nothing. The default holds nothing.
    fn hold(&mut self, event_type: &str) -> Result<(bool, bool)> {
        let settled = self.settled(&[event_type.to_owned()])?;
        Ok((false, settled.iter().all(|(_, s)| *s)))
    }

    /// Ends a [`Notifications::hold`]; then says whether it is
    /// [`settled`](Notifications::settled).
    fn release(&mut self, event_type: &str) -> Result<bool> {
        let settled = self.settled(&[event_type.to_owned()])?;
        Ok(settled.iter().all(|(_, s)| *s))
    }
}

/// A rewrite of the outbox table ([`MaintenanceStore::compact`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Compaction {
    /// Bytes of the table and its indexes before the rewrite.
    pub bytes_before: u64,
    /// And after it.
    pub bytes_after: u64,
}

/// Recovery, cleanup and the outbox's counts: what the relay's maintenance
/// threads, the metrics and the admin tools need.
pub trait MaintenanceStore: Store {
    /// Returns up to `limit` IN_PROCESS rows whose lease expired to PENDING, without
    /// counting an attempt.
    fn recover_expired(&self, limit: usize) -> Result<u64>;

    /// Deletes up to `limit` PROCESSED rows processed more than `ttl` ago.
    fn delete_processed(&self, ttl: Duration, limit: usize) -> Result<u64>;

    /// Per-type counts of the outbox (bounded, index-backed queries).
    fn status(&self) -> Result<Vec<TypeStatus>>;

    /// Rewrites the outbox table when it is mostly empty space: at least 8
    /// MiB, with fewer live rows than pages as VACUUM last counted them (a
    /// table a long transaction kept VACUUM from cleaning, then drained: its
    /// space would otherwise stay unused until a manual `VACUUM FULL`). Rows
    /// that a transaction still open may see are copied too: such a rewrite
    /// gains little, and the relay's cleanup then waits before the next.
    /// The rewrite waits for its lock, and runs, at most `timeout` (then it
    /// gives up with an error, the table as it was): writers queue behind a
    /// waiting exclusive lock, so the wait is short. `Ok(None)` when nothing
    /// was to be done, or the store has no such rewrite (the default:
    /// InnoDB, SQLite and Oracle reuse the space as it is).
    fn compact(&self, timeout: Duration) -> Result<Option<Compaction>> {
        let _ = timeout;
        Ok(None)
    }

    /// Pauses `event_type`: every relay on these tables stops claiming it
    /// (the claims skip a paused type; publishing goes on). Returns whether
    /// it was running. A store without pauses returns
    /// [`Error::Unsupported`].
    fn pause(&self, event_type: &str) -> Result<bool> {
        let _ = event_type;
        Err(cannot_pause())
    }

    /// Resumes `event_type` and, where commits notify (PostgreSQL), wakes
    /// every relay's poller of it. Returns whether it was paused.
    fn resume(&self, event_type: &str) -> Result<bool> {
        let _ = event_type;
        Err(cannot_pause())
    }

    /// The paused event types, by name (none on a store without pauses).
    fn paused(&self) -> Result<Vec<String>> {
        Ok(Vec::new())
    }
}

/// The error of a store that cannot pause event types.
fn cannot_pause() -> Error {
    Error::Unsupported {
        what: "pausing an event type".into(),
        why: "this store keeps no paused types".into(),
    }
}

/// The dead letters: what the relay's DLQ threads and [`Dlq`](crate::Dlq) need.
pub trait DeadLetterStore: Store {
    /// Moves up to `limit` FAILED rows to the dead letters in one transaction.
    fn move_failed_to_dlq(&self, limit: usize) -> Result<u64>;

    /// Moves up to `limit` dead letters marked RETRY back to the outbox as PENDING
    /// with a fresh retry budget, in one transaction.
    fn requeue_dlq_retries(&self, limit: usize) -> Result<u64>;

    /// Deletes up to `limit` RESOLVED dead letters resolved more than `ttl` ago.
    fn delete_resolved_dlq(&self, ttl: Duration, limit: usize) -> Result<u64>;

    /// Lists dead letters, ordered by moved-at then id.
    fn dlq_list(&self, filter: &DlqFilter) -> Result<Vec<DeadLetter>>;

    /// Counts dead letters matching the filter (paging ignored).
    fn dlq_count(&self, filter: &DlqFilter) -> Result<u64>;

    /// One dead letter by id.
    fn dlq_get(&self, id: EventId) -> Result<Option<DeadLetter>>;

    /// Sets `to` on the given dead letters whose status is one of `from`; returns the
    /// ids changed.
    fn dlq_set_status(
        &self,
        ids: &[EventId],
        from: &[DlqStatus],
        to: DlqStatus,
    ) -> Result<Vec<EventId>>;

    /// Deletes the given dead letters whose status is one of `from`; returns the ids deleted.
    fn dlq_delete(&self, ids: &[EventId], from: &[DlqStatus]) -> Result<Vec<EventId>>;

    /// The keys of `event_type` held back by a dead letter (DEAD or RETRY) or a
    /// FAILED outbox event, the earliest such event of each key and the key's
    /// pending events after it, by key: at most `limit` keys, read from at most
    /// `4 * limit` such events. Whether they are blocked depends on the type's
    /// settings: [`Dlq::blocked_keys`](crate::Dlq::blocked_keys) asks only for
    /// ordered types that block.
    fn blocked_keys(&self, event_type: &str, limit: usize) -> Result<Vec<BlockedKey>>;
}

/// Consumed ids: what the [`Inbox`](crate::Inbox) and its cleanup need.
pub trait InboxStore: Store {
    /// Records ids consumed by `consumer` in a transaction of its own; returns those
    /// that were new for that consumer (the unique key (consumer, event id) decides,
    /// never a check-then-insert).
    fn inbox_insert(&self, consumer: &str, ids: &[EventId]) -> Result<Vec<EventId>>;

    /// Deletes up to `limit` consumed ids recorded more than `ttl` ago.
    fn delete_expired_inbox(&self, ttl: Duration, limit: usize) -> Result<u64>;
}

/// A store with every part: what [`Config::connect`](crate::Config::connect)
/// returns and what [`Relay::start`](crate::Relay::start) and the admin endpoint
/// take. Implemented for every type that implements the four part traits;
/// an `Arc<dyn FullStore>` converts into an `Arc<dyn InboxStore>` (or another
/// part) where only that part is needed.
pub trait FullStore: ClaimStore + MaintenanceStore + DeadLetterStore + InboxStore {}

impl<T: ClaimStore + MaintenanceStore + DeadLetterStore + InboxStore> FullStore for T {}

/// Refuses a store opened on other tables than `prefix` (the configuration's):
/// the publisher and `who` would use different tables.
pub(crate) fn check_same_tables(store: &dyn Store, prefix: &str, who: &str) -> Result<()> {
    let opened = store.table_prefix();
    if opened != prefix {
        return Err(Error::config(
            "table_prefix",
            format!(
                "is {prefix:?} but the store was opened with {opened:?}: the publisher \
                 and {who} would use different tables (open the store with \
                 Config::connect)"
            ),
        ));
    }
    Ok(())
}

// The store side of the configuration: kept here, so that `config` does not
// depend on `store`.
impl crate::Config {
    /// Opens the store `url` names on this configuration's tables, so the table
    /// prefix is given once: `postgres://...` (feature `postgres`),
    /// `mysql://...` or `mariadb://...` (feature `mysql`), `sqlite:PATH`
    /// (feature `sqlite`), `oracle://user:password@host:port/service` (feature
    /// `oracle`). The store of one dialect, with its own methods, is had the same
    /// way from its type: [`PgStore::connect(url, &config)`](crate::PgStore).
    ///
    /// ```no_run
    /// # fn main() -> txbox::Result<()> {
    /// let config = txbox::Config::builder().table_prefix("shop_").build()?;
    /// let store = config.connect("sqlite:jobs.db")?;
    /// store.migrate()?;
    /// # Ok(()) }
    /// ```
    pub fn connect(&self, url: &str) -> Result<Arc<dyn FullStore>> {
        connect(url, self)
    }
}

/// Opens the store `url` names on the tables of `config` (see
/// [`Config::connect`](crate::Config::connect)).
#[allow(clippy::needless_return)] // each arm returns from a feature-gated block
pub(crate) fn connect(url: &str, config: &crate::Config) -> Result<Arc<dyn FullStore>> {
    let _ = config; // unused when txbox is built without any SQL dialect
    let scheme = url.split(':').next().unwrap_or_default();
    #[allow(unused_variables)]
    let missing = |feature: &str| Error::Unsupported {
        what: format!("database url {scheme}:..."),
        why: format!("txbox was built without the feature `{feature}`"),
    };
    match scheme {
        "postgres" | "postgresql" => {
            #[cfg(feature = "postgres")]
            return Ok(Arc::new(PgStore::connect(url, config)?));
            #[cfg(not(feature = "postgres"))]
            return Err(missing("postgres"));
        }
        "mysql" | "mariadb" => {
            #[cfg(feature = "mysql")]
            return Ok(Arc::new(MySqlStore::connect(url, config)?));
            #[cfg(not(feature = "mysql"))]
            return Err(missing("mysql"));
        }
        "sqlite" => {
            #[cfg(feature = "sqlite")]
            return Ok(Arc::new(SqliteStore::connect(url, config)?));
            #[cfg(not(feature = "sqlite"))]
            return Err(missing("sqlite"));
        }
        "oracle" => {
            #[cfg(feature = "oracle")]
            return Ok(Arc::new(OracleStore::connect(url, config)?));
            #[cfg(not(feature = "oracle"))]
            return Err(missing("oracle"));
        }
        // the URL is not echoed (it may hold a password anywhere, or be a
        // key=value string), only a scheme that looks like one
        _ => {
            let plain = !scheme.is_empty()
                && scheme.len() <= 20
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c));
            Err(Error::config(
                "database url",
                format!(
                    "unknown scheme {:?}: expected postgres://, mysql://, sqlite:PATH or oracle://",
                    if plain { scheme } else { "?" }
                ),
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::tables::validate_prefix;

    #[test]
    fn prefixes() {
        assert!(validate_prefix("").is_ok());
        assert!(validate_prefix("shop_").is_ok());
        assert!(validate_prefix("_x9").is_ok());
        for bad in ["9x", "a-b", "a;drop table x", "a b", "é", &"x".repeat(25)] {
            let err = validate_prefix(bad).unwrap_err().to_string();
            assert!(err.contains("invalid table prefix"), "{err}");
        }
    }
}
