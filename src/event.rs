//! Events: ids, the event row the relay hands to a sender, and the builder for new events.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::error::{Error, Result};
pub(crate) use crate::id::EventId;

/// Header that carries the event id on every message txbox sends (Kafka record
/// header, AMQP header and `message_id`). The inbox deduplicates on it.
pub const HEADER_EVENT_ID: &str = "txbox-event-id";
/// Header that carries the event type on every message txbox sends.
pub const HEADER_EVENT_TYPE: &str = "txbox-event-type";
/// Header that carries the event key on RabbitMQ messages (Kafka uses the record key).
pub const HEADER_EVENT_KEY: &str = "txbox-event-key";
/// Prefix reserved for txbox's own headers; user headers may not start with it.
pub const RESERVED_HEADER_PREFIX: &str = "txbox-";

/// An event as the relay hands it to a [`Sender`](crate::Sender).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// The event id (UUIDv7). Senders put it in the [`HEADER_EVENT_ID`] header.
    pub id: EventId,
    /// The event type, as published.
    pub event_type: String,
    /// Where it goes: the topic (Kafka) or exchange (RabbitMQ) configured for its type;
    /// the event type itself when none is configured.
    pub destination: String,
    /// The RabbitMQ routing key configured for its type; the event type when none is.
    pub routing_key: String,
    /// The optional key (Kafka record key).
    pub key: Option<String>,
    /// The user's headers.
    pub headers: BTreeMap<String, String>,
    /// The payload: the JSON the publisher serialized, byte for byte.
    pub payload: String,
    /// Failed send attempts before this one.
    pub attempts: u32,
}

/// A new event to publish: the builder form of [`Outbox::publish`](crate::Outbox::publish),
/// for a key and headers.
///
/// ```
/// # fn main() -> txbox::Result<()> {
/// let event = txbox::NewEvent::new("order-created", &serde_json::json!({"order": 7}))?
///     .key("order-7")
///     .header("trace-id", "abc");
/// assert_eq!(event.event_type(), "order-created");
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct NewEvent {
    pub(crate) id: EventId,
    pub(crate) event_type: String,
    pub(crate) key: Option<String>,
    pub(crate) headers: BTreeMap<String, String>,
    pub(crate) payload: String,
}

impl NewEvent {
    /// Serializes `payload` to JSON; the id is assigned now (UUIDv7).
    pub fn new<T: Serialize + ?Sized>(event_type: &str, payload: &T) -> Result<Self> {
        let payload = serde_json::to_string(payload).map_err(|source| Error::Serialize {
            event_type: event_type.to_owned(),
            source,
        })?;
        Ok(Self::from_json(event_type, payload))
    }

    /// One event of `event_type` per payload, in order, for
    /// [`Outbox::publish_all`](crate::Outbox::publish_all) (one statement).
    ///
    /// ```
    /// let events = txbox::NewEvent::batch("order-created", [1, 2, 3])?;
    /// assert_eq!(events.len(), 3);
    /// assert_eq!(events[2].event_type(), "order-created");
    /// # Ok::<(), txbox::Error>(())
    /// ```
    pub fn batch<T, I>(event_type: &str, payloads: I) -> Result<Vec<Self>>
    where
        T: Serialize,
        I: IntoIterator<Item = T>,
    {
        payloads
            .into_iter()
            .map(|p| Self::new(event_type, &p))
            .collect()
    }

    /// An event whose payload is already serialized JSON text.
    pub fn from_json(event_type: &str, payload: impl Into<String>) -> Self {
        NewEvent {
            id: EventId::new(),
            event_type: event_type.to_owned(),
            key: None,
            headers: BTreeMap::new(),
            payload: payload.into(),
        }
    }

    /// Sets the key (the Kafka record key; ordering within a partition follows it).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a header. Names starting with `txbox-` are reserved and refused at publish.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.insert(name.into(), value.into());
        self
    }

    /// The id this event will have.
    pub fn id(&self) -> EventId {
        self.id
    }

    /// The event type.
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The serialized payload.
    pub fn payload(&self) -> &str {
        &self.payload
    }
}
