//! # txbox
//!
//! The transactional outbox and inbox for blocking Rust code, on PostgreSQL, MySQL /
//! MariaDB, SQLite and Oracle, with Kafka and RabbitMQ.
//!
//! A service writes its business rows and an event in **one database transaction**
//! with [`Outbox::publish`]. A [`Relay`] — a fixed pool of `std::thread`s — later
//! claims the event with `FOR UPDATE SKIP LOCKED`, hands it to a [`Sender`] (Kafka,
//! RabbitMQ, or the in-memory [`MemorySender`]), waits for the broker's ack and only
//! then marks the row PROCESSED. Delivery is at-least-once: no committed event is
//! lost, a rolled-back one is never sent.
//!
//! Payloads are JSON by default (serde); [`Outbox::publish_bytes`] publishes raw
//! bytes (protobuf, Avro) with a content type, delivered unchanged.
//!
//! ## Example
//!
//! ```no_run
//! use std::time::Duration;
//! use txbox::{Config, MemorySender, Outbox, Relay};
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     let url = "postgres://postgres@127.0.0.1:5432/test";
//!     // 1. Configuration: defaults plus one entry per event type.
//!     let config = Config::builder()
//!         .defaults(|e| e.batch_size(100))
//!         .event("order-created", |e| e.destination("orders"))
//!         .build()?;
//!
//!     // 2. The store on the configuration's tables, and its schema (idempotent).
//!     let store = config.connect(url)?;
//!     store.migrate()?;
//!
//!     // 3. Publish inside the business transaction.
//!     let outbox = Outbox::new(&config)?;
//!     let mut client = postgres::Client::connect(url, postgres::NoTls)?;
//!     client.batch_execute("CREATE TABLE IF NOT EXISTS orders (id bigint PRIMARY KEY)")?;
//!     let mut tx = client.transaction()?;
//!     tx.execute("INSERT INTO orders (id) VALUES (42) ON CONFLICT DO NOTHING", &[])?;
//!     let id = outbox.publish(&mut tx, "order-created", &serde_json::json!({"id": 42}))?;
//!     tx.commit()?;
//!
//!     // 4. Relay: here into memory; Kafka and RabbitMQ senders plug in the same way.
//!     let sender = MemorySender::new();
//!     let relay = Relay::start(store, &config, sender.clone())?;
//!     relay.wake("order-created");
//!     sender.wait_for(1, Duration::from_secs(10));
//!     assert!(sender.sent().iter().any(|e| e.id == id));
//!     relay.shutdown(Duration::from_secs(5))?;
//!     Ok(())
//! }
//! ```
//!
//! ## A tour, in the order an event travels
//!
//! 1. **Configure**: [`Config::builder`] or [`Config::from_toml`]; each event type
//!    starts from the defaults ([`EventSettings`]).
//! 2. **Open the store** on the configuration's tables: [`Config::connect`], or
//!    one dialect's [`SqlStore`] ([`PgStore`], [`MySqlStore`], [`SqliteStore`],
//!    [`OracleStore`]); [`Store::migrate`] creates the schema.
//! 3. **Publish** in your transaction: [`Outbox::publish`] and
//!    [`Outbox::publish_all`] on any [`Transaction`] (a driver's transaction, or
//!    a [`PgPrepared`] statement wrapping one).
//! 4. **Relay**: [`Relay::start`] with a [`SenderFactory`]:
//!    [`kafka::KafkaSender`], [`rabbitmq::RabbitSender`], or a
//!    [`MemorySender`] in tests; in a blocking test or a batch job,
//!    [`Relay::deliver_pending`] does the relay's work once on your thread. An
//!    event type with [`EventOrder::Key`] sends one key's events one at a time,
//!    in order, on every relay instance.
//! 5. **Consume** on the other side: [`kafka::KafkaConsumer`] or
//!    [`rabbitmq::RabbitConsumer`] hand you [`ReceivedEvent`]s; the [`Inbox`]
//!    runs the handler once per event id: in your transaction with
//!    [`Inbox::handle_in`] (the id and the handler's writes commit together), or
//!    at most once with [`Inbox::handle_at_most_once`] (below).
//! 6. **Dead letters**: events that used up their retries, listed and retried
//!    through [`Dlq`].
//! 7. **Operate**: [`metrics`], the HTTP [`admin`] endpoint, the `txbox` CLI.
//!
//! ```no_run
//! # #[cfg(not(all(feature = "kafka", feature = "postgres")))]
//! # fn main() {}
//! # #[cfg(all(feature = "kafka", feature = "postgres"))]
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use txbox::{Config, Dlq, DlqFilter, Inbox, StopSignal};
//!
//! let config = Config::builder().event("order-created", |e| e).build()?;
//! let store = config.connect("postgres://postgres@127.0.0.1:5432/test")?;
//! // 4. the relay into Kafka
//! let kafka = txbox::kafka::KafkaSender::builder("127.0.0.1:9092").build()?;
//! let relay = txbox::Relay::start(store.clone(), &config, kafka)?;
//! // 5. an idempotent consumer: the handler runs once per event id
//! let inbox = Inbox::new(&config, "billing")?.with_store(store.clone())?;
//! let consumer = txbox::kafka::KafkaConsumer::builder("127.0.0.1:9092", "billing").build()?;
//! consumer.subscribe(&["order-created"])?;
//! let stop = StopSignal::new();
//! # stop.stop();
//! consumer.run(&stop, |event| -> txbox::Result<()> {
//!     let id = event.event_id()?;
//!     inbox.handle_at_most_once(id, || -> txbox::Result<()> {
//!         println!("bill order {}", String::from_utf8_lossy(&event.payload));
//!         Ok(())
//!     })?;
//!     Ok(())
//! })?;
//! // 6. the dead letters
//! for dead in Dlq::new(store.clone()).list(&DlqFilter::default())? {
//!     println!("{} failed: {:?}", dead.id, dead.last_error);
//! }
//! // 7. what the relay did
//! println!("{}", txbox::metrics::prometheus());
//! relay.shutdown(std::time::Duration::from_secs(5))?;
//! # Ok(()) }
//! ```
//!
//! ## Guarantees
//!
//! - `publish` joins the caller's transaction ([`Transaction`]); it never
//!   begins, commits or rolls back.
//! - Event ids are UUIDv7 and travel in the [`HEADER_EVENT_ID`] header.
//! - A row is marked PROCESSED (or, with `processed_ttl` zero, deleted) only after the
//!   sender reported the broker's ack. Every error path leaves it PENDING, IN_PROCESS
//!   (recovered after its lease) or FAILED (moved to the dead letters).
//! - Finishing a batch checks its claim token: a relay whose lease expired cannot
//!   overwrite what another relay did since. With held claims ([`ClaimMode::Lock`],
//!   PostgreSQL) the rows stay locked in the claim's open transaction instead, and
//!   the database ends a session that idles in it past the lease.
//! - With [`EventOrder::Key`], an event is claimed only when no earlier event
//!   of its key is waiting, in process, retrying or (with [`OnPoison::Block`])
//!   dead: a consumer never sees a key's earlier event after a later one.
//! - Time comes from the database clock.

#![warn(missing_docs)]

// Each item has one public path: the crate root, or the module of its feature
// (`kafka`, `rabbitmq`, `admin`) and `metrics`.
#[cfg(feature = "admin-http")]
pub mod admin;
mod backoff;
mod config;
mod consumer;
#[cfg(all(
    feature = "diesel",
    any(feature = "postgres", feature = "mysql", feature = "sqlite")
))]
pub mod diesel;
mod dlq;
mod error;
mod event;
mod id;
mod inbox;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod metrics;
mod outbox;
mod pause;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
mod redact;
mod relay;
pub mod sender;
mod status;
pub mod store;
mod tables;
#[cfg(any(feature = "postgres", feature = "rabbitmq", feature = "redis"))]
mod tls;
#[cfg(feature = "trace-context")]
pub mod trace;
mod transaction;

pub use config::{
    Backoff, ClaimMode, Config, ConfigBuilder, DlqSettings, EventOrder, EventSettings,
    InboxSettings, MaintenanceSettings, OnPoison, Polling, PollingStrategy, Wake,
};
pub use consumer::{Position, ReceivedEvent, StopSignal, Verdict};
pub use dlq::Dlq;
pub use error::{Cause, DatabaseErrorKind, Error, Result};
pub use event::{
    Event, NewEvent, HEADER_CONTENT_TYPE, HEADER_EVENT_ID, HEADER_EVENT_KEY, HEADER_EVENT_TYPE,
    JSON_CONTENT_TYPE, MAX_DELAY, MAX_HEADER_BYTES, RESERVED_HEADER_PREFIX,
};
pub use id::{EventId, ParseEventIdError};
pub use inbox::{
    Handled, Inbox, InboxCache, InboxCleanup, InboxStats, MemoryCache, MissingIdPolicy,
};
#[cfg(feature = "redis")]
pub use inbox::{RedisCache, RedisCacheBuilder};
pub use outbox::Outbox;
#[cfg(feature = "postgres")]
pub use outbox::{PgPrepared, PgPreparedTx};
pub use pause::Pauses;
pub use relay::{Delivery, Relay, RelayProbe, RelayWaker, TypeDelivery};
pub use sender::{MemorySender, SendError, Sender, SenderFactory};
#[cfg(feature = "mysql")]
pub use store::MySqlStore;
#[cfg(feature = "oracle")]
pub use store::OracleStore;
#[cfg(feature = "_sql")]
pub use store::SqlStore;
#[cfg(feature = "sqlite")]
pub use store::SqliteStore;
#[cfg(feature = "postgres")]
pub use store::{pg_config, PgConnector, PgPool, PgStore, PgTls};
pub use store::{
    BlockedKey, Compaction, DeadLetter, DeadLetterStore, DlqFilter, DlqStatus, FullStore,
    InboxStore, MaintenanceStore, PendingMigration, Store, TypeStatus,
};
pub use transaction::Transaction;
