//! The benchmark: what txbox costs a business transaction and how fast and how
//! safely it drains, each figure beside its baseline in the same run.
//!
//! ```text
//! cargo run --release -p txbox-bench            # quick (< 1 minute)
//! cargo run --release -p txbox-bench -- --full  # the full sizes
//! cargo run --release -p txbox-bench -- --help  # parts, window
//! ```
//! Needs PostgreSQL (`TXBOX_PG_URL`), RabbitMQ and Kafka (as in the tests). Prints one
//! table; docs/BENCHMARKS.md keeps a run.

use brokers::broker_throughput;
use common::*;
use delayed::delayed_on_time;
use floor::{ordered_floor, ordered_plan, relay_floor};
use idle::{idle_cost, idle_direct};
use instances::{many_instances, many_latency, worker};
use latency::{ensure_queue, pickup_broker, pickup_latency};
use migrate::migration_cost;
use publish::{batch_publish, diesel_overhead, publish_overhead};
use slow_link::slow_link;
use soak::soak;
use soak_mysql::soak_mysql;
use writers::concurrent_publishers;

mod brokers;
mod common;
mod delayed;
mod floor;
mod idle;
mod instances;
mod latency;
mod migrate;
mod publish;
mod slow_link;
mod soak;
mod soak_mysql;
mod writers;

use std::sync::Arc;
use std::time::{Duration, Instant};

use txbox::ClaimMode;

/// The benchmark: what txbox costs a business transaction and how fast and how
/// safely it drains, each figure beside its baseline in the same run. A bad
/// flag or value is an error, not a silently ignored word that runs
/// everything.
#[derive(clap::Parser)]
#[command(name = "bench")]
struct Args {
    /// The full sizes (100,000 events, 5 minutes idle, 3 rounds; about 10
    /// minutes) instead of the quick run (under a minute).
    #[arg(long)]
    full: bool,
    /// Run only these parts (writers: 1, 8, 32 and 64 concurrent publishers
    /// with the wake-up on commit on and off, a relay draining; migrate: an
    /// upgrade's duration and the longest publish during it over 100,000
    /// events, 1,000,000 with --full; idle-direct: the broker's share of the
    /// pick-up after idle, one event published directly; ordered: the relay
    /// floor of an ordered type; plan: an ordered claim's EXPLAIN over 100,000
    /// pending rows, 1,000,000 with --full; soak: the relay under a held
    /// snapshot beside a run without, see --soak-secs; soak-mysql: a claim's
    /// index reads on MySQL/MariaDB after --events events under a held
    /// consistent snapshot; delayed: 1,000 events delayed
    /// 1-10 s, each one's send time minus its due time; diesel: the publish
    /// overhead in a Diesel transaction; slow-link: the relay's drain with
    /// its database --link-delay away each way).
    #[arg(long, value_name = "PART,PART...", value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(PARTS))]
    only: Option<Vec<String>>,
    /// Batches the relay keeps with the broker (default: the relay's
    /// default, 3).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
    in_flight: Option<u16>,
    /// The relay floor and the brokers with processed_ttl zero: acked rows
    /// are deleted instead of marked PROCESSED (the hand loop too).
    #[arg(long)]
    delete_acked: bool,
    /// `lock`: the relay floor and the brokers with held claims (rows locked
    /// in an open transaction, not stamped; the hand loop too).
    #[arg(long, value_name = "lease|lock", default_value = "lease")]
    claim: ClaimMode,
    /// Pending events for the relay floor, the brokers and the many
    /// instances (quick 20,000; full 100,000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    events: Option<u64>,
    /// Transactions for the publish overhead (quick 500; full 5,000); batch
    /// publish runs N/5 batches.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    txs: Option<u64>,
    /// How long the idle cost is observed, and the idle time before the
    /// single-event pick-up (quick 10 and 5; full 300 and 60).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    idle: Option<u64>,
    /// Events in the pick-up's burst, one transaction (quick 2,000; full
    /// 10,000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    burst: Option<u64>,
    /// How many single events after an idle spell the pick-up times (quick
    /// 2; full 10).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    idle_samples: Option<u64>,
    /// How long events arrive at 100/s for the pick-up latency (quick 3;
    /// full 30).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    rate_secs: Option<u64>,
    /// How often the relay floor's turns (relay, hand loop, hand loop, relay)
    /// and the brokers' runs (relay, direct, database alone) repeat; each
    /// figure is their median (quick 1; full 3).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    rounds: Option<u64>,
    /// The publish overhead with PostgreSQL's commit notification `on` (as
    /// shipped), `off` (its trigger disabled) or `empty` (the trigger fires,
    /// its function sends nothing).
    #[arg(long, default_value = "on", value_parser = ["on", "off", "empty"])]
    trigger: String,
    /// The numbers of concurrent publishers of part `writers`.
    #[arg(long, value_name = "N,N...", value_delimiter = ',', default_value = "1,8,32,64",
          value_parser = clap::value_parser!(u64).range(1..=256))]
    writers: Vec<u64>,
    /// How long each of part `soak`'s two runs lasts (quick 40; full 600,
    /// the issue's ten minutes; 1800 for its half hour).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(12..))]
    soak_secs: Option<u64>,
    /// Events per second part `soak`'s four publishers make together.
    #[arg(long, value_name = "N", default_value = "1000",
          value_parser = clap::value_parser!(u64).range(4..=20_000))]
    soak_rate: u64,
    /// How far part `slow-link` puts the database, each way, in
    /// milliseconds (the issue's 200).
    #[arg(long, value_name = "MS", default_value = "200",
          value_parser = clap::value_parser!(u64).range(1..=2_000))]
    link_delay: u64,
}

fn main() -> Res<()> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, prefix, file, broker] = raw.as_slice() {
        if flag == "--worker" {
            return worker(prefix, file, broker);
        }
    }
    let args = <Args as clap::Parser>::parse();
    let (full, only) = (args.full, args.only.clone());
    let in_flight = args.in_flight.map(usize::from);
    let n = |v: Option<u64>| v.map(|n| n as usize);
    let (events, txs, rounds) = (n(args.events), n(args.txs), n(args.rounds));
    let part = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    let s = if full {
        Size {
            txs: 5000,
            batches: 1000,
            floor: 100_000,
            brokers: 100_000,
            idle: Duration::from_secs(300),
            rate_secs: 30,
            burst: 10_000,
            idle_single: Duration::from_secs(60),
            idle_samples: 10,
            instances: 100_000,
            plan_rows: 1_000_000,
            writers_secs: 8,
            writers: vec![],
            trigger: String::new(),
            rounds: 3,
            in_flight,
            delete_acked: args.delete_acked,
            claim: args.claim,
        }
    } else {
        Size {
            txs: 500,
            batches: 100,
            floor: 20_000,
            brokers: 20_000,
            idle: Duration::from_secs(10),
            rate_secs: 3,
            burst: 2_000,
            idle_single: Duration::from_secs(5),
            idle_samples: 2,
            instances: 20_000,
            plan_rows: 100_000,
            writers_secs: 3,
            writers: vec![],
            trigger: String::new(),
            rounds: 1,
            in_flight,
            delete_acked: args.delete_acked,
            claim: args.claim,
        }
    };
    let s = Size {
        txs: txs.unwrap_or(s.txs),
        batches: txs.map_or(s.batches, |n| (n / 5).max(1)),
        floor: events.unwrap_or(s.floor),
        brokers: events.unwrap_or(s.brokers),
        instances: events.unwrap_or(s.instances),
        idle: args.idle.map_or(s.idle, Duration::from_secs),
        idle_single: args.idle.map_or(s.idle_single, Duration::from_secs),
        rate_secs: args.rate_secs.unwrap_or(s.rate_secs),
        burst: n(args.burst).unwrap_or(s.burst),
        idle_samples: n(args.idle_samples).unwrap_or(s.idle_samples),
        rounds: rounds.unwrap_or(s.rounds),
        trigger: args.trigger.clone(),
        writers: args.writers.iter().map(|&n| n as usize).collect(),
        ..s
    };
    let _ = env_logger::builder()
        .filter_level(log::LevelFilter::Error)
        .try_init();
    let (rabbit, brokers) = (rabbit_url(), kafka_brokers());
    let mut out = Vec::new();
    let t = Instant::now();
    let step = |what: &str| eprintln!("bench: {what} done at {:.1}s", t.elapsed().as_secs_f64());
    if part("publish") {
        publish_overhead(&s, &mut out)?;
        step("publish overhead");
    }
    if part("batch") {
        batch_publish(&s, &mut out)?;
        step("batch publish");
    }
    if part("floor") {
        relay_floor(&s, false, &mut out)?;
        relay_floor(&s, true, &mut out)?;
        step("relay floor");
    }
    if part("ordered") {
        ordered_floor(&s, &mut out)?;
        step("ordered relay floor");
    }
    if part("plan") {
        ordered_plan(&s, &mut out)?;
        step("ordered claim plan");
    }
    if part("brokers") {
        ensure_queue(&rabbit)?;
        broker_throughput(
            "RabbitMQ (confirms)",
            &s,
            Arc::new(rabbit_sender(&rabbit)?),
            "amq.direct",
            &|| ensure_queue(&rabbit),
            &mut out,
        )?;
        txbox::kafka::ensure_topic(&brokers, "txbox-bench", 3)?;
        broker_throughput(
            "Kafka (acks=all)",
            &s,
            Arc::new(txbox::kafka::KafkaSender::builder(&brokers).build()?),
            "txbox-bench",
            &|| Ok(()), // Tansu keeps no queue to empty
            &mut out,
        )?;
        step("brokers");
    }
    if part("writers") {
        concurrent_publishers(&s, &mut out)?;
        step("concurrent publishers");
    }
    if part("idle") {
        idle_cost(&s, &mut out)?;
        step("idle cost");
    }
    if part("latency") {
        pickup_latency(&s, pickup_broker("rabbitmq")?, &mut out)?;
        pickup_latency(&s, pickup_broker("kafka")?, &mut out)?;
        step("pick-up latency");
    }
    if part("migrate") {
        migration_cost(&s, &mut out)?;
        step("migrate");
    }
    if part("diesel") {
        diesel_overhead(&s, &mut out)?;
        step("Diesel publish overhead");
    }
    if part("delayed") {
        delayed_on_time(&mut out)?;
        step("delayed events");
    }
    if part("soak") {
        let secs = args.soak_secs.unwrap_or(if full { 600 } else { 40 });
        soak(secs, args.soak_rate, &mut out)?;
        step("soak under a held snapshot");
    }
    if part("slow-link") {
        slow_link(&s, Duration::from_millis(args.link_delay), &mut out)?;
        step("relay with a far database");
    }
    if part("soak-mysql") {
        soak_mysql(s.floor, &mut out)?;
        step("MySQL/MariaDB claims under a held snapshot");
    }
    if part("idle-direct") {
        idle_direct(&s, &mut out)?;
        step("direct publish after idle");
    }
    if part("instances") {
        many_instances(&s, &mut out)?;
        for broker in ["rabbitmq", "kafka"] {
            many_latency(&s, broker, &mut out)?;
        }
        step("many instances");
    }

    println!("txbox bench ({})", if full { "full" } else { "quick" });
    let w = out.iter().map(|r| r.what.len()).max().unwrap_or(10);
    println!(
        "| {:w$} | {:>14} | {:>22} | {:>6} | target |",
        "measure", "txbox", "baseline", "ratio"
    );
    println!(
        "|{}|{}|{}|{}|---|",
        "-".repeat(w + 2),
        "-".repeat(16),
        "-".repeat(24),
        "-".repeat(8)
    );
    for r in out {
        let ratio = if r.ratio == "0.00" {
            "-".to_string()
        } else {
            r.ratio
        };
        println!(
            "| {:w$} | {:>14} | {:>22} | {:>6} | {} |",
            r.what, r.txbox, r.baseline, ratio, r.target
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn literals_replace_whole_placeholders() {
        let v: Vec<String> = (1..=10).map(|n| format!("v{n}")).collect();
        let v: Vec<&str> = v.iter().map(String::as_str).collect();
        assert_eq!(
            super::with_literals("$1, $10, $$ x $2", &v).unwrap(),
            "v1, v10, $$ x v2"
        );
        assert!(super::with_literals("$11", &v).is_err());
    }
}
