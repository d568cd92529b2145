//! The transactional inbox on Kafka: a payment service consumes `order-created`
//! events and charges each order exactly once, although the broker delivers some
//! events twice (here: re-sent raw with the same event id).
//!
//! ```text
//! cargo run --all-features --example inbox_consumer
//! ```
//! Needs PostgreSQL (`TXBOX_DATABASE_URL`) and Kafka (`TXBOX_KAFKA_BROKERS`).
//! The last line is `inbox_consumer: handled=N duplicates_skipped=M lost=0`; the
//! exit code is non-zero if an event was lost or charged twice.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use txbox::kafka::{ensure_topic, KafkaConsumer, KafkaSender};
use txbox::{Config, Error, Outbox, PgStore, Relay, Sender, StopSignal};
use txbox::{Inbox, MemoryCache, MissingIdPolicy};

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() -> ExitCode {
    let _ = env_logger::builder()
        .filter_level(log::LevelFilter::Warn)
        .parse_default_env()
        .try_init();
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("inbox_consumer: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let url = env(
        "TXBOX_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let brokers = env("TXBOX_KAFKA_BROKERS", "127.0.0.1:9092");
    let topic = format!("txbox-inbox-demo-{}", txbox::EventId::new());
    ensure_topic(&brokers, &topic, 1)?;
    let config = Config::builder()
        .table_prefix("inbox_demo_")
        .defaults(|e| e.adaptive_polling(Duration::from_millis(20), Duration::from_secs(1), 1.5))
        .event("order-created", |e| e.destination(&topic))
        .build()?;
    let store = Arc::new(PgStore::connect(&url, &config)?);
    store.migrate()?;
    let mut db = postgres::Client::connect(&url, postgres::NoTls)?;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS inbox_demo_charges (event_id uuid NOT NULL, amount_cents bigint NOT NULL)",
    )?;

    // Producer side: 50 orders through the outbox and the relay.
    let outbox = Outbox::new(&config)?;
    let sender = KafkaSender::builder(&brokers).build()?;
    let relay = Relay::start(store.clone(), &config, sender.clone())?;
    let mut tx = db.transaction()?;
    let ids = outbox.publish_all(
        &mut tx,
        txbox::NewEvent::batch(
            "order-created",
            (0..50).map(|i| serde_json::json!({"amount_cents": 100 + i})),
        )?,
    )?;
    tx.commit()?;
    relay.wake("order-created");

    // The broker delivers 10 of them a second time (a producer retry, a replay...).
    let mut raw = sender;
    let deadline = Instant::now() + Duration::from_secs(30);
    while store.status()?.iter().any(|s| s.pending + s.in_process > 0) && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    // long enough for the batches in flight to get their acks
    let deadline = relay.ack_wait().unwrap_or_default() + Duration::from_secs(5);
    relay.shutdown(deadline)?;
    let again: Vec<txbox::Event> = ids[..10]
        .iter()
        .enumerate()
        .map(|(i, id)| txbox::Event {
            id: *id,
            event_type: "order-created".into(),
            destination: topic.clone(),
            key: None,
            headers: Default::default(),
            payload: serde_json::json!({"amount_cents": 100 + i})
                .to_string()
                .into_bytes(),
            content_type: None,
            attempts: 0,
        })
        .collect();
    if raw.send(&again).iter().any(|r| r.is_err()) {
        return Err("re-sending the duplicates failed".into());
    }

    // Consumer side: charge each order in the same transaction that records its id.
    let inbox = Inbox::new(&config, "payments")?.with_cache(MemoryCache::new(10_000));
    let handler = inbox.handler_pg(
        store.pool().clone(),
        MissingIdPolicy::Reject,
        |tx, event| {
            let order: serde_json::Value = event.json()?;
            let amount = order["amount_cents"].as_i64().unwrap_or(0);
            tx.execute(
                "INSERT INTO inbox_demo_charges (event_id, amount_cents) VALUES ($1, $2)",
                &[&event.event_id()?.as_uuid(), &amount],
            )
            .map_err(Error::from)?;
            Ok::<_, Error>(())
        },
    );
    let consumer = KafkaConsumer::builder(&brokers, &format!("payments-{topic}")).build()?;
    consumer.assign(&topic, &[0])?;
    let stop = StopSignal::new();
    let s = stop.clone();
    let worker = std::thread::spawn(move || consumer.run_with(&s, handler));
    let deadline = Instant::now() + Duration::from_secs(60);
    while inbox.stats().consumed + inbox.stats().duplicates < 60 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    stop.stop();
    let _ = worker.join();

    let want: Vec<uuid::Uuid> = ids.iter().map(|i| i.as_uuid()).collect();
    let rows = db.query(
        "SELECT event_id FROM inbox_demo_charges WHERE event_id = ANY($1)",
        &[&want],
    )?;
    let charged: Vec<uuid::Uuid> = rows.iter().map(|r| r.get(0)).collect();
    let distinct: HashSet<_> = charged.iter().collect();
    let lost = ids.len() - distinct.len();
    let charged_twice = charged.len() - distinct.len();
    if charged_twice > 0 {
        eprintln!("inbox_consumer: {charged_twice} orders were charged twice");
    }
    let stats = inbox.stats();
    println!(
        "inbox_consumer: handled={} duplicates_skipped={} lost={lost}",
        distinct.len(),
        stats.duplicates
    );
    Ok(lost == 0 && charged_twice == 0)
}
