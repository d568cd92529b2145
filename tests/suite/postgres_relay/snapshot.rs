//! A long transaction holding the database's snapshot (an analytics query,
//! `pg_dump`, an idle session in REPEATABLE READ): VACUUM removes nothing
//! meanwhile, so every claimed event leaves dead index entries behind. A
//! claim must not walk them all (issue 45): it starts at the floor the
//! store knows to be settled, and a transaction that commits late is still
//! delivered at once.

use std::collections::HashSet;
use std::time::Duration;

use txbox::store::{ClaimArgs, ClaimStore};
use txbox::{Config, MaintenanceStore, MemorySender, Outbox, PgStore, Relay};
use uuid::Uuid;

use crate::common::*;

use super::fast;

fn config(p: &str) -> Config {
    Config::builder()
        .table_prefix(p)
        .defaults(fast)
        .event("e", |e| e)
        .event("idle", |e| e)
        .build()
        .unwrap()
}

/// A session that holds a REPEATABLE READ snapshot until dropped (read-only:
/// it holds the xmin horizon, not a transaction id).
fn hold_snapshot() -> postgres::Client {
    let mut c = client().unwrap();
    c.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class")
        .unwrap();
    c
}

/// Heap and index blocks read (hit or not) of the outbox table so far, as the
/// statistics have them: a backend's counts arrive when it exits at the latest.
fn blocks(c: &mut postgres::Client, p: &str) -> i64 {
    c.query_one(
        "SELECT (coalesce(heap_blks_hit, 0) + coalesce(heap_blks_read, 0) \
           + coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0))::int8 \
         FROM pg_statio_user_tables WHERE relname = $1",
        &[&format!("{p}outbox_events")],
    )
    .unwrap()
    .get(0)
}

/// Waits until no session named `app*` is connected: the statistics of an
/// ended one are there once it is gone from the list.
fn ended(c: &mut postgres::Client, app: &str) {
    wait_until("the sessions ended", Duration::from_secs(10), || {
        c.query_one(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name LIKE $1 || '%'",
            &[&app],
        )
        .unwrap()
        .get::<_, i64>(0)
            == 0
    });
}

/// Publishes events `range` of type `e` in one committed transaction.
fn publish_range(c: &mut postgres::Client, outbox: &Outbox, range: std::ops::Range<usize>) {
    let mut tx = c.transaction().unwrap();
    outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("e", range).unwrap())
        .unwrap();
    tx.commit().unwrap();
}

/// A client named `app`.
fn named(app: &str) -> postgres::Client {
    postgres::Client::connect(&pg_url_as(app), postgres::NoTls).unwrap()
}

/// The blocks `claims` claims of the drained type read on a store of their
/// own (the first claims of a store scan from the lowest number), counted
/// once its sessions have ended.
fn blocks_of_claims(c: &mut postgres::Client, p: &str, claims: usize) -> i64 {
    let app = format!("{p}claims");
    let before = blocks(c, p);
    {
        let store = PgStore::connect(&pg_url_as(&app), &config(p)).unwrap();
        for _ in 0..claims {
            let args = ClaimArgs::new("e", 200, Duration::from_secs(60));
            assert!(store.claim_after(&args, Uuid::now_v7()).unwrap().is_empty());
        }
    }
    ended(c, &app);
    blocks(c, p) - before
}

#[test]
fn claims_under_a_held_snapshot_do_not_walk_the_dead_rows() {
    let p = "t_snap_flat_";
    let app = format!("{p}work");
    let Some((store, mut c)) = fresh_with_url(p, &pg_url_as(&format!("{app}-relay"))) else {
        return;
    };
    let config = config(p);
    let snapshot = hold_snapshot();
    // 20,000 events published and sent while the snapshot holds: each leaves
    // a dead version and its index entries that no VACUUM can remove
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut publisher = named(&format!("{app}-publisher"));
    for chunk in 0..40 {
        publish_range(&mut publisher, &outbox, chunk * 500..(chunk + 1) * 500);
    }
    drop(publisher);
    let sent = sender.wait_for(20_000, Duration::from_secs(120));
    assert!(sent >= 20_000, "sent {sent} of 20,000");
    relay.shutdown(Duration::from_secs(10)).unwrap();
    let ids: HashSet<_> = sender.sent().iter().map(|e| e.id).collect();
    assert_eq!(ids.len(), 20_000, "every event sent once");
    let mut vacuum = named(&format!("{app}-vacuum"));
    vacuum
        .batch_execute(&format!("VACUUM {p}outbox_events"))
        .unwrap();
    drop(vacuum);
    let dead: i64 = c
        .query_one(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = $1",
            &[&format!("{p}outbox_events")],
        )
        .unwrap()
        .get(0);
    assert!(dead >= 20_000, "the snapshot keeps the dead rows: {dead}");
    ended(&mut c, &app);

    // a store's first claims scan from the lowest number: they walk them all
    let scan = blocks_of_claims(&mut c, p, 1);
    // the claims after them start at the settled floor
    let first = blocks_of_claims(&mut c, p, 2);
    let with_floor = blocks_of_claims(&mut c, p, 42) - first;
    eprintln!("blocks read: one scan from the lowest {scan}, two first claims {first}, 40 claims from the floor {with_floor}");
    assert!(
        scan > 300,
        "the fixture makes a scan from the lowest number costly: {scan} blocks"
    );
    assert!(
        with_floor * 10 < scan * 40,
        "40 claims from the floor read {with_floor} blocks, a tenth of one scan from the \
         lowest each at most ({scan})"
    );
    drop(snapshot);
}

#[test]
fn a_late_commit_below_the_floor_is_delivered_at_once() {
    let p = "t_snap_late_";
    let Some((store, mut c)) = fresh(p) else {
        return;
    };
    let config = config(p);
    let outbox = Outbox::new(&config).unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    // a transaction that takes its number early (its first write is the
    // event) and commits after thousands of later events were sent
    let mut late = client().unwrap();
    let mut tx = late.transaction().unwrap();
    let early = outbox.publish(&mut tx, "e", &"early").unwrap();
    for chunk in 0..10 {
        publish_range(&mut c, &outbox, chunk * 300..(chunk + 1) * 300);
        assert!(sender.wait_for((chunk + 1) * 300, Duration::from_secs(30)) >= (chunk + 1) * 300);
    }
    assert!(!sender.sent().iter().any(|e| e.id == early));
    tx.commit().unwrap();
    // well before stuck recovery's pass (60 s), which would find it too
    wait_until("the late commit sent", Duration::from_secs(5), || {
        sender.sent().iter().any(|e| e.id == early)
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(sender.sent().len(), 3_001, "every event sent once");
}

#[test]
fn txbox_publish_refuses_headers_publish_refuses() {
    let p = "t_snap_sqlhdr_";
    let Some((_store, mut c)) = fresh(p) else {
        return;
    };
    let err = c
        .query_one(
            &format!(
                "SELECT {p}txbox_publish('e', '1', NULL, jsonb_build_object('big', repeat('x', 70000)))"
            ),
            &[],
        )
        .unwrap_err();
    let text = err
        .as_db_error()
        .map(|d| d.message().to_owned())
        .unwrap_or_default();
    assert!(text.contains("65536"), "{err:?}");
    // at the bound it is taken
    let at_bound = txbox::MAX_HEADER_BYTES - "big".len() - 8;
    c.query_one(
        &format!(
            "SELECT {p}txbox_publish('e', '1', NULL, jsonb_build_object('big', repeat('x', {at_bound})))"
        ),
        &[],
    )
    .unwrap();
}

/// An event due at its insert, from a publisher whose transaction began
/// after the claim's (the claim's `now()` is its own transaction's start,
/// taken before the statement is planned; the publisher commits meanwhile):
/// the claim from the floor takes it, for no later claim would read it
/// below the floor (seen in the soak: 12 events left for the sweep).
#[test]
fn an_event_due_at_its_insert_is_claimed_whatever_the_claims_clock_says() {
    let p = "t_snap_clock_";
    let Some((store, mut c)) = fresh(p) else {
        return;
    };
    let args = ClaimArgs::new("e", 200, Duration::from_secs(60));
    // the first claims of a store scan from the lowest number and set its floor
    for _ in 0..3 {
        assert!(store.claim_after(&args, Uuid::now_v7()).unwrap().is_empty());
    }
    // as its publisher's transaction left it: due at its insert, which is
    // later than the claim's `now()`
    let id = Uuid::now_v7();
    c.execute(
        &format!(
            "INSERT INTO {p}outbox_events (id, event_type, payload, created_at, next_attempt_at) \
             VALUES ($1, 'e', '1', now() + interval '2 s', now() + interval '2 s')"
        ),
        &[&id],
    )
    .unwrap();
    let got = store.claim_after(&args, Uuid::now_v7()).unwrap();
    assert_eq!(
        got.iter().map(|e| e.id.as_uuid()).collect::<Vec<_>>(),
        [id],
        "claimed at once"
    );
}

/// An event given back unchanged below the floor (another claim held it
/// locked while this store's claims passed it, and its connection was lost
/// before it committed): no claim from the floor reads it, stuck recovery
/// makes it due again, and the next claim takes it.
#[test]
fn an_event_given_back_below_the_floor_is_claimed_after_recovery() {
    let p = "t_snap_back_";
    let Some((store, mut c)) = fresh(p) else {
        return;
    };
    let config = config(p);
    let outbox = Outbox::new(&config).unwrap();
    let args = ClaimArgs::new("e", 200, Duration::from_secs(60));
    // the store's ticks settle a mark past the event while its type is
    // paused (its claims take nothing)
    assert!(store.pause("e").unwrap());
    let mut tx = c.transaction().unwrap();
    let id = outbox.publish(&mut tx, "e", &"given back").unwrap();
    tx.commit().unwrap();
    // a mark settles once every transaction that took an id before its tick
    // has ended: in the cluster, other tests' writers too (a bulk insert, a
    // table's rewrite), which are waited for
    for _ in 0..2 {
        assert!(store.claim_after(&args, Uuid::now_v7()).unwrap().is_empty());
        super::older_transactions_ended(&mut c);
    }
    assert!(store.claim_after(&args, Uuid::now_v7()).unwrap().is_empty());
    assert!(store.resume("e").unwrap());
    // a claim elsewhere holds it locked while this store claims
    let mut other = client().unwrap();
    let mut held = other.transaction().unwrap();
    held.execute(
        &format!("SELECT 1 FROM {p}outbox_events WHERE id = $1 FOR UPDATE"),
        &[&id.as_uuid()],
    )
    .unwrap();
    assert!(
        store.claim_after(&args, Uuid::now_v7()).unwrap().is_empty(),
        "locked: skipped"
    );
    held.rollback().unwrap();
    assert!(
        store.claim_after(&args, Uuid::now_v7()).unwrap().is_empty(),
        "given back below the floor, a claim does not read it"
    );
    assert_eq!(store.recover_expired(100).unwrap(), 1);
    let again = store.claim_after(&args, Uuid::now_v7()).unwrap();
    assert_eq!(again.iter().map(|e| e.id).collect::<Vec<_>>(), [id]);
}
