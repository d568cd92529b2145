//! One event type's poller: sleeps until its polling delay or a wake-up, then
//! runs its delivery pipeline ([`super::pipeline`]) and works out the next delay.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;

use super::pipeline::{Pipeline, Run};
use super::{Ctx, PollState, Slept};
use crate::config::EventSettings;
use crate::error::{Error, Result};
use crate::sender::{Sender, SenderFactory};
use crate::store::ClaimStore;

/// The longest a poller waits before it asks a broker that could not be
/// reached again.
const BROKER_RETRY: Duration = Duration::from_secs(1);

/// The least time between the starts of two claims of a poller that sleeps
/// between them (a full batch's successor claims at once): short while each
/// claim finds an event or two (a trickle: each goes out at once), longer once
/// claims find more (commits come faster than claims: fewer, fuller claims
/// cost the database less, for a few milliseconds more).
const WAKE_GAP: Duration = Duration::from_millis(5);
const BUSY_WAKE_GAP: Duration = Duration::from_millis(20);
/// A claim of more events than this makes the next gap [`BUSY_WAKE_GAP`].
const TRICKLE: usize = 2;
/// Added to the wait until an event is due: the claim after it should find
/// the event due by the database's clock, not a hair before.
const DUE_MARGIN: Duration = Duration::from_millis(1);

/// When a type's next event is due.
enum Due {
    /// One is due already.
    Now,
    /// In this long (`Duration::MAX`: none is pending).
    In(Duration),
    /// The store could not say: the claim runs as usual, and reports what
    /// fails.
    Unknown,
}

pub(super) struct Poller {
    ctx: Ctx,
    store: Arc<dyn ClaimStore>,
    pipeline: Pipeline,
    factory: Arc<dyn SenderFactory>,
    sender: Option<Box<dyn Sender>>,
    /// Counts the claims this poller started (read by the listener, which holds
    /// back its type's commit notifications until the next claim starts).
    claims: Arc<AtomicU64>,
}

impl Poller {
    /// A poller of `event_type` that claims nothing until [`Poller::run`].
    pub(super) fn new(
        ctx: Ctx,
        store: Arc<dyn ClaimStore>,
        event_type: String,
        settings: EventSettings,
        factory: Arc<dyn SenderFactory>,
        delete_acked: bool,
        claims: Arc<AtomicU64>,
    ) -> Self {
        let pipeline = Pipeline::new(&event_type, settings, delete_acked, ctx.observer.clone());
        Poller {
            ctx,
            store,
            pipeline,
            factory,
            sender: None,
            claims,
        }
    }

    pub(super) fn run(mut self, wake: Receiver<()>) {
        let polling = self.pipeline.settings().polling.clone();
        let mut state = PollState::new(&polling);
        let mut delay = polling.initial_delay;
        // after an error the poller backs off in full: wake-ups (a commit each,
        // during a broker outage) wait in their channel until it is over
        let mut backing_off = false;
        let mut last_claim = Instant::now();
        let mut gap = WAKE_GAP;
        // the last poll claimed nothing, and nothing woke the poller since:
        // the next poll asks when the type's next event is due before it
        // claims (one statement either way while the type is idle)
        let mut quiet = false;
        // the type had events due later (delayed, or a retry's backoff) when
        // last asked: a poll that claims less than a full batch asks again
        let mut later = false;
        loop {
            super::beat();
            // a poller sleeps only with nothing in flight, so only a full batch's
            // successor (no delay) finds batches to finish at a stop
            if delay.is_zero() {
                if self.ctx.stopped() {
                    self.drain();
                    return;
                }
            } else {
                // nothing is claimed at once: a stashed batch is finished alone
                let _ = self.pipeline.flush_stash();
                let wake = (!backing_off).then_some(&wake);
                match self.ctx.sleep(delay, wake) {
                    Slept::Stop => return,
                    Slept::Woken => quiet = false,
                    Slept::Timeout => {}
                }
                // woken again soon after a claim: commits are frequent, and
                // claims that follow each other closer than this take more
                // of the database than the events they bring (never longer
                // than the polling delay itself)
                if let Some(rest) = gap.min(delay).checked_sub(last_claim.elapsed()) {
                    if let Slept::Stop = self.ctx.sleep(rest, None) {
                        return;
                    }
                }
            }
            if quiet && !backing_off {
                // nothing due yet: no claim; sleep until the next event is
                // due, at most the polling delay (which grows as an empty
                // poll's does)
                if let Due::In(wait) = self.due(&mut later) {
                    let grown = state.after_empty();
                    delay = grown.min(wait);
                    // waking when an event is due, the poll claims it
                    // without asking again
                    quiet = wait > grown;
                    self.ctx
                        .observer
                        .polling_delay(self.pipeline.event_type(), delay);
                    continue;
                }
            }
            last_claim = Instant::now();
            self.claims.fetch_add(1, Ordering::Relaxed);
            let polled = catch_unwind(AssertUnwindSafe(|| self.poll_once()));
            backing_off = !matches!(polled, Ok(Ok(_)));
            let next = match polled {
                Ok(Ok(claimed)) => {
                    gap = match claimed {
                        // nothing came: the next wake-up is a new commit
                        0 => Duration::ZERO,
                        1..=TRICKLE => WAKE_GAP,
                        _ => BUSY_WAKE_GAP,
                    };
                    quiet = claimed == 0;
                    let next = state.after_batch(claimed, self.pipeline.follow_at());
                    if claimed == 0 {
                        // a claim that found nothing (woken by a commit of
                        // an event due later, say): sleep no longer than
                        // until the next one is due
                        match self.due(&mut later) {
                            Due::In(wait) => {
                                quiet = wait > next;
                                next.min(wait)
                            }
                            Due::Now | Due::Unknown => next,
                        }
                    } else if later && !next.is_zero() {
                        // events of the type are due later: wake for the
                        // next, or claim again at once for one due already
                        // (this claim found work: no idle loop)
                        match self.due(&mut later) {
                            Due::In(wait) => next.min(wait),
                            Due::Now => Duration::ZERO,
                            Due::Unknown => next,
                        }
                    } else {
                        next
                    }
                }
                Ok(Err(e)) => {
                    // a broker that cannot be reached is asked again within
                    // a second (the sender's own backoff spaces its connects):
                    // its events go out soon after it is back
                    let d = match e {
                        Error::Broker { .. } => state.after_error().min(BROKER_RETRY),
                        _ => state.after_error(),
                    };
                    log::warn!(
                        "txbox: poller {}: {e}; next try in {d:?}",
                        self.pipeline.event_type()
                    );
                    d
                }
                Err(_) => {
                    // the sender's state is unknown: its batches return after the lease
                    self.sender = None;
                    self.pipeline.forget();
                    let d = state.after_error();
                    log::error!(
                        "txbox: poller {} panicked; its batches return after the lease (held claims: at once); next try in {d:?}",
                        self.pipeline.event_type()
                    );
                    d
                }
            };
            self.ctx
                .observer
                .polling_delay(self.pipeline.event_type(), next);
            delay = next;
        }
    }

    /// When the type's next event is due, as the store says; `later`
    /// records whether events are due later.
    fn due(&self, later: &mut bool) -> Due {
        match self.store.next_due(self.pipeline.event_type()) {
            Ok(None) => {
                *later = false;
                Due::In(Duration::MAX)
            }
            Ok(Some(wait)) if !wait.is_zero() => {
                *later = true;
                Due::In(wait.saturating_add(DUE_MARGIN))
            }
            Ok(Some(_)) => Due::Now,
            Err(e) => {
                log::debug!(
                    "txbox: poller {}: asking when the next event is due: {e}",
                    self.pipeline.event_type()
                );
                Due::Unknown
            }
        }
    }

    /// Runs one step of the pipeline (creating the sender first if need be).
    /// Returns how many events it claimed; a transport failure is an error,
    /// so the poller backs off before the next claim.
    fn poll_once(&mut self) -> Result<usize> {
        let sender = match &mut self.sender {
            Some(sender) => sender,
            None => self.sender.insert(self.factory.create()?),
        };
        let mut run = Run {
            store: self.store.as_ref(),
            sender: sender.as_mut(),
            leased: &self.ctx.leased,
            relay: Some(&self.ctx),
        };
        let polled = self.pipeline.step(&mut run)?;
        if polled.released > 0 {
            // the transport failed: back off before the next claim (and ask the
            // sender whether it is ready) instead of claiming the same rows again
            return Err(Error::broker(format!(
                "{} events went back to pending, no attempt counted: \
                 the broker could not be reached",
                polled.released
            )));
        }
        Ok(polled.claimed)
    }

    /// Finishes every batch in flight (at a stop).
    fn drain(&mut self) {
        if let Some(sender) = &mut self.sender {
            let mut run = Run {
                store: self.store.as_ref(),
                sender: sender.as_mut(),
                leased: &self.ctx.leased,
                relay: Some(&self.ctx),
            };
            // a failure is logged: the batch goes back after its lease
            let _ = self.pipeline.finish_all(&mut run);
        }
    }
}
