//! Dead letters: moved, listed, retried, resolved, cleaned; bytes through them.

use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use crate::common::wait_until;
use txbox::store::Outcome;
use txbox::{Config, Dlq, DlqFilter, DlqStatus, Error, MemorySender, Relay};
use uuid::Uuid;

use super::{config, ms};

pub(super) fn dead_letters_move_list_retry_resolve_and_clean(b: Backend, p: &str) {
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
    let page = dlq.list(&DlqFilter::default().offset(1).limit(1)).unwrap();
    assert_eq!(page.iter().map(|d| d.id).collect::<Vec<_>>(), vec![ids[1]]);
    let other_type = DlqFilter::default().event_type("f");
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

    let resolved = DlqFilter::default().status(DlqStatus::Resolved);
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

pub(super) fn binary_payloads_come_back_unchanged_through_the_dead_letters(b: Backend, p: &str) {
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

pub(super) fn failing_sender_ends_in_the_dlq_and_a_retry_delivers(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| {
            e.fixed_polling(ms(20))
                .max_retries(1)
                .backoff_delay(ms(50))
                .backoff_jitter(0.0)
        })
        .dlq(|d| d.enabled(true))
        .dlq(|d| d.move_interval(ms(50)))
        .dlq(|d| d.retry_interval(ms(50)))
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
