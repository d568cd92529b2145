//! Part `latency`: commit to broker ack, steady, beside a full-speed type, in a
//! burst and after idle.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txbox::{Config, Event, EventId, EventSettings, Outbox, Relay, Sender};

use crate::common::*;

/// The broker a pick-up latency run sends to: its name in the rows, a factory
/// of its senders and the destination.
pub(crate) struct PickUpBroker {
    pub(crate) name: &'static str,
    pub(crate) factory: Arc<dyn txbox::SenderFactory>,
    pub(crate) destination: &'static str,
    /// Takes what the bench sent off the broker, as a consumer would
    /// (RabbitMQ confirms slower behind thousands of unread messages).
    pub(crate) drain: fn() -> Res<()>,
}

/// The pick-up runs' broker by name (`rabbitmq` or `kafka`), its queue or topic
/// made ready.
pub(crate) fn pickup_broker(name: &str) -> Res<PickUpBroker> {
    Ok(match name {
        "rabbitmq" => {
            let url = rabbit_url();
            ensure_queue(&url)?;
            PickUpBroker {
                name: "RabbitMQ",
                factory: Arc::new(rabbit_sender(&url)?),
                destination: "amq.direct",
                drain: || ensure_queue(&rabbit_url()),
            }
        }
        "kafka" => {
            let brokers = kafka_brokers();
            txbox::kafka::ensure_topic(&brokers, "txbox-bench-latency", 1)?;
            PickUpBroker {
                name: "Kafka",
                factory: Arc::new(txbox::kafka::KafkaSender::builder(&brokers).build()?),
                destination: "txbox-bench-latency",
                drain: || Ok(()), // a topic keeps no queue to empty
            }
        }
        other => return Err(format!("unknown broker `{other}`").into()),
    })
}

impl PickUpBroker {
    /// Event `n` as the relay hands it to this broker's sender.
    pub(crate) fn event(&self, n: usize) -> Event {
        Event {
            id: EventId::new(),
            event_type: "bench".into(),
            destination: self.destination.into(),
            key: None,
            headers: Default::default(),
            payload: format!("{{\"n\":{n}}}").into_bytes(),
            content_type: None,
            attempts: 0,
        }
    }
}

pub(crate) fn pickup_latency(s: &Size, broker: PickUpBroker, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_latency_";
    let (store, mut c) = fresh(p)?;
    c.batch_execute(
        "DROP TABLE IF EXISTS bench_writer_orders; \
         CREATE TABLE bench_writer_orders (id bigserial PRIMARY KEY, total bigint)",
    )?;
    // `load`: the other event type that 32 publishers fill at full speed
    // while `bench` is timed
    let at_broker = EventSettings::default().destination(broker.destination);
    let cfg = Config::builder()
        .table_prefix(p)
        .event("bench", |_| at_broker.clone())
        .event("load", |_| at_broker.clone())
        .build()?;
    let outbox = Outbox::new(&cfg)?;
    drop(store);
    // the relay's store reports each claim and how long it took: the
    // database's share of a pick-up
    let (store, claims) = counted_by(&cfg, Claims::timing("bench"))?;
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let factory = broker.factory.clone();
    // the broker's own share: one event every 10 ms published directly and its
    // ack awaited, by the same client, no database and no relay
    let direct = {
        let mut sender = factory.create()?;
        let mut l = Vec::new();
        let start = Instant::now();
        let mut next = start;
        let mut n = 0;
        while start.elapsed() < Duration::from_secs(s.rate_secs) {
            let e = broker.event(n);
            let t = Instant::now();
            let r = sender.send(std::slice::from_ref(&e));
            if r.iter().all(|r| r.is_ok()) {
                l.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            n += 1;
            next += Duration::from_millis(10);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        l
    };
    let acks = Acks {
        times: Some(acked.clone()),
        ..Acks::default()
    };
    let relay = Relay::start(store, &cfg, move || -> txbox::Result<Box<dyn Sender>> {
        Ok(Box::new(Timed::new(factory.create()?, acks.clone())))
    })?;
    let mut commit = |n: usize| -> Res<Vec<(EventId, Instant)>> {
        let mut tx = c.transaction()?;
        let ids = outbox.publish_all(
            &mut tx,
            txbox::NewEvent::batch("bench", (0..n).map(|i| serde_json::json!({"n": i})))?,
        )?;
        tx.commit()?;
        let t = Instant::now();
        Ok(ids.into_iter().map(|i| (i, t)).collect())
    };
    let latencies = |committed: &[(EventId, Instant)],
                     acked: &Arc<Mutex<HashMap<EventId, Instant>>>|
     -> Vec<f64> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let a = acked.lock().unwrap();
            if committed.iter().all(|(id, _)| a.contains_key(id)) || Instant::now() > deadline {
                return committed
                    .iter()
                    .filter_map(|(id, t)| {
                        a.get(id)
                            .map(|x| x.duration_since(*t).as_secs_f64() * 1000.0)
                    })
                    .collect();
            }
            drop(a);
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // the relay's senders connect on their first batch: one event through first,
    // so the steady rate measures a running relay, not its start
    let warm = commit(1)?;
    latencies(&warm, &acked);
    // steady 100 events/s: one commit every 10 ms, whatever a commit takes
    let steady = |commit: &mut dyn FnMut(usize) -> Res<Vec<(EventId, Instant)>>| {
        let mut committed = Vec::new();
        let start = Instant::now();
        let mut next = start;
        while start.elapsed() < Duration::from_secs(s.rate_secs) {
            committed.extend(commit(1)?);
            next += Duration::from_millis(10);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        Res::Ok(committed)
    };
    claims.take_durations();
    let waits = relay_thread_waits();
    let committed = steady(&mut commit)?;
    // p50 and p99 of the latencies in `l`, side by side
    let p50_p99 = |what: String, mut l: Vec<f64>| {
        row(
            what,
            format!("{:.1} ms", median(&mut l)),
            format!("{:.1} ms", pct(&mut l, 0.99)),
            0.0,
            "-",
        )
    };
    let name = broker.name;
    let l = latencies(&committed, &acked);
    // read once every event is acked: the claims that took the last ones too
    let (steady_claims, steady_waits) = (claims.take_durations(), relay_thread_waits());
    let steady_p50 = p50(&l);
    out.push(p50_p99(
        format!(
            "pick-up, 100 ev/s, commit->{name} ack p50 / p99 ({} ev)",
            l.len()
        ),
        l,
    ));
    let notify_p50 = p50(&bare_notify(s.rate_secs)?);
    let claim_p50 = the_way(
        out,
        &format!("{name}, 100 ev/s"),
        &committed,
        &acked,
        &steady_claims,
    );
    parts(out, "100 ev/s", steady_claims, (&waits, &steady_waits));
    // the same while 32 publishers fill the other type at full speed
    let load = {
        let cfg = cfg.clone();
        let secs = s.rate_secs;
        std::thread::spawn(move || {
            publish_flat_out(&cfg, "load", 32, secs).map_err(|e| e.to_string())
        })
    };
    claims.take_durations();
    let waits = relay_thread_waits();
    let committed = steady(&mut commit)?;
    let loaded = load.join().map_err(|_| "the load panicked")??;
    let l = latencies(&committed, &acked);
    let (loaded_claims, loaded_waits) = (claims.take_durations(), relay_thread_waits());
    out.push(row(
        format!(
            "pick-up, 100 ev/s while 32 publishers fill another type ({loaded} events), \
             commit->{name} ack p50 / p99 ({} ev)",
            l.len()
        ),
        format!("{:.1} ms", p50(&l)),
        format!("{:.1} ms", pct(&mut l.clone(), 0.99)),
        0.0,
        "p99 <= 20 ms",
    ));
    the_way(
        out,
        &format!("{name}, beside 32 publishers"),
        &committed,
        &acked,
        &loaded_claims,
    );
    parts(
        out,
        "beside 32 publishers",
        loaded_claims,
        (&waits, &loaded_waits),
    );
    (broker.drain)()?;
    let direct_p50 = p50(&direct);
    out.push(p50_p99(
        format!(
            "  {name}: one event published directly, publish->ack p50 / p99 ({} ev)",
            direct.len()
        ),
        direct,
    ));
    // what a pick-up cannot avoid: the notification's way to the listener, a
    // claim in the database (one that took an event) and the broker's ack,
    // one after the other (a sum of medians: a guide, not a bound)
    out.push(row(
        format!(
            "  {name}, 100 ev/s: pick-up p50 vs the sum of its parts' p50 \
             (notification {notify_p50:.2} + an event's claim {claim_p50:.2} + broker {direct_p50:.2} ms)"
        ),
        format!("{steady_p50:.1} ms"),
        format!("{:.1} ms", notify_p50 + claim_p50 + direct_p50),
        0.0,
        "-",
    ));
    // a burst in one transaction: each event, and the last one
    let committed = commit(s.burst)?;
    let mut l = latencies(&committed, &acked);
    let last = l.iter().copied().fold(0.0, f64::max);
    out.push(p50_p99(
        format!("pick-up ({name}), burst of {}, p50 / p99", s.burst),
        std::mem::take(&mut l),
    ));
    out.push(row(
        format!("pick-up ({name}), burst of {}, the last event", s.burst),
        format!("{last:.1} ms"),
        "-".into(),
        0.0,
        "<= burst / relay floor rate + 50 ms",
    ));
    // a consumer would have taken the burst: RabbitMQ confirms slower with
    // thousands of messages in the queue (one event after a minute: 0.8 ms on
    // an empty queue, 4.8 ms behind 2,000), which is the bench's, not the relay's
    (broker.drain)()?;
    // idle, then one event, `idle_samples` times
    let mut after_idle = Vec::new();
    for _ in 0..s.idle_samples {
        std::thread::sleep(s.idle_single);
        let committed = commit(1)?;
        after_idle.extend(latencies(&committed, &acked));
    }
    out.push(p50_p99(
        format!(
            "pick-up ({name}), one event after {:?} idle, p50 / p99 ({} samples)",
            s.idle_single, s.idle_samples
        ),
        after_idle,
    ));
    relay.shutdown(Duration::from_secs(10))?;
    Ok(())
}

/// The rows that say where a phase's pick-up time went: the relay's claims
/// (each one statement in the database) and how long the relay's threads
/// waited for a core.
fn parts(
    out: &mut Vec<Row>,
    phase: &str,
    claims: Vec<(Instant, f64)>,
    (before, after): (&ThreadWaits, &ThreadWaits),
) {
    let mut claims: Vec<f64> = claims.into_iter().map(|c| c.1).collect();
    if !claims.is_empty() {
        out.push(row(
            format!(
                "  {phase}: the type's claim statements p50 / p99 ({} claims, with the empty follow-ups)",
                claims.len()
            ),
            format!("{:.2} ms", median(&mut claims)),
            format!("{:.2} ms", pct(&mut claims, 0.99)),
            0.0,
            "-",
        ));
    }
    let wait =
        |prefix| mean_wait(before, after, prefix).map_or("-".into(), |w| format!("{w:.2} ms"));
    out.push(row(
        format!(
            "  {phase}: run-queue wait per scheduling, the type's poller / the listener (mean)"
        ),
        wait("txbox-poll-benc"),
        wait("txbox-listen"),
        0.0,
        "-",
    ));
}

/// The row of each event's way, p50 (ms): from its commit until the claim
/// that took it started, that claim, and from its end until the broker's ack;
/// returns that claim's p50. The claim that took an event is the last claim of
/// the type's poller (the only ones timed) that ended before its ack: the
/// poller waits for a partial batch's acks before it claims again.
fn the_way(
    out: &mut Vec<Row>,
    phase: &str,
    committed: &[(EventId, Instant)],
    acked: &Mutex<HashMap<EventId, Instant>>,
    claims: &[(Instant, f64)],
) -> f64 {
    let way = ways(committed, acked, claims);
    let part = |k: usize| p50(&way.iter().map(|w| [w.0, w.1, w.2][k]).collect::<Vec<_>>());
    out.push(row(
        format!(
            "  {phase}, each event's way p50: commit->its claim starts / the claim / \
             claim->ack ({} ev)",
            way.len()
        ),
        format!("{:.2} / {:.2} / {:.2} ms", part(0), part(1), part(2)),
        "-".into(),
        0.0,
        "-",
    ));
    part(1)
}

fn ways(
    committed: &[(EventId, Instant)],
    acked: &Mutex<HashMap<EventId, Instant>>,
    claims: &[(Instant, f64)],
) -> Vec<(f64, f64, f64)> {
    let acked = acked.lock().unwrap();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    committed
        .iter()
        .filter_map(|(id, commit)| {
            let ack = *acked.get(id)?;
            let (end, took) = claims.iter().rev().find(|(end, _)| *end <= ack)?;
            let start = end.checked_sub(Duration::from_secs_f64(took / 1000.0))?;
            Some((
                ms(start.saturating_duration_since(*commit)),
                *took,
                ms(ack.duration_since(*end)),
            ))
        })
        .collect()
}

/// A bare notification's way: a commit that sends one, every 10 ms for
/// `secs`, and the time from the commit's return until a listening session
/// has it (ms; below zero where it arrived before the commit returned).
fn bare_notify(secs: u64) -> Res<Vec<f64>> {
    let mut listen = postgres::Client::connect(&pg_url(), postgres::NoTls)?;
    listen.batch_execute("LISTEN bench_bare_notify")?;
    let heard = std::thread::spawn(move || {
        let mut times = Vec::new();
        let mut n = listen.notifications();
        let mut it = n.timeout_iter(Duration::from_secs(2));
        while let Ok(Some(_)) = postgres::fallible_iterator::FallibleIterator::next(&mut it) {
            times.push(Instant::now());
        }
        times
    });
    let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls)?;
    let mut committed = Vec::new();
    let start = Instant::now();
    let mut next = start;
    while start.elapsed() < Duration::from_secs(secs) {
        c.batch_execute("BEGIN; SELECT pg_notify('bench_bare_notify', ''); COMMIT")?;
        committed.push(Instant::now());
        next += Duration::from_millis(10);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let heard = heard.join().map_err(|_| "the listener panicked")?;
    if heard.len() != committed.len() {
        // a diagnostic row: said, not fatal to the part
        eprintln!(
            "bench: {} notifications heard of {}: no bare notification row",
            heard.len(),
            committed.len()
        );
        return Ok(Vec::new());
    }
    Ok(committed
        .iter()
        .zip(&heard)
        .map(|(c, h)| match h.checked_duration_since(*c) {
            Some(d) => d.as_secs_f64() * 1000.0,
            None => -(c.duration_since(*h).as_secs_f64() * 1000.0),
        })
        .collect())
}

pub(crate) fn ensure_queue(url: &str) -> Res<()> {
    use amiquip::{Connection, FieldTable, QueueDeclareOptions};
    let mut conn = Connection::insecure_open(url)?;
    let ch = conn.open_channel(None)?;
    let q = QueueDeclareOptions {
        auto_delete: false,
        ..Default::default()
    };
    ch.queue_declare("txbox-bench", q)?;
    ch.queue_bind(
        "txbox-bench",
        "amq.direct",
        "txbox-bench",
        FieldTable::new(),
    )?;
    ch.queue_purge("txbox-bench")?;
    conn.close()?;
    Ok(())
}
