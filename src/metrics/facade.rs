//! The `metrics` facade as an [`Observer`] (feature `metrics`).

use std::time::Duration;

use super::{Count, Observer, StoreCall};
use crate::status::TypeStatus;

/// An [`Observer`] that hands every metric to the `metrics` facade crate,
/// under the names of the Prometheus text (feature `metrics`). Part of the
/// default observer.
#[derive(Debug, Clone, Copy, Default)]
pub struct Facade;

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
    fn paused(&self, event_types: &[String]) {
        // the types paused at the last call: one resumed since goes to 0
        static LAST: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        let mut last = LAST.lock().unwrap_or_else(|p| p.into_inner());
        for t in last.iter().filter(|t| !event_types.contains(t)) {
            metrics::gauge!("txbox_event_type_paused", "event_type" => t.clone()).set(0.0);
        }
        for t in event_types {
            metrics::gauge!("txbox_event_type_paused", "event_type" => t.clone()).set(1.0);
        }
        *last = event_types.to_vec();
    }
    fn broker_ready(&self, event_type: &str, ready: bool) {
        let up = if ready { 1.0 } else { 0.0 };
        metrics::gauge!("txbox_broker_up", "event_type" => event_type.to_owned()).set(up);
    }
    fn store_call(&self, call: StoreCall, took: Duration, ok: bool) {
        metrics::histogram!("txbox_store_call_seconds", "call" => call.name())
            .record(took.as_secs_f64());
        if !ok {
            metrics::counter!("txbox_store_errors_total", "call" => call.name()).increment(1);
        }
    }
}
