//! Kafka (feature `kafka`): a [`KafkaSender`] for the relay and a [`KafkaConsumer`]
//! loop, both on `rdkafka` with its bundled librdkafka and no async runtime.
//!
//! ## Record contract
//! - record key: the event's key (none when the event has none);
//! - record value: the JSON payload, byte for byte;
//! - headers: `txbox-event-id` (the UUIDv7, text), `txbox-event-type`, then the
//!   user's headers as they were published.
//!
//! ## Delivery
//! The producer runs with `acks=all` and `enable.idempotence=true`. Each record is
//! confirmed by its own delivery report, never by `flush()`: a batch waits for all of
//! its reports up to the delivery timeout, and one record that fails (unknown topic,
//! too large, timeout) fails alone while the rest of its batch counts as sent. The
//! relay pipelines ([`Sender::start`](crate::Sender::start)): its next batch is enqueued while the broker
//! still acks the previous one.

//!
//! The sender is in `sender.rs`, the consumer loop in `consumer.rs`, topic
//! creation in `admin.rs`; each item has one path: `txbox::kafka::...`.

use std::collections::BTreeMap;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;

use crate::error::{Error, Result};

mod admin;
mod consumer;
mod sender;

pub use admin::ensure_topic;
pub use consumer::{KafkaConsumer, KafkaConsumerBuilder};
pub use sender::{KafkaSender, KafkaSenderBuilder};

/// Default `message.timeout.ms`: how long librdkafka tries one record.
pub const DEFAULT_MESSAGE_TIMEOUT: Duration = Duration::from_secs(30);

/// The largest `message.timeout.ms` librdkafka takes (its own limit).
const MAX_MESSAGE_TIMEOUT_MS: u64 = 2_147_483_647;

/// The `[kafka]` table of a configuration file: librdkafka properties (e.g.
/// `"bootstrap.servers"`), passed through as they are, numbers and booleans as
/// their text; `[kafka.env]` maps a property to the environment variable that
/// holds its value (`"sasl.password" = "KAFKA_PASSWORD"`: a secret stays out
/// of the file). [`Config::from_toml`](crate::Config::from_toml) reads the same
/// text and leaves this table to the broker. Give them to
/// [`KafkaSenderBuilder::properties`] or [`KafkaConsumerBuilder::properties`].
///
/// ```
/// let text = "[kafka]\n\"bootstrap.servers\" = \"broker:9092\"\n\"linger.ms\" = 10\n";
/// let properties = txbox::kafka::properties_from_toml(text)?;
/// assert_eq!(properties["linger.ms"], "10");
/// # Ok::<(), txbox::Error>(())
/// ```
pub fn properties_from_toml(text: &str) -> Result<BTreeMap<String, String>> {
    let mut table =
        crate::config::broker_section::<toml::Table>(text, "kafka")?.unwrap_or_default();
    // properties whose values come from the environment: `[kafka.env]`
    // maps a property to the variable that holds it (a password)
    let from_env = match table.remove("env") {
        None => BTreeMap::new(),
        Some(toml::Value::Table(env)) => env
            .into_iter()
            .map(|(k, v)| match v {
                toml::Value::String(var) => {
                    let path = format!("kafka.env.{k}");
                    Ok((k, crate::config::from_env(&path, &var)?))
                }
                _ => Err(Error::config(
                    format!("kafka.env.{k}"),
                    "must be the name of an environment variable",
                )),
            })
            .collect::<Result<BTreeMap<_, _>>>()?,
        Some(_) => return Err(Error::config("kafka.env", "must be a table")),
    };
    let properties: Result<BTreeMap<String, String>> = table
        .into_iter()
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
        .collect();
    let mut properties = properties?;
    for (k, v) in from_env {
        if properties.insert(k.clone(), v).is_some() {
            return Err(Error::config(
                format!("kafka.env.{k}"),
                "is set in [kafka] too: keep one",
            ));
        }
    }
    Ok(properties)
}

pub(crate) fn client_config(properties: &BTreeMap<String, String>) -> Result<ClientConfig> {
    if !properties.contains_key("bootstrap.servers") {
        return Err(Error::config("kafka.bootstrap.servers", "must be set"));
    }
    let mut c = ClientConfig::new();
    for (k, v) in properties {
        c.set(k, v);
    }
    Ok(c)
}

pub(crate) fn kafka_err(what: &str, e: KafkaError) -> Error {
    Error::broker_from(format_args!("kafka {what}"), e)
}

/// A client `config` could not be created: the error with the values of the
/// config's secrets taken out of its text (librdkafka may quote a property's
/// value when it refuses it).
pub(crate) fn creation_err(what: &str, e: KafkaError, config: &ClientConfig) -> Error {
    Error::broker(crate::redact::values(
        &format!("kafka {what}: {e}"),
        config.config_map(),
    ))
}
