//! A blocking Kafka consumer loop: an offset is committed only after its
//! message's handler returned.

use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::OnceLock;
use std::time::Duration;

use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::message::Message;
use rdkafka::{Offset, TopicPartitionList};

use super::{client_config, creation_err, kafka_err};
use crate::backoff::RetryBackoff;
use crate::consumer::{Position, ReceivedEvent, StopSignal, Verdict};
use crate::error::{Error, Result};

/// A blocking Kafka consumer loop with at-least-once semantics: the offset of a
/// message is committed only after its handler returned `Ok`; a handler error seeks
/// back so the same message is handled again after `retry_delay`.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// use txbox::{kafka::KafkaConsumer, StopSignal};
/// let consumer = KafkaConsumer::builder("127.0.0.1:9092", "billing").build()?;
/// consumer.subscribe(&["orders"])?;
/// let stop = StopSignal::new();
/// consumer.run(&stop, |event| {
///     println!("{:?} {:?}", event.id, event.event_type);
///     Ok::<(), std::io::Error>(())
/// })?;
/// # Ok(()) }
/// ```
pub struct KafkaConsumer {
    consumer: BaseConsumer,
    retry_delay: Duration,
    /// Why the loop stopped on a message it could not rewind to: the consumer's
    /// position is past it, so it never runs again (a new consumer reads from the
    /// committed offset, which is not past it).
    lost_position: OnceLock<String>,
}

/// Builds a [`KafkaConsumer`]. Its `Debug` redacts secret properties.
#[derive(Clone)]
pub struct KafkaConsumerBuilder {
    properties: BTreeMap<String, String>,
    retry_delay: Duration,
}

impl std::fmt::Debug for KafkaConsumerBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaConsumerBuilder")
            .field("properties", &crate::redact::Properties(&self.properties))
            .field("retry_delay", &self.retry_delay)
            .finish()
    }
}

impl KafkaConsumerBuilder {
    /// Sets any librdkafka consumer property.
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Sets every property of the map.
    pub fn properties(mut self, map: &BTreeMap<String, String>) -> Self {
        self.properties
            .extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
        self
    }

    /// Wait before a message whose handler failed is handled again (default 1s).
    pub fn retry_delay(mut self, d: Duration) -> Self {
        self.retry_delay = d;
        self
    }

    /// Creates the consumer (auto commit off: the loop commits).
    pub fn build(mut self) -> Result<KafkaConsumer> {
        self.properties
            .insert("enable.auto.commit".into(), "false".into());
        let config = client_config(&self.properties)?;
        let consumer = config
            .create()
            .map_err(|e| creation_err("consumer", e, &config))?;
        Ok(KafkaConsumer {
            consumer,
            retry_delay: self.retry_delay,
            lost_position: OnceLock::new(),
        })
    }
}

impl KafkaConsumer {
    /// A builder for consumer group `group_id`, reading from the earliest offset when
    /// the group has none committed.
    pub fn builder(bootstrap_servers: &str, group_id: &str) -> KafkaConsumerBuilder {
        let mut properties = BTreeMap::new();
        for (k, v) in [
            ("bootstrap.servers", bootstrap_servers),
            ("group.id", group_id),
            ("auto.offset.reset", "earliest"),
        ] {
            properties.insert(k.to_string(), v.to_string());
        }
        KafkaConsumerBuilder {
            properties,
            retry_delay: Duration::from_secs(1),
        }
    }

    /// Joins the consumer group for these topics (partitions assigned by the group).
    pub fn subscribe(&self, topics: &[&str]) -> Result<()> {
        self.consumer
            .subscribe(topics)
            .map_err(|e| kafka_err("subscribe", e))
    }

    /// Reads these partitions directly, from the group's committed offset (or the
    /// earliest when none): no group rebalance.
    pub fn assign(&self, topic: &str, partitions: &[i32]) -> Result<()> {
        let mut list = TopicPartitionList::new();
        for p in partitions {
            list.add_partition_offset(topic, *p, Offset::Stored)
                .map_err(|e| kafka_err("assign", e))?;
        }
        self.consumer
            .assign(&list)
            .map_err(|e| kafka_err("assign", e))
    }

    /// The partitions of `topic`, from the broker's metadata.
    pub fn partitions(&self, topic: &str, timeout: Duration) -> Result<Vec<i32>> {
        let md = self
            .consumer
            .fetch_metadata(Some(topic), timeout)
            .map_err(|e| kafka_err("metadata", e))?;
        Ok(md
            .topics()
            .iter()
            .filter(|t| t.name() == topic)
            .flat_map(|t| t.partitions().iter().map(|p| p.id()))
            .collect())
    }

    /// Hands every message to `handler` until `stop`. Commits a message's offset only
    /// after `Ok`; on `Err` the error is logged, the partition rewinds to the message
    /// and it is handled again after the retry delay. Broker errors are logged and
    /// polled through; the loop returns when stopped, or with an error when a
    /// message to handle again cannot be rewound (its partition was revoked): it
    /// is never skipped, and nothing past it is committed.
    pub fn run<E, F>(&self, stop: &StopSignal, handler: F) -> Result<()>
    where
        E: Display,
        F: FnMut(&ReceivedEvent) -> Result<(), E>,
    {
        self.run_with(stop, crate::consumer::verdicts(handler))
    }

    /// Like [`KafkaConsumer::run`] with a [`Verdict`] per message: `Ack` commits,
    /// `Retry` rewinds, `Reject` logs at error level and commits past the message
    /// (Kafka has no dead-letter exchange), `Stop` returns
    /// [`Error::ConsumerStopped`] without committing.
    pub fn run_with<F>(&self, stop: &StopSignal, mut handler: F) -> Result<()>
    where
        F: FnMut(&ReceivedEvent) -> Verdict,
    {
        if let Some(why) = self.lost_position.get() {
            return Err(Error::broker(why.clone()));
        }
        // errors in a row (the broker away): waits from 200 ms up to 5 s
        let mut backoff =
            RetryBackoff::doubling(Duration::from_millis(200), Duration::from_secs(5));
        while !stop.is_stopped() {
            let msg = match self.consumer.poll(Duration::from_millis(100)) {
                None => continue,
                Some(Err(e)) => {
                    let wait = backoff.wait();
                    log::warn!("txbox: kafka consumer: {e}; polling again in {wait:?}");
                    stop.sleep(wait);
                    continue;
                }
                Some(Ok(m)) => m,
            };
            backoff.reset();
            let event = ReceivedEvent::from_parts(
                message_headers(&msg),
                msg.key().map(|k| String::from_utf8_lossy(k).into_owned()),
                msg.payload().unwrap_or_default().to_vec(),
                Position::Kafka {
                    topic: msg.topic().to_string(),
                    partition: msg.partition(),
                    offset: msg.offset(),
                },
            );
            match crate::consumer::handle(&event, &mut handler) {
                Verdict::Ack => {}
                Verdict::Reject(why) => log::error!(
                    "txbox: kafka message at {} rejected and skipped: {why}",
                    event.position
                ),
                Verdict::Stop(why) => return Err(Error::ConsumerStopped(why)),
                Verdict::Retry(why) => {
                    log::warn!(
                        "txbox: handler failed at {}: {why}; it will be handled again",
                        event.position
                    );
                    let (topic, partition, offset) =
                        (msg.topic().to_string(), msg.partition(), msg.offset());
                    drop(msg);
                    // A message that cannot be rewound must not be skipped: the
                    // next message's commit would move the offset past it.
                    self.consumer
                        .seek(
                            &topic,
                            partition,
                            Offset::Offset(offset),
                            Duration::from_secs(5),
                        )
                        .map_err(|e| {
                            let err = rewind_failed(&topic, partition, offset, e);
                            let _ = self.lost_position.set(err.to_string());
                            err
                        })?;
                    stop.sleep(self.retry_delay);
                    continue;
                }
            }
            if let Err(e) = self.consumer.commit_message(&msg, CommitMode::Sync) {
                log::warn!(
                    "txbox: kafka commit at {}: {e} (the message may be seen again)",
                    event.position
                );
            }
        }
        Ok(())
    }
}

/// Every header of a consumed message as (name, value), read as bytes and made
/// text lossily. rdkafka's own accessor panics on a header name that is not
/// UTF-8 (any producer may send one), so the headers are read through librdkafka
/// directly. An id header that is not valid UTF-8 or not a UUID then leaves the
/// event without an id, and the missing-id policy decides.
fn message_headers(msg: &rdkafka::message::BorrowedMessage<'_>) -> Vec<(String, String)> {
    use rdkafka::bindings as rd;
    use std::ffi::{c_char, c_void, CStr};
    const OK: rd::rd_kafka_resp_err_t = rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR;
    let mut out = Vec::new();
    let mut headers: *mut rd::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `msg` is a live message of this consumer; the header list it hands
    // out belongs to the message and lives as long as it does.
    if unsafe { rd::rd_kafka_message_headers(msg.ptr(), &mut headers) } != OK || headers.is_null() {
        return out;
    }
    // SAFETY: `headers` is the message's list, checked non-null above.
    let count = unsafe { rd::rd_kafka_header_cnt(headers) };
    for i in 0..count {
        let (mut name, mut value, mut size): (*const c_char, *const c_void, usize) =
            (std::ptr::null(), std::ptr::null(), 0);
        // SAFETY: `i` is below the count; librdkafka fills the three out-pointers
        // with the header's NUL-terminated name and its value and size, owned by
        // the list.
        if unsafe { rd::rd_kafka_header_get_all(headers, i, &mut name, &mut value, &mut size) }
            != OK
            || name.is_null()
        {
            continue;
        }
        // SAFETY: a NUL-terminated name and `size` bytes of value, as above.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let value = if value.is_null() {
            String::new()
        } else {
            // SAFETY: see above.
            let bytes = unsafe { std::slice::from_raw_parts(value.cast::<u8>(), size) };
            String::from_utf8_lossy(bytes).into_owned()
        };
        out.push((name, value));
    }
    out
}

/// The error that stops a consumer loop whose message to retry cannot be rewound.
fn rewind_failed(topic: &str, partition: i32, offset: i64, e: KafkaError) -> Error {
    Error::Broker {
        message: format!(
            "kafka consumer stopped: could not seek back to {topic}/{partition}@{offset} to \
             handle it again ({e}); nothing past it was committed, and this consumer \
             does not run again: create a new one, which reads from the committed offset"
        ),
        source: Some(Box::new(e)),
    }
}
