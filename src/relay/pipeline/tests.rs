//! Unit tests of the delivery pipeline on the in-memory store.

use super::{next_cursor, Pipeline, Polled, Run};
use crate::config::EventSettings;
use crate::event::{Event, EventId};
use crate::relay::leased::Leased;
use crate::sender::{SendError, Sender, Started};
use crate::store::memory::{MemoryStore, Status};
use crate::MemorySender;
use std::collections::VecDeque;

fn keyed(keys: &[&str]) -> Vec<Event> {
    keys.iter()
        .map(|k| Event {
            id: EventId::new(),
            event_type: "t".into(),
            destination: "t".into(),
            key: (!k.is_empty()).then(|| k.to_string()),
            headers: Default::default(),
            payload: b"{}".to_vec(),
            content_type: None,
            attempts: 0,
        })
        .collect()
}

#[test]
fn the_cursor_goes_on_after_a_full_batch_and_round_after_a_short_one() {
    assert_eq!(
        next_cursor(&keyed(&["b", "c", "a"]), 3).as_deref(),
        Some("c")
    );
    assert_eq!(next_cursor(&keyed(&["b", ""]), 2).as_deref(), Some("b"));
    assert_eq!(
        next_cursor(&keyed(&["x", "y"]), 3),
        None,
        "short: from the first"
    );
    assert_eq!(next_cursor(&keyed(&["", ""]), 2), None, "no key taken");
    assert_eq!(next_cursor(&[], 1), None);
}

/// Keeps every started batch until waited for; fails `transient` with a
/// transport error.
#[derive(Default)]
struct Pipelining {
    queue: VecDeque<Vec<Event>>,
    transient: Option<EventId>,
    acked: Vec<EventId>,
}

impl Sender for Pipelining {
    fn send(&mut self, _: &[Event]) -> Vec<Result<(), SendError>> {
        unreachable!("the pipeline starts and waits")
    }
    fn start(&mut self, events: &[Event]) -> Started {
        self.queue.push_back(events.to_vec());
        Started::InFlight
    }
    fn wait(&mut self) -> Vec<Result<(), SendError>> {
        let batch = self.queue.pop_front().unwrap_or_default();
        batch
            .iter()
            .map(|e| {
                if self.transient == Some(e.id) {
                    return Err(SendError::transient("connection reset"));
                }
                self.acked.push(e.id);
                Ok(())
            })
            .collect()
    }
}

fn pipeline(s: EventSettings) -> Pipeline {
    Pipeline::new("t", s, false, Default::default())
}

/// Steps until a step claims nothing after a full scan; what each step did.
fn drain_all(p: &mut Pipeline, store: &MemoryStore, sender: &mut dyn Sender) -> Vec<Polled> {
    let leased = Leased::default();
    let mut run = Run {
        store,
        sender,
        leased: &leased,
        relay: None,
    };
    let mut steps = Vec::new();
    loop {
        let polled = p.step(&mut run).unwrap();
        steps.push(polled);
        if polled.claimed == 0 && polled.scanned {
            return steps;
        }
        assert!(steps.len() < 100, "no end: {steps:?}");
    }
}

#[test]
fn a_backlog_drains_after_each_full_batch_and_ends_on_a_full_scan() {
    let store = MemoryStore::default();
    store.publish("t", None, 5);
    let mut p = pipeline(EventSettings::default().batch_size(2));
    let steps = drain_all(&mut p, &store, &mut MemorySender::new());
    let shape: Vec<(usize, bool)> = steps.iter().map(|s| (s.claimed, s.scanned)).collect();
    // full batches are followed from their last id; the short one ends
    // the walk, and a scan from the lowest id finds nothing
    assert_eq!(shape, [(2, true), (2, false), (1, false), (0, true)]);
    assert_eq!(p.delivered.sent, 5);
    assert_eq!(store.count(Status::Processed), 5);
}

#[test]
fn an_ordered_type_with_batches_in_flight_is_not_done_until_they_are_finished() {
    let store = MemoryStore::default();
    for k in ["a", "b", "c", "d"] {
        store.publish("t", Some(k), 3);
    }
    let s = EventSettings::default()
        .ordering(crate::EventOrder::Key)
        .batch_size(4)
        .in_flight(3);
    let mut p = pipeline(s);
    let mut sender = Pipelining::default();
    let steps = drain_all(&mut p, &store, &mut sender);
    // every key's head is with the sender: the next claim finds nothing,
    // which is not the end
    assert_eq!(
        (steps[1].claimed, steps[1].scanned),
        (0, false),
        "{steps:?}"
    );
    assert_eq!(p.delivered.sent, 12);
    assert_eq!(sender.acked.len(), 12);
    assert_eq!(store.count(Status::Processed), 12);
}

/// Rows the store cannot read fail at once, never reach a pipelining
/// sender, and leave its results in step with the other events, a batch
/// of them only included (nothing started for it).
#[test]
fn defective_rows_fail_at_once_beside_batches_in_flight() {
    let store = MemoryStore::default();
    let ids = store.publish("t", None, 6);
    for id in [ids[1], ids[4], ids[5]] {
        store.mark_defective(id, "headers: [1]");
    }
    let s = EventSettings::default()
        .batch_size(2)
        .in_flight(3)
        .max_retries(3);
    let mut p = pipeline(s);
    let mut sender = Pipelining::default();
    drain_all(&mut p, &store, &mut sender);
    assert_eq!(sender.acked, [ids[0], ids[2], ids[3]]);
    assert_eq!((p.delivered.sent, p.delivered.failed), (3, 3));
    for id in [ids[1], ids[4], ids[5]] {
        let row = store.row(id);
        assert_eq!(row.status, Status::Failed, "retries left, failed at once");
        assert!(row.last_error.unwrap().contains("headers: [1]"));
    }
    assert_eq!(store.count(Status::Processed), 3);
}

#[test]
fn a_transport_failure_releases_its_event_without_an_attempt_and_finishes_the_rest() {
    let store = MemoryStore::default();
    let ids = store.publish("t", None, 6);
    let s = EventSettings::default().batch_size(2).in_flight(3);
    let mut p = pipeline(s);
    let mut sender = Pipelining {
        transient: Some(ids[0]),
        ..Default::default()
    };
    let leased = Leased::default();
    let mut run = Run {
        store: &store,
        sender: &mut sender,
        leased: &leased,
        relay: None,
    };
    // the first batch stays in flight (full), the second's step finds
    // nothing to finish yet, and the release comes with the oldest
    let mut released = 0;
    while released == 0 {
        released = p.step(&mut run).unwrap().released;
    }
    assert_eq!(released, 1);
    // nothing is left with the sender: a backing-off poller sleeps with
    // nothing in flight
    assert!(p.in_flight.is_empty());
    let row = store.row(ids[0]);
    assert_eq!((row.status, row.event.attempts), (Status::Pending, 0));
    assert_eq!(store.count(Status::InProcess), 0);
    assert_eq!(p.delivered.released, 1);
    assert_eq!(p.delivered.sent as usize, store.count(Status::Processed));
}

#[test]
fn a_refused_event_waits_for_its_backoff_and_fails_with_no_retry_left() {
    let store = MemoryStore::default();
    let ids = store.publish("t", None, 2);
    let sender = MemorySender::new();
    let bad = ids[1];
    sender.fail_when(move |e| (e.id == bad).then(|| "refused".to_string()));
    let mut s = EventSettings::default().max_retries(1);
    s.backoff.jitter = 0.0;
    let mut p = pipeline(s.clone());
    drain_all(&mut p, &store, &mut sender.clone());
    let row = store.row(bad);
    assert_eq!((row.status, row.event.attempts), (Status::Pending, 1));
    assert_eq!(row.last_error.as_deref(), Some("refused"));
    assert_eq!((p.delivered.sent, p.delivered.retried), (1, 1));
    // due only after its backoff (10 s): a second drain does not take it
    let mut again = pipeline(s.clone());
    drain_all(&mut again, &store, &mut sender.clone());
    assert_eq!(again.delivered, Default::default());
    // due now, its one retry used: the next refusal fails it
    store.make_due(bad);
    let mut last = pipeline(s);
    drain_all(&mut last, &store, &mut sender.clone());
    assert_eq!(last.delivered.failed, 1);
}
