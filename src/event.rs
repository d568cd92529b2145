//! Events: ids, the event row the relay hands to a sender, and the builder for new events.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

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
/// Kafka record header that carries the content type of an event published as
/// bytes ([`NewEvent::bytes`]); RabbitMQ messages carry it in their
/// `content_type` property. A JSON event has no such header on Kafka (its
/// content type is [`JSON_CONTENT_TYPE`]). Reserved: publish refuses a user
/// header of this name (in any case) on every event.
pub const HEADER_CONTENT_TYPE: &str = "content-type";
/// The most bytes an event's headers may have, names and values together and
/// 8 bytes per header (refused at publish): a RabbitMQ message carries them in
/// one content-header frame, which must fit the connection's `frame_max`
/// (131,072 bytes by default), beside txbox's own headers; an AMQP table
/// entry takes 6 bytes besides its name and value.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// What each header counts towards [`MAX_HEADER_BYTES`] besides its name and value.
pub(crate) const HEADER_OVERHEAD: usize = 8;
/// The content type of events published as JSON.
pub const JSON_CONTENT_TYPE: &str = "application/json";

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
    /// The optional key (Kafka record key).
    pub key: Option<String>,
    /// The user's headers.
    pub headers: BTreeMap<String, String>,
    /// The payload, byte for byte: the JSON text the publisher serialized, or
    /// the bytes of an event published as bytes ([`NewEvent::bytes`]).
    pub payload: Vec<u8>,
    /// The content type of an event published as bytes; `None` for JSON
    /// ([`JSON_CONTENT_TYPE`]).
    pub content_type: Option<String>,
    /// Failed send attempts before this one.
    pub attempts: u32,
}

impl Event {
    /// The payload as text, when it is UTF-8 (always for a JSON event).
    ///
    /// ```
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// use std::time::Duration;
    /// use txbox::store::ClaimStore;
    /// use txbox::{Config, Outbox, Store};
    /// # let path = std::env::temp_dir().join(format!("txbox-doc-event-{}.db", std::process::id()));
    /// # let _ = std::fs::remove_file(&path);
    /// let config = Config::builder().event("order-created", |e| e).build()?;
    /// let store = config.connect(&format!("sqlite:{}", path.display()))?;
    /// store.migrate()?;
    /// let outbox = Outbox::new(&config)?;
    /// let mut conn = rusqlite::Connection::open(&path)?;
    /// let mut tx = conn.transaction()?;
    /// outbox.publish(&mut tx, "order-created", &7)?;
    /// outbox.publish_bytes(&mut tx, "order-created", &[0xff, 0x00], "application/x-protobuf")?;
    /// tx.commit()?;
    /// let claimed = store.claim("order-created", 10, Duration::from_secs(60), uuid::Uuid::now_v7())?;
    /// assert_eq!(claimed[0].payload_str(), Some("7"));
    /// assert_eq!(claimed[0].content_type(), "application/json");
    /// assert_eq!(claimed[1].payload, [0xff, 0x00]);
    /// assert_eq!(claimed[1].content_type(), "application/x-protobuf");
    /// # Ok(()) }
    /// ```
    pub fn payload_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }

    /// The content type the brokers are told: the one it was published with,
    /// or [`JSON_CONTENT_TYPE`].
    pub fn content_type(&self) -> &str {
        self.content_type.as_deref().unwrap_or(JSON_CONTENT_TYPE)
    }
}

/// What a new event carries: JSON text (the default path) or bytes with their
/// content type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Body {
    Json(String),
    Bytes {
        bytes: Vec<u8>,
        content_type: String,
    },
}

impl Body {
    pub(crate) fn len(&self) -> usize {
        match self {
            Body::Json(s) => s.len(),
            Body::Bytes { bytes, .. } => bytes.len(),
        }
    }
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
    pub(crate) payload: Body,
    /// Not sent before the database's clock passes its insert time plus this
    /// ([`NewEvent::deliver_after`]); `None`: due at once.
    pub(crate) delay: Option<Duration>,
}

/// The longest [`NewEvent::deliver_after`] takes: a year.
pub const MAX_DELAY: Duration = Duration::from_secs(365 * 24 * 3600);

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
            payload: Body::Json(payload.into()),
            delay: None,
        }
    }

    /// An event whose payload is `bytes` as they are (protobuf, Avro, ...), sent
    /// with `content_type` (the `content-type` header on Kafka, the
    /// `content_type` property on RabbitMQ). They are stored in a binary column
    /// and reach consumers unchanged. The content type must be 1 to 255 printable
    /// ASCII characters; [`Outbox::publish_all`](crate::Outbox::publish_all)
    /// refuses another.
    ///
    /// ```
    /// let event = txbox::NewEvent::bytes("order-created", vec![0x08, 0x96, 0x01], "application/x-protobuf")
    ///     .key("order-7");
    /// assert_eq!(event.payload(), &[0x08, 0x96, 0x01]);
    /// assert_eq!(event.content_type(), Some("application/x-protobuf"));
    /// ```
    pub fn bytes(event_type: &str, bytes: impl Into<Vec<u8>>, content_type: &str) -> Self {
        NewEvent {
            id: EventId::new(),
            event_type: event_type.to_owned(),
            key: None,
            headers: BTreeMap::new(),
            payload: Body::Bytes {
                bytes: bytes.into(),
                content_type: content_type.to_owned(),
            },
            delay: None,
        }
    }

    /// Delivers the event not before `delay` has passed since its insert, by
    /// the database's clock (the row is due at the database's `now()` plus
    /// `delay`, the same clock every relay reads). The relay's poller sleeps
    /// until the earliest due event of its type; a commit notifies the relay
    /// only for events due at once. At most [`MAX_DELAY`] (refused at publish
    /// with [`Error::InvalidEvent`]).
    ///
    /// An ordered type's ([`EventOrder::Key`](crate::EventOrder::Key)) delayed
    /// event holds back the later events of its key until it is sent:
    /// publish order is key order.
    ///
    /// ```
    /// use std::time::Duration;
    /// let reminder = txbox::NewEvent::new("cart-reminder", &serde_json::json!({"cart": 7}))?
    ///     .deliver_after(Duration::from_secs(3600));
    /// assert_eq!(reminder.delay(), Some(Duration::from_secs(3600)));
    /// # Ok::<(), txbox::Error>(())
    /// ```
    pub fn deliver_after(mut self, delay: Duration) -> Self {
        self.delay = (!delay.is_zero()).then_some(delay);
        self
    }

    /// Delivers the event not before `at`, a time of the publisher's clock:
    /// the delay from the publisher's `now` to `at` is taken here, and the
    /// database adds it to its own clock at the insert
    /// ([`NewEvent::deliver_after`]). So a publisher whose clock is off from
    /// the database's still waits the time it meant; a time already past is
    /// due at once.
    ///
    /// ```
    /// use std::time::{Duration, SystemTime};
    /// let at = SystemTime::now() + Duration::from_secs(60);
    /// let e = txbox::NewEvent::new("invoice-due", &1)?.deliver_at(at);
    /// assert!(e.delay().is_some_and(|d| d <= Duration::from_secs(60)));
    /// # Ok::<(), txbox::Error>(())
    /// ```
    pub fn deliver_at(self, at: SystemTime) -> Self {
        let delay = at.duration_since(SystemTime::now()).unwrap_or_default();
        self.deliver_after(delay)
    }

    /// The delay set by [`NewEvent::deliver_after`] or
    /// [`NewEvent::deliver_at`]; `None`: due at once.
    pub fn delay(&self) -> Option<Duration> {
        self.delay
    }

    /// Sets the key (the Kafka record key; ordering within a partition follows it).
    pub fn key(mut self, key: impl Into<String>) -> Self {
        self.key = Some(key.into());
        self
    }

    /// Adds a header. Names starting with `txbox-` and the name `content-type`
    /// (any case; [`HEADER_CONTENT_TYPE`]) are reserved and refused at publish,
    /// and so are headers over [`MAX_HEADER_BYTES`] in all.
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

    /// The payload: the serialized JSON's bytes, or the bytes as given.
    pub fn payload(&self) -> &[u8] {
        match &self.payload {
            Body::Json(s) => s.as_bytes(),
            Body::Bytes { bytes, .. } => bytes,
        }
    }

    /// The content type of an event made with [`NewEvent::bytes`]; `None` for JSON.
    pub fn content_type(&self) -> Option<&str> {
        match &self.payload {
            Body::Json(_) => None,
            Body::Bytes { content_type, .. } => Some(content_type),
        }
    }
}
