//! The TOML file and its durations.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Deserialize;

use super::builder::{DlqOptions, InboxOptions, MaintenanceOptions};
use super::{ConfigBuilder, EventOptions, PollingStrategy};
use crate::error::{Error, Result};

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
pub(super) mod toml_model {
    use super::*;

    #[derive(Deserialize, Default)]
    #[serde(deny_unknown_fields)]
    pub(crate) struct Root {
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
        pub(crate) fn into_builder(self) -> Result<ConfigBuilder> {
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
