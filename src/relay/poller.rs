//! One event type's poller: claim a batch, hand it to the sender, finish the rows
//! with the broker's verdicts.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Receiver;
use uuid::Uuid;

use super::retry::{outcomes, record};
use super::{Ctx, PollState, Relay, Slept};
use crate::config::{ClaimMode, EventSettings};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::metrics;
use crate::sender::{SendError, Sender, SenderFactory, Started};
use crate::store::{ClaimArgs, ClaimStore, HeldBatch, HeldClaim, Outcome};

/// The least time between the starts of two claims of a poller that sleeps
/// between them (a full batch's successor claims at once): short while each
/// claim finds an event or two (a trickle: each goes out at once), longer once
/// claims find more (commits come faster than claims: fewer, fuller claims
/// cost the database less, for a few milliseconds more).
const WAKE_GAP: Duration = Duration::from_millis(5);
const BUSY_WAKE_GAP: Duration = Duration::from_millis(20);
/// A claim of more events than this makes the next gap [`BUSY_WAKE_GAP`].
const TRICKLE: usize = 2;

pub(super) struct Poller {
    ctx: Ctx,
    store: Arc<dyn ClaimStore>,
    event_type: String,
    destination: String,
    routing_key: String,
    settings: EventSettings,
    factory: Arc<dyn SenderFactory>,
    sender: Option<Box<dyn Sender>>,
    /// Claimed batches handed to the sender, oldest first.
    in_flight: VecDeque<Claimed>,
    /// Where the next claim starts while a backlog drains: the last id of the
    /// previous full batch, and how many batches ago the last full scan was.
    resume: Option<(crate::EventId, usize)>,
    /// `processed_ttl` is zero: acked rows are deleted, not marked PROCESSED.
    delete_acked: bool,
    /// A held batch whose outcomes are known, kept to be finished together with
    /// the next claim (one round trip) when that claim follows at once.
    stash: Option<Stashed>,
    /// Ordered types: where the next claim's key walk starts
    /// ([`ClaimArgs::from_key`], see [`next_cursor`]), so every key gets its turn.
    key_cursor: Option<String>,
    /// Counts the claims this poller started (read by the listener, which holds
    /// back its type's commit notifications until the next claim starts).
    claims: Arc<AtomicU64>,
}

/// A held batch waiting for its finish ([`HeldBatch::finish_and_claim`]).
struct Stashed {
    held: Box<dyn HeldBatch>,
    events: Vec<Event>,
    outcomes: Vec<(crate::EventId, Outcome)>,
}

/// A claimed batch on its way to the broker.
struct Claimed {
    token: Uuid,
    /// The open transaction that holds the rows ([`ClaimMode::Lock`]).
    held: Option<Box<dyn HeldBatch>>,
    events: Vec<Event>,
    lease_end: Instant,
    started: Instant,
    /// The results, when the sender gave them at once.
    results: Option<Vec<Result<(), SendError>>>,
}

/// Where an ordered type's next key walk starts after a claim that took
/// `events` of at most `limit`: after a full batch, at the last key taken (the
/// walk goes on through the keys); after a short one (the walk reached the last
/// key, or found no more), at the first key. Keys compared byte for byte,
/// which is the walk's order on SQLite and close to it elsewhere: a cursor a
/// little off only starts the next walk a few keys early or late.
fn next_cursor(events: &[Event], limit: usize) -> Option<String> {
    if events.len() < limit {
        return None;
    }
    events.iter().filter_map(|e| e.key.clone()).max()
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
        let (destination, routing_key) = settings.address(&event_type);
        Poller {
            ctx,
            store,
            destination: destination.to_owned(),
            routing_key: routing_key.to_owned(),
            event_type,
            settings,
            factory,
            sender: None,
            in_flight: VecDeque::new(),
            resume: None,
            delete_acked,
            stash: None,
            key_cursor: None,
            claims,
        }
    }

    pub(super) fn run(mut self, wake: Receiver<()>) {
        let mut state = PollState::new(&self.settings.polling);
        let mut delay = self.settings.polling.initial_delay;
        // after an error the poller backs off in full: wake-ups (a commit each,
        // during a broker outage) wait in their channel until it is over
        let mut backing_off = false;
        let mut last_claim = Instant::now();
        let mut gap = WAKE_GAP;
        loop {
            super::beat();
            // a poller sleeps only with nothing in flight, so only a full batch's
            // successor (no delay) finds batches to finish at a stop
            if delay.is_zero() {
                if self.ctx.stopped() {
                    self.drain(0, false);
                    return;
                }
            } else {
                // nothing is claimed at once: a stashed batch is finished alone
                self.flush_stash();
                let wake = (!backing_off).then_some(&wake);
                if let Slept::Stop = self.ctx.sleep(delay, wake) {
                    return;
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
                    state.after_batch(claimed, self.follow_at())
                }
                Ok(Err(e)) => {
                    let d = state.after_error();
                    log::warn!("txbox: poller {}: {e}; next try in {d:?}", self.event_type);
                    d
                }
                Err(_) => {
                    // the sender's state is unknown: its batches return after the lease
                    self.sender = None;
                    self.in_flight.clear();
                    self.stash = None;
                    let d = state.after_error();
                    log::error!(
                        "txbox: poller {} panicked; its batches return after the lease (held claims: at once); next try in {d:?}",
                        self.event_type
                    );
                    d
                }
            };
            metrics::polling_delay(&self.event_type, next);
            delay = next;
        }
    }

    /// Claims one batch and hands it to the sender; finishes the batches whose turn
    /// has come. Returns how many events it claimed.
    fn poll_once(&mut self) -> Result<usize> {
        if self.sender.is_none() {
            self.sender = Some(self.factory.create()?);
        }
        // a broker that cannot be reached: claim nothing (the events stay
        // PENDING, no attempt counted) until it can
        let ready = self.sender.as_mut().map(|s| s.ready());
        super::broker_ready(!matches!(ready, Some(Err(_))));
        if let Some(Err(e)) = ready {
            self.resume = None;
            self.drain(0, false);
            return Err(Error::Broker(format!("sender not ready: {e}")));
        }
        let token = Uuid::now_v7();
        let claimed_at = Instant::now();
        let after = self.resume.map(|(id, _)| id);
        let claim = self.claim(after, token);
        if let (crate::EventOrder::Key, Ok((events, _))) = (self.settings.ordering, &claim) {
            self.key_cursor = next_cursor(events, self.settings.batch_size);
        }
        let s = &self.settings;
        let (mut events, held) = match claim {
            Ok(claimed) => claimed,
            Err(e) => {
                self.resume = None;
                self.drain(0, false);
                return Err(e);
            }
        };
        let claimed = events.len();
        // a full batch: more is waiting, and the next claim starts after this one;
        // anything else (or every RESCAN_EVERY batches) scans from the lowest id.
        // An ordered type's next claim starts at its key cursor instead: its
        // candidates (the keys' first events) have any id.
        let scanned = self.resume.map_or(0, |(_, n)| n);
        self.resume = match events.last() {
            Some(last)
                if claimed >= s.batch_size
                    && scanned + 1 < Relay::RESCAN_EVERY
                    && s.key_order().is_none() =>
            {
                Some((last.id, scanned + 1))
            }
            _ => None,
        };
        let mut pipelined = false;
        if claimed > 0 {
            for e in &mut events {
                e.destination.clone_from(&self.destination);
                e.routing_key.clone_from(&self.routing_key);
            }
            // a leased batch is registered before it is sent, for a shutdown
            // that times out to release it; past that release it goes back
            if held.is_none() && !self.ctx.leased.add(token, &events, self.store.as_ref())? {
                return Ok(claimed);
            }
            let started = Instant::now();
            let Some(sender) = &mut self.sender else {
                unreachable!("created above");
            };
            let results = match sender.start(&events) {
                Started::Done(results) => Some(results),
                Started::InFlight => None,
            };
            pipelined = results.is_none();
            self.in_flight.push_back(Claimed {
                token,
                held,
                events,
                // the lease is at most MAX_LEASE (`Relay::start` validates)
                lease_end: claimed_at + s.lease,
                started,
                results,
            });
        }
        // after a full batch the next claim follows at once: up to in_flight - 1
        // batches stay with the broker meanwhile; otherwise all are finished now
        let keep = if pipelined && claimed >= s.batch_size {
            s.in_flight - 1
        } else {
            0
        };
        // a full batch is followed by the next claim at once: the last batch
        // finished now waits to go with it
        let released = self.drain(keep, claimed >= self.follow_at());
        if released > 0 {
            // the transport failed: back off before the next claim (and ask the
            // sender whether it is ready) instead of claiming the same rows again;
            // a poller sleeps with nothing in flight, so the batches still with
            // the broker are waited for and finished first
            self.drain(0, false);
            self.resume = None;
            return Err(Error::Broker(format!(
                "{released} events went back to pending, no attempt counted: \
                 the broker could not be reached"
            )));
        }
        Ok(claimed)
    }

    /// One claim from `after` on (from the key cursor for an ordered type).
    fn claim(&mut self, after: Option<crate::EventId>, token: Uuid) -> Result<HeldClaim> {
        match self.settings.claim {
            ClaimMode::Lease => self
                .store
                .claim_after(&self.claim_args(after), token)
                .map(|events| (events, None)),
            ClaimMode::Lock => self.claim_held(after),
        }
    }

    /// How many events a claim takes for the next claim to follow at once: a full
    /// batch (more is waiting); for an ordered type any event, since finishing
    /// it lets the next event of its key be claimed.
    fn follow_at(&self) -> usize {
        match self.settings.ordering {
            crate::EventOrder::Key => 1,
            crate::EventOrder::None => self.settings.batch_size,
        }
    }

    /// What this poller's claims take, from `after` on (an ordered type's from
    /// the key cursor on).
    fn claim_args(&self, after: Option<crate::EventId>) -> ClaimArgs<'_> {
        let s = &self.settings;
        ClaimArgs {
            event_type: &self.event_type,
            after,
            limit: s.batch_size,
            lease: s.lease,
            delete_acked: self.delete_acked,
            ordered: s.key_order(),
            from_key: self.key_cursor.as_deref(),
            upto: None,
        }
    }

    /// A held claim, on the connection of a stashed batch together with its finish
    /// when there is one.
    fn claim_held(&mut self, after: Option<crate::EventId>) -> Result<HeldClaim> {
        let stash = self.stash.take();
        let args = self.claim_args(after);
        if let Some(st) = stash {
            match st.held.finish_and_claim(&st.events, &st.outcomes, &args) {
                Ok((_, Some(claim))) => return Ok(claim),
                Ok((_, None)) => {} // finished only: the store claims
                Err(e) => {
                    log::error!(
                        "txbox: poller {}: could not finish {} events and claim the next batch \
                         ({e}); unless their commit went through, their claim ended with the \
                         transaction, so they stay pending and are sent again",
                        self.event_type,
                        st.outcomes.len()
                    );
                    return Err(e);
                }
            }
        }
        self.store.claim_held(&args)
    }

    /// Finishes a stashed held batch on its own.
    fn flush_stash(&mut self) {
        if let Some(st) = self.stash.take() {
            self.finish_held(st.held, &st.events, &st.outcomes);
        }
    }

    /// Waits for and finishes the oldest batches until `keep` are in flight. With
    /// `stash` (the next claim follows at once) the last held batch waits to be
    /// finished together with that claim. Returns how many events went back to
    /// PENDING for a transport failure ([`Outcome::Release`]).
    fn drain(&mut self, keep: usize, stash: bool) -> usize {
        let mut released = 0;
        while self.in_flight.len() > keep {
            let Some(batch) = self.in_flight.pop_front() else {
                break;
            };
            let results = match (batch.results, &mut self.sender) {
                (Some(results), _) => results,
                (None, Some(sender)) => sender.wait(),
                (None, None) => Vec::new(),
            };
            metrics::send_latency(batch.started.elapsed());
            let outcomes = outcomes(&batch.events, results, &self.settings, self.delete_acked);
            released += record(&outcomes, &self.settings).released as usize;
            match batch.held {
                Some(held) if stash && self.stash.is_none() && self.in_flight.len() == keep => {
                    self.stash = Some(Stashed {
                        held,
                        events: batch.events,
                        outcomes,
                    });
                }
                Some(held) => self.finish_held(held, &batch.events, &outcomes),
                None => {
                    self.finish(batch.token, &outcomes, batch.lease_end);
                    self.ctx.leased.remove(batch.token);
                }
            }
        }
        if !stash {
            self.flush_stash();
        }
        released
    }

    /// Finishes a held batch in its transaction: once, for a lost connection has
    /// already freed its rows (still PENDING, so sent again).
    fn finish_held(
        &self,
        held: Box<dyn HeldBatch>,
        events: &[Event],
        outcomes: &[(crate::EventId, Outcome)],
    ) {
        if let Err(e) = held.finish(events, outcomes) {
            log::error!(
                "txbox: poller {}: could not finish {} events ({e}); their claim ended with \
                 the transaction, so they stay pending and are sent again",
                self.event_type,
                outcomes.len()
            );
        }
    }

    /// Finishes the batch, retrying a lost database until the lease runs out (after
    /// that, recovery hands the rows to another relay and the token fences us out).
    fn finish(&self, token: Uuid, outcomes: &[(crate::EventId, Outcome)], lease_end: Instant) {
        let mut wait = Duration::from_millis(50);
        let mut stop_deadline: Option<Instant> = None;
        loop {
            match self.store.finish(token, outcomes) {
                Ok(n) if (n as usize) < outcomes.len() => {
                    log::warn!(
                        "txbox: poller {}: {} of {} events were no longer held by this relay \
                         (lease expired and recovered); their new owner finishes them",
                        self.event_type,
                        outcomes.len() - n as usize,
                        outcomes.len()
                    );
                    return;
                }
                Ok(_) => return,
                Err(e) => {
                    let now = Instant::now();
                    if self.ctx.stopped() {
                        stop_deadline.get_or_insert(now + Duration::from_secs(5));
                    }
                    let deadline = stop_deadline.map_or(lease_end, |d| d.min(lease_end));
                    if now + wait >= deadline {
                        log::error!(
                            "txbox: poller {}: could not finish {} events ({e}); they stay in \
                             process and are sent again after the lease",
                            self.event_type,
                            outcomes.len()
                        );
                        return;
                    }
                    log::warn!(
                        "txbox: poller {}: finishing batch: {e}; retrying in {wait:?}",
                        self.event_type
                    );
                    std::thread::sleep(wait);
                    wait = (wait * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::next_cursor;
    use crate::event::{Event, EventId};

    fn keyed(keys: &[&str]) -> Vec<Event> {
        keys.iter()
            .map(|k| Event {
                id: EventId::new(),
                event_type: "t".into(),
                destination: "t".into(),
                routing_key: "t".into(),
                key: (!k.is_empty()).then(|| k.to_string()),
                headers: Default::default(),
                payload: b"{}".to_vec(),
                content_type: None,
                attempts: 0,
            })
            .collect()
    }

    #[test]
    fn the_cursor_goes_on_after_a_full_batch_and_round_after_a_short_one() {
        assert_eq!(
            next_cursor(&keyed(&["b", "c", "a"]), 3).as_deref(),
            Some("c")
        );
        assert_eq!(next_cursor(&keyed(&["b", ""]), 2).as_deref(), Some("b"));
        assert_eq!(
            next_cursor(&keyed(&["x", "y"]), 3),
            None,
            "short: from the first"
        );
        assert_eq!(next_cursor(&keyed(&["", ""]), 2), None, "no key taken");
        assert_eq!(next_cursor(&[], 1), None);
    }
}
