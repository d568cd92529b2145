//! What a broker says that the database or the poller must survive: an error text
//! with a NUL byte, a broker that cannot be reached.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use serde_json::json;
use txbox::{Config, EventId, EventSettings, MemorySender, NewEvent, Outbox, Relay};

use super::fast;

/// A broker's error text with a NUL byte (which PostgreSQL's text refuses) is
/// stored escaped: the attempt is counted and the row goes on to its retry, instead
/// of a finish that fails and a row sent again forever after each lease.
#[test]
fn an_error_text_with_a_nul_byte_is_stored_and_counted() {
    let p = "t_rel_nul_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("n", |e: EventSettings| {
            fast(e)
                .lease(Duration::from_secs(60))
                .max_retries(3)
                .backoff_delay(Duration::from_secs(60))
        })
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = MemorySender::new();
    sender.fail_when(|_| Some("broker said \0 no".to_string()));
    let relay = Relay::start(store, &config, sender).unwrap();
    let mut tx = client.transaction().unwrap();
    let id = outbox.publish(&mut tx, "n", &json!({})).unwrap();
    tx.commit().unwrap();
    let mut row: Option<(String, i32, Option<String>)> = None;
    wait_until(
        "the failed attempt is recorded",
        Duration::from_secs(10),
        || {
            let r = client
                .query_one(
                    &format!(
                        "SELECT status, attempts, last_error FROM {p}outbox_events WHERE id = $1"
                    ),
                    &[&id.as_uuid()],
                )
                .unwrap();
            row = Some((r.get(0), r.get(1), r.get(2)));
            r.get::<_, i32>(1) == 1
        },
    );
    relay.shutdown(Duration::from_secs(10)).unwrap();
    let (status, _, error) = row.unwrap();
    assert_eq!(status, "PENDING", "waiting for its retry");
    assert_eq!(error.as_deref(), Some("broker said \\0 no"));
}

/// A sender that cannot reach its broker until the test lets it: counts the
/// readiness checks and the sends.
#[derive(Clone, Default)]
pub(super) struct Unreachable {
    pub(super) reachable: Arc<std::sync::atomic::AtomicBool>,
    pub(super) checks: Arc<AtomicUsize>,
    pub(super) sent: MemorySender,
}

impl txbox::Sender for Unreachable {
    fn send(&mut self, events: &[txbox::Event]) -> Vec<Result<(), txbox::SendError>> {
        self.sent.send(events)
    }

    fn ready(&mut self) -> Result<(), txbox::SendError> {
        self.checks.fetch_add(1, Ordering::Relaxed);
        if self.reachable.load(Ordering::Relaxed) {
            Ok(())
        } else {
            Err(txbox::SendError::transient("broker down"))
        }
    }
}

/// While the sender says the broker cannot be reached, the poller claims nothing:
/// the events stay PENDING, unclaimed, with no attempt counted, and nothing is
/// sent; once it can, every event goes out.
#[test]
fn a_sender_that_is_not_ready_gets_no_claims() {
    let p = "t_rel_unready_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("u", |e: EventSettings| fast(e).max_retries(0))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = Unreachable::default();
    let factory = {
        let s = sender.clone();
        move || -> txbox::Result<Box<dyn txbox::Sender>> { Ok(Box::new(s.clone())) }
    };
    let relay = Relay::start(store, &config, factory).unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, NewEvent::batch("u", 0..5).unwrap())
        .unwrap();
    tx.commit().unwrap();
    // counted from the commit, so the events were there to claim at each check
    let before = sender.checks.load(Ordering::Relaxed);
    wait_until(
        "the poller asked again and again",
        Duration::from_secs(10),
        || sender.checks.load(Ordering::Relaxed) >= before + 4,
    );
    assert!(sender.sent.is_empty(), "nothing sent while not ready");
    let untouched: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {p}outbox_events \
                 WHERE status = 'PENDING' AND attempts = 0 AND claim_token IS NULL"
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(untouched, 5, "claimed nothing, counted nothing");

    sender.reachable.store(true, Ordering::Relaxed);
    assert_eq!(sender.sent.wait_for(5, Duration::from_secs(10)), 5);
    let sent: HashSet<EventId> = sender.sent.sent().iter().map(|e| e.id).collect();
    assert_eq!(sent, ids.into_iter().collect());
    relay.shutdown(Duration::from_secs(5)).unwrap();
}
