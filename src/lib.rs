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
//! - Time comes from the database clock.

#![warn(missing_docs)]

#[cfg(feature = "admin-http")]
pub mod admin;
pub mod config;
pub mod consumer;
pub mod dlq;
mod error;
pub mod event;
mod id;
pub mod inbox;
#[cfg(feature = "kafka")]
pub mod kafka;
pub mod metrics;
mod outbox;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
mod redact;
pub mod relay;
pub mod sender;
pub mod store;
mod tables;
mod transaction;

pub use config::{ClaimMode, Config, ConfigBuilder, EventSettings};
pub use consumer::{Position, ReceivedEvent, StopSignal, Verdict};
pub use dlq::{DeadLetter, Dlq, DlqFilter, DlqStatus};
pub use error::{DatabaseErrorKind, Error, Result};
pub use event::{Event, EventId, NewEvent, HEADER_EVENT_ID, HEADER_EVENT_TYPE};
pub use outbox::Outbox;
pub use relay::{Relay, RelayProbe};
pub use sender::{MemorySender, SendError, SendErrorKind, Sender, SenderFactory, Started};
#[cfg(feature = "mysql")]
pub use store::mysql::MySqlStore;
#[cfg(feature = "oracle")]
pub use store::oracle::OracleStore;
#[cfg(feature = "postgres")]
pub use store::postgres::{PgPrepared, PgPreparedTx, PgStore};
#[cfg(feature = "sqlite")]
pub use store::sqlite::SqliteStore;
pub use store::{ClaimArgs, HeldBatch, Outcome, Store, Tables, TypeStatus};
pub use transaction::Transaction;
