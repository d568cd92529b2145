//! [`EventOptions`]: the `defaults` block and each event type's overrides.

use std::time::Duration;

use super::{ClaimMode, EventSettings, PollingStrategy};

/// A partial [`EventSettings`]: the `defaults` block or one event type's override.
/// Unset values inherit (override <- defaults <- built-in defaults).
///
/// ```
/// use std::time::Duration;
/// let options = txbox::EventOptions::new()
///     .destination("orders")
///     .adaptive_polling(Duration::from_millis(100), Duration::from_secs(10), 2.0)
///     .backoff_delay(Duration::from_secs(1));
/// # let _ = options;
/// ```
#[derive(Debug, Clone, Default, PartialEq)]
pub struct EventOptions {
    pub(crate) destination: Option<String>,
    pub(crate) routing_key: Option<String>,
    pub(crate) batch_size: Option<usize>,
    pub(crate) in_flight: Option<usize>,
    pub(crate) strategy: Option<PollingStrategy>,
    pub(crate) delay: Option<Duration>,
    pub(crate) min: Option<Duration>,
    pub(crate) max: Option<Duration>,
    pub(crate) poll_multiplier: Option<f64>,
    pub(crate) initial_delay: Option<Duration>,
    pub(crate) max_retries: Option<u32>,
    pub(crate) backoff_enabled: Option<bool>,
    pub(crate) backoff_delay: Option<Duration>,
    pub(crate) backoff_multiplier: Option<f64>,
    pub(crate) jitter: Option<f64>,
    pub(crate) lease: Option<Duration>,
    pub(crate) claim: Option<ClaimMode>,
}

impl EventOptions {
    /// Nothing set: everything inherits.
    pub fn new() -> Self {
        Self::default()
    }
    /// Topic (Kafka) or exchange (RabbitMQ).
    pub fn destination(mut self, d: impl Into<String>) -> Self {
        self.destination = Some(d.into());
        self
    }
    /// RabbitMQ routing key (default: the event type).
    pub fn routing_key(mut self, k: impl Into<String>) -> Self {
        self.routing_key = Some(k.into());
        self
    }
    /// Most events one poll claims.
    pub fn batch_size(mut self, n: usize) -> Self {
        self.batch_size = Some(n);
        self
    }
    /// Most batches in flight at once per poller (see [`EventSettings::in_flight`]).
    pub fn in_flight(mut self, n: usize) -> Self {
        self.in_flight = Some(n);
        self
    }
    /// Fixed polling with this delay.
    pub fn fixed_polling(mut self, delay: Duration) -> Self {
        self.strategy = Some(PollingStrategy::Fixed);
        self.delay = Some(delay);
        self
    }
    /// Adaptive polling between `min` and `max`, growing by `multiplier`.
    pub fn adaptive_polling(mut self, min: Duration, max: Duration, multiplier: f64) -> Self {
        self.strategy = Some(PollingStrategy::Adaptive);
        self.min = Some(min);
        self.max = Some(max);
        self.poll_multiplier = Some(multiplier);
        self
    }
    /// Wait before the first poll.
    pub fn initial_delay(mut self, d: Duration) -> Self {
        self.initial_delay = Some(d);
        self
    }
    /// Retries after the first failed send.
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = Some(n);
        self
    }
    /// Exponential backoff on or off (off: fixed delay).
    pub fn backoff_enabled(mut self, on: bool) -> Self {
        self.backoff_enabled = Some(on);
        self
    }
    /// The first retry's delay.
    pub fn backoff_delay(mut self, d: Duration) -> Self {
        self.backoff_delay = Some(d);
        self
    }
    /// Backoff growth per retry.
    pub fn backoff_multiplier(mut self, m: f64) -> Self {
        self.backoff_multiplier = Some(m);
        self
    }
    /// Backoff jitter, a fraction in `[0, 1)`.
    pub fn backoff_jitter(mut self, j: f64) -> Self {
        self.jitter = Some(j);
        self
    }
    /// Claim lease: the longest a batch may stay in process before recovery.
    pub fn lease(mut self, d: Duration) -> Self {
        self.lease = Some(d);
        self
    }
    /// How batches are claimed (see [`ClaimMode`]).
    pub fn claim(mut self, mode: ClaimMode) -> Self {
        self.claim = Some(mode);
        self
    }

    pub(crate) fn apply(&self, base: &EventSettings) -> EventSettings {
        let mut s = base.clone();
        if let Some(d) = &self.destination {
            s.destination = Some(d.clone());
        }
        if let Some(k) = &self.routing_key {
            s.routing_key = Some(k.clone());
        }
        macro_rules! set {
            ($($field:ident => $target:expr),* $(,)?) => { $( if let Some(v) = self.$field { $target = v; } )* };
        }
        set!(
            batch_size => s.batch_size,
            in_flight => s.in_flight,
            strategy => s.polling.strategy,
            delay => s.polling.delay,
            min => s.polling.min,
            max => s.polling.max,
            poll_multiplier => s.polling.multiplier,
            initial_delay => s.polling.initial_delay,
            max_retries => s.max_retries,
            backoff_enabled => s.backoff.enabled,
            backoff_delay => s.backoff.delay,
            backoff_multiplier => s.backoff.multiplier,
            jitter => s.backoff.jitter,
            lease => s.lease,
            claim => s.claim,
        );
        s
    }
}
