//! What the broker consumer loops hand to a handler, and how to stop them.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crossbeam_channel::{bounded, Receiver, Sender};
use serde::de::DeserializeOwned;

use crate::error::{Error, Result};
use crate::event::{
    EventId, HEADER_CONTENT_TYPE, HEADER_EVENT_ID, HEADER_EVENT_KEY, HEADER_EVENT_TYPE,
    RESERVED_HEADER_PREFIX,
};

/// Where a received message came from. `#[non_exhaustive]`: another broker
/// adds its own variant.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Position {
    /// A Kafka record.
    Kafka {
        /// Topic.
        topic: String,
        /// Partition.
        partition: i32,
        /// Offset.
        offset: i64,
    },
    /// A RabbitMQ delivery.
    RabbitMq {
        /// Queue consumed from.
        queue: String,
        /// Delivery tag on the consumer's channel.
        delivery_tag: u64,
        /// The broker delivered it before.
        redelivered: bool,
    },
}

impl fmt::Display for Position {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Position::Kafka {
                topic,
                partition,
                offset,
            } => {
                write!(f, "kafka {topic}/{partition}@{offset}")
            }
            Position::RabbitMq {
                queue,
                delivery_tag,
                ..
            } => {
                write!(f, "rabbitmq queue {queue} delivery {delivery_tag}")
            }
        }
    }
}

/// A message read from a broker, as a consumer loop hands it to its handler.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReceivedEvent {
    /// The event id from the [`HEADER_EVENT_ID`] header; `None` when it is missing or
    /// not a UUID (see [`ReceivedEvent::event_id`]).
    pub id: Option<EventId>,
    /// The event type from the [`HEADER_EVENT_TYPE`] header.
    pub event_type: Option<String>,
    /// The record key (Kafka) or routing key (RabbitMQ).
    pub key: Option<String>,
    /// The user's headers (txbox's own `txbox-*` headers are in the fields above).
    pub headers: BTreeMap<String, String>,
    /// The payload bytes, unchanged: the JSON text, or the bytes of an event
    /// published as bytes ([`NewEvent::bytes`](crate::NewEvent::bytes)).
    pub payload: Vec<u8>,
    /// The content type the message names: the [`HEADER_CONTENT_TYPE`] header
    /// (Kafka) or the `content_type` property (RabbitMQ, `application/json` for
    /// JSON events). `None` when it names none, as txbox's JSON events on Kafka.
    pub content_type: Option<String>,
    /// Where it came from.
    pub position: Position,
}

impl ReceivedEvent {
    /// Builds one from a message's raw headers: picks out txbox's headers
    /// (`txbox-event-id`, `txbox-event-type`, `txbox-event-key`) and the
    /// `content-type` header, and keeps the rest.
    /// For consumer loops of your own.
    pub fn from_parts(
        raw_headers: impl IntoIterator<Item = (String, String)>,
        key: Option<String>,
        payload: Vec<u8>,
        position: Position,
    ) -> Self {
        let (mut id, mut event_type, mut headers, mut key) = (None, None, BTreeMap::new(), key);
        let mut content_type = None;
        for (k, v) in raw_headers {
            if k.eq_ignore_ascii_case(HEADER_CONTENT_TYPE) {
                content_type = Some(v);
            } else if k == HEADER_EVENT_KEY {
                key = Some(v);
            } else if k == HEADER_EVENT_ID {
                id = v.parse().ok();
            } else if k == HEADER_EVENT_TYPE {
                event_type = Some(v);
            } else if !k.starts_with(RESERVED_HEADER_PREFIX) {
                headers.insert(k, v);
            }
        }
        ReceivedEvent {
            id,
            event_type,
            key,
            headers,
            payload,
            content_type,
            position,
        }
    }

    /// The event id, or [`Error::MissingEventId`] naming the message's position.
    pub fn event_id(&self) -> Result<EventId> {
        self.id
            .ok_or_else(|| Error::MissingEventId(self.position.to_string()))
    }

    /// Deserializes the JSON payload; [`Error::Deserialize`], naming where the
    /// message was read, when it is not the JSON of a `T`.
    ///
    /// ```
    /// use txbox::{Error, Position, ReceivedEvent};
    /// let position = Position::Kafka { topic: "orders".into(), partition: 0, offset: 7 };
    /// let e = ReceivedEvent::from_parts([], None, b"{\"n\": 3}".to_vec(), position);
    /// assert_eq!(e.json::<serde_json::Value>().unwrap()["n"], 3);
    /// let err = e.json::<u32>().unwrap_err();
    /// assert!(
    ///     matches!(&err, Error::Deserialize { position, .. } if position == "kafka orders/0@7"),
    ///     "{err}"
    /// );
    /// ```
    pub fn json<T: DeserializeOwned>(&self) -> Result<T> {
        serde_json::from_slice(&self.payload).map_err(|source| Error::Deserialize {
            position: self.position.to_string(),
            source,
        })
    }
}

/// Stops a consumer loop from another thread. Clones share the signal.
///
/// ```
/// let stop = txbox::StopSignal::new();
/// let for_loop = stop.clone();
/// stop.stop();
/// assert!(for_loop.is_stopped());
/// ```
#[derive(Clone)]
pub struct StopSignal {
    tx: Arc<Mutex<Option<Sender<()>>>>,
    rx: Receiver<()>,
}

impl Default for StopSignal {
    fn default() -> Self {
        Self::new()
    }
}

impl StopSignal {
    /// A signal not yet given.
    pub fn new() -> Self {
        let (tx, rx) = bounded(0);
        StopSignal {
            tx: Arc::new(Mutex::new(Some(tx))),
            rx,
        }
    }

    /// Asks the loop to stop; it returns after the message in hand.
    pub fn stop(&self) {
        self.tx.lock().unwrap_or_else(|p| p.into_inner()).take();
    }

    /// True once [`StopSignal::stop`] was called.
    pub fn is_stopped(&self) -> bool {
        matches!(
            self.rx.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    /// Sleeps `d` or until stopped; true if stopped.
    pub fn sleep(&self, d: Duration) -> bool {
        matches!(
            self.rx.recv_timeout(d),
            Err(crossbeam_channel::RecvTimeoutError::Disconnected)
        )
    }

    /// The channel that disconnects on stop, for `select!`.
    pub fn receiver(&self) -> &Receiver<()> {
        &self.rx
    }
}

/// What a consumer loop does with a message after its handler ran
/// (see `run_with` on the Kafka and RabbitMQ consumers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Done: commit the offset / ack.
    Ack,
    /// Failed: see it again (Kafka rewinds; RabbitMQ nacks as its `OnError` says).
    Retry(String),
    /// Unprocessable: RabbitMQ rejects it to the queue's dead-letter exchange; Kafka,
    /// which has none, commits past it. Logged at error level.
    Reject(String),
    /// Stop the loop without committing or acking the message; `run_with` returns
    /// [`Error::ConsumerStopped`].
    Stop(String),
}

/// Runs `handler` on `event`, inside a span whose parent is the publisher's
/// trace context with the feature `trace-context`: what both consumer loops
/// call for each message.
#[cfg_attr(not(any(feature = "kafka", feature = "rabbitmq")), allow(dead_code))]
pub(crate) fn handle(
    event: &ReceivedEvent,
    handler: &mut impl FnMut(&ReceivedEvent) -> Verdict,
) -> Verdict {
    #[cfg(feature = "trace-context")]
    return crate::trace::in_consumer_span(
        crate::trace::Received {
            event_type: event.event_type.as_deref(),
            id: event.id,
            headers: &event.headers,
        },
        || handler(event),
    );
    #[cfg(not(feature = "trace-context"))]
    handler(event)
}

/// The `run` form of the consumer loops: `Ok` acks, `Err` retries.
#[cfg_attr(not(any(feature = "kafka", feature = "rabbitmq")), allow(dead_code))]
pub(crate) fn verdicts<E: std::fmt::Display>(
    mut handler: impl FnMut(&ReceivedEvent) -> std::result::Result<(), E>,
) -> impl FnMut(&ReceivedEvent) -> Verdict {
    move |e| match handler(e) {
        Ok(()) => Verdict::Ack,
        Err(err) => Verdict::Retry(err.to_string()),
    }
}
