//! The ranges every setting is checked against, and the checks.

use std::time::Duration;

use super::EventSettings;
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

pub(crate) fn validate_event(s: &EventSettings, path: &str) -> Result<()> {
    let err = |key: &str, msg: &str| Err(Error::config(format!("{path}.{key}"), msg));
    if let Some(d) = &s.destination {
        if d.trim().is_empty() {
            return err("destination", "must not be blank");
        }
        if let Err(why) = plain_name(d) {
            return err("destination", &why);
        }
    }
    if let Some(k) = &s.routing_key {
        if k.len() > 255 {
            return err("routing_key", "must be at most 255 bytes");
        }
        if k.chars().any(char::is_control) {
            return err("routing_key", "must not contain control characters");
        }
    }
    if !(1..=10_000).contains(&s.batch_size) {
        return err("batch_size", "must be between 1 and 10000");
    }
    if !(1..=16).contains(&s.in_flight) {
        return err("in_flight", "must be between 1 and 16");
    }
    let p = &s.polling;
    let key = |k: &str| format!("{path}.{k}");
    within(&key("polling.delay"), p.delay, MAX_DELAY)?;
    within(&key("polling.min"), p.min, MAX_DELAY)?;
    within(&key("polling.max"), p.max, MAX_DELAY)?;
    within_or_zero(&key("polling.initial_delay"), p.initial_delay, MAX_DELAY)?;
    if p.max < p.min {
        return err("polling.max", "must be >= polling.min");
    }
    multiplier(&key("polling.multiplier"), p.multiplier)?;
    if s.max_retries > 100 {
        return err("max_retries", "must be <= 100");
    }
    let b = &s.backoff;
    if b.delay.is_zero() {
        return err(
            "backoff.delay",
            "must be > 0 (disable backoff for a fixed delay)",
        );
    }
    within(&key("backoff.delay"), b.delay, MAX_DELAY)?;
    multiplier(&key("backoff.multiplier"), b.multiplier)?;
    if !(b.jitter.is_finite() && (0.0..1.0).contains(&b.jitter)) {
        return err("backoff.jitter", "must be >= 0.0 and < 1.0");
    }
    if s.lease < Duration::from_secs(1) || s.lease > MAX_LEASE {
        return Err(Error::config(
            key("lease"),
            format!(
                "must be between 1s and {}, not {:?}",
                spell(MAX_LEASE),
                s.lease
            ),
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
