//! The inbox: an idempotent consumer keyed by the event id.
//!
//! At-least-once delivery means a consumer sees some events twice. The inbox records
//! each consumed event id in the `inbox_consumed` table, whose primary key decides
//! duplicates (`INSERT ... ON CONFLICT DO NOTHING`, never check-then-insert), so two
//! consumers racing on one id run the handler exactly once between them.
//!
//! - **Transactional** ([`Inbox::handle_in`], or [`Inbox::handle_pg`] which opens the
//!   transaction from a pool): the id and the handler's writes commit together
//!   (effectively-once). If the handler fails, everything rolls back and a redelivery
//!   runs it again.
//! - **At-most-once** ([`Inbox::handle_at_most_once`]): the id commits first, then the
//!   handler runs; a failed handler is not retried and a redelivery is skipped. For
//!   effects that cannot be undone (an email).
//! - **Batch** ([`Inbox::handle_batch_in`]): the handler runs once with only the new
//!   events; a batch of nothing but duplicates does not call it.
//!
//! ## Cache
//! An optional [`InboxCache`] in front of the table: a hit skips the database. An id
//! is cached only after its transaction committed. Keys are
//! `txbox:inbox:<service>:<table prefix>:<database>:<event id>` (the database as
//! [`Inbox::cache_database`] names it, empty by default), so services, table
//! prefixes and databases sharing one Redis never see each other's ids. The rule: **cache TTL <= inbox TTL <= how long a duplicate can still
//! arrive** (the broker's retention or redelivery window). A shorter cache TTL only
//! costs database look-ups; an inbox TTL shorter than the redelivery window lets a
//! late duplicate through.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::consumer::ReceivedEvent;
use crate::error::{Error, Result};
use crate::event::EventId;
use crate::store::InboxStore;
use crate::tables::Tables;
use crate::transaction::Transaction;

mod cache;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "redis")]
mod redis;

pub use cache::{InboxCache, MemoryCache};
#[cfg(feature = "redis")]
pub use redis::{RedisCache, RedisCacheBuilder};

/// Whether the handler ran.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled<T> {
    /// The event was new: the handler ran and returned this.
    Consumed(T),
    /// The event was consumed before: the handler did not run.
    Duplicate,
}

impl<T> Handled<T> {
    /// True for [`Handled::Duplicate`].
    pub fn is_duplicate(&self) -> bool {
        matches!(self, Handled::Duplicate)
    }
}

/// What the consumer adapters ([`Inbox::handler_pg`]) do with a message that has no
/// valid `txbox-event-id` header. Every case is logged at error level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MissingIdPolicy {
    /// Reject it: RabbitMQ routes it to the queue's dead-letter exchange; Kafka, which
    /// has none, commits past it. The default.
    #[default]
    Reject,
    /// Acknowledge and skip it.
    Skip,
    /// Stop the consumer loop (the message is neither acked nor committed).
    Stop,
}

/// Counters of one inbox.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct InboxStats {
    /// Handlers run for new events.
    pub consumed: u64,
    /// Events skipped as duplicates.
    pub duplicates: u64,
    /// Cache look-ups that found the id.
    pub cache_hits: u64,
    /// Cache look-ups that did not.
    pub cache_misses: u64,
    /// SQL statements the inbox sent.
    pub statements: u64,
}

/// What one inbox counts; all but `Statements` also go to its configuration's observer.
#[derive(Clone, Copy)]
enum Stat {
    Consumed,
    Duplicates,
    CacheHits,
    CacheMisses,
    Statements,
}

impl Stat {
    fn observed(self) -> Option<crate::metrics::Count> {
        use crate::metrics::Count;
        match self {
            Stat::Consumed => Some(Count::InboxConsumed),
            Stat::Duplicates => Some(Count::InboxDuplicates),
            Stat::CacheHits => Some(Count::CacheHits),
            Stat::CacheMisses => Some(Count::CacheMisses),
            Stat::Statements => None,
        }
    }
}

type Counters = [AtomicU64; 5];

/// The idempotent consumer.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// use txbox::{Handled, Inbox, MemoryCache};
/// let config = txbox::Config::builder().build()?;
/// let inbox = Inbox::new(&config, "billing")?.with_cache(MemoryCache::new(100_000));
/// let mut client = postgres::Client::connect("postgres://postgres@127.0.0.1/test", postgres::NoTls)?;
/// let id: txbox::EventId = "01890a5d-ac96-774b-bcce-b302099a8057".parse()?;
/// let mut tx = client.transaction()?;
/// let handled = inbox.handle_in(&mut tx, id, |tx| {
///     tx.execute("UPDATE accounts SET balance = balance - 5 WHERE id = 1", &[])?;
///     Ok::<_, txbox::Error>(())
/// })?;
/// tx.commit()?;
/// inbox.committed(&[id]); // cache it now that it committed
/// assert!(matches!(handled, Handled::Consumed(()) | Handled::Duplicate));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Inbox {
    inner: Arc<Inner>,
}

struct Inner {
    tables: Tables,
    service: String,
    database: String,
    cache: Option<Arc<dyn InboxCache>>,
    cache_ttl: Duration,
    store: Option<Arc<dyn InboxStore>>,
    counters: Counters,
    /// The configuration's observer.
    observer: crate::metrics::Observed,
}

/// A clone configured apart: the same settings, and its counts so far.
impl Clone for Inner {
    fn clone(&self) -> Self {
        Inner {
            tables: self.tables.clone(),
            service: self.service.clone(),
            database: self.database.clone(),
            cache: self.cache.clone(),
            cache_ttl: self.cache_ttl,
            store: self.store.clone(),
            counters: std::array::from_fn(|i| {
                AtomicU64::new(self.counters[i].load(Ordering::Relaxed))
            }),
            observer: self.observer.clone(),
        }
    }
}

impl Inbox {
    /// An inbox on the tables of `config` for the service `service_name` (part of
    /// every cache key; a plain name such as `billing`).
    pub fn new(config: &crate::Config, service_name: &str) -> Result<Self> {
        crate::tables::validate_consumer(service_name)?;
        Ok(Inbox {
            inner: Arc::new(Inner {
                tables: Tables::new(&config.table_prefix)?,
                service: service_name.to_string(),
                database: String::new(),
                cache: None,
                cache_ttl: config.inbox.cache_ttl,
                store: None,
                counters: Default::default(),
                observer: config.observer.clone(),
            }),
        })
    }

    /// The settings to change: a clone's own from then on (a clone
    /// configured apart is an inbox of its own; the one it was cloned from
    /// keeps its settings).
    fn inner_mut(&mut self) -> &mut Inner {
        Arc::make_mut(&mut self.inner)
    }

    /// Puts a cache in front of the table.
    pub fn with_cache(mut self, cache: impl InboxCache + 'static) -> Self {
        self.inner_mut().cache = Some(Arc::new(cache));
        self
    }

    /// The store for [`Inbox::handle_at_most_once`], which commits the id in a
    /// transaction of its own. A store opened on
    /// other tables than the inbox's configuration is refused: the inbox's two
    /// ways of recording ids would use different tables.
    pub fn with_store(mut self, store: Arc<dyn InboxStore>) -> Result<Self> {
        crate::store::check_same_tables(store.as_ref(), &self.inner.tables.prefix, "the inbox")?;
        self.inner_mut().store = Some(store);
        Ok(self)
    }

    /// Names this inbox's database in its cache keys: where inboxes of one service and table prefix in several
    /// databases share one cache, each needs a name of its own (such as
    /// `orders-eu`), or an id consumed in one would be a duplicate in the
    /// others.
    pub fn cache_database(mut self, name: &str) -> Self {
        self.inner_mut().database = name.to_string();
        self
    }

    /// The cache key of `id`: the service, the table prefix, the database
    /// ([`Inbox::cache_database`]) and the id.
    pub fn cache_key(&self, id: EventId) -> String {
        let i = &self.inner;
        format!(
            "txbox:inbox:{}:{}:{}:{id}",
            i.service, i.tables.prefix, i.database
        )
    }

    /// Counters so far.
    pub fn stats(&self) -> InboxStats {
        let get = |s: Stat| self.inner.counters[s as usize].load(Ordering::Relaxed);
        InboxStats {
            consumed: get(Stat::Consumed),
            duplicates: get(Stat::Duplicates),
            cache_hits: get(Stat::CacheHits),
            cache_misses: get(Stat::CacheMisses),
            statements: get(Stat::Statements),
        }
    }

    fn count(&self, stat: Stat, n: u64) {
        self.inner.counters[stat as usize].fetch_add(n, Ordering::Relaxed);
        if let Some(c) = stat.observed() {
            self.inner.observer.add(c, n);
        }
    }

    /// True if the cache knows `id` as consumed (a cache error counts as a miss).
    fn cached(&self, id: EventId) -> bool {
        let Some(cache) = &self.inner.cache else {
            return false;
        };
        let hit = match cache.contains(&self.cache_key(id)) {
            Ok(hit) => hit,
            Err(e) => {
                log::warn!("txbox: inbox cache look-up failed, asking the database: {e}");
                false
            }
        };
        self.count(
            if hit {
                Stat::CacheHits
            } else {
                Stat::CacheMisses
            },
            1,
        );
        hit
    }

    /// Tells the cache that these ids committed. [`Inbox::handle_pg`] and
    /// [`Inbox::handle_at_most_once`] call it themselves; after
    /// [`Inbox::handle_in`] call it once your transaction committed.
    pub fn committed(&self, ids: &[EventId]) {
        let Some(cache) = &self.inner.cache else {
            return;
        };
        for id in ids {
            if let Err(e) = cache.insert(&self.cache_key(*id), self.inner.cache_ttl) {
                log::warn!("txbox: inbox cache insert failed (the table still has the id): {e}");
            }
        }
    }

    fn insert<Tx: Transaction + ?Sized>(
        &self,
        tx: &mut Tx,
        ids: &[EventId],
    ) -> Result<Vec<EventId>> {
        // one insert per distinct id
        let mut seen = std::collections::HashSet::new();
        let distinct: Vec<EventId> = ids.iter().copied().filter(|id| seen.insert(*id)).collect();
        self.count(Stat::Statements, distinct.len() as u64);
        tx.insert_new_ids(&self.inner.tables, &self.inner.service, &distinct)
    }

    /// Transactional: records `id` in `tx` and runs `handler` in the same
    /// transaction, unless `id` was consumed before. On `Err` roll `tx` back: the id
    /// is then not recorded and a redelivery runs the handler again. The handler's
    /// error passes through unchanged.
    pub fn handle_in<Tx, T, E, F>(
        &self,
        tx: &mut Tx,
        id: EventId,
        handler: F,
    ) -> Result<Handled<T>, E>
    where
        Tx: Transaction + ?Sized,
        E: From<Error>,
        F: FnOnce(&mut Tx) -> Result<T, E>,
    {
        if self.is_cached(id) {
            return Ok(Handled::Duplicate);
        }
        self.handle_in_uncached(tx, id, handler)
    }

    /// A cache hit counts as a duplicate.
    pub(crate) fn is_cached(&self, id: EventId) -> bool {
        let hit = self.cached(id);
        if hit {
            self.count(Stat::Duplicates, 1);
        }
        hit
    }

    pub(crate) fn handle_in_uncached<Tx, T, E, F>(
        &self,
        tx: &mut Tx,
        id: EventId,
        handler: F,
    ) -> Result<Handled<T>, E>
    where
        Tx: Transaction + ?Sized,
        E: From<Error>,
        F: FnOnce(&mut Tx) -> Result<T, E>,
    {
        if self.insert(tx, &[id])?.is_empty() {
            self.count(Stat::Duplicates, 1);
            return Ok(Handled::Duplicate);
        }
        let out = handler(tx)?;
        self.count(Stat::Consumed, 1);
        Ok(Handled::Consumed(out))
    }

    /// Transactional batch: records the ids of all `events` in `tx` and calls
    /// `handler` once with only the new ones; a batch of duplicates only does not call
    /// it. Events without an id are refused ([`Error::MissingEventId`]).
    pub fn handle_batch_in<'a, Tx, T, E, F>(
        &self,
        tx: &mut Tx,
        events: &'a [ReceivedEvent],
        handler: F,
    ) -> Result<Handled<T>, E>
    where
        Tx: Transaction + ?Sized,
        E: From<Error>,
        F: FnOnce(&mut Tx, Vec<&'a ReceivedEvent>) -> Result<T, E>,
    {
        let mut ids = Vec::with_capacity(events.len());
        for e in events {
            ids.push(e.event_id()?);
        }
        let unseen: Vec<EventId> = ids.iter().copied().filter(|id| !self.cached(*id)).collect();
        let new = if unseen.is_empty() {
            Vec::new()
        } else {
            self.insert(tx, &unseen)?
        };
        self.count(Stat::Duplicates, (events.len() - new.len()) as u64);
        if new.is_empty() {
            return Ok(Handled::Duplicate);
        }
        // each new id once: a second copy of it in the batch is a duplicate too
        let mut fresh_ids: std::collections::HashSet<EventId> = new.into_iter().collect();
        let fresh: Vec<&ReceivedEvent> = events
            .iter()
            .zip(&ids)
            .filter(|(_, id)| fresh_ids.remove(id))
            .map(|(e, _)| e)
            .collect();
        let n = fresh.len() as u64;
        let out = handler(tx, fresh)?;
        self.count(Stat::Consumed, n);
        Ok(Handled::Consumed(out))
    }

    /// At-most-once: commits `id` first (in its own transaction, through the store
    /// given with [`Inbox::with_store`]), then runs `handler` outside any transaction.
    /// A failed handler is not retried: a redelivery is a duplicate.
    pub fn handle_at_most_once<T, E, F>(&self, id: EventId, handler: F) -> Result<Handled<T>, E>
    where
        E: From<Error>,
        F: FnOnce() -> Result<T, E>,
    {
        if self.is_cached(id) {
            return Ok(Handled::Duplicate);
        }
        let store =
            self.inner.store.as_ref().ok_or_else(|| {
                Error::Misuse("handle_at_most_once needs Inbox::with_store".into())
            })?;
        self.count(Stat::Statements, 1);
        if store.inbox_insert(&self.inner.service, &[id])?.is_empty() {
            self.count(Stat::Duplicates, 1);
            return Ok(Handled::Duplicate);
        }
        self.committed(&[id]);
        self.count(Stat::Consumed, 1);
        handler().map(Handled::Consumed)
    }
}

/// What the PostgreSQL inbox's handler on a pool tells a consumer loop.
#[cfg(feature = "postgres")]
mod verdicts {
    use std::fmt::Display;

    use super::{Handled, Inbox, MissingIdPolicy};
    use crate::consumer::{ReceivedEvent, Verdict};
    use crate::error::Result;

    impl Inbox {
        /// The verdict for a consumer loop on a message without a valid event id.
        pub(crate) fn missing_id(policy: MissingIdPolicy, event: &ReceivedEvent) -> Verdict {
            let what = format!(
                "message at {} has no valid txbox-event-id header",
                event.position
            );
            match policy {
                MissingIdPolicy::Reject => {
                    log::error!("txbox: inbox: {what}; rejected");
                    Verdict::Reject(what)
                }
                MissingIdPolicy::Skip => {
                    log::error!("txbox: inbox: {what}; skipped");
                    Verdict::Ack
                }
                MissingIdPolicy::Stop => {
                    log::error!("txbox: inbox: {what}; stopping the consumer");
                    Verdict::Stop(what)
                }
            }
        }

        /// The verdict for a consumer loop after the inbox handled a message.
        pub(crate) fn verdict<T, E: Display>(result: Result<Handled<T>, E>) -> Verdict {
            match result {
                Ok(_) => Verdict::Ack,
                Err(e) => Verdict::Retry(e.to_string()),
            }
        }
    }
}

/// Deletes consumed ids older than the inbox TTL, in bounded batches, under the
/// lease lock `txbox-cleanup-inbox` so one instance runs it at a time. One thread.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// # let store: std::sync::Arc<dyn txbox::FullStore> = std::sync::Arc::new(txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", &txbox::Config::builder().build()?)?);
/// let config = txbox::Config::builder().build()?;
/// let cleaner = txbox::InboxCleanup::start(store, &config)?;
/// // ...
/// cleaner.shutdown(std::time::Duration::from_secs(5))?;
/// # Ok(()) }
/// ```
#[must_use = "dropping it stops it"]
pub struct InboxCleanup {
    relay: crate::Relay,
}

impl InboxCleanup {
    /// Starts the cleanup thread with the `[inbox]` settings of `config`.
    /// A store opened on other tables than `config`'s is refused.
    pub fn start(store: Arc<dyn InboxStore>, config: &crate::Config) -> Result<Self> {
        crate::store::check_same_tables(
            store.as_ref(),
            config.table_prefix(),
            "the inbox cleanup",
        )?;
        Ok(InboxCleanup {
            relay: crate::Relay::start_inbox_cleanup(store, config)?,
        })
    }

    /// Stops the thread, waiting at most `timeout`.
    pub fn shutdown(self, timeout: Duration) -> Result<()> {
        self.relay.shutdown(timeout)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A clone configured apart is an inbox of its own (it panicked, "configure
    /// the inbox before cloning it"); the one it was cloned from keeps its
    /// settings, and clones not configured apart share them.
    #[test]
    fn a_clone_configured_apart_keeps_the_original_as_it_was() {
        let config = crate::Config::builder().build().unwrap();
        let original = Inbox::new(&config, "billing").unwrap();
        let shared = original.clone();
        let eu = original
            .clone()
            .cache_database("orders-eu")
            .with_cache(MemoryCache::new(10));
        assert_eq!(original.inner.database, "");
        assert!(original.inner.cache.is_none());
        assert_eq!(eu.inner.database, "orders-eu");
        assert!(eu.inner.cache.is_some());
        assert!(Arc::ptr_eq(&original.inner, &shared.inner));
        assert!(!Arc::ptr_eq(&original.inner, &eu.inner));
    }
}
