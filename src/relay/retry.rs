//! The retry policy: what becomes of each claimed event after the send (sent,
//! back to pending, retried after its backoff, or failed), and how its error is
//! stored.

use crate::config::{EventSettings, OnPoison};
use crate::event::Event;
use crate::metrics::{Count, Observed};
use crate::sender::SendError;
use crate::store::{Outcome, HEADER_DEFECT};

/// What [`Relay::deliver_pending`](crate::Relay::deliver_pending) did with one event type's events.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TypeDelivery {
    /// Acked by the sender: PROCESSED (or deleted with `processed_ttl` zero).
    pub sent: u64,
    /// Sends refused with retries left (the event PENDING again, due after its
    /// backoff; one whose backoff ends within the call is sent again, and
    /// counted again).
    pub retried: u64,
    /// Refused with no retry left: FAILED (the DLQ's to move).
    pub failed: u64,
    /// A transport failure (the broker could not be reached): PENDING again
    /// with no attempt counted.
    pub released: u64,
}

impl std::ops::AddAssign for TypeDelivery {
    fn add_assign(&mut self, o: TypeDelivery) {
        self.sent += o.sent;
        self.retried += o.retried;
        self.failed += o.failed;
        self.released += o.released;
    }
}

/// Longest `last_error` kept with an event, in bytes (longer messages are cut).
pub(crate) const MAX_ERROR_LEN: usize = 2000;

/// Turns the sender's per-event results into row outcomes: acked (PROCESSED, or
/// deleted when `delete_acked`), a transport failure back to PENDING with no
/// attempt counted, retry with backoff while retries are left, FAILED after.
/// A row the store could not read as an event ([`HEADER_DEFECT`]) is FAILED
/// at once: no retry can change it.
pub(super) fn outcomes(
    events: &[Event],
    results: Vec<Result<(), SendError>>,
    s: &EventSettings,
    delete_acked: bool,
) -> Vec<(crate::EventId, Outcome)> {
    let got = results.len();
    let mut results = results.into_iter();
    events
        .iter()
        .map(|e| {
            let result = results.next().unwrap_or_else(|| {
                Err(SendError::transient(format!(
                    "sender returned {got} results for {} events",
                    events.len()
                )))
            });
            let outcome = match result {
                Ok(()) if delete_acked => Outcome::SentDelete,
                Ok(()) => Outcome::Sent,
                Err(err) if err.is_transient() => Outcome::Release {
                    error: clean_error(&err.message),
                },
                Err(err) => {
                    let error = clean_error(&err.message);
                    let retry = e.attempts + 1;
                    if retry > s.max_retries || e.headers.contains_key(HEADER_DEFECT) {
                        Outcome::Failed { error }
                    } else {
                        Outcome::Retry {
                            delay: s.backoff.delay_for(retry),
                            error,
                        }
                    }
                }
            };
            (e.id, outcome)
        })
        .collect()
}

/// Counts what became of a batch's events and records it in the metrics (sent,
/// retried, failed, and a skipped poison event of an ordered type) for the
/// observer.
pub(super) fn record(
    outcomes: &[(crate::EventId, Outcome)],
    s: &EventSettings,
    observer: &Observed,
) -> TypeDelivery {
    let mut t = TypeDelivery::default();
    for (_, o) in outcomes {
        match o {
            Outcome::Sent | Outcome::SentDelete => t.sent += 1,
            Outcome::Retry { .. } => t.retried += 1,
            Outcome::Failed { .. } => t.failed += 1,
            Outcome::Release { .. } => t.released += 1,
        }
    }
    observer.acked(
        outcomes
            .iter()
            .filter_map(|(id, o)| o.is_sent().then_some(*id)),
    );
    observer.add(Count::Sent, t.sent);
    observer.add(Count::Retried, t.retried);
    observer.add(Count::Failed, t.failed);
    if s.key_order() == Some(OnPoison::Skip) {
        observer.add(Count::OrderedSkipped, t.failed);
    }
    t
}

/// An error text as it can be stored: NUL bytes (which PostgreSQL's text refuses,
/// so the finish would fail and the row be sent again forever) written as `\0`,
/// cut to [`MAX_ERROR_LEN`].
fn clean_error(message: &str) -> String {
    truncate(&message.replace('\0', "\\0"), MAX_ERROR_LEN)
}

fn truncate(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_owned();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::EventId;
    use std::time::Duration;

    fn event(attempts: u32) -> Event {
        Event {
            id: EventId::new(),
            event_type: "t".into(),
            destination: "t".into(),
            key: None,
            headers: Default::default(),
            payload: b"{}".to_vec(),
            content_type: None,
            attempts,
        }
    }

    #[test]
    fn outcomes_retry_then_fail_and_short_results_release() {
        let mut s = EventSettings::default();
        s.backoff.jitter = 0.0;
        let events = vec![event(0), event(2), event(3), event(0)];
        let results = vec![Ok(()), Err(SendError::new("x")), Err(SendError::new("y"))];
        let o = outcomes(&events, results.clone(), &s, false);
        assert_eq!(o[0].1, Outcome::Sent);
        // processed rows not kept: the acked one is deleted, the failures are the same
        let deleting = outcomes(&events, results, &s, true);
        assert_eq!(deleting[0].1, Outcome::SentDelete);
        assert_eq!(deleting[1..], o[1..]);
        assert_eq!(
            o[1].1,
            Outcome::Retry {
                delay: Duration::from_secs(90),
                error: "x".into()
            }
        );
        assert_eq!(o[2].1, Outcome::Failed { error: "y".into() });
        // a missing result is not the event's fault: no attempt counted
        assert!(matches!(&o[3].1, Outcome::Release { error } if error.contains("3 results for 4")));
    }

    #[test]
    fn transient_errors_release_without_an_attempt_and_nul_bytes_are_escaped() {
        let s = EventSettings::default();
        let events = vec![event(3), event(0)];
        let results = vec![
            Err(SendError::transient("broker down")),
            Err(SendError::new("bad\0byte")),
        ];
        let o = outcomes(&events, results, &s, false);
        // even with no retry left, an outage does not fail the event
        assert_eq!(
            o[0].1,
            Outcome::Release {
                error: "broker down".into()
            }
        );
        assert!(
            matches!(&o[1].1, Outcome::Retry { error, .. } if error == "bad\\0byte"),
            "{:?}",
            o[1].1
        );
    }

    #[test]
    fn backoff_grows_and_disabled_is_fixed() {
        let mut s = EventSettings::default();
        s.backoff.jitter = 0.0;
        assert_eq!(s.backoff.delay_for(1), Duration::from_secs(10));
        assert_eq!(s.backoff.delay_for(2), Duration::from_secs(30));
        assert_eq!(s.backoff.delay_for(3), Duration::from_secs(90));
        s.backoff.enabled = false;
        assert_eq!(s.backoff.delay_for(3), Duration::from_secs(10));
        s.backoff.enabled = true;
        s.backoff.jitter = 0.5;
        for _ in 0..100 {
            let d = s.backoff.delay_for(1).as_secs_f64();
            assert!((5.0..=15.0).contains(&d), "{d}");
        }
    }

    #[test]
    fn truncates_on_char_boundary() {
        assert_eq!(truncate("ééé", 3), "é");
        assert_eq!(truncate("abc", 5), "abc");
    }
}
