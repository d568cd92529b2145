//! Delivery, failure and retry, cleanup and shutdown: events reach the sender,
//! a failing one reaches the dead letters, a stopped relay finishes what the broker has.

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use txbox::store::ClaimStore;

use crate::common::*;
use serde_json::json;
use txbox::{
    ClaimMode, Config, Dlq, DlqStatus, EventId, EventSettings, MemorySender, Outbox, Relay,
};

use super::{fast, ms};

#[test]
fn committed_events_are_delivered_with_key_headers_and_destination() {
    let p = "t_rel_basic_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(fast)
        .event("order-created", |e| e.destination("orders"))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();

    let mut tx = client.transaction().unwrap();
    outbox
        .publish(&mut tx, "order-created", &json!({"rolled": true}))
        .unwrap();
    tx.rollback().unwrap();
    let mut tx = client.transaction().unwrap();
    let ev = txbox::NewEvent::new("order-created", &json!({"id": 1}))
        .unwrap()
        .key("o-1")
        .header("trace", "t-1");
    let id = outbox.publish_all(&mut tx, [ev]).unwrap()[0];
    tx.commit().unwrap();

    wait_until("the event is processed", Duration::from_secs(10), || {
        count(&mut client, p, "PROCESSED") == 1
    });
    let sent = sender.sent();
    assert_eq!(sent.len(), 1, "the rolled-back event is never sent");
    let e = &sent[0];
    assert_eq!(e.id, id);
    assert_eq!(e.event_type, "order-created");
    assert_eq!(e.destination, "orders");
    assert_eq!(e.key.as_deref(), Some("o-1"));
    assert_eq!(
        e.headers,
        BTreeMap::from([("trace".to_string(), "t-1".to_string())])
    );
    assert_eq!(e.payload_str(), Some(r#"{"id":1}"#));
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

#[test]
fn failing_sender_backs_off_fails_moves_to_dlq_and_retry_delivers() {
    let p = "t_rel_fail_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("pay", |e| {
            e.fixed_polling(ms(20))
                .max_retries(2)
                .backoff_delay(ms(700))
                .backoff_multiplier(2.0)
                .backoff_jitter(0.0)
        })
        .dlq(|d| d.enabled(true))
        .dlq(|d| d.move_interval(ms(100)))
        .dlq(|d| d.retry_interval(ms(100)))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = MemorySender::new();
    let attempts_at = Arc::new(Mutex::new(Vec::<Instant>::new()));
    let seen = attempts_at.clone();
    sender.fail_when(move |_| {
        seen.lock().unwrap().push(Instant::now());
        Some("broker said no".into())
    });
    let relay = Relay::start(store.clone(), &config, sender.clone()).unwrap();

    let mut tx = client.transaction().unwrap();
    let id = outbox
        .publish(&mut tx, "pay", &json!({"amount": 5}))
        .unwrap();
    tx.commit().unwrap();

    // first failure: PENDING, attempts 1, next attempt ~700ms after now, error kept
    let row_sql = format!(
        "SELECT status, attempts, last_error, extract(epoch FROM next_attempt_at - now())::float8 \
         FROM {p}outbox_events WHERE id = $1"
    );
    let mut first = None;
    wait_until("the first failed attempt", Duration::from_secs(10), || {
        let r = client.query_one(&row_sql, &[&id.as_uuid()]).unwrap();
        if r.get::<_, i32>(1) == 1 {
            first = Some((
                r.get::<_, String>(0),
                r.get::<_, Option<String>>(2),
                r.get::<_, f64>(3),
            ));
        }
        first.is_some()
    });
    let (status, error, due_in) = first.unwrap();
    assert_eq!(status, "PENDING");
    assert_eq!(error.as_deref(), Some("broker said no"));
    assert!(
        due_in > 0.3 && due_in <= 0.7,
        "next attempt in {due_in}s, backoff 700ms"
    );

    // retries used up -> FAILED -> moved to the dead letters
    let dlq = Dlq::new(store.clone());
    wait_until("the dead letter", Duration::from_secs(15), || {
        dlq.get(id).is_ok()
    });
    let dead = dlq.get(id).unwrap();
    assert_eq!(dead.status, DlqStatus::Dead);
    assert_eq!(dead.attempts, 3, "first try + 2 retries");
    assert_eq!(dead.last_error.as_deref(), Some("broker said no"));
    assert_eq!(dead.payload_str(), Some(r#"{"amount":5}"#));
    assert_eq!(
        count(&mut client, p, "FAILED") + count(&mut client, p, "PENDING"),
        0
    );
    let times = attempts_at.lock().unwrap().clone();
    assert_eq!(times.len(), 3);
    let gap1 = times[1] - times[0];
    let gap2 = times[2] - times[1];
    assert!(
        gap1 >= ms(650) && gap1 < ms(3000),
        "first retry after {gap1:?}, want ~700ms"
    );
    assert!(
        gap2 >= ms(1350) && gap2 < ms(4000),
        "second retry after {gap2:?}, want ~1400ms"
    );

    // an operator retries it; the broker is back; it is delivered with a fresh budget
    sender.succeed_all();
    dlq.retry(id).unwrap();
    assert_eq!(dlq.get(id).unwrap().status, DlqStatus::Retry);
    wait_until(
        "delivery after the DLQ retry",
        Duration::from_secs(10),
        || sender.sent().iter().any(|e| e.id == id),
    );
    wait_until("the row is processed", Duration::from_secs(10), || {
        count(&mut client, p, "PROCESSED") == 1
    });
    assert!(dlq.get(id).is_err(), "no longer a dead letter");
    assert_eq!(sender.sent()[0].attempts, 0, "fresh retry budget");
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

#[test]
fn thread_counts_and_an_idle_relay_shuts_down_at_once() {
    let p = "t_rel_threads_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let slow = |e: txbox::EventSettings| {
        e.adaptive_polling(Duration::from_secs(60), Duration::from_secs(60), 1.5)
    };
    let types = |b: txbox::ConfigBuilder| b.event("a", |e| e).event("b", |e| e).event("c", |e| e);
    // polling only: no listener
    let base = types(
        Config::builder()
            .table_prefix(p)
            .defaults(|e| slow(e).wake(txbox::Wake::Poll)),
    );
    let config = base.clone().dlq(|d| d.enabled(false)).build().unwrap();
    let relay = Relay::start(store.clone(), &config, MemorySender::new()).unwrap();
    assert_eq!(relay.thread_count(), 2 + 3);
    assert_eq!(
        relay.thread_names(),
        [
            "txbox-poll-a",
            "txbox-poll-b",
            "txbox-poll-c",
            "txbox-recovery",
            "txbox-cleanup"
        ]
    );
    std::thread::sleep(ms(300)); // let every thread reach its 1-minute sleep
    let t = Instant::now();
    relay.shutdown(Duration::from_secs(5)).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "shutdown took {:?}",
        t.elapsed()
    );

    // the DLQ is on by default
    let config = base.build().unwrap();
    let relay = Relay::start(store.clone(), &config, MemorySender::new()).unwrap();
    assert_eq!(relay.thread_count(), 5 + 3);
    std::thread::sleep(ms(300));
    relay.shutdown(Duration::from_secs(5)).unwrap();

    // the wake-up on commit (the default): one listener thread on PostgreSQL
    let config = types(Config::builder().table_prefix(p).defaults(slow))
        .build()
        .unwrap();
    let relay = Relay::start(store, &config, MemorySender::new()).unwrap();
    assert_eq!(relay.thread_count(), 6 + 3);
    assert!(relay.thread_names().contains(&"txbox-listen".to_string()));
    std::thread::sleep(ms(300));
    let t = Instant::now();
    relay.shutdown(Duration::from_secs(5)).unwrap();
    assert!(
        t.elapsed() < ms(300),
        "shutdown with the listener took {:?}",
        t.elapsed()
    );
}

/// A pipelining sender whose acks wait for a gate the test opens.
#[derive(Clone, Default)]
struct Gated {
    queue: Arc<Mutex<std::collections::VecDeque<Vec<txbox::Event>>>>,
    starts: Arc<Mutex<usize>>,
    open: Arc<(Mutex<bool>, std::sync::Condvar)>,
    acked: Arc<Mutex<Vec<EventId>>>,
}

impl txbox::Sender for Gated {
    fn send(&mut self, events: &[txbox::Event]) -> Vec<Result<(), txbox::SendError>> {
        events
            .iter()
            .map(|_| Err(txbox::SendError::new("use start")))
            .collect()
    }
    fn start(&mut self, events: &[txbox::Event]) -> txbox::sender::Started {
        self.queue.lock().unwrap().push_back(events.to_vec());
        *self.starts.lock().unwrap() += 1;
        txbox::sender::Started::InFlight
    }
    fn wait(&mut self) -> Vec<Result<(), txbox::SendError>> {
        let (lock, cv) = &*self.open;
        let mut open = lock.lock().unwrap();
        while !*open {
            open = cv.wait(open).unwrap();
        }
        drop(open);
        let batch = self.queue.lock().unwrap().pop_front().unwrap_or_default();
        self.acked
            .lock()
            .unwrap()
            .extend(batch.iter().map(|e| e.id));
        batch.iter().map(|_| Ok(())).collect()
    }
}

#[test]
fn with_no_processed_ttl_acked_rows_are_deleted_and_failed_ones_stay() {
    let p = "t_rel_del_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e: EventSettings| {
            fast(e)
                .batch_size(40)
                .max_retries(5)
                .backoff_delay(ms(3_600_000))
        })
        .event("d", |e| e)
        .maintenance(|m| m.processed_ttl(Duration::ZERO))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = MemorySender::new();
    // one event of every ten is refused by the broker
    sender.fail_when(|e| e.payload.ends_with(b"7").then(|| "refused".to_string()));
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("d", 0..100).unwrap())
        .unwrap();
    tx.commit().unwrap();

    let rows = |c: &mut postgres::Client| -> i64 {
        c.query_one(&format!("SELECT count(*) FROM {p}outbox_events"), &[])
            .unwrap()
            .get(0)
    };
    wait_until("the acked rows deleted", Duration::from_secs(10), || {
        rows(&mut client) == 10
    });
    relay.shutdown(Duration::from_secs(5)).unwrap();
    let acked: HashSet<EventId> = sender.sent().iter().map(|e| e.id).collect();
    assert_eq!(acked.len(), 90, "every acked event was sent");
    assert_eq!(
        count(&mut client, p, "PROCESSED"),
        0,
        "none marked PROCESSED"
    );
    // the refused ones wait for their retry, attempts counted; none of them was acked
    assert_eq!(count(&mut client, p, "PENDING"), 10);
    let left: Vec<uuid::Uuid> = client
        .query(
            &format!("SELECT id FROM {p}outbox_events WHERE attempts = 1 ORDER BY id"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let refused: Vec<uuid::Uuid> = ids
        .iter()
        .enumerate()
        .filter(|(i, _)| i % 10 == 7)
        .map(|(_, id)| id.as_uuid())
        .collect();
    assert_eq!(left, refused);
    assert!(refused
        .iter()
        .all(|id| !acked.contains(&EventId::from(*id))));
}

each_claim_mode!(failures_in_a_backlog, "t_rel_flaky":
    failed_sends_in_a_backlog_are_retried_and_delivered_once,
    failed_sends_in_a_backlog_of_held_claims_are_retried_and_delivered_once,
    failed_sends_in_a_backlog_of_deleting_held_claims_are_retried_and_delivered_once);

/// A backlog drained while the broker refuses every tenth event once: those are
/// counted, wait for their retry and are delivered; every event is acked exactly
/// once. With held claims the refused events' finish goes with the next claim (and,
/// deleting acked rows, writes them back).
fn failures_in_a_backlog(p: &str, claim: ClaimMode, delete: bool) {
    refusals_in_a_backlog(p, claim, delete, false);
}

each_claim_mode!(outage_in_a_backlog, "t_rel_outage":
    transport_failures_in_a_backlog_count_no_attempt,
    transport_failures_in_a_held_backlog_count_no_attempt,
    transport_failures_in_a_deleting_held_backlog_count_no_attempt);

/// As [`failures_in_a_backlog`], but the refusals are transport failures (the
/// broker could not be reached): the refused events go back to PENDING with no
/// attempt counted, so even with no retry allowed none becomes FAILED.
fn outage_in_a_backlog(p: &str, claim: ClaimMode, delete: bool) {
    refusals_in_a_backlog(p, claim, delete, true);
}

fn refusals_in_a_backlog(p: &str, claim: ClaimMode, delete: bool, transient: bool) {
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let defaults = |e: EventSettings| {
        fast(e)
            .batch_size(100)
            .max_retries(if transient { 0 } else { 3 })
            .backoff_delay(ms(200))
            .backoff_jitter(0.0)
    };
    let config = crate::common::mode_config(p, defaults, claim, delete)
        .event("f", |e| e)
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("f", 0..2000).unwrap())
        .unwrap();
    tx.commit().unwrap();
    let refuse: HashSet<EventId> = ids.iter().step_by(10).copied().collect();
    let refused = Arc::new(Mutex::new(HashSet::new()));
    let sender = MemorySender::new();
    let (r, seen) = (refuse.clone(), refused.clone());
    let refusal = move |e: &txbox::Event| {
        (r.contains(&e.id) && seen.lock().unwrap().insert(e.id)).then(|| "not now".to_string())
    };
    if transient {
        sender.fail_transiently_when(refusal);
    } else {
        sender.fail_when(refusal);
    }
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    wait_until("every event acked", Duration::from_secs(30), || {
        sender.len() >= ids.len()
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();

    assert_eq!(*refused.lock().unwrap(), refuse, "each was refused once");
    let acked: Vec<EventId> = sender.sent().iter().map(|e| e.id).collect();
    let unique: HashSet<EventId> = acked.iter().copied().collect();
    assert_eq!(acked.len(), unique.len(), "an event acked twice");
    assert_eq!(unique, ids.iter().copied().collect::<HashSet<_>>());
    // the refused ones counted their failed attempt before they went through
    let rows: Vec<(uuid::Uuid, i32, String)> = client
        .query(
            &format!("SELECT id, attempts, status FROM {p}outbox_events"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    if delete {
        assert!(rows.is_empty(), "acked rows left: {}", rows.len());
    } else {
        assert_eq!(rows.len(), ids.len());
        for (id, attempts, status) in rows {
            let want = i32::from(!transient && refuse.contains(&EventId::from_uuid(id)));
            assert_eq!((attempts, status.as_str()), (want, "PROCESSED"), "{id}");
        }
    }
}

each_claim_mode!(shutdown_finishes, "t_rel_drain":
    shutdown_finishes_the_batches_in_flight,
    shutdown_finishes_the_held_batches_in_flight,
    shutdown_finishes_the_deleting_held_batches_in_flight);

/// A relay stopped while batches are with the broker: every acked event is
/// finished (PROCESSED or deleted), the rest is PENDING and free to claim. With
/// held claims the batch finished last waits to go with the next claim (one round
/// trip), and the stop finishes it on its own.
fn shutdown_finishes(p: &str, claim: ClaimMode, delete: bool) {
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = crate::common::mode_config(p, |e: EventSettings| fast(e), claim, delete)
        .event("e", |e| e.batch_size(100).in_flight(3))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("e", 0..2000).unwrap())
        .unwrap();
    tx.commit().unwrap();

    let sender = Gated::default();
    let s = sender.clone();
    let relay = Relay::start(store.clone(), &config, move || {
        Ok(Box::new(s.clone()) as Box<dyn txbox::Sender>)
    })
    .unwrap();
    // three batches with the broker, the poller waiting for the first one's acks
    wait_until("three batches started", Duration::from_secs(10), || {
        *sender.starts.lock().unwrap() >= 3
    });
    let stopping = std::thread::spawn(move || relay.shutdown(Duration::from_secs(20)));
    {
        let (lock, cv) = &*sender.open;
        *lock.lock().unwrap() = true;
        cv.notify_all();
    }
    stopping.join().unwrap().unwrap();

    let acked = sender.acked.lock().unwrap().clone();
    let unique: HashSet<EventId> = acked.iter().copied().collect();
    assert_eq!(unique.len(), acked.len(), "an event acked twice");
    assert!(acked.len() >= 300, "the batches in flight were acked");
    let ids = |client: &mut postgres::Client, status: &str| -> HashSet<EventId> {
        client
            .query(
                &format!("SELECT id FROM {p}outbox_events WHERE status = $1"),
                &[&status],
            )
            .unwrap()
            .iter()
            .map(|r| EventId::from_uuid(r.get(0)))
            .collect()
    };
    let processed = ids(&mut client, "PROCESSED");
    let pending = ids(&mut client, "PENDING");
    if delete {
        assert!(processed.is_empty());
    } else {
        assert_eq!(processed, unique, "every acked event is PROCESSED");
    }
    assert!(
        pending.is_disjoint(&unique),
        "an acked event is still pending"
    );
    assert_eq!(
        pending.len() + unique.len(),
        2000,
        "the rest is still pending"
    );
    assert_eq!(
        count(&mut client, p, "IN_PROCESS"),
        0,
        "nothing left claimed"
    );
    // and nothing left locked: another claim takes the rest at once
    let rest = store
        .claim("e", 2000, Duration::from_secs(60), uuid::Uuid::now_v7())
        .unwrap();
    assert_eq!(rest.len(), pending.len());
}
