//! A small order service on Diesel: its orders are Diesel models, its schema
//! Diesel migrations; each order and its `order-placed` event are written in
//! one Diesel transaction (`txbox::diesel::transaction`), which a relay then
//! sends to RabbitMQ, where a consumer in the same program reads them back.
//! An order refused half-way rolls back with its event.
//!
//! ```text
//! cargo run --features diesel,rabbitmq --example diesel_service
//! ```
//! Needs PostgreSQL (`TXBOX_DATABASE_URL`) and RabbitMQ (`TXBOX_RABBITMQ_URL`,
//! default amqp://guest:guest@127.0.0.1:5672). The last line is
//! `diesel_service: placed=N received=N lost=0 refused_order_arrived=false`;
//! the exit code is non-zero if anything was lost or a refused order's event
//! arrived.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use diesel::prelude::*;
use diesel_migrations::{embed_migrations, EmbeddedMigrations, MigrationHarness};
use txbox::rabbitmq::{RabbitConsumer, RabbitSender};
use txbox::{Config, EventId, Outbox, PgStore, Relay, StopSignal};

const MIGRATIONS: EmbeddedMigrations = embed_migrations!("examples/diesel_service/migrations");
const EXCHANGE: &str = "txbox-diesel-orders";

diesel::table! {
    diesel_service_orders (id) {
        id -> BigInt,
        customer -> Text,
        total_cents -> BigInt,
    }
}

/// An order as the service inserts it.
#[derive(Insertable)]
#[diesel(table_name = diesel_service_orders)]
struct NewOrder<'a> {
    customer: &'a str,
    total_cents: i64,
}

/// An order as stored.
#[derive(Queryable, Selectable, Debug, serde::Serialize, serde::Deserialize)]
#[diesel(table_name = diesel_service_orders)]
struct Order {
    id: i64,
    customer: String,
    total_cents: i64,
}

/// Places an order: the row and its event commit together, or neither does.
fn place_order(
    conn: &mut PgConnection,
    outbox: &Outbox,
    customer: &str,
    total_cents: i64,
) -> txbox::Result<(Order, EventId)> {
    txbox::diesel::transaction(conn, |tx| {
        let order: Order = diesel::insert_into(diesel_service_orders::table)
            .values(&NewOrder {
                customer,
                total_cents,
            })
            .returning(Order::as_returning())
            .get_result(tx.conn())?;
        let event = outbox.publish(tx, "order-placed", &order)?;
        if total_cents <= 0 {
            // refused after the insert: the order and its event roll back
            return Err(txbox::Error::InvalidInput(format!(
                "order {} has no total",
                order.id
            )));
        }
        Ok((order, event))
    })
}

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
            eprintln!("diesel_service: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let db = env(
        "TXBOX_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let rabbit = env("TXBOX_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672");
    // the service's schema (Diesel's migrations) and txbox's
    let mut conn = PgConnection::establish(&db)?;
    conn.run_pending_migrations(MIGRATIONS)
        .map_err(|e| format!("migrations: {e}"))?;
    let config = Config::builder()
        .table_prefix("diesel_service_")
        .defaults(|e| e.adaptive_polling(Duration::from_millis(20), Duration::from_secs(1), 1.5))
        .event("order-placed", |e| e.destination(EXCHANGE))
        .build()?;
    let store = Arc::new(PgStore::connect(&db, &config)?);
    store.migrate()?;
    let outbox = Outbox::new(&config)?;

    // a queue of this run's own, bound to the exchange
    let queue = format!("diesel-service-{}", EventId::new());
    {
        use amiquip::{
            Connection, ExchangeDeclareOptions, ExchangeType, FieldTable, QueueDeclareOptions,
        };
        let mut c = Connection::insecure_open(&rabbit)?;
        let ch = c.open_channel(None)?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(ExchangeType::Direct, EXCHANGE, durable)?;
        let q = QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        };
        ch.queue_declare(queue.clone(), q)?;
        ch.queue_bind(queue.clone(), EXCHANGE, "order-placed", FieldTable::new())?;
        c.close()?;
    }
    let relay = Relay::start(store, &config, RabbitSender::builder(&rabbit).build()?)?;
    let received: Arc<Mutex<HashSet<EventId>>> = Arc::default();
    let refused_arrived = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = StopSignal::new();
    let consumer = {
        let (received, stop) = (received.clone(), stop.clone());
        let refused_arrived = refused_arrived.clone();
        let consumer = RabbitConsumer::builder(&rabbit, &queue).build();
        std::thread::spawn(move || {
            consumer.run(&stop, |e| {
                let order: Order = serde_json::from_slice(&e.payload).map_err(|e| e.to_string())?;
                println!(
                    "diesel_service: received order {} of {}",
                    order.id, order.customer
                );
                if order.total_cents <= 0 {
                    refused_arrived.store(true, std::sync::atomic::Ordering::Relaxed);
                }
                if let Some(id) = e.id {
                    received
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(id);
                }
                Ok::<_, String>(())
            })
        })
    };

    // the service: five orders, the last one refused (no total)
    let mut placed = HashSet::new();
    for (customer, total) in [
        ("ada", 1200),
        ("bob", 800),
        ("cy", 450),
        ("dee", 3100),
        ("eve", 0),
    ] {
        match place_order(&mut conn, &outbox, customer, total) {
            Ok((order, event)) => {
                println!("diesel_service: placed order {} of {customer}", order.id);
                placed.insert(event);
            }
            Err(e) => println!("diesel_service: refused, rolled back with its event: {e}"),
        }
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    let got = || received.lock().unwrap_or_else(|p| p.into_inner()).clone();
    while got().len() < placed.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // a little longer: a refused order's event would arrive now
    std::thread::sleep(Duration::from_millis(300));
    stop.stop();
    consumer.join().map_err(|_| "consumer panicked")??;
    relay.shutdown(Duration::from_secs(10))?;
    let got = got();
    let lost = placed.difference(&got).count();
    let refused = refused_arrived.load(std::sync::atomic::Ordering::Relaxed);
    println!(
        "diesel_service: placed={} received={} lost={lost} refused_order_arrived={refused}",
        placed.len(),
        placed.intersection(&got).count()
    );
    Ok(lost == 0 && !refused)
}
