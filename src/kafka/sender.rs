//! The relay's Kafka sender: one idempotent producer, each record confirmed by
//! its own delivery report.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use rdkafka::config::ClientConfig;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{DeliveryResult, Header, OwnedHeaders};
use rdkafka::producer::{BaseRecord, Producer, ProducerContext, ThreadedProducer};
use rdkafka::ClientContext;

use super::{client_config, creation_err, DEFAULT_MESSAGE_TIMEOUT, MAX_MESSAGE_TIMEOUT_MS};
use crate::backoff::RetryBackoff;
use crate::error::{Error, Result};
use crate::event::{Event, HEADER_CONTENT_TYPE, HEADER_EVENT_ID, HEADER_EVENT_TYPE};
use crate::sender::{Pipelining, SendError, Sender, SenderFactory};

/// Errors after which the idempotent producer cannot go on (a broker that forgot
/// or replaced its producer id, e.g. after a restart or a long freeze): the
/// producer is replaced, and the records are the transport's failure.
fn producer_state_lost(code: RDKafkaErrorCode) -> bool {
    use RDKafkaErrorCode as C;
    matches!(
        code,
        C::ProducerFenced
            | C::InvalidProducerEpoch
            | C::UnknownProducerId
            | C::OutOfOrderSequenceNumber
            | C::InvalidProducerIdMapping
            | C::Fenced
    )
}

/// A failed record as a [`SendError`]: the broker's verdicts on the record itself
/// (too large, invalid, unknown topic or partition, not authorized, refused by a
/// policy) count an attempt; everything else is the transport's (timeouts, brokers
/// down or unreachable, leaders moving, a full local queue) and counts none.
fn send_error(message: String, code: Option<RDKafkaErrorCode>) -> SendError {
    use RDKafkaErrorCode as C;
    match code {
        Some(
            C::MessageSizeTooLarge
            | C::InvalidMessageSize
            | C::InvalidMessage
            | C::BadMessage
            | C::MessageBatchTooLarge
            | C::UnknownTopic
            | C::UnknownTopicOrPartition
            | C::UnknownPartition
            | C::InvalidTopic
            | C::TopicAuthorizationFailed
            | C::ClusterAuthorizationFailed
            | C::PolicyViolation
            | C::InvalidTimestamp
            | C::InvalidRecord
            | C::UnsupportedForMessageFormat,
        ) => SendError::new(message),
        _ => SendError::transient(message),
    }
}

/// One slot per record of a batch, and how many are filled.
type Slots = (Vec<Option<Result<(), SendError>>>, usize);

/// The results of one batch, filled in by delivery reports.
struct Batch {
    results: Mutex<Slots>,
    done: Condvar,
    timeouts: AtomicUsize,
    /// A report said the producer's idempotence state is no longer valid (fenced,
    /// unknown producer id, sequence out of order): only a new producer gets on.
    fenced: AtomicBool,
}

impl Batch {
    fn set(&self, index: usize, result: Result<(), SendError>) {
        let mut g = self.results.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = g.0.get_mut(index) {
            if slot.is_none() {
                *slot = Some(result);
                g.1 += 1;
            }
        }
        self.done.notify_all();
    }

    /// Waits until `n` reports are in or the deadline passes; returns how many are in.
    fn wait_all(&self, n: usize, deadline: Instant) -> usize {
        let mut g = self.results.lock().unwrap_or_else(|p| p.into_inner());
        while g.1 < n {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            g = match self.done.wait_timeout(g, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        g.1
    }
}

/// Routes each delivery report to its batch slot.
struct Reports;

impl ClientContext for Reports {}

impl ProducerContext for Reports {
    type DeliveryOpaque = Box<(Arc<Batch>, usize)>;

    fn delivery(&self, result: &DeliveryResult<'_>, opaque: Self::DeliveryOpaque) {
        let (batch, index) = *opaque;
        let outcome = match result {
            Ok(_) => Ok(()),
            Err((e, _)) => {
                let code = e.rdkafka_error_code();
                if code == Some(RDKafkaErrorCode::MessageTimedOut) {
                    batch.timeouts.fetch_add(1, Ordering::Relaxed);
                }
                if code.is_some_and(producer_state_lost) {
                    batch.fenced.store(true, Ordering::Relaxed);
                }
                Err(send_error(format!("kafka delivery failed: {e}"), code))
            }
        };
        batch.set(index, outcome);
    }
}

/// The relay's Kafka sender: one thread-safe idempotent producer shared by every
/// relay thread (clones share it).
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// let sender = txbox::kafka::KafkaSender::builder("127.0.0.1:9092")
///     .property("compression.type", "lz4")
///     .build()?;
/// # let _ = sender; Ok(()) }
/// ```
pub struct KafkaSender {
    shared: Arc<Shared>,
    /// Batches started and not yet waited for, oldest first (per clone).
    in_flight: VecDeque<Pending>,
}

/// A clone shares the producer, not the batches in flight.
impl Clone for KafkaSender {
    fn clone(&self) -> Self {
        KafkaSender {
            shared: self.shared.clone(),
            in_flight: VecDeque::new(),
        }
    }
}

/// A batch with the producer (`KafkaSender`'s [`Pipelining::Batch`]).
pub struct Pending {
    batch: Arc<Batch>,
    len: usize,
    deadline: Instant,
    generation: u64,
}

/// Batches in a row whose every record timed out before the producer is replaced.
const REBUILD_AFTER: usize = 3;

struct Shared {
    config: ClientConfig,
    timed_out_batches: AtomicUsize,
    /// A batch failed for the transport: [`Sender::ready`] asks the brokers for
    /// metadata before the next claim.
    unreachable: AtomicBool,
    producer: RwLock<(u64, ThreadedProducer<Reports>)>,
    wait: Duration,
}

/// Builds a [`KafkaSender`]. Its `Debug` redacts secret properties.
#[derive(Clone)]
pub struct KafkaSenderBuilder {
    properties: BTreeMap<String, String>,
}

impl std::fmt::Debug for KafkaSenderBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KafkaSenderBuilder")
            .field("properties", &crate::redact::Properties(&self.properties))
            .finish()
    }
}

impl KafkaSenderBuilder {
    /// Sets any librdkafka producer property (overrides txbox's defaults).
    pub fn property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.properties.insert(key.into(), value.into());
        self
    }

    /// Sets every property of the map (e.g. from [`properties_from_toml`](super::properties_from_toml)).
    pub fn properties(mut self, map: &BTreeMap<String, String>) -> Self {
        self.properties
            .extend(map.iter().map(|(k, v)| (k.clone(), v.clone())));
        self
    }

    /// Creates the producer. Fails on a bad property (named in the error).
    pub fn build(self) -> Result<KafkaSender> {
        refuse_unsafe(&self.properties)?;
        // librdkafka's alias: the one set last wins there; two that differ
        // are refused here rather than guessed
        let timeouts: Vec<(&str, &String)> = ["message.timeout.ms", "delivery.timeout.ms"]
            .into_iter()
            .filter_map(|k| Some((k, self.properties.get(k)?)))
            .collect();
        if let [(a, x), (b, y)] = timeouts.as_slice() {
            if x != y {
                return Err(Error::config(
                    format!("kafka.{b}"),
                    format!("is {y:?} while its alias {a} is {x:?}: set one"),
                ));
            }
        }
        let timeout_ms: u64 = match timeouts.first() {
            Some((k, v)) => v
                .parse()
                .ok()
                // 0 is "no limit" to librdkafka: a batch would wait forever
                .filter(|ms| (1..=MAX_MESSAGE_TIMEOUT_MS).contains(ms))
                .ok_or_else(|| {
                    Error::config(
                        format!("kafka.{k}"),
                        format!(
                            "must be a number of milliseconds from 1 to {MAX_MESSAGE_TIMEOUT_MS}, not {v:?}"
                        ),
                    )
                })?,
            None => DEFAULT_MESSAGE_TIMEOUT.as_millis() as u64,
        };
        let defaulted = timeouts.is_empty();
        let mut properties = self.properties;
        if defaulted {
            properties.insert("message.timeout.ms".into(), timeout_ms.to_string());
        }
        let config = client_config(&properties)?;
        let producer = config
            .create_with_context(Reports)
            .map_err(|e| creation_err("producer", e, &config))?;
        Ok(KafkaSender {
            shared: Arc::new(Shared {
                config,
                timed_out_batches: AtomicUsize::new(0),
                unreachable: AtomicBool::new(false),
                producer: RwLock::new((0, producer)),
                wait: Duration::from_millis(timeout_ms) + Duration::from_secs(5),
            }),
            in_flight: VecDeque::new(),
        })
    }
}

/// Refuses settings under which the broker acks a record before it is safe:
/// a row would become PROCESSED for a record a broker failure can lose
/// (`acks` other than `all`), or a retried send could write a record twice
/// or out of its key's order (`enable.idempotence` off).
fn refuse_unsafe(properties: &BTreeMap<String, String>) -> Result<()> {
    for key in ["acks", "request.required.acks"] {
        if let Some(v) = properties.get(key) {
            if !matches!(v.trim(), "all" | "-1") {
                return Err(Error::config(
                    format!("kafka.{key}"),
                    format!(
                        "is {v:?}: txbox marks an event sent only once every in-sync replica has it, \
                         so it must be \"all\" (or -1)"
                    ),
                ));
            }
        }
    }
    match properties.get("enable.idempotence") {
        Some(v) if v.trim() != "true" => Err(Error::config(
            "kafka.enable.idempotence",
            format!(
                "is {v:?}: it must be true, or a retried send could write an event twice or out \
                 of its key's order"
            ),
        )),
        _ => Ok(()),
    }
}

/// Why `name` is no Kafka topic name (1 to 249 ASCII letters, digits, `.`,
/// `_` and `-`, and neither `.` nor `..`), or `None`.
fn topic_name_error(name: &str) -> Option<String> {
    if name.is_empty() || name.len() > 249 {
        return Some(format!(
            "is {} bytes: a Kafka topic name has 1 to 249",
            name.len()
        ));
    }
    if name == "." || name == ".." {
        return Some(format!("{name:?} cannot be a Kafka topic name"));
    }
    let bad = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')))?;
    Some(format!(
        "{:?} has {bad:?}: a Kafka topic name has only ASCII letters, digits, '.', '_' and '-'",
        name.escape_debug().to_string()
    ))
}

impl KafkaSender {
    /// A builder with txbox's producer defaults: `acks=all`,
    /// `enable.idempotence=true`, `message.timeout.ms=30000`, `linger.ms=1`.
    ///
    /// `linger.ms` is librdkafka's default of 5 ms cut to 1: the relay hands a
    /// whole batch over at once and then waits for its acks, so lingering to fill
    /// a request only delays every batch (0 sends the first records of a batch
    /// alone, in requests of their own).
    pub fn builder(bootstrap_servers: &str) -> KafkaSenderBuilder {
        let mut properties = BTreeMap::new();
        for (k, v) in [
            ("bootstrap.servers", bootstrap_servers),
            ("acks", "all"),
            ("enable.idempotence", "true"),
            ("linger.ms", "1"),
        ] {
            properties.insert(k.to_string(), v.to_string());
        }
        KafkaSenderBuilder { properties }
    }

    /// A sender from the `[kafka]` table of a configuration file (see
    /// [`properties_from_toml`](super::properties_from_toml)), which must set
    /// `bootstrap.servers`.
    pub fn from_toml(text: &str) -> Result<KafkaSender> {
        let properties = super::properties_from_toml(text)?;
        let servers = properties
            .get("bootstrap.servers")
            .ok_or_else(|| Error::config("kafka.bootstrap.servers", "must be set"))?;
        Self::builder(servers).properties(&properties).build()
    }

    /// Replaces a producer that hit a fatal error or is stuck; `generation` tells
    /// whether another thread replaced it already.
    fn rebuild(&self, generation: u64, why: &str) {
        let mut w = self
            .shared
            .producer
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if w.0 != generation {
            return;
        }
        match self.shared.config.create_with_context(Reports) {
            Ok(p) => {
                log::warn!("txbox: kafka producer replaced: {why}");
                self.shared.timed_out_batches.store(0, Ordering::Relaxed);
                *w = (generation + 1, p);
            }
            Err(e) => log::error!(
                "txbox: kafka producer could not be replaced ({why}): {}",
                creation_err("producer", e, &self.shared.config)
            ),
        }
    }

    fn enqueue(
        producer: &ThreadedProducer<Reports>,
        e: &Event,
        batch: &Arc<Batch>,
        index: usize,
        deadline: Instant,
    ) -> Result<(), SendError> {
        let mut headers = OwnedHeaders::new_with_capacity(2 + e.headers.len())
            .insert(Header {
                key: HEADER_EVENT_ID,
                value: Some(e.id.to_string().as_bytes()),
            })
            .insert(Header {
                key: HEADER_EVENT_TYPE,
                value: Some(e.event_type.as_bytes()),
            });
        for (k, v) in &e.headers {
            headers = headers.insert(Header {
                key: k,
                value: Some(v.as_bytes()),
            });
        }
        // JSON events go without it: their path costs what it did
        if let Some(content_type) = &e.content_type {
            headers = headers.insert(Header {
                key: HEADER_CONTENT_TYPE,
                value: Some(content_type.as_bytes()),
            });
        }
        let mut record =
            BaseRecord::with_opaque_to(&e.destination, Box::new((batch.clone(), index)))
                .payload(&e.payload)
                .headers(headers);
        if let Some(k) = &e.key {
            record = record.key(k.as_bytes());
        }
        // the producer's queue is full: wait for room, a little longer each
        // time (the backoff is built only then, not for every record)
        let mut backoff = None;
        loop {
            match producer.send(record) {
                Ok(()) => return Ok(()),
                Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r))
                    if Instant::now() < deadline =>
                {
                    record = r;
                    let backoff = backoff.get_or_insert_with(|| {
                        RetryBackoff::doubling(Duration::from_millis(1), Duration::from_millis(10))
                    });
                    std::thread::sleep(backoff.wait());
                }
                Err((err, _)) => {
                    let code = err.rdkafka_error_code();
                    return Err(send_error(
                        format!("kafka produce to {}: {err}", e.destination),
                        code,
                    ));
                }
            }
        }
    }
}

impl Pipelining for KafkaSender {
    type Batch = Pending;

    fn in_flight(&mut self) -> &mut VecDeque<Pending> {
        &mut self.in_flight
    }

    /// Enqueues every record of `events`; their reports fill the returned batch.
    fn publish(&mut self, events: &[Event]) -> Pending {
        let batch = Arc::new(Batch {
            results: Mutex::new((vec![None; events.len()], 0)),
            done: Condvar::new(),
            timeouts: AtomicUsize::new(0),
            fenced: AtomicBool::new(false),
        });
        let deadline = Instant::now() + self.shared.wait;
        let guard = self
            .shared
            .producer
            .read()
            .unwrap_or_else(|p| p.into_inner());
        let (generation, producer) = &*guard;
        for (i, e) in events.iter().enumerate() {
            if let Err(err) = Self::enqueue(producer, e, &batch, i, deadline) {
                batch.set(i, Err(err));
            }
        }
        Pending {
            batch,
            len: events.len(),
            deadline,
            generation: *generation,
        }
    }

    /// Waits for the reports of `p`, replacing a producer that failed or is stuck.
    fn collect(&mut self, p: Pending) -> Vec<Result<(), SendError>> {
        let reported = p.batch.wait_all(p.len, p.deadline);
        let timed_out = p.batch.timeouts.load(Ordering::Relaxed) + (p.len - reported);
        // A producer whose every record times out while others get through is
        // stuck (e.g. an idempotent producer id the broker forgot after a restart):
        // after a few such batches it is replaced, as after a fatal error.
        let stuck = if timed_out == p.len {
            self.shared
                .timed_out_batches
                .fetch_add(1, Ordering::Relaxed)
                + 1
                >= REBUILD_AFTER
        } else {
            self.shared.timed_out_batches.store(0, Ordering::Relaxed);
            false
        };
        let fatal = {
            let guard = self
                .shared
                .producer
                .read()
                .unwrap_or_else(|p| p.into_inner());
            match guard.1.client().fatal_error() {
                _ if guard.0 != p.generation => None, // replaced already
                Some((code, msg)) => Some(format!("fatal error {code:?}: {msg}")),
                None if p.batch.fenced.load(Ordering::Relaxed) => {
                    Some("the broker no longer knows its producer id".into())
                }
                None if stuck => Some(format!("{REBUILD_AFTER} batches in a row timed out")),
                None => None,
            }
        };
        if let Some(why) = fatal {
            self.rebuild(p.generation, &why);
        }
        let wait = self.shared.wait;
        let mut g = p.batch.results.lock().unwrap_or_else(|p| p.into_inner());
        let results: Vec<_> =
            g.0.iter_mut()
                .map(|r| {
                    r.take().unwrap_or_else(|| {
                        Err(SendError::transient(format!(
                            "kafka: no delivery report within {wait:?}"
                        )))
                    })
                })
                .collect();
        if results
            .iter()
            .any(|r| r.as_ref().is_err_and(SendError::is_transient))
        {
            self.shared.unreachable.store(true, Ordering::Relaxed);
        }
        results
    }

    /// [`Sender::ready`]: after a transport failure, ready once the brokers answer
    /// a metadata request again.
    fn check(&mut self) -> std::result::Result<(), SendError> {
        if !self.shared.unreachable.load(Ordering::Relaxed) {
            return Ok(());
        }
        let guard = self
            .shared
            .producer
            .read()
            .unwrap_or_else(|p| p.into_inner());
        match guard.1.client().fetch_metadata(None, READY_TIMEOUT) {
            Ok(_) => {
                self.shared.unreachable.store(false, Ordering::Relaxed);
                log::info!("txbox: kafka brokers answer again");
                Ok(())
            }
            Err(e) => Err(SendError::transient(format!(
                "kafka brokers do not answer: {e}"
            ))),
        }
    }
}

/// How long [`Sender::ready`] waits for the brokers' metadata after a transport
/// failure.
const READY_TIMEOUT: Duration = Duration::from_secs(2);

crate::pipelined_sender!(KafkaSender);

impl SenderFactory for KafkaSender {
    fn create(&self) -> Result<Box<dyn Sender>> {
        Ok(Box::new(self.clone()))
    }

    fn ack_wait(&self) -> Option<Duration> {
        Some(self.shared.wait)
    }

    fn check_destination(&self, destination: &str) -> std::result::Result<(), String> {
        topic_name_error(destination).map_or(Ok(()), Err)
    }
}
