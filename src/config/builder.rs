//! [`ConfigBuilder`]: a [`Config`] built in code.

use std::collections::BTreeMap;
use std::time::Duration;

use super::{Config, DlqSettings, EventOptions, EventSettings, InboxSettings, MaintenanceSettings};
use crate::error::Result;

/// Builds a [`Config`] in code. Its `Debug` redacts secret Kafka properties.
#[derive(Debug, Clone, Default)]
pub struct ConfigBuilder {
    pub(crate) table_prefix: Option<String>,
    pub(crate) max_payload_bytes: Option<usize>,
    pub(crate) defaults: EventOptions,
    pub(crate) events: BTreeMap<String, EventOptions>,
    pub(crate) dlq: DlqOptions,
    pub(crate) maintenance: MaintenanceOptions,
    pub(crate) inbox: InboxOptions,
    pub(crate) kafka: crate::redact::SecretMap,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct InboxOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) cache_ttl: Option<Duration>,
    pub(crate) cleanup_interval: Option<Duration>,
    pub(crate) batch_size: Option<usize>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct DlqOptions {
    pub(crate) enabled: Option<bool>,
    pub(crate) move_interval: Option<Duration>,
    pub(crate) retry_interval: Option<Duration>,
    pub(crate) cleanup_interval: Option<Duration>,
    pub(crate) resolved_ttl: Option<Duration>,
}

#[derive(Debug, Clone, Default)]
pub(crate) struct MaintenanceOptions {
    pub(crate) recovery_interval: Option<Duration>,
    pub(crate) cleanup_interval: Option<Duration>,
    pub(crate) processed_ttl: Option<Duration>,
    pub(crate) batch_size: Option<usize>,
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
