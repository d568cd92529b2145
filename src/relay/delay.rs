//! The delay between polls, as a small state machine.

use std::time::Duration;

use crate::backoff::RetryBackoff;
use crate::config::{Polling, PollingStrategy};

/// Longest wait after an error (lost database, no sender): a poller comes back
/// within this time once the cause is gone.
pub(crate) const MAX_ERROR_DELAY: Duration = Duration::from_secs(5);

/// How long a poller waits before its next poll.
#[derive(Debug)]
pub(crate) struct PollState {
    polling: Polling,
    current: Duration,
    /// the waits after failed polls, started again by a poll that worked
    errors: RetryBackoff,
}

impl PollState {
    /// Starts at `min` (adaptive) or `delay` (fixed).
    pub fn new(polling: &Polling) -> Self {
        let current = match polling.strategy {
            PollingStrategy::Adaptive => polling.min,
            PollingStrategy::Fixed => polling.delay,
        };
        let cap = match polling.strategy {
            PollingStrategy::Fixed => polling.delay,
            PollingStrategy::Adaptive => polling.max,
        }
        .min(MAX_ERROR_DELAY);
        PollState {
            polling: polling.clone(),
            current,
            errors: RetryBackoff::doubling(polling.min.min(cap), cap),
        }
    }

    /// The wait after a poll that claimed `claimed` of at most `batch_size` events:
    /// none after a full batch; `min` after a partial one (adaptive), which
    /// resets the delay; after an empty poll the current delay, which then grows.
    pub fn after_batch(&mut self, claimed: usize, batch_size: usize) -> Duration {
        self.errors.reset();
        let p = &self.polling;
        if claimed >= batch_size {
            if p.strategy == PollingStrategy::Adaptive {
                self.current = p.min;
            }
            return Duration::ZERO;
        }
        match p.strategy {
            PollingStrategy::Fixed => p.delay,
            // a partial batch found work: events trickle in, so the next poll
            // comes soon; only an empty poll grows the delay
            PollingStrategy::Adaptive if claimed > 0 => {
                self.current = p.min;
                p.min
            }
            PollingStrategy::Adaptive => {
                let wait = self.current;
                // never overflows, whatever the settings say
                self.current = Duration::try_from_secs_f64(wait.as_secs_f64() * p.multiplier)
                    .unwrap_or(p.max)
                    .min(p.max);
                wait
            }
        }
    }

    /// The wait after a poll that found nothing (or a quiet poller's
    /// question that found nothing due): the current delay, which grows.
    pub fn after_empty(&mut self) -> Duration {
        self.after_batch(0, usize::MAX)
    }

    /// The wait after a failed poll: doubling from `min` up to [`MAX_ERROR_DELAY`]
    /// (or the poll delay, when that is shorter).
    pub fn after_error(&mut self) -> Duration {
        self.errors.wait()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::EventSettings;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn adaptive_sequence_resets_grows_and_caps() {
        let mut s = PollState::new(&EventSettings::default().polling);
        let mut waits = Vec::new();
        for _ in 0..16 {
            waits.push(s.after_batch(0, 200));
        }
        assert_eq!(waits[0], ms(250));
        assert_eq!(waits[1], ms(375));
        assert_eq!(waits[2], Duration::from_micros(562_500));
        for w in waits.windows(2) {
            assert!(w[1] >= w[0] && w[1] <= ms(60_000), "{w:?}");
        }
        assert_eq!(*waits.last().unwrap(), ms(60_000), "capped at max");
        // a partial batch that claimed something resets to min: a steady
        // trickle below a batch per poll keeps polling at min
        assert_eq!(s.after_batch(199, 200), ms(250));
        assert_eq!(s.after_batch(3, 200), ms(250));
        assert_eq!(s.after_batch(3, 200), ms(250));
        // only an empty poll grows the delay
        assert_eq!(s.after_batch(0, 200), ms(250));
        assert_eq!(s.after_batch(0, 200), ms(375));
        // a full batch polls at once and resets to min
        assert_eq!(s.after_batch(200, 200), Duration::ZERO);
        assert_eq!(s.after_batch(0, 200), ms(250));
    }

    #[test]
    fn idle_type_costs_about_70_polls_in_its_first_hour() {
        let mut s = PollState::new(&EventSettings::default().polling);
        let (mut t, mut polls) = (Duration::ZERO, 0);
        while t < Duration::from_secs(3600) {
            polls += 1;
            t += s.after_batch(0, 200);
        }
        assert!(
            (60..=75).contains(&polls),
            "{polls} polls in the first hour"
        );
    }

    #[test]
    fn fixed_waits_its_delay_and_errors_back_off() {
        let mut settings = EventSettings::default();
        settings.polling.strategy = PollingStrategy::Fixed;
        settings.polling.delay = ms(800);
        let mut s = PollState::new(&settings.polling);
        assert_eq!(s.after_batch(0, 200), ms(800));
        assert_eq!(s.after_batch(200, 200), Duration::ZERO);
        assert_eq!(s.after_error(), ms(250));
        assert_eq!(s.after_error(), ms(500));
        assert_eq!(s.after_error(), ms(800));
        assert_eq!(s.after_batch(1, 200), ms(800));

        let mut a = PollState::new(&EventSettings::default().polling);
        let errs: Vec<_> = (0..8).map(|_| a.after_error()).collect();
        assert_eq!(errs[0], ms(250));
        assert_eq!(*errs.last().unwrap(), MAX_ERROR_DELAY);
    }

    #[test]
    fn an_absurd_multiplier_set_by_hand_never_panics() {
        // the configuration refuses it; settings built by hand are not checked
        let mut settings = EventSettings::default();
        settings.polling.multiplier = 1e300;
        settings.polling.max = Duration::MAX;
        let mut s = PollState::new(&settings.polling);
        for _ in 0..5 {
            assert!(s.after_batch(0, 200) <= Duration::MAX);
        }
    }
}
