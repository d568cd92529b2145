//! A blocking RabbitMQ consumer loop: manual ack after the handler returned.

use std::fmt::Display;
use std::time::Duration;

use amiquip::{AmqpValue, Connection, ConsumerMessage, ConsumerOptions};
use crossbeam_channel::select;

use super::{MAX_RECONNECT, MIN_RECONNECT};
use crate::backoff::RetryBackoff;
use crate::consumer::{Position, ReceivedEvent, StopSignal, Verdict};
use crate::error::{Error, Result};
use crate::event::{HEADER_CONTENT_TYPE, HEADER_EVENT_ID};

fn open(url: &str) -> Result<Connection> {
    super::open(url, amiquip::ConnectionTuning::default())
}

fn text(v: &AmqpValue) -> String {
    match v {
        AmqpValue::LongString(s) => s.clone(),
        other => format!("{other:?}"),
    }
}

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
/// use txbox::{rabbitmq::RabbitConsumer, StopSignal};
/// let consumer = RabbitConsumer::builder("amqp://guest:guest@127.0.0.1:5672", "billing-orders")
///     .prefetch(50)
///     .build();
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

/// Builds a [`RabbitConsumer`]. Its `Debug` redacts the URL's password.
#[derive(Clone, Debug)]
pub struct RabbitConsumerBuilder {
    consumer: RabbitConsumer,
}

impl RabbitConsumerBuilder {
    /// Unacked messages the broker may push at once (default 100).
    pub fn prefetch(mut self, n: u16) -> Self {
        self.consumer.prefetch = n.max(1);
        self
    }

    /// What a handler error does to the message (default [`OnError::Requeue`]).
    pub fn on_error(mut self, policy: OnError) -> Self {
        self.consumer.on_error = policy;
        self
    }

    /// Wait after a handler error before the next message (default 500ms), so a
    /// requeued message that keeps failing does not spin.
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.consumer.retry_delay = d;
        self
    }

    /// The consumer. It connects when it runs.
    pub fn build(self) -> RabbitConsumer {
        self.consumer
    }
}

impl RabbitConsumer {
    /// A builder for a consumer of `queue` (which must exist) at `url`.
    pub fn builder(url: &str, queue: &str) -> RabbitConsumerBuilder {
        RabbitConsumerBuilder {
            consumer: RabbitConsumer {
                url: url.to_string(),
                queue: queue.to_string(),
                prefetch: 100,
                on_error: OnError::Requeue,
                retry_delay: Duration::from_millis(500),
            },
        }
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
        let mut backoff = RetryBackoff::doubling(MIN_RECONNECT, MAX_RECONNECT);
        while !stop.is_stopped() {
            match self.session(stop, &mut handler) {
                Ok(()) => return Ok(()),
                Err(e @ Error::ConsumerStopped(_)) => return Err(e),
                Err(e) => {
                    let wait = backoff.wait();
                    log::warn!(
                        "txbox: rabbitmq consumer on {}: {e}; reconnecting in {wait:?}",
                        self.queue
                    );
                    if stop.sleep(wait) {
                        return Ok(());
                    }
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
            Error::broker(format!("rabbitmq: {}", crate::redact::urls(&e.to_string())))
        };
        let mut connection = open(&self.url)?;
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
                    return Err(Error::broker(format!("rabbitmq consumer ended: {other:?}")))
                }
                Err(_) => return Err(Error::broker("rabbitmq consumer channel closed")),
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
            // the property, read as Kafka's header is
            if let Some(content_type) = delivery.properties.content_type() {
                raw.retain(|(k, _)| !k.eq_ignore_ascii_case(HEADER_CONTENT_TYPE));
                raw.push((HEADER_CONTENT_TYPE.to_string(), content_type.clone()));
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
            match crate::consumer::handle(&event, handler) {
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
