//! Durations as the configuration spells them (humantime's words), read from
//! the TOML file's strings.

use std::time::Duration;

/// Parses a duration as the configuration spells it: what humantime (2.4 or
/// later) accepts, e.g. `"250ms"`, `"10s"`, `"1.5s"`, `"1m"`, `"24h"`, `"7d"`,
/// `"1h 30m"`, `"0"`.
pub(crate) fn parse_duration(s: &str) -> Option<Duration> {
    humantime::parse_duration(s.trim()).ok()
}

/// `#[serde(with = "duration")]`: a duration field read from a string.
pub(crate) mod serde_string {
    use std::time::Duration;

    use serde::{Deserialize, Deserializer};

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_duration(&s).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "has invalid duration {s:?} (use e.g. \"250ms\", \"10s\", \"1m\", \"24h\")"
            ))
        })
    }
}

#[cfg(feature = "rabbitmq")]
/// `#[serde(default, with = "...")]`: an optional duration field read from a
/// string (absent: `None`).
pub(crate) mod serde_optional {
    use std::time::Duration;

    use serde::Deserializer;

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        super::serde_string::deserialize(d).map(Some)
    }
}
