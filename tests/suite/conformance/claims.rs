//! Publishing, claiming, finishing, retries, cleanup and the lease locks.

use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use crate::common::wait_until;
use txbox::store::{ClaimArgs, Outcome};
use txbox::{Dlq, DlqFilter, EventId};
use uuid::Uuid;

use super::{config, ms};

pub(super) fn publish_commits_and_rollback_leaves_nothing(b: Backend, p: &str) {
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

pub(super) fn claims_are_disjoint_and_bounded(b: Backend, p: &str) {
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

pub(super) fn claims_after_an_id_skip_lower_ones_until_asked_without(b: Backend, p: &str) {
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

pub(super) fn finish_checks_the_token_and_recovery_counts_no_attempt(b: Backend, p: &str) {
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

pub(super) fn acked_rows_are_deleted_under_the_token_when_none_are_kept(b: Backend, p: &str) {
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

pub(super) fn retries_wait_for_their_backoff_then_fail(b: Backend, p: &str) {
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

pub(super) fn cleanup_deletes_old_processed_rows_in_bounded_batches(b: Backend, p: &str) {
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

pub(super) fn lease_locks_have_one_holder(b: Backend, p: &str) {
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

pub(super) fn ping_answers_without_reading_a_table(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    fx.store.ping().unwrap();
    // a prefix whose tables were never created: the database still answers
    let bare = Fixture::new_existing(b, &format!("{p}none_"));
    assert!(bare.store.dlq_count(&DlqFilter::default()).is_err());
    bare.store.ping().unwrap();
}

/// What a store says it can do is what it does: a held claim and commit
/// notifications work where its capabilities name them, and are refused with
/// `Error::Unsupported` elsewhere (the driver's sessions and the dialect's
/// statements agree).
pub(super) fn a_store_does_what_its_capabilities_say(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let caps = fx.store.capabilities();
    let both = matches!(b, Backend::Postgres);
    assert_eq!(
        (caps.held_claims, caps.notifications),
        (both, both),
        "{b:?}"
    );
    let c = config(p);
    fx.publish(&c, "e", 2, true);
    let held = fx
        .store
        .claim_held(&ClaimArgs::new("e", 10, Duration::from_secs(30)));
    match held {
        Ok(claim) => {
            assert!(caps.held_claims, "{b:?} held a claim");
            let (events, batch) = claim.into_parts();
            assert_eq!(events.len(), 2);
            drop(batch); // rolled back: both still pending
            assert_eq!(fx.counts("e").pending, 2);
        }
        Err(e) => {
            assert!(!caps.held_claims, "{b:?}: {e}");
            assert!(matches!(e, txbox::Error::Unsupported { .. }), "{e}");
        }
    }
    match fx.store.listen() {
        Ok(_) => assert!(caps.notifications, "{b:?} listened"),
        Err(e) => {
            assert!(!caps.notifications, "{b:?}: {e}");
            assert!(matches!(e, txbox::Error::Unsupported { .. }), "{e}");
        }
    }
}
