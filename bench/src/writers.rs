//! Part `writers`: concurrent publishers with the wake-up on commit on, off,
//! as schema 3 had it, firing an empty function, and with the type's wake-up
//! `poll`.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use txbox::{EventSettings, Relay, Sender};

use crate::common::*;

/// How the concurrent publishers' commits wake the relay.
#[derive(Clone, Copy, PartialEq)]
pub(crate) enum WakeUp {
    /// the rationed trigger as shipped (schemas 6 and 8)
    On,
    /// the trigger disabled: the relay polls
    Off,
    /// schema 3's trigger: every commit notifies
    EveryCommit,
    /// the trigger fires and its function returns at once: what the deferred
    /// trigger itself costs (the relay polls)
    Empty,
    /// the type's wake-up is `poll`: the trigger does all its work (its locks,
    /// its checks) and sends nothing; the relay polls and nobody listens
    Poll,
}

/// N concurrent publishers through `Outbox::publish` with the wake-up on commit
/// as shipped, off (its trigger disabled) and as schema 3 had it (every commit
/// notifies), a relay draining in each: commits per second and the ratios to
/// off. Each run starts on fresh tables (a run's dead rows would slow the
/// next); the runs take turns, each figure the median of `rounds`.
pub(crate) fn concurrent_publishers(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_writers_";
    let cfg = config_with(p, EventSettings::default(), true);
    let polling = config_with(p, EventSettings::default().wake(txbox::Wake::Poll), true);
    let every_commit = include_str!("../../sql/postgres/003_notify_on_commit.sql")
        .lines()
        .filter(|l| l.starts_with("CREATE "))
        .map(|l| l.replace("{prefix}", p))
        .collect::<Vec<_>>()
        .join("\n");
    let empty = format!(
        "CREATE OR REPLACE FUNCTION {p}txbox_wake() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RETURN NULL; END $$"
    );
    let modes = [
        WakeUp::On,
        WakeUp::Off,
        WakeUp::EveryCommit,
        WakeUp::Empty,
        WakeUp::Poll,
    ];
    for &n in &s.writers {
        let mut tps: [Vec<f64>; 5] = Default::default();
        let mut cpu: [Vec<f64>; 5] = Default::default();
        let mut xids: [Vec<f64>; 5] = Default::default();
        let mut claims: [Vec<f64>; 5] = Default::default();
        for r in 0..s.rounds.max(2) {
            // each round in another order: none always goes first
            for k in 0..modes.len() {
                let i = (r + k) % modes.len();
                let mode = modes[i];
                let (_, mut c) = fresh(p)?;
                c.batch_execute(
                    "DROP TABLE IF EXISTS bench_writer_orders; \
                     CREATE TABLE bench_writer_orders (id bigserial PRIMARY KEY, total bigint)",
                )?;
                if mode == WakeUp::Empty {
                    c.batch_execute(&empty)?;
                }
                if mode == WakeUp::Off || mode == WakeUp::EveryCommit {
                    c.batch_execute(&format!(
                        "ALTER TABLE {p}outbox_events DISABLE TRIGGER {p}outbox_events_wake"
                    ))?;
                }
                if mode == WakeUp::EveryCommit {
                    c.batch_execute(&every_commit)?;
                }
                c.batch_execute("CHECKPOINT")?;
                let acks = Acks::default();
                let count = acks.count.clone();
                let cfg = if mode == WakeUp::Poll { &polling } else { &cfg };
                let (store, claimed) = counted(cfg)?;
                let relay = Relay::start(store, cfg, move || -> txbox::Result<Box<dyn Sender>> {
                    Ok(Box::new(Timed::new(Discard, acks.clone())))
                })?;
                // the machine's CPU from the first commit until the relay sent
                // the last event: the publishers, the database and the relay
                let xid = |c: &mut postgres::Client| -> Res<i64> {
                    Ok(c.query_one("SELECT txid_current()", &[])?.get(0))
                };
                let first = xid(&mut c)?;
                let (commits, busy) = with_cpu(|| {
                    let commits = publish_flat_out(cfg, "bench", n, s.writers_secs)?;
                    // the relay keeps up (or the run says so)
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while count.load(Ordering::Relaxed) < commits && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Res::Ok(commits)
                })?;
                if count.load(Ordering::Relaxed) < commits {
                    return Err(format!("the relay sent {count:?} of {commits} events").into());
                }
                // every writing transaction takes an id: the publishers' and
                // the relay's (claims, finishes)
                let writes = (xid(&mut c)? - first - 1) as f64;
                xids[i].push(writes / commits.max(1) as f64);
                claims[i].push(claimed.count() as f64 * 1000.0 / commits.max(1) as f64);
                let rate = commits as f64 / s.writers_secs as f64;
                tps[i].push(rate);
                if let Some(busy) = busy {
                    cpu[i].push(busy * 1e6 / commits.max(1) as f64);
                }
                relay.shutdown(Duration::from_secs(10))?;
            }
        }
        // each measure's median per mode, in the order of `modes`
        let medians = |v: &[Vec<f64>; 5]| v.iter().map(|v| p50(v)).collect::<Vec<_>>();
        let (tps, cpu, claims, xids) = (
            medians(&tps),
            medians(&cpu),
            medians(&claims),
            medians(&xids),
        );
        let at = |m: WakeUp| modes.iter().position(|&x| x == m).unwrap_or(0);
        let off = at(WakeUp::Off);
        let target = match n {
            1 => ">= 0.93",
            64 => ">= 0.9",
            _ => ">= 0.95",
        };
        let compared = [
            (WakeUp::On, "wake-up on", target),
            (
                WakeUp::EveryCommit,
                "schema 3's trigger (every commit notifies)",
                "-",
            ),
            (WakeUp::Empty, "the trigger firing an empty function", "-"),
            (
                WakeUp::Poll,
                "wake = \"poll\" (the trigger's locks, no notification)",
                "-",
            ),
        ];
        for (mode, what, target) in compared {
            let i = at(mode);
            out.push(row(
                format!("{n} publishers, commits/s, {what} vs off"),
                format!("{:.0}/s", tps[i]),
                format!("{:.0}/s", tps[off]),
                tps[i] / tps[off],
                target,
            ));
            // on a machine the publishers keep busy, the commit rate is the
            // inverse of this: the steadier figure of the two (NaN: not read)
            if !cpu[i].is_nan() && !cpu[off].is_nan() {
                out.push(row(
                    format!("  {n} publishers, machine CPU per commit and its relaying, {what} vs off (ratio off/it)"),
                    format!("{:.0} us", cpu[i]),
                    format!("{:.0} us", cpu[off]),
                    cpu[off] / cpu[i],
                    target,
                ));
            }
        }
        let on = at(WakeUp::On);
        out.push(row(
            format!("  {n} publishers, the relay's claims per 1,000 commits, on vs off"),
            format!("{:.1}", claims[on]),
            format!("{:.1}", claims[off]),
            claims[on] / claims[off],
            "-",
        ));
        out.push(row(
            format!("  {n} publishers, writing transactions per commit (the publisher's and the relay's), on vs off"),
            format!("{:.3}", xids[on]),
            format!("{:.3}", xids[off]),
            xids[on] / xids[off],
            "-",
        ));
    }
    Ok(())
}
