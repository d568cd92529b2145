//! The pattern for a synchronous web service: an HTTP handler writes its business
//! row and the event in one database transaction, and a relay in the same
//! process sends the events to the broker.
//!
//! - `POST /orders` with `{"item": "book", "quantity": 2}` inserts the order and
//!   publishes `order-placed` in the same transaction, then answers `201` with the
//!   order id and the event id. Either both are stored or neither is.
//! - `GET /orders/{id}` shows the order (and its event id).
//! - The relay (its own threads, started beside the server) sends `order-placed`
//!   to RabbitMQ (exchange `web-orders`, queue `web-orders`) or to Kafka (topic
//!   `web-orders`), waits for the broker's ack, then marks the row sent.
//!
//! ```text
//! cargo run --all-features --example web_service -- rabbitmq          # serves on 127.0.0.1:8080
//! cargo run --all-features --example web_service -- kafka 127.0.0.1:9000
//! curl -si -XPOST localhost:8080/orders -d '{"item":"book","quantity":2}'
//! cargo run --all-features --example web_service -- rabbitmq --once   # one order through, then exit
//! ```
//! Needs PostgreSQL (`TXBOX_DATABASE_URL`, default
//! postgres://postgres@127.0.0.1:5432/test), and RabbitMQ (`TXBOX_RABBITMQ_URL`)
//! or Kafka (`TXBOX_KAFKA_BROKERS`). `tests/suite/web_service.rs` drives it over HTTP
//! and reads the events back from both brokers.

use std::sync::Arc;
use std::time::Duration;

use r2d2_postgres::PostgresConnectionManager;
use serde::Deserialize;
use serde_json::json;
use txbox::{Config, Outbox, PgStore, Relay, SenderFactory};

/// The exchange, queue and topic the example sends to.
pub const DESTINATION: &str = "web-orders";
/// The event type (and RabbitMQ routing key).
pub const EVENT: &str = "order-placed";

type Pool = r2d2::Pool<PostgresConnectionManager<postgres::NoTls>>;
type Failure = Box<dyn std::error::Error + Send + Sync>;

/// Where the relay sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    RabbitMq,
    Kafka,
}

fn env(name: &str, default: &str) -> String {
    std::env::var(name)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_string())
}

/// The RabbitMQ URL the example uses.
pub fn rabbit_url() -> String {
    env("TXBOX_RABBITMQ_URL", "amqp://guest:guest@127.0.0.1:5672")
}

/// The Kafka bootstrap servers the example uses.
pub fn kafka_brokers() -> String {
    env("TXBOX_KAFKA_BROKERS", "127.0.0.1:9092")
}

/// The running service: the HTTP server's address, and what to stop.
pub struct Service {
    pub addr: std::net::SocketAddr,
    server: Arc<tiny_http::Server>,
    workers: Vec<std::thread::JoinHandle<()>>,
    relay: Relay,
}

impl Service {
    /// Stops taking requests, lets the relay finish its batches and joins
    /// every thread.
    pub fn stop(self) -> Result<(), Failure> {
        self.server.unblock();
        for _ in 1..self.workers.len() {
            self.server.unblock();
        }
        for w in self.workers {
            let _ = w.join();
        }
        // long enough for the batches in flight to get their acks
        let deadline = self.relay.ack_wait().unwrap_or_default() + Duration::from_secs(5);
        self.relay.shutdown(deadline)?;
        Ok(())
    }
}

/// The broker's side made ready (the queue bound to the exchange, the topic),
/// and the relay's sender for it.
fn sender(broker: Broker) -> Result<Arc<dyn SenderFactory>, Failure> {
    Ok(match broker {
        Broker::RabbitMq => {
            use amiquip::{ExchangeDeclareOptions, ExchangeType, FieldTable, QueueDeclareOptions};
            // amiquip's connection errors quote the URL, password included
            let mut conn = amiquip::Connection::insecure_open(&rabbit_url())
                .map_err(|e| e.to_string().replace(&rabbit_url(), "TXBOX_RABBITMQ_URL"))?;
            let ch = conn.open_channel(None)?;
            let durable = || ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.exchange_declare(ExchangeType::Direct, DESTINATION, durable())?;
            let queue = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            ch.queue_declare(DESTINATION, queue)?;
            ch.queue_bind(DESTINATION, DESTINATION, EVENT, FieldTable::new())?;
            conn.close()?;
            Arc::new(txbox::rabbitmq::RabbitSender::builder(&rabbit_url()).build()?)
        }
        Broker::Kafka => {
            txbox::kafka::ensure_topic(&kafka_brokers(), DESTINATION, 1)?;
            Arc::new(txbox::kafka::KafkaSender::builder(&kafka_brokers()).build()?)
        }
    })
}

/// Starts the service on `addr` (`127.0.0.1:0`: any free port): the schema, the
/// relay and four HTTP worker threads.
pub fn start(database_url: &str, broker: Broker, addr: &str) -> Result<Service, Failure> {
    let config = Config::builder()
        .table_prefix("web_")
        .event(EVENT, |e| e.destination(DESTINATION))
        .build()?;
    let store = Arc::new(PgStore::connect(database_url, &config)?);
    store.migrate()?;
    let pool: Pool = r2d2::Pool::builder()
        .max_size(8)
        .build(PostgresConnectionManager::new(
            database_url.parse()?,
            postgres::NoTls,
        ))?;
    pool.get()?.batch_execute(
        "CREATE TABLE IF NOT EXISTS web_orders (
            id bigserial PRIMARY KEY,
            item text NOT NULL,
            quantity integer NOT NULL,
            event_id uuid NULL -- the id of the order's event, set in its transaction
        )",
    )?;
    let factory = sender(broker)?;
    let relay = Relay::start(store, &config, move || factory.create())?;
    let outbox = Arc::new(Outbox::new(&config)?);
    let server =
        Arc::new(tiny_http::Server::http(addr).map_err(|e| format!("listen on {addr}: {e}"))?);
    let addr = server
        .server_addr()
        .to_ip()
        .ok_or("the server has no IP address")?;
    let workers = (0..4)
        .map(|i| {
            let (server, pool, outbox) = (server.clone(), pool.clone(), outbox.clone());
            std::thread::Builder::new()
                .name(format!("web-{i}"))
                .spawn(move || {
                    // `recv` fails once the server is unblocked: the worker ends
                    while let Ok(request) = server.recv() {
                        handle(request, &pool, &outbox);
                    }
                })
        })
        .collect::<Result<_, _>>()?;
    Ok(Service {
        addr,
        server,
        workers,
        relay,
    })
}

/// `POST /orders`'s body.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct NewOrder {
    item: String,
    quantity: i32,
}

/// An answer: status and JSON body.
type Answer = (u16, serde_json::Value);

fn handle(mut request: tiny_http::Request, pool: &Pool, outbox: &Outbox) {
    let (code, body) = answer(&mut request, pool, outbox).unwrap_or_else(|e| {
        // the database or the outbox failed: nothing was committed
        log::error!("web_service: {} {}: {e}", request.method(), request.url());
        (500, json!({"error": "internal error"}))
    });
    let header =
        tiny_http::Header::from_bytes("Content-Type", "application/json").expect("a valid header");
    let response = tiny_http::Response::from_string(body.to_string())
        .with_status_code(code)
        .with_header(header);
    if let Err(e) = request.respond(response) {
        log::warn!("web_service: the client went away: {e}");
    }
}

fn answer(
    request: &mut tiny_http::Request,
    pool: &Pool,
    outbox: &Outbox,
) -> Result<Answer, Failure> {
    let url = request.url().to_string();
    let segments: Vec<&str> = url.trim_matches('/').split('/').collect();
    Ok(match (request.method(), segments.as_slice()) {
        (tiny_http::Method::Post, ["orders"]) => {
            let mut body = Vec::new();
            let mut limited = std::io::Read::take(request.as_reader(), 64 * 1024);
            std::io::Read::read_to_end(&mut limited, &mut body)?;
            let order: NewOrder = match serde_json::from_slice(&body) {
                Ok(o) => o,
                Err(e) => return Ok((400, json!({"error": format!("bad order: {e}")}))),
            };
            if order.item.is_empty() || order.quantity < 1 {
                return Ok((
                    400,
                    json!({"error": "an order needs an item and a quantity >= 1"}),
                ));
            }
            place(pool, outbox, &order)?
        }
        (tiny_http::Method::Get, ["orders", id]) => match id.parse::<i64>() {
            Ok(id) => show(pool, id)?,
            Err(_) => (404, json!({"error": format!("no order {id:?}")})),
        },
        _ => (
            404,
            json!({"error": format!("no route {} {url}", request.method())}),
        ),
    })
}

/// The order row and its event, in one transaction.
fn place(pool: &Pool, outbox: &Outbox, order: &NewOrder) -> Result<Answer, Failure> {
    let mut client = pool.get()?;
    let mut tx = client.transaction()?;
    let id: i64 = tx
        .query_one(
            "INSERT INTO web_orders (item, quantity) VALUES ($1, $2) RETURNING id",
            &[&order.item, &order.quantity],
        )?
        .get(0);
    let event_id = outbox.publish(
        &mut tx,
        EVENT,
        &json!({"order_id": id, "item": order.item, "quantity": order.quantity}),
    )?;
    tx.execute(
        "UPDATE web_orders SET event_id = $1 WHERE id = $2",
        &[&event_id.as_uuid(), &id],
    )?;
    tx.commit()?;
    Ok((201, json!({"id": id, "event_id": event_id.to_string()})))
}

fn show(pool: &Pool, id: i64) -> Result<Answer, Failure> {
    let mut client = pool.get()?;
    let row = client.query_opt(
        "SELECT item, quantity, event_id FROM web_orders WHERE id = $1",
        &[&id],
    )?;
    Ok(match row {
        Some(r) => {
            let (item, quantity, event_id): (String, i32, uuid::Uuid) =
                (r.get(0), r.get(1), r.get(2));
            (
                200,
                json!({"id": id, "item": item, "quantity": quantity, "event_id": event_id.to_string()}),
            )
        }
        None => (404, json!({"error": format!("no order {id}")})),
    })
}

#[allow(dead_code)] // `tests/suite/web_service.rs` includes this file for `start`
fn main() -> std::process::ExitCode {
    let _ = env_logger::builder()
        .filter_level(log::LevelFilter::Warn)
        .parse_default_env()
        .try_init();
    let args: Vec<String> = std::env::args().skip(1).collect();
    let broker = match args.first().map(String::as_str) {
        Some("rabbitmq") => Broker::RabbitMq,
        Some("kafka") => Broker::Kafka,
        _ => {
            eprintln!("usage: web_service rabbitmq|kafka [ADDR] [--once]");
            return std::process::ExitCode::from(2);
        }
    };
    let once = args.iter().any(|a| a == "--once");
    let addr = args
        .iter()
        .skip(1)
        .find(|a| !a.starts_with("--"))
        .cloned()
        .unwrap_or_else(|| {
            if once {
                "127.0.0.1:0"
            } else {
                "127.0.0.1:8080"
            }
            .into()
        });
    let database_url = env(
        "TXBOX_DATABASE_URL",
        "postgres://postgres@127.0.0.1:5432/test",
    );
    match run(&database_url, broker, &addr, once) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("web_service: error: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}

#[allow(dead_code)]
fn run(database_url: &str, broker: Broker, addr: &str, once: bool) -> Result<(), Failure> {
    let service = start(database_url, broker, addr)?;
    println!(
        "web_service: serving on http://{} (relay to {broker:?})",
        service.addr
    );
    if !once {
        // until the process is stopped (Ctrl-C)
        loop {
            std::thread::park();
        }
    }
    // --once: one order through the service, over HTTP, as a client would
    let base = format!("http://{}", service.addr);
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let placed: serde_json::Value = agent
        .post(format!("{base}/orders"))
        .send(r#"{"item": "book", "quantity": 2}"#)?
        .into_body()
        .read_json()?;
    println!("web_service: POST /orders -> {placed}");
    let id = placed["id"].as_i64().ok_or("no order id in the answer")?;
    let shown: serde_json::Value = agent
        .get(format!("{base}/orders/{id}"))
        .call()?
        .into_body()
        .read_json()?;
    println!("web_service: GET /orders/{id} -> {shown}");
    if shown["event_id"] != placed["event_id"] {
        return Err("the order does not show its event".into());
    }
    // the relay sends within milliseconds: wait for the row to be PROCESSED
    let mut client = postgres::Client::connect(database_url, postgres::NoTls)?;
    let event_id: uuid::Uuid = placed["event_id"].as_str().ok_or("no event id")?.parse()?;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let status: String = client
            .query_one(
                "SELECT status FROM web_outbox_events WHERE id = $1",
                &[&event_id],
            )?
            .get(0);
        if status == "PROCESSED" {
            println!("web_service: event {event_id} acked by {broker:?}");
            break;
        }
        if std::time::Instant::now() > deadline {
            return Err(format!("event {event_id} still {status} after 30 s").into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    service.stop()
}
