//! Part `brokers`: the relay to Kafka and RabbitMQ beside the same client
//! publishing directly and the database alone.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use txbox::sender::Started;
use txbox::{Config, Event, EventId, EventSettings, Outbox, PgStore, Relay, Sender};

use crate::common::*;
use crate::floor::HandLoop;

pub(crate) fn broker_throughput(
    name: &str,
    s: &Size,
    factory: Arc<dyn txbox::SenderFactory>,
    destination: &str,
    reset: &dyn Fn() -> Res<()>,
    out: &mut Vec<Row>,
) -> Res<()> {
    let p = "bench_broker_";
    let cfg = s.relay_config(
        p,
        EventSettings::default()
            .destination(destination)
            .batch_size(200)
            .in_flight(s.in_flight.unwrap_or(EventSettings::default().in_flight)),
    );
    let window = cfg.event("bench").map_or(1, |e| e.in_flight);
    let outbox = Outbox::new(&cfg)?;
    // a message as the relay hands it to the sender
    let event = |payload: String| Event {
        id: EventId::new(),
        event_type: "bench".into(),
        destination: destination.into(),
        key: None,
        headers: Default::default(),
        payload: payload.into_bytes(),
        content_type: None,
        attempts: 0,
    };
    // warm up: connections and metadata are not what is measured
    let warm = event("{}".into());
    let mut direct = factory.create()?;
    if direct
        .send(std::slice::from_ref(&warm))
        .iter()
        .any(|r| r.is_err())
    {
        return Err(format!("{name}: warm-up send failed").into());
    }
    // the same client, same settings, the same messages in batches of 200, directly
    let events: Vec<Event> = (0..s.brokers)
        .map(|i| event(serde_json::json!({"n": i}).to_string()))
        .collect();
    // each round: the relay on a freshly filled table, the same client directly
    // with the relay's window of batches in flight, and the database alone (the
    // relay's statements by hand, no broker); each from an empty queue
    let hand_loop = HandLoop::new(p, s)?;
    let (mut ours, mut windowed, mut db) = (Vec::new(), Vec::new(), Vec::new());
    // the machine's CPU seconds per event of each (client, database and broker)
    let (mut ours_cpu, mut windowed_cpu, mut db_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let per_event = |cpu: Option<f64>, v: &mut Vec<f64>| {
        v.extend(cpu.map(|c| c / s.brokers as f64));
    };
    for _ in 0..s.rounds {
        let (store, mut c) = fresh(p)?;
        fill(&mut c, &outbox, s.brokers)?;
        reset()?;
        let (rate, cpu) = with_cpu(|| relay_rate(name, s, &store, &cfg, &factory))?;
        ours.push(rate);
        per_event(cpu, &mut ours_cpu);
        reset()?;
        let (rate, cpu) = with_cpu(|| direct_rate(name, &mut *direct, &events, window))?;
        windowed.push(rate);
        per_event(cpu, &mut windowed_cpu);
        let (_, mut c) = fresh(p)?;
        fill(&mut c, &outbox, s.brokers)?;
        let (took, cpu) = with_cpu(|| hand_loop.drain(&mut c, s.brokers))?;
        db.push(s.brokers as f64 / took.as_secs_f64());
        per_event(cpu, &mut db_cpu);
    }
    let (ours, windowed, db) = (median(&mut ours), median(&mut windowed), median(&mut db));
    // and the same client one batch at a time, and at its ceiling (every batch
    // handed over before the first ack)
    reset()?;
    let single = direct_rate(name, &mut *direct, &events, 1)?;
    reset()?;
    let ceiling = direct_rate(name, &mut *direct, &events, usize::MAX)?;
    let rounds = if s.rounds > 1 {
        format!(", median of {}", s.rounds)
    } else {
        String::new()
    };
    out.push(row(
        format!(
            "relay to {name} ({} events{}{rounds}), vs direct, {window} batches in flight",
            s.brokers,
            s.mode()
        ),
        format!("{ours:.0} ev/s"),
        format!("{windowed:.0} ev/s"),
        ours / windowed,
        ">= 0.8",
    ));
    out.push(row(
        format!("  {name}: vs direct, one batch at a time"),
        format!("{ours:.0} ev/s"),
        format!("{single:.0} ev/s"),
        ours / single,
        "-",
    ));
    out.push(row(
        format!("  {name}: vs direct, all in flight (client ceiling)"),
        format!("{ours:.0} ev/s"),
        format!("{ceiling:.0} ev/s"),
        ours / ceiling,
        "-",
    ));
    // the relay can go no faster than the slower of its two halves
    out.push(row(
        format!("  {name}: vs the database alone (the floor's hand loop)"),
        format!("{ours:.0} ev/s"),
        format!("{db:.0} ev/s"),
        ours / db,
        "-",
    ));
    if ours_cpu.len() == s.rounds {
        // a relay does the database's work and the client's work for each event:
        // with every core busy it can go no faster than the cores over their sum
        let us = |v: &mut Vec<f64>| median(v) * 1e6;
        let (ours_us, direct_us, db_us) =
            (us(&mut ours_cpu), us(&mut windowed_cpu), us(&mut db_cpu));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let bound = cores as f64 * 1e6 / (direct_us + db_us);
        out.push(row(
            format!("  {name}: machine CPU per event, relay vs direct + database alone"),
            format!("{ours_us:.1} us"),
            format!("{direct_us:.1} + {db_us:.1} us"),
            ours_us / (direct_us + db_us),
            "-",
        ));
        out.push(row(
            format!("  {name}: CPU bound for any relay ({cores} cores / that sum), vs direct"),
            format!("{bound:.0} ev/s"),
            format!("{windowed:.0} ev/s"),
            bound / windowed,
            "-",
        ));
    }
    Ok(())
}

/// Events/s of a relay draining the `s.brokers` events pending in `store` to
/// the broker; counted by the acks as they come (the rows are finished right
/// after).
pub(crate) fn relay_rate(
    name: &str,
    s: &Size,
    store: &Arc<PgStore>,
    cfg: &Config,
    factory: &Arc<dyn txbox::SenderFactory>,
) -> Res<f64> {
    let t = Instant::now();
    let f = factory.clone();
    let acks = Acks::default();
    let a = acks.clone();
    let relay = Relay::start(
        store.clone(),
        cfg,
        move || -> txbox::Result<Box<dyn Sender>> {
            Ok(Box::new(Timed::new(f.create()?, a.clone())))
        },
    )?;
    while acks.count.load(Ordering::Relaxed) < s.brokers as u64
        && t.elapsed() < Duration::from_secs(600)
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    relay.shutdown(Duration::from_secs(10))?;
    let rate = s.brokers as f64 / t.elapsed().as_secs_f64();
    if store.status()?.iter().any(|x| x.pending + x.in_process > 0) {
        return Err(format!("{name}: events left unfinished").into());
    }
    Ok(rate)
}

/// Events/s of `sender` publishing `events` in batches of 200 with at most
/// `window` batches awaiting acks.
pub(crate) fn direct_rate(
    name: &str,
    sender: &mut dyn Sender,
    events: &[Event],
    window: usize,
) -> Res<f64> {
    let t = Instant::now();
    let mut results = Vec::new();
    let mut waiting = 0;
    for chunk in events.chunks(200) {
        match sender.start(chunk) {
            Started::Done(r) => results.extend(r),
            Started::InFlight => waiting += 1,
        }
        if waiting >= window {
            results.extend(sender.wait());
            waiting -= 1;
        }
    }
    for _ in 0..waiting {
        results.extend(sender.wait());
    }
    let failed = events.len() - results.iter().filter(|r| r.is_ok()).count();
    if failed > 0 {
        return Err(format!("{name}: {failed} direct sends failed").into());
    }
    Ok(events.len() as f64 / t.elapsed().as_secs_f64())
}
