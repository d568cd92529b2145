//! The registry: an [`Observer`] that keeps every metric, read as a
//! [`MetricsSnapshot`] or as Prometheus text.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use super::{index, Count, Observer, StoreCall, COUNTERS, STORE_CALLS};
use crate::status::TypeStatus;

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

/// An [`Observer`] that keeps every metric, to read as a [`MetricsSnapshot`]
/// or as Prometheus text. The process has one ([`global`](super::global)), which every part
/// of txbox reports to unless its configuration names another
/// ([`Config::observed`](crate::Config::observed)).
pub struct Registry {
    counters: [AtomicU64; COUNTERS.len()],
    polling_delay: Mutex<BTreeMap<String, f64>>,
    outbox: Mutex<Option<(Vec<TypeStatus>, u64)>>,
    notify_queue_usage: Mutex<Option<f64>>,
    paused: Mutex<Vec<String>>,
    broker_up: Mutex<BTreeMap<String, bool>>,
    send_latency: Histogram,
    commit_to_ack: Histogram,
    /// By [`StoreCall::index`].
    store_calls: [Histogram; STORE_CALLS.len()],
    store_errors: [AtomicU64; STORE_CALLS.len()],
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
            paused: Mutex::new(Vec::new()),
            broker_up: Mutex::new(BTreeMap::new()),
            send_latency: Histogram::new(),
            commit_to_ack: Histogram::new(),
            store_calls: std::array::from_fn(|_| Histogram::new()),
            store_errors: Default::default(),
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
            paused: lock(&self.paused).clone(),
            broker_up: lock(&self.broker_up).clone(),
            polling_delay_seconds: lock(&self.polling_delay).clone(),
            send_latency: self.send_latency.snapshot(),
            commit_to_ack: self.commit_to_ack.snapshot(),
            store_call_seconds: STORE_CALLS
                .iter()
                .map(|c| (c.name().to_owned(), self.store_calls[c.index()].snapshot()))
                .collect(),
            store_errors: STORE_CALLS
                .iter()
                .map(|c| {
                    let n = self.store_errors[c.index()].load(Ordering::Relaxed);
                    (c.name().to_owned(), n)
                })
                .collect(),
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
        // 1 for each paused type, 0 for the other types the outbox has
        let _ = writeln!(
            out,
            "# HELP txbox_event_type_paused Whether the event type is paused (no relay claims it)\n\
             # TYPE txbox_event_type_paused gauge"
        );
        let running = s.outbox.iter().map(|t| &t.event_type);
        let mut types: BTreeMap<&String, u8> = running.map(|t| (t, 0)).collect();
        types.extend(s.paused.iter().map(|t| (t, 1)));
        for (t, paused) in types {
            let _ = writeln!(
                out,
                "txbox_event_type_paused{{event_type=\"{}\"}} {paused}",
                label(t)
            );
        }
        if !s.broker_up.is_empty() {
            let _ = writeln!(
                out,
                "# HELP txbox_broker_up Whether the poller of the event type can reach its broker\n\
                 # TYPE txbox_broker_up gauge"
            );
            for (t, up) in &s.broker_up {
                let _ = writeln!(
                    out,
                    "txbox_broker_up{{event_type=\"{}\"}} {}",
                    label(t),
                    u8::from(*up)
                );
            }
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
            histogram(&mut out, name, "", h);
        }
        let name = "txbox_store_call_seconds";
        let _ = writeln!(
            out,
            "# HELP {name} A SQL store's calls (claim, finish, maintenance)\n# TYPE {name} histogram"
        );
        for (call, h) in &s.store_call_seconds {
            histogram(&mut out, name, &format!("call=\"{call}\","), h);
        }
        let _ = writeln!(
            out,
            "# HELP txbox_store_errors_total A SQL store's calls that failed\n\
             # TYPE txbox_store_errors_total counter"
        );
        for (call, n) in &s.store_errors {
            let _ = writeln!(out, "txbox_store_errors_total{{call=\"{call}\"}} {n}");
        }
        out
    }
}

/// Writes the rows of one histogram, each with `labels` (`a="b",` or nothing).
fn histogram(out: &mut String, name: &str, labels: &str, h: &HistogramSnapshot) {
    use std::fmt::Write;
    for (b, c) in &h.buckets {
        let _ = writeln!(out, "{name}_bucket{{{labels}le=\"{b}\"}} {c}");
    }
    let plain = labels.trim_end_matches(',');
    let braces = if plain.is_empty() {
        String::new()
    } else {
        format!("{{{plain}}}")
    };
    let _ = writeln!(
        out,
        "{name}_bucket{{{labels}le=\"+Inf\"}} {}\n{name}_sum{braces} {}\n{name}_count{braces} {}",
        h.count, h.sum_seconds, h.count
    );
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
    fn paused(&self, event_types: &[String]) {
        *lock(&self.paused) = event_types.to_vec();
    }
    fn broker_ready(&self, event_type: &str, ready: bool) {
        lock(&self.broker_up).insert(event_type.to_owned(), ready);
    }
    fn store_call(&self, call: StoreCall, took: Duration, ok: bool) {
        self.store_calls[call.index()].record(took.as_secs_f64());
        if !ok {
            self.store_errors[call.index()].fetch_add(1, Ordering::Relaxed);
        }
    }
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
    /// [`record_status`](super::record_status)).
    pub outbox: Vec<TypeStatus>,
    /// Dead letters, as of the same moment.
    pub dlq_size: Option<u64>,
    /// How full PostgreSQL's notification queue is (0 to 1), as of the relay's
    /// last recovery run; at 0.5 commits stop notifying and the relay polls.
    pub notify_queue_usage: Option<f64>,
    /// The paused event types ([`Pauses`](crate::Pauses)), as of the relay's
    /// last recovery run.
    pub paused: Vec<String>,
    /// Whether each event type's poller can reach its broker (the last
    /// change its poller saw: a failed connect or a batch given back because
    /// the transport failed, a connection made again).
    pub broker_up: BTreeMap<String, bool>,
    /// The current polling delay of each poller, in seconds.
    pub polling_delay_seconds: BTreeMap<String, f64>,
    /// Duration of each batch send (until the broker's acks).
    pub send_latency: HistogramSnapshot,
    /// From an event's creation (its UUIDv7 time) to the broker's ack.
    pub commit_to_ack: HistogramSnapshot,
    /// How long a SQL store's calls took, by [`StoreCall::name`] (`claim`,
    /// `finish`, `maintenance`).
    pub store_call_seconds: BTreeMap<String, HistogramSnapshot>,
    /// A SQL store's calls that failed, by [`StoreCall::name`].
    pub store_errors: BTreeMap<String, u64>,
}

fn label(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

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
