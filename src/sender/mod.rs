//! Senders: how the relay hands events to a broker.
//!
//! A relay thread asks its [`SenderFactory`] for one [`Sender`] and keeps it: a
//! thread-safe client (a Kafka producer) hands out clones of one handle, a client
//! that wants one channel per thread (RabbitMQ) opens one per call.

use crate::error::Result;
use crate::event::Event;

mod memory;

pub use memory::MemorySender;

/// Why one event could not be sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendError {
    /// What the broker or client said.
    pub message: String,
}

impl SendError {
    /// A failure with its reason.
    pub fn new(message: impl Into<String>) -> Self {
        SendError {
            message: message.into(),
        }
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
/// [`Sender::start`] and [`Sender::wait`] as well: the relay then claims its next
/// batch from the database while the broker acks the previous one.
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
}

/// Implements [`Sender`] for a pipelining sender with a field `in_flight` (a queue
/// of its batches) and two methods: `publish(&events) -> batch`, which hands a batch
/// to the client without waiting, and `collect(batch) -> results`, which waits for
/// its acks.
#[cfg_attr(
    not(any(feature = "kafka", feature = "rabbitmq")),
    allow(unused_macros)
)]
macro_rules! pipelined_sender {
    ($t:ty) => {
        impl $crate::sender::Sender for $t {
            fn send(
                &mut self,
                events: &[$crate::Event],
            ) -> Vec<Result<(), $crate::sender::SendError>> {
                let batch = self.publish(events);
                self.collect(batch)
            }

            fn start(&mut self, events: &[$crate::Event]) -> $crate::sender::Started {
                let batch = self.publish(events);
                self.in_flight.push_back(batch);
                $crate::sender::Started::InFlight
            }

            fn wait(&mut self) -> Vec<Result<(), $crate::sender::SendError>> {
                match self.in_flight.pop_front() {
                    Some(batch) => self.collect(batch),
                    None => Vec::new(),
                }
            }
        }
    };
}
#[cfg_attr(
    not(any(feature = "kafka", feature = "rabbitmq")),
    allow(unused_imports)
)]
pub(crate) use pipelined_sender;

/// Makes a [`Sender`] for each relay thread.
pub trait SenderFactory: Send + Sync + 'static {
    /// A sender for one thread. An error here (broker unreachable) is logged and
    /// retried with backoff; no event is claimed meanwhile.
    fn create(&self) -> Result<Box<dyn Sender>>;
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
}
