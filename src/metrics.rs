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

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use crate::store::TypeStatus;

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

/// Histogram bucket bounds, in seconds.
pub const BUCKETS: [f64; 14] = [
    0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
];

struct Histogram {
    /// Observations per bucket alone (not cumulative): one add per observation.
    buckets: [AtomicU64; 14],
    count: AtomicU64,
    sum_micros: AtomicU64,
}

impl Histogram {
    fn new() -> Self {
        Histogram {
            buckets: Default::default(),
            count: AtomicU64::new(0),
            sum_micros: AtomicU64::new(0),
        }
    }

    fn record(&self, seconds: f64) {
        // above the last bound: only in +Inf, which is the count
        if let Some(i) = BUCKETS.iter().position(|bound| seconds <= *bound) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_micros
            .fetch_add((seconds.max(0.0) * 1e6) as u64, Ordering::Relaxed);
    }

    fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: BUCKETS
                .iter()
                .zip(&self.buckets)
                .scan(0, |below, (b, c)| {
                    *below += c.load(Ordering::Relaxed);
                    Some((*b, *below))
                })
                .collect(),
            count: self.count.load(Ordering::Relaxed),
            sum_seconds: self.sum_micros.load(Ordering::Relaxed) as f64 / 1e6,
        }
    }
}

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

/// Receives what txbox observes: counts, the pollers' delays, batch send
/// times, commit-to-ack ages, the outbox gauges. Every method has a default
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
}

/// An [`Observer`] that keeps every metric, to read as a [`MetricsSnapshot`]
/// or as Prometheus text. The process has one ([`global`]), which every part
/// of txbox reports to unless its configuration names another
/// ([`Config::observed`](crate::Config::observed)).
pub struct Registry {
    counters: [AtomicU64; COUNTERS.len()],
    polling_delay: Mutex<BTreeMap<String, f64>>,
    outbox: Mutex<Option<(Vec<TypeStatus>, u64)>>,
    notify_queue_usage: Mutex<Option<f64>>,
    send_latency: Histogram,
    commit_to_ack: Histogram,
}

impl Default for Registry {
    fn default() -> Self {
        Registry::new()
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Registry {
            counters: Default::default(),
            polling_delay: Mutex::new(BTreeMap::new()),
            outbox: Mutex::new(None),
            notify_queue_usage: Mutex::new(None),
            send_latency: Histogram::new(),
            commit_to_ack: Histogram::new(),
        }
    }

    /// Every metric now.
    pub fn snapshot(&self) -> MetricsSnapshot {
        let c = |k: Count| self.counters[index(k)].load(Ordering::Relaxed);
        let outbox = lock(&self.outbox).clone();
        MetricsSnapshot {
            events_published: c(Count::Published),
            events_sent: c(Count::Sent),
            events_failed: c(Count::Failed),
            events_retried: c(Count::Retried),
            events_moved_to_dlq: c(Count::MovedToDlq),
            events_recovered: c(Count::Recovered),
            rows_cleaned: c(Count::Cleaned),
            inbox_consumed: c(Count::InboxConsumed),
            inbox_duplicates: c(Count::InboxDuplicates),
            inbox_cache_hits: c(Count::CacheHits),
            inbox_cache_misses: c(Count::CacheMisses),
            ordered_skipped: c(Count::OrderedSkipped),
            dlq_size: outbox.as_ref().map(|o| o.1),
            outbox: outbox.map(|o| o.0).unwrap_or_default(),
            notify_queue_usage: *lock(&self.notify_queue_usage),
            polling_delay_seconds: lock(&self.polling_delay).clone(),
            send_latency: self.send_latency.snapshot(),
            commit_to_ack: self.commit_to_ack.snapshot(),
        }
    }

    /// Every metric in the Prometheus text exposition format.
    pub fn prometheus(&self) -> String {
        use std::fmt::Write;
        let s = self.snapshot();
        let r = self;
        let mut out = String::new();
        for (k, name, help) in COUNTERS {
            let _ = writeln!(
                out,
                "# HELP {name} {help}\n# TYPE {name} counter\n{name} {}",
                r.counters[index(k)].load(Ordering::Relaxed)
            );
        }
        type Gauge = (&'static str, &'static str, fn(&TypeStatus) -> f64);
        let gauges: [Gauge; 4] = [
            ("txbox_outbox_pending", "Events waiting to be sent", |t| {
                t.pending as f64
            }),
            (
                "txbox_outbox_in_process",
                "Events claimed by a relay",
                |t| t.in_process as f64,
            ),
            (
                "txbox_outbox_failed",
                "Events waiting for the move to the dead letters",
                |t| t.failed as f64,
            ),
            (
                "txbox_outbox_oldest_pending_age_seconds",
                "Age of the oldest pending event",
                |t| t.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64()),
            ),
        ];
        for (name, help, f) in gauges {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} gauge");
            for t in &s.outbox {
                let _ = writeln!(
                    out,
                    "{name}{{event_type=\"{}\"}} {}",
                    label(&t.event_type),
                    f(t)
                );
            }
        }
        if let Some(n) = s.dlq_size {
            let _ = writeln!(
                out,
                "# HELP txbox_dlq_size Dead letters\n# TYPE txbox_dlq_size gauge\ntxbox_dlq_size {n}"
            );
        }
        if let Some(u) = s.notify_queue_usage {
            let _ = writeln!(
                out,
                "# HELP txbox_notify_queue_usage How full PostgreSQL's notification queue is (0 to 1)\n\
                 # TYPE txbox_notify_queue_usage gauge\ntxbox_notify_queue_usage {u}"
            );
        }
        let _ = writeln!(out, "# HELP txbox_polling_delay_seconds Current polling delay\n# TYPE txbox_polling_delay_seconds gauge");
        for (t, d) in &s.polling_delay_seconds {
            let _ = writeln!(
                out,
                "txbox_polling_delay_seconds{{event_type=\"{}\"}} {d}",
                label(t)
            );
        }
        for (name, help, h) in [
            (
                "txbox_send_latency_seconds",
                "Batch send until the broker's acks",
                &s.send_latency,
            ),
            (
                "txbox_commit_to_ack_seconds",
                "Event creation to the broker's ack",
                &s.commit_to_ack,
            ),
        ] {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
            for (b, c) in &h.buckets {
                let _ = writeln!(out, "{name}_bucket{{le=\"{b}\"}} {c}");
            }
            let _ = writeln!(
                out,
                "{name}_bucket{{le=\"+Inf\"}} {}\n{name}_sum {}\n{name}_count {}",
                h.count, h.sum_seconds, h.count
            );
        }
        out
    }
}

impl Observer for Registry {
    fn count(&self, what: Count, n: u64) {
        self.counters[index(what)].fetch_add(n, Ordering::Relaxed);
    }
    fn polling_delay(&self, event_type: &str, delay: Duration) {
        lock(&self.polling_delay).insert(event_type.to_string(), delay.as_secs_f64());
    }
    fn send_latency(&self, took: Duration) {
        self.send_latency.record(took.as_secs_f64());
    }
    fn commit_to_ack(&self, age: Duration) {
        self.commit_to_ack.record(age.as_secs_f64());
    }
    fn outbox_status(&self, status: &[TypeStatus], dlq_size: u64) {
        *lock(&self.outbox) = Some((status.to_vec(), dlq_size));
    }
    fn notify_queue_usage(&self, usage: f64) {
        *lock(&self.notify_queue_usage) = Some(usage);
    }
}

/// An [`Observer`] that hands every metric to the `metrics` facade crate,
/// under the names of the Prometheus text (feature `metrics`). Part of the
/// default observer.
#[cfg(feature = "metrics")]
#[derive(Debug, Clone, Copy, Default)]
pub struct Facade;

#[cfg(feature = "metrics")]
impl Observer for Facade {
    fn count(&self, what: Count, n: u64) {
        metrics::counter!(what.name()).increment(n);
    }
    fn polling_delay(&self, event_type: &str, delay: Duration) {
        metrics::gauge!("txbox_polling_delay_seconds", "event_type" => event_type.to_string())
            .set(delay.as_secs_f64());
    }
    fn send_latency(&self, took: Duration) {
        metrics::histogram!("txbox_send_latency_seconds").record(took.as_secs_f64());
    }
    fn commit_to_ack(&self, age: Duration) {
        metrics::histogram!("txbox_commit_to_ack_seconds").record(age.as_secs_f64());
    }
    fn outbox_status(&self, status: &[TypeStatus], dlq_size: u64) {
        for s in status {
            let t = s.event_type.clone();
            metrics::gauge!("txbox_outbox_pending", "event_type" => t.clone())
                .set(s.pending as f64);
            metrics::gauge!("txbox_outbox_in_process", "event_type" => t.clone())
                .set(s.in_process as f64);
            metrics::gauge!("txbox_outbox_failed", "event_type" => t.clone()).set(s.failed as f64);
            let age = s.oldest_pending_age.map_or(0.0, |d| d.as_secs_f64());
            metrics::gauge!("txbox_outbox_oldest_pending_age_seconds", "event_type" => t).set(age);
        }
        metrics::gauge!("txbox_dlq_size").set(dlq_size as f64);
    }
    fn notify_queue_usage(&self, usage: f64) {
        metrics::gauge!("txbox_notify_queue_usage").set(usage);
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

impl Observer for ProcessWide {
    fn count(&self, what: Count, n: u64) {
        GLOBAL.count(what, n);
        #[cfg(feature = "metrics")]
        Facade.count(what, n);
    }
    fn polling_delay(&self, event_type: &str, delay: Duration) {
        GLOBAL.polling_delay(event_type, delay);
        #[cfg(feature = "metrics")]
        Facade.polling_delay(event_type, delay);
    }
    fn send_latency(&self, took: Duration) {
        GLOBAL.send_latency(took);
        #[cfg(feature = "metrics")]
        Facade.send_latency(took);
    }
    fn commit_to_ack(&self, age: Duration) {
        GLOBAL.commit_to_ack(age);
        #[cfg(feature = "metrics")]
        Facade.commit_to_ack(age);
    }
    fn outbox_status(&self, status: &[TypeStatus], dlq_size: u64) {
        GLOBAL.outbox_status(status, dlq_size);
        #[cfg(feature = "metrics")]
        Facade.outbox_status(status, dlq_size);
    }
    fn notify_queue_usage(&self, usage: f64) {
        GLOBAL.notify_queue_usage(usage);
        #[cfg(feature = "metrics")]
        Facade.notify_queue_usage(usage);
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

/// A histogram's state: cumulative bucket counts by upper bound (seconds).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct HistogramSnapshot {
    /// `(upper bound in seconds, observations <= bound)`.
    pub buckets: Vec<(f64, u64)>,
    /// Observations.
    pub count: u64,
    /// Sum of observations, in seconds.
    pub sum_seconds: f64,
}

/// Every metric at one moment.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct MetricsSnapshot {
    /// Events written into business transactions (counted before their commit).
    pub events_published: u64,
    /// Events the broker acked.
    pub events_sent: u64,
    /// Sends that failed with no retry left.
    pub events_failed: u64,
    /// Sends that failed and were scheduled for a retry.
    pub events_retried: u64,
    /// Events moved to the dead letters.
    pub events_moved_to_dlq: u64,
    /// Events recovered after their lease expired.
    pub events_recovered: u64,
    /// Rows deleted by the cleanups.
    pub rows_cleaned: u64,
    /// Events the inbox handled.
    pub inbox_consumed: u64,
    /// Duplicates the inbox skipped.
    pub inbox_duplicates: u64,
    /// Inbox cache hits.
    pub inbox_cache_hits: u64,
    /// Inbox cache misses.
    pub inbox_cache_misses: u64,
    /// Events of ordered types with `on_poison = "skip"` that used up their
    /// retries: their key went on without them.
    pub ordered_skipped: u64,
    /// The outbox per event type, as of the relay's last recovery run (or the last
    /// [`record_status`]).
    pub outbox: Vec<TypeStatus>,
    /// Dead letters, as of the same moment.
    pub dlq_size: Option<u64>,
    /// How full PostgreSQL's notification queue is (0 to 1), as of the relay's
    /// last recovery run; at 0.5 commits stop notifying and the relay polls.
    pub notify_queue_usage: Option<f64>,
    /// The current polling delay of each poller, in seconds.
    pub polling_delay_seconds: BTreeMap<String, f64>,
    /// Duration of each batch send (until the broker's acks).
    pub send_latency: HistogramSnapshot,
    /// From an event's creation (its UUIDv7 time) to the broker's ack.
    pub commit_to_ack: HistogramSnapshot,
}

/// Every metric of the process-wide registry now.
pub fn snapshot() -> MetricsSnapshot {
    GLOBAL.snapshot()
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
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
    }

    #[test]
    fn histogram_buckets_are_cumulative() {
        let h = Histogram::new();
        for s in [0.0005, 0.003, 0.003, 0.7, 120.0] {
            h.record(s);
        }
        let snap = h.snapshot();
        let at = |bound: f64| snap.buckets.iter().find(|(b, _)| *b == bound).unwrap().1;
        assert_eq!(at(0.001), 1);
        assert_eq!(at(0.005), 3);
        assert_eq!(at(0.5), 3);
        assert_eq!(at(1.0), 4);
        assert_eq!(at(60.0), 4, "120 s is only in +Inf");
        assert_eq!(snap.count, 5);
    }
}
