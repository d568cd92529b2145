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
//! next batch on the same channel ([`Sender::start`]). A dropped connection fails
//! the unconfirmed messages of every batch in flight and is opened again on a later
//! batch, with backoff.

use std::collections::VecDeque;
use std::fmt::Display;
use std::time::{Duration, Instant};

use amiquip::{
    AmqpProperties, AmqpValue, Channel, Confirm, Connection, ConsumerMessage, ConsumerOptions,
    FieldTable, Publish, Return,
};
use crossbeam_channel::{select, Receiver};

use crate::consumer::{Position, ReceivedEvent, StopSignal, Verdict};
use crate::error::{Error, Result};
use crate::event::{Event, HEADER_EVENT_ID, HEADER_EVENT_KEY, HEADER_EVENT_TYPE};
use crate::sender::{SendError, Sender, SenderFactory};

/// Opens a plain-TCP AMQP connection (`amqp://`; TLS is not built in).
fn open(url: &str) -> std::result::Result<Connection, amiquip::Error> {
    Connection::insecure_open(url)
}

/// Frames a sender hands to amiquip's I/O thread without waiting for it (a message
/// is three: method, header, body). With amiquip's default of 16 the relay thread
/// waited on the I/O thread every five messages, so publishing a batch of 200 took
/// as long as claiming it; with room for a whole batch the thread hands it over and
/// goes back to the database. The queue holds copies of at most about 340 messages
/// (the relay holds the batches in flight anyway); past it, and past the I/O
/// thread's 16 MiB of unwritten data, publishing waits as before.
const PUBLISH_FRAMES: usize = 1024;

/// Opens a connection for publishing.
fn open_publisher(url: &str) -> std::result::Result<Connection, amiquip::Error> {
    Connection::insecure_open_tuned(
        url,
        amiquip::ConnectionTuning::default().mem_channel_bound(PUBLISH_FRAMES),
    )
}

fn text(v: &AmqpValue) -> String {
    match v {
        AmqpValue::LongString(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

/// Makes one [`RabbitSender`] per relay thread.
///
/// ```no_run
/// let factory = txbox::rabbitmq::RabbitSenderFactory::new("amqp://guest:guest@127.0.0.1:5672");
/// # let _ = factory;
/// ```
#[derive(Clone)]
pub struct RabbitSenderFactory {
    url: String,
    confirm_timeout: Duration,
}

/// The URL's password is redacted.
impl std::fmt::Debug for RabbitSenderFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSenderFactory")
            .field("url", &crate::redact::urls(&self.url))
            .field("confirm_timeout", &self.confirm_timeout)
            .finish()
    }
}

impl RabbitSenderFactory {
    /// Senders for the broker at `url` (`amqp://user:pass@host:port/vhost`).
    pub fn new(url: &str) -> Self {
        RabbitSenderFactory {
            url: url.to_string(),
            confirm_timeout: Duration::from_secs(30),
        }
    }

    /// Longest wait for the broker's confirms of one batch (default 30s).
    pub fn confirm_timeout(mut self, d: Duration) -> Self {
        self.confirm_timeout = d;
        self
    }
}

impl SenderFactory for RabbitSenderFactory {
    fn create(&self) -> Result<Box<dyn Sender>> {
        Ok(Box::new(RabbitSender::new(&self.url, self.confirm_timeout)))
    }

    fn ack_wait(&self) -> Option<Duration> {
        Some(self.confirm_timeout)
    }
}

struct Open {
    // Field order: the channel closes before its connection.
    channel: Channel,
    confirms: Receiver<Confirm>,
    returns: Receiver<Return>,
    next_tag: u64,
    _connection: Connection,
}

/// One connection and one confirm-mode channel, owned by one relay thread.
pub struct RabbitSender {
    url: String,
    confirm_timeout: Duration,
    open: Option<Open>,
    retry_at: Instant,
    backoff: Duration,
    last_error: String,
    /// Batches started and not yet waited for, oldest first.
    in_flight: VecDeque<Unconfirmed>,
}

const MIN_RECONNECT: Duration = Duration::from_millis(100);
const MAX_RECONNECT: Duration = Duration::from_secs(10);

impl RabbitSender {
    /// A sender that connects on its first batch.
    pub fn new(url: &str, confirm_timeout: Duration) -> Self {
        RabbitSender {
            url: url.to_string(),
            confirm_timeout,
            open: None,
            retry_at: Instant::now(),
            backoff: MIN_RECONNECT,
            last_error: String::new(),
            in_flight: VecDeque::new(),
        }
    }

    fn connect(&mut self) -> std::result::Result<&mut Open, String> {
        if self.open.is_none() {
            let now = Instant::now();
            if now < self.retry_at {
                return Err(format!(
                    "rabbitmq not connected ({}); next try in {:?}",
                    self.last_error,
                    self.retry_at - now
                ));
            }
            match Self::open_channel(&self.url) {
                Ok(o) => {
                    self.backoff = MIN_RECONNECT;
                    self.open = Some(o);
                    log::info!("txbox: rabbitmq sender connected");
                }
                Err(e) => {
                    // amiquip's connect errors name the URL, password included
                    let e = crate::redact::urls(&e.to_string());
                    self.last_error = e.clone();
                    self.retry_at = now + self.backoff;
                    self.backoff = (self.backoff * 2).min(MAX_RECONNECT);
                    return Err(format!("rabbitmq connect: {e}"));
                }
            }
        }
        self.open
            .as_mut()
            .ok_or_else(|| "rabbitmq not connected".to_string())
    }

    fn open_channel(url: &str) -> std::result::Result<Open, amiquip::Error> {
        let mut connection = open_publisher(url)?;
        let channel = connection.open_channel(None)?;
        let confirms = channel.listen_for_publisher_confirms()?;
        let returns = channel.listen_for_returns()?;
        channel.enable_publisher_confirms()?;
        Ok(Open {
            channel,
            confirms,
            returns,
            next_tag: 1,
            _connection: connection,
        })
    }

    /// Closes the channel; the unconfirmed messages of the batches in flight fail.
    fn drop_connection(&mut self, why: &SendError) {
        for b in &mut self.in_flight {
            b.broken.get_or_insert_with(|| why.clone());
        }
        if self.open.take().is_some() {
            log::warn!("txbox: rabbitmq sender: {why}; reconnecting");
            self.last_error = why.message.clone();
            self.retry_at = Instant::now() + self.backoff;
        }
    }

    /// [`Sender::ready`]: connected, or connecting now succeeds (with backoff
    /// between tries).
    fn check(&mut self) -> std::result::Result<(), SendError> {
        self.connect().map(|_| ()).map_err(SendError::transient)
    }
}

/// Whose fault a channel or connection error is: the server closes a channel for
/// what was sent on it (404 a missing exchange, 403 access refused, 406 a message
/// over the broker's size limit): a verdict on the batch, counted as an attempt.
/// Anything else (a lost, refused or forced-closed connection) is the transport's.
fn classify(context: String, err: &amiquip::Error) -> SendError {
    // amiquip's errors may name the URL, password included
    let text = format!("{context}: {}", crate::redact::urls(&err.to_string()));
    match err {
        amiquip::Error::ServerClosedChannel { .. } => SendError::new(text),
        _ => SendError::transient(text),
    }
}

fn properties(e: &Event) -> AmqpProperties {
    let mut headers = FieldTable::new();
    headers.insert(
        HEADER_EVENT_ID.to_string(),
        AmqpValue::LongString(e.id.to_string()),
    );
    headers.insert(
        HEADER_EVENT_TYPE.to_string(),
        AmqpValue::LongString(e.event_type.clone()),
    );
    if let Some(key) = &e.key {
        headers.insert(
            HEADER_EVENT_KEY.to_string(),
            AmqpValue::LongString(key.clone()),
        );
    }
    for (k, v) in &e.headers {
        headers.insert(k.clone(), AmqpValue::LongString(v.clone()));
    }
    AmqpProperties::default()
        .with_message_id(e.id.to_string())
        .with_type_(e.event_type.clone())
        .with_content_type("application/json".to_string())
        .with_delivery_mode(2)
        .with_headers(headers)
}

/// A batch published on the current channel, waiting for its confirms.
struct Unconfirmed {
    /// Delivery tag of the first message; the others follow in order.
    first: u64,
    /// Messages published (tags `first..first + published`).
    published: u64,
    /// Event ids (each message's id), to match returns.
    ids: Vec<crate::EventId>,
    results: Vec<Option<Result<(), SendError>>>,
    deadline: Instant,
    /// Why the batch's unsettled messages failed (channel lost, no confirm).
    broken: Option<SendError>,
}

impl Unconfirmed {
    /// Applies the broker's confirm of tags `from..=upto` (of the current channel:
    /// a broken batch's tags belonged to a closed one).
    fn confirm(&mut self, from: u64, upto: u64, ok: bool) {
        if self.broken.is_some() {
            return;
        }
        let last = self.first + self.published;
        for tag in from.max(self.first)..(upto + 1).min(last) {
            let slot = &mut self.results[(tag - self.first) as usize];
            if slot.is_none() {
                *slot = Some(if ok {
                    Ok(())
                } else {
                    Err(SendError::new("rabbitmq: broker nacked the message"))
                });
            }
        }
    }

    fn settled(&self) -> bool {
        self.results.iter().all(Option::is_some)
    }

    /// A returned (unroutable) message fails, whatever its confirm said.
    fn returned(&mut self, ret: &Return) {
        let id: Option<crate::EventId> = ret
            .properties
            .message_id()
            .as_deref()
            .and_then(|m| m.parse().ok());
        if let Some(i) = self.ids.iter().position(|x| Some(*x) == id) {
            self.results[i] = Some(Err(SendError::new(format!(
                "rabbitmq returned the message as unroutable: {} {} (exchange {:?}, routing key {:?})",
                ret.reply_code, ret.reply_text, ret.exchange, ret.routing_key
            ))));
        }
    }

    fn into_results(self) -> Vec<Result<(), SendError>> {
        let why = self
            .broken
            .unwrap_or_else(|| SendError::transient("rabbitmq: no publisher confirm"));
        self.results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(why.clone())))
            .collect()
    }
}

impl RabbitSender {
    /// Publishes `events` on the channel (opening it if needed) without waiting.
    fn publish(&mut self, events: &[Event]) -> Unconfirmed {
        let mut batch = Unconfirmed {
            first: 0,
            published: 0,
            ids: events.iter().map(|e| e.id).collect(),
            results: vec![None; events.len()],
            deadline: Instant::now() + self.confirm_timeout,
            broken: None,
        };
        let open = match self.connect() {
            Ok(o) => o,
            Err(msg) => {
                batch.broken = Some(SendError::transient(msg));
                return batch;
            }
        };
        batch.first = open.next_tag;
        for e in events {
            let mut publish = Publish::with_properties(
                e.payload.as_bytes(),
                e.routing_key.clone(),
                properties(e),
            );
            publish.mandatory = true;
            if let Err(err) = open.channel.basic_publish(e.destination.clone(), publish) {
                let why = classify(
                    format!("rabbitmq publish to exchange {:?}", e.destination),
                    &err,
                );
                batch.broken = Some(why.clone());
                self.drop_connection(&why);
                return batch;
            }
            open.next_tag += 1;
            batch.published += 1;
        }
        batch
    }

    /// Waits for the confirms of `batch`; confirms and returns of later batches
    /// are kept with them.
    ///
    /// The broker sends a `mandatory` message's return before its ack, so the
    /// returns queued when a confirm arrives are applied before that confirm: an
    /// ack never marks a returned message sent, whatever happens to its batch or
    /// the connection afterwards.
    fn collect(&mut self, mut batch: Unconfirmed) -> Vec<Result<(), SendError>> {
        while !batch.settled() && batch.broken.is_none() {
            let Some(open) = &self.open else {
                batch.broken = Some(SendError::transient(
                    "rabbitmq: connection lost before the confirms",
                ));
                break;
            };
            let wait = batch.deadline.saturating_duration_since(Instant::now());
            let confirm = open.confirms.recv_timeout(wait);
            Self::apply_returns(open, &mut batch, &mut self.in_flight);
            let (payload, ok) = match confirm {
                Ok(Confirm::Ack(p)) => (p, true),
                Ok(Confirm::Nack(p)) => (p, false),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {
                    let why = SendError::transient(format!(
                        "rabbitmq: no publisher confirm within {:?}",
                        self.confirm_timeout
                    ));
                    batch.broken = Some(why.clone());
                    self.drop_connection(&why);
                    break;
                }
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    // the channel is gone: its next call tells why (a missing
                    // exchange closes it with 404)
                    let why = match open.channel.qos(0, 0, false) {
                        Err(err) => classify("rabbitmq channel closed".into(), &err),
                        Ok(()) => SendError::transient("rabbitmq: publisher confirms stopped"),
                    };
                    batch.broken = Some(why.clone());
                    self.drop_connection(&why);
                    break;
                }
            };
            let upto = payload.delivery_tag;
            let from = if payload.multiple { 0 } else { upto };
            batch.confirm(from, upto, ok);
            for later in &mut self.in_flight {
                later.confirm(from, upto, ok);
            }
        }
        if let Some(open) = &self.open {
            Self::apply_returns(open, &mut batch, &mut self.in_flight);
        }
        batch.into_results()
    }

    /// Fails every returned (unroutable) message of `batch` and `later` that the
    /// broker has sent back so far.
    fn apply_returns(open: &Open, batch: &mut Unconfirmed, later: &mut VecDeque<Unconfirmed>) {
        while let Ok(ret) = open.returns.try_recv() {
            batch.returned(&ret);
            for b in later.iter_mut() {
                b.returned(&ret);
            }
        }
    }
}

crate::sender::pipelined_sender!(RabbitSender);

/// What the consumer loop does with a message whose handler failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnError {
    /// Nack with requeue: the broker delivers it again (default).
    Requeue,
    /// Reject without requeue: it goes to the queue's dead-letter exchange, if any.
    DeadLetter,
}

/// A blocking RabbitMQ consumer loop: manual ack after the handler returned `Ok`; on
/// `Err`, nack with requeue (or reject to the dead-letter exchange).
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// use txbox::{consumer::StopSignal, rabbitmq::RabbitConsumer};
/// let consumer = RabbitConsumer::new("amqp://guest:guest@127.0.0.1:5672", "billing-orders").prefetch(50);
/// let stop = StopSignal::new();
/// consumer.run(&stop, |event| {
///     println!("{:?}", event.id);
///     Ok::<(), std::io::Error>(())
/// })?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct RabbitConsumer {
    url: String,
    queue: String,
    prefetch: u16,
    on_error: OnError,
    retry_delay: Duration,
}

/// The URL's password is redacted.
impl std::fmt::Debug for RabbitConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitConsumer")
            .field("url", &crate::redact::urls(&self.url))
            .field("queue", &self.queue)
            .field("prefetch", &self.prefetch)
            .field("on_error", &self.on_error)
            .field("retry_delay", &self.retry_delay)
            .finish()
    }
}

impl RabbitConsumer {
    /// Consumes `queue` (which must exist) at `url`. Prefetch 100, requeue on error.
    pub fn new(url: &str, queue: &str) -> Self {
        RabbitConsumer {
            url: url.to_string(),
            queue: queue.to_string(),
            prefetch: 100,
            on_error: OnError::Requeue,
            retry_delay: Duration::from_millis(500),
        }
    }

    /// Unacked messages the broker may push at once.
    pub fn prefetch(mut self, n: u16) -> Self {
        self.prefetch = n.max(1);
        self
    }

    /// What a handler error does to the message.
    pub fn on_error(mut self, policy: OnError) -> Self {
        self.on_error = policy;
        self
    }

    /// Wait after a handler error before the next message (default 500ms), so a
    /// requeued message that keeps failing does not spin.
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.retry_delay = d;
        self
    }

    /// Hands every message to `handler` until `stop`. A lost connection is logged and
    /// opened again with backoff; unacked messages are redelivered by the broker.
    pub fn run<E, F>(&self, stop: &StopSignal, handler: F) -> Result<()>
    where
        E: Display,
        F: FnMut(&ReceivedEvent) -> Result<(), E>,
    {
        self.run_with(stop, crate::consumer::verdicts(handler))
    }

    /// Like [`RabbitConsumer::run`] with a [`Verdict`] per message: `Ack` acks,
    /// `Retry` nacks as [`OnError`] says, `Reject` rejects to the dead-letter exchange
    /// (logged at error level), `Stop` nacks with requeue and returns
    /// [`Error::ConsumerStopped`].
    pub fn run_with<F>(&self, stop: &StopSignal, mut handler: F) -> Result<()>
    where
        F: FnMut(&ReceivedEvent) -> Verdict,
    {
        let mut backoff = MIN_RECONNECT;
        while !stop.is_stopped() {
            match self.session(stop, &mut handler) {
                Ok(()) => return Ok(()),
                Err(e @ Error::ConsumerStopped(_)) => return Err(e),
                Err(e) => {
                    log::warn!(
                        "txbox: rabbitmq consumer on {}: {e}; reconnecting in {backoff:?}",
                        self.queue
                    );
                    if stop.sleep(backoff) {
                        return Ok(());
                    }
                    backoff = (backoff * 2).min(MAX_RECONNECT);
                }
            }
        }
        Ok(())
    }

    fn session<F>(&self, stop: &StopSignal, handler: &mut F) -> Result<()>
    where
        F: FnMut(&ReceivedEvent) -> Verdict,
    {
        let amqp = |e: amiquip::Error| {
            Error::Broker(format!("rabbitmq: {}", crate::redact::urls(&e.to_string())))
        };
        let mut connection = open(&self.url).map_err(amqp)?;
        let channel = connection.open_channel(None).map_err(amqp)?;
        channel.qos(0, self.prefetch, false).map_err(amqp)?;
        let consumer = channel
            .basic_consume(self.queue.clone(), ConsumerOptions::default())
            .map_err(amqp)?;
        loop {
            let message = select! {
                recv(stop.receiver()) -> _ => return Ok(()),
                recv(consumer.receiver()) -> m => m,
            };
            let mut delivery = match message {
                Ok(ConsumerMessage::Delivery(d)) => d,
                Ok(other) => {
                    return Err(Error::Broker(format!("rabbitmq consumer ended: {other:?}")))
                }
                Err(_) => return Err(Error::Broker("rabbitmq consumer channel closed".into())),
            };
            let mut raw: Vec<(String, String)> = delivery
                .properties
                .headers()
                .as_ref()
                .map(|h| h.iter().map(|(k, v)| (k.clone(), text(v))).collect())
                .unwrap_or_default();
            if !raw.iter().any(|(k, _)| k == HEADER_EVENT_ID) {
                if let Some(id) = delivery.properties.message_id() {
                    raw.push((HEADER_EVENT_ID.to_string(), id.clone()));
                }
            }
            let event = ReceivedEvent::from_parts(
                raw,
                None,
                std::mem::take(&mut delivery.body), // the ack needs only the tag
                Position::RabbitMq {
                    queue: self.queue.clone(),
                    delivery_tag: delivery.delivery_tag(),
                    redelivered: delivery.redelivered,
                },
            );
            match handler(&event) {
                Verdict::Ack => consumer.ack(delivery).map_err(amqp)?,
                Verdict::Reject(why) => {
                    log::error!(
                        "txbox: rabbitmq message at {} rejected to the dead-letter exchange: {why}",
                        event.position
                    );
                    consumer.reject(delivery, false).map_err(amqp)?;
                }
                Verdict::Stop(why) => {
                    consumer.nack(delivery, true).map_err(amqp)?;
                    return Err(Error::ConsumerStopped(why));
                }
                Verdict::Retry(why) => {
                    let requeue = self.on_error == OnError::Requeue;
                    log::warn!(
                        "txbox: handler failed at {}: {why}; {}",
                        event.position,
                        if requeue {
                            "requeued"
                        } else {
                            "rejected to the dead-letter exchange"
                        }
                    );
                    consumer.nack(delivery, requeue).map_err(amqp)?;
                    if stop.sleep(self.retry_delay) {
                        return Ok(());
                    }
                }
            }
        }
    }
}
