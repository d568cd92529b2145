//! Part `instances`: many relay processes (this binary's `--worker`) on one
//! table.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txbox::{Config, Event, EventId, EventSettings, Outbox, PgStore, Relay, SendError, Sender};

use crate::common::*;
use crate::latency::pickup_broker;

/// A relay process of the many-instances scenarios: logs each acked id, with the
/// time of its ack, to a file. `broker` is `none` (the throughput run: a sender
/// that acks at once) or `rabbitmq` / `kafka` (the latency run: the real broker,
/// with the default settings).
pub(crate) fn worker(prefix: &str, file: &str, broker: &str) -> Res<()> {
    struct AckAll;
    impl Sender for AckAll {
        fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
            events.iter().map(|_| Ok(())).collect()
        }
    }
    let store = Arc::new(PgStore::connect(
        &pg_url(),
        &Config::builder().table_prefix(prefix).build()?,
    )?);
    let log = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)?,
    ));
    let acks = Acks {
        log: Some(log),
        ..Acks::default()
    };
    let _relay = match broker {
        "none" => {
            let cfg = config(
                prefix,
                EventSettings::default().batch_size(200).adaptive_polling(
                    Duration::from_millis(20),
                    Duration::from_millis(500),
                    1.5,
                ),
            );
            Relay::start(store, &cfg, move || -> txbox::Result<Box<dyn Sender>> {
                Ok(Box::new(Timed::new(AckAll, acks.clone())))
            })?
        }
        _ => {
            let b = pickup_broker(broker)?;
            let cfg = config(prefix, EventSettings::default().destination(b.destination));
            let factory = b.factory;
            Relay::start(store, &cfg, move || -> txbox::Result<Box<dyn Sender>> {
                Ok(Box::new(Timed::new(factory.create()?, acks.clone())))
            })?
        }
    };
    std::thread::sleep(Duration::from_secs(600));
    Ok(())
}

/// Starts `n` relay processes (see [`worker`]) on the tables of `prefix`, each
/// logging to its own file; they are killed when the returned guard drops.
pub(crate) struct Workers {
    children: Vec<std::process::Child>,
    files: Vec<std::path::PathBuf>,
}

impl Workers {
    fn start(n: usize, prefix: &str, broker: &str) -> Res<Workers> {
        let mut w = Workers {
            children: Vec::new(),
            files: Vec::new(),
        };
        for i in 0..n {
            let f = std::env::temp_dir().join(format!(
                "txbox-bench-{}-{broker}-{i}.ids",
                std::process::id()
            ));
            let _ = std::fs::remove_file(&f);
            w.children.push(
                std::process::Command::new(std::env::current_exe()?)
                    .args(["--worker", prefix, &f.display().to_string(), broker])
                    .spawn()?,
            );
            w.files.push(f);
        }
        Ok(w)
    }

    /// Every ack logged so far: (id, unix µs), duplicates included.
    fn acks(&self) -> Vec<(EventId, u128)> {
        let mut v = Vec::new();
        for f in &self.files {
            for l in std::fs::read_to_string(f).unwrap_or_default().lines() {
                let mut words = l.split(' ');
                if let (Some(Ok(id)), Some(Ok(t))) = (
                    words.next().map(str::parse),
                    words.next().map(str::parse::<u128>),
                ) {
                    v.push((id, t));
                }
            }
        }
        v
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for ch in &mut self.children {
            let _ = ch.kill();
            let _ = ch.wait();
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

pub(crate) fn many_instances(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_many_";
    let mut base = 0.0;
    for n in [1, 2, 4] {
        let (store, mut c) = fresh(p)?;
        let outbox = Outbox::new(&config(p, EventSettings::default()))?;
        let ids = fill(&mut c, &outbox, s.instances)?;
        let t = Instant::now();
        let workers = Workers::start(n, p, "none")?;
        while store.status()?.iter().any(|x| x.pending + x.in_process > 0)
            && t.elapsed() < Duration::from_secs(600)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let secs = t.elapsed().as_secs_f64();
        let acks = workers.acks();
        drop(workers);
        let lines = acks.len();
        let seen: HashSet<EventId> = acks.into_iter().map(|(id, _)| id).collect();
        let rate = s.instances as f64 / secs;
        if n == 1 {
            base = rate;
        }
        let lost = ids.iter().filter(|i| !seen.contains(i)).count();
        out.push(row(
            format!(
                "{n} relay process(es), {} events: duplicates {} lost {lost}",
                s.instances,
                lines - seen.len()
            ),
            format!("{rate:.0} ev/s"),
            format!("{base:.0} ev/s (1 process)"),
            rate / base,
            "0 duplicates, 0 lost",
        ));
    }
    Ok(())
}

/// 4 relay processes on one table, each with its own connection to the real
/// broker and the default settings (wake-up on commit), events committed at
/// 100/s: commit -> ack p50 / p99 over all of them, and the duplicates.
pub(crate) fn many_latency(s: &Size, broker: &str, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_many_latency_";
    let (_store, mut c) = fresh(p)?;
    let outbox = Outbox::new(&config(p, EventSettings::default()))?;
    let name = pickup_broker(broker)?.name;
    let workers = Workers::start(4, p, broker)?;
    let mut commit = || -> Res<(EventId, u128)> {
        let mut tx = c.transaction()?;
        let id = outbox.publish(&mut tx, "bench", &serde_json::json!({"n": 1}))?;
        tx.commit()?;
        Ok((id, unix_micros()))
    };
    // wait until every process's relay has sent once (their senders connect on
    // the first batch), so the timed window measures running relays
    let deadline = Instant::now() + Duration::from_secs(60);
    while workers
        .files
        .iter()
        .any(|f| std::fs::metadata(f).map_or(true, |m| m.len() == 0))
    {
        if Instant::now() > deadline {
            return Err("the relay processes did not all send within 60 s".into());
        }
        commit()?;
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut committed = Vec::new();
    let start = Instant::now();
    let mut next = start;
    while start.elapsed() < Duration::from_secs(s.rate_secs) {
        committed.push(commit()?);
        next += Duration::from_millis(10);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let acks = loop {
        let acks = workers.acks();
        let seen: HashSet<EventId> = acks.iter().map(|(id, _)| *id).collect();
        if committed.iter().all(|(id, _)| seen.contains(id)) || Instant::now() > deadline {
            break acks;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(workers);
    let mut first: HashMap<EventId, u128> = HashMap::new();
    let mut duplicates = 0;
    for (id, t) in &acks {
        if first.insert(*id, *t).is_some() {
            duplicates += 1;
        }
    }
    let mut l: Vec<f64> = committed
        .iter()
        .filter_map(|(id, t)| first.get(id).map(|a| a.saturating_sub(*t) as f64 / 1000.0))
        .collect();
    let lost = committed.len() - l.len();
    out.push(row(
        format!(
            "4 relay processes, 100 ev/s, commit->{name} ack p50 / p99 ({} ev): duplicates {duplicates} lost {lost}",
            committed.len()
        ),
        format!("{:.1} ms", median(&mut l)),
        format!("{:.1} ms", pct(&mut l, 0.99)),
        0.0,
        "p99 <= 20 ms, 0 duplicates",
    ));
    Ok(())
}
