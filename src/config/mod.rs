//! Configuration: one `defaults` block, per-event-type overrides, and the relay's
//! maintenance settings. Built in code with [`Config::builder`] or read from TOML
//! with [`Config::from_toml`]; both go through the same validation, whose errors
//! name the key path of the wrong value.
//!
//! The settings are plain structs ([`EventSettings`], [`DlqSettings`], ...), each
//! defined once: the TOML file is read into them, the builder's closures change
//! them, the relay reads them. See [`ConfigBuilder`] for an example in code and
//! [`Config::from_toml`] for one in TOML.

use std::collections::BTreeMap;
use std::path::Path;

use crate::error::{Error, Result};

mod builder;
mod duration;
mod file;
mod sections;
mod settings;
mod validate;

pub use builder::ConfigBuilder;
#[cfg(feature = "rabbitmq")]
pub(crate) use duration::serde_optional as optional_duration;
#[cfg(any(feature = "kafka", feature = "rabbitmq"))]
pub(crate) use file::{broker_section, from_env};
pub use sections::{DlqSettings, InboxSettings, MaintenanceSettings};
pub use settings::{
    Backoff, ClaimMode, EventOrder, EventSettings, OnPoison, Polling, PollingStrategy, Wake,
};
pub(crate) use validate::{plain_name, MAX_PAYLOAD_LIMIT};

/// The whole configuration, validated: built with [`Config::builder`] or read
/// with [`Config::from_toml`]. Its parts are read through the accessors; a
/// configuration cannot be changed after it was built, so every value a relay
/// runs on has been checked.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    pub(crate) table_prefix: String,
    pub(crate) max_payload_bytes: usize,
    pub(crate) defaults: EventSettings,
    pub(crate) events: BTreeMap<String, EventSettings>,
    pub(crate) dlq: DlqSettings,
    pub(crate) maintenance: MaintenanceSettings,
    pub(crate) inbox: InboxSettings,
    /// What the parts built from this configuration report to.
    pub(crate) observer: crate::metrics::Observed,
}

/// The default `max_payload_bytes`: 1 MiB.
pub(crate) const DEFAULT_MAX_PAYLOAD: usize = 1024 * 1024;

impl Config {
    /// Checks every value ([`ConfigBuilder::build`] and [`Config::from_toml`] call it).
    pub(crate) fn validate(&self) -> Result<()> {
        crate::tables::validate_prefix(&self.table_prefix)?;
        let max_payload_bytes = self.max_payload_bytes;
        if !(1..=MAX_PAYLOAD_LIMIT).contains(&max_payload_bytes) {
            return Err(Error::config(
                "max_payload_bytes",
                format!("must be between 1 and {MAX_PAYLOAD_LIMIT}, not {max_payload_bytes}"),
            ));
        }
        self.defaults.validate("defaults")?;
        for (name, settings) in &self.events {
            let path = format!("events.{}", name.escape_debug());
            if let Err(why) = plain_name(name) {
                return Err(Error::config(path, format!("event type {why}")));
            }
            settings.validate(&path)?;
        }
        self.dlq.validate("dlq")?;
        self.maintenance.validate("maintenance")?;
        self.inbox.validate("inbox")?;
        Ok(())
    }

    /// A builder with every default.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder::default()
    }

    /// The settings of a known event type.
    pub fn event(&self, event_type: &str) -> Option<&EventSettings> {
        self.events.get(event_type)
    }

    /// Every declared event type with its settings, by name.
    pub fn events(&self) -> impl ExactSizeIterator<Item = (&str, &EventSettings)> {
        self.events.iter().map(|(name, s)| (name.as_str(), s))
    }

    /// The defaults every event type started from.
    pub fn defaults(&self) -> &EventSettings {
        &self.defaults
    }

    /// The prefix of every table name (default empty).
    pub fn table_prefix(&self) -> &str {
        &self.table_prefix
    }

    /// The largest serialized payload `publish` accepts (default 1 MiB).
    pub fn max_payload_bytes(&self) -> usize {
        self.max_payload_bytes
    }

    /// Dead-letter settings.
    pub fn dlq(&self) -> &DlqSettings {
        &self.dlq
    }

    /// Recovery and cleanup settings.
    pub fn maintenance(&self) -> &MaintenanceSettings {
        &self.maintenance
    }

    /// Inbox settings.
    pub fn inbox(&self) -> &InboxSettings {
        &self.inbox
    }

    /// This configuration with `observer` for the metrics of every part built
    /// from it ([`Outbox`](crate::Outbox), [`Relay`](crate::Relay),
    /// [`Inbox`](crate::Inbox), [`Relay::deliver_pending`](crate::Relay::deliver_pending)),
    /// instead of the process-wide [`Registry`](crate::metrics::Registry) and
    /// the `metrics` facade. A [`Registry`](crate::metrics::Registry) of its
    /// own counts what one relay did, apart from the others in the process:
    ///
    /// ```
    /// # fn main() -> txbox::Result<()> {
    /// use std::sync::Arc;
    /// let registry = Arc::new(txbox::metrics::Registry::new());
    /// let config = txbox::Config::builder()
    ///     .event("order-created", |e| e)
    ///     .build()?
    ///     .observed(registry.clone());
    /// # let _ = config;
    /// # Ok(()) }
    /// ```
    #[must_use]
    pub fn observed(mut self, observer: std::sync::Arc<dyn crate::metrics::Observer>) -> Self {
        self.observer = crate::metrics::Observed::new(observer);
        self
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

    /// Parses TOML. Durations are strings like `"250ms"`, `"10s"`, `"1m"`, `"24h"`
    /// (see [`humantime`](https://docs.rs/humantime); a decimal of one unit such as
    /// `"1.5s"` too). `[defaults]` is merged into each `[events.x]`
    /// before it is read. The brokers' tables, `[kafka]` and `[rabbitmq]`, are
    /// left to the broker modules, which read them from the same text
    /// (`KafkaSender::from_toml`, `RabbitSender::from_toml`).
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
        let config = file::parse(text)?;
        config.validate()?;
        Ok(config)
    }
}
