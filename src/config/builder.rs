//! [`ConfigBuilder`]: a [`Config`] built in code.

use std::collections::BTreeMap;

use super::{Config, DlqSettings, EventSettings, InboxSettings, MaintenanceSettings};
use crate::error::{Error, Result};

/// Builds a [`Config`] in code, one section at a time and each the same way: a
/// closure gets the section's present settings and returns them changed (the
/// settings types have a setter per field). Set the defaults first, then
/// declare each event type, which starts from those defaults.
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
///     .dlq(|d| d.move_interval(Duration::from_secs(5)))
///     .maintenance(|m| m.processed_ttl(Duration::ZERO))
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
    /// Changes the dead-letter settings (`[dlq]`): `change` gets the present
    /// ones and returns the new ones, as [`ConfigBuilder::event`] does for a
    /// type: `.dlq(|d| d.move_interval(Duration::from_secs(5)))`.
    pub fn dlq(mut self, change: impl FnOnce(DlqSettings) -> DlqSettings) -> Self {
        self.dlq = change(self.dlq);
        self
    }
    /// Changes the recovery and cleanup settings (`[maintenance]`):
    /// `.maintenance(|m| m.processed_ttl(Duration::ZERO))`.
    pub fn maintenance(
        mut self,
        change: impl FnOnce(MaintenanceSettings) -> MaintenanceSettings,
    ) -> Self {
        self.maintenance = change(self.maintenance);
        self
    }
    /// Changes the inbox settings (`[inbox]`): `.inbox(|i| i.ttl(Duration::from_secs(3600)))`.
    pub fn inbox(mut self, change: impl FnOnce(InboxSettings) -> InboxSettings) -> Self {
        self.inbox = change(self.inbox);
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

#[cfg(test)]
mod tests {
    use crate::error::Error;
    use crate::Config;
    use std::time::Duration;

    /// Each section is changed the same way, the changes add up, and a value
    /// out of range is refused with the key's path in the file's terms.
    #[test]
    fn every_section_is_set_by_a_closure_and_checked_by_its_path() {
        let s = Duration::from_secs;
        let c = Config::builder()
            .dlq(|d| d.move_interval(s(5)))
            .dlq(|d| d.enabled(false))
            .maintenance(|m| m.processed_ttl(Duration::ZERO).batch_size(10))
            .inbox(|i| i.ttl(s(7200)).cache_ttl(s(60)))
            .build()
            .unwrap();
        assert_eq!((c.dlq.enabled, c.dlq.move_interval), (false, s(5)));
        assert_eq!(
            (c.maintenance.processed_ttl, c.maintenance.batch_size),
            (Duration::ZERO, 10)
        );
        assert_eq!((c.inbox.ttl, c.inbox.cache_ttl), (s(7200), s(60)));
        let path = |b: crate::ConfigBuilder| match b.build() {
            Err(Error::Config { path, .. }) => path,
            other => panic!("{other:?}"),
        };
        assert_eq!(
            path(Config::builder().dlq(|d| d.move_interval(Duration::ZERO))),
            "dlq.move_interval"
        );
        assert_eq!(
            path(Config::builder().maintenance(|m| m.batch_size(0))),
            "maintenance.batch_size"
        );
        assert_eq!(
            path(Config::builder().inbox(|i| i.ttl(s(60)).cache_ttl(s(61)))),
            "inbox.cache_ttl"
        );
    }
}
