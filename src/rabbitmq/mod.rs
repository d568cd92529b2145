//! RabbitMQ (feature `rabbitmq`): a [`RabbitSender`] for the relay and a
//! [`RabbitConsumer`] loop, on `amiquip`.
//!
//! ## Message contract
//! - exchange: the event type's `destination`; routing key: its `routing_key`
//!   (default: the event type);
//! - body: the JSON payload; `content_type` `application/json`; `type` the event type;
//! - `message_id` and the header `txbox-event-id`: the event id; header
//!   `txbox-event-type`: the event type; `txbox-event-key`: the event's key, when
//!   it has one; then the user's headers (string values);
//! - persistent (`delivery_mode` 2) and `mandatory`: a message no queue takes comes
//!   back as a failure and is never counted as sent.
//!
//! Each relay thread gets its own connection and channel with publisher confirms; a
//! batch waits for the broker's ack of every message, while the relay publishes its
//! next batch on the same channel ([`Sender::start`](crate::Sender::start)). A dropped connection fails
//! the unconfirmed messages of every batch in flight and is opened again on a later
//! batch, with backoff.
//!
//! The sender is in `sender.rs`, the consumer loop in `consumer.rs`; each item
//! has one path: `txbox::rabbitmq::...`.

use std::time::Duration;

mod consumer;
mod sender;

pub use consumer::{OnError, RabbitConsumer, RabbitConsumerBuilder};
pub use sender::{RabbitSender, RabbitSenderBuilder};

/// Shortest and longest wait before a lost connection is opened again.
pub(crate) const MIN_RECONNECT: Duration = Duration::from_millis(100);
pub(crate) const MAX_RECONNECT: Duration = Duration::from_secs(10);
