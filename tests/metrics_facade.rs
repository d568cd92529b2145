//! With the feature `metrics`, txbox's metrics reach the application's recorder
//! through the `metrics` facade.
#![cfg(feature = "metrics")]

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::backend::{Backend, Fixture};
use metrics::{
    Counter, CounterFn, Gauge, GaugeFn, Histogram, HistogramFn, Key, KeyName, Metadata, Recorder,
    SharedString, Unit,
};
use txbox::{Config, MemorySender, Relay};

#[derive(Default)]
struct Seen {
    counters: Mutex<HashMap<String, Arc<Total>>>,
    gauges: Mutex<HashMap<String, Arc<Total>>>,
    histograms: Mutex<HashMap<String, Arc<Total>>>,
}

#[derive(Default)]
struct Total(AtomicU64);

impl CounterFn for Total {
    fn increment(&self, v: u64) {
        self.0.fetch_add(v, Ordering::Relaxed);
    }
    fn absolute(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }
}
impl GaugeFn for Total {
    fn increment(&self, _: f64) {}
    fn decrement(&self, _: f64) {}
    fn set(&self, v: f64) {
        self.0.store(v as u64 + 1, Ordering::Relaxed); // +1: "was set"
    }
}
impl HistogramFn for Total {
    fn record(&self, _: f64) {
        self.0.fetch_add(1, Ordering::Relaxed);
    }
}

struct Rec(&'static Seen);

fn entry(map: &Mutex<HashMap<String, Arc<Total>>>, key: &Key) -> Arc<Total> {
    map.lock()
        .unwrap()
        .entry(key.name().to_string())
        .or_default()
        .clone()
}

impl Recorder for Rec {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(entry(&self.0.counters, key))
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(entry(&self.0.gauges, key))
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::from_arc(entry(&self.0.histograms, key))
    }
}

fn value(map: &Mutex<HashMap<String, Arc<Total>>>, name: &str) -> u64 {
    map.lock()
        .unwrap()
        .get(name)
        .map_or(0, |t| t.0.load(Ordering::Relaxed))
}

#[test]
fn an_application_recorder_sees_txbox_metrics() {
    let seen: &'static Seen = Box::leak(Box::default());
    metrics::set_global_recorder(Rec(seen)).expect("the only recorder of this test binary");
    let p = "t_metrics_facade_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let c = Config::builder()
        .table_prefix(p)
        .defaults(|e| {
            e.adaptive_polling(Duration::from_millis(10), Duration::from_millis(100), 1.5)
        })
        .event("e", |e| e)
        .maintenance(|m| m.recovery_interval(Duration::from_millis(100)))
        .build()
        .unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(fx.store.clone(), &c, sender.clone()).unwrap();
    fx.publish(&c, "e", 4, true);
    common::wait_until(
        "the metrics through the facade",
        Duration::from_secs(10),
        || {
            value(&seen.counters, "txbox_events_sent_total") == 4
                && value(&seen.gauges, "txbox_dlq_size") > 0
                && value(&seen.gauges, "txbox_polling_delay_seconds") > 0
        },
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
    // the only test of this binary: the counts are exact
    assert_eq!(value(&seen.counters, "txbox_events_sent_total"), 4);
    assert_eq!(value(&seen.counters, "txbox_events_published_total"), 4);
    assert!((1..=4).contains(&value(&seen.histograms, "txbox_send_latency_seconds")));
    assert_eq!(value(&seen.histograms, "txbox_commit_to_ack_seconds"), 4);
    // the store's calls (its configuration's observer is the default): at
    // least the claim and the finish that sent the 4 events, none failed
    assert!(value(&seen.histograms, "txbox_store_call_seconds") >= 2);
    assert_eq!(value(&seen.counters, "txbox_store_errors_total"), 0);
}
