//! Delayed events (`NewEvent::deliver_after` / `deliver_at`): due by the
//! database's clock, never claimed before, sent on time by a poller that
//! sleeps until the next one is due instead of claiming again and again.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use crate::common::backend::{Backend, Fixture};
use crate::common::wait_until;
use txbox::store::ClaimArgs;
use txbox::{Config, Event, EventId, NewEvent, OnPoison, Relay, SendError, Sender};
use uuid::Uuid;

use super::{config, ms};

pub(super) fn a_delayed_event_is_claimed_only_once_due(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let lease = Duration::from_secs(60);
    assert_eq!(fx.store.next_due("e").unwrap(), None, "nothing pending");
    let before = Instant::now();
    let ids = fx.publish_events(
        &c,
        vec![
            NewEvent::new("e", &"later")
                .unwrap()
                .deliver_after(ms(1500)),
            NewEvent::new("e", &"now").unwrap(),
            // a time already past is due at once
            NewEvent::new("e", &"past")
                .unwrap()
                .deliver_at(SystemTime::now() - Duration::from_secs(5)),
        ],
    );
    // an ordered type: a key's delayed event holds back its later ones
    let keyed = fx.publish_events(
        &c,
        vec![
            NewEvent::new("f", &1)
                .unwrap()
                .key("k")
                .deliver_after(ms(1500)),
            NewEvent::new("f", &2).unwrap().key("k"),
            NewEvent::new("f", &3).unwrap().key("other"),
        ],
    );
    let ordered = || {
        let args = ClaimArgs::new("f", 10, lease).ordered(OnPoison::Block);
        let got = fx.store.claim_after(&args, Uuid::now_v7()).unwrap();
        got.iter().map(|e| e.id).collect::<Vec<_>>()
    };
    assert_eq!(
        ordered(),
        [keyed[2]],
        "key k waits for its delayed first event"
    );
    let claimed = fx.store.claim("e", 10, lease, Uuid::now_v7()).unwrap();
    let got: Vec<EventId> = claimed.iter().map(|e| e.id).collect();
    assert_eq!(got, [ids[1], ids[2]], "the delayed event is not due yet");
    // by the database's clock: a little under 1.5 s from now
    let wait = fx.store.next_due("e").unwrap().expect("one pending");
    assert!(wait > ms(900) && wait <= ms(1500), "{b:?}: due in {wait:?}");
    assert!(fx
        .store
        .claim("e", 10, lease, Uuid::now_v7())
        .unwrap()
        .is_empty());
    wait_until("the delayed event due", Duration::from_secs(10), || {
        fx.store.next_due("e").unwrap() == Some(Duration::ZERO)
    });
    assert!(
        before.elapsed() >= ms(1400),
        "due after {:?}",
        before.elapsed()
    );
    let claimed = fx.store.claim("e", 10, lease, Uuid::now_v7()).unwrap();
    assert_eq!(claimed.iter().map(|e| e.id).collect::<Vec<_>>(), [ids[0]]);
    assert_eq!(claimed[0].payload_str(), Some("\"later\""));
    assert_eq!(fx.store.next_due("e").unwrap(), None);
    // published a moment after the others, so due a moment later (the
    // type's next due time is now all along: its second event waits for the
    // key, not for the clock)
    let mut got = Vec::new();
    wait_until(
        "key k's first event claimed",
        Duration::from_secs(10),
        || {
            got = ordered();
            !got.is_empty()
        },
    );
    assert_eq!(got, [keyed[0]], "then the key's first, alone");
    assert!(
        before.elapsed() >= ms(1400),
        "claimed after {:?}",
        before.elapsed()
    );

    // a delay longer than a year is refused at publish, naming the type
    let outbox = txbox::Outbox::new(&c).unwrap();
    let too_long = NewEvent::new("e", &1)
        .unwrap()
        .deliver_after(txbox::MAX_DELAY + Duration::from_secs(1));
    let err = fx
        .in_tx(|tx| outbox.publish_all(tx, [too_long]), |_| false)
        .unwrap_err();
    assert!(
        matches!(&err, txbox::Error::InvalidEvent(m) if m.contains("delay") && m.contains("\"e\"")),
        "{err}"
    );
}

/// Records when each event reached it.
#[derive(Clone, Default)]
struct Clocked(Arc<Mutex<HashMap<EventId, Instant>>>);

impl Sender for Clocked {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        let now = Instant::now();
        let mut seen = self.0.lock().unwrap();
        events
            .iter()
            .map(|e| {
                seen.insert(e.id, now);
                Ok(())
            })
            .collect()
    }
}

/// A relay sends each delayed event once it is due, not before, and soon
/// after; meanwhile its poller asks when the next one is due instead of
/// claiming at every poll.
pub(super) fn a_relay_sends_delayed_events_when_due(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let registry = Arc::new(txbox::metrics::Registry::new());
    let c = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(ms(10), ms(100), 1.5))
        .event("e", |e| e)
        .build()
        .unwrap()
        .observed(registry.clone());
    let store = fx.store_with(&c);
    let sent = Clocked::default();
    let factory = {
        let sent = sent.clone();
        move || -> txbox::Result<Box<dyn Sender>> { Ok(Box::new(sent.clone())) }
    };
    let relay = Relay::start(store, &c, factory).unwrap();
    // the relay is idle first: its polls ask, and find nothing
    std::thread::sleep(ms(300));
    let claims = || registry.snapshot().store_call_seconds["claim"].count;
    let claims_before = claims();
    let delays: Vec<Duration> = (0..12).map(|i| ms(400 + 100 * i)).collect();
    let before = Instant::now();
    let ids = fx.publish_events(
        &c,
        delays
            .iter()
            .map(|d| {
                NewEvent::new("e", &d.as_millis())
                    .unwrap()
                    .deliver_after(*d)
            })
            .collect(),
    );
    let committed = Instant::now();
    wait_until("every delayed event sent", Duration::from_secs(20), || {
        sent.0.lock().unwrap().len() == ids.len()
    });
    let at = sent.0.lock().unwrap().clone();
    for (id, delay) in ids.iter().zip(&delays) {
        let t = at[id];
        // the database's clock and this one are the same host's: a few
        // milliseconds of rounding at most
        assert!(
            t + ms(5) >= before + *delay,
            "{b:?}: sent {:?} after the publish began, delay {delay:?}",
            t - before
        );
        assert!(
            t <= committed + *delay + Duration::from_secs(1),
            "{b:?}: sent {:?} after the commit, delay {delay:?}",
            t - committed
        );
    }
    // a claim or two per event (one that comes a hair early by the
    // database's clock finds nothing; on PostgreSQL the commit's wake-up
    // claims once), not one per poll of the 1.5 s: the polls between asked
    // when the next event was due (with the question turned off: 60)
    let used = claims() - claims_before;
    assert!(
        used <= 3 * ids.len() as u64,
        "{b:?}: {used} claims for {} delayed events",
        ids.len()
    );
    relay.shutdown(Duration::from_secs(10)).unwrap();
}

/// A delay counts from the publish call, not from the start of the
/// transaction it is published in: a batch job's transaction that has been
/// open longer than the delay does not make its delayed events due at once
/// (`deliver_after`), nor before the time asked for (`deliver_at`).
pub(super) fn a_long_transaction_does_not_shorten_a_delay(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let outbox = txbox::Outbox::new(&c).unwrap();
    let lease = Duration::from_secs(60);
    let published = fx.in_tx(
        |tx| {
            // the transaction has begun (its first statement), then the job
            // works for longer than the delay before it publishes
            outbox.publish(tx, "f", &"started").unwrap();
            std::thread::sleep(ms(2000));
            let at = SystemTime::now() + ms(1500);
            outbox
                .publish_all(
                    tx,
                    [
                        NewEvent::new("e", &"after")
                            .unwrap()
                            .deliver_after(ms(1500)),
                        NewEvent::new("e", &"at").unwrap().deliver_at(at),
                    ],
                )
                .unwrap();
            Instant::now()
        },
        |_| true,
    );
    let claimed = fx.store.claim("e", 10, lease, Uuid::now_v7()).unwrap();
    assert!(
        claimed.is_empty() || published.elapsed() >= ms(1400),
        "{b:?}: due {:?} after the publish call, 1.5 s asked: {:?}",
        published.elapsed(),
        claimed.iter().map(|e| e.payload_str()).collect::<Vec<_>>()
    );
    let wait = fx.store.next_due("e").unwrap().expect("two pending");
    assert!(wait > ms(500), "{b:?}: due in {wait:?}");
    wait_until("the delayed events due", Duration::from_secs(10), || {
        fx.store
            .claim("e", 10, lease, Uuid::now_v7())
            .unwrap()
            .len()
            == 2
            || fx.counts("e").pending == 0
    });
    assert!(
        published.elapsed() >= ms(1400),
        "{b:?}: claimed {:?} after the publish call",
        published.elapsed()
    );
}
