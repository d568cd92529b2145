//! Part `soak`: the relay under a long transaction (issue 45). The same load
//! twice, on fresh tables: without, then with a REPEATABLE READ snapshot held
//! from a sixth of the run to its end (an analytics query, `pg_dump`): 4
//! publishers at `--soak-rate` events/s in all (1,000), each transaction a
//! business row and an event; a relay at its defaults (lease claims, the
//! wake-up on commit) to a sender that acks at once, so that what is
//! measured is the database's side. Autovacuum is turned on for the part
//! (the image ships it off) and back as it was after.
//!
//! Per run, the first window after the snapshot begins and the last one
//! (each a sixth of the run): the relay's claim (mean time and count), the
//! backlog (published and committed, not yet sent) at its most, the longest
//! wait from a commit to its send, the publishers' mean transaction time and
//! the CPU of the relay's database sessions; at the end the outbox's dead row
//! versions and its pending index's size. Printed side by side, as in the
//! issue's table; the summary takes the claim's and the CPU's ratios.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txbox::{Config, Event, EventId, Outbox, PgStore, Relay, SendError, Sender};

use crate::common::*;

/// When each event was committed and when it was sent.
#[derive(Default)]
struct Clock {
    committed: Mutex<HashMap<EventId, Instant>>,
    sent: Mutex<Vec<(Instant, EventId)>>,
    published: AtomicU64,
    delivered: AtomicU64,
}

struct Stamp(Arc<Clock>);

impl Sender for Stamp {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        let now = Instant::now();
        let mut sent = self.0.sent.lock().unwrap();
        sent.extend(events.iter().map(|e| (now, e.id)));
        self.0
            .delivered
            .fetch_add(events.len() as u64, Ordering::Relaxed);
        events.iter().map(|_| Ok(())).collect()
    }
}

/// What one window of a run showed.
#[derive(Debug, Default, Clone, Copy)]
struct Window {
    claim_ms: f64,
    claims_per_10s: f64,
    backlog_max: u64,
    wait_max_ms: f64,
    publish_ms: f64,
    /// CPU seconds of the relay's database sessions per 10 s
    db_cpu: f64,
}

struct Run {
    first: Window,
    last: Window,
    dead: i64,
    index_kb: i64,
    sent: usize,
    unique: usize,
    published: u64,
}

/// CPU seconds (user + system) the backends of `app` used so far.
fn backend_cpu(c: &mut postgres::Client, app: &str) -> Res<f64> {
    let mut total = 0.0;
    for r in c.query(
        "SELECT pid FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )? {
        let pid: i32 = r.get(0);
        if let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            // the fields after the command's closing parenthesis; utime and
            // stime are the 14th and 15th of the line
            if let Some(rest) = stat.rsplit(')').next() {
                let f: Vec<&str> = rest.split_whitespace().collect();
                let ticks: f64 = f.get(11).and_then(|v| v.parse().ok()).unwrap_or(0.0)
                    + f.get(12).and_then(|v| v.parse().ok()).unwrap_or(0.0);
                total += ticks / 100.0;
            }
        }
    }
    Ok(total)
}

fn url_as(app: &str) -> String {
    let url = pg_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={app}")
}

fn one_run(secs: u64, rate: u64, held: bool) -> Res<Run> {
    let p = if held {
        "bench_soak_held_"
    } else {
        "bench_soak_"
    };
    let (_, mut c) = fresh(p)?;
    c.batch_execute(&format!(
        "DROP TABLE IF EXISTS {p}orders; CREATE TABLE {p}orders (id bigserial PRIMARY KEY, n int8 NOT NULL)"
    ))?;
    let app = format!("{p}relay");
    let claims = Arc::new(Claims::timing("bench"));
    let cfg = Config::builder()
        .table_prefix(p)
        .event("bench", |e| e)
        .build()?
        .observed(claims.clone());
    let store = Arc::new(PgStore::connect(&url_as(&app), &cfg)?);
    let clock = Arc::new(Clock::default());
    let factory = {
        let clock = clock.clone();
        move || -> txbox::Result<Box<dyn Sender>> { Ok(Box::new(Stamp(clock.clone()))) }
    };
    let relay = Relay::start(store, &cfg, factory)?;
    let start = Instant::now();
    let run_for = Duration::from_secs(secs);
    let window = run_for / 6;
    let stop = Arc::new(AtomicBool::new(false));
    // publishers, each at a quarter of the rate, on a fixed schedule
    let publishers: Vec<_> = (0..4)
        .map(|w| {
            let (cfg, clock, stop) = (cfg.clone(), clock.clone(), stop.clone());
            std::thread::spawn(move || -> Result<Vec<(Instant, f64)>, String> {
                let publish = || -> Res<Vec<(Instant, f64)>> {
                    let outbox = Outbox::new(&cfg)?;
                    let mut pc = postgres::Client::connect(&pg_url(), postgres::NoTls)?;
                    let insert = format!("INSERT INTO {p}orders (n) VALUES ($1)");
                    let every = Duration::from_secs_f64(4.0 / rate as f64);
                    let mut latencies = Vec::new();
                    let mut next = start + every.mul_f64(w as f64 / 4.0);
                    let mut n: i64 = 0;
                    while !stop.load(Ordering::Relaxed) {
                        let now = Instant::now();
                        if next > now {
                            std::thread::sleep(next - now);
                        }
                        next += every;
                        let began = Instant::now();
                        let mut tx = pc.transaction()?;
                        tx.execute(&insert, &[&n])?;
                        let id = outbox.publish(&mut tx, "bench", &serde_json::json!({"n": n}))?;
                        tx.commit()?;
                        let done = Instant::now();
                        clock.committed.lock().unwrap().insert(id, done);
                        clock.published.fetch_add(1, Ordering::Relaxed);
                        latencies.push((done, (done - began).as_secs_f64() * 1000.0));
                        n += 1;
                    }
                    Ok(latencies)
                };
                publish().map_err(|e| e.to_string())
            })
        })
        .collect();
    // the backlog, sampled; the snapshot and the CPU readings at their times
    let mut backlog: Vec<(Instant, u64)> = Vec::new();
    let mut snapshot = None;
    let marks = [window, window * 2, run_for - window, run_for];
    let mut cpu = Vec::new();
    while start.elapsed() < run_for {
        let at = start.elapsed();
        if held && snapshot.is_none() && at >= window {
            let mut s =
                postgres::Client::connect(&url_as(&format!("{p}snapshot")), postgres::NoTls)?;
            s.batch_execute(
                "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT count(*) FROM pg_class",
            )?;
            snapshot = Some(s);
        }
        if cpu.len() < marks.len() && at >= marks[cpu.len()] {
            cpu.push(backend_cpu(&mut c, &app)?);
        }
        let published = clock.published.load(Ordering::Relaxed);
        let delivered = clock.delivered.load(Ordering::Relaxed);
        backlog.push((Instant::now(), published.saturating_sub(delivered)));
        std::thread::sleep(Duration::from_millis(50));
    }
    cpu.push(backend_cpu(&mut c, &app)?);
    while cpu.len() < marks.len() {
        cpu.push(*cpu.last().unwrap_or(&0.0));
    }
    stop.store(true, Ordering::Relaxed);
    let mut latencies = Vec::new();
    for p in publishers {
        latencies.extend(p.join().map_err(|_| "a publisher panicked")??);
    }
    let published = clock.published.load(Ordering::Relaxed);
    let deadline = Instant::now() + Duration::from_secs(60);
    while clock.delivered.load(Ordering::Relaxed) < published && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    relay.shutdown(Duration::from_secs(30))?;
    let (dead, index_kb): (i64, i64) = {
        let r = c.query_one(
            &format!(
                "SELECT coalesce((SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = '{p}outbox_events'), 0), \
                   coalesce(pg_relation_size(to_regclass('{p}outbox_events_fresh_idx')), 0) / 1024"
            ),
            &[],
        )?;
        (r.get(0), r.get(1))
    };
    drop(snapshot);
    let claimed = claims.take_durations();
    let committed = std::mem::take(&mut *clock.committed.lock().unwrap());
    let sent = std::mem::take(&mut *clock.sent.lock().unwrap());
    let unique = sent
        .iter()
        .map(|(_, id)| *id)
        .collect::<std::collections::HashSet<_>>()
        .len();
    let window_of = |from: Duration, to: Duration, cpu_from: f64, cpu_to: f64| {
        let (a, b) = (start + from, start + to);
        let within = |t: Instant| t >= a && t < b;
        let durations: Vec<f64> = claimed
            .iter()
            .filter(|(t, _)| within(*t))
            .map(|(_, d)| *d)
            .collect();
        let secs = (to - from).as_secs_f64();
        let waits = sent
            .iter()
            .filter(|(t, _)| within(*t))
            .filter_map(|(t, id)| committed.get(id).map(|c| (*t - *c).as_secs_f64() * 1000.0));
        let publish: Vec<f64> = latencies
            .iter()
            .filter(|(t, _)| within(*t))
            .map(|(_, d)| *d)
            .collect();
        Window {
            claim_ms: durations.iter().sum::<f64>() / durations.len().max(1) as f64,
            claims_per_10s: durations.len() as f64 * 10.0 / secs,
            backlog_max: backlog
                .iter()
                .filter(|(t, _)| within(*t))
                .map(|(_, n)| *n)
                .max()
                .unwrap_or(0),
            wait_max_ms: waits.fold(0.0, f64::max),
            publish_ms: publish.iter().sum::<f64>() / publish.len().max(1) as f64,
            db_cpu: (cpu_to - cpu_from) * 10.0 / secs,
        }
    };
    Ok(Run {
        first: window_of(window, window * 2, cpu[0], cpu[1]),
        last: window_of(run_for - window, run_for, cpu[2], cpu[3]),
        dead,
        index_kb,
        sent: sent.len(),
        unique,
        published,
    })
}

/// Autovacuum on for the part (and back as it was): VACUUM keeping up is what
/// a run without the snapshot has, and what the snapshot takes away.
fn with_autovacuum<T>(f: impl FnOnce() -> Res<T>) -> Res<T> {
    let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls)?;
    let was: String = c.query_one("SHOW autovacuum", &[])?.get(0);
    if was != "on" {
        eprintln!("bench: soak: autovacuum turned on for the part (it was {was})");
        c.batch_execute("ALTER SYSTEM SET autovacuum = on")?;
        c.batch_execute("SELECT pg_reload_conf()")?;
    }
    let r = f();
    if was != "on" {
        c.batch_execute("ALTER SYSTEM RESET autovacuum")?;
        c.batch_execute("SELECT pg_reload_conf()")?;
    }
    r
}

pub(crate) fn soak(secs: u64, rate: u64, out: &mut Vec<Row>) -> Res<()> {
    let (plain, held) =
        with_autovacuum(|| Ok((one_run(secs, rate, false)?, one_run(secs, rate, true)?)))?;
    for (name, r) in [("without", &plain), ("snapshot held", &held)] {
        if r.unique as u64 != r.published || r.sent != r.unique {
            return Err(format!(
                "soak {name}: {} published, {} sent, {} of them once",
                r.published, r.sent, r.unique
            )
            .into());
        }
    }
    println!(
        "soak: {rate} events/s from 4 publishers for {secs} s; the snapshot held from {} s on; \
         first and last window of {} s",
        secs / 6,
        secs / 6
    );
    println!("| figure | no snapshot, first / last | snapshot held, first / last |");
    println!("|---|---|---|");
    let line = |what: &str, f: &dyn Fn(&Window) -> String| {
        println!(
            "| {what} | {} / {} | {} / {} |",
            f(&plain.first),
            f(&plain.last),
            f(&held.first),
            f(&held.last)
        );
    };
    line("relay's claim, mean", &|w| format!("{:.2} ms", w.claim_ms));
    line("claims per 10 s", &|w| format!("{:.0}", w.claims_per_10s));
    line("backlog (published, not sent), max", &|w| {
        w.backlog_max.to_string()
    });
    line("longest wait, commit to send", &|w| {
        format!("{:.1} ms", w.wait_max_ms)
    });
    line("publisher's transaction, mean", &|w| {
        format!("{:.2} ms", w.publish_ms)
    });
    line("relay's database sessions, CPU s per 10 s", &|w| {
        format!("{:.2}", w.db_cpu)
    });
    println!(
        "| outbox dead row versions at the end | {} | {} |",
        plain.dead, held.dead
    );
    println!(
        "| pending index at the end | {} kB | {} kB |",
        plain.index_kb, held.index_kb
    );
    println!(
        "| events published, sent once each | {} | {} |",
        plain.published, held.published
    );
    out.push(row(
        "soak: claim mean, last / first window, snapshot held",
        format!("{:.2} ms", held.last.claim_ms),
        format!("{:.2} ms", held.first.claim_ms),
        held.last.claim_ms / held.first.claim_ms,
        "<= 1.5",
    ));
    out.push(row(
        "soak: backlog max, last window, held / without",
        held.last.backlog_max.to_string(),
        plain.last.backlog_max.to_string(),
        held.last.backlog_max as f64 / plain.last.backlog_max.max(1) as f64,
        "<= 2",
    ));
    out.push(ms_row(
        "soak: longest commit-to-send wait, last window, held (vs without)",
        held.last.wait_max_ms,
        plain.last.wait_max_ms,
        "< 50 ms",
    ));
    out.push(ms_row(
        "soak: publisher's transaction, last window, held / without",
        held.last.publish_ms,
        plain.last.publish_ms,
        "<= 1.2",
    ));
    out.push(row(
        "soak: relay's database CPU, last window, held / without",
        format!("{:.2} s/10s", held.last.db_cpu),
        format!("{:.2} s/10s", plain.last.db_cpu),
        held.last.db_cpu / plain.last.db_cpu.max(0.001),
        "<= 1.2",
    ));
    Ok(())
}
