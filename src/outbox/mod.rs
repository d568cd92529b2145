//! Publishing: events join the caller's open transaction.

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Serialize;

use crate::config::Config;
use crate::error::{Error, Result};
use crate::event::{
    EventId, NewEvent, HEADER_CONTENT_TYPE, HEADER_OVERHEAD, MAX_DELAY, MAX_HEADER_BYTES,
    RESERVED_HEADER_PREFIX,
};
use crate::tables::Tables;
use crate::transaction::Transaction;

#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "postgres")]
pub use postgres::{PgPrepared, PgPreparedTx};

/// Writes events into the outbox table inside the caller's transaction.
///
/// `publish` never begins, commits or rolls back: the event commits or rolls back
/// with the caller's business rows. Cheap to clone; share one per process.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// use txbox::{Config, Outbox};
///
/// let config = Config::builder().event("order-created", |e| e).build()?;
/// let outbox = Outbox::new(&config)?;
/// let mut client = postgres::Client::connect("postgres://postgres@127.0.0.1/test", postgres::NoTls)?;
/// let mut tx = client.transaction()?;
/// tx.execute("INSERT INTO orders (id) VALUES (1)", &[])?;
/// let id = outbox.publish(&mut tx, "order-created", &serde_json::json!({"id": 1}))?;
/// tx.commit()?; // the order and its event become visible together
/// # let _ = id; Ok(()) }
/// ```
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

struct Inner {
    tables: Tables,
    types: BTreeSet<String>,
    max_payload_bytes: usize,
    /// The configuration's observer.
    observer: crate::metrics::Observed,
}

impl Outbox {
    /// An outbox for the event types and table prefix of `config`.
    pub fn new(config: &Config) -> Result<Self> {
        Ok(Outbox {
            inner: Arc::new(Inner {
                tables: Tables::new(&config.table_prefix)?,
                types: config.events.keys().cloned().collect(),
                max_payload_bytes: config.max_payload_bytes,
                observer: config.observer.clone(),
            }),
        })
    }

    /// Serializes `payload` to JSON and inserts one event into `tx`. Returns its id.
    ///
    /// Errors: [`Error::UnknownEventType`], [`Error::Serialize`],
    /// [`Error::PayloadTooLarge`], [`Error::InvalidEvent`] (a key or header out of
    /// bounds), [`Error::Misuse`] (an Oracle connection in autocommit),
    /// [`Error::Database`]. After an error the caller's
    /// transaction is still the caller's to roll back (PostgreSQL will refuse further
    /// statements in it after a database error).
    ///
    /// On PostgreSQL the statement is parsed and planned on every call; a
    /// `PgPrepared` (`Outbox::prepare_pg`, feature `postgres`) prepares it once per
    /// connection instead: publish on `prepared.on(&mut tx)`.
    pub fn publish<T, P>(&self, tx: &mut T, event_type: &str, payload: &P) -> Result<EventId>
    where
        T: Transaction + ?Sized,
        P: Serialize + ?Sized,
    {
        self.check_type(event_type)?;
        let event = NewEvent::new(event_type, payload)?;
        let id = event.id;
        self.publish_all(tx, [event])?;
        Ok(id)
    }

    /// Inserts one event whose payload is `bytes` as they are (protobuf, Avro,
    /// ...) into `tx`, sent with `content_type`: [`NewEvent::bytes`] in one call.
    /// Returns its id. The bytes go to a binary column and reach the broker, and
    /// consumers, unchanged.
    ///
    /// Errors: as [`Outbox::publish`], and [`Error::InvalidEvent`] for a content
    /// type that is not 1 to 255 printable ASCII characters.
    ///
    /// ```no_run
    /// # fn main() -> txbox::Result<()> {
    /// # let config = txbox::Config::builder().event("order-created", |e| e).build()?;
    /// let outbox = txbox::Outbox::new(&config)?;
    /// let mut client = postgres::Client::connect("postgres://postgres@127.0.0.1/test", postgres::NoTls)?;
    /// let mut tx = client.transaction()?;
    /// let encoded: Vec<u8> = vec![0x08, 0x96, 0x01]; // e.g. a protobuf message's bytes
    /// outbox.publish_bytes(&mut tx, "order-created", &encoded, "application/x-protobuf")?;
    /// tx.commit()?;
    /// # Ok(()) }
    /// ```
    pub fn publish_bytes<T>(
        &self,
        tx: &mut T,
        event_type: &str,
        bytes: &[u8],
        content_type: &str,
    ) -> Result<EventId>
    where
        T: Transaction + ?Sized,
    {
        self.check_type(event_type)?;
        let event = NewEvent::bytes(event_type, bytes, content_type);
        let id = event.id;
        self.publish_all(tx, [event])?;
        Ok(id)
    }

    /// Inserts events built with [`NewEvent`] (any known types, keys, headers;
    /// [`NewEvent::batch`] for many payloads of one type) in one statement, one
    /// round trip. Returns their ids in order. Nothing is written when one of them
    /// is refused.
    ///
    /// ```no_run
    /// # fn main() -> txbox::Result<()> {
    /// # let config = txbox::Config::builder().event("order-created", |e| e).build()?;
    /// use txbox::{NewEvent, Outbox};
    /// let outbox = Outbox::new(&config)?;
    /// let mut client = postgres::Client::connect("postgres://postgres@127.0.0.1/test", postgres::NoTls)?;
    /// let mut tx = client.transaction()?;
    /// let keyed = NewEvent::new("order-created", &serde_json::json!({"id": 7}))?
    ///     .key("order-7")
    ///     .header("trace-id", "abc");
    /// let ids = outbox.publish_all(&mut tx, [keyed])?;
    /// let more = outbox.publish_all(&mut tx, NewEvent::batch("order-created", [8, 9])?)?;
    /// tx.commit()?;
    /// # let _ = (ids, more); Ok(()) }
    /// ```
    pub fn publish_all<T, I>(&self, tx: &mut T, events: I) -> Result<Vec<EventId>>
    where
        T: Transaction + ?Sized,
        I: IntoIterator<Item = NewEvent>,
    {
        #[allow(unused_mut)]
        let mut events: Vec<NewEvent> = events.into_iter().collect();
        if events.is_empty() {
            return Ok(Vec::new());
        }
        // the current trace context travels in the headers (checked with them)
        #[cfg(feature = "trace-context")]
        for e in &mut events {
            crate::trace::inject(&mut e.headers);
        }
        for e in &events {
            self.check(e)?;
        }
        tx.insert_events(&self.inner.tables, &events)?;
        let published = events.len() as u64;
        self.inner
            .observer
            .add(crate::metrics::Count::Published, published);
        Ok(events.iter().map(|e| e.id).collect())
    }

    /// The table names events are written to.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub(crate) fn tables(&self) -> &Tables {
        &self.inner.tables
    }

    fn check_type(&self, event_type: &str) -> Result<()> {
        if self.inner.types.contains(event_type) {
            Ok(())
        } else {
            Err(Error::UnknownEventType(event_type.to_owned()))
        }
    }

    fn check(&self, e: &NewEvent) -> Result<()> {
        self.check_type(&e.event_type)?;
        if e.payload.len() > self.inner.max_payload_bytes {
            return Err(Error::PayloadTooLarge {
                event_type: e.event_type.clone(),
                size: e.payload.len(),
                max: self.inner.max_payload_bytes,
            });
        }
        if let Some(ct) = e.content_type() {
            // an AMQP short string; a header value every broker and client keeps as is
            if ct.is_empty()
                || ct.len() > 255
                || !ct.bytes().all(|b| b.is_ascii_graphic() || b == b' ')
            {
                return Err(Error::InvalidEvent(format!(
                    "content type {:?} of event type {:?}: must be 1 to 255 printable ASCII characters",
                    ct.escape_debug().to_string(),
                    e.event_type
                )));
            }
        }
        if e.delay.is_some_and(|d| d > MAX_DELAY) {
            return Err(Error::InvalidEvent(format!(
                "delay of event type {:?} is {:?}, at most {:?} (a year)",
                e.event_type,
                e.delay.unwrap_or_default(),
                MAX_DELAY
            )));
        }
        if let Some(k) = &e.key {
            if k.len() > 255 {
                return Err(Error::InvalidEvent(format!(
                    "key of event type {:?} is {} bytes, at most 255",
                    e.event_type,
                    k.len()
                )));
            }
        }
        // an AMQP header name is a short string (255 bytes); a NUL would cut a
        // Kafka header name short on the consumer's side
        if let Some(name) = e
            .headers
            .keys()
            .find(|n| n.is_empty() || n.len() > 255 || n.chars().any(char::is_control))
        {
            return Err(Error::InvalidEvent(format!(
                "header {:?} of event type {:?}: a header name must be 1 to 255 bytes without \
                 control characters",
                name.escape_debug().to_string(),
                e.event_type
            )));
        }
        if let Some(name) = e
            .headers
            .keys()
            .find(|n| n.starts_with(RESERVED_HEADER_PREFIX))
        {
            return Err(Error::InvalidEvent(format!(
                "header {name:?} of event type {:?}: names starting with {RESERVED_HEADER_PREFIX:?} are reserved",
                e.event_type
            )));
        }
        // txbox sends every event's content type itself (Kafka's header, the
        // AMQP property): a JSON event's own header would be read as its
        // content type on Kafka and dropped on RabbitMQ
        if let Some(name) = e
            .headers
            .keys()
            .find(|n| n.eq_ignore_ascii_case(HEADER_CONTENT_TYPE))
        {
            return Err(Error::InvalidEvent(format!(
                "header {name:?} of event type {:?}: txbox sends the content type in it; \
                 publish bytes with their content type (NewEvent::bytes) to set one",
                e.event_type
            )));
        }
        let header_bytes: usize = e
            .headers
            .iter()
            .map(|(k, v)| k.len() + v.len() + HEADER_OVERHEAD)
            .sum();
        if header_bytes > MAX_HEADER_BYTES {
            return Err(Error::InvalidEvent(format!(
                "headers of event type {:?} are {header_bytes} bytes (names and values, and \
                 {HEADER_OVERHEAD} per header), at most {MAX_HEADER_BYTES}",
                e.event_type
            )));
        }
        Ok(())
    }
}
