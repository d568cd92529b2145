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

use crate::error::{Error, Result};

mod builder;
mod file;
mod options;
mod validate;

pub use builder::ConfigBuilder;
pub use file::parse_duration;
pub use options::EventOptions;
pub(crate) use validate::{plain_name, validate_event, within, within_or_zero};
pub use validate::{
    MAX_DELAY, MAX_INTERVAL, MAX_LEASE, MAX_MULTIPLIER, MAX_PAYLOAD_LIMIT, MAX_TTL,
};

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
        let raw: file::toml_model::Root =
            toml::from_str(text).map_err(|e| Error::ConfigSyntax(e.to_string()))?;
        raw.into_builder()?.build()
    }
}
