//! The ranges every setting is checked against, and the checks the
//! sections share (each section checks its own fields beside them).

use std::time::Duration;

use crate::error::{Error, Result};

/// Largest `max_payload_bytes`: 256 MiB.
pub(crate) const MAX_PAYLOAD_LIMIT: usize = 256 * 1024 * 1024;
/// Longest polling delay (`delay`, `min`, `max`, `initial_delay`) and first
/// backoff delay: one day.
pub(crate) const MAX_DELAY: Duration = Duration::from_secs(86_400);
/// Longest interval of a maintenance or DLQ job: 30 days.
pub(crate) const MAX_INTERVAL: Duration = Duration::from_secs(30 * 86_400);
/// Longest TTL (processed rows, dead letters, inbox ids): 10 years.
pub(crate) const MAX_TTL: Duration = Duration::from_secs(3650 * 86_400);
/// Longest claim lease: 24 days. A held claim's lease becomes PostgreSQL's
/// `idle_in_transaction_session_timeout`, a 32-bit count of milliseconds (24.8
/// days at most).
pub(crate) const MAX_LEASE: Duration = Duration::from_secs(24 * 86_400);
/// Largest polling and backoff multiplier.
pub(crate) const MAX_MULTIPLIER: f64 = 100.0;

/// A duration as the configuration spells it (`"250ms"`, `"90s"`, `"24d"`).
pub(crate) fn spell(d: Duration) -> String {
    let ms = d.as_millis();
    match ms {
        _ if ms % 86_400_000 == 0 && ms > 0 => format!("{}d", ms / 86_400_000),
        _ if ms % 3_600_000 == 0 && ms > 0 => format!("{}h", ms / 3_600_000),
        _ if ms % 1000 == 0 => format!("{}s", ms / 1000),
        _ => format!("{ms}ms"),
    }
}

/// `d` is more than zero and at most `max`.
pub(crate) fn within(path: &str, d: Duration, max: Duration) -> Result<()> {
    if d.is_zero() || d > max {
        return Err(Error::config(
            path,
            format!("must be more than 0 and at most {}, not {d:?}", spell(max)),
        ));
    }
    Ok(())
}

/// `d` is at most `max` (zero allowed).
pub(crate) fn within_or_zero(path: &str, d: Duration, max: Duration) -> Result<()> {
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

/// A growth factor between 1 and [`MAX_MULTIPLIER`].
pub(crate) fn multiplier(path: &str, m: f64) -> Result<()> {
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
