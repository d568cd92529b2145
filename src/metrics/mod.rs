//! Metrics: counters, gauges and histograms of the outboxes, relays and inboxes,
//! delivered to an [`Observer`].
//!
//! Every part of txbox reports to the observer of the [`Config`](crate::Config)
//! it was built from. By default that is the process-wide [`Registry`]
//! ([`global`]), read as a [`MetricsSnapshot`] ([`snapshot`]) or as Prometheus
//! text ([`prometheus`]), and, with the feature `metrics`, the `metrics` facade
//! crate (`Facade`), so an application's existing exporter picks them up
//! (names as in the Prometheus text). [`Config::observed`](crate::Config::observed)
//! gives a configuration an observer of its own: a [`Registry`] per relay (two
//! relays in one process then count apart), or any type that implements
//! [`Observer`].
//!
//! ```
//! let snap = txbox::metrics::snapshot();
//! let text = txbox::metrics::prometheus();
//! assert!(text.contains("txbox_events_sent_total"));
//! # let _ = snap;
//! ```
//!
//! ```
//! # fn main() -> txbox::Result<()> {
//! use std::sync::Arc;
//! use txbox::metrics::Registry;
//!
//! let registry = Arc::new(Registry::new());
//! let config = txbox::Config::builder()
//!     .event("order-created", |e| e)
//!     .build()?
//!     .observed(registry.clone());
//! // ... an Outbox, a Relay and an Inbox built from `config` count here only:
//! assert_eq!(registry.snapshot().events_sent, 0);
//! # Ok(()) }
//! ```

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use crate::status::TypeStatus;

#[cfg(feature = "metrics")]
mod facade;
mod registry;

#[cfg(feature = "metrics")]
pub use facade::Facade;
pub use registry::{HistogramSnapshot, MetricsSnapshot, Registry, BUCKETS};

/// A counter txbox keeps ([`Observer::count`]); its name in the Prometheus
/// text is [`Count::name`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Count {
    /// Events written into business transactions (counted before their commit).
    Published,
    /// Events the broker acked.
    Sent,
    /// Sends that failed with no retry left.
    Failed,
    /// Sends that failed and were scheduled for a retry.
    Retried,
    /// Events moved to the dead letters.
    MovedToDlq,
    /// In-process events returned to pending after their lease.
    Recovered,
    /// Rows deleted by the cleanups.
    Cleaned,
    /// Events the inbox handled.
    InboxConsumed,
    /// Duplicates the inbox skipped.
    InboxDuplicates,
    /// Inbox cache look-ups that hit.
    CacheHits,
    /// Inbox cache look-ups that missed.
    CacheMisses,
    /// Events of ordered types (`on_poison = "skip"`) whose key went on without them.
    OrderedSkipped,
}

const COUNTERS: [(Count, &str, &str); 12] = [
    (
        Count::Published,
        "txbox_events_published_total",
        "Events written into business transactions",
    ),
    (
        Count::Sent,
        "txbox_events_sent_total",
        "Events the broker acked",
    ),
    (
        Count::Failed,
        "txbox_events_failed_total",
        "Sends that failed with no retry left (the event became FAILED)",
    ),
    (
        Count::Retried,
        "txbox_events_retried_total",
        "Sends that failed and were scheduled for a retry",
    ),
    (
        Count::MovedToDlq,
        "txbox_events_moved_to_dlq_total",
        "Events moved to the dead letters",
    ),
    (
        Count::Recovered,
        "txbox_events_recovered_total",
        "In-process events returned to pending after their lease",
    ),
    (
        Count::Cleaned,
        "txbox_rows_cleaned_total",
        "Processed events, resolved dead letters and inbox ids deleted",
    ),
    (
        Count::InboxConsumed,
        "txbox_inbox_consumed_total",
        "Events the inbox handled",
    ),
    (
        Count::InboxDuplicates,
        "txbox_inbox_duplicates_total",
        "Duplicates the inbox skipped",
    ),
    (
        Count::CacheHits,
        "txbox_inbox_cache_hits_total",
        "Inbox cache look-ups that hit",
    ),
    (
        Count::CacheMisses,
        "txbox_inbox_cache_misses_total",
        "Inbox cache look-ups that missed",
    ),
    (
        Count::OrderedSkipped,
        "txbox_ordered_skipped_total",
        "Events of ordered types (on_poison = skip) whose key went on without them",
    ),
];

fn index(c: Count) -> usize {
    c as usize
}

impl Count {
    /// Its name in the Prometheus text and the `metrics` facade
    /// (`txbox_events_sent_total`, ...).
    pub fn name(self) -> &'static str {
        COUNTERS[index(self)].1
    }
}

/// A call to a SQL store, timed for [`Observer::store_call`]: what the relay
/// asks of the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum StoreCall {
    /// A claim of a batch: under a lease, or held (`claim = "lock"`).
    Claim,
    /// A batch's finish: its outcomes written (a held batch's commit, with
    /// the next claim when the two go together).
    Finish,
    /// A maintenance pass: the recovery of expired leases, a cleanup, a move
    /// to or from the dead letters.
    Maintenance,
    /// A poller's question when its type's next event is due, asked instead
    /// of a claim while the type is quiet.
    NextDue,
}

/// Every [`StoreCall`], in the order of its index.
pub(crate) const STORE_CALLS: [StoreCall; 4] = [
    StoreCall::Claim,
    StoreCall::Finish,
    StoreCall::Maintenance,
    StoreCall::NextDue,
];

impl StoreCall {
    /// Its `call` label in the Prometheus text and the facade.
    pub fn name(self) -> &'static str {
        match self {
            StoreCall::Claim => "claim",
            StoreCall::Finish => "finish",
            StoreCall::Maintenance => "maintenance",
            StoreCall::NextDue => "next_due",
        }
    }

    pub(crate) fn index(self) -> usize {
        self as usize
    }
}

/// Receives what txbox observes: counts, the pollers' delays, batch send
/// times, commit-to-ack ages, the outbox gauges, the SQL stores' calls. Every method has a default
/// that does nothing: implement the ones you want. Called on the hot path
/// (the relay's threads, a publish): keep them cheap and never block.
///
/// ```
/// use std::sync::atomic::{AtomicU64, Ordering};
/// use txbox::metrics::{Count, Observer};
///
/// #[derive(Default)]
/// struct Acked(AtomicU64);
///
/// impl Observer for Acked {
///     fn count(&self, what: Count, n: u64) {
///         if what == Count::Sent {
///             self.0.fetch_add(n, Ordering::Relaxed);
///         }
///     }
/// }
/// ```
pub trait Observer: Send + Sync {
    /// `n` more of `what` happened.
    fn count(&self, what: Count, n: u64) {
        let _ = (what, n);
    }

    /// The poller of `event_type` waits `delay` before its next claim.
    fn polling_delay(&self, event_type: &str, delay: Duration) {
        let _ = (event_type, delay);
    }

    /// A batch took `took` from its send to the broker's acks.
    fn send_latency(&self, took: Duration) {
        let _ = took;
    }

    /// An event the broker acked just now was created `age` ago (its UUIDv7
    /// time).
    fn commit_to_ack(&self, age: Duration) {
        let _ = age;
    }

    /// The outbox per event type and the dead letters' count, as read from
    /// the store by the relay's recovery thread ([`record_status`] sets the
    /// process-wide registry's and the facade's).
    fn outbox_status(&self, status: &[TypeStatus], dlq_size: u64) {
        let _ = (status, dlq_size);
    }

    /// How full PostgreSQL's notification queue is (0 to 1).
    fn notify_queue_usage(&self, usage: f64) {
        let _ = usage;
    }

    /// The paused event types ([`Pauses`](crate::Pauses)), read by the
    /// relay's recovery thread with the outbox's status.
    fn paused(&self, event_types: &[String]) {
        let _ = event_types;
    }

    /// The poller of `event_type` can (`true`) or cannot reach its broker:
    /// said when it changes (a connect that failed, a batch given back
    /// because the transport failed, a connection made again).
    fn broker_ready(&self, event_type: &str, ready: bool) {
        let _ = (event_type, ready);
    }

    /// A SQL store built from the configuration ([`Config::connect`](crate::Config::connect),
    /// the stores' `connect` and `PgStore::from_pool`) made `call`, which took
    /// `took`; `ok`: it returned no error (a deadlock retried within it is
    /// part of the call). A store reports to the observer of the
    /// configuration it was built from: one connected before
    /// [`Config::observed`](crate::Config::observed) reports to the one before.
    fn store_call(&self, call: StoreCall, took: Duration, ok: bool) {
        let _ = (call, took, ok);
    }
}

impl<O: Observer + ?Sized> Observer for Arc<O> {
    fn count(&self, what: Count, n: u64) {
        (**self).count(what, n);
    }
    fn polling_delay(&self, event_type: &str, delay: Duration) {
        (**self).polling_delay(event_type, delay);
    }
    fn send_latency(&self, took: Duration) {
        (**self).send_latency(took);
    }
    fn commit_to_ack(&self, age: Duration) {
        (**self).commit_to_ack(age);
    }
    fn outbox_status(&self, status: &[TypeStatus], dlq_size: u64) {
        (**self).outbox_status(status, dlq_size);
    }
    fn notify_queue_usage(&self, usage: f64) {
        (**self).notify_queue_usage(usage);
    }
    fn paused(&self, event_types: &[String]) {
        (**self).paused(event_types);
    }
    fn broker_ready(&self, event_type: &str, ready: bool) {
        (**self).broker_ready(event_type, ready);
    }
    fn store_call(&self, call: StoreCall, took: Duration, ok: bool) {
        (**self).store_call(call, took, ok);
    }
}

static GLOBAL: LazyLock<Registry> = LazyLock::new(Registry::new);

/// The process-wide registry: what every part of txbox whose configuration
/// names no observer of its own reports to.
pub fn global() -> &'static Registry {
    &GLOBAL
}

/// The default observer: the process-wide registry and (feature `metrics`)
/// the facade.
struct ProcessWide;

impl ProcessWide {
    /// Hands `f` each observer the default reports to.
    fn each(f: impl Fn(&dyn Observer)) {
        f(&*GLOBAL);
        #[cfg(feature = "metrics")]
        f(&Facade);
    }
}

impl Observer for ProcessWide {
    fn count(&self, what: Count, n: u64) {
        Self::each(|o| o.count(what, n));
    }
    fn polling_delay(&self, event_type: &str, delay: Duration) {
        Self::each(|o| o.polling_delay(event_type, delay));
    }
    fn send_latency(&self, took: Duration) {
        Self::each(|o| o.send_latency(took));
    }
    fn commit_to_ack(&self, age: Duration) {
        Self::each(|o| o.commit_to_ack(age));
    }
    fn outbox_status(&self, status: &[TypeStatus], dlq_size: u64) {
        Self::each(|o| o.outbox_status(status, dlq_size));
    }
    fn notify_queue_usage(&self, usage: f64) {
        Self::each(|o| o.notify_queue_usage(usage));
    }
    fn paused(&self, event_types: &[String]) {
        Self::each(|o| o.paused(event_types));
    }
    fn broker_ready(&self, event_type: &str, ready: bool) {
        Self::each(|o| o.broker_ready(event_type, ready));
    }
    fn store_call(&self, call: StoreCall, took: Duration, ok: bool) {
        Self::each(|o| o.store_call(call, took, ok));
    }
}

static PROCESS_WIDE: LazyLock<Arc<dyn Observer>> = LazyLock::new(|| Arc::new(ProcessWide));

/// The observer a [`Config`](crate::Config) carries to the parts built from
/// it. Configurations compare equal when they carry the same observer (the
/// same `Arc`'s value).
#[derive(Clone)]
pub(crate) struct Observed(Arc<dyn Observer>);

impl Observed {
    pub(crate) fn new(observer: Arc<dyn Observer>) -> Self {
        Observed(observer)
    }

    fn is_default(&self) -> bool {
        *self == Observed::default()
    }

    /// Runs `f`, a store's `call`, and reports how long it took.
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn timed<T>(
        &self,
        call: StoreCall,
        f: impl FnOnce() -> crate::Result<T>,
    ) -> crate::Result<T> {
        let start = std::time::Instant::now();
        let result = f();
        self.0.store_call(call, start.elapsed(), result.is_ok());
        result
    }

    /// Counts `n` of `what` (nothing for zero).
    pub(crate) fn add(&self, what: Count, n: u64) {
        if n > 0 {
            self.0.count(what, n);
        }
    }

    /// Records the commit-to-ack age of events the broker acked just now (an
    /// event id is a UUIDv7: its timestamp is the publish time).
    pub(crate) fn acked(&self, ids: impl IntoIterator<Item = crate::EventId>) {
        let now = std::time::SystemTime::now();
        for id in ids {
            let Some(ts) = id.as_uuid().get_timestamp() else {
                continue;
            };
            let (secs, nanos) = ts.to_unix();
            let created = std::time::UNIX_EPOCH + Duration::new(secs, nanos);
            if let Ok(age) = now.duration_since(created) {
                self.0.commit_to_ack(age);
            }
        }
    }
}

impl std::ops::Deref for Observed {
    type Target = dyn Observer;
    fn deref(&self) -> &(dyn Observer + 'static) {
        &*self.0
    }
}

impl Default for Observed {
    fn default() -> Self {
        Observed(PROCESS_WIDE.clone())
    }
}

impl PartialEq for Observed {
    fn eq(&self, other: &Self) -> bool {
        // the same value, whatever vtable each `Arc<dyn Observer>` was given
        std::ptr::addr_eq(Arc::as_ptr(&self.0), Arc::as_ptr(&other.0))
    }
}

impl std::fmt::Debug for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let which = if self.is_default() {
            "process-wide"
        } else {
            "of its own"
        };
        write!(f, "Observed({which})")
    }
}

/// Sets the outbox gauges (pending, in process, failed, oldest pending age per
/// type; DLQ size) of the process-wide registry and the facade to counts read
/// from a store. The relay does it on each recovery run, for its
/// configuration's observer; between runs, read them yourself:
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// use txbox::{DeadLetterStore, DlqFilter, MaintenanceStore};
/// # let store = txbox::Config::builder().build()?.connect("sqlite:jobs.db")?;
/// txbox::metrics::record_status(store.status()?, store.dlq_count(&DlqFilter::default())?);
/// # Ok(()) }
/// ```
pub fn record_status(status: Vec<TypeStatus>, dlq_size: u64) {
    ProcessWide.outbox_status(&status, dlq_size);
}

/// Every metric of the process-wide registry now.
pub fn snapshot() -> MetricsSnapshot {
    GLOBAL.snapshot()
}

/// Every metric of the process-wide registry in the Prometheus text
/// exposition format.
pub fn prometheus() -> String {
    GLOBAL.prometheus()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_is_its_own_row() {
        for (i, (c, _, _)) in COUNTERS.iter().enumerate() {
            assert_eq!(index(*c), i, "{c:?}");
        }
        for (i, c) in STORE_CALLS.iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
        }
    }
}
