//! The relay against a real PostgreSQL, with the in-memory sender standing in for
//! the broker (the relay's logic is under test here, not a broker).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use txbox::{ClaimStore, DeadLetterStore, FullStore, InboxStore, MaintenanceStore, Store};

use crate::common::*;
use serde_json::json;
use txbox::{
    ClaimArgs, ClaimMode, Config, Dlq, DlqStatus, EventId, EventSettings, MemorySender, NewEvent,
    Outbox, Outcome, Relay,
};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn fast(e: EventSettings) -> EventSettings {
    e.adaptive_polling(ms(10), ms(100), 1.5)
}

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
        .dlq(true)
        .dlq_move_interval(ms(100))
        .dlq_retry_interval(ms(100))
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
    let config = base.clone().dlq(false).build().unwrap();
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

each_claim_mode!(killed_connections, "t_rel_kill":
    killed_database_connections_lose_nothing,
    killed_database_connections_holding_claims_lose_nothing,
    killed_database_connections_deleting_in_held_claims_lose_nothing);

/// Kills the relay's database connections again and again while a producer
/// publishes: every event is delivered, the relay's threads live on. `delete`:
/// acked rows are deleted (`processed_ttl` zero).
fn killed_connections(p: &str, claim: ClaimMode, delete: bool) {
    let app = format!("txbox_kill_{claim:?}_{delete}");
    let app = app.as_str();
    let Some((store, mut client)) = fresh_with_url(p, &pg_url_as(app)) else {
        return;
    };
    // a claim whose connection dies before its reply is committed but unseen: its
    // rows come back after the lease, so the lease is short here
    let defaults = |e: EventSettings| fast(e).batch_size(50).lease(Duration::from_secs(2));
    let config = crate::common::mode_config(p, defaults, claim, delete)
        .event("k", |e| e)
        .recovery_interval(ms(200))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();

    let producer = {
        let outbox = outbox.clone();
        std::thread::spawn(move || {
            let mut c = crate::common::client().unwrap();
            let mut ids = Vec::new();
            for i in 0..40 {
                let mut tx = c.transaction().unwrap();
                let payloads: Vec<_> = (0..50).map(|j| json!({"n": i * 50 + j})).collect();
                ids.extend(
                    outbox
                        .publish_all(&mut tx, txbox::NewEvent::batch("k", &payloads).unwrap())
                        .unwrap(),
                );
                tx.commit().unwrap();
                std::thread::sleep(ms(25));
            }
            ids
        })
    };
    let mut kills = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while (!producer.is_finished() || kills < 5) && Instant::now() < deadline {
        kills += (kill_backends(&mut client, app) > 0) as usize;
        std::thread::sleep(ms(150));
    }
    let published: Vec<EventId> = producer.join().unwrap();
    assert_eq!(published.len(), 2000);
    wait_until("every event delivered", Duration::from_secs(60), || {
        let got: HashSet<EventId> = sender.sent().iter().map(|e| e.id).collect();
        published.iter().all(|id| got.contains(id))
    });
    let done = if delete { 0 } else { 2000 };
    wait_until("all rows processed", Duration::from_secs(60), || {
        let rows: i64 = client
            .query_one(&format!("SELECT count(*) FROM {p}outbox_events"), &[])
            .unwrap()
            .get(0);
        rows == done && count(&mut client, p, "PROCESSED") == done
    });
    assert!(kills >= 5, "connections were killed {kills} times");
    // one poller, five maintenance threads, the commit listener
    assert_eq!(relay.thread_count(), 7, "no relay thread died");
    let delivered: HashSet<EventId> = sender.sent().iter().map(|e| e.id).collect();
    let duplicates = sender.len() - delivered.len();
    let lost = published
        .iter()
        .filter(|id| !delivered.contains(id))
        .count();
    eprintln!(
        "{claim:?} claims (acked rows deleted: {delete}), killed connections {kills} times: \
         delivered {}, duplicates {duplicates}, lost {lost}",
        delivered.len()
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

#[test]
fn pooled_connections_killed_are_tested_and_replaced() {
    let p = "t_rel_pool_";
    let app = "txbox_pool_test";
    let Some((store, mut client)) = fresh_with_url(p, &pg_url_as(app)) else {
        return;
    };
    // every backend of the store's pool, until none is listed (the pool may be
    // opening one in the background)
    // returns how many it killed
    let kill_all = |c: &mut postgres::Client| {
        let mut killed = 0;
        wait_until("the store's backends gone", Duration::from_secs(10), || {
            let n = kill_backends(c, app);
            killed += n;
            n == 0
        });
        killed
    };
    store.ping().unwrap();
    // killed after sitting unused past the bypass window: the check-out test finds
    // the dead connection, and the call goes through on a new one
    kill_all(&mut client);
    std::thread::sleep(ms(600)); // longer than the pool's 500 ms bypass window
    store
        .ping()
        .expect("a connection idle past the window is tested");
    assert!(store.status().unwrap().is_empty());

    // killed right after use: the next call may fail once per dead connection
    // (the pool may have opened a second one meanwhile), and the pool drops
    // each, so the call after them works
    store.ping().unwrap();
    for _ in 0..kill_all(&mut client) {
        let _ = store.ping();
    }
    store.ping().expect("the dead connections were dropped");

    // a pool of the caller's keeps r2d2's test of every check-out: a connection
    // killed right after use is found dead before the call, not by it
    let manager = r2d2_postgres::PostgresConnectionManager::new(
        pg_url_as(app).parse().unwrap(),
        postgres::NoTls,
    );
    let pool = r2d2::Pool::builder().max_size(4).build(manager).unwrap();
    let theirs = txbox::PgStore::from_pool(pool, &crate::common::prefix_config(p)).unwrap();
    theirs.ping().unwrap();
    kill_all(&mut client);
    theirs
        .ping()
        .expect("the pool tested the dead connection and opened another");
}

#[test]
fn cleanup_deletes_old_processed_rows_under_the_lock() {
    let p = "t_rel_clean_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(fast)
        .event("c", |e| e)
        .processed_ttl(ms(500))
        .cleanup_interval(ms(100))
        .maintenance_batch_size(7)
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("c", 0..30).unwrap())
        .unwrap();
    tx.commit().unwrap();

    // another instance holds the cleanup lock: nothing is deleted
    let other = uuid::Uuid::now_v7();
    assert!(store
        .try_lock("txbox-cleanup-processed", other, Duration::from_secs(60))
        .unwrap());
    let sender = MemorySender::new();
    let relay = Relay::start(store.clone(), &config, sender.clone()).unwrap();
    wait_until("30 processed", Duration::from_secs(10), || {
        count(&mut client, p, "PROCESSED") == 30
    });
    std::thread::sleep(ms(1000)); // past the TTL, several cleanup rounds
    assert_eq!(
        count(&mut client, p, "PROCESSED"),
        30,
        "the lock holder alone cleans"
    );
    store.unlock("txbox-cleanup-processed", other).unwrap();
    wait_until("cleanup in batches of 7", Duration::from_secs(10), || {
        count(&mut client, p, "PROCESSED") == 0
    });
    relay.shutdown(Duration::from_secs(5)).unwrap();

    // the batch bound, directly
    let mut tx = client.transaction().unwrap();
    outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("c", 0..20).unwrap())
        .unwrap();
    tx.commit().unwrap();
    let t = uuid::Uuid::now_v7();
    let claimed = store.claim("c", 100, Duration::from_secs(60), t).unwrap();
    let done: Vec<_> = claimed.iter().map(|e| (e.id, Outcome::Sent)).collect();
    store.finish(t, &done).unwrap();
    assert_eq!(
        store
            .delete_processed(Duration::from_secs(3600), 5)
            .unwrap(),
        0,
        "younger than the TTL"
    );
    std::thread::sleep(ms(20));
    assert_eq!(store.delete_processed(ms(10), 5).unwrap(), 5);
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
    fn start(&mut self, events: &[txbox::Event]) -> txbox::Started {
        self.queue.lock().unwrap().push_back(events.to_vec());
        *self.starts.lock().unwrap() += 1;
        txbox::Started::InFlight
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
        .processed_ttl(Duration::ZERO)
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

/// `claim = "lock"`: the relay holds each batch's rows locked in an open
/// transaction instead of stamping them, and finishes them in it.
#[test]
fn held_claims_deliver_every_event_and_finish_in_their_transaction() {
    let p = "t_rel_held_";
    let app = "txbox_held_test";
    let Some((store, mut client)) = fresh_with_url(p, &pg_url_as(app)) else {
        return;
    };
    held_backlog(p, store, &mut client);
    // the refused ones wait for their retry with the attempt counted, never claimed
    // under a token
    let (pending, attempts, stamped): (i64, i64, i64) = {
        let r = client
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE status = 'PENDING'), \
                       coalesce(sum(attempts) FILTER (WHERE status = 'PENDING'), 0)::int8, \
                       count(*) FILTER (WHERE claim_token IS NOT NULL OR status = 'IN_PROCESS') \
                     FROM {p}outbox_events"
                ),
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!((pending, attempts, stamped), (100, 100, 0));
    // every held transaction ended: none of the store's sessions is left in one
    assert_eq!(open_transactions(&mut client, app), 0);
}

/// Drains a backlog of 1,000 events of type "h" with held claims (batches of 40,
/// 3 in flight) from `store` into a sender that refuses every tenth event; checks
/// that each acked event was sent once and the refused ones were not.
fn held_backlog(p: &str, store: Arc<impl FullStore>, client: &mut postgres::Client) {
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e: EventSettings| {
            fast(e)
                .batch_size(40)
                .in_flight(3)
                .claim(ClaimMode::Lock)
                .max_retries(5)
                .backoff_delay(ms(3_600_000))
        })
        .event("h", |e| e)
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = MemorySender::new();
    sender.fail_when(|e| e.payload.ends_with(b"7").then(|| "refused".to_string()));
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("h", 0..1000).unwrap())
        .unwrap();
    tx.commit().unwrap();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    wait_until("the acked rows processed", Duration::from_secs(20), || {
        count(client, p, "PROCESSED") == 900
    });
    relay.shutdown(Duration::from_secs(5)).unwrap();

    let sent = sender.sent();
    let acked: HashSet<EventId> = sent.iter().map(|e| e.id).collect();
    assert_eq!(acked.len(), 900);
    assert_eq!(sent.len(), 900, "no event sent twice");
    assert!(ids
        .iter()
        .enumerate()
        .all(|(i, id)| (i % 10 == 7) != acked.contains(id)));
}

/// How many sessions of application `app` idle in an open transaction.
fn open_transactions(client: &mut postgres::Client, app: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
            &[&app],
        )
        .unwrap()
        .get(0)
}

#[test]
fn a_held_claim_hides_its_rows_until_it_ends_and_a_lost_one_changes_nothing() {
    held_claim_semantics("t_rel_holdx_", false);
}

/// With acked rows deleted, a held claim deletes its rows in the held transaction:
/// the same guarantees, and the events not acked come back as they were.
#[test]
fn a_deleting_held_claim_hides_its_rows_and_writes_back_what_was_not_acked() {
    held_claim_semantics("t_rel_holdd_", true);
}

/// The rows of `p`'s outbox: id, key, headers, payload, created_at, in id order.
fn snapshot(
    client: &mut postgres::Client,
    p: &str,
) -> Vec<(uuid::Uuid, Option<String>, String, String, String)> {
    client
        .query(
            &format!(
                "SELECT id, event_key, headers::text, payload, created_at::text \
                 FROM {p}outbox_events ORDER BY id"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// An outbox on the tables of prefix `p` with the one event type `x`.
fn outbox_of_x(p: &str) -> Outbox {
    let config = Config::builder()
        .table_prefix(p)
        .event("x", |e| e)
        .build()
        .unwrap();
    Outbox::new(&config).unwrap()
}

fn held_claim_semantics(p: &str, delete_acked: bool) {
    let app = format!("txbox_{p}test");
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let outbox = outbox_of_x(p);
    let mut tx = client.transaction().unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        // keys and headers (quotes, backslashes) must survive a write-back
        let e = NewEvent::new("x", &json!({"n": i, "s": r"it's \ here"}))
            .unwrap()
            .key(format!("k'{i}"))
            .header("h", r#"a"b\c"#);
        ids.push(outbox.publish_all(&mut tx, [e]).unwrap()[0]);
    }
    tx.commit().unwrap();
    let before = snapshot(&mut client, p);
    let other =
        txbox::PgStore::connect(&pg_url_as(&app), &crate::common::prefix_config(p)).unwrap();
    let lease = Duration::from_secs(60);
    let claim_x = ClaimArgs::new("x", 100, lease).delete_acked(delete_acked);
    let token = uuid::Uuid::now_v7();
    let sent = |events: &[txbox::Event]| -> Vec<(EventId, Outcome)> {
        let acked = if delete_acked {
            Outcome::SentDelete
        } else {
            Outcome::Sent
        };
        events.iter().map(|e| (e.id, acked.clone())).collect()
    };

    let (events, held) = store.claim_held(&claim_x).unwrap();
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    assert_eq!(events[0].key.as_deref(), Some("k'0"));
    assert_eq!(
        events[0].headers.get("h").map(String::as_str),
        Some(r#"a"b\c"#)
    );
    // the rows stay PENDING to others, locked: another relay gets none of them, in
    // either mode
    assert_eq!(count(&mut client, p, "PENDING"), 10);
    let (none, no_tx) = other.claim_held(&claim_x).unwrap();
    assert!(none.is_empty() && no_tx.is_none());
    assert!(other.claim("x", 100, lease, token).unwrap().is_empty());
    // a claim dropped unfinished (a panicking poller) rolls back: the rows are free
    drop(held);
    let (again, held) = other.claim_held(&claim_x).unwrap();
    assert_eq!(again.len(), 10);
    // its connection dies before the finish: the late finish fails, nothing changes,
    // and the rows are free again at once, not after the lease
    assert!(kill_backends(&mut client, &app) > 0);
    let late = held.unwrap().finish(&again, &sent(&again));
    assert!(late.is_err(), "a finish on a dead connection fails");
    assert_eq!(count(&mut client, p, "PENDING"), 10);
    assert_eq!(snapshot(&mut client, p), before);
    let (last, held) = store.claim_held(&claim_x).unwrap();
    assert_eq!(last.len(), 10);
    // failed sends count an attempt: a retry waits, the last one fails
    let mut outcomes = sent(&last);
    outcomes[0].1 = Outcome::Retry {
        delay: Duration::from_secs(3600),
        // written into the finish script as a literal: quotes and backslashes kept
        error: r"broker's \busy\".into(),
    };
    outcomes[1].1 = Outcome::Failed {
        error: "gone".into(),
    };
    assert_eq!(held.unwrap().finish(&last, &outcomes).unwrap(), 10);
    let processed = if delete_acked { 0 } else { 8 };
    assert_eq!(count(&mut client, p, "PROCESSED"), processed);
    assert_eq!(count(&mut client, p, "FAILED"), 1);
    let r = client
        .query_one(
            &format!(
                "SELECT attempts, last_error, next_attempt_at > now() + interval '50 minutes' \
                 FROM {p}outbox_events WHERE status = 'PENDING'"
            ),
            &[],
        )
        .unwrap();
    assert_eq!(
        (
            r.get::<_, i32>(0),
            r.get::<_, String>(1),
            r.get::<_, bool>(2)
        ),
        (1, r"broker's \busy\".to_string(), true)
    );
    // the two events not acked keep their key, headers, payload and age
    let after = snapshot(&mut client, p);
    let kept = if delete_acked {
        &before[..2]
    } else {
        &before[..]
    };
    assert_eq!(after, kept);
    let (later, none) = store.claim_held(&claim_x).unwrap();
    assert!(later.is_empty() && none.is_none(), "the retry is not due");
}

#[test]
fn a_held_batch_finishes_and_claims_the_next_in_one_call() {
    finish_and_claim("t_rel_fc_", false);
}

#[test]
fn a_deleting_held_batch_finishes_and_claims_the_next_in_one_call() {
    finish_and_claim("t_rel_fcd_", true);
}

/// `HeldBatch::finish_and_claim`: the finish applies and commits, the next rows
/// are held by a new transaction on the same connection, and when nothing is left
/// that transaction is committed too.
fn finish_and_claim(p: &str, delete: bool) {
    let app = format!("txbox_{p}test");
    let Some((_, mut client)) = fresh(p) else {
        return;
    };
    let store =
        txbox::PgStore::connect(&pg_url_as(&app), &crate::common::prefix_config(p)).unwrap();
    let other = txbox::PgStore::connect(&pg_url(), &crate::common::prefix_config(p)).unwrap();
    let outbox = outbox_of_x(p);
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("x", 0..10).unwrap())
        .unwrap();
    tx.commit().unwrap();
    let of = |events: &[txbox::Event]| events.iter().map(|e| e.id).collect::<Vec<_>>();
    let acked = if delete {
        Outcome::SentDelete
    } else {
        Outcome::Sent
    };
    let all_acked = |events: &[txbox::Event]| -> Vec<(EventId, Outcome)> {
        events.iter().map(|e| (e.id, acked.clone())).collect()
    };
    let lease = Duration::from_secs(60);

    let first = ClaimArgs::new("x", 4, lease).delete_acked(delete);
    let (a, held) = store.claim_held(&first).unwrap();
    assert_eq!(of(&a), ids[..4]);
    let mut outcomes = all_acked(&a);
    outcomes[0].1 = Outcome::Retry {
        delay: Duration::from_secs(3600),
        error: "busy".into(),
    };
    let next = first.after(a.last().map(|e| e.id));
    let (n, claim) = held
        .unwrap()
        .finish_and_claim(&a, &outcomes, &next)
        .unwrap();
    assert_eq!(n, 4);
    let (b, held) = claim.expect("the store's batches claim the next one themselves");
    assert_eq!(of(&b), ids[4..8]);
    // the finish is committed: three acked, the retry counted and waiting
    assert_eq!(
        count(&mut client, p, "PROCESSED"),
        if delete { 0 } else { 3 }
    );
    let attempts: i32 = client
        .query_one(
            &format!("SELECT attempts FROM {p}outbox_events WHERE id = $1"),
            &[&ids[0].as_uuid()],
        )
        .unwrap()
        .get(0);
    assert_eq!(attempts, 1);
    // the new batch is held: another relay gets only the rest
    let (rest, other_held) = other.claim_held(&first.limit(10)).unwrap();
    assert_eq!(of(&rest), ids[8..]);
    drop(other_held); // rolled back: free again

    // all acked, and the next claim after the batch's last id
    let step = |held: Option<Box<dyn txbox::HeldBatch>>, events: &[txbox::Event]| {
        let next = next.after(events.last().map(|e| e.id));
        held.unwrap()
            .finish_and_claim(events, &all_acked(events), &next)
            .unwrap()
    };
    let (n, claim) = step(held, &b);
    assert_eq!(n, 4);
    let (c, held) = claim.unwrap();
    assert_eq!(of(&c), ids[8..]);
    let (n, claim) = step(held, &c);
    assert_eq!(n, 2);
    let (none, no_tx) = claim.unwrap();
    assert!(none.is_empty() && no_tx.is_none());
    // nothing left open on the store's connections
    assert_eq!(
        open_transactions(&mut client, &app),
        0,
        "a transaction was left open"
    );
    let rows: i64 = client
        .query_one(&format!("SELECT count(*) FROM {p}outbox_events"), &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, if delete { 1 } else { 10 });
    assert_eq!(count(&mut client, p, "PENDING"), 1, "the retry");
}

/// An idle type costs one statement per poll with held claims too: the claim first
/// asks whether anything is due, and opens no transaction when nothing is.
#[test]
fn an_idle_held_claim_sends_only_its_probe() {
    let p = "t_rel_holdidle_";
    let app = "txbox_holdidle_test";
    let Some((_, mut client)) = fresh(p) else {
        return;
    };
    let store = txbox::PgStore::connect(&pg_url_as(app), &crate::common::prefix_config(p)).unwrap();
    for delete_acked in [false, true] {
        let args = ClaimArgs::new("x", 100, Duration::from_secs(60)).delete_acked(delete_acked);
        let (events, held) = store.claim_held(&args).unwrap();
        assert!(events.is_empty() && held.is_none());
    }
    // each backend's last statement: the probe, and no transaction was opened
    let ran: Vec<(String, String)> = client
        .query(
            "SELECT state, query FROM pg_stat_activity \
             WHERE application_name = $1 AND query <> ''",
            &[&app],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let probe = format!("SELECT 1 FROM {p}outbox_events WHERE");
    assert!(ran.iter().any(|(_, q)| q.starts_with(&probe)), "{ran:?}");
    assert!(
        ran.iter().all(|(state, q)| state == "idle"
            && !q.contains("FOR UPDATE")
            && !q.contains("COMMIT")),
        "{ran:?}"
    );
}

#[test]
fn held_claims_need_a_store_that_can_hold_them() {
    let config = Config::builder()
        .event("y", |e| e.claim(ClaimMode::Lock))
        .build()
        .unwrap();
    let store = Arc::new(
        txbox::SqliteStore::connect(":memory:", &crate::common::prefix_config("")).unwrap(),
    );
    store.migrate().unwrap();
    let err = Relay::start(store.clone(), &config, MemorySender::new())
        .err()
        .expect("SQLite cannot hold a claim open");
    assert!(
        matches!(&err, txbox::Error::Config { path, .. } if path == "events.y.claim"),
        "{err}"
    );
    assert!(err.to_string().contains("PostgreSQL"), "{err}");
    let err = store
        .claim_held(&ClaimArgs::new("y", 10, Duration::from_secs(1)))
        .err()
        .expect("SQLite cannot hold a claim open");
    assert!(
        matches!(&err, txbox::Error::Unsupported { what, .. } if what.contains("lock")),
        "{err}"
    );
}

/// A held claim sends its statements as one script each, values written as
/// literals: event types with quotes and backslashes (and one that tries to end
/// the statement) are claimed exactly and harm nothing.
#[test]
fn held_claims_write_odd_event_types_as_exact_literals() {
    let p = "t_rel_holdq_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let odd = [
        r"it's",
        r"back\slash\\",
        r"x'); DELETE FROM t_rel_holdq_outbox_events; --",
        r"\'; SELECT 1; --",
        "ünïcödé ✓",
    ];
    let mut b = Config::builder().table_prefix(p);
    for t in odd {
        b = b.event(t, |e| e);
    }
    let config = b.build().unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let mut published = Vec::new();
    for t in odd {
        published.push(
            outbox
                .publish_all(&mut tx, txbox::NewEvent::batch(t, 0..3).unwrap())
                .unwrap(),
        );
    }
    tx.commit().unwrap();
    for (t, ids) in odd.iter().zip(&published) {
        let (events, held) = store
            .claim_held(&ClaimArgs::new(t, 10, Duration::from_secs(60)))
            .unwrap();
        assert_eq!(&events.iter().map(|e| e.id).collect::<Vec<_>>(), ids, "{t}");
        assert!(events.iter().all(|e| e.event_type == *t), "{t}");
        let acked: Vec<(EventId, Outcome)> = ids.iter().map(|id| (*id, Outcome::Sent)).collect();
        assert_eq!(held.unwrap().finish(&events, &acked).unwrap(), 3, "{t}");
    }
    assert_eq!(count(&mut client, p, "PROCESSED"), 15);
}

/// Relays with lease claims and relays with held claims share one table: each
/// skips what the others hold, and every event is delivered once.
#[test]
fn lease_and_held_claims_share_a_table_and_deliver_each_event_once() {
    let p = "t_rel_mixed_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = |claim: ClaimMode| {
        Config::builder()
            .table_prefix(p)
            .defaults(|e: EventSettings| fast(e).batch_size(50).claim(claim))
            .event("m", |e| e)
            .build()
            .unwrap()
    };
    let outbox = Outbox::new(&config(ClaimMode::Lease)).unwrap();
    let mut published = HashSet::new();
    for _ in 0..10 {
        let mut tx = client.transaction().unwrap();
        published.extend(
            outbox
                .publish_all(&mut tx, txbox::NewEvent::batch("m", 0..1000).unwrap())
                .unwrap(),
        );
        tx.commit().unwrap();
    }
    let senders: Vec<MemorySender> = (0..4).map(|_| MemorySender::new()).collect();
    // connected first, so the four relays start together
    let stores: Vec<Arc<dyn FullStore>> = (0..4)
        .map(|i| -> Arc<dyn FullStore> {
            if i == 0 {
                store.clone()
            } else {
                Arc::new(
                    txbox::PgStore::connect(&pg_url(), &crate::common::prefix_config(p)).unwrap(),
                )
            }
        })
        .collect();
    let mode = |i: usize| {
        if i % 2 == 0 {
            ClaimMode::Lease
        } else {
            ClaimMode::Lock
        }
    };
    let relays: Vec<Relay> = senders
        .iter()
        .zip(stores)
        .enumerate()
        .map(|(i, (s, store))| Relay::start(store, &config(mode(i)), s.clone()).unwrap())
        .collect();
    wait_until("10,000 rows processed", Duration::from_secs(60), || {
        count(&mut client, p, "PROCESSED") == 10_000
    });
    crate::common::shut_down_and_check_each_once(relays, &senders, &published);
    let share = |m: ClaimMode| -> usize {
        (0..4)
            .filter(|i| mode(*i) == m)
            .map(|i| senders[i].len())
            .sum()
    };
    assert!(
        share(ClaimMode::Lease) > 0 && share(ClaimMode::Lock) > 0,
        "both kinds of relay took a share: {:?}",
        senders.iter().map(MemorySender::len).collect::<Vec<_>>()
    );
}

/// A held batch of someone else's store: it implements only `finish`, so it gets
/// the trait's `finish_and_claim`, which finishes and leaves the next claim to the
/// store.
struct FinishOnly(Box<dyn txbox::HeldBatch>, Arc<AtomicUsize>);

impl txbox::HeldBatch for FinishOnly {
    fn finish(
        self: Box<Self>,
        events: &[txbox::Event],
        outcomes: &[(EventId, Outcome)],
    ) -> txbox::Result<u64> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.finish(events, outcomes)
    }
}

/// PostgreSQL whose held batches are [`FinishOnly`]; counts its held claims and
/// their finishes.
struct DefaultHeld {
    pg: Arc<txbox::PgStore>,
    claims: Arc<AtomicUsize>,
    finishes: Arc<AtomicUsize>,
}

impl Store for DefaultHeld {
    fn migrate(&self) -> txbox::Result<()> {
        self.pg.migrate()
    }
    fn ping(&self) -> txbox::Result<()> {
        self.pg.ping()
    }
    fn table_prefix(&self) -> &str {
        self.pg.table_prefix()
    }
    fn try_lock(&self, name: &str, owner: uuid::Uuid, lease: Duration) -> txbox::Result<bool> {
        self.pg.try_lock(name, owner, lease)
    }
    fn unlock(&self, name: &str, owner: uuid::Uuid) -> txbox::Result<()> {
        self.pg.unlock(name, owner)
    }
}

impl ClaimStore for DefaultHeld {
    fn claim_after(
        &self,
        args: &ClaimArgs<'_>,
        token: uuid::Uuid,
    ) -> txbox::Result<Vec<txbox::Event>> {
        self.pg.claim_after(args, token)
    }
    fn finish(&self, token: uuid::Uuid, outcomes: &[(EventId, Outcome)]) -> txbox::Result<u64> {
        self.pg.finish(token, outcomes)
    }
    fn can_hold_claims(&self) -> bool {
        true
    }
    fn max_connections(&self) -> Option<usize> {
        self.pg.max_connections()
    }
    fn can_notify(&self) -> bool {
        self.pg.can_notify()
    }
    fn listen(&self) -> txbox::Result<Box<dyn txbox::Notifications>> {
        self.pg.listen()
    }
    fn claim_held(&self, args: &ClaimArgs<'_>) -> txbox::Result<txbox::HeldClaim> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        let (events, held) = self.pg.claim_held(args)?;
        let held = held
            .map(|h| Box::new(FinishOnly(h, self.finishes.clone())) as Box<dyn txbox::HeldBatch>);
        Ok((events, held))
    }
}

impl MaintenanceStore for DefaultHeld {
    fn recover_expired(&self, limit: usize) -> txbox::Result<u64> {
        self.pg.recover_expired(limit)
    }
    fn delete_processed(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.pg.delete_processed(ttl, limit)
    }
    fn status(&self) -> txbox::Result<Vec<txbox::TypeStatus>> {
        self.pg.status()
    }
}

impl DeadLetterStore for DefaultHeld {
    fn move_failed_to_dlq(&self, limit: usize) -> txbox::Result<u64> {
        self.pg.move_failed_to_dlq(limit)
    }
    fn requeue_dlq_retries(&self, limit: usize) -> txbox::Result<u64> {
        self.pg.requeue_dlq_retries(limit)
    }
    fn delete_resolved_dlq(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.pg.delete_resolved_dlq(ttl, limit)
    }
    fn dlq_list(&self, filter: &txbox::DlqFilter) -> txbox::Result<Vec<txbox::DeadLetter>> {
        self.pg.dlq_list(filter)
    }
    fn dlq_count(&self, filter: &txbox::DlqFilter) -> txbox::Result<u64> {
        self.pg.dlq_count(filter)
    }
    fn dlq_get(&self, id: EventId) -> txbox::Result<Option<txbox::DeadLetter>> {
        self.pg.dlq_get(id)
    }
    fn dlq_set_status(
        &self,
        ids: &[EventId],
        from: &[DlqStatus],
        to: DlqStatus,
    ) -> txbox::Result<Vec<EventId>> {
        self.pg.dlq_set_status(ids, from, to)
    }
    fn dlq_delete(&self, ids: &[EventId], from: &[DlqStatus]) -> txbox::Result<Vec<EventId>> {
        self.pg.dlq_delete(ids, from)
    }
    fn blocked_keys(
        &self,
        event_type: &str,
        limit: usize,
    ) -> txbox::Result<Vec<txbox::BlockedKey>> {
        self.pg.blocked_keys(event_type, limit)
    }
}

impl InboxStore for DefaultHeld {
    fn inbox_insert(&self, consumer: &str, ids: &[EventId]) -> txbox::Result<Vec<EventId>> {
        self.pg.inbox_insert(consumer, ids)
    }
    fn delete_expired_inbox(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.pg.delete_expired_inbox(ttl, limit)
    }
}

/// A store of one's own whose held batches keep the trait's `finish_and_claim`
/// (finish only): the relay claims each next batch through the store instead, and
/// a backlog still drains with every event sent once and every row finished.
#[test]
fn held_batches_without_their_own_finish_and_claim_drain_a_backlog() {
    let p = "t_rel_heldef_";
    let app = "txbox_heldef_test";
    let Some((pg, mut client)) = fresh_with_url(p, &pg_url_as(app)) else {
        return;
    };
    let (claims, finishes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let store = Arc::new(DefaultHeld {
        pg,
        claims: claims.clone(),
        finishes: finishes.clone(),
    });
    held_backlog(p, store, &mut client);
    assert_eq!(
        count(&mut client, p, "PENDING"),
        100,
        "the refused wait to retry"
    );
    // 25 full batches, each claimed through the store and finished by its own batch
    let (claims, finishes) = (
        claims.load(Ordering::SeqCst),
        finishes.load(Ordering::SeqCst),
    );
    assert!(claims >= 25, "{claims} claims through the store");
    assert_eq!(finishes, 25, "each batch finished once");
    assert_eq!(
        open_transactions(&mut client, app),
        0,
        "no held transaction left open"
    );
}

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

/// Held claims keep a connection per batch in flight: a configuration that needs
/// more than the store's pool has is refused at start, with the numbers.
#[test]
fn held_claims_needing_more_connections_than_the_pool_are_refused() {
    let p = "t_rel_pool_";
    if fresh(p).is_none() {
        return;
    }
    let pool = r2d2::Pool::builder()
        .max_size(8)
        .build(r2d2_postgres::PostgresConnectionManager::new(
            pg_url().parse().unwrap(),
            postgres::NoTls,
        ))
        .unwrap();
    let store =
        Arc::new(txbox::PgStore::from_pool(pool, &crate::common::prefix_config(p)).unwrap());
    let held = |n: usize| {
        let mut b = Config::builder().table_prefix(p).defaults(|e| {
            e.claim(ClaimMode::Lock)
                .in_flight(3)
                .wake(txbox::Wake::Poll)
        });
        for i in 0..n {
            b = b.event(format!("t{i}"), |e| e);
        }
        b.build().unwrap()
    };
    let err = Relay::start(store.clone(), &held(2), MemorySender::new())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("held claims need up to 12 database connections (6 batches in flight of held types, 0 other pollers, 5 maintenance threads, 1 health check), and the store's pool has 8"),
        "{err}"
    );
    // the commit listener keeps a connection too: 2 + 5 + 1 + 1 = 9 is one too many
    let err = Relay::start(
        store.clone(),
        &Config::builder()
            .table_prefix(p)
            .event("t", |e| e.claim(ClaimMode::Lock).in_flight(2))
            .build()
            .unwrap(),
        MemorySender::new(),
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(
        err.contains(
            "5 maintenance threads, 1 commit listener, 1 health check), and the store's pool has 8"
        ),
        "{err}"
    );
    // one held type with 2 in flight, polling only: 2 + 5 + 1 = 8 fits
    let config = Config::builder()
        .table_prefix(p)
        .event("t", |e| {
            e.claim(ClaimMode::Lock)
                .in_flight(2)
                .wake(txbox::Wake::Poll)
        })
        .build()
        .unwrap();
    Relay::start(store, &config, MemorySender::new())
        .unwrap()
        .shutdown(Duration::from_secs(5))
        .unwrap();
}

/// An event type holding a NUL, or a NaN multiplier: refused with the key by
/// the builder (a configuration cannot be changed after it was validated), where
/// a relay used to panic on the thread name.
#[test]
fn a_configuration_with_a_nul_type_or_nan_multiplier_is_refused() {
    let err = Config::builder()
        .event("bad\0type", |e| e)
        .build()
        .expect_err("refused")
        .to_string();
    assert!(
        err.starts_with("events.bad\\0type event type must not contain control characters"),
        "{err}"
    );
    let err = Config::builder()
        .defaults(|d| d.backoff_multiplier(f64::NAN))
        .build()
        .expect_err("refused")
        .to_string();
    assert!(
        err.starts_with("defaults.backoff.multiplier must be between"),
        "{err}"
    );
}

/// A store opened on other tables than the configuration names would have the
/// relay read tables the publisher never writes: refused at start, naming both.
#[test]
fn a_store_on_other_tables_than_the_configuration_is_refused() {
    let p = "t_rel_prefix_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix("t_rel_other_")
        .event("e", |e| e)
        .build()
        .unwrap();
    let err = Relay::start(store, &config, MemorySender::new())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.starts_with(
            "table_prefix is \"t_rel_other_\" but the store was opened with \"t_rel_prefix_\""
        ),
        "{err}"
    );
    // opened from the configuration, the prefix is given once
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap();
    let store = config.connect(&pg_url()).unwrap();
    Relay::start(store, &config, MemorySender::new())
        .unwrap()
        .shutdown(Duration::from_secs(5))
        .unwrap();
}

/// A sender that cannot reach its broker until the test lets it: counts the
/// readiness checks and the sends.
#[derive(Clone, Default)]
struct Unreachable {
    reachable: Arc<std::sync::atomic::AtomicBool>,
    checks: Arc<AtomicUsize>,
    sent: MemorySender,
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

/// A relay that sleeps in a long polling delay, its events' wake-up `notify`.
fn sleepy(p: &str) -> Config {
    Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(Duration::from_secs(30), Duration::from_secs(60), 1.5))
        .event("n", |e| e)
        .build()
        .unwrap()
}

/// Publishes `n` events of type `n` in one transaction and commits it.
fn commit_events(client: &mut postgres::Client, config: &Config, n: usize) -> Vec<EventId> {
    let outbox = Outbox::new(config).unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, NewEvent::batch("n", 0..n).unwrap())
        .unwrap();
    tx.commit().unwrap();
    ids
}

/// On PostgreSQL the commit wakes the relay: an event published while its
/// poller sleeps in a 30 s delay is sent within a second or two.
#[test]
fn an_event_committed_while_the_relay_sleeps_is_sent_at_once() {
    let p = "t_rel_notify_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = sleepy(p);
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    assert!(relay.thread_names().contains(&"txbox-listen".to_string()));
    wait_for_listener(&mut client, p);
    std::thread::sleep(ms(300)); // the first poll found nothing: 30 s to the next
    let t = Instant::now();
    let ids = commit_events(&mut client, &config, 3);
    wait_until("sent on commit", Duration::from_secs(5), || {
        sender.len() >= 3
    });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let sent: HashSet<EventId> = sender.sent().iter().map(|e| e.id).collect();
    assert_eq!(sent, ids.into_iter().collect());
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// The listener's connection ended by the database: events committed while it
/// was gone are still sent (it wakes every poller once it listens again), and
/// later ones are again sent on commit.
#[test]
fn the_listener_killed_listens_again_and_nothing_waits_for_the_poll() {
    let p = "t_rel_relisten_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = sleepy(p);
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    let listener = |c: &mut postgres::Client| listener_pid(c, p);
    let mut pid = None;
    wait_until("the listener listens", Duration::from_secs(5), || {
        pid = listener(&mut client);
        pid.is_some()
    });
    std::thread::sleep(ms(300)); // the first poll found nothing: 30 s to the next
                                 // waits (up to 5 s) until the backend is gone: the commit below finds no
                                 // listener, only the wake-up after the listener listens again sends it
    client
        .execute("SELECT pg_terminate_backend($1, 5000)", &[&pid.unwrap()])
        .unwrap();
    let while_down = commit_events(&mut client, &config, 3);
    wait_until(
        "the events committed while it was down sent",
        Duration::from_secs(10),
        || {
            let sent = sender.sent();
            while_down.iter().all(|id| sent.iter().any(|e| e.id == *id))
        },
    );
    wait_until("listening again", Duration::from_secs(10), || {
        listener(&mut client).is_some_and(|again| Some(again) != pid)
    });
    std::thread::sleep(ms(300));
    let t = Instant::now();
    let later = commit_events(&mut client, &config, 2);
    wait_until(
        "later events sent on commit",
        Duration::from_secs(5),
        || {
            let sent = sender.sent();
            later.iter().all(|id| sent.iter().any(|e| e.id == *id))
        },
    );
    assert!(t.elapsed() < Duration::from_secs(5));
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// `NOTIFY` comes with the commit only: a rolled-back publish notifies nobody,
/// and a transaction with 500 events of one type and 2 of another notifies
/// once per type.
#[test]
fn a_rollback_notifies_nobody_and_a_commit_once_per_type() {
    let p = "t_rel_notify_once_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    let mut listening = crate::common::listening(p);
    let config = Config::builder()
        .table_prefix(p)
        .event("a", |e| e)
        .event("b", |e| e)
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    outbox
        .publish_all(&mut tx, NewEvent::batch("a", 0..3).unwrap())
        .unwrap();
    tx.rollback().unwrap();
    let got = heard(&mut listening, ms(500));
    assert!(got.is_empty(), "a rollback notified: {got:?}");

    let mut tx = client.transaction().unwrap();
    outbox
        .publish_all(&mut tx, NewEvent::batch("a", 0..500).unwrap())
        .unwrap();
    outbox.publish(&mut tx, "b", &1).unwrap();
    outbox.publish(&mut tx, "b", &2).unwrap();
    tx.commit().unwrap();
    let mut got = heard(&mut listening, ms(1000));
    got.sort();
    assert_eq!(got, ["a", "b"], "one notification per type and commit");
}

/// `wake = "poll"` turns the wake-up off for its type: of two types sleeping in
/// a 30 s delay, the one that listens is sent on commit, the other waits.
#[test]
fn a_type_that_polls_is_not_woken_by_its_commits() {
    let p = "t_rel_wake_poll_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(Duration::from_secs(30), Duration::from_secs(60), 1.5))
        .event("n", |e| e)
        .event("q", |e| e.wake(txbox::Wake::Poll))
        .build()
        .unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    wait_for_listener(&mut client, p);
    std::thread::sleep(ms(300));
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let polled = outbox.publish(&mut tx, "q", &1).unwrap();
    let notified = outbox.publish(&mut tx, "n", &2).unwrap();
    tx.commit().unwrap();
    wait_until("the notified type sent", Duration::from_secs(5), || {
        sender.sent().iter().any(|e| e.id == notified)
    });
    std::thread::sleep(ms(1500));
    assert!(
        !sender.sent().iter().any(|e| e.id == polled),
        "the polling type was woken"
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// A poller backing off after an error is not cut short by wake-ups: during a
/// broker outage every commit would otherwise ask the broker again.
#[test]
fn commits_do_not_cut_short_the_backoff_of_a_poller_whose_broker_is_down() {
    let p = "t_rel_wake_backoff_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    // the error backoff doubles from `min` up to `max` (at most 5 s)
    let config = Config::builder()
        .table_prefix(p)
        .event("u", |e| {
            e.adaptive_polling(ms(10), Duration::from_secs(10), 1.5)
                .max_retries(0)
        })
        .build()
        .unwrap();
    let sender = Unreachable::default();
    let factory = {
        let s = sender.clone();
        move || -> txbox::Result<Box<dyn txbox::Sender>> { Ok(Box::new(s.clone())) }
    };
    let relay = Relay::start(store, &config, factory).unwrap();
    wait_for_listener(&mut client, p);
    // the error backoff doubles from 10 ms: after a few checks it is past 1 s
    wait_until("the backoff grew", Duration::from_secs(10), || {
        sender.checks.load(Ordering::Relaxed) >= 8
    });
    let before = sender.checks.load(Ordering::Relaxed);
    let outbox = Outbox::new(&config).unwrap();
    for i in 0..20 {
        let mut tx = client.transaction().unwrap();
        outbox.publish(&mut tx, "u", &i).unwrap();
        tx.commit().unwrap();
        std::thread::sleep(ms(25));
    }
    let asked = sender.checks.load(Ordering::Relaxed) - before;
    assert!(asked <= 2, "20 commits asked the broker {asked} times");
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// Bytes published on PostgreSQL, through the prepared statement's transaction
/// too, claimed with held claims whose acked rows are deleted: a refused send
/// writes the row back, bytes and content type included, and the retry sends
/// them unchanged. The relay's sessions have `bytea_output = 'escape'` (a
/// server or role may): the held claim reads its rows as text all the same.
#[test]
fn binary_payloads_survive_a_held_claims_write_back() {
    let p = "t_rel_bytes_";
    let escape = format!(
        "{}&options=-c%20bytea_output%3Descape",
        pg_url_as("t_rel_bytes")
    );
    let Some((store, mut client)) = fresh_with_url(p, &escape) else {
        return;
    };
    let output: String = store
        .pool()
        .get()
        .unwrap()
        .query_one("SHOW bytea_output", &[])
        .unwrap()
        .get(0);
    assert_eq!(output, "escape", "the store's sessions write bytea escaped");
    let config = Config::builder()
        .table_prefix(p)
        .processed_ttl(Duration::ZERO)
        .defaults(|e: EventSettings| {
            fast(e)
                .claim(ClaimMode::Lock)
                .max_retries(3)
                .backoff_delay(ms(10))
        })
        .event("b", |e| e)
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let prepared = outbox.prepare_pg(&mut client).unwrap();
    let mut tx = client.transaction().unwrap();
    let id = outbox
        .publish_bytes(
            &mut prepared.on(&mut tx),
            "b",
            RAW_BYTES,
            "application/x-protobuf",
        )
        .unwrap();
    let json = outbox.publish(&mut tx, "b", &json!({"n": 1})).unwrap();
    tx.commit().unwrap();
    let sender = MemorySender::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let r = refused.clone();
    sender.fail_when(move |e| {
        (e.content_type.is_some() && r.fetch_add(1, Ordering::SeqCst) == 0)
            .then(|| "refused once".to_string())
    });
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    wait_until("both sent", Duration::from_secs(20), || {
        sender.sent().iter().any(|e| e.id == id) && sender.sent().iter().any(|e| e.id == json)
    });
    relay.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(refused.load(Ordering::SeqCst), 2, "refused once, then sent");
    let sent = sender.sent();
    let bytes = sent.iter().find(|e| e.id == id).unwrap();
    assert_eq!(
        (
            bytes.payload.as_slice(),
            bytes.content_type.as_deref(),
            bytes.attempts
        ),
        (RAW_BYTES, Some("application/x-protobuf"), 1)
    );
    let j = sent.iter().find(|e| e.id == json).unwrap();
    assert_eq!(
        (j.payload_str(), j.content_type.as_deref()),
        (Some(r#"{"n":1}"#), None)
    );
}
