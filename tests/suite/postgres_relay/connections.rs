//! The relay's database connections killed under load: nothing is lost, the pool
//! replaces them.

use std::collections::HashSet;
use std::time::{Duration, Instant};
use txbox::store::ClaimStore;
use txbox::{MaintenanceStore, Store};

use crate::common::*;
use serde_json::json;
use txbox::store::Outcome;
use txbox::{ClaimMode, Config, EventId, EventSettings, MemorySender, Outbox, Relay};

use super::{fast, ms};

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
        .maintenance(|m| m.recovery_interval(ms(200)))
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
        .maintenance(|m| m.processed_ttl(ms(500)))
        .maintenance(|m| m.cleanup_interval(ms(100)))
        .maintenance(|m| m.batch_size(7))
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

/// A relay's claim commits and its answer is lost (the connection broke
/// after the statement went out: a partition, a failover, a proxy restart;
/// the store says so with an error, the rows IN_PROCESS under a lease of
/// 60 s). The relay gives the claim back at its next step and sends the
/// events at once, not after their lease and the next recovery, which is
/// what they waited for before.
#[test]
fn a_claim_whose_answer_was_lost_is_given_back_at_once() {
    let p = "t_rel_lost_";
    let Some((pg, mut client)) = fresh(p) else {
        return;
    };
    let store = std::sync::Arc::new(super::held::DefaultHeld {
        pg,
        claims: Default::default(),
        finishes: Default::default(),
        lose_answers: std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(1)),
    });
    let config = txbox::Config::builder()
        .table_prefix(p)
        .defaults(|e| super::fast(e).lease(Duration::from_secs(60)))
        .event("e", |e| e)
        .build()
        .unwrap();
    let outbox = txbox::Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    for i in 0..3 {
        outbox.publish(&mut tx, "e", &i).unwrap();
    }
    tx.commit().unwrap();
    let sender = txbox::MemorySender::new();
    let started = Instant::now();
    let relay = txbox::Relay::start(store.clone(), &config, sender.clone()).unwrap();
    wait_until("the events sent", Duration::from_secs(20), || {
        sender.len() == 3
    });
    let took = started.elapsed();
    assert_eq!(
        store.lose_answers.load(std::sync::atomic::Ordering::SeqCst),
        0,
        "a claim's answer was lost"
    );
    assert!(took < Duration::from_secs(5), "sent after {took:?}");
    relay.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(count(&mut client, p, "PROCESSED"), 3);
}
