//! The TOML file. The file is read into the same structs the
//! builder fills ([`EventSettings`] and the rest): `[defaults]` is merged into each
//! `[events.x]` table before that table is read, and every error names the key
//! path of the wrong value.

use std::collections::BTreeMap;

use serde::Deserialize;

use super::{Config, DlqSettings, EventSettings, InboxSettings, MaintenanceSettings};
use crate::error::{Error, Result};

/// The file: the sections of [`Config`], with `[defaults]` and each
/// `[events.x]` kept as tables until they are merged.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    table_prefix: String,
    #[serde(default = "default_max_payload")]
    max_payload_bytes: usize,
    #[serde(default)]
    defaults: EventSettings,
    #[serde(default)]
    events: BTreeMap<String, EventSettings>,
    #[serde(default)]
    dlq: DlqSettings,
    #[serde(default)]
    maintenance: MaintenanceSettings,
    #[serde(default)]
    inbox: InboxSettings,
}

fn default_max_payload() -> usize {
    super::DEFAULT_MAX_PAYLOAD
}

/// `over` on top of `base`, tables merged key by key.
fn merge(base: &toml::Table, over: toml::Table) -> toml::Table {
    let mut merged = base.clone();
    for (key, value) in over {
        let value = match (merged.remove(&key), value) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => {
                toml::Value::Table(merge(&b, o))
            }
            (_, value) => value,
        };
        merged.insert(key, value);
    }
    merged
}

/// The file's text as a table.
fn root(text: &str) -> Result<toml::Table> {
    text.parse()
        .map_err(|e: toml::de::Error| Error::ConfigSyntax(syntax(text, &e).into()))
}

/// A TOML syntax error as "line L, column C: what", without the text: the
/// parser's own error quotes the line (a URL with its password, say) in its
/// `Display` and holds the whole input in its `Debug`.
fn syntax(text: &str, e: &toml::de::Error) -> String {
    let Some(span) = e.span() else {
        return e.message().to_owned();
    };
    let before = text.get(..span.start).unwrap_or(text);
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
    format!("line {line}, column {column}: {}", e.message())
}

/// A setting that moved out of the core in 0.3, named where it is found.
fn moved(root: &toml::Table) -> Result<()> {
    let tables = root
        .get("defaults")
        .into_iter()
        .map(|t| ("defaults".to_owned(), t));
    let events = match root.get("events") {
        Some(toml::Value::Table(events)) => events
            .iter()
            .map(|(n, t)| (format!("events.{n}"), t))
            .collect(),
        _ => Vec::new(),
    };
    for (path, table) in tables.chain(events) {
        if let Some(table) = table.as_table() {
            if table.contains_key("routing_key") {
                return Err(Error::config(
                    format!("{path}.routing_key"),
                    "has moved to the RabbitMQ sender in txbox 0.3: set it under \
                     [rabbitmq.routing_keys] (RabbitSender::from_toml) or with \
                     RabbitSenderBuilder::routing_key",
                ));
            }
        }
    }
    Ok(())
}

/// The value of the environment variable `var`, which the setting at `path`
/// names (a secret kept out of the file): an error naming both when it is not
/// set or not UTF-8. The value itself is never part of an error.
#[cfg(any(feature = "kafka", feature = "rabbitmq"))]
pub(crate) fn from_env(path: &str, var: &str) -> Result<String> {
    std::env::var(var).map_err(|e| {
        let why = match e {
            std::env::VarError::NotPresent => "which is not set",
            std::env::VarError::NotUnicode(_) => "which is not UTF-8",
        };
        Error::config(
            path,
            format!("names the environment variable {var:?}, {why}"),
        )
    })
}

/// The broker's section `name` of a configuration file (`[kafka]`,
/// `[rabbitmq]`), read by its broker module into `T`; `None` when the file
/// has none. Errors name the key path, from `name` on.
#[cfg(any(feature = "kafka", feature = "rabbitmq"))]
pub(crate) fn broker_section<T: serde::de::DeserializeOwned>(
    text: &str,
    name: &str,
) -> Result<Option<T>> {
    let Some(table) = root(text)?.remove(name) else {
        return Ok(None);
    };
    serde_path_to_error::deserialize(table)
        .map(Some)
        .map_err(|e| path_error(name, e))
}

/// A value serde refused, as an error naming its key path under `prefix`.
fn path_error(prefix: &str, e: serde_path_to_error::Error<toml::de::Error>) -> Error {
    let path = match e.path().to_string().as_str() {
        "." => prefix.to_owned(),
        p if prefix.is_empty() => p.to_owned(),
        p => format!("{prefix}.{p}"),
    };
    let message = e.into_inner().message().to_owned();
    let message = if message.starts_with("has ") || message.starts_with("must ") {
        message
    } else {
        format!("is not valid: {message}")
    };
    Error::config(path, message)
}

/// Parses the file's text into a [`Config`] (not yet validated). The
/// brokers' sections ([`crate::sender::BROKER_SECTIONS`]) are left to the
/// broker modules, which read them from the same text.
pub(super) fn parse(text: &str) -> Result<Config> {
    let mut root = root(text)?;
    for section in crate::sender::BROKER_SECTIONS {
        root.remove(*section);
    }
    moved(&root)?;
    let defaults = match root.get("defaults") {
        Some(toml::Value::Table(t)) => t.clone(),
        _ => toml::Table::new(),
    };
    // only tables are merged: anything else is left for serde to refuse, with its path
    if let Some(toml::Value::Table(events)) = root.get_mut("events") {
        for (_, value) in events.iter_mut() {
            if let toml::Value::Table(table) = value {
                *table = merge(&defaults, std::mem::take(table));
            }
        }
    }
    let file: File = serde_path_to_error::deserialize(toml::Value::Table(root))
        .map_err(|e| path_error("", e))?;
    Ok(Config {
        table_prefix: file.table_prefix,
        max_payload_bytes: file.max_payload_bytes,
        defaults: file.defaults,
        events: file.events,
        dlq: file.dlq,
        maintenance: file.maintenance,
        inbox: file.inbox,
        observer: Default::default(),
    })
}

#[cfg(test)]
mod tests {
    use crate::config::duration::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_as_before_and_what_humantime_reads() {
        let ms = Duration::from_millis;
        for (text, want) in [
            ("250ms", Some(ms(250))),
            ("10s", Some(ms(10_000))),
            ("1m", Some(ms(60_000))),
            ("24h", Some(ms(86_400_000))),
            ("7d", Some(ms(7 * 86_400_000))),
            ("0", Some(Duration::ZERO)),
            ("0s", Some(Duration::ZERO)),
            ("1.5s", Some(ms(1500))),
            ("0.5m", Some(ms(30_000))),
            ("1h 30m", Some(ms(5_400_000))),
            (" 2s ", Some(ms(2000))),
            ("soon", None),
            ("", None),
            ("1.5", None),
            ("-1s", None),
            ("1e400s", None),
        ] {
            assert_eq!(parse_duration(text), want, "{text:?}");
        }
    }
}
