//! Part `delayed`: events published with a delay go out on time. 1,000
//! events delayed 1-10 s (spread evenly, shuffled), published to a relay idle
//! for 5 s, through it on
//! PostgreSQL to a sender that acks at once; each one's send time minus its
//! due time (the row's `next_attempt_at`, the database's clock, on the same
//! host as the bench's).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use txbox::{Config, Event, EventId, NewEvent, Outbox, Relay, SendError, Sender};

use crate::common::*;

/// Records when each event reached it, by the wall clock.
#[derive(Clone, Default)]
struct SentAt(Arc<Mutex<HashMap<EventId, SystemTime>>>);

impl Sender for SentAt {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        let now = SystemTime::now();
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

pub(crate) fn delayed_on_time(out: &mut Vec<Row>) -> Res<()> {
    const EVENTS: usize = 1000;
    let p = "bench_delayed_";
    let (store, mut c) = fresh(p)?;
    let cfg = Config::builder()
        .table_prefix(p)
        .event("bench", |e| e)
        .build()?;
    let sent = SentAt::default();
    let factory = {
        let sent = sent.clone();
        move || -> txbox::Result<Box<dyn Sender>> { Ok(Box::new(sent.clone())) }
    };
    let relay = Relay::start(store, &cfg, factory)?;
    // idle first, as a relay is when events are published: its polling
    // delay has grown (250 ms x1.5 per empty poll) when they come
    std::thread::sleep(Duration::from_secs(5));
    // delays of 1 to 10 s, 9 ms apart, in a random order
    let mut delays: Vec<Duration> = (0..EVENTS)
        .map(|i| Duration::from_millis(1000 + (9000 * i / EVENTS) as u64))
        .collect();
    fastrand::shuffle(&mut delays);
    let outbox = Outbox::new(&cfg)?;
    for chunk in delays.chunks(100) {
        let mut tx = c.transaction()?;
        let events = chunk
            .iter()
            .map(|d| Ok(NewEvent::new("bench", &d.as_millis())?.deliver_after(*d)))
            .collect::<txbox::Result<Vec<_>>>()?;
        outbox.publish_all(&mut tx, events)?;
        tx.commit()?;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while sent.0.lock().unwrap().len() < EVENTS && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    relay.shutdown(Duration::from_secs(5))?;
    let due: HashMap<uuid::Uuid, f64> = c
        .query(
            &format!(
                "SELECT id, (extract(epoch FROM next_attempt_at) * 1000)::float8 FROM {p}outbox_events"
            ),
            &[],
        )?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let at = sent.0.lock().unwrap().clone();
    let mut late: Vec<f64> = at
        .iter()
        .filter_map(|(id, t)| {
            let sent_ms = t.duration_since(UNIX_EPOCH).ok()?.as_secs_f64() * 1000.0;
            Some(sent_ms - due.get(&id.as_uuid())?)
        })
        .collect();
    let early = late.iter().filter(|l| **l < 0.0).count();
    out.push(row(
        format!(
            "delayed events: sent minus due, p50 / p99 / max ({} of {EVENTS} sent, delays 1-10 s)",
            late.len()
        ),
        format!(
            "{:.1} / {:.1} / {:.1} ms",
            median(&mut late.clone()),
            pct(&mut late.clone(), 0.99),
            late.iter().copied().fold(f64::MIN, f64::max)
        ),
        "-".into(),
        pct(&mut late, 0.99) / 20.0,
        "p99 <= 20 ms",
    ));
    out.push(row(
        "delayed events sent before they were due",
        format!("{early}"),
        "0".into(),
        early as f64,
        "0",
    ));
    Ok(())
}
