//! The waits between the tries of every retry loop in txbox: reconnecting a
//! broker, a consumer or the commit listener, finishing a batch, retrying a
//! deadlocked statement, skipping the inbox cache after a failure. One type, on
//! `backon`'s exponential backoff, so each loop names its bounds and nothing
//! else. (An event's own retry schedule is [`crate::Backoff`]: it is stored
//! with the event, not waited for.)

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Waits that double from a first one up to a longest one, started again by
/// [`RetryBackoff::reset`] after a success.
#[derive(Debug)]
pub(crate) struct RetryBackoff {
    policy: ExponentialBuilder,
    max: Duration,
    waits: ExponentialBackoff,
    /// a wait was taken since the waits were (re)built: a reset has work
    used: bool,
}

impl RetryBackoff {
    /// `first`, doubling up to `max`, for as many tries as it takes.
    pub(crate) fn doubling(first: Duration, max: Duration) -> Self {
        let policy = ExponentialBuilder::new()
            .with_min_delay(first)
            .with_max_delay(max)
            .with_factor(2.0)
            .without_max_times();
        RetryBackoff {
            policy,
            max,
            waits: policy.build(),
            used: false,
        }
    }

    /// Each wait stretched by a random part of itself (up to twice as long),
    /// so the tries of many threads or processes spread out (the SQL stores'
    /// retries).
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn jittered(mut self) -> Self {
        self.policy = self.policy.with_jitter();
        self.waits = self.policy.build();
        self
    }

    /// The next wait of a loop without a bound on its tries.
    pub(crate) fn wait(&mut self) -> Duration {
        self.used = true;
        self.waits.next().unwrap_or(self.max)
    }

    /// The next wait is the first one again. Free when no wait was taken
    /// since (a poller resets after every poll that worked).
    pub(crate) fn reset(&mut self) {
        if std::mem::take(&mut self.used) {
            self.waits = self.policy.build();
        }
    }
}

/// The waits, without end (`take(n)` for a loop of at most `n` retries).
impl Iterator for RetryBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        Some(self.wait())
    }
}

#[cfg(test)]
mod tests {
    use super::RetryBackoff;
    use std::time::Duration;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_double_up_to_the_longest_and_start_again_after_a_reset() {
        let mut b = RetryBackoff::doubling(100 * MS, 500 * MS);
        // backon multiplies by an f32: 200 ms is 200.000003 ms
        let waits: Vec<u128> = (0..5).map(|_| b.wait().as_millis()).collect();
        assert_eq!(waits, [100, 200, 400, 500, 500]);
        b.reset();
        assert_eq!(b.wait(), 100 * MS);
        // resets with no wait between them change nothing; one after a wait
        // starts again
        b.reset();
        b.reset();
        assert_eq!(b.wait(), 100 * MS);
        assert_eq!(b.wait().as_millis(), 200);
        b.reset();
        assert_eq!(b.wait(), 100 * MS);
    }

    #[test]
    fn jitter_stays_within_twice_the_wait() {
        let waits: Vec<Duration> = RetryBackoff::doubling(5 * MS, 40 * MS)
            .jittered()
            .take(5)
            .collect();
        assert_eq!(waits.len(), 5);
        for (w, base) in waits.iter().zip([5, 10, 20, 40, 40]) {
            assert!(*w >= base * MS && *w < 2 * base * MS, "{w:?} for {base} ms");
        }
    }
}
