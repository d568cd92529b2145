//! Process-wide metrics: counters, gauges and histograms of every outbox, relay and
//! inbox in the process.
//!
//! Read them as a [`MetricsSnapshot`] ([`snapshot`]), as Prometheus text
//! ([`prometheus`]), or, with the feature `metrics`, through the `metrics` facade
//! crate, so an application's existing exporter picks them up (names as in the
//! Prometheus text).
//!
//! ```
//! let snap = txbox::metrics::snapshot();
//! let text = txbox::metrics::prometheus();
//! assert!(text.contains("txbox_events_sent_total"));
//! # let _ = snap;
//! ```

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use crate::store::TypeStatus;

/// A counter txbox keeps; its discriminant is its row in [`COUNTERS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counter {
    Published,
    Sent,
    Failed,
    Retried,
    MovedToDlq,
    Recovered,
    Cleaned,
    InboxConsumed,
    InboxDuplicates,
    CacheHits,
    CacheMisses,
    OrderedSkipped,
}

const COUNTERS: [(Counter, &str, &str); 12] = [
    (
        Counter::Published,
        "txbox_events_published_total",
        "Events written into business transactions",
    ),
    (
        Counter::Sent,
        "txbox_events_sent_total",
        "Events the broker acked",
    ),
    (
        Counter::Failed,
        "txbox_events_failed_total",
        "Sends that failed with no retry left (the event became FAILED)",
    ),
    (
        Counter::Retried,
        "txbox_events_retried_total",
        "Sends that failed and were scheduled for a retry",
    ),
    (
        Counter::MovedToDlq,
        "txbox_events_moved_to_dlq_total",
        "Events moved to the dead letters",
    ),
    (
        Counter::Recovered,
        "txbox_events_recovered_total",
        "In-process events returned to pending after their lease",
    ),
    (
        Counter::Cleaned,
        "txbox_rows_cleaned_total",
        "Processed events, resolved dead letters and inbox ids deleted",
    ),
    (
        Counter::InboxConsumed,
        "txbox_inbox_consumed_total",
        "Events the inbox handled",
    ),
    (
        Counter::InboxDuplicates,
        "txbox_inbox_duplicates_total",
        "Duplicates the inbox skipped",
    ),
    (
        Counter::CacheHits,
        "txbox_inbox_cache_hits_total",
        "Inbox cache look-ups that hit",
    ),
    (
        Counter::CacheMisses,
        "txbox_inbox_cache_misses_total",
        "Inbox cache look-ups that missed",
    ),
    (
        Counter::OrderedSkipped,
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

struct Registry {
    counters: [AtomicU64; COUNTERS.len()],
    polling_delay: Mutex<BTreeMap<String, f64>>,
    outbox: Mutex<Option<(Vec<TypeStatus>, u64)>>,
    notify_queue_usage: Mutex<Option<f64>>,
    send_latency: Histogram,
    commit_to_ack: Histogram,
}

static REGISTRY: LazyLock<Registry> = LazyLock::new(|| Registry {
    counters: Default::default(),
    polling_delay: Mutex::new(BTreeMap::new()),
    outbox: Mutex::new(None),
    notify_queue_usage: Mutex::new(None),
    send_latency: Histogram::new(),
    commit_to_ack: Histogram::new(),
});

fn index(c: Counter) -> usize {
    c as usize
}

pub(crate) fn add(c: Counter, n: u64) {
    if n == 0 {
        return;
    }
    REGISTRY.counters[index(c)].fetch_add(n, Ordering::Relaxed);
    #[cfg(feature = "metrics")]
    metrics::counter!(COUNTERS[index(c)].1).increment(n);
}

pub(crate) fn polling_delay(event_type: &str, d: Duration) {
    let mut m = REGISTRY
        .polling_delay
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    m.insert(event_type.to_string(), d.as_secs_f64());
    #[cfg(feature = "metrics")]
    metrics::gauge!("txbox_polling_delay_seconds", "event_type" => event_type.to_string())
        .set(d.as_secs_f64());
}

pub(crate) fn send_latency(d: Duration) {
    REGISTRY.send_latency.record(d.as_secs_f64());
    #[cfg(feature = "metrics")]
    metrics::histogram!("txbox_send_latency_seconds").record(d.as_secs_f64());
}

/// Records the commit-to-ack age of events the broker acked just now (an event id
/// is a UUIDv7: its timestamp is the publish time).
pub(crate) fn acked(ids: impl IntoIterator<Item = crate::EventId>) {
    let now = std::time::SystemTime::now();
    #[cfg(feature = "metrics")]
    let facade = metrics::histogram!("txbox_commit_to_ack_seconds");
    for id in ids {
        let Some(ts) = id.as_uuid().get_timestamp() else {
            continue;
        };
        let (secs, nanos) = ts.to_unix();
        let created = std::time::UNIX_EPOCH + Duration::new(secs, nanos);
        if let Ok(age) = now.duration_since(created) {
            REGISTRY.commit_to_ack.record(age.as_secs_f64());
            #[cfg(feature = "metrics")]
            facade.record(age.as_secs_f64());
        }
    }
}

/// Sets the outbox gauges (pending, in process, failed, oldest pending age per
/// type; DLQ size) to counts read from a store. The relay does it on each
/// recovery run; between runs, read them yourself:
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// use txbox::{DeadLetterStore, DlqFilter, MaintenanceStore};
/// # let store = txbox::Config::builder().build()?.connect("sqlite:jobs.db")?;
/// txbox::metrics::record_status(store.status()?, store.dlq_count(&DlqFilter::default())?);
/// # Ok(()) }
/// ```
pub fn record_status(status: Vec<TypeStatus>, dlq_size: u64) {
    #[cfg(feature = "metrics")]
    {
        for s in &status {
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
    *REGISTRY.outbox.lock().unwrap_or_else(|p| p.into_inner()) = Some((status, dlq_size));
}

/// Sets the notification queue's usage gauge (0 to 1; PostgreSQL), which the
/// relay reads on each recovery run.
pub(crate) fn notify_queue_usage(usage: f64) {
    #[cfg(feature = "metrics")]
    metrics::gauge!("txbox_notify_queue_usage").set(usage);
    *REGISTRY
        .notify_queue_usage
        .lock()
        .unwrap_or_else(|p| p.into_inner()) = Some(usage);
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

/// Every metric now.
pub fn snapshot() -> MetricsSnapshot {
    let r = &*REGISTRY;
    let c = |k: Counter| r.counters[index(k)].load(Ordering::Relaxed);
    let outbox = r.outbox.lock().unwrap_or_else(|p| p.into_inner()).clone();
    MetricsSnapshot {
        events_published: c(Counter::Published),
        events_sent: c(Counter::Sent),
        events_failed: c(Counter::Failed),
        events_retried: c(Counter::Retried),
        events_moved_to_dlq: c(Counter::MovedToDlq),
        events_recovered: c(Counter::Recovered),
        rows_cleaned: c(Counter::Cleaned),
        inbox_consumed: c(Counter::InboxConsumed),
        inbox_duplicates: c(Counter::InboxDuplicates),
        inbox_cache_hits: c(Counter::CacheHits),
        inbox_cache_misses: c(Counter::CacheMisses),
        ordered_skipped: c(Counter::OrderedSkipped),
        dlq_size: outbox.as_ref().map(|o| o.1),
        outbox: outbox.map(|o| o.0).unwrap_or_default(),
        notify_queue_usage: *r
            .notify_queue_usage
            .lock()
            .unwrap_or_else(|p| p.into_inner()),
        polling_delay_seconds: r
            .polling_delay
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone(),
        send_latency: r.send_latency.snapshot(),
        commit_to_ack: r.commit_to_ack.snapshot(),
    }
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every metric in the Prometheus text exposition format.
pub fn prometheus() -> String {
    use std::fmt::Write;
    let s = snapshot();
    let r = &*REGISTRY;
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
