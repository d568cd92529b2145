//! The sections besides the event types (`[dlq]`, `[maintenance]`,
//! `[inbox]`): read from the TOML file (serde), changed by the builder's
//! closures, each checked beside its fields. Their `Default` is the built-in
//! default.

use std::time::Duration;

use serde::Deserialize;

use super::duration::serde_string as duration;
use super::validate::{within, within_or_zero, MAX_INTERVAL, MAX_TTL};
use crate::error::{Error, Result};

/// Dead-letter settings (`[dlq]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DlqSettings {
    /// Run the three DLQ threads (move, retry, cleanup). Default true: an event
    /// that used up its retries then moves to the dead letters, where the admin
    /// API, the CLI and the HTTP routes list, retry, resolve and delete it. With
    /// it off, FAILED events stay in the outbox until an operator moves them
    /// there ([`Dlq::move_failed`](crate::Dlq::move_failed), `txbox dlq move`).
    pub enabled: bool,
    /// How often FAILED events are moved to the dead letters (default 30s).
    #[serde(with = "duration")]
    pub move_interval: Duration,
    /// How often dead letters marked for retry go back to the outbox (default 10s).
    #[serde(with = "duration")]
    pub retry_interval: Duration,
    /// How often resolved dead letters are cleaned up (default 10m).
    #[serde(with = "duration")]
    pub cleanup_interval: Duration,
    /// Resolved dead letters older than this are deleted (default 24h).
    #[serde(with = "duration")]
    pub resolved_ttl: Duration,
}

impl Default for DlqSettings {
    fn default() -> Self {
        DlqSettings {
            enabled: true,
            move_interval: Duration::from_secs(30),
            retry_interval: Duration::from_secs(10),
            cleanup_interval: Duration::from_secs(600),
            resolved_ttl: Duration::from_secs(86_400),
        }
    }
}

impl DlqSettings {
    /// Runs the dead-letter threads (the default) or not.
    pub fn enabled(mut self, on: bool) -> Self {
        self.enabled = on;
        self
    }
    /// How often FAILED events move to the dead letters.
    pub fn move_interval(mut self, d: Duration) -> Self {
        self.move_interval = d;
        self
    }
    /// How often dead letters marked for retry return to the outbox.
    pub fn retry_interval(mut self, d: Duration) -> Self {
        self.retry_interval = d;
        self
    }
    /// How often resolved dead letters are cleaned up.
    pub fn cleanup_interval(mut self, d: Duration) -> Self {
        self.cleanup_interval = d;
        self
    }
    /// Age after which resolved dead letters are deleted.
    pub fn resolved_ttl(mut self, d: Duration) -> Self {
        self.resolved_ttl = d;
        self
    }

    /// Checks every value; errors name the key under `path` (`dlq`).
    pub(crate) fn validate(&self, path: &str) -> Result<()> {
        let key = |k: &str| format!("{path}.{k}");
        within(&key("move_interval"), self.move_interval, MAX_INTERVAL)?;
        within(&key("retry_interval"), self.retry_interval, MAX_INTERVAL)?;
        within(
            &key("cleanup_interval"),
            self.cleanup_interval,
            MAX_INTERVAL,
        )?;
        within_or_zero(&key("resolved_ttl"), self.resolved_ttl, MAX_TTL)
    }
}

/// Stuck recovery and cleanup settings (`[maintenance]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MaintenanceSettings {
    /// How often expired claims are returned to PENDING (default 60s).
    #[serde(with = "duration")]
    pub recovery_interval: Duration,
    /// How often processed events are cleaned up (default 5m).
    #[serde(with = "duration")]
    pub cleanup_interval: Duration,
    /// Processed events older than this are deleted (default 24h). Zero keeps none:
    /// the relay deletes each row as soon as the broker acks it, instead of marking
    /// it PROCESSED (less database work per event, nothing left to clean up).
    #[serde(with = "duration")]
    pub processed_ttl: Duration,
    /// Rows one maintenance statement touches at most (default 1000).
    pub batch_size: usize,
    /// The longest an upgrade of the schema ([`Store::migrate`](crate::Store::migrate))
    /// waits for a lock on a table before it gives up with an error (default
    /// 10s): an open transaction that wrote the outbox would otherwise hold
    /// it, and every writer would queue behind its wait. A current schema
    /// takes no lock at all.
    #[serde(with = "duration")]
    pub migrate_lock_timeout: Duration,
    /// After each cleanup, rewrite the outbox table when it is mostly empty
    /// space ([`MaintenanceStore::compact`](crate::MaintenanceStore::compact);
    /// PostgreSQL's `CLUSTER`), default true: a table that a long transaction
    /// kept VACUUM from cleaning, then drained, gives its space back.
    pub compact: bool,
    /// The longest the rewrite waits for its lock and runs (default 1s):
    /// writers queue behind a waiting exclusive lock. A rewrite that gives
    /// up is tried again after 1, 2, 4 ... 64 cleanups.
    #[serde(with = "duration")]
    pub compact_timeout: Duration,
}

impl Default for MaintenanceSettings {
    fn default() -> Self {
        MaintenanceSettings {
            recovery_interval: Duration::from_secs(60),
            cleanup_interval: Duration::from_secs(300),
            processed_ttl: Duration::from_secs(86_400),
            batch_size: 1000,
            migrate_lock_timeout: Duration::from_secs(10),
            compact: true,
            compact_timeout: Duration::from_secs(1),
        }
    }
}

impl MaintenanceSettings {
    /// How often expired claims are recovered.
    pub fn recovery_interval(mut self, d: Duration) -> Self {
        self.recovery_interval = d;
        self
    }
    /// How often processed events are cleaned up.
    pub fn cleanup_interval(mut self, d: Duration) -> Self {
        self.cleanup_interval = d;
        self
    }
    /// Age after which processed events are deleted. `Duration::ZERO` deletes
    /// each row as soon as the broker acks it.
    pub fn processed_ttl(mut self, d: Duration) -> Self {
        self.processed_ttl = d;
        self
    }
    /// Rows one maintenance statement touches at most.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
    /// The longest a schema upgrade waits for a table's lock (default 10s).
    pub fn migrate_lock_timeout(mut self, d: Duration) -> Self {
        self.migrate_lock_timeout = d;
        self
    }
    /// Whether a cleanup rewrites a mostly empty outbox table (default true).
    pub fn compact(mut self, on: bool) -> Self {
        self.compact = on;
        self
    }
    /// The longest that rewrite waits for its lock and runs (default 1s).
    pub fn compact_timeout(mut self, d: Duration) -> Self {
        self.compact_timeout = d;
        self
    }

    /// Checks every value; errors name the key under `path` (`maintenance`).
    pub(crate) fn validate(&self, path: &str) -> Result<()> {
        let key = |k: &str| format!("{path}.{k}");
        within(
            &key("recovery_interval"),
            self.recovery_interval,
            MAX_INTERVAL,
        )?;
        within(
            &key("cleanup_interval"),
            self.cleanup_interval,
            MAX_INTERVAL,
        )?;
        within_or_zero(&key("processed_ttl"), self.processed_ttl, MAX_TTL)?;
        within(
            &key("migrate_lock_timeout"),
            self.migrate_lock_timeout,
            MAX_INTERVAL,
        )?;
        within(
            &key("compact_timeout"),
            self.compact_timeout,
            Duration::from_secs(60),
        )?;
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(Error::config(
                key("batch_size"),
                "must be between 1 and 100000",
            ));
        }
        Ok(())
    }
}

/// Inbox settings (`[inbox]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct InboxSettings {
    /// Consumed ids older than this are deleted (default 24h). Keep it at least as
    /// long as a duplicate can still arrive.
    #[serde(with = "duration")]
    pub ttl: Duration,
    /// How long the inbox cache keeps an id (default 1h; must be <= `ttl`).
    #[serde(with = "duration")]
    pub cache_ttl: Duration,
    /// How often the cleanup runs (default 10m).
    #[serde(with = "duration")]
    pub cleanup_interval: Duration,
    /// Rows one cleanup statement deletes at most (default 1000).
    pub batch_size: usize,
}

impl Default for InboxSettings {
    fn default() -> Self {
        InboxSettings {
            ttl: Duration::from_secs(86_400),
            cache_ttl: Duration::from_secs(3600),
            cleanup_interval: Duration::from_secs(600),
            batch_size: 1000,
        }
    }
}

impl InboxSettings {
    /// Age after which consumed inbox ids are deleted.
    pub fn ttl(mut self, d: Duration) -> Self {
        self.ttl = d;
        self
    }
    /// How long the inbox cache keeps an id (<= the inbox TTL).
    pub fn cache_ttl(mut self, d: Duration) -> Self {
        self.cache_ttl = d;
        self
    }
    /// How often the inbox cleanup runs.
    pub fn cleanup_interval(mut self, d: Duration) -> Self {
        self.cleanup_interval = d;
        self
    }
    /// Rows one inbox cleanup statement deletes at most.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }

    /// Checks every value; errors name the key under `path` (`inbox`).
    pub(crate) fn validate(&self, path: &str) -> Result<()> {
        let key = |k: &str| format!("{path}.{k}");
        within(&key("ttl"), self.ttl, MAX_TTL)?;
        within(&key("cache_ttl"), self.cache_ttl, MAX_TTL)?;
        within(
            &key("cleanup_interval"),
            self.cleanup_interval,
            MAX_INTERVAL,
        )?;
        if self.cache_ttl > self.ttl {
            return Err(Error::config(
                key("cache_ttl"),
                format!("must be <= {path}.ttl"),
            ));
        }
        if !(1..=100_000).contains(&self.batch_size) {
            return Err(Error::config(
                key("batch_size"),
                "must be between 1 and 100000",
            ));
        }
        Ok(())
    }
}
