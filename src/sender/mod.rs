//! Senders: how the relay hands events to a broker, for those who implement
//! one ([`Sender::start`] and [`Started`] for a broker that pipelines,
//! [`SendErrorKind`] for what a failure means). The crate root re-exports
//! [`Sender`], [`SenderFactory`], [`SendError`] and [`MemorySender`].
//!
//! A relay thread asks its [`SenderFactory`] for one [`Sender`] and keeps it: a
//! thread-safe client (a Kafka producer) hands out clones of one handle, a client
//! that wants one channel per thread (RabbitMQ) opens one per call.

use crate::error::Result;
use crate::event::Event;

mod memory;

pub use memory::MemorySender;

/// The tables of a configuration file that belong to a broker, each read by
/// its broker's module from the same text (`KafkaSender::from_toml`,
/// `RabbitSender::from_toml`): [`Config::from_toml`](crate::Config::from_toml)
/// leaves them alone, whether or not this build has the broker's feature.
pub(crate) const BROKER_SECTIONS: &[&str] = &["kafka", "rabbitmq"];

/// Why one event could not be sent.
///
/// Its [`kind`](SendError::kind) tells the relay whose fault it was: a
/// [`Permanent`](SendErrorKind::Permanent) verdict on this event (unroutable,
/// too large, unknown topic, not authorized) counts an attempt and leads, once the
/// retries are used up, to FAILED and the dead letters; a
/// [`Transient`](SendErrorKind::Transient) transport failure (broker unreachable,
/// connection lost, no confirm in time, a RabbitMQ nack) returns the event to PENDING without
/// counting an attempt, and the poller stops claiming until the sender is
/// [ready](Sender::ready) again. Use it only for what is not the event's fault:
/// an event whose own failure is reported as transient is sent again and again
/// and never reaches the dead letters.
///
/// ```
/// use txbox::sender::{SendError, SendErrorKind};
/// let e = SendError::transient("connection refused");
/// assert_eq!(e.kind, SendErrorKind::Transient);
/// assert!(!SendError::new("unroutable").is_transient());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct SendError {
    /// What the broker or client said.
    pub message: String,
    /// Whose fault it was.
    pub kind: SendErrorKind,
}

/// Whether a failed send is the event's fault ([`SendError::kind`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendErrorKind {
    /// The broker's verdict on this event: counts an attempt.
    Permanent,
    /// The transport failed (the broker is down or unreachable): the event goes
    /// back to PENDING with no attempt counted.
    Transient,
}

impl SendError {
    /// A verdict on this event ([`SendErrorKind::Permanent`]): counts an attempt.
    pub fn new(message: impl Into<String>) -> Self {
        SendError {
            message: message.into(),
            kind: SendErrorKind::Permanent,
        }
    }

    /// A transport failure ([`SendErrorKind::Transient`]): no attempt counted.
    pub fn transient(message: impl Into<String>) -> Self {
        SendError {
            message: message.into(),
            kind: SendErrorKind::Transient,
        }
    }

    /// True for a transport failure ([`SendErrorKind::Transient`]).
    pub fn is_transient(&self) -> bool {
        self.kind == SendErrorKind::Transient
    }
}

impl std::fmt::Display for SendError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for SendError {}

/// What [`Sender::start`] did with a batch.
#[derive(Debug)]
pub enum Started {
    /// The batch is finished: one result per event (a sender that does not
    /// pipeline sends and waits at once).
    Done(Vec<Result<(), SendError>>),
    /// The batch is with the client; [`Sender::wait`] returns its results.
    InFlight,
}

/// Publishes batches of events to a broker and waits for its acks.
///
/// A sender that can have several batches in flight (Kafka, RabbitMQ) implements
/// [`Sender::start`] and [`Sender::wait`] as well, most simply through
/// [`Pipelining`] and [`pipelined_sender!`](crate::pipelined_sender): the relay
/// then claims its next batch from the database while the broker acks the
/// previous one.
pub trait Sender: Send {
    /// Sends `events` (all of one type, in id order) and returns one result per
    /// event, in the same order. `Ok` only once the broker acked that event; an
    /// event that fails fails alone. Must not panic; a panic is caught and the batch
    /// is left to lease recovery.
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>>;

    /// Hands `events` to the broker without waiting for the acks when the sender
    /// can; the default sends and waits ([`Started::Done`]).
    fn start(&mut self, events: &[Event]) -> Started {
        Started::Done(self.send(events))
    }

    /// The results of the oldest batch that [`Sender::start`] left
    /// [`Started::InFlight`], one per event as in [`Sender::send`]. The relay calls it
    /// once per such batch, in start order. Fewer results than events count as
    /// failures of the missing ones (the default returns none).
    fn wait(&mut self) -> Vec<Result<(), SendError>> {
        Vec::new()
    }

    /// Whether the broker can be reached now. The poller asks before every claim
    /// and claims nothing while this fails (it backs off and asks again), so an
    /// outage leaves events PENDING instead of failing them batch after batch. The
    /// default: always ready.
    fn ready(&mut self) -> Result<(), SendError> {
        Ok(())
    }
}

/// A sender that hands a batch to its client without waiting for the acks
/// ([`Pipelining::publish`]) and waits for them later
/// ([`Pipelining::collect`]), as Kafka's and RabbitMQ's senders do. The
/// macro [`pipelined_sender!`](crate::pipelined_sender) makes it a [`Sender`]
/// whose [`start`](Sender::start) publishes and keeps the batch in
/// [`in_flight`](Pipelining::in_flight), and whose [`wait`](Sender::wait)
/// collects the oldest: the relay then claims its next batches while the
/// broker acks the first (`in_flight` in the event settings).
///
/// ```
/// use std::collections::VecDeque;
/// use txbox::sender::Pipelining;
/// use txbox::{Event, SendError};
///
/// /// A broker client that answers each batch later (here: at once).
/// #[derive(Default)]
/// struct MyBroker {
///     in_flight: VecDeque<Vec<txbox::EventId>>,
/// }
///
/// impl Pipelining for MyBroker {
///     type Batch = Vec<txbox::EventId>;
///     fn publish(&mut self, events: &[Event]) -> Self::Batch {
///         events.iter().map(|e| e.id).collect() // hand them to the client here
///     }
///     fn collect(&mut self, batch: Self::Batch) -> Vec<Result<(), SendError>> {
///         batch.iter().map(|_| Ok(())).collect() // wait for each ack here
///     }
///     fn in_flight(&mut self) -> &mut VecDeque<Self::Batch> {
///         &mut self.in_flight
///     }
/// }
/// txbox::pipelined_sender!(MyBroker);
///
/// use txbox::Sender;
/// let mut sender = MyBroker::default();
/// assert!(sender.send(&[]).is_empty());
/// ```
pub trait Pipelining: Send {
    /// What [`publish`](Pipelining::publish) returns of one batch, for
    /// [`collect`](Pipelining::collect) to wait on.
    type Batch: Send;

    /// Hands `events` (all of one type, in id order) to the client without
    /// waiting for their acks.
    fn publish(&mut self, events: &[Event]) -> Self::Batch;

    /// Waits for the acks of `batch`: one result per event, in order, as
    /// [`Sender::send`] returns them. Batches are collected in the order they
    /// were published.
    fn collect(&mut self, batch: Self::Batch) -> Vec<Result<(), SendError>>;

    /// [`Sender::ready`]: whether the broker can be reached now. The default:
    /// always.
    fn check(&mut self) -> Result<(), SendError> {
        Ok(())
    }

    /// The batches published and not yet collected, oldest first, which the
    /// sender keeps (a field of its own).
    fn in_flight(&mut self) -> &mut std::collections::VecDeque<Self::Batch>;
}

/// Implements [`Sender`](crate::Sender) for a type that implements
/// [`Pipelining`](crate::sender::Pipelining): `send` publishes and collects
/// at once, `start` publishes and keeps the batch in flight, `wait` collects
/// the oldest, `ready` is `check`. (A macro, not a blanket impl, so that a
/// type can still implement `Sender` by hand.)
#[macro_export]
macro_rules! pipelined_sender {
    ($t:ty) => {
        impl $crate::Sender for $t {
            fn send(
                &mut self,
                events: &[$crate::Event],
            ) -> ::std::vec::Vec<::std::result::Result<(), $crate::SendError>> {
                let batch = $crate::sender::Pipelining::publish(self, events);
                $crate::sender::Pipelining::collect(self, batch)
            }

            fn start(&mut self, events: &[$crate::Event]) -> $crate::sender::Started {
                let batch = $crate::sender::Pipelining::publish(self, events);
                $crate::sender::Pipelining::in_flight(self).push_back(batch);
                $crate::sender::Started::InFlight
            }

            fn wait(&mut self) -> ::std::vec::Vec<::std::result::Result<(), $crate::SendError>> {
                match $crate::sender::Pipelining::in_flight(self).pop_front() {
                    ::std::option::Option::Some(batch) => {
                        $crate::sender::Pipelining::collect(self, batch)
                    }
                    ::std::option::Option::None => ::std::vec::Vec::new(),
                }
            }

            fn ready(&mut self) -> ::std::result::Result<(), $crate::SendError> {
                $crate::sender::Pipelining::check(self)
            }
        }
    };
}

/// Makes a [`Sender`] for each relay thread.
pub trait SenderFactory: Send + Sync + 'static {
    /// A sender for one thread. An error here (broker unreachable) is logged and
    /// retried with backoff; no event is claimed meanwhile.
    fn create(&self) -> Result<Box<dyn Sender>>;

    /// The longest its senders wait for the broker's acks of one batch (Kafka's
    /// delivery timeout plus a margin, RabbitMQ's confirm timeout), when bounded.
    /// [`Relay::start`](crate::Relay::start) refuses a lease shorter than this: a
    /// batch still waiting for its acks would be recovered and sent again while
    /// in flight. The default: not known.
    fn ack_wait(&self) -> Option<std::time::Duration> {
        None
    }

    /// Why the broker cannot take `destination` (an event type's topic or
    /// exchange), or `Ok`. [`Relay::start`](crate::Relay::start) asks for each
    /// event type and refuses to start on an error, naming the type: a
    /// destination no broker can have would otherwise fail every event of
    /// the type at send. The default: every destination is fine.
    fn check_destination(&self, destination: &str) -> std::result::Result<(), String> {
        let _ = destination;
        Ok(())
    }

    /// Refuses settings of the sender's own that name an event type not in
    /// `event_types` (the relay's configuration), with an error naming the
    /// setting (RabbitMQ's `rabbitmq.routing_keys.<type>`).
    /// [`Relay::start`](crate::Relay::start) asks once. The default: fine.
    fn check_event_types(&self, event_types: &[&str]) -> Result<()> {
        let _ = event_types;
        Ok(())
    }
}

impl<F> SenderFactory for F
where
    F: Fn() -> Result<Box<dyn Sender>> + Send + Sync + 'static,
{
    fn create(&self) -> Result<Box<dyn Sender>> {
        self()
    }
}

impl<S: Sender + ?Sized> Sender for Box<S> {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        (**self).send(events)
    }
    fn start(&mut self, events: &[Event]) -> Started {
        (**self).start(events)
    }
    fn wait(&mut self) -> Vec<Result<(), SendError>> {
        (**self).wait()
    }
    fn ready(&mut self) -> Result<(), SendError> {
        (**self).ready()
    }
}
