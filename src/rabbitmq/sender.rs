//! The relay's RabbitMQ sender: one connection and one confirm-mode channel per
//! relay thread.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use amiquip::{
    AmqpProperties, AmqpValue, Channel, Confirm, Connection, FieldTable, Publish, Return,
};
use crossbeam_channel::Receiver;

use super::{MAX_RECONNECT, MIN_RECONNECT};
use crate::error::Result;
use crate::event::{Event, HEADER_EVENT_ID, HEADER_EVENT_KEY, HEADER_EVENT_TYPE};
use crate::sender::{SendError, Sender, SenderFactory};

/// Frames a sender hands to amiquip's I/O thread without waiting for it (a message
/// is three: method, header, body). With amiquip's default of 16 the relay thread
/// waited on the I/O thread every five messages, so publishing a batch of 200 took
/// as long as claiming it; with room for a whole batch the thread hands it over and
/// goes back to the database. The queue holds copies of at most about 340 messages
/// (the relay holds the batches in flight anyway); past it, and past the I/O
/// thread's 16 MiB of unwritten data, publishing waits as before.
const PUBLISH_FRAMES: usize = 1024;

/// Opens a connection for publishing.
fn open_publisher(url: &str) -> crate::Result<Connection> {
    super::open(
        url,
        amiquip::ConnectionTuning::default().mem_channel_bound(PUBLISH_FRAMES),
    )
}

/// The relay's RabbitMQ sender: built once, it gives each relay thread a
/// connection and a confirm-mode channel of its own ([`SenderFactory`]).
///
/// ```no_run
/// use std::time::Duration;
/// let sender = txbox::rabbitmq::RabbitSender::builder("amqp://guest:guest@127.0.0.1:5672")
///     .confirm_timeout(Duration::from_secs(10))
///     .build();
/// # let _ = sender;
/// ```
#[derive(Clone)]
pub struct RabbitSender {
    url: String,
    confirm_timeout: Duration,
}

/// Builds a [`RabbitSender`]. Its `Debug` redacts the URL's password.
#[derive(Clone)]
pub struct RabbitSenderBuilder {
    sender: RabbitSender,
}

/// The URL's password is redacted.
impl std::fmt::Debug for RabbitSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSender")
            .field("url", &crate::redact::urls(&self.url))
            .field("confirm_timeout", &self.confirm_timeout)
            .finish()
    }
}

impl std::fmt::Debug for RabbitSenderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RabbitSenderBuilder")
            .field("sender", &self.sender)
            .finish()
    }
}

impl RabbitSender {
    /// A builder for the broker at `url` (`amqp://user:pass@host:port/vhost`).
    pub fn builder(url: &str) -> RabbitSenderBuilder {
        RabbitSenderBuilder {
            sender: RabbitSender {
                url: url.to_string(),
                confirm_timeout: Duration::from_secs(30),
            },
        }
    }
}

impl RabbitSenderBuilder {
    /// Longest wait for the broker's confirms of one batch (default 30s).
    pub fn confirm_timeout(mut self, d: Duration) -> Self {
        self.sender.confirm_timeout = d;
        self
    }

    /// The sender. It connects when a relay thread first needs it.
    pub fn build(self) -> RabbitSender {
        self.sender
    }
}

impl SenderFactory for RabbitSender {
    fn create(&self) -> Result<Box<dyn Sender>> {
        Ok(Box::new(RabbitChannel::new(
            &self.url,
            self.confirm_timeout,
        )))
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
pub(crate) struct RabbitChannel {
    url: String,
    confirm_timeout: Duration,
    open: Option<Open>,
    retry_at: Instant,
    backoff: Duration,
    last_error: String,
    /// Batches started and not yet waited for, oldest first.
    in_flight: VecDeque<Unconfirmed>,
}

impl RabbitChannel {
    /// A sender that connects on its first batch.
    pub(crate) fn new(url: &str, confirm_timeout: Duration) -> Self {
        RabbitChannel {
            url: url.to_string(),
            confirm_timeout,
            open: None,
            retry_at: Instant::now(),
            backoff: MIN_RECONNECT,
            last_error: String::new(),
            in_flight: VecDeque::new(),
        }
    }

    /// The open channel, opening it when the backoff allows; a failure is the
    /// transport's.
    fn connect(&mut self) -> std::result::Result<&mut Open, SendError> {
        if self.open.is_none() {
            let now = Instant::now();
            if now < self.retry_at {
                return Err(SendError::transient(format!(
                    "rabbitmq not connected ({}); next try in {:?}",
                    self.last_error,
                    self.retry_at - now
                )));
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
                    // the events wait (PENDING, no attempt counted): the log
                    // says why, once per try, and the relay is not ready
                    log::warn!(
                        "txbox: rabbitmq sender: {e}; next try in {:?}",
                        self.backoff
                    );
                    self.last_error = e.clone();
                    self.retry_at = now + self.backoff;
                    self.backoff = (self.backoff * 2).min(MAX_RECONNECT);
                    return Err(SendError::transient(format!("rabbitmq connect: {e}")));
                }
            }
        }
        self.open
            .as_mut()
            .ok_or_else(|| SendError::transient("rabbitmq not connected"))
    }

    fn open_channel(url: &str) -> crate::Result<Open> {
        let mut connection = open_publisher(url)?;
        let amqp = |e: amiquip::Error| {
            crate::Error::Broker(format!("rabbitmq: {}", crate::redact::urls(&e.to_string())))
        };
        let channel = connection.open_channel(None).map_err(amqp)?;
        let confirms = channel.listen_for_publisher_confirms().map_err(amqp)?;
        let returns = channel.listen_for_returns().map_err(amqp)?;
        channel.enable_publisher_confirms().map_err(amqp)?;
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
        self.connect().map(|_| ())
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
    let id = e.id.to_string();
    let mut headers = FieldTable::new();
    headers.insert(
        HEADER_EVENT_ID.to_string(),
        AmqpValue::LongString(id.clone()),
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
        .with_message_id(id)
        .with_type_(e.event_type.clone())
        .with_content_type(e.content_type().to_string())
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
                    // RabbitMQ nacks for its own trouble (a full queue with
                    // `x-overflow = reject-publish`, a queue process error):
                    // not the message's fault
                    Err(SendError::transient(
                        "rabbitmq: broker nacked the message (queue full or unavailable)",
                    ))
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

impl RabbitChannel {
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
            Err(why) => {
                batch.broken = Some(why);
                return batch;
            }
        };
        batch.first = open.next_tag;
        for e in events {
            let mut publish =
                Publish::with_properties(&e.payload, e.routing_key.clone(), properties(e));
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
                Err(lost) => {
                    let why = match lost {
                        crossbeam_channel::RecvTimeoutError::Timeout => {
                            SendError::transient(format!(
                                "rabbitmq: no publisher confirm within {:?}",
                                self.confirm_timeout
                            ))
                        }
                        // the channel is gone: its next call tells why (a missing
                        // exchange closes it with 404)
                        crossbeam_channel::RecvTimeoutError::Disconnected => {
                            match open.channel.qos(0, 0, false) {
                                Err(err) => classify("rabbitmq channel closed".into(), &err),
                                Ok(()) => {
                                    SendError::transient("rabbitmq: publisher confirms stopped")
                                }
                            }
                        }
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

crate::sender::pipelined_sender!(RabbitChannel);
