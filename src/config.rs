//! Configuration: one `defaults` block, per-event-type overrides, and the relay's
//! maintenance settings. Built in code with [`Config::builder`] or read from TOML
//! with [`Config::from_toml`]; both go through the same validation, whose errors
//! name the key path of the wrong value.
//!
//! ```
//! # fn main() -> txbox::Result<()> {
//! use std::time::Duration;
//! use txbox::{Config, EventOptions};
//!
//! let config = Config::builder()
//!     .defaults(EventOptions::new().batch_size(100))
//!     .event("order-created", EventOptions::new().destination("orders").max_retries(5))
//!     .event("order-paid", EventOptions::new().fixed_polling(Duration::from_millis(500)))
//!     .dlq(true)
//!     .build()?;
//! assert_eq!(config.event("order-created").unwrap().batch_size, 100);
//! assert_eq!(config.event("order-created").unwrap().max_retries, 5);
//! # Ok(()) }
//! ```

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::error::{Error, Result};

/// How a poller waits between polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PollingStrategy {
    /// Wait `delay` after a partial or empty batch. A full batch polls again at once:
    /// more work is waiting.
    Fixed,
    /// A full batch polls again at once and resets the delay to `min`; a partial or
    /// empty batch waits the current delay, then multiplies it by `multiplier`, up to
    /// `max`. With the defaults (250ms, x1.5, 1m) an idle type polls about 70 times in
    /// its first hour and 60 times an hour after that.
    Adaptive,
}

/// How a poller claims a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ClaimMode {
    /// The default, on every database: the claim stamps the rows IN_PROCESS with a
    /// token and a lease in one short transaction; the finish checks the token, and
    /// stuck recovery returns rows whose lease expired. Each event row is written
    /// twice (claim, finish).
    #[default]
    Lease,
    /// PostgreSQL only: the claim locks the rows (`FOR UPDATE SKIP LOCKED`) in a
    /// transaction that stays open until the broker acked the batch, and the finish
    /// commits in it. Each row is written once, so the database does about half the
    /// work per event (see `docs/BENCHMARKS.md`). The rows stay PENDING meanwhile;
    /// other relays skip them while they are locked. A relay that dies loses its
    /// connection and the rows are free at once; one that hangs past `lease` has its
    /// session ended by the database (`idle_in_transaction_session_timeout`), which
    /// frees the rows and makes its late finish fail. Costs one database
    /// connection per batch in flight (`in_flight` per event type) while it waits
    /// for the broker. With `processed_ttl` zero the claim deletes the rows in that
    /// transaction (others still see them PENDING until it commits): a batch the
    /// broker acked whole is finished by the commit alone, and the events it did
    /// not ack are written back with their attempt counted.
    Lock,
}

impl std::fmt::Display for ClaimMode {
    /// `lease` or `lock`, as the TOML configuration spells it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ClaimMode::Lease => "lease",
            ClaimMode::Lock => "lock",
        })
    }
}

impl std::str::FromStr for ClaimMode {
    type Err = String;
    /// `"lease"` or `"lock"`, as in the TOML configuration; the error says what
    /// is allowed.
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "lease" => Ok(ClaimMode::Lease),
            "lock" => Ok(ClaimMode::Lock),
            other => Err(format!("must be \"lease\" or \"lock\", not {other:?}")),
        }
    }
}

/// Polling settings of one event type.
#[derive(Debug, Clone, PartialEq)]
pub struct Polling {
    /// Fixed or adaptive.
    pub strategy: PollingStrategy,
    /// The delay of the fixed strategy (default 1s).
    pub delay: Duration,
    /// The shortest adaptive delay (default 250ms).
    pub min: Duration,
    /// The longest adaptive delay (default 1m).
    pub max: Duration,
    /// Growth of the adaptive delay after a partial or empty batch (default 1.5).
    pub multiplier: f64,
    /// Wait before the first poll after start (default 0).
    pub initial_delay: Duration,
}

/// Retry backoff of one event type: the n-th retry waits `delay * multiplier^(n-1)`,
/// spread by `± jitter` (a fraction). Disabled means a fixed `delay` every time.
#[derive(Debug, Clone, PartialEq)]
pub struct Backoff {
    /// Exponential growth on (default true). Off: a fixed delay, never zero.
    pub enabled: bool,
    /// The first retry's delay (default 10s).
    pub delay: Duration,
    /// Growth per retry (default 3.0).
    pub multiplier: f64,
    /// Random spread, a fraction in `[0, 1)` (default 0.1: ±10%).
    pub jitter: f64,
}

impl Backoff {
    /// The delay before retry number `retry` (1 for the first retry), with jitter.
    pub fn delay_for(&self, retry: u32) -> Duration {
        let base = if self.enabled {
            let exp = retry.saturating_sub(1).min(64) as i32;
            self.delay.as_secs_f64() * self.multiplier.powi(exp)
        } else {
            self.delay.as_secs_f64()
        };
        let spread = if self.jitter > 0.0 {
            1.0 + self.jitter * (fastrand::f64() * 2.0 - 1.0)
        } else {
            1.0
        };
        // Cap at 30 days so huge exponents stay representable; settings made by
        // hand (NaN, infinities) fall back to the cap instead of panicking.
        let secs = base * spread;
        let secs = if secs.is_nan() { 30.0 * 86_400.0 } else { secs };
        Duration::try_from_secs_f64(secs.clamp(0.001, 30.0 * 86_400.0))
            .unwrap_or(Duration::from_secs(30 * 86_400))
    }
}

/// The resolved settings of one event type: its override on top of `defaults`.
#[derive(Debug, Clone, PartialEq)]
pub struct EventSettings {
    /// Topic (Kafka) or exchange (RabbitMQ). `None`: the event type's name.
    pub destination: Option<String>,
    /// RabbitMQ routing key. `None`: the event type's name.
    pub routing_key: Option<String>,
    /// Most events one poll claims (default 200).
    pub batch_size: usize,
    /// Most claimed batches one poller has with the broker at a time (default 3):
    /// the next batches are claimed while the broker acks the previous ones. 1
    /// sends one batch at a time. Senders that cannot pipeline behave as 1.
    pub in_flight: usize,
    /// Polling between claims.
    pub polling: Polling,
    /// Retries after the first failed send before the event is FAILED (default 3).
    pub max_retries: u32,
    /// Delay between retries.
    pub backoff: Backoff,
    /// Longest a claimed batch may stay in process before recovery returns it (default 300s).
    pub lease: Duration,
    /// How batches are claimed (default [`ClaimMode::Lease`]).
    pub claim: ClaimMode,
}

impl Default for EventSettings {
    fn default() -> Self {
        EventSettings {
            destination: None,
            routing_key: None,
            batch_size: 200,
            in_flight: 3,
            polling: Polling {
                strategy: PollingStrategy::Adaptive,
                delay: Duration::from_secs(1),
                min: Duration::from_millis(250),
                max: Duration::from_secs(60),
                multiplier: 1.5,
                initial_delay: Duration::ZERO,
            },
            max_retries: 3,
            backoff: Backoff {
                enabled: true,
                delay: Duration::from_secs(10),
                multiplier: 3.0,
                jitter: 0.1,
            },
            lease: Duration::from_secs(300),
            claim: ClaimMode::Lease,
        }
    }
}

/// A partial [`EventSettings`]: the `defaults` block or one event type's override.
/// Unset values inherit (override <- defaults <- built-in defaults).
///
/// ```
/// use std::time::Duration;
/// let options = txbox::EventOptions::new()
///     .destination("orders")
///     .adaptive_polling(Duration::from_millis(100), Duration::from_secs(10), 2.0)
///     .backoff_delay(Duration::from_secs(1));
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventOptions {
    destination: Option<String>,
    routing_key: Option<String>,
    batch_size: Option<usize>,
    in_flight: Option<usize>,
    strategy: Option<PollingStrategy>,
    delay: Option<Duration>,
    min: Option<Duration>,
    max: Option<Duration>,
    poll_multiplier: Option<f64>,
    initial_delay: Option<Duration>,
    max_retries: Option<u32>,
    backoff_enabled: Option<bool>,
    backoff_delay: Option<Duration>,
    backoff_multiplier: Option<f64>,
    jitter: Option<f64>,
    lease: Option<Duration>,
    claim: Option<ClaimMode>,
}

impl EventOptions {
    /// Nothing set: everything inherits.
    pub fn new() -> Self {
        Self::default()
    }
    /// Topic (Kafka) or exchange (RabbitMQ).
    pub fn destination(mut self, d: impl Into<String>) -> Self {
        self.destination = Some(d.into());
        self
    }
    /// RabbitMQ routing key (default: the event type).
    pub fn routing_key(mut self, k: impl Into<String>) -> Self {
        self.routing_key = Some(k.into());
        self
    }
    /// Most events one poll claims.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = Some(n);
        self
    }
    /// Most batches in flight at once per poller (see [`EventSettings::in_flight`]).
    pub fn in_flight(mut self, n: usize) -> Self {
        self.in_flight = Some(n);
        self
    }
    /// Fixed polling with this delay.
    pub fn fixed_polling(mut self, delay: Duration) -> Self {
        self.strategy = Some(PollingStrategy::Fixed);
        self.delay = Some(delay);
        self
    }
    /// Adaptive polling between `min` and `max`, growing by `multiplier`.
    pub fn adaptive_polling(mut self, min: Duration, max: Duration, multiplier: f64) -> Self {
        self.strategy = Some(PollingStrategy::Adaptive);
        self.min = Some(min);
        self.max = Some(max);
        self.poll_multiplier = Some(multiplier);
        self
    }
    /// Wait before the first poll.
    pub fn initial_delay(mut self, d: Duration) -> Self {
        self.initial_delay = Some(d);
        self
    }
    /// Retries after the first failed send.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = Some(n);
        self
    }
    /// Exponential backoff on or off (off: fixed delay).
    pub fn backoff_enabled(mut self, on: bool) -> Self {
        self.backoff_enabled = Some(on);
        self
    }
    /// The first retry's delay.
    pub fn backoff_delay(mut self, d: Duration) -> Self {
        self.backoff_delay = Some(d);
        self
    }
    /// Backoff growth per retry.
    pub fn backoff_multiplier(mut self, m: f64) -> Self {
        self.backoff_multiplier = Some(m);
        self
    }
    /// Backoff jitter, a fraction in `[0, 1)`.
    pub fn backoff_jitter(mut self, j: f64) -> Self {
        self.jitter = Some(j);
        self
    }
    /// Claim lease: the longest a batch may stay in process before recovery.
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = Some(d);
        self
    }
    /// How batches are claimed (see [`ClaimMode`]).
    pub fn claim(mut self, mode: ClaimMode) -> Self {
        self.claim = Some(mode);
        self
    }

    fn apply(&self, base: &EventSettings) -> EventSettings {
        let mut s = base.clone();
        if let Some(d) = &self.destination {
            s.destination = Some(d.clone());
        }
        if let Some(k) = &self.routing_key {
            s.routing_key = Some(k.clone());
        }
        macro_rules! set {
            ($($field:ident => $target:expr),* $(,)?) => { $( if let Some(v) = self.$field { $target = v; } )* };
        }
        set!(
            batch_size => s.batch_size,
            in_flight => s.in_flight,
            strategy => s.polling.strategy,
            delay => s.polling.delay,
            min => s.polling.min,
            max => s.polling.max,
            poll_multiplier => s.polling.multiplier,
            initial_delay => s.polling.initial_delay,
            max_retries => s.max_retries,
            backoff_enabled => s.backoff.enabled,
            backoff_delay => s.backoff.delay,
            backoff_multiplier => s.backoff.multiplier,
            jitter => s.backoff.jitter,
            lease => s.lease,
            claim => s.claim,
        );
        s
    }
}

/// Dead-letter settings.
#[derive(Debug, Clone, PartialEq)]
pub struct DlqSettings {
    /// Run the three DLQ threads (move, retry, cleanup). Default true: an event
    /// that used up its retries then moves to the dead letters, where the admin
    /// API, the CLI and the HTTP routes list, retry, resolve and delete it. With
    /// it off, FAILED events stay in the outbox until an operator moves them
    /// there ([`Dlq::move_failed`](crate::Dlq::move_failed), `txbox dlq move`).
    pub enabled: bool,
    /// How often FAILED events are moved to the dead letters (default 30s).
    pub move_interval: Duration,
    /// How often dead letters marked for retry go back to the outbox (default 10s).
    pub retry_interval: Duration,
    /// How often resolved dead letters are cleaned up (default 10m).
    pub cleanup_interval: Duration,
    /// Resolved dead letters older than this are deleted (default 24h).
    pub resolved_ttl: Duration,
}

/// Stuck recovery and cleanup settings.
#[derive(Debug, Clone, PartialEq)]
pub struct MaintenanceSettings {
    /// How often expired claims are returned to PENDING (default 60s).
    pub recovery_interval: Duration,
    /// How often processed events are cleaned up (default 5m).
    pub cleanup_interval: Duration,
    /// Processed events older than this are deleted (default 24h). Zero keeps none:
    /// the relay deletes each row as soon as the broker acks it, instead of marking
    /// it PROCESSED (less database work per event, nothing left to clean up).
    pub processed_ttl: Duration,
    /// Rows one maintenance statement touches at most (default 1000).
    pub batch_size: usize,
}

/// Inbox settings.
#[derive(Debug, Clone, PartialEq)]
pub struct InboxSettings {
    /// Consumed ids older than this are deleted (default 24h). Keep it at least as
    /// long as a duplicate can still arrive.
    pub ttl: Duration,
    /// How long the inbox cache keeps an id (default 1h; must be <= `ttl`).
    pub cache_ttl: Duration,
    /// How often the cleanup runs (default 10m).
    pub cleanup_interval: Duration,
    /// Rows one cleanup statement deletes at most (default 1000).
    pub batch_size: usize,
}

/// The whole configuration. Its `Debug` redacts secret Kafka properties
/// (`sasl.password`, ...).
#[derive(Clone, PartialEq)]
pub struct Config {
    /// Prefix of every table name (validated identifier; default empty).
    pub table_prefix: String,
    /// Largest serialized payload `publish` accepts (default 1 MiB).
    pub max_payload_bytes: usize,
    /// The resolved defaults.
    pub defaults: EventSettings,
    /// Resolved settings per known event type.
    pub events: BTreeMap<String, EventSettings>,
    /// Dead-letter settings.
    pub dlq: DlqSettings,
    /// Recovery and cleanup.
    pub maintenance: MaintenanceSettings,
    /// The inbox.
    pub inbox: InboxSettings,
    /// librdkafka properties for the Kafka sender and consumer (`[kafka]` in TOML),
    /// passed through as they are, e.g. `"bootstrap.servers"`.
    pub kafka: BTreeMap<String, String>,
}

impl std::fmt::Debug for Config {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Config")
            .field("table_prefix", &self.table_prefix)
            .field("max_payload_bytes", &self.max_payload_bytes)
            .field("defaults", &self.defaults)
            .field("events", &self.events)
            .field("dlq", &self.dlq)
            .field("maintenance", &self.maintenance)
            .field("inbox", &self.inbox)
            .field("kafka", &crate::redact::Properties(&self.kafka))
            .finish()
    }
}

impl Config {
    /// Checks every value, as [`ConfigBuilder::build`] and [`Config::from_toml`]
    /// do. The fields are public, so a configuration changed after it was built
    /// is checked again by [`Relay::start`](crate::Relay::start).
    pub fn validate(&self) -> Result<()> {
        crate::store::validate_prefix(&self.table_prefix)?;
        let max_payload_bytes = self.max_payload_bytes;
        if !(1..=MAX_PAYLOAD_LIMIT).contains(&max_payload_bytes) {
            return Err(Error::config(
                "max_payload_bytes",
                format!("must be between 1 and {MAX_PAYLOAD_LIMIT}, not {max_payload_bytes}"),
            ));
        }
        validate_event(&self.defaults, "defaults")?;
        for (name, settings) in &self.events {
            let path = format!("events.{}", name.escape_debug());
            if let Err(why) = plain_name(name) {
                return Err(Error::config(path, format!("event type {why}")));
            }
            validate_event(settings, &path)?;
        }
        let dlq = &self.dlq;
        within("dlq.move_interval", dlq.move_interval, MAX_INTERVAL)?;
        within("dlq.retry_interval", dlq.retry_interval, MAX_INTERVAL)?;
        within("dlq.cleanup_interval", dlq.cleanup_interval, MAX_INTERVAL)?;
        within_or_zero("dlq.resolved_ttl", dlq.resolved_ttl, MAX_TTL)?;
        let m = &self.maintenance;
        within(
            "maintenance.recovery_interval",
            m.recovery_interval,
            MAX_INTERVAL,
        )?;
        within(
            "maintenance.cleanup_interval",
            m.cleanup_interval,
            MAX_INTERVAL,
        )?;
        within_or_zero("maintenance.processed_ttl", m.processed_ttl, MAX_TTL)?;
        if !(1..=100_000).contains(&m.batch_size) {
            return Err(Error::config(
                "maintenance.batch_size",
                "must be between 1 and 100000",
            ));
        }
        let inbox = &self.inbox;
        within("inbox.ttl", inbox.ttl, MAX_TTL)?;
        within("inbox.cache_ttl", inbox.cache_ttl, MAX_TTL)?;
        within(
            "inbox.cleanup_interval",
            inbox.cleanup_interval,
            MAX_INTERVAL,
        )?;
        if inbox.cache_ttl > inbox.ttl {
            return Err(Error::config("inbox.cache_ttl", "must be <= inbox.ttl"));
        }
        if !(1..=100_000).contains(&inbox.batch_size) {
            return Err(Error::config(
                "inbox.batch_size",
                "must be between 1 and 100000",
            ));
        }
        Ok(())
    }

    /// Opens the store `url` names (see [`crate::store::connect`]) on this
    /// configuration's tables: the table prefix is given once.
    ///
    /// ```no_run
    /// # fn main() -> txbox::Result<()> {
    /// let config = txbox::Config::builder().table_prefix("shop_").build()?;
    /// let store = config.connect("sqlite:jobs.db")?;
    /// store.migrate()?;
    /// # Ok(()) }
    /// ```
    pub fn connect(&self, url: &str) -> Result<std::sync::Arc<dyn crate::Store>> {
        crate::store::connect(url, &self.table_prefix)
    }

    /// A builder with every default.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// The settings of a known event type.
    pub fn event(&self, event_type: &str) -> Option<&EventSettings> {
        self.events.get(event_type)
    }

    /// Like [`Config::event`] but an unknown type is [`Error::UnknownEventType`].
    pub fn require_event(&self, event_type: &str) -> Result<&EventSettings> {
        self.event(event_type)
            .ok_or_else(|| Error::UnknownEventType(event_type.to_owned()))
    }

    /// Reads a TOML file (see [`Config::from_toml`]).
    pub fn from_toml_file(path: impl AsRef<Path>) -> Result<Config> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Io {
            context: format!("reading {}", path.display()),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Parses TOML. Durations are strings like `"250ms"`, `"10s"`, `"1m"`, `"24h"`.
    ///
    /// ```
    /// # fn main() -> txbox::Result<()> {
    /// let config = txbox::Config::from_toml(r#"
    ///     table_prefix = "shop_"
    ///     [defaults]
    ///     batch_size = 100
    ///     [defaults.polling]
    ///     min = "100ms"
    ///     [events.order-created]
    ///     destination = "orders"
    ///     [events.order-created.backoff]
    ///     delay = "2s"
    /// "#)?;
    /// let s = config.event("order-created").unwrap();
    /// assert_eq!(s.polling.min, std::time::Duration::from_millis(100));
    /// assert_eq!(s.backoff.delay, std::time::Duration::from_secs(2));
    ///
    /// let err = txbox::Config::from_toml("[events.x.polling]\nmultiplier = 0.5").unwrap_err();
    /// assert_eq!(
    ///     err.to_string(),
    ///     "events.x.polling.multiplier must be between 1.0 and 100, not 0.5"
    /// );
    /// # Ok(()) }
    /// ```
    pub fn from_toml(text: &str) -> Result<Config> {
        let raw: toml_model::Root =
            toml::from_str(text).map_err(|e| Error::ConfigSyntax(e.to_string()))?;
        raw.into_builder()?.build()
    }
}

/// Builds a [`Config`] in code. Its `Debug` redacts secret Kafka properties.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    table_prefix: Option<String>,
    max_payload_bytes: Option<usize>,
    defaults: EventOptions,
    events: BTreeMap<String, EventOptions>,
    dlq: DlqOptions,
    maintenance: MaintenanceOptions,
    inbox: InboxOptions,
    kafka: crate::redact::SecretMap,
}

#[derive(Debug, Clone, Default)]
struct InboxOptions {
    ttl: Option<Duration>,
    cache_ttl: Option<Duration>,
    cleanup_interval: Option<Duration>,
    batch_size: Option<usize>,
}

#[derive(Debug, Clone, Default)]
struct DlqOptions {
    enabled: Option<bool>,
    move_interval: Option<Duration>,
    retry_interval: Option<Duration>,
    cleanup_interval: Option<Duration>,
    resolved_ttl: Option<Duration>,
}

#[derive(Debug, Clone, Default)]
struct MaintenanceOptions {
    recovery_interval: Option<Duration>,
    cleanup_interval: Option<Duration>,
    processed_ttl: Option<Duration>,
    batch_size: Option<usize>,
}

impl ConfigBuilder {
    /// Prefix of every table name: a plain identifier such as `shop_`.
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = Some(prefix.into());
        self
    }
    /// Largest serialized payload accepted by `publish`.
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = Some(n);
        self
    }
    /// The defaults every event type inherits.
    pub fn defaults(mut self, options: EventOptions) -> Self {
        self.defaults = options;
        self
    }
    /// Declares an event type with its overrides (`EventOptions::new()` for none).
    pub fn event(mut self, event_type: impl Into<String>, options: EventOptions) -> Self {
        self.events.insert(event_type.into(), options);
        self
    }
    /// Turns the dead-letter threads on (the default) or off.
    pub fn dlq(mut self, enabled: bool) -> Self {
        self.dlq.enabled = Some(enabled);
        self
    }
    /// How often FAILED events move to the dead letters.
    pub fn dlq_move_interval(mut self, d: Duration) -> Self {
        self.dlq.move_interval = Some(d);
        self
    }
    /// How often dead letters marked for retry return to the outbox.
    pub fn dlq_retry_interval(mut self, d: Duration) -> Self {
        self.dlq.retry_interval = Some(d);
        self
    }
    /// How often resolved dead letters are cleaned up.
    pub fn dlq_cleanup_interval(mut self, d: Duration) -> Self {
        self.dlq.cleanup_interval = Some(d);
        self
    }
    /// Age after which resolved dead letters are deleted.
    pub fn dlq_resolved_ttl(mut self, d: Duration) -> Self {
        self.dlq.resolved_ttl = Some(d);
        self
    }
    /// How often expired claims are recovered.
    pub fn recovery_interval(mut self, d: Duration) -> Self {
        self.maintenance.recovery_interval = Some(d);
        self
    }
    /// How often processed events are cleaned up.
    pub fn cleanup_interval(mut self, d: Duration) -> Self {
        self.maintenance.cleanup_interval = Some(d);
        self
    }
    /// Age after which processed events are deleted. `Duration::ZERO` deletes each
    /// row as soon as the broker acks it.
    pub fn processed_ttl(mut self, d: Duration) -> Self {
        self.maintenance.processed_ttl = Some(d);
        self
    }
    /// Rows one maintenance statement touches at most.
    pub fn maintenance_batch_size(mut self, n: usize) -> Self {
        self.maintenance.batch_size = Some(n);
        self
    }

    /// Age after which consumed inbox ids are deleted.
    pub fn inbox_ttl(mut self, d: Duration) -> Self {
        self.inbox.ttl = Some(d);
        self
    }
    /// How long the inbox cache keeps an id (<= the inbox TTL).
    pub fn inbox_cache_ttl(mut self, d: Duration) -> Self {
        self.inbox.cache_ttl = Some(d);
        self
    }
    /// How often the inbox cleanup runs.
    pub fn inbox_cleanup_interval(mut self, d: Duration) -> Self {
        self.inbox.cleanup_interval = Some(d);
        self
    }
    /// Rows one inbox cleanup statement deletes at most.
    pub fn inbox_batch_size(mut self, n: usize) -> Self {
        self.inbox.batch_size = Some(n);
        self
    }

    /// Sets a librdkafka property (e.g. `"bootstrap.servers"`) for the Kafka sender and consumer.
    pub fn kafka_property(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.kafka.0.insert(key.into(), value.into());
        self
    }

    /// Resolves inheritance and validates every value.
    pub fn build(self) -> Result<Config> {
        let defaults = self.defaults.apply(&EventSettings::default());
        let events = self
            .events
            .iter()
            .map(|(name, options)| (name.clone(), options.apply(&defaults)))
            .collect();
        let (d, m, i) = (self.dlq, self.maintenance, self.inbox);
        let config = Config {
            table_prefix: self.table_prefix.unwrap_or_default(),
            max_payload_bytes: self.max_payload_bytes.unwrap_or(1024 * 1024),
            defaults,
            events,
            dlq: DlqSettings {
                enabled: d.enabled.unwrap_or(true),
                move_interval: d.move_interval.unwrap_or(Duration::from_secs(30)),
                retry_interval: d.retry_interval.unwrap_or(Duration::from_secs(10)),
                cleanup_interval: d.cleanup_interval.unwrap_or(Duration::from_secs(600)),
                resolved_ttl: d.resolved_ttl.unwrap_or(Duration::from_secs(86_400)),
            },
            maintenance: MaintenanceSettings {
                recovery_interval: m.recovery_interval.unwrap_or(Duration::from_secs(60)),
                cleanup_interval: m.cleanup_interval.unwrap_or(Duration::from_secs(300)),
                processed_ttl: m.processed_ttl.unwrap_or(Duration::from_secs(86_400)),
                batch_size: m.batch_size.unwrap_or(1000),
            },
            inbox: InboxSettings {
                ttl: i.ttl.unwrap_or(Duration::from_secs(86_400)),
                cache_ttl: i.cache_ttl.unwrap_or(Duration::from_secs(3600)),
                cleanup_interval: i.cleanup_interval.unwrap_or(Duration::from_secs(600)),
                batch_size: i.batch_size.unwrap_or(1000),
            },
            kafka: self.kafka.0,
        };
        config.validate()?;
        Ok(config)
    }
}

/// Largest `max_payload_bytes`: 256 MiB.
pub const MAX_PAYLOAD_LIMIT: usize = 256 * 1024 * 1024;
/// Longest polling delay (`delay`, `min`, `max`, `initial_delay`) and first
/// backoff delay: one day.
pub const MAX_DELAY: Duration = Duration::from_secs(86_400);
/// Longest interval of a maintenance or DLQ job: 30 days.
pub const MAX_INTERVAL: Duration = Duration::from_secs(30 * 86_400);
/// Longest TTL (processed rows, dead letters, inbox ids): 10 years.
pub const MAX_TTL: Duration = Duration::from_secs(3650 * 86_400);
/// Longest claim lease: 24 days. A held claim's lease becomes PostgreSQL's
/// `idle_in_transaction_session_timeout`, a 32-bit count of milliseconds (24.8
/// days at most).
pub const MAX_LEASE: Duration = Duration::from_secs(24 * 86_400);
/// Largest polling and backoff multiplier.
pub const MAX_MULTIPLIER: f64 = 100.0;

/// A duration as the configuration spells it (`"250ms"`, `"90s"`, `"24d"`).
fn spell(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms % 86_400_000 == 0 && ms > 0 => format!("{}d", ms / 86_400_000),
        _ if ms % 3_600_000 == 0 && ms > 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// `d` is more than zero and at most `max`.
fn within(path: &str, d: Duration, max: Duration) -> Result<()> {
    if d.is_zero() || d > max {
        return Err(Error::config(
            path,
            format!("must be more than 0 and at most {}, not {d:?}", spell(max)),
        ));
    }
    Ok(())
}

/// `d` is at most `max` (zero allowed).
fn within_or_zero(path: &str, d: Duration, max: Duration) -> Result<()> {
    if d > max {
        return Err(Error::config(
            path,
            format!("must be at most {}, not {d:?}", spell(max)),
        ));
    }
    Ok(())
}

/// A name txbox passes on to threads, brokers and SQL values (event types,
/// destinations): 1 to 255 bytes, no control characters (a NUL cannot be a
/// thread name, a Kafka topic or an AMQP exchange).
pub(crate) fn plain_name(name: &str) -> std::result::Result<(), String> {
    if name.is_empty() || name.len() > 255 {
        return Err(format!(
            "must be 1 to 255 bytes, not {} ({:?})",
            name.len(),
            name.escape_debug().to_string()
        ));
    }
    if let Some(c) = name.chars().find(|c| c.is_control()) {
        return Err(format!(
            "must not contain control characters, found {:?} in {:?}",
            c,
            name.escape_debug().to_string()
        ));
    }
    Ok(())
}

fn validate_event(s: &EventSettings, path: &str) -> Result<()> {
    let err = |key: &str, msg: &str| Err(Error::config(format!("{path}.{key}"), msg));
    if let Some(d) = &s.destination {
        if d.trim().is_empty() {
            return err("destination", "must not be blank");
        }
        if let Err(why) = plain_name(d) {
            return err("destination", &why);
        }
    }
    if let Some(k) = &s.routing_key {
        if k.len() > 255 {
            return err("routing_key", "must be at most 255 bytes");
        }
        if k.chars().any(char::is_control) {
            return err("routing_key", "must not contain control characters");
        }
    }
    if !(1..=10_000).contains(&s.batch_size) {
        return err("batch_size", "must be between 1 and 10000");
    }
    if !(1..=16).contains(&s.in_flight) {
        return err("in_flight", "must be between 1 and 16");
    }
    let p = &s.polling;
    let key = |k: &str| format!("{path}.{k}");
    within(&key("polling.delay"), p.delay, MAX_DELAY)?;
    within(&key("polling.min"), p.min, MAX_DELAY)?;
    within(&key("polling.max"), p.max, MAX_DELAY)?;
    within_or_zero(&key("polling.initial_delay"), p.initial_delay, MAX_DELAY)?;
    if p.max < p.min {
        return err("polling.max", "must be >= polling.min");
    }
    multiplier(&key("polling.multiplier"), p.multiplier)?;
    if s.max_retries > 100 {
        return err("max_retries", "must be <= 100");
    }
    let b = &s.backoff;
    if b.delay.is_zero() {
        return err(
            "backoff.delay",
            "must be > 0 (disable backoff for a fixed delay)",
        );
    }
    within(&key("backoff.delay"), b.delay, MAX_DELAY)?;
    multiplier(&key("backoff.multiplier"), b.multiplier)?;
    if !(b.jitter.is_finite() && (0.0..1.0).contains(&b.jitter)) {
        return err("backoff.jitter", "must be >= 0.0 and < 1.0");
    }
    if s.lease < Duration::from_secs(1) || s.lease > MAX_LEASE {
        return Err(Error::config(
            key("lease"),
            format!(
                "must be between 1s and {}, not {:?}",
                spell(MAX_LEASE),
                s.lease
            ),
        ));
    }
    Ok(())
}

/// A growth factor between 1 and [`MAX_MULTIPLIER`].
fn multiplier(path: &str, m: f64) -> Result<()> {
    if !(m.is_finite() && (1.0..=MAX_MULTIPLIER).contains(&m)) {
        return Err(Error::config(
            path,
            format!(
                "must be between 1.0 and {MAX_MULTIPLIER}, not {}",
                if m.is_finite() && m.abs() >= 1e6 {
                    format!("{m:e}")
                } else {
                    m.to_string()
                }
            ),
        ));
    }
    Ok(())
}

/// Parses `"250ms"`, `"10s"`, `"1.5s"`, `"1m"`, `"24h"`, `"7d"` or `"0"`.
///
/// ```
/// use std::time::Duration;
/// assert_eq!(txbox::config::parse_duration("250ms"), Some(Duration::from_millis(250)));
/// assert_eq!(txbox::config::parse_duration("1m"), Some(Duration::from_secs(60)));
/// assert_eq!(txbox::config::parse_duration("soon"), None);
/// ```
pub fn parse_duration(s: &str) -> Option<Duration> {
    let s = s.trim();
    if s == "0" {
        return Some(Duration::ZERO);
    }
    let split = s.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = s.split_at(split);
    let value: f64 = num.parse().ok()?;
    let secs = match unit.trim() {
        "ms" => value / 1000.0,
        "s" => value,
        "m" => value * 60.0,
        "h" => value * 3600.0,
        "d" => value * 86_400.0,
        _ => return None,
    };
    if !secs.is_finite() || secs > 1e9 {
        return None;
    }
    Some(Duration::from_secs_f64(secs))
}

/// The TOML shape; strings are turned into typed values with their key paths.
mod toml_model {
    use super::*;

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    pub(super) struct Root {
        table_prefix: Option<String>,
        max_payload_bytes: Option<usize>,
        #[serde(default)]
        defaults: Event,
        #[serde(default)]
        events: BTreeMap<String, Event>,
        #[serde(default)]
        dlq: Dlq,
        #[serde(default)]
        maintenance: Maintenance,
        #[serde(default)]
        inbox: InboxRaw,
        #[serde(default)]
        kafka: BTreeMap<String, toml::Value>,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct InboxRaw {
        ttl: Option<String>,
        cache_ttl: Option<String>,
        cleanup_interval: Option<String>,
        batch_size: Option<usize>,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Event {
        destination: Option<String>,
        routing_key: Option<String>,
        batch_size: Option<usize>,
        in_flight: Option<usize>,
        #[serde(default)]
        polling: PollingRaw,
        max_retries: Option<u32>,
        #[serde(default)]
        backoff: BackoffRaw,
        lease: Option<String>,
        claim: Option<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct PollingRaw {
        strategy: Option<String>,
        delay: Option<String>,
        min: Option<String>,
        max: Option<String>,
        multiplier: Option<f64>,
        initial_delay: Option<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct BackoffRaw {
        enabled: Option<bool>,
        delay: Option<String>,
        multiplier: Option<f64>,
        jitter: Option<f64>,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Dlq {
        enabled: Option<bool>,
        move_interval: Option<String>,
        retry_interval: Option<String>,
        cleanup_interval: Option<String>,
        resolved_ttl: Option<String>,
    }

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    struct Maintenance {
        recovery_interval: Option<String>,
        cleanup_interval: Option<String>,
        processed_ttl: Option<String>,
        batch_size: Option<usize>,
    }

    fn dur(path: &str, v: &Option<String>) -> Result<Option<Duration>> {
        match v {
            None => Ok(None),
            Some(s) => parse_duration(s).map(Some).ok_or_else(|| {
                Error::config(
                    path,
                    format!(
                        "has invalid duration {s:?} (use e.g. \"250ms\", \"10s\", \"1m\", \"24h\")"
                    ),
                )
            }),
        }
    }

    impl Event {
        fn options(&self, path: &str) -> Result<EventOptions> {
            let p = |k: &str| format!("{path}.{k}");
            let strategy = match self.polling.strategy.as_deref() {
                None => None,
                Some("fixed") => Some(PollingStrategy::Fixed),
                Some("adaptive") => Some(PollingStrategy::Adaptive),
                Some(other) => {
                    return Err(Error::config(
                        p("polling.strategy"),
                        format!("must be \"fixed\" or \"adaptive\", not {other:?}"),
                    ))
                }
            };
            let claim = self
                .claim
                .as_deref()
                .map(str::parse)
                .transpose()
                .map_err(|e| Error::config(p("claim"), e))?;
            Ok(EventOptions {
                destination: self.destination.clone(),
                routing_key: self.routing_key.clone(),
                batch_size: self.batch_size,
                in_flight: self.in_flight,
                strategy,
                delay: dur(&p("polling.delay"), &self.polling.delay)?,
                min: dur(&p("polling.min"), &self.polling.min)?,
                max: dur(&p("polling.max"), &self.polling.max)?,
                poll_multiplier: self.polling.multiplier,
                initial_delay: dur(&p("polling.initial_delay"), &self.polling.initial_delay)?,
                max_retries: self.max_retries,
                backoff_enabled: self.backoff.enabled,
                backoff_delay: dur(&p("backoff.delay"), &self.backoff.delay)?,
                backoff_multiplier: self.backoff.multiplier,
                jitter: self.backoff.jitter,
                lease: dur(&p("lease"), &self.lease)?,
                claim,
            })
        }
    }

    fn kafka_properties(raw: BTreeMap<String, toml::Value>) -> Result<BTreeMap<String, String>> {
        raw.into_iter()
            .map(|(k, v)| {
                let v = match v {
                    toml::Value::String(s) => s,
                    toml::Value::Integer(i) => i.to_string(),
                    toml::Value::Float(f) => f.to_string(),
                    toml::Value::Boolean(b) => b.to_string(),
                    _ => {
                        return Err(Error::config(
                            format!("kafka.{k}"),
                            "must be a string, number or boolean",
                        ))
                    }
                };
                Ok((k, v))
            })
            .collect()
    }

    impl Root {
        pub(super) fn into_builder(self) -> Result<ConfigBuilder> {
            let mut events = BTreeMap::new();
            for (name, e) in &self.events {
                events.insert(name.clone(), e.options(&format!("events.{name}"))?);
            }
            Ok(ConfigBuilder {
                table_prefix: self.table_prefix,
                max_payload_bytes: self.max_payload_bytes,
                defaults: self.defaults.options("defaults")?,
                events,
                dlq: DlqOptions {
                    enabled: self.dlq.enabled,
                    move_interval: dur("dlq.move_interval", &self.dlq.move_interval)?,
                    retry_interval: dur("dlq.retry_interval", &self.dlq.retry_interval)?,
                    cleanup_interval: dur("dlq.cleanup_interval", &self.dlq.cleanup_interval)?,
                    resolved_ttl: dur("dlq.resolved_ttl", &self.dlq.resolved_ttl)?,
                },
                maintenance: MaintenanceOptions {
                    recovery_interval: dur(
                        "maintenance.recovery_interval",
                        &self.maintenance.recovery_interval,
                    )?,
                    cleanup_interval: dur(
                        "maintenance.cleanup_interval",
                        &self.maintenance.cleanup_interval,
                    )?,
                    processed_ttl: dur(
                        "maintenance.processed_ttl",
                        &self.maintenance.processed_ttl,
                    )?,
                    batch_size: self.maintenance.batch_size,
                },
                inbox: InboxOptions {
                    ttl: dur("inbox.ttl", &self.inbox.ttl)?,
                    cache_ttl: dur("inbox.cache_ttl", &self.inbox.cache_ttl)?,
                    cleanup_interval: dur("inbox.cleanup_interval", &self.inbox.cleanup_interval)?,
                    batch_size: self.inbox.batch_size,
                },
                kafka: crate::redact::SecretMap(kafka_properties(self.kafka)?),
            })
        }
    }
}
