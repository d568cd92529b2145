//! The relay's RabbitMQ sender on one relay thread: one connection and one
//! confirm-mode channel of its own, its batches in flight and their confirms.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};

use amiquip::{
    AmqpProperties, AmqpValue, Channel, Confirm, Connection, FieldTable, Publish, Return,
};
use crossbeam_channel::Receiver;

use super::factory::{RabbitSender, Routes};
use super::{FRAME_MAX, MAX_RECONNECT, MIN_RECONNECT};
use crate::backoff::RetryBackoff;
use crate::error::Result;
use crate::event::{Event, HEADER_EVENT_ID, HEADER_EVENT_KEY, HEADER_EVENT_TYPE};
use crate::sender::{Pipelining, SendError};

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
    /// Each event type's routing key ([`RabbitSender::routing_key`]).
    routes: Arc<Routes>,
    confirm_timeout: Duration,
    /// The largest body published: the builder's, or the lower limit the
    /// broker named when it refused a message.
    max_message: usize,
    open: Option<Open>,
    retry_at: Instant,
    backoff: RetryBackoff,
    last_error: String,
    /// Batches started and not yet waited for, oldest first.
    in_flight: VecDeque<Unconfirmed>,
}

impl RabbitChannel {
    /// A sender that connects on its first batch.
    pub(super) fn new(sender: &RabbitSender) -> Self {
        RabbitChannel {
            url: sender.url.clone(),
            routes: Arc::clone(&sender.routes),
            confirm_timeout: sender.confirm_timeout,
            max_message: sender.max_message_size,
            open: None,
            retry_at: Instant::now(),
            backoff: RetryBackoff::doubling(MIN_RECONNECT, MAX_RECONNECT),
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
                    self.backoff.reset();
                    self.open = Some(o);
                    log::info!("txbox: rabbitmq sender connected");
                }
                Err(e) => {
                    // amiquip's connect errors name the URL, password included
                    let e = crate::redact::urls(&e.to_string());
                    // the events wait (PENDING, no attempt counted): the log
                    // says why, once per try, and the relay is not ready
                    let wait = self.backoff.wait();
                    log::warn!("txbox: rabbitmq sender: {e}; next try in {wait:?}");
                    self.last_error = e.clone();
                    self.retry_at = now + wait;
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
            crate::Error::broker(format!("rabbitmq: {}", crate::redact::urls(&e.to_string())))
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

    /// Closes the channel; the unconfirmed messages of the batches in flight
    /// get the verdict of `why`.
    fn drop_connection(&mut self, why: &Breakage) {
        for b in &mut self.in_flight {
            b.break_off(why);
        }
        if let Blame::BodyOver(limit) = why.blame {
            self.max_message = self.max_message.min(limit);
        }
        if self.open.take().is_some() {
            log::warn!("txbox: rabbitmq sender: {}; reconnecting", why.error);
            self.last_error = why.error.message.clone();
            self.retry_at = Instant::now() + self.backoff.wait();
        }
    }
}

/// Why a channel broke, and whose fault that is for each message it left
/// unconfirmed.
struct Breakage {
    error: SendError,
    blame: Blame,
}

/// Which unconfirmed messages a broken channel is the fault of.
#[derive(Clone, Copy)]
enum Blame {
    /// None: the transport failed (no attempt counted).
    Nobody,
    /// Every one: the destination refused them all (a missing exchange, access
    /// refused), counted as an attempt each.
    Every,
    /// The ones whose body is over this many bytes (the broker's
    /// `max_message_size`); the others go back without an attempt.
    BodyOver(usize),
    /// The ones whose content header frame is over this many bytes (a frame
    /// the broker refused as too large); the others go back.
    HeaderOver(usize),
}

impl Breakage {
    fn transport(error: SendError) -> Self {
        Breakage {
            error,
            blame: Blame::Nobody,
        }
    }

    /// The verdict on a published, unconfirmed message of `sizes` (body, header).
    fn verdict(&self, (body, header): (usize, usize)) -> SendError {
        let guilty = match self.blame {
            Blame::Nobody => false,
            Blame::Every => true,
            Blame::BodyOver(limit) => body > limit,
            Blame::HeaderOver(limit) => header > limit,
        };
        if guilty {
            SendError::new(self.error.message.clone())
        } else if matches!(self.blame, Blame::Nobody) {
            self.error.clone()
        } else {
            SendError::transient(format!(
                "{} (another message's fault: this one goes back)",
                self.error.message
            ))
        }
    }
}

/// The smallest frame every AMQP broker takes: a content header over it is
/// what a frame error (501) blames.
const FRAME_MIN: usize = 4096;

/// Whose fault a channel or connection error is: the server closes a channel
/// for what was sent on it: 406 for a message over its size limit (that
/// message's fault alone), 404 a missing exchange, 403 access refused (the
/// destination's: every message's). It closes the connection with 501 for a
/// frame too large (the message with the large header). Anything else (a lost,
/// refused or forced-closed connection) is the transport's.
fn classify(context: String, err: &amiquip::Error) -> Breakage {
    // amiquip's errors may name the URL, password included
    let text = format!("{context}: {}", crate::redact::urls(&err.to_string()));
    let blame = match err {
        amiquip::Error::ServerClosedChannel {
            code: 406, message, ..
        } => match size_limit(message) {
            Some(limit) => Blame::BodyOver(limit),
            None => Blame::Every,
        },
        amiquip::Error::ServerClosedChannel { .. } => Blame::Every,
        amiquip::Error::ServerClosedConnection { code: 501, .. } => Blame::HeaderOver(FRAME_MIN),
        _ => Blame::Nobody,
    };
    let error = match blame {
        Blame::Nobody => SendError::transient(text),
        _ => SendError::new(text),
    };
    Breakage { error, blame }
}

/// The limit in RabbitMQ's refusal of a message for its size ("message size
/// 3145728 is larger than configured max size 2097152").
fn size_limit(message: &str) -> Option<usize> {
    let (_, after) = message.split_once("max size ")?;
    let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The bytes of the content-header frame that carries `e`'s properties
/// ([`properties`]), as AMQP 0-9-1 encodes them.
fn header_frame_bytes(e: &Event) -> usize {
    let short = |s: &str| 1 + s.len();
    // a table entry: name (short string), type tag, long string
    let entry = |k: &str, v: &str| short(k) + 1 + 4 + v.len();
    let id = 36;
    let mut table = 4 + short(HEADER_EVENT_ID) + 5 + id + entry(HEADER_EVENT_TYPE, &e.event_type);
    if let Some(key) = &e.key {
        table += entry(HEADER_EVENT_KEY, key);
    }
    table += e.headers.iter().map(|(k, v)| entry(k, v)).sum::<usize>();
    // frame header and end, class, weight, body size, flags; then the
    // properties: message id, type, content type, delivery mode, headers
    8 + 14 + (1 + id) + short(&e.event_type) + short(e.content_type()) + 1 + table
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

/// A batch published on the current channel, waiting for its confirms (the
/// [`Pipelining::Batch`] of RabbitMQ's sender).
pub struct Unconfirmed {
    /// Delivery tag of the first message published; the others follow in order.
    first: u64,
    /// The event (index into `results`) of each message published: tag
    /// `first + n` is event `published[n]` (an event refused before
    /// publishing has no tag).
    published: Vec<usize>,
    /// Event ids (each message's id), to match returns.
    ids: Vec<crate::EventId>,
    /// Each event's body and content-header frame bytes, for a broken
    /// channel's verdict.
    sizes: Vec<(usize, usize)>,
    results: Vec<Option<Result<(), SendError>>>,
    deadline: Instant,
    /// The channel broke: every message has its verdict, no confirm applies.
    broken: bool,
}

impl Unconfirmed {
    /// Applies the broker's confirm of tags `from..=upto` (of the current channel:
    /// a broken batch's tags belonged to a closed one).
    fn confirm(&mut self, from: u64, upto: u64, ok: bool) {
        if self.broken {
            return;
        }
        let last = self.first + self.published.len() as u64;
        for tag in from.max(self.first)..(upto + 1).min(last) {
            let slot = &mut self.results[self.published[(tag - self.first) as usize]];
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

    /// The channel broke for `why`: each message published and not yet
    /// settled gets its verdict, each one not published goes back.
    fn break_off(&mut self, why: &Breakage) {
        if self.broken {
            return;
        }
        self.broken = true;
        for &i in &self.published {
            if self.results[i].is_none() {
                self.results[i] = Some(Err(why.verdict(self.sizes[i])));
            }
        }
        for slot in self.results.iter_mut().filter(|r| r.is_none()) {
            *slot = Some(Err(SendError::transient(format!(
                "not published: {}",
                why.error.message
            ))));
        }
    }

    fn into_results(self) -> Vec<Result<(), SendError>> {
        self.results
            .into_iter()
            .map(|r| {
                r.unwrap_or_else(|| Err(SendError::transient("rabbitmq: no publisher confirm")))
            })
            .collect()
    }
}

impl RabbitChannel {
    /// Publishes `events` on the channel (opening it if needed) without waiting.
    fn publish_batch(&mut self, events: &[Event]) -> Unconfirmed {
        let mut batch = Unconfirmed {
            first: 0,
            published: Vec::with_capacity(events.len()),
            ids: events.iter().map(|e| e.id).collect(),
            sizes: events
                .iter()
                .map(|e| (e.payload.len(), header_frame_bytes(e)))
                .collect(),
            results: vec![None; events.len()],
            deadline: Instant::now() + self.confirm_timeout,
            broken: false,
        };
        // what the broker would refuse by closing the channel (or the
        // connection) fails alone here, unpublished
        for (i, &(body, header)) in batch.sizes.iter().enumerate() {
            if body > self.max_message {
                batch.results[i] = Some(Err(SendError::new(format!(
                    "rabbitmq: the message is {body} bytes, over the broker's max message size of {} bytes \
                     (RabbitSenderBuilder::max_message_size, RabbitMQ's max_message_size)",
                    self.max_message
                ))));
            } else if header > FRAME_MAX {
                batch.results[i] = Some(Err(SendError::new(format!(
                    "rabbitmq: the message's content header is {header} bytes, over one frame \
                     (frame_max {FRAME_MAX} bytes): fewer or shorter headers"
                ))));
            }
        }
        // the keys by a handle of their own: the open channel borrows the sender
        let routes = Arc::clone(&self.routes);
        let open = match self.connect() {
            Ok(o) => o,
            Err(why) => {
                batch.break_off(&Breakage::transport(why));
                return batch;
            }
        };
        batch.first = open.next_tag;
        for (i, e) in events.iter().enumerate() {
            if batch.results[i].is_some() {
                continue;
            }
            let routing_key = routes.key(&e.event_type);
            let mut publish =
                Publish::with_properties(&e.payload, routing_key.to_owned(), properties(e));
            publish.mandatory = true;
            if let Err(err) = open.channel.basic_publish(e.destination.clone(), publish) {
                let why = classify(
                    format!("rabbitmq publish to exchange {:?}", e.destination),
                    &err,
                );
                // what the broker confirmed or returned before it closed the
                // channel stands: only the rest gets the verdict
                if let Some(open) = &self.open {
                    Self::absorb(open, &mut batch, &mut self.in_flight);
                }
                batch.break_off(&why);
                self.drop_connection(&why);
                return batch;
            }
            open.next_tag += 1;
            batch.published.push(i);
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
    fn collect_batch(&mut self, mut batch: Unconfirmed) -> Vec<Result<(), SendError>> {
        while !batch.settled() && !batch.broken {
            let Some(open) = &self.open else {
                batch.break_off(&Breakage::transport(SendError::transient(
                    "rabbitmq: connection lost before the confirms",
                )));
                break;
            };
            let wait = batch.deadline.saturating_duration_since(Instant::now());
            let confirm = open.confirms.recv_timeout(wait);
            Self::apply_returns(open, &mut batch, &mut self.in_flight);
            match confirm {
                Ok(c) => Self::apply_confirm(c, &mut batch, &mut self.in_flight),
                Err(lost) => {
                    let why = match lost {
                        crossbeam_channel::RecvTimeoutError::Timeout => {
                            Breakage::transport(SendError::transient(format!(
                                "rabbitmq: no publisher confirm within {:?}",
                                self.confirm_timeout
                            )))
                        }
                        // the channel is gone: its next call tells why (a missing
                        // exchange closes it with 404)
                        crossbeam_channel::RecvTimeoutError::Disconnected => {
                            match open.channel.qos(0, 0, false) {
                                Err(err) => classify("rabbitmq channel closed".into(), &err),
                                Ok(()) => Breakage::transport(SendError::transient(
                                    "rabbitmq: publisher confirms stopped",
                                )),
                            }
                        }
                    };
                    batch.break_off(&why);
                    self.drop_connection(&why);
                    break;
                }
            }
        }
        if let Some(open) = &self.open {
            Self::apply_returns(open, &mut batch, &mut self.in_flight);
        }
        batch.into_results()
    }

    /// Applies the returns and confirms the broker has sent so far to `batch`
    /// and `later` (returns first: the broker sends a message's return before
    /// its ack).
    fn absorb(open: &Open, batch: &mut Unconfirmed, later: &mut VecDeque<Unconfirmed>) {
        loop {
            Self::apply_returns(open, batch, later);
            match open.confirms.try_recv() {
                Ok(c) => Self::apply_confirm(c, batch, later),
                Err(_) => return,
            }
        }
    }

    /// Applies one confirm (of one tag, or of every tag up to it) to `batch`
    /// and `later`.
    fn apply_confirm(c: Confirm, batch: &mut Unconfirmed, later: &mut VecDeque<Unconfirmed>) {
        let (payload, ok) = match c {
            Confirm::Ack(p) => (p, true),
            Confirm::Nack(p) => (p, false),
        };
        let upto = payload.delivery_tag;
        let from = if payload.multiple { 0 } else { upto };
        batch.confirm(from, upto, ok);
        for b in later.iter_mut() {
            b.confirm(from, upto, ok);
        }
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

impl Pipelining for RabbitChannel {
    type Batch = Unconfirmed;

    fn publish(&mut self, events: &[Event]) -> Unconfirmed {
        self.publish_batch(events)
    }

    fn collect(&mut self, batch: Unconfirmed) -> Vec<Result<(), SendError>> {
        self.collect_batch(batch)
    }

    /// [`Sender::ready`]: connected, or connecting now succeeds (with backoff
    /// between tries).
    fn check(&mut self) -> std::result::Result<(), SendError> {
        self.connect().map(|_| ())
    }

    fn in_flight(&mut self) -> &mut VecDeque<Unconfirmed> {
        &mut self.in_flight
    }
}

crate::pipelined_sender!(RabbitChannel);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limit_is_read_from_rabbitmqs_refusal() {
        let refusal =
            "PRECONDITION_FAILED - message size 3145728 is larger than configured max size 2097152";
        assert_eq!(size_limit(refusal), Some(2_097_152));
        let default =
            "PRECONDITION_FAILED - message size 200000000 is larger than max size 134217728";
        assert_eq!(size_limit(default), Some(134_217_728));
        assert_eq!(size_limit("PRECONDITION_FAILED - inequivalent arg"), None);
    }

    #[test]
    fn a_verdict_blames_only_the_guilty_message() {
        let over = Breakage {
            error: SendError::new("406"),
            blame: Blame::BodyOver(100),
        };
        assert!(!over.verdict((101, 10)).is_transient());
        assert!(over.verdict((100, 10)).is_transient());
        let frame = Breakage {
            error: SendError::new("501"),
            blame: Blame::HeaderOver(FRAME_MIN),
        };
        assert!(!frame.verdict((1, FRAME_MIN + 1)).is_transient());
        assert!(frame.verdict((1_000_000, 300)).is_transient());
        let lost = Breakage::transport(SendError::transient("reset"));
        assert!(lost.verdict((1 << 30, 1 << 20)).is_transient());
    }
}
