//! The settings of an event type (`[defaults]`, `[events.x]`), each defined
//! once: the structs below are what the TOML file is read into (serde), what
//! the builder's closures change, and what the relay reads. Their `Default` is
//! the built-in default. The other sections are in `sections.rs`.

use std::time::Duration;

use serde::Deserialize;

use super::validate::{
    multiplier, plain_name, spell, within, within_or_zero, MAX_DELAY, MAX_LEASE,
};
use crate::error::{Error, Result};

use super::duration::serde_string as duration;

/// How a poller waits between polls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "String")]
pub enum PollingStrategy {
    /// Wait `delay` after a partial or empty batch. A full batch polls again at once:
    /// more work is waiting.
    Fixed,
    /// A full batch polls again at once and resets the delay to `min`; a partial
    /// batch (it found work) waits `min` and resets the delay to it; an empty poll
    /// waits the current delay, then multiplies it by `multiplier`, up to `max`.
    /// With the defaults (250ms, x1.5, 1m) an idle type polls about 70 times in
    /// its first hour and 60 times an hour after that.
    Adaptive,
}

/// How a poller claims a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum ClaimMode {
    /// The default, on every database: the claim stamps the rows IN_PROCESS with a
    /// token and a lease in one short transaction; the finish checks the token, and
    /// stuck recovery returns rows whose lease expired. Each event row is written
    /// twice (claim, finish).
    #[default]
    Lease,
    /// PostgreSQL only: the claim locks the rows (`FOR UPDATE SKIP LOCKED`) in a
    /// transaction that stays open until the broker acked the batch, and the finish
    /// commits in it. Each row is written once, so the database does about half the
    /// work per event (see `docs/BENCHMARKS.md`). The rows stay PENDING meanwhile;
    /// other relays skip them while they are locked. A relay that dies loses its
    /// connection and the rows are free at once; one that hangs past `lease` has its
    /// session ended by the database (`idle_in_transaction_session_timeout`), which
    /// frees the rows and makes its late finish fail. Costs one database
    /// connection per batch in flight (`in_flight` per event type) while it waits
    /// for the broker. With `processed_ttl` zero the claim deletes the rows in that
    /// transaction (others still see them PENDING until it commits): a batch the
    /// broker acked whole is finished by the commit alone, and the events it did
    /// not ack are written back with their attempt counted.
    Lock,
}

/// How a poller learns that events were committed, besides polling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum Wake {
    /// The default: on PostgreSQL every publish makes its commit wake the
    /// relay (`NOTIFY`, delivered only if the transaction commits), and the
    /// relay's listener wakes the poller at once. Other databases have no such
    /// notification: there a [`RelayWaker`](crate::RelayWaker) wakes it, and
    /// polling stays the safety net everywhere.
    ///
    /// PostgreSQL commits the transactions that notify one at a time,
    /// cluster-wide, so the notifications are rationed: one commit per type
    /// notifies at a time, and the relay waits for the others and wakes the
    /// poller again (docs/HOW-IT-WORKS.md, "Wake-up on commit"). `SET txbox.wake =
    /// 'off'` turns it off for a transaction, session or role (two-phase
    /// commit needs it), and `ALTER TABLE <outbox table> DISABLE TRIGGER
    /// <prefix>outbox_events_wake` for the whole table.
    #[default]
    Notify,
    /// Polling only (and [`RelayWaker`](crate::RelayWaker)): this type's
    /// commits send no notification (the relay tells the database so when it
    /// starts, [`ClaimStore::set_commit_wake`](crate::store::ClaimStore::set_commit_wake)).
    Poll,
}

/// Whether one event type's events are sent in order per key.
///
/// ```
/// use txbox::{Config, EventOrder, NewEvent, OnPoison};
/// let config = Config::from_toml(r#"
///     [events.order-events]
///     ordering = "key"
///     on_poison = "block"
/// "#)?;
/// let s = config.event("order-events").unwrap();
/// assert_eq!((s.ordering, s.on_poison), (EventOrder::Key, OnPoison::Block));
/// // an order's created, paid and shipped share its id as their key, so they
/// // reach the consumers in this order
/// let created = NewEvent::new("order-events", &serde_json::json!({"created": 42}))?.key("order-42");
/// # let _ = created;
/// # Ok::<(), txbox::Error>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum EventOrder {
    /// The default: events are claimed oldest first, but batches in flight,
    /// retries with backoff and several relays may send them in any order.
    #[default]
    None,
    /// Events with the same key (`NewEvent::key`) are sent one at a time, in
    /// id (publish) order, on every relay instance: an event is claimed only
    /// when no earlier event of its key is waiting, in process, retrying or (with
    /// [`OnPoison::Block`]) dead. Events without a key are not ordered; different
    /// keys go in parallel, in the same batches.
    ///
    /// The order is the order of publish: two transactions that publish events
    /// of one key at the same time without serializing on the key's own row
    /// (as a write to the aggregate does) are in the order of their ids, and an
    /// event whose commit comes after a later event of its key was sent is sent
    /// after it.
    Key,
}

/// What an ordered type ([`EventOrder::Key`]) does with an event that used up
/// its retries (a poison event).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(try_from = "String")]
pub enum OnPoison {
    /// The default: its key waits. The later events of the key stay pending until
    /// the failed event is sent by a retry, or an operator resolves or deletes its
    /// dead letter ([`Dlq::blocked_keys`](crate::Dlq::blocked_keys) lists the keys
    /// that wait, and for which event).
    #[default]
    Block,
    /// The failed event goes to the dead letters and its key goes on without it;
    /// `txbox_ordered_skipped_total` counts these events.
    Skip,
}

/// The names of a setting's values, as the TOML configuration spells them:
/// `FromStr` and `TryFrom<String>` (which serde reads them through) refuse
/// another name saying which are allowed, and `Display` writes the name.
macro_rules! named_values {
    ($($ty:ident { $($name:literal => $variant:ident),+ $(,)? })*) => {$(
        impl std::str::FromStr for $ty {
            type Err = String;
            fn from_str(s: &str) -> std::result::Result<Self, String> {
                match s {
                    $($name => Ok($ty::$variant),)+
                    other => Err(format!(
                        "must be {}, not {other:?}",
                        [$(concat!("\"", $name, "\"")),+].join(" or ")
                    )),
                }
            }
        }

        impl TryFrom<String> for $ty {
            type Error = String;
            fn try_from(s: String) -> std::result::Result<Self, String> {
                s.parse()
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(match self {
                    $($ty::$variant => $name,)+
                })
            }
        }
    )*};
}

named_values! {
    PollingStrategy { "fixed" => Fixed, "adaptive" => Adaptive }
    ClaimMode { "lease" => Lease, "lock" => Lock }
    Wake { "notify" => Notify, "poll" => Poll }
    EventOrder { "none" => None, "key" => Key }
    OnPoison { "block" => Block, "skip" => Skip }
}

/// Polling settings of one event type (`[events.x.polling]`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Polling {
    /// Fixed or adaptive (default adaptive).
    pub strategy: PollingStrategy,
    /// The delay of the fixed strategy (default 1s).
    #[serde(with = "duration")]
    pub delay: Duration,
    /// The shortest adaptive delay (default 250ms).
    #[serde(with = "duration")]
    pub min: Duration,
    /// The longest adaptive delay (default 1m).
    #[serde(with = "duration")]
    pub max: Duration,
    /// Growth of the adaptive delay after an empty poll (default 1.5).
    pub multiplier: f64,
    /// Wait before the first poll after start (default 0).
    #[serde(with = "duration")]
    pub initial_delay: Duration,
}

impl Default for Polling {
    fn default() -> Self {
        Polling {
            strategy: PollingStrategy::Adaptive,
            delay: Duration::from_secs(1),
            min: Duration::from_millis(250),
            max: Duration::from_secs(60),
            multiplier: 1.5,
            initial_delay: Duration::ZERO,
        }
    }
}

/// Retry backoff of one event type (`[events.x.backoff]`): the n-th retry waits
/// `delay * multiplier^(n-1)`, spread by `± jitter` (a fraction). Disabled means a
/// fixed `delay` every time.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Backoff {
    /// Exponential growth on (default true). Off: a fixed delay, never zero.
    pub enabled: bool,
    /// The first retry's delay (default 10s).
    #[serde(with = "duration")]
    pub delay: Duration,
    /// Growth per retry (default 3.0).
    pub multiplier: f64,
    /// Random spread, a fraction in `[0, 1)` (default 0.1: ±10%).
    pub jitter: f64,
}

impl Default for Backoff {
    fn default() -> Self {
        Backoff {
            enabled: true,
            delay: Duration::from_secs(10),
            multiplier: 3.0,
            jitter: 0.1,
        }
    }
}

impl Backoff {
    /// The delay before retry number `retry` (1 for the first retry), with jitter.
    pub fn delay_for(&self, retry: u32) -> Duration {
        let base = if self.enabled {
            let exp = retry.saturating_sub(1).min(64) as i32;
            self.delay.as_secs_f64() * self.multiplier.powi(exp)
        } else {
            self.delay.as_secs_f64()
        };
        let spread = if self.jitter > 0.0 {
            1.0 + self.jitter * (fastrand::f64() * 2.0 - 1.0)
        } else {
            1.0
        };
        // Cap at 30 days so huge exponents stay representable; settings made by
        // hand (NaN, infinities) fall back to the cap instead of panicking.
        let secs = base * spread;
        let secs = if secs.is_nan() { 30.0 * 86_400.0 } else { secs };
        Duration::try_from_secs_f64(secs.clamp(0.001, 30.0 * 86_400.0))
            .unwrap_or(Duration::from_secs(30 * 86_400))
    }
}

/// The settings of one event type: `[defaults]` (or the builder's
/// [`ConfigBuilder::defaults`](super::ConfigBuilder::defaults)) with the type's own
/// `[events.x]` (or [`ConfigBuilder::event`](super::ConfigBuilder::event)) on top.
///
/// The chained setters are for the builder's closures:
///
/// ```
/// use std::time::Duration;
/// let config = txbox::Config::builder()
///     .defaults(|d| d.batch_size(100))
///     .event("order-created", |e| {
///         e.destination("orders")
///             .adaptive_polling(Duration::from_millis(100), Duration::from_secs(10), 2.0)
///     })
///     .build()?;
/// let settings = config.event("order-created").unwrap();
/// assert_eq!(settings.batch_size, 100);
/// assert_eq!(settings.polling.min, Duration::from_millis(100));
/// # Ok::<(), txbox::Error>(())
/// ```
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct EventSettings {
    /// Topic (Kafka) or exchange (RabbitMQ). `None`: the event type's name.
    pub destination: Option<String>,
    /// Most events one poll claims (default 200).
    pub batch_size: usize,
    /// Most claimed batches one poller has with the broker at a time (default 3):
    /// the next batches are claimed while the broker acks the previous ones. 1
    /// sends one batch at a time. Senders that cannot pipeline behave as 1.
    pub in_flight: usize,
    /// Polling between claims.
    pub polling: Polling,
    /// Retries after the first failed send before the event is FAILED (default 3).
    pub max_retries: u32,
    /// Delay between retries.
    pub backoff: Backoff,
    /// Longest a claimed batch may stay in process before recovery returns it
    /// (default 300s).
    #[serde(with = "duration")]
    pub lease: Duration,
    /// How batches are claimed (default [`ClaimMode::Lease`]).
    pub claim: ClaimMode,
    /// How the poller learns of commits besides polling (default
    /// [`Wake::Notify`]).
    pub wake: Wake,
    /// Whether events of one key are sent in order (default [`EventOrder::None`]).
    pub ordering: EventOrder,
    /// With [`EventOrder::Key`]: what a key does when one of its events used up
    /// its retries (default [`OnPoison::Block`]).
    pub on_poison: OnPoison,
}

impl Default for EventSettings {
    fn default() -> Self {
        EventSettings {
            destination: None,
            batch_size: 200,
            in_flight: 3,
            polling: Polling::default(),
            max_retries: 3,
            backoff: Backoff::default(),
            lease: Duration::from_secs(300),
            claim: ClaimMode::Lease,
            wake: Wake::Notify,
            ordering: EventOrder::None,
            on_poison: OnPoison::Block,
        }
    }
}

impl EventSettings {
    /// Where the events of `event_type` go: its destination, the type's name
    /// when not set.
    pub(crate) fn destination_for<'a>(&'a self, event_type: &'a str) -> &'a str {
        self.destination.as_deref().unwrap_or(event_type)
    }

    /// Checks every value; errors name the key under `path` (`defaults`,
    /// `events.<type>`).
    pub(crate) fn validate(&self, path: &str) -> Result<()> {
        let s = self;
        let err = |key: &str, msg: &str| Err(Error::config(format!("{path}.{key}"), msg));
        if let Some(d) = &s.destination {
            if d.trim().is_empty() {
                return err("destination", "must not be blank");
            }
            if let Err(why) = plain_name(d) {
                return err("destination", &why);
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

    /// The poison policy of a type ordered by key; `None` for an unordered
    /// one (what [`ClaimArgs::ordered`](crate::store::ClaimArgs::ordered) takes).
    pub(crate) fn key_order(&self) -> Option<OnPoison> {
        (self.ordering == EventOrder::Key).then_some(self.on_poison)
    }

    /// Topic (Kafka) or exchange (RabbitMQ).
    pub fn destination(mut self, d: impl Into<String>) -> Self {
        self.destination = Some(d.into());
        self
    }
    /// Most events one poll claims.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = n;
        self
    }
    /// Most batches in flight at once per poller (see [`EventSettings::in_flight`](#structfield.in_flight)).
    pub fn in_flight(mut self, n: usize) -> Self {
        self.in_flight = n;
        self
    }
    /// Fixed polling with this delay.
    pub fn fixed_polling(mut self, delay: Duration) -> Self {
        self.polling.strategy = PollingStrategy::Fixed;
        self.polling.delay = delay;
        self
    }
    /// Adaptive polling between `min` and `max`, growing by `multiplier`.
    pub fn adaptive_polling(mut self, min: Duration, max: Duration, multiplier: f64) -> Self {
        self.polling.strategy = PollingStrategy::Adaptive;
        self.polling.min = min;
        self.polling.max = max;
        self.polling.multiplier = multiplier;
        self
    }
    /// Wait before the first poll.
    pub fn initial_delay(mut self, d: Duration) -> Self {
        self.polling.initial_delay = d;
        self
    }
    /// Retries after the first failed send.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }
    /// Exponential backoff on or off (off: fixed delay).
    pub fn backoff_enabled(mut self, on: bool) -> Self {
        self.backoff.enabled = on;
        self
    }
    /// The first retry's delay.
    pub fn backoff_delay(mut self, d: Duration) -> Self {
        self.backoff.delay = d;
        self
    }
    /// Backoff growth per retry.
    pub fn backoff_multiplier(mut self, m: f64) -> Self {
        self.backoff.multiplier = m;
        self
    }
    /// Backoff jitter, a fraction in `[0, 1)`.
    pub fn backoff_jitter(mut self, j: f64) -> Self {
        self.backoff.jitter = j;
        self
    }
    /// Claim lease: the longest a batch may stay in process before recovery.
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = d;
        self
    }
    /// How batches are claimed (see [`ClaimMode`]).
    pub fn claim(mut self, mode: ClaimMode) -> Self {
        self.claim = mode;
        self
    }
    /// How the poller learns of commits besides polling (see [`Wake`]).
    pub fn wake(mut self, wake: Wake) -> Self {
        self.wake = wake;
        self
    }
    /// Whether events of one key are sent in order (see [`EventOrder`]).
    pub fn ordering(mut self, ordering: EventOrder) -> Self {
        self.ordering = ordering;
        self
    }
    /// What an ordered key does with a poison event (see [`OnPoison`]).
    pub fn on_poison(mut self, on_poison: OnPoison) -> Self {
        self.on_poison = on_poison;
        self
    }
}
