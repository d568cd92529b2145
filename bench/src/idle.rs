//! Parts `idle` and `idle-direct`: an idle type's statements per hour, and the
//! broker's own share of the pick-up after idle.

use std::time::{Duration, Instant};

use txbox::{Config, Event, EventSettings, MemorySender, Outbox, Relay, Sender};

use crate::common::*;
use crate::latency::pickup_broker;

pub(crate) fn idle_cost(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_idle_";
    fresh(p)?;
    // one idle type, default adaptive polling; the maintenance threads are shared
    // by all types and not counted (claims only)
    let cfg = Config::builder()
        .table_prefix(p)
        .event("bench", |e| e)
        .build()?;
    let (counting, calls) = counted(&cfg)?;
    let relay = Relay::start(counting, &cfg, MemorySender::new())?;
    std::thread::sleep(s.idle);
    let measured = calls.statements();
    relay.shutdown(Duration::from_secs(5))?;
    // again with one event due in an hour: the poller sleeps as when idle
    let (_, mut c) = fresh(p)?;
    let (counting, calls) = counted(&cfg)?;
    let outbox = Outbox::new(&cfg)?;
    let mut tx = c.transaction()?;
    outbox.publish_all(
        &mut tx,
        [txbox::NewEvent::new("bench", &0)?.deliver_after(Duration::from_secs(3600))],
    )?;
    tx.commit()?;
    let relay = Relay::start(counting, &cfg, MemorySender::new())?;
    std::thread::sleep(s.idle);
    let with_delayed = calls.statements();
    relay.shutdown(Duration::from_secs(5))?;
    // the same delay sequence over an hour
    let polling = EventSettings::default().polling;
    let (mut model_window, mut model_hour) = (0, 0);
    // the adaptive rule for empty polls: wait the current delay, then grow it
    let mut current = polling.min;
    let mut t = Duration::ZERO;
    while t < Duration::from_secs(3600) {
        if t < s.idle {
            model_window += 1;
        }
        model_hour += 1;
        t += current;
        current = current.mul_f64(polling.multiplier).min(polling.max);
    }
    let steady = (3600.0 / polling.max.as_secs_f64()).round();
    out.push(row(
        format!(
            "idle cost: statements in {:?} (claims, next-due questions; measured vs model)",
            s.idle
        ),
        format!("{measured}"),
        format!("{model_window}"),
        measured as f64 / model_window.max(1) as f64,
        "-",
    ));
    out.push(row(
        format!(
            "idle cost with one event due in an hour: statements in {:?} (vs none due)",
            s.idle
        ),
        format!("{with_delayed}"),
        format!("{measured}"),
        with_delayed as f64 / measured.max(1) as f64,
        "<= 1.0",
    ));
    out.push(row(
        "idle cost: statements per hour (first hour / steady)",
        format!("{model_hour}"),
        format!("{steady}"),
        model_hour as f64 / 70.0,
        "<= 70",
    ));
    Ok(())
}

pub(crate) fn idle_direct(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    for name in ["rabbitmq", "kafka"] {
        let broker = pickup_broker(name)?;
        let mut sender = broker.factory.create()?;
        let event = |n: usize| broker.event(n);
        // the connection opened and used, as a running relay's is, and the
        // queue as full as the latency part leaves it (nothing consumes it)
        let burst: Vec<Event> = (0..s.burst).map(event).collect();
        for chunk in burst.chunks(200) {
            let _ = sender.send(chunk);
        }
        let mut l = Vec::new();
        for n in 0..s.idle_samples {
            std::thread::sleep(s.idle_single);
            let t = Instant::now();
            if sender.send(&[event(n + 1)]).iter().all(|r| r.is_ok()) {
                l.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        out.push(row(
            format!(
                "  {}: one event published directly after {:?} idle, p50 / p99 ({} samples)",
                broker.name,
                s.idle_single,
                l.len()
            ),
            format!("{:.1} ms", median(&mut l.clone())),
            format!("{:.1} ms", pct(&mut l, 0.99)),
            0.0,
            "-",
        ));
    }
    Ok(())
}
