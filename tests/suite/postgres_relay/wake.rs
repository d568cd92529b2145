//! The wake-up on commit: a sleeping relay sends at once, a killed listener
//! listens again, a rollback notifies nobody, a polling type is not woken.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::common::*;
use txbox::{Config, EventId, MemorySender, NewEvent, Outbox, Relay};

use super::errors::Unreachable;
use super::ms;

/// A relay that sleeps in a 30 s polling delay, its type `n` woken by commits.
fn sleepy_n(p: &str) -> Config {
    sleepy(p, Duration::from_secs(30), &[("n", txbox::Wake::Notify)])
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
    let config = sleepy_n(p);
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    assert!(relay.thread_names().contains(&"txbox-listen".to_string()));
    let sentinels = relay_woken_by_commits(&mut client, p, &config, &sender, "n");
    let t = Instant::now();
    let ids = commit_events(&mut client, &config, 3);
    wait_until("sent on commit", Duration::from_secs(5), || {
        sender.len() >= 5
    });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let mut sent: HashSet<EventId> = sender.sent().iter().map(|e| e.id).collect();
    assert!(sentinels.iter().all(|s| sent.remove(s)));
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
    let config = sleepy_n(p);
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    let listener = |c: &mut postgres::Client| listener_pid(c, p);
    let mut pid = None;
    wait_until("the listener listens", Duration::from_secs(5), || {
        pid = listener(&mut client);
        pid.is_some()
    });
    relay_woken_by_commits(&mut client, p, &config, &sender, "n");
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
    relay_woken_by_commits(&mut client, p, &config, &sender, "n");
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

/// A PENDING row notifies, due now or later; a FAILED one does not. A row
/// due later (a delayed event, what a held claim writes back for a failed
/// one) notifies since schema 9, so the woken poller asks when it is due and
/// sleeps until then (schema 8 returned early for it; schema 6 asked in a
/// WHEN clause).
#[test]
fn a_pending_row_notifies_due_now_or_later_and_a_failed_one_does_not() {
    let p = "t_rel_notify_due_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    let mut listening = crate::common::listening(p);
    let insert = |status: &str, due: &str| {
        format!(
            "INSERT INTO {p}outbox_events (id, event_type, payload, status, next_attempt_at) \
             VALUES (gen_random_uuid(), '{status}', '1', '{status}', {due})"
        )
    };
    client
        .batch_execute(&format!("BEGIN; {}; COMMIT", insert("FAILED", "now()")))
        .unwrap();
    let got = heard(&mut listening, ms(500));
    assert!(got.is_empty(), "a FAILED row notified: {got:?}");
    client
        .batch_execute(&format!(
            "BEGIN; {}; COMMIT",
            insert("PENDING", "now() + interval '1 hour'")
        ))
        .unwrap();
    assert_eq!(heard(&mut listening, ms(1000)), ["PENDING"], "due later");
    client
        .batch_execute(&format!("BEGIN; {}; COMMIT", insert("PENDING", "now()")))
        .unwrap();
    assert_eq!(heard(&mut listening, ms(1000)), ["PENDING"], "due now");
}

/// A relay asleep in a 30 s polling delay sends an event delayed 1 s on
/// time: the commit wakes its poller, which finds nothing due, asks when
/// the event is, and sleeps until then.
#[test]
fn an_idle_relay_sends_a_delayed_event_when_due_not_at_its_next_poll() {
    let p = "t_rel_wake_delayed_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(Duration::from_secs(30), Duration::from_secs(60), 1.5))
        .event("d", |e| e)
        .build()
        .unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    // its first poll found nothing: it sleeps 30 s
    std::thread::sleep(ms(500));
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    outbox
        .publish_all(
            &mut tx,
            [txbox::NewEvent::new("d", &1)
                .unwrap()
                .deliver_after(Duration::from_secs(1))],
        )
        .unwrap();
    tx.commit().unwrap();
    let committed = std::time::Instant::now();
    assert_eq!(sender.wait_for(1, Duration::from_secs(10)), 1);
    let took = committed.elapsed();
    assert!(
        took >= ms(900) && took < Duration::from_secs(5),
        "sent {took:?} after the commit, due 1 s after it"
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
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
        // its first poll 30 s away too: nothing but a wake-up sends it in time
        .event("q", |e| {
            e.wake(txbox::Wake::Poll)
                .initial_delay(Duration::from_secs(30))
        })
        .build()
        .unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    relay_woken_by_commits(&mut client, p, &config, &sender, "n");
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
