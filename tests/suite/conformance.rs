//! One suite, every SQL dialect: each test below runs unchanged against PostgreSQL,
//! MariaDB/MySQL (feature `mysql`), SQLite (feature `sqlite`) and Oracle (feature
//! `oracle`, only when `TXBOX_ORACLE_URL` is set: it cannot run here), through the
//! `Store` trait and each dialect's own business transactions. A dialect that passes
//! it is done. SQLite has one writer per database: its "several instances" tests are
//! several stores (connections) in one process, which is what SQLite can offer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use crate::common::wait_until;
use txbox::Inbox;
use txbox::{
    ClaimArgs, Config, Dlq, DlqFilter, DlqStatus, Error, Event, EventId, MemorySender, Outcome,
    Relay, SendError, Sender, Started,
};
use uuid::Uuid;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config(prefix: &str) -> Config {
    Config::builder()
        .table_prefix(prefix)
        .defaults(|e| e.adaptive_polling(ms(10), ms(100), 1.5))
        .event("e", |e| e)
        .event("f", |e| e)
        .build()
        .unwrap()
}

fn publish_commits_and_rollback_leaves_nothing(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    fx.publish(&c, "e", 3, false);
    let ids = fx.publish(&c, "e", 250, true);
    assert_eq!(
        fx.counts("e").pending,
        250,
        "the rolled-back batch left nothing"
    );
    let claimed = fx
        .store
        .claim("e", 1000, Duration::from_secs(60), Uuid::now_v7())
        .unwrap();
    assert_eq!(
        claimed.iter().map(|e| e.id).collect::<Vec<_>>(),
        ids,
        "all of them, oldest first"
    );
    assert_eq!(claimed[7].payload_str(), Some("7"));
    assert_eq!(claimed[0].attempts, 0);
}

fn claims_are_disjoint_and_bounded(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids = fx.publish(&c, "e", 10, true);
    fx.publish(&c, "f", 2, true);
    let other = fx.another_store();
    let a = fx
        .store
        .claim("e", 4, Duration::from_secs(60), Uuid::now_v7())
        .unwrap();
    let b2 = other
        .claim("e", 4, Duration::from_secs(60), Uuid::now_v7())
        .unwrap();
    let c2 = fx
        .store
        .claim("e", 4, Duration::from_secs(60), Uuid::now_v7())
        .unwrap();
    assert_eq!((a.len(), b2.len(), c2.len()), (4, 4, 2));
    let all: Vec<_> = a.iter().chain(&b2).chain(&c2).map(|e| e.id).collect();
    assert_eq!(all, ids, "disjoint batches, in id order");
    assert!(fx
        .store
        .claim("e", 4, Duration::from_secs(60), Uuid::now_v7())
        .unwrap()
        .is_empty());
    assert_eq!(
        fx.store
            .claim("f", 10, Duration::from_secs(60), Uuid::now_v7())
            .unwrap()
            .len(),
        2,
        "per type"
    );
    let s = fx.counts("e");
    assert_eq!((s.pending, s.in_process), (0, 10));
}

fn claims_after_an_id_skip_lower_ones_until_asked_without(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids = fx.publish(&c, "e", 10, true);
    let lease = Duration::from_secs(60);
    let claim = |after: Option<EventId>, n: usize| -> (Uuid, Vec<EventId>) {
        let t = Uuid::now_v7();
        let args = ClaimArgs::new("e", n, lease).after(after);
        let got = fx.store.claim_after(&args, t).unwrap();
        (t, got.iter().map(|e| e.id).collect())
    };
    let (t0, first) = claim(None, 3);
    assert_eq!(first, ids[0..3]);
    let (_, second) = claim(Some(ids[2]), 3);
    assert_eq!(second, ids[3..6], "starts after the given id");
    // the first event fails and is due again at once: lower than the resume point
    let retry = Outcome::Retry {
        delay: Duration::ZERO,
        error: "x".into(),
    };
    let outcomes = [
        (ids[0], retry),
        (ids[1], Outcome::Sent),
        (ids[2], Outcome::Sent),
    ];
    assert_eq!(fx.store.finish(t0, &outcomes).unwrap(), 3);
    let (_, third) = claim(Some(ids[5]), 10);
    assert_eq!(
        third,
        ids[6..10],
        "a lower id waits for a claim without a bound"
    );
    let (_, rescan) = claim(None, 10);
    assert_eq!(rescan, vec![ids[0]]);
}

fn finish_checks_the_token_and_recovery_counts_no_attempt(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids = fx.publish(&c, "e", 2, true);
    let old = Uuid::now_v7();
    assert_eq!(fx.store.claim("e", 10, ms(300), old).unwrap().len(), 2);
    assert_eq!(
        fx.store.recover_expired(100).unwrap(),
        0,
        "lease not expired yet"
    );
    let mut recovered = 0;
    wait_until("the lease to expire", Duration::from_secs(10), || {
        recovered += fx.store.recover_expired(100).unwrap();
        recovered == 2
    });
    let new = Uuid::now_v7();
    let again = fx
        .store
        .claim("e", 10, Duration::from_secs(60), new)
        .unwrap();
    assert_eq!(again.len(), 2);
    assert!(
        again.iter().all(|e| e.attempts == 0),
        "recovery counts no attempt"
    );
    // the first relay comes back late: nothing it says changes a row
    assert_eq!(fx.store.finish(old, &[(ids[0], Outcome::Sent)]).unwrap(), 0);
    assert_eq!(
        fx.store
            .finish(
                old,
                &[(
                    ids[1],
                    Outcome::Failed {
                        error: "late".into()
                    }
                )]
            )
            .unwrap(),
        0
    );
    assert_eq!(fx.counts("e").in_process, 2);
    assert_eq!(
        fx.store
            .finish(new, &[(ids[0], Outcome::Sent), (ids[1], Outcome::Sent)])
            .unwrap(),
        2
    );
    assert_eq!(
        fx.counts("e"),
        txbox::TypeStatus::default(),
        "all processed"
    );
}

fn acked_rows_are_deleted_under_the_token_when_none_are_kept(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids = fx.publish(&c, "e", 4, true);
    let old = Uuid::now_v7();
    assert_eq!(fx.store.claim("e", 10, ms(300), old).unwrap().len(), 4);
    let mut recovered = 0;
    wait_until("the lease to expire", Duration::from_secs(10), || {
        recovered += fx.store.recover_expired(100).unwrap();
        recovered == 4
    });
    let new = Uuid::now_v7();
    assert_eq!(
        fx.store
            .claim("e", 10, Duration::from_secs(60), new)
            .unwrap()
            .len(),
        4
    );
    // the first relay comes back late: it deletes nothing
    let late: Vec<_> = ids.iter().map(|id| (*id, Outcome::SentDelete)).collect();
    assert_eq!(fx.store.finish(old, &late).unwrap(), 0);
    assert_eq!(fx.counts("e").in_process, 4);
    // acked and failed outcomes of one batch, together
    let outcomes = [
        (ids[0], Outcome::SentDelete),
        (ids[1], Outcome::SentDelete),
        (
            ids[2],
            Outcome::Retry {
                delay: Duration::from_secs(3600),
                error: "later".into(),
            },
        ),
        (
            ids[3],
            Outcome::Failed {
                error: "too large".into(),
            },
        ),
    ];
    assert_eq!(fx.store.finish(new, &outcomes).unwrap(), 4);
    let s = fx.counts("e");
    assert_eq!((s.pending, s.in_process, s.failed), (1, 0, 1));
    assert_eq!(
        fx.store.delete_processed(Duration::ZERO, 100).unwrap(),
        0,
        "the acked rows were deleted, not marked PROCESSED"
    );
    assert_eq!(fx.store.move_failed_to_dlq(10).unwrap(), 1);
    assert_eq!(
        Dlq::new(fx.store.clone())
            .get(ids[3])
            .unwrap()
            .last_error
            .as_deref(),
        Some("too large")
    );
}

fn retries_wait_for_their_backoff_then_fail(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids = fx.publish(&c, "e", 3, true);
    let t = Uuid::now_v7();
    fx.store.claim("e", 10, Duration::from_secs(60), t).unwrap();
    let outcomes = [
        (
            ids[0],
            Outcome::Retry {
                delay: ms(400),
                error: "broker down".into(),
            },
        ),
        (
            ids[1],
            Outcome::Retry {
                delay: Duration::from_secs(3600),
                error: "later".into(),
            },
        ),
        (
            ids[2],
            Outcome::Failed {
                error: "too large".into(),
            },
        ),
    ];
    assert_eq!(fx.store.finish(t, &outcomes).unwrap(), 3);
    let s = fx.counts("e");
    assert_eq!((s.pending, s.failed), (2, 1));
    assert!(
        fx.store
            .claim("e", 10, Duration::from_secs(60), Uuid::now_v7())
            .unwrap()
            .is_empty(),
        "not yet due"
    );
    let mut due = Vec::new();
    wait_until("the first retry to be due", Duration::from_secs(10), || {
        due = fx
            .store
            .claim("e", 10, Duration::from_secs(60), Uuid::now_v7())
            .unwrap();
        !due.is_empty()
    });
    assert_eq!(due.len(), 1);
    assert_eq!((due[0].id, due[0].attempts), (ids[0], 1));
}

fn dead_letters_move_list_retry_resolve_and_clean(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids = fx.publish(&c, "e", 3, true);
    let t = Uuid::now_v7();
    fx.store.claim("e", 10, Duration::from_secs(60), t).unwrap();
    let failed: Vec<_> = ids
        .iter()
        .map(|id| {
            (
                *id,
                Outcome::Failed {
                    error: "gone".into(),
                },
            )
        })
        .collect();
    fx.store.finish(t, &failed).unwrap();
    assert_eq!(fx.store.move_failed_to_dlq(2).unwrap(), 2, "bounded");
    assert_eq!(fx.store.move_failed_to_dlq(10).unwrap(), 1);
    assert_eq!(fx.counts("e").failed, 0);

    let dlq = Dlq::new(fx.store.clone());
    let all = dlq.list(&DlqFilter::default()).unwrap();
    assert_eq!(
        all.iter().map(|d| d.id).collect::<Vec<_>>(),
        ids,
        "moved-at, then id"
    );
    let d0 = &all[0];
    assert_eq!(
        (
            d0.attempts,
            d0.last_error.as_deref(),
            d0.payload_str().unwrap()
        ),
        (1, Some("gone"), "0")
    );
    assert_eq!(d0.status, DlqStatus::Dead);
    assert!(
        d0.moved_at.ends_with('Z') && d0.created_at.len() >= 20,
        "{} / {}",
        d0.created_at,
        d0.moved_at
    );
    let page = dlq
        .list(&DlqFilter {
            offset: 1,
            limit: 1,
            ..Default::default()
        })
        .unwrap();
    assert_eq!(page.iter().map(|d| d.id).collect::<Vec<_>>(), vec![ids[1]]);
    let other_type = DlqFilter {
        event_type: Some("f".into()),
        ..Default::default()
    };
    assert_eq!(dlq.count(&other_type).unwrap(), 0);

    dlq.resolve(ids[0]).unwrap();
    assert!(matches!(
        dlq.resolve(ids[0]).unwrap_err(),
        Error::InvalidTransition { .. }
    ));
    dlq.delete(ids[1]).unwrap();
    assert!(matches!(dlq.get(ids[1]).unwrap_err(), Error::NotFound(_)));
    assert_eq!(
        dlq.retry_many(&[ids[2], ids[1]]).unwrap(),
        vec![ids[2]],
        "absent ids are skipped"
    );
    assert_eq!(fx.store.requeue_dlq_retries(10).unwrap(), 1);
    let back = fx
        .store
        .claim("e", 10, Duration::from_secs(60), Uuid::now_v7())
        .unwrap();
    assert_eq!(
        (back.len(), back[0].id, back[0].attempts),
        (1, ids[2], 0),
        "fresh retry budget"
    );

    let resolved = DlqFilter {
        status: Some(DlqStatus::Resolved),
        ..Default::default()
    };
    assert_eq!(dlq.count(&resolved).unwrap(), 1);
    assert_eq!(
        fx.store
            .delete_resolved_dlq(Duration::from_secs(3600), 10)
            .unwrap(),
        0,
        "younger than the TTL"
    );
    std::thread::sleep(ms(30));
    assert_eq!(fx.store.delete_resolved_dlq(ms(10), 10).unwrap(), 1);
    assert_eq!(dlq.count(&DlqFilter::default()).unwrap(), 0);
}

fn binary_payloads_come_back_unchanged_through_the_dead_letters(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let big: Vec<u8> = (0..70_000u32).map(|i| (i % 251) as u8).collect();
    // a chunk of JSON and bytes together, then bytes alone, then JSON alone
    let ids = fx.publish_events(
        &c,
        vec![
            txbox::NewEvent::new("e", &7).unwrap(),
            txbox::NewEvent::bytes("e", crate::common::RAW_BYTES, "application/x-protobuf")
                .key("k"),
            txbox::NewEvent::bytes("e", Vec::new(), "application/octet-stream"),
        ],
    );
    let more = fx.publish_events(
        &c,
        vec![txbox::NewEvent::bytes("e", big.clone(), "application/avro")],
    );
    fx.publish(&c, "e", 1, true);
    let token = Uuid::now_v7();
    let got = fx
        .store
        .claim("e", 10, Duration::from_secs(60), token)
        .unwrap();
    let seen: Vec<(Vec<u8>, Option<&str>)> = got
        .iter()
        .map(|e| (e.payload.clone(), e.content_type.as_deref()))
        .collect();
    assert_eq!(
        seen,
        vec![
            (b"7".to_vec(), None),
            (
                crate::common::RAW_BYTES.to_vec(),
                Some("application/x-protobuf")
            ),
            (Vec::new(), Some("application/octet-stream")),
            (big.clone(), Some("application/avro")),
            (b"0".to_vec(), None),
        ]
    );
    assert_eq!(got[1].key.as_deref(), Some("k"));
    assert_eq!(got[4].content_type(), txbox::JSON_CONTENT_TYPE);

    // failed, dead-lettered, listed, retried: the bytes stay as they were
    let dying = [ids[1], more[0]];
    let outcomes = got
        .iter()
        .map(|e| {
            let o = if dying.contains(&e.id) {
                Outcome::Failed { error: "no".into() }
            } else {
                Outcome::Sent
            };
            (e.id, o)
        })
        .collect::<Vec<_>>();
    fx.store.finish(token, &outcomes).unwrap();
    assert_eq!(fx.store.move_failed_to_dlq(10).unwrap(), 2);
    let dlq = Dlq::new(fx.store.clone());
    let dead = dlq.get(ids[1]).unwrap();
    assert_eq!(
        (dead.payload.as_slice(), dead.content_type.as_deref()),
        (crate::common::RAW_BYTES, Some("application/x-protobuf"))
    );
    let json = serde_json::to_value(&dead).unwrap();
    assert_eq!(json["payload"], "/wD+XHg0MYAAwyg=", "base64 in JSON");
    assert_eq!(dlq.get(more[0]).unwrap().payload, big);
    dlq.retry_many(&[ids[1], more[0]]).unwrap();
    assert_eq!(fx.store.requeue_dlq_retries(10).unwrap(), 2);
    let back = fx
        .store
        .claim("e", 10, Duration::from_secs(60), Uuid::now_v7())
        .unwrap();
    assert_eq!(
        back.iter()
            .map(|e| (e.payload.clone(), e.content_type.clone()))
            .collect::<Vec<_>>(),
        vec![
            (
                crate::common::RAW_BYTES.to_vec(),
                Some("application/x-protobuf".into())
            ),
            (big, Some("application/avro".into()))
        ]
    );
}

fn cleanup_deletes_old_processed_rows_in_bounded_batches(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids = fx.publish(&c, "e", 12, true);
    let t = Uuid::now_v7();
    fx.store
        .claim("e", 100, Duration::from_secs(60), t)
        .unwrap();
    let sent: Vec<_> = ids.iter().map(|id| (*id, Outcome::Sent)).collect();
    assert_eq!(fx.store.finish(t, &sent).unwrap(), 12);
    assert_eq!(
        fx.store
            .delete_processed(Duration::from_secs(3600), 5)
            .unwrap(),
        0,
        "younger than the TTL"
    );
    std::thread::sleep(ms(30));
    assert_eq!(fx.store.delete_processed(ms(10), 5).unwrap(), 5);
    assert_eq!(fx.store.delete_processed(ms(10), 5).unwrap(), 5);
    assert_eq!(fx.store.delete_processed(ms(10), 5).unwrap(), 2);
}

fn lease_locks_have_one_holder(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let other = fx.another_store();
    let (a, b2) = (Uuid::now_v7(), Uuid::now_v7());
    assert!(fx.store.try_lock("job", a, ms(400)).unwrap());
    assert!(
        !other.try_lock("job", b2, Duration::from_secs(60)).unwrap(),
        "held"
    );
    assert!(
        fx.store.try_lock("job", a, ms(400)).unwrap(),
        "the holder renews"
    );
    assert!(
        other
            .try_lock("other-job", b2, Duration::from_secs(60))
            .unwrap(),
        "per name"
    );
    wait_until("the lease to run out", Duration::from_secs(10), || {
        other.try_lock("job", b2, Duration::from_secs(60)).unwrap()
    });
    assert!(!fx
        .store
        .try_lock("job", a, Duration::from_secs(60))
        .unwrap());
    other.unlock("job", b2).unwrap();
    assert!(
        fx.store
            .try_lock("job", a, Duration::from_secs(60))
            .unwrap(),
        "released"
    );
}

fn inbox_inserts_if_absent(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let (x, y) = (txbox::EventId::new(), txbox::EventId::new());
    assert_eq!(
        fx.store.inbox_insert("svc", &[x, y, x]).unwrap(),
        vec![x, y]
    );
    assert!(fx.store.inbox_insert("svc", &[x]).unwrap().is_empty());
    let inbox = Inbox::new(&c, "svc").unwrap();
    let z = txbox::EventId::new();
    assert!(fx.inbox_tx::<()>(&inbox, z, false).is_err());
    assert!(
        !fx.inbox_tx::<()>(&inbox, z, true).unwrap().is_duplicate(),
        "a rolled-back id was not recorded"
    );
    assert!(fx.inbox_tx::<()>(&inbox, z, true).unwrap().is_duplicate());
    assert!(fx.inbox_tx::<()>(&inbox, x, true).unwrap().is_duplicate());
    assert_eq!(
        fx.store
            .delete_expired_inbox(Duration::from_secs(3600), 10)
            .unwrap(),
        0
    );
    std::thread::sleep(ms(30));
    assert_eq!(
        fx.store.delete_expired_inbox(ms(10), 2).unwrap(),
        2,
        "bounded"
    );
    assert_eq!(fx.store.delete_expired_inbox(ms(10), 10).unwrap(), 1);
}

/// Two consumers of the same events in one database (billing and shipping) each
/// handle every event once: the inbox's key is (consumer, event id).
fn the_inbox_deduplicates_per_consumer(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids: Vec<EventId> = (0..500).map(|_| EventId::new()).collect();
    for consumer in ["billing", "shipping"] {
        assert_eq!(
            fx.store.inbox_insert(consumer, &ids).unwrap(),
            ids,
            "{consumer} sees every id as new"
        );
        assert!(
            fx.store.inbox_insert(consumer, &ids).unwrap().is_empty(),
            "{consumer} sees its redeliveries as duplicates"
        );
    }
    // through each inbox in a business transaction: each runs its handler once
    let (billing, shipping) = (
        Inbox::new(&c, "billing").unwrap(),
        Inbox::new(&c, "shipping").unwrap(),
    );
    let x = EventId::new();
    let mut handled = 0;
    for _ in 0..2 {
        for inbox in [&billing, &shipping] {
            if !fx.inbox_tx::<()>(inbox, x, true).unwrap().is_duplicate() {
                handled += 1;
            }
        }
    }
    assert_eq!(handled, 2, "once per consumer");
    // names are compared as they are written, on every database (MySQL's
    // default collation would fold case): `Billing` is another consumer
    let y = EventId::new();
    for consumer in ["billing", "Billing"] {
        assert_eq!(
            fx.store.inbox_insert(consumer, &[y]).unwrap(),
            vec![y],
            "{consumer} is a consumer of its own"
        );
    }
    // the store refuses a name the inbox would: `*` (the rows from before
    // the upgrade, consumed for everyone) and what the column cannot hold
    for bad in ["*".to_string(), "x".repeat(101), String::new()] {
        let err = fx.store.inbox_insert(&bad, &[EventId::new()]).unwrap_err();
        assert!(
            err.to_string().contains("inbox consumer name"),
            "{bad:?}: {err}"
        );
    }
}

/// A 0.1 inbox (keyed by the event id alone) is upgraded in place by `migrate`,
/// once: its rows are kept and still count as consumed for every consumer, and
/// new ids are kept per consumer.
fn migrate_upgrades_a_0_1_inbox_in_place_keeping_its_rows(b: Backend, p: &str) {
    let old: Vec<EventId> = (0..20).map(|_| EventId::new()).collect();
    let Some(fx) = Fixture::schema_v1(b, p, &old) else {
        return;
    };
    fx.store.migrate().unwrap();
    fx.store.migrate().unwrap(); // version 2 is applied once
    for consumer in ["billing", "shipping"] {
        assert!(
            fx.store.inbox_insert(consumer, &old).unwrap().is_empty(),
            "an id consumed before the upgrade is not handled again by {consumer}"
        );
    }
    let new = EventId::new();
    assert_eq!(fx.store.inbox_insert("billing", &[new]).unwrap(), vec![new]);
    assert_eq!(
        fx.store.inbox_insert("shipping", &[new]).unwrap(),
        vec![new]
    );
    assert!(fx.store.inbox_insert("billing", &[new]).unwrap().is_empty());
    // every row is still there, and the cleanup takes them by age
    std::thread::sleep(ms(30));
    assert_eq!(fx.store.delete_expired_inbox(ms(10), 100).unwrap(), 22);
}

/// Events of a key waiting when the schema is upgraded to the database's
/// insert order keep their order (their ids'), and come before every event
/// published after the upgrade; the key still has one event out at a time.
fn an_upgrade_keeps_the_order_of_the_events_waiting(b: Backend, p: &str) {
    let Some(fx) = Fixture::schema_v1(b, p, &[]) else {
        return;
    };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.ordering(txbox::EventOrder::Key))
        .build()
        .unwrap();
    let mut ids = fx.publish_events(&c, keyed("e", &["a"], 3));
    fx.store.migrate().unwrap();
    ids.extend(fx.publish_events(&c, keyed("e", &["a"], 2)));
    let args = ClaimArgs::new("e", 100, Duration::from_secs(60)).ordered(txbox::OnPoison::Block);
    let mut sent = Vec::new();
    for _ in 0..ids.len() {
        let token = Uuid::now_v7();
        let got: Vec<EventId> = fx
            .store
            .claim_after(&args, token)
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(got.len(), 1, "one event of the key at a time: {got:?}");
        fx.store.finish(token, &[(got[0], Outcome::Sent)]).unwrap();
        sent.extend(got);
    }
    assert_eq!(sent, ids, "in publish order across the upgrade");
}

/// After the upgrade: ids from before it are consumed for every consumer, new
/// ones are kept per consumer.
fn upgraded_inbox_works(fx: &Fixture, old: &[EventId]) {
    assert!(fx.store.inbox_insert("billing", old).unwrap().is_empty());
    let new = EventId::new();
    assert_eq!(fx.store.inbox_insert("billing", &[new]).unwrap(), vec![new]);
    assert_eq!(
        fx.store.inbox_insert("shipping", &[new]).unwrap(),
        vec![new]
    );
}

/// Two instances starting at once on a 0.1 table both migrate without an error,
/// and the upgrade is applied once.
fn two_instances_migrating_at_once_both_succeed(b: Backend, p: &str) {
    let old = [EventId::new()];
    let Some(fx) = Fixture::schema_v1(b, p, &old) else {
        return;
    };
    let stores = [fx.another_store(), fx.another_store()];
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let runs: Vec<_> = stores
            .iter()
            .map(|st| {
                s.spawn(|| {
                    barrier.wait();
                    st.migrate()
                })
            })
            .collect();
        for r in runs {
            r.join().unwrap().unwrap();
        }
    });
    upgraded_inbox_works(&fx, &old);
}

/// The tests that run four relays take one backend's turn each: two at once,
/// beside the rest of the suite, took more connections than PostgreSQL's
/// default 100.
fn four_relays_turn(b: Backend) -> std::sync::MutexGuard<'static, ()> {
    static TURNS: [Mutex<()>; 4] = [
        Mutex::new(()),
        Mutex::new(()),
        Mutex::new(()),
        Mutex::new(()),
    ];
    TURNS[b as usize % 4]
        .lock()
        .unwrap_or_else(|p| p.into_inner())
}

fn four_relays_deliver_every_event_exactly_once(b: Backend, p: &str) {
    let _turn = four_relays_turn(b);
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let mut published = HashSet::new();
    for _ in 0..10 {
        published.extend(fx.publish(&c, "e", 1000, true));
    }
    let senders: Vec<MemorySender> = (0..4).map(|_| MemorySender::new()).collect();
    let relays: Vec<Relay> = senders
        .iter()
        .enumerate()
        .map(|(i, s)| {
            let store = if i == 0 {
                fx.store.clone()
            } else {
                fx.another_store()
            };
            Relay::start(store, &c, s.clone()).unwrap()
        })
        .collect();
    let total = || senders.iter().map(MemorySender::len).sum::<usize>();
    wait_until("10,000 deliveries", Duration::from_secs(180), || {
        total() >= 10_000
    });
    wait_until("nothing left in process", Duration::from_secs(30), || {
        fx.counts("e") == txbox::TypeStatus::default()
    });
    crate::common::shut_down_and_check_each_once(relays, &senders, &published);
}

fn failing_sender_ends_in_the_dlq_and_a_retry_delivers(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| {
            e.fixed_polling(ms(20))
                .max_retries(1)
                .backoff_delay(ms(50))
                .backoff_jitter(0.0)
        })
        .dlq(true)
        .dlq_move_interval(ms(50))
        .dlq_retry_interval(ms(50))
        .build()
        .unwrap();
    let ids = fx.publish(&c, "e", 2, true);
    let sender = MemorySender::new();
    let bad = ids[1];
    sender.fail_when(move |e| (e.id == bad).then(|| "rejected".to_string()));
    let relay = Relay::start(fx.store.clone(), &c, sender.clone()).unwrap();
    let dlq = Dlq::new(fx.store.clone());
    wait_until("the bad event in the DLQ", Duration::from_secs(20), || {
        dlq.get(bad).is_ok()
    });
    assert_eq!(dlq.get(bad).unwrap().attempts, 2);
    assert_eq!(
        sender.sent().iter().map(|e| e.id).collect::<Vec<_>>(),
        vec![ids[0]],
        "the good one went alone"
    );
    sender.succeed_all();
    dlq.retry(bad).unwrap();
    wait_until(
        "the retried event delivered",
        Duration::from_secs(20),
        || sender.len() == 2,
    );
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(dlq.count(&DlqFilter::default()).unwrap(), 0);
}

/// A sender that keeps every started batch until the relay waits for it, fails one
/// event once, and remembers what it acked.
#[derive(Clone, Default)]
struct Pipelined(Arc<Mutex<PipeState>>);

#[derive(Default)]
struct PipeState {
    queue: VecDeque<Vec<Event>>,
    most_in_flight: usize,
    fail_once: Option<EventId>,
    /// Fails transiently (broker unreachable) once, and remembers it did.
    release_once: Option<EventId>,
    released: bool,
    starts: HashMap<EventId, usize>,
    acked: Vec<EventId>,
    plain_sends: usize,
}

impl Sender for Pipelined {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        self.0.lock().unwrap().plain_sends += 1;
        events
            .iter()
            .map(|_| Err(SendError::new("use start")))
            .collect()
    }
    fn start(&mut self, events: &[Event]) -> Started {
        let mut s = self.0.lock().unwrap();
        for e in events {
            *s.starts.entry(e.id).or_default() += 1;
        }
        s.queue.push_back(events.to_vec());
        s.most_in_flight = s.most_in_flight.max(s.queue.len());
        Started::InFlight
    }
    fn wait(&mut self) -> Vec<Result<(), SendError>> {
        let mut s = self.0.lock().unwrap();
        let batch = s.queue.pop_front().unwrap_or_default();
        batch
            .iter()
            .map(|e| {
                if s.fail_once == Some(e.id) {
                    s.fail_once = None;
                    return Err(SendError::new("refused once"));
                }
                if s.release_once == Some(e.id) {
                    s.release_once = None;
                    s.released = true;
                    return Err(SendError::transient("connection reset"));
                }
                s.acked.push(e.id);
                Ok(())
            })
            .collect()
    }
}

/// A transport failure in the oldest of three batches in flight: the poller
/// backs off, but first waits for the two batches still with the broker and
/// finishes them, so a stop during the backoff leaves nothing IN_PROCESS (acked
/// rows would otherwise be recovered after their lease and sent again).
fn a_release_finishes_the_batches_in_flight_before_backing_off(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| {
            e.batch_size(100)
                .in_flight(3)
                // the backoff after the failure: long enough to stop in it
                .adaptive_polling(Duration::from_secs(5), Duration::from_secs(10), 1.5)
        })
        .build()
        .unwrap();
    let ids = fx.publish(&c, "e", 1000, true);
    let sender = Pipelined::default();
    sender.0.lock().unwrap().release_once = Some(ids[50]);
    let s = sender.clone();
    let relay = Relay::start(fx.store.clone(), &c, move || {
        Ok(Box::new(s.clone()) as Box<dyn Sender>)
    })
    .unwrap();
    wait_until("the transport failure", Duration::from_secs(20), || {
        sender.0.lock().unwrap().released
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();
    let counts = fx.counts("e");
    assert_eq!(counts.in_process, 0, "batches left in flight: {counts:?}");
    let acked = sender.0.lock().unwrap().acked.len() as u64;
    assert_eq!(counts.pending, 1000 - acked, "every acked event finished");
}

/// A relay sleeping in a long polling delay (30 s) sends an event within a
/// second of the wake-up its publisher gives after the commit
/// ([`txbox::RelayWaker`]): the cheap handle every dialect has.
fn a_wake_after_the_commit_sends_at_once_on_every_dialect(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| {
            e.adaptive_polling(Duration::from_secs(30), Duration::from_secs(60), 1.5)
                .wake(txbox::Wake::Poll)
        })
        .build()
        .unwrap();
    let sender = MemorySender::new();
    let relay = Relay::start(fx.store.clone(), &c, sender.clone()).unwrap();
    let waker = relay.waker();
    std::thread::sleep(ms(300)); // the first poll found nothing: 30 s to the next
    let ids = fx.publish(&c, "e", 3, true);
    let t = std::time::Instant::now();
    waker.wake("e");
    wait_until("the woken relay sent them", Duration::from_secs(5), || {
        sender.len() >= 3
    });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let sent: HashSet<EventId> = sender.sent().iter().map(|e| e.id).collect();
    assert_eq!(sent, ids.into_iter().collect());
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

fn pipelined_batches_finish_in_order_and_retry(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| {
            e.batch_size(100)
                .in_flight(2)
                .adaptive_polling(ms(10), ms(100), 1.5)
                .backoff_delay(ms(50))
                .backoff_jitter(0.0)
        })
        .build()
        .unwrap();
    let ids = fx.publish(&c, "e", 1000, true);
    let sender = Pipelined::default();
    let bad = ids[450]; // in the middle of a batch that another follows
    sender.0.lock().unwrap().fail_once = Some(bad);
    let s = sender.clone();
    let relay = Relay::start(fx.store.clone(), &c, move || {
        Ok(Box::new(s.clone()) as Box<dyn Sender>)
    })
    .unwrap();
    wait_until("1,000 acks", Duration::from_secs(60), || {
        sender.0.lock().unwrap().acked.len() >= 1000
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(fx.counts("e"), txbox::TypeStatus::default(), "all finished");
    let s = sender.0.lock().unwrap();
    assert_eq!(
        s.most_in_flight, 2,
        "the next batch started before the acks"
    );
    assert_eq!(s.plain_sends, 0);
    let acked: HashSet<EventId> = s.acked.iter().copied().collect();
    assert_eq!(acked.len(), s.acked.len(), "an event acked twice");
    assert_eq!(acked, ids.iter().copied().collect::<HashSet<_>>());
    assert_eq!(s.starts[&bad], 2, "the refused event was sent again");
    assert_eq!(
        s.starts.values().filter(|n| **n > 1).count(),
        1,
        "only the refused event was sent twice"
    );
}

fn migrate_twice_is_fine(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    fx.store.migrate().unwrap();
    fx.store.migrate().unwrap();
    assert!(fx.store.status().unwrap().is_empty());
}

fn ping_answers_without_reading_a_table(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    fx.store.ping().unwrap();
    // a prefix whose tables were never created: the database still answers
    let bare = Fixture::new_existing(b, &format!("{p}none_"));
    assert!(bare.store.dlq_count(&DlqFilter::default()).is_err());
    bare.store.ping().unwrap();
}

/// `n` events of type `event_type` for each key of `keys` (payload: the key and
/// its sequence number), published round-robin over the keys so the keys'
/// events interleave by id.
fn keyed(event_type: &str, keys: &[&str], n: usize) -> Vec<txbox::NewEvent> {
    (0..n)
        .flat_map(|i| {
            keys.iter().map(move |k| {
                let e = txbox::NewEvent::new(event_type, &serde_json::json!([k, i])).unwrap();
                if k.is_empty() {
                    e
                } else {
                    e.key(*k)
                }
            })
        })
        .collect()
}

/// An ordered claim whose oldest waiting events all wait for keys in process
/// walks the keys in order from the cursor it is given, past the busy ones, to
/// the heads of the keys behind them; from the first key when given none.
fn ordered_claims_walk_the_keys_from_a_cursor(b: Backend, p: &str) {
    if !b.walks_keys() {
        eprintln!("SKIPPED: {b:?}'s ordered claims read due events in id order (no key walk)");
        return;
    }
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.ordering(txbox::EventOrder::Key))
        .build()
        .unwrap();
    let names: Vec<String> = (0..10).map(|k| format!("a{k}")).collect();
    let front: Vec<&str> = names.iter().map(String::as_str).collect();
    // ten keys with ten events each first (ids by round: a0 .. a9), then one
    // event each of thirty keys k00 .. k29
    let deep = fx.publish_events(&c, keyed("e", &front, 10));
    let names: Vec<String> = (0..30).map(|k| format!("k{k:02}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let k = fx.publish_events(&c, keyed("e", &keys, 1));
    let claim = |from_key: Option<&str>| -> (Uuid, Vec<EventId>) {
        let args = ClaimArgs::new("e", 10, Duration::from_secs(60))
            .ordered(txbox::OnPoison::Block)
            .from_key(from_key);
        let token = Uuid::now_v7();
        let got = fx.store.claim_after(&args, token).unwrap();
        (token, got.iter().map(|e| e.id).collect())
    };
    let (t, heads) = claim(None);
    assert_eq!(
        heads,
        deep[..10],
        "the oldest events: the ten a-keys' heads"
    );
    // the oldest waiting events are now the a-keys' next ones, all held back
    assert_eq!(claim(None).1, k[..10], "past the ten busy keys: k00 .. k09");
    assert_eq!(
        claim(Some("k25")).1,
        k[25..],
        "from the cursor to the last key"
    );
    assert_eq!(claim(Some("k25")).1, vec![], "k25 .. k29 are busy");
    assert_eq!(claim(None).1, k[10..20]);
    assert_eq!(claim(None).1, k[20..25]);
    assert_eq!(claim(None).1, vec![], "every key busy");
    // the a-keys' heads sent: their next events are the oldest, and go first
    let sent: Vec<(EventId, Outcome)> = heads.iter().map(|id| (*id, Outcome::Sent)).collect();
    fx.store.finish(t, &sent).unwrap();
    assert_eq!(claim(Some("k25")).1, deep[10..20]);
}

/// An ordered type's claim takes the first waiting event of each key (and every
/// event without a key): a key's next event only once the one before it is
/// sent; a retry keeps its place; a failed event holds its key back with
/// `block` (listed by `blocked_keys`, released by resolving its dead letter)
/// and not with `skip`.
fn ordered_claims_take_one_event_per_key_in_order(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.ordering(txbox::EventOrder::Key))
        .event("s", |e| {
            e.ordering(txbox::EventOrder::Key)
                .on_poison(txbox::OnPoison::Skip)
        })
        .build()
        .unwrap();
    let lease = Duration::from_secs(60);
    let claim = |t: &str, policy: txbox::OnPoison| -> (Uuid, Vec<EventId>) {
        let token = Uuid::now_v7();
        let args = ClaimArgs::new(t, 100, lease).ordered(policy);
        let got = fx.store.claim_after(&args, token).unwrap();
        (token, got.iter().map(|e| e.id).collect())
    };
    let block = txbox::OnPoison::Block;
    // ids by round: a0 b0 -0, a1 b1 -1, a2 b2 -2 (`-`: no key)
    let ids = fx.publish_events(&c, keyed("e", &["a", "b", ""], 3));
    let at = |key: usize, i: usize| ids[i * 3 + key];
    let (t1, first) = claim("e", block);
    assert_eq!(
        first,
        vec![at(0, 0), at(1, 0), at(2, 0), at(2, 1), at(2, 2)],
        "each key's first event and every event without a key"
    );
    assert_eq!(claim("e", block).1, vec![], "the keys' next events wait");
    // a0 sent, b0 to be retried: a1 is next; b0 keeps its place before b1
    let retry = Outcome::Retry {
        delay: Duration::ZERO,
        error: "x".into(),
    };
    let sent: Vec<(EventId, Outcome)> = [at(0, 0), at(2, 0), at(2, 1), at(2, 2)]
        .into_iter()
        .map(|id| (id, Outcome::Sent))
        .chain([(at(1, 0), retry)])
        .collect();
    assert_eq!(fx.store.finish(t1, &sent).unwrap(), 5);
    let (t2, second) = claim("e", block);
    assert_eq!(second, vec![at(1, 0), at(0, 1)], "b0 again, before b1; a1");
    // b0 used up its retries: with `block` b1 waits, in the outbox and as a
    // dead letter, until the dead letter is resolved
    let failed = Outcome::Failed {
        error: "poison".into(),
    };
    fx.store
        .finish(t2, &[(at(0, 1), Outcome::Sent), (at(1, 0), failed.clone())])
        .unwrap();
    assert_eq!(
        claim("e", block).1,
        vec![at(0, 2)],
        "b1 waits behind FAILED b0"
    );
    let dlq = Dlq::new(fx.store.clone());
    let blocked = dlq.blocked_keys(&c).unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(
        (
            blocked[0].key.as_str(),
            blocked[0].blocked_by,
            blocked[0].status.as_str(),
            blocked[0].waiting
        ),
        ("b", at(1, 0), "FAILED", 2)
    );
    assert_eq!(fx.store.move_failed_to_dlq(10).unwrap(), 1);
    assert_eq!(claim("e", block).1, vec![], "b1 waits behind dead b0");
    assert_eq!(dlq.blocked_keys(&c).unwrap()[0].status, "DEAD");
    dlq.resolve(at(1, 0)).unwrap();
    assert!(dlq.blocked_keys(&c).unwrap().is_empty());
    assert_eq!(claim("e", block).1, vec![at(1, 1)], "resolved: b goes on");

    // `skip`: the key goes on past its failed event
    let skip = txbox::OnPoison::Skip;
    let ids = fx.publish_events(&c, keyed("s", &["k"], 2));
    let (t, got) = claim("s", skip);
    assert_eq!(got, vec![ids[0]]);
    fx.store.finish(t, &[(ids[0], failed)]).unwrap();
    assert_eq!(claim("s", skip).1, vec![ids[1]], "skip: k goes on");
    assert!(
        dlq.blocked_keys(&c).unwrap().is_empty(),
        "a skipping type blocks no key"
    );

    // keys are compared byte for byte (MySQL's default collation would fold
    // case, accents and trailing spaces into one key)
    let ids = fx.publish_events(&c, keyed("s", &["Case", "case", "cáse", "case "], 1));
    assert_eq!(claim("s", skip).1, ids, "four keys, four heads");
}

/// Four relays on one table, 200 keys x 50 events and a sender that fails 5%
/// of the sends once: each key's events reach the sender in publish order (a retry may
/// repeat the key's latest, never go back to an earlier one), none lost.
fn four_relays_keep_each_keys_order(b: Backend, p: &str) {
    let _turn = four_relays_turn(b);
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| {
            e.ordering(txbox::EventOrder::Key)
                .adaptive_polling(ms(10), ms(100), 1.5)
                .batch_size(50)
                .max_retries(5)
                .backoff_delay(ms(20))
        })
        .build()
        .unwrap();
    let keys: Vec<String> = (0..200).map(|k| format!("key-{k}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // rounds 0..25 before the relays start, 25..50 while they run (in
    // transactions of 200 events, each key's sequence going on)
    let mut ids = fx.publish_events(&c, keyed("e", &key_refs, 25));
    let sender = MemorySender::new();
    let failed_once = Arc::new(Mutex::new(HashSet::new()));
    sender.fail_when(move |e| {
        let unlucky = e.id.as_uuid().as_u128() % 20 == 0;
        (unlucky && failed_once.lock().unwrap().insert(e.id)).then(|| "refused once".to_string())
    });
    let relays: Vec<Relay> = (0..4)
        .map(|i| {
            let store = if i == 0 {
                fx.store.clone()
            } else {
                fx.another_store()
            };
            Relay::start(store, &c, sender.clone()).unwrap()
        })
        .collect();
    for round in 25..50 {
        let events = key_refs
            .iter()
            .map(|k| {
                txbox::NewEvent::new("e", &serde_json::json!([k, round]))
                    .unwrap()
                    .key(*k)
            })
            .collect();
        ids.extend(fx.publish_events(&c, events));
    }
    wait_until("every event sent", Duration::from_secs(120), || {
        fx.counts("e") == txbox::TypeStatus::default()
    });
    for r in relays {
        r.shutdown(Duration::from_secs(10)).unwrap();
    }
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut seen = HashSet::new();
    for e in sender.sent() {
        let (k, i): (String, i64) = serde_json::from_slice(&e.payload).unwrap();
        let before = last.insert(k.clone(), i).unwrap_or(-1);
        assert!(i >= before, "{k}: event {i} arrived after event {before}");
        assert!(
            i <= before + 1,
            "{k}: event {i} arrived before event {}",
            before + 1
        );
        seen.insert(e.id);
    }
    assert_eq!(seen, ids.into_iter().collect::<HashSet<_>>(), "none lost");
}

/// One key's third event always fails. `block`: the key's later events wait,
/// listed by `blocked_keys`, while every other key drains; resolving the dead
/// letter releases them, in order. `skip`: the key goes on once the retries are
/// used up, and the metric counts the skipped event.
fn a_poison_event_blocks_or_is_skipped(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let ordered = |e: txbox::EventSettings| {
        e.ordering(txbox::EventOrder::Key)
            .fixed_polling(ms(20))
            .max_retries(1)
            .backoff_delay(ms(20))
            .backoff_jitter(0.0)
    };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", ordered)
        .event("s", |e| ordered(e).on_poison(txbox::OnPoison::Skip))
        .dlq(true)
        .dlq_move_interval(ms(50))
        .build()
        .unwrap();
    let keys = ["k0", "k1", "k2", "k3"];
    let block = fx.publish_events(&c, keyed("e", &keys, 10));
    let skip = fx.publish_events(&c, keyed("s", &keys, 10));
    // k1's third event (round 2) of each type
    let (poison, poison_s) = (block[2 * 4 + 1], skip[2 * 4 + 1]);
    let sender = MemorySender::new();
    sender.fail_when(move |e| {
        [poison, poison_s]
            .contains(&e.id)
            .then(|| "poison".to_string())
    });
    let skipped_before = txbox::metrics::snapshot().ordered_skipped;
    let relay = Relay::start(fx.store.clone(), &c, sender.clone()).unwrap();
    let dlq = Dlq::new(fx.store.clone());
    let of = |t: &str, key: &str| -> Vec<i64> {
        sender
            .sent()
            .iter()
            .filter(|e| e.event_type == t)
            .map(|e| serde_json::from_slice::<(String, i64)>(&e.payload).unwrap())
            .filter(|(k, _)| k == key)
            .map(|(_, i)| i)
            .collect()
    };
    let k1_blocked = || {
        dlq.blocked_keys(&c)
            .unwrap()
            .iter()
            .any(|k| k.key == "k1" && k.blocked_by == poison && k.status == "DEAD")
    };
    wait_until(
        "the other keys drained, k1 blocked by its dead letter",
        Duration::from_secs(30),
        || ["k0", "k2", "k3"].iter().all(|k| of("e", k).len() == 10) && k1_blocked(),
    );
    let blocked = dlq.blocked_keys(&c).unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(blocked[0].waiting, 7, "k1's events 3..9 wait");
    assert_eq!(of("e", "k1"), vec![0, 1], "nothing of k1 after the poison");
    // the skipping type went on past its poison
    wait_until(
        "every skip event but the poison",
        Duration::from_secs(30),
        || keys.iter().map(|k| of("s", k).len()).sum::<usize>() == 39,
    );
    assert_eq!(of("s", "k1"), vec![0, 1, 3, 4, 5, 6, 7, 8, 9]);
    assert!(txbox::metrics::snapshot().ordered_skipped > skipped_before);
    // resolving the dead letter releases k1, in order
    dlq.resolve(poison).unwrap();
    wait_until("k1 released", Duration::from_secs(30), || {
        of("e", "k1").len() == 9
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(of("e", "k1"), vec![0, 1, 3, 4, 5, 6, 7, 8, 9]);
}

/// `Relay::deliver_pending` sends what is due now on the caller's thread and
/// reports it per type: a refused event is sent again within the call when its
/// backoff has passed (1 ms for type `g`, whose next event's send takes
/// longer), and waits for a later call
/// when it has not (an hour for `f`); an ordered key's events all go, in order;
/// a second call finds nothing.
fn deliver_pending_sends_what_is_due_and_reports_it(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .event("f", |e| e.backoff_delay(Duration::from_secs(3600)))
        .event("g", |e| {
            e.batch_size(1)
                .backoff_delay(Duration::from_millis(1))
                .backoff_jitter(0.0)
        })
        .event("o", |e| {
            e.ordering(txbox::EventOrder::Key)
                .batch_size(10)
                .backoff_delay(Duration::from_secs(3600))
        })
        .build()
        .unwrap();
    let e = fx.publish(&c, "e", 3, true);
    let f = fx.publish(&c, "f", 2, true);
    let g = fx.publish(&c, "g", 2, true);
    let o = fx.publish_events(&c, keyed("o", &["k"], 3));
    // key j's first event is refused: its second waits (the order is kept)
    let j = fx.publish_events(&c, keyed("o", &["j"], 2));
    let sender = MemorySender::new();
    let bad = [f[0], j[0]];
    let (g0, g1, g_refused) = (g[0], g[1], std::sync::atomic::AtomicBool::new(false));
    sender.fail_when(move |e| {
        if e.id == g1 {
            // g0's 1 ms backoff passes while g1 is "sent"
            std::thread::sleep(Duration::from_millis(5));
        }
        let once = e.id == g0 && !g_refused.swap(true, std::sync::atomic::Ordering::SeqCst);
        (bad.contains(&e.id) || once).then(|| "refused".to_string())
    });
    let report = Relay::deliver_pending(&*fx.store, &c, &mut sender.clone()).unwrap();
    let t = |name: &str| report.by_type.get(name).copied().unwrap_or_default();
    assert_eq!((t("e").sent, t("e").retried), (3, 0));
    assert_eq!((t("f").sent, t("f").retried, t("f").failed), (1, 1, 0));
    assert_eq!(
        (t("g").sent, t("g").retried),
        (2, 1),
        "g0 refused, then sent again in the same call"
    );
    assert_eq!(
        (t("o").sent, t("o").retried),
        (3, 1),
        "k's three; j's first refused"
    );
    assert_eq!((report.sent(), report.not_sent()), (9, 3));
    assert!(
        !sender.sent().iter().any(|e| e.id == j[1]),
        "j's second waits behind its refused first"
    );
    let sent: Vec<EventId> = sender.sent().iter().map(|e| e.id).collect();
    let of_o: Vec<EventId> = sent.iter().copied().filter(|id| o.contains(id)).collect();
    assert_eq!(of_o, o, "in order");
    assert!(
        e.iter().all(|id| sent.contains(id))
            && sent.contains(&f[1])
            && g.iter().all(|id| sent.contains(id))
    );
    assert!(sender.sent().iter().all(|e| e.destination == e.event_type));
    assert_eq!(
        fx.counts("f").pending,
        1,
        "the refused one waits for its backoff"
    );
    let again = Relay::deliver_pending(&*fx.store, &c, &mut sender.clone()).unwrap();
    assert_eq!(again, txbox::Delivery::default(), "nothing due");
}

/// The suite, instantiated per backend; each test gets its own table prefix
/// (`c<tag>_<short>_`).
macro_rules! suite {
    ($module:ident, $backend:expr, $tag:literal) => {
        suite!(@tests $module, $backend, $tag;
            publish_commits_and_rollback_leaves_nothing => "pub",
            claims_are_disjoint_and_bounded => "claim",
            claims_after_an_id_skip_lower_ones_until_asked_without => "after",
            finish_checks_the_token_and_recovery_counts_no_attempt => "fence",
            acked_rows_are_deleted_under_the_token_when_none_are_kept => "del",
            retries_wait_for_their_backoff_then_fail => "retry",
            dead_letters_move_list_retry_resolve_and_clean => "dlq",
            binary_payloads_come_back_unchanged_through_the_dead_letters => "bin",
            cleanup_deletes_old_processed_rows_in_bounded_batches => "clean",
            lease_locks_have_one_holder => "lock",
            inbox_inserts_if_absent => "inbox",
            the_inbox_deduplicates_per_consumer => "fan",
            migrate_upgrades_a_0_1_inbox_in_place_keeping_its_rows => "up",
            two_instances_migrating_at_once_both_succeed => "up2",
            an_upgrade_keeps_the_order_of_the_events_waiting => "upord",
            four_relays_deliver_every_event_exactly_once => "four",
            failing_sender_ends_in_the_dlq_and_a_retry_delivers => "relay",
            pipelined_batches_finish_in_order_and_retry => "pipe",
            a_release_finishes_the_batches_in_flight_before_backing_off => "rel",
            a_wake_after_the_commit_sends_at_once_on_every_dialect => "wake",
            ordered_claims_take_one_event_per_key_in_order => "ord",
            ordered_claims_walk_the_keys_from_a_cursor => "walk",
            four_relays_keep_each_keys_order => "ord4",
            a_poison_event_blocks_or_is_skipped => "poison",
            deliver_pending_sends_what_is_due_and_reports_it => "flush",
            migrate_twice_is_fine => "mig",
            ping_answers_without_reading_a_table => "ping",
        );
    };
    (@tests $module:ident, $backend:expr, $tag:literal; $($test:ident => $short:literal,)*) => {
        mod $module {
            use super::*;
            $(
                #[test]
                fn $test() {
                    super::$test($backend, concat!("c", $tag, "_", $short, "_"));
                }
            )*
        }
    };
}

suite!(postgres, Backend::Postgres, "pg");
#[cfg(feature = "mysql")]
suite!(mysql, Backend::MySql, "my");
#[cfg(feature = "sqlite")]
suite!(sqlite, Backend::Sqlite, "lite");
#[cfg(feature = "oracle")]
suite!(oracle, Backend::Oracle, "ora");

/// MySQL commits each DDL statement: a migration that stopped after its key
/// change (before it recorded its version) is resumed by the next `migrate`.
#[cfg(feature = "mysql")]
#[test]
fn mysql_resumes_an_upgrade_that_stopped_half_way() {
    use ::mysql::prelude::Queryable;
    let p = "cmy_half_";
    let old = [EventId::new()];
    let Some(fx) = Fixture::schema_v1(Backend::MySql, p, &old) else {
        return;
    };
    let pool = ::mysql::Pool::new(crate::common::backend::mysql_url().as_str()).unwrap();
    let mut c = pool.get_conn().unwrap();
    // the first statement of 002 only, as a migration that died after it
    let first = include_str!("../../sql/mysql/002_inbox_per_consumer.sql")
        .replace("{prefix}", p)
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let first = first.split(';').next().unwrap().to_string();
    c.query_drop(first).unwrap();
    fx.store.migrate().unwrap();
    fx.store.migrate().unwrap();
    upgraded_inbox_works(&fx, &old);
    let versions: Vec<i32> = c
        .query(format!("SELECT version FROM {p}txbox_schema_version"))
        .unwrap();
    assert_eq!(versions, vec![2, 3, 4, 5]);
}

/// Suspected: the MySQL/MariaDB inbox insert (`INSERT IGNORE ... SELECT ...
/// WHERE NOT EXISTS`) takes next-key locks under the caller's default
/// REPEATABLE READ, and new UUIDv7 ids share the last gap, so concurrent
/// consumers could deadlock (error 1213). Eight threads record fresh ids in
/// default-isolation transactions for 10 s, from an empty inbox on: no
/// deadlock, and every id recorded once.
#[cfg(feature = "mysql")]
#[test]
fn mysql_inbox_inserts_from_concurrent_consumers_do_not_deadlock() {
    use ::mysql::prelude::Queryable;
    use std::sync::atomic::{AtomicU64, Ordering};
    let p = "cmy_inbox_race_";
    let Some(_fx) = Fixture::new(Backend::MySql, p) else {
        return;
    };
    let config = txbox::Config::builder().table_prefix(p).build().unwrap();
    let inbox = txbox::Inbox::new(&config, "billing").unwrap();
    let pool = ::mysql::Pool::new(crate::common::backend::mysql_url().as_str()).unwrap();
    let (recorded, deadlocks, other) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let until = std::time::Instant::now() + Duration::from_secs(10);
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (inbox, pool) = (inbox.clone(), pool.clone());
            let (recorded, deadlocks, other) = (&recorded, &deadlocks, &other);
            s.spawn(move || {
                let mut c = pool.get_conn().unwrap();
                while std::time::Instant::now() < until {
                    let mut tx = c.start_transaction(::mysql::TxOpts::default()).unwrap();
                    let r = inbox.handle_in(&mut tx, EventId::new(), |_| Ok::<_, txbox::Error>(()));
                    match r {
                        Ok(h) if !h.is_duplicate() => {
                            tx.commit().unwrap();
                            recorded.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => panic!("a fresh id was a duplicate"),
                        Err(e) if e.to_string().contains("1213") => {
                            deadlocks.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            eprintln!("inbox insert: {e}");
                            other.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let (recorded, deadlocks, other) = (
        recorded.into_inner(),
        deadlocks.into_inner(),
        other.into_inner(),
    );
    eprintln!("mysql inbox, 8 threads for 10 s: {recorded} recorded, {deadlocks} deadlocks, {other} other errors");
    assert_eq!((deadlocks, other), (0, 0));
    let mut c = pool.get_conn().unwrap();
    let rows: u64 = c
        .query_first(format!("SELECT COUNT(*) FROM {p}inbox_consumed"))
        .unwrap()
        .unwrap();
    assert_eq!(rows, recorded, "every id recorded once");
    assert!(recorded > 100, "the consumers made progress: {recorded}");
}
