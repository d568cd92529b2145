//! txbox in one screen: business transactions publish events into the outbox (some
//! roll back), a relay delivers the committed ones, and the program checks that none
//! was lost, none duplicated, and no rolled-back event escaped.
//!
//! ```text
//! cargo run --example quickstart [-- --database-url postgres://user@host/db]
//! ```
//! The URL defaults to `TXBOX_DATABASE_URL`, then to the local test database.
//! The last line is `quickstart: published=N delivered=N rolled_back=M lost=0 duplicates=0`;
//! the exit code is non-zero if anything was lost or duplicated.

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use txbox::{Config, EventOptions, MemorySender, Outbox, PgStore, Relay, Store};

#[derive(Serialize)]
struct OrderCreated {
    order_id: i64,
    customer: String,
    total_cents: i64,
}

fn database_url() -> Result<String, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(std::env::var("TXBOX_DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())),
        [flag, url] if flag == "--database-url" => Ok(url.clone()),
        _ => Err(format!(
            "unexpected arguments {args:?} (usage: quickstart [--database-url URL])"
        )),
    }
}

fn main() -> ExitCode {
    env_logger_init();
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("quickstart: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn env_logger_init() {
    let _ = env_logger::builder()
        .filter_level(log::LevelFilter::Warn)
        .try_init();
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let url = database_url()?;
    let config = Config::builder()
        .table_prefix("quickstart_")
        .defaults(EventOptions::new().adaptive_polling(
            Duration::from_millis(50),
            Duration::from_secs(2),
            1.5,
        ))
        .event("order-created", EventOptions::new().destination("orders"))
        .dlq(true)
        .build()?;

    // The schema: idempotent, so every run can call it.
    let store = Arc::new(PgStore::connect(&url, &config.table_prefix)?);
    store.migrate()?;
    let outbox = Outbox::new(&config)?;

    let mut client = postgres::Client::connect(&url, postgres::NoTls)?;
    client.batch_execute(
        "CREATE TABLE IF NOT EXISTS quickstart_orders (
             id bigserial PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)",
    )?;

    // The relay runs beside the business code.
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone())?;

    // Business transactions: the order row and its event commit (or roll back) together.
    let mut published = HashSet::new();
    let mut rolled_back = HashSet::new();
    for i in 0..50i64 {
        let mut tx = client.transaction()?;
        let customer = format!("customer-{}", i % 7);
        let total_cents = 1000 + i * 37;
        let order_id: i64 = tx
            .query_one(
                "INSERT INTO quickstart_orders (customer, total_cents) VALUES ($1, $2) RETURNING id",
                &[&customer, &total_cents],
            )?
            .get(0);
        let event = OrderCreated {
            order_id,
            customer,
            total_cents,
        };
        let id = outbox.publish(&mut tx, "order-created", &event)?;
        if i % 5 == 4 {
            tx.rollback()?; // e.g. payment declined: neither the order nor the event exist
            rolled_back.insert(id);
        } else {
            tx.commit()?;
            published.insert(id);
        }
    }
    relay.wake("order-created");

    // Wait until every committed event was delivered (or give up after 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let delivered_all = || {
        let sent: HashSet<_> = sender.sent().iter().map(|e| e.id).collect();
        published.iter().all(|id| sent.contains(id))
    };
    while !delivered_all() && Instant::now() < deadline {
        sender.wait_for(sender.len() + 1, Duration::from_millis(200));
    }
    relay.shutdown(Duration::from_secs(10))?;

    let mut times: HashMap<txbox::EventId, usize> = HashMap::new();
    for e in sender.sent() {
        *times.entry(e.id).or_default() += 1;
    }
    let delivered = published.iter().filter(|id| times.contains_key(id)).count();
    let lost = published.len() - delivered;
    let duplicates: usize = times.values().map(|n| n - 1).sum();
    let escaped = rolled_back
        .iter()
        .filter(|id| times.contains_key(id))
        .count();
    if escaped > 0 {
        eprintln!("quickstart: {escaped} rolled-back events were sent");
    }
    println!(
        "quickstart: published={} delivered={delivered} rolled_back={} lost={lost} duplicates={duplicates}",
        published.len(),
        rolled_back.len()
    );
    Ok(lost == 0 && duplicates == 0 && escaped == 0)
}
