//! A small blocking order service on a real broker: it writes orders and publishes
//! `order-created` through the outbox; a relay delivers them; a consumer in the same
//! program reads them back.
//!
//! ```text
//! cargo run --features kafka,rabbitmq --example order_service -- kafka
//! cargo run --features kafka,rabbitmq --example order_service -- rabbitmq
//! ```
//! Needs PostgreSQL (`TXBOX_DATABASE_URL`), and Kafka (`TXBOX_KAFKA_BROKERS`, default
//! 127.0.0.1:9092) or RabbitMQ (`TXBOX_RABBITMQ_URL`, default amqp://guest:guest@127.0.0.1:5672).
//! The last line is `order_service: published=N received=N lost=0`; the exit code
//! is non-zero if anything was lost.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use txbox::{Config, EventId, NewEvent, Outbox, PgStore, ReceivedEvent, Relay, StopSignal};

const DESTINATION: &str = "txbox-orders";

#[derive(Serialize, Deserialize)]
struct OrderCreated {
    order_id: i64,
    customer: String,
    total_cents: i64,
}

type Received = Arc<Mutex<HashSet<EventId>>>;

fn env(name: &str, default: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| default.to_string())
}

fn main() -> ExitCode {
    let _ = env_logger::builder()
        .filter_level(log::LevelFilter::Warn)
        .parse_default_env()
        .try_init();
    let broker = std::env::args().nth(1).unwrap_or_default();
    if broker != "kafka" && broker != "rabbitmq" {
        eprintln!("usage: order_service kafka|rabbitmq");
        return ExitCode::from(2);
    }
    match run(&broker) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("order_service: error: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Starts the relay's sender and the consumer for the chosen broker.
fn start(
    broker: &str,
    store: Arc<PgStore>,
    config: &Config,
    received: Received,
    stop: &StopSignal,
) -> Result<(Relay, JoinHandle<()>), Box<dyn std::error::Error>> {
    let record = move |e: &ReceivedEvent| -> Result<(), txbox::Error> {
        let order: OrderCreated = e.json()?; // a real handler would act on the order
        log::debug!("order {} for {} received", order.order_id, order.customer);
        received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(e.event_id()?);
        Ok(())
    };
    let s = stop.clone();
    if broker == "kafka" {
        use txbox::kafka::{ensure_topic, KafkaConsumer, KafkaSender};
        let brokers = env("TXBOX_KAFKA_BROKERS", "127.0.0.1:9092");
        ensure_topic(&brokers, DESTINATION, 3)?;
        let relay = Relay::start(store, config, KafkaSender::builder(&brokers).build()?)?;
        let consumer =
            KafkaConsumer::builder(&brokers, &format!("order-service-{}", EventId::new()))
                .build()?;
        consumer.assign(
            DESTINATION,
            &consumer.partitions(DESTINATION, Duration::from_secs(10))?,
        )?;
        let h = std::thread::spawn(move || {
            if let Err(e) = consumer.run(&s, record) {
                eprintln!("order_service: consumer: {e}");
            }
        });
        Ok((relay, h))
    } else {
        use amiquip::{
            Connection, ExchangeDeclareOptions, ExchangeType, FieldTable, QueueDeclareOptions,
        };
        use txbox::rabbitmq::{RabbitConsumer, RabbitSender};
        let url = env("TXBOX_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672");
        let queue = format!("order-service-{}", EventId::new());
        let mut conn = Connection::insecure_open(&url)?;
        let ch = conn.open_channel(None)?;
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(ExchangeType::Direct, DESTINATION, durable)?;
        // auto-deleted once the consumer leaves
        let q = QueueDeclareOptions {
            auto_delete: true,
            ..Default::default()
        };
        ch.queue_declare(queue.clone(), q)?;
        ch.queue_bind(
            queue.clone(),
            DESTINATION,
            "order.created",
            FieldTable::new(),
        )?;
        conn.close()?;
        let relay = Relay::start(
            store,
            config,
            RabbitSender::builder(&url)
                .routing_key("order-created", "order.created")
                .build()?,
        )?;
        let consumer = RabbitConsumer::builder(&url, &queue).build();
        let h = std::thread::spawn(move || {
            if let Err(e) = consumer.run(&s, record) {
                eprintln!("order_service: consumer: {e}");
            }
        });
        Ok((relay, h))
    }
}

fn run(broker: &str) -> Result<bool, Box<dyn std::error::Error>> {
    let url = env(
        "TXBOX_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    let config = Config::builder()
        .table_prefix("order_service_")
        .defaults(|e| e.adaptive_polling(Duration::from_millis(20), Duration::from_secs(1), 1.5))
        .event("order-created", |e| e.destination(DESTINATION))
        .dlq(|d| d.enabled(true))
        .build()?;
    let store = Arc::new(PgStore::connect(&url, &config)?);
    store.migrate()?;
    let outbox = Outbox::new(&config)?;
    let mut db = postgres::Client::connect(&url, postgres::NoTls)?;
    db.batch_execute(
        "CREATE TABLE IF NOT EXISTS order_service_orders (
             id bigserial PRIMARY KEY, customer text NOT NULL, total_cents bigint NOT NULL)",
    )?;

    let received: Received = Default::default();
    let stop = StopSignal::new();
    let (relay, consumer) = start(broker, store, &config, received.clone(), &stop)?;

    // The service: each order and its event in one transaction; every 10th is rolled back.
    // It keeps its connection, so the outbox's INSERT is prepared on it once.
    let publisher = outbox.prepare_pg(&mut db)?;
    let mut published = HashSet::new();
    for i in 0..100i64 {
        let mut tx = db.transaction()?;
        let customer = format!("customer-{}", i % 9);
        let total_cents = 500 + i * 13;
        let order_id: i64 = tx
            .query_one(
                "INSERT INTO order_service_orders (customer, total_cents) VALUES ($1, $2) RETURNING id",
                &[&customer, &total_cents],
            )?
            .get(0);
        let event = NewEvent::new(
            "order-created",
            &OrderCreated {
                order_id,
                customer: customer.clone(),
                total_cents,
            },
        )?
        .key(customer)
        .header("source", "order_service");
        let id = outbox.publish_all(&mut publisher.on(&mut tx), [event])?[0];
        if i % 10 == 9 {
            tx.rollback()?;
        } else {
            tx.commit()?;
            published.insert(id);
        }
    }
    relay.wake("order-created");

    let deadline = Instant::now() + Duration::from_secs(60);
    let got = || {
        received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .intersection(&published)
            .count()
    };
    while got() < published.len() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    // long enough for the batches in flight to get their acks
    let deadline = relay.ack_wait().unwrap_or_default() + Duration::from_secs(5);
    relay.shutdown(deadline)?;
    stop.stop();
    let _ = consumer.join();
    let got = got();
    let lost = published.len() - got;
    println!(
        "order_service: published={} received={got} lost={lost}",
        published.len()
    );
    Ok(lost == 0)
}
