//! The relay on every dialect: four relays on one table, pipelined batches, a
//! release, a wake-up after the commit, `deliver_pending`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use crate::common::wait_until;
use txbox::sender::Started;
use txbox::{Config, Event, EventId, MemorySender, Relay, SendError, Sender};

use super::ordering::keyed;
use super::{config, four_relays_turn, ms};

pub(super) fn four_relays_deliver_every_event_exactly_once(b: Backend, p: &str) {
    let _turn = four_relays_turn(b);
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let mut published = HashSet::new();
    for _ in 0..10 {
        published.extend(fx.publish(&c, "e", 1000, true));
    }
    let senders: Vec<MemorySender> = (0..4).map(|_| MemorySender::new()).collect();
    let relays: Vec<Relay> = super::relays_of(&fx, &c, &senders);
    let total = || senders.iter().map(MemorySender::len).sum::<usize>();
    wait_until("10,000 deliveries", Duration::from_secs(180), || {
        total() >= 10_000
    });
    wait_until("nothing left in process", Duration::from_secs(30), || {
        fx.counts("e") == txbox::TypeStatus::default()
    });
    crate::common::shut_down_and_check_each_once(relays, &senders, &published);
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
pub(super) fn a_release_finishes_the_batches_in_flight_before_backing_off(b: Backend, p: &str) {
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
pub(super) fn a_wake_after_the_commit_sends_at_once_on_every_dialect(b: Backend, p: &str) {
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

pub(super) fn pipelined_batches_finish_in_order_and_retry(b: Backend, p: &str) {
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

/// `Relay::deliver_pending` sends what is due now on the caller's thread and
/// reports it per type: a refused event is sent again within the call when its
/// backoff has passed (1 ms for type `g`, whose next event's send takes
/// longer), and waits for a later call
/// when it has not (an hour for `f`); an ordered key's events all go, in order;
/// a second call finds nothing.
pub(super) fn deliver_pending_sends_what_is_due_and_reports_it(b: Backend, p: &str) {
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

/// A sender whose broker cannot be reached: `ready` says so, and a send is a
/// transport failure. Counts the batches handed to it.
#[derive(Clone, Default)]
struct Unreachable(Arc<Mutex<usize>>);

impl Sender for Unreachable {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        *self.0.lock().unwrap() += 1;
        events
            .iter()
            .map(|_| Err(SendError::transient("connection refused")))
            .collect()
    }
    fn ready(&mut self) -> Result<(), SendError> {
        Err(SendError::transient("not connected; next try in 2s"))
    }
}

/// `Relay::deliver_pending` asks the sender whether its broker can be reached
/// before it claims, as the poller does: with a sender that is not ready it
/// claims nothing, hands nothing to the sender, and says why.
pub(super) fn deliver_pending_claims_nothing_while_the_sender_is_not_ready(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    fx.publish(&c, "e", 3, true);
    let mut sender = Unreachable::default();
    let err = Relay::deliver_pending(&*fx.store, &c, &mut sender).unwrap_err();
    assert!(
        matches!(&err, txbox::Error::Broker { message: m, .. } if m.contains("not connected")),
        "{err}"
    );
    assert_eq!(
        *sender.0.lock().unwrap(),
        0,
        "no batch handed to the sender"
    );
    let counts = fx.counts("e");
    assert_eq!((counts.pending, counts.in_process), (3, 0), "{counts:?}");
}

/// `Relay::deliver_pending` with a sender that keeps batches in flight and an
/// ordered type: a claim that finds nothing while every key's head is with the
/// broker is not "nothing due" (each key's next event is due once those are
/// finished): every event of every key goes out, in order, in one call.
pub(super) fn deliver_pending_with_batches_in_flight_sends_every_keys_events(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("o", |e| {
            e.ordering(txbox::EventOrder::Key)
                .batch_size(20)
                .in_flight(3)
        })
        .build()
        .unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ids = fx.publish_events(&c, keyed("o", &keys, 3));
    let mut sender = Pipelined::default();
    let report = Relay::deliver_pending(&*fx.store, &c, &mut sender).unwrap();
    assert_eq!(report.sent(), 60, "{report:?}");
    let counts = fx.counts("o");
    assert_eq!((counts.pending, counts.in_process), (0, 0), "{counts:?}");
    let acked = sender.0.lock().unwrap().acked.clone();
    assert_eq!(acked.len(), 60);
    // each key's events in publish order (published round by round: key j's
    // i-th event is ids[20 * i + j])
    let at = |id: &EventId| acked.iter().position(|a| a == id).unwrap();
    for j in 0..keys.len() {
        let positions: Vec<usize> = (0..3).map(|i| at(&ids[20 * i + j])).collect();
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "key {j}: {positions:?}"
        );
    }
}

/// A row whose headers are no JSON object (written by hand: txbox writes an
/// object) fails alone: the sender never gets it, the other events of its
/// batch are sent, and it is FAILED at once (retries left or not: none can
/// change it) with an error that names its headers. The dead letters list it once it is moved, with what is
/// wrong in place of its headers. It used to go out without its headers.
pub(super) fn a_row_with_unreadable_headers_fails_alone(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.max_retries(3))
        .dlq(|d| d.enabled(true))
        .build()
        .unwrap();
    let ids = fx.publish_events(&c, keyed("e", &["a", "bad", "c", ""], 1));
    let bad = ids[1];
    fx.execute(&format!(
        "UPDATE {p}outbox_events SET headers = '[1]' WHERE event_key = 'bad'"
    ));
    let mut sender = MemorySender::new();
    let report = Relay::deliver_pending(&*fx.store, &c, &mut sender).unwrap();
    let sent: HashSet<EventId> = sender.sent().iter().map(|e| e.id).collect();
    let others: HashSet<EventId> = ids.iter().copied().filter(|i| *i != bad).collect();
    assert_eq!(sent, others, "the other three sent, the bad one not");
    let t = report.by_type["e"];
    assert_eq!((t.sent, t.failed), (3, 1), "{report:?}");
    let counts = fx.counts("e");
    assert_eq!(
        (counts.pending, counts.in_process, counts.failed),
        (0, 0, 1)
    );
    let dlq = txbox::Dlq::new(fx.store.clone());
    assert_eq!(dlq.move_failed(10).unwrap(), 1);
    let dead = dlq.get(bad).unwrap();
    let error = dead.last_error.clone().unwrap_or_default();
    assert!(
        error.contains("headers") && error.contains("[1]"),
        "{error}"
    );
    let defect = dead.headers.get(txbox::store::HEADER_DEFECT);
    assert!(
        defect.is_some_and(|d| d.contains("[1]")),
        "{:?}",
        dead.headers
    );
    assert_eq!(dlq.list(&txbox::DlqFilter::default()).unwrap().len(), 1);
}

/// A broker client of one's own that pipelines: `Pipelining` and
/// `txbox::pipelined_sender!` make it a `Sender`, and the relay keeps up to
/// `in_flight` of its batches with it, collected in the order published.
#[derive(Default)]
struct ThirdBroker {
    in_flight: VecDeque<Vec<EventId>>,
    most_in_flight: usize,
    collected: Vec<EventId>,
}

impl txbox::sender::Pipelining for ThirdBroker {
    type Batch = Vec<EventId>;
    fn publish(&mut self, events: &[Event]) -> Vec<EventId> {
        self.most_in_flight = self.most_in_flight.max(self.in_flight.len() + 1);
        events.iter().map(|e| e.id).collect()
    }
    fn collect(&mut self, batch: Vec<EventId>) -> Vec<Result<(), SendError>> {
        self.collected.extend(&batch);
        batch.iter().map(|_| Ok(())).collect()
    }
    fn in_flight(&mut self) -> &mut VecDeque<Vec<EventId>> {
        &mut self.in_flight
    }
}
txbox::pipelined_sender!(ThirdBroker);

pub(super) fn a_pipelining_sender_of_ones_own_keeps_batches_in_flight(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.batch_size(50).in_flight(3))
        .build()
        .unwrap();
    let ids = fx.publish(&c, "e", 400, true);
    let mut sender = ThirdBroker::default();
    let report = Relay::deliver_pending(&*fx.store, &c, &mut sender).unwrap();
    assert_eq!(report.sent(), 400, "{report:?}");
    assert_eq!(sender.collected, ids, "every event once, in publish order");
    assert_eq!(
        sender.most_in_flight, 3,
        "three batches with the broker at most"
    );
    assert!(sender.in_flight.is_empty());
}

/// A store opened with a configuration reports its calls to that
/// configuration's observer: each claim, each batch's finish, each
/// maintenance pass, and a call that failed as an error of its kind.
pub(super) fn a_stores_calls_reach_its_configurations_observer(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let registry = Arc::new(txbox::metrics::Registry::new());
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.batch_size(100))
        .build()
        .unwrap()
        .observed(registry.clone());
    let store = fx.store_with(&c);
    fx.publish(&c, "e", 250, true);
    let report = Relay::deliver_pending(&*store, &c, &mut MemorySender::new()).unwrap();
    assert_eq!(report.sent(), 250);
    let calls = |name: &str| registry.snapshot().store_call_seconds[name].count;
    // 100, 100 and 50 claimed after the last full batch's last id, then a
    // scan from the lowest id that finds nothing
    assert_eq!((calls("claim"), calls("finish")), (4, 3));
    assert_eq!(calls("maintenance"), 0);
    store.recover_expired(10).unwrap();
    store.delete_processed(Duration::ZERO, 10).unwrap();
    assert_eq!(calls("maintenance"), 2);
    assert_eq!(registry.snapshot().store_errors["claim"], 0);
    fx.execute(&format!("DROP TABLE {p}outbox_events"));
    let args = txbox::store::ClaimArgs::new("e", 10, Duration::from_secs(60));
    txbox::store::ClaimStore::claim_after(&*store, &args, uuid::Uuid::now_v7()).unwrap_err();
    let s = registry.snapshot();
    assert_eq!(
        (s.store_call_seconds["claim"].count, s.store_errors["claim"]),
        (5, 1)
    );
    let text = registry.prometheus();
    assert!(
        text.contains("txbox_store_call_seconds_count{call=\"claim\"} 5")
            && text.contains("txbox_store_errors_total{call=\"claim\"} 1"),
        "{text}"
    );
}
