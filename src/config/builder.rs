//! [`ConfigBuilder`]: a [`Config`] built in code.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Config, DlqSettings, EventSettings, InboxSettings, MaintenanceSettings};
use crate::error::{Error, Result};

/// Builds a [`Config`] in code: set the defaults first, then declare each event
/// type, which starts from those defaults.
///
/// ```
/// # fn main() -> txbox::Result<()> {
/// use std::time::Duration;
/// use txbox::Config;
///
/// let config = Config::builder()
///     .defaults(|d| d.batch_size(100))
///     .event("order-created", |e| e.destination("orders").max_retries(5))
///     .event("order-paid", |e| e.fixed_polling(Duration::from_millis(500)))
///     .dlq(true)
///     .build()?;
/// assert_eq!(config.event("order-created").unwrap().batch_size, 100);
/// assert_eq!(config.event("order-created").unwrap().max_retries, 5);
/// # Ok(()) }
/// ```
#[derive(Debug, Clone)]
pub struct ConfigBuilder {
    table_prefix: String,
    max_payload_bytes: usize,
    defaults: EventSettings,
    events: BTreeMap<String, EventSettings>,
    defaults_after: Option<String>,
    dlq: DlqSettings,
    maintenance: MaintenanceSettings,
    inbox: InboxSettings,
}

impl Default for ConfigBuilder {
    fn default() -> Self {
        ConfigBuilder {
            table_prefix: String::new(),
            max_payload_bytes: super::DEFAULT_MAX_PAYLOAD,
            defaults: EventSettings::default(),
            events: BTreeMap::new(),
            defaults_after: None,
            dlq: DlqSettings::default(),
            maintenance: MaintenanceSettings::default(),
            inbox: InboxSettings::default(),
        }
    }
}

impl ConfigBuilder {
    /// Prefix of every table name: a plain identifier such as `shop_`.
    pub fn table_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.table_prefix = prefix.into();
        self
    }
    /// Largest serialized payload accepted by `publish` (default 1 MiB).
    pub fn max_payload_bytes(mut self, n: usize) -> Self {
        self.max_payload_bytes = n;
        self
    }
    /// Changes the defaults every event type starts from: `change` gets the
    /// present defaults (the built-in ones at first) and returns the new ones.
    /// Call it before [`ConfigBuilder::event`]: afterwards [`ConfigBuilder::build`]
    /// refuses, for the types declared before would not have them.
    pub fn defaults(mut self, change: impl FnOnce(EventSettings) -> EventSettings) -> Self {
        self.defaults = change(self.defaults);
        if let Some(first) = self.events.keys().next() {
            self.defaults_after.get_or_insert_with(|| first.clone());
        }
        self
    }
    /// Declares an event type: `change` gets the defaults and returns the type's
    /// settings (`|e| e` keeps them all). Declaring a type again replaces it.
    pub fn event(
        mut self,
        event_type: impl Into<String>,
        change: impl FnOnce(EventSettings) -> EventSettings,
    ) -> Self {
        self.events
            .insert(event_type.into(), change(self.defaults.clone()));
        self
    }
    /// Turns the dead-letter threads on (the default) or off.
    pub fn dlq(mut self, enabled: bool) -> Self {
        self.dlq.enabled = enabled;
        self
    }
    /// How often FAILED events move to the dead letters.
    pub fn dlq_move_interval(mut self, d: Duration) -> Self {
        self.dlq.move_interval = d;
        self
    }
    /// How often dead letters marked for retry return to the outbox.
    pub fn dlq_retry_interval(mut self, d: Duration) -> Self {
        self.dlq.retry_interval = d;
        self
    }
    /// How often resolved dead letters are cleaned up.
    pub fn dlq_cleanup_interval(mut self, d: Duration) -> Self {
        self.dlq.cleanup_interval = d;
        self
    }
    /// Age after which resolved dead letters are deleted.
    pub fn dlq_resolved_ttl(mut self, d: Duration) -> Self {
        self.dlq.resolved_ttl = d;
        self
    }
    /// The longest a schema upgrade waits for a table's lock (default 10s;
    /// [`MaintenanceSettings::migrate_lock_timeout`](crate::MaintenanceSettings::migrate_lock_timeout)).
    pub fn migrate_lock_timeout(mut self, d: Duration) -> Self {
        self.maintenance.migrate_lock_timeout = d;
        self
    }
    /// How often expired claims are recovered.
    pub fn recovery_interval(mut self, d: Duration) -> Self {
        self.maintenance.recovery_interval = d;
        self
    }
    /// How often processed events are cleaned up.
    pub fn cleanup_interval(mut self, d: Duration) -> Self {
        self.maintenance.cleanup_interval = d;
        self
    }
    /// Age after which processed events are deleted. `Duration::ZERO` deletes each
    /// row as soon as the broker acks it.
    pub fn processed_ttl(mut self, d: Duration) -> Self {
        self.maintenance.processed_ttl = d;
        self
    }
    /// Rows one maintenance statement touches at most.
    pub fn maintenance_batch_size(mut self, n: usize) -> Self {
        self.maintenance.batch_size = n;
        self
    }
    /// Age after which consumed inbox ids are deleted.
    pub fn inbox_ttl(mut self, d: Duration) -> Self {
        self.inbox.ttl = d;
        self
    }
    /// How long the inbox cache keeps an id (<= the inbox TTL).
    pub fn inbox_cache_ttl(mut self, d: Duration) -> Self {
        self.inbox.cache_ttl = d;
        self
    }
    /// How often the inbox cleanup runs.
    pub fn inbox_cleanup_interval(mut self, d: Duration) -> Self {
        self.inbox.cleanup_interval = d;
        self
    }
    /// Rows one inbox cleanup statement deletes at most.
    pub fn inbox_batch_size(mut self, n: usize) -> Self {
        self.inbox.batch_size = n;
        self
    }

    /// Validates every value and returns the configuration.
    pub fn build(self) -> Result<Config> {
        if let Some(first) = self.defaults_after {
            return Err(Error::config(
                "defaults",
                format!(
                    "must be set before the event types: event type {first:?} was declared before"
                ),
            ));
        }
        let config = Config {
            table_prefix: self.table_prefix,
            max_payload_bytes: self.max_payload_bytes,
            defaults: self.defaults,
            events: self.events,
            dlq: self.dlq,
            maintenance: self.maintenance,
            inbox: self.inbox,
            observer: Default::default(),
        };
        config.validate()?;
        Ok(config)
    }
}
