//! One event type's delivery pipeline: claim a batch, hand it to the sender,
//! turn the broker's verdicts into outcomes, finish the rows. A poller
//! ([`super::poller`]) schedules it on its thread; [`Relay::deliver_pending`]
//! runs it on the caller's thread until nothing is due.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::leased::Leased;
use super::retry::{outcomes, record, TypeDelivery};
use super::{broker_ready, Ctx, Relay};
use crate::backoff::RetryBackoff;
use crate::config::{ClaimMode, EventSettings};
use crate::error::{Error, Result};
use crate::event::{Event, EventId};
use crate::metrics::Observed;
use crate::sender::{SendError, Sender, Started};
use crate::store::{ClaimArgs, ClaimStore, HeldBatch, HeldClaim, Outcome, HEADER_DEFECT};

/// Most claims whose answer was lost kept to be given back: older ones wait
/// for their lease.
const MAX_UNSETTLED: usize = 64;

/// The claim state of one event type between batches: what is with the
/// broker, where the next claim starts, and what was delivered so far.
pub(super) struct Pipeline {
    event_type: String,
    destination: String,
    settings: EventSettings,
    /// `processed_ttl` is zero: acked rows are deleted, not marked PROCESSED.
    delete_acked: bool,
    /// Only events the database had inserted up to this mark
    /// ([`ClaimArgs::upto`]).
    upto: Option<i64>,
    /// Claimed batches handed to the sender, oldest first.
    in_flight: VecDeque<Claimed>,
    /// The tokens of leased claims that failed (the answer may have been
    /// lost after a commit), oldest first: given back before the next claim.
    unsettled: VecDeque<Uuid>,
    /// What the observer was last told of the broker.
    broker_up: Option<bool>,
    /// Where the next claim starts while a backlog drains: the last id of the
    /// previous full batch, and how many batches ago the last full scan was.
    resume: Option<(EventId, usize)>,
    /// A held batch whose outcomes are known, kept to be finished together with
    /// the next claim (one round trip) when that claim follows at once.
    stash: Option<Stashed>,
    /// Ordered types: where the next claim's key walk starts
    /// ([`ClaimArgs::from_key`], see [`next_cursor`]), so every key gets its turn.
    key_cursor: Option<String>,
    /// What became of the events finished so far.
    pub(super) delivered: TypeDelivery,
    /// The configuration's observer.
    observer: Observed,
}

/// Where a pipeline runs, for one step.
pub(super) struct Run<'a, S: ClaimStore + ?Sized> {
    pub(super) store: &'a S,
    pub(super) sender: &'a mut dyn Sender,
    /// Where leased batches are registered while they are with the broker.
    pub(super) leased: &'a Leased,
    /// On a relay's poller: its context (a finish that fails is retried until
    /// the lease runs out, or a few seconds after the stop). `None`: the
    /// caller's thread, where a finish that fails ends the call.
    pub(super) relay: Option<&'a Ctx>,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Polled {
    /// Events claimed.
    pub(super) claimed: usize,
    /// The claim scanned from the lowest id (not after a backlog's last id)
    /// with no batch of this pipeline in flight: claiming nothing, it found
    /// nothing due (with a batch in flight, an ordered key's next event
    /// becomes due when that batch is finished).
    pub(super) scanned: bool,
    /// Events finished in this step that went back to PENDING with no attempt
    /// counted: the broker could not be reached.
    pub(super) released: usize,
    /// The lowest id of the events claimed.
    pub(super) lowest: Option<EventId>,
}

/// A held batch waiting for its finish ([`HeldBatch::finish_and_claim`]).
struct Stashed {
    held: Box<dyn HeldBatch>,
    events: Vec<Event>,
    outcomes: Vec<(EventId, Outcome)>,
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
    /// How many of the last events the store could not read
    /// ([`defects_last`]): not handed to the sender.
    defective: usize,
    /// The send's span, linked to each event's trace context; ended once
    /// the broker's acks are in.
    #[cfg(feature = "trace-context")]
    span: crate::trace::BatchSpan,
}

/// Moves the events whose row the store could not read ([`HEADER_DEFECT`])
/// behind the others, which keep their order, and returns how many: they are
/// never sent, and fail alone ([`refusal`]).
fn defects_last(events: &mut [Event]) -> usize {
    let defective = |e: &Event| e.headers.contains_key(HEADER_DEFECT);
    let n = events.iter().filter(|e| defective(e)).count();
    if n > 0 {
        events.sort_by_key(defective); // stable
    }
    n
}

/// The refusal of an event whose row the store could not read: FAILED at
/// once by the retry policy, whatever retries are left.
fn refusal(e: &Event) -> Result<(), SendError> {
    let why = e.headers.get(HEADER_DEFECT).map_or("", String::as_str);
    log::warn!(
        "txbox: event {} is not sent and fails: its row is no event: {why}",
        e.id
    );
    Err(SendError::new(format!(
        "not sent: its row is no event: {why}"
    )))
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

impl Pipeline {
    pub(super) fn new(
        event_type: &str,
        settings: EventSettings,
        delete_acked: bool,
        observer: Observed,
    ) -> Self {
        Pipeline {
            destination: settings.destination_for(event_type).to_owned(),
            event_type: event_type.to_owned(),
            settings,
            delete_acked,
            upto: None,
            in_flight: VecDeque::new(),
            unsettled: VecDeque::new(),
            broker_up: None,
            resume: None,
            stash: None,
            key_cursor: None,
            delivered: TypeDelivery::default(),
            observer,
        }
    }

    /// Gives back the claims whose answer was lost, in one call; kept for
    /// the next step if the database does not answer yet.
    fn release_unsettled<S: ClaimStore + ?Sized>(&mut self, store: &S) {
        if self.unsettled.is_empty() {
            return;
        }
        let tokens: Vec<Uuid> = self.unsettled.iter().copied().collect();
        match store.release_claims(&tokens) {
            Ok(n) => {
                if n > 0 {
                    log::info!(
                        "txbox: poller {}: {n} events of claims whose answer was lost are \
                         pending again",
                        self.event_type
                    );
                }
                self.unsettled.clear();
            }
            Err(e) => log::debug!("txbox: giving back claims whose answer was lost: {e}"),
        }
    }

    /// Claims only what the database had inserted up to `mark`.
    pub(super) fn upto(mut self, mark: Option<i64>) -> Self {
        self.upto = mark;
        self
    }

    pub(super) fn event_type(&self) -> &str {
        &self.event_type
    }

    pub(super) fn settings(&self) -> &EventSettings {
        &self.settings
    }

    /// Forgets what is in flight (after a panic: the sender's state is unknown,
    /// and the batches return after their lease, held ones at once).
    pub(super) fn forget(&mut self) {
        self.in_flight.clear();
        super::probe::sending(None);
        self.stash = None;
        self.resume = None;
    }

    /// Claims one batch and hands it to the sender; finishes the batches whose
    /// turn has come. A full batch (more is waiting) leaves up to
    /// `in_flight - 1` batches with a pipelining sender, and a held one stashed
    /// for the next claim; anything else leaves nothing in flight.
    pub(super) fn step<S: ClaimStore + ?Sized>(&mut self, run: &mut Run<'_, S>) -> Result<Polled> {
        // a broker that cannot be reached: claim nothing (the events stay
        // PENDING, no attempt counted) until it can
        // before the broker's readiness: another relay may send them meanwhile
        self.release_unsettled(run.store);
        let ready = run.sender.ready();
        self.broker_ready(ready.is_ok());
        if let Err(e) = ready {
            self.resume = None;
            self.drain(run, 0, false)?;
            return Err(Error::broker_from("sender not ready", e));
        }
        let token = Uuid::now_v7();
        let claimed_at = Instant::now();
        let after = self.resume.map(|(id, _)| id);
        let full_scan = after.is_none() && self.in_flight.is_empty() && self.stash.is_none();
        let claim = self.claim(run.store, after, token);
        if let (crate::EventOrder::Key, Ok(claimed)) = (self.settings.ordering, &claim) {
            self.key_cursor = next_cursor(&claimed.events, self.settings.batch_size);
        }
        let HeldClaim {
            mut events,
            batch: held,
        } = match claim {
            Ok(claimed) => claimed,
            Err(e) => {
                // a leased claim may have committed with its answer lost:
                // given back at the next step, not after its lease (a held
                // claim's rows go back with its transaction)
                if self.settings.claim == ClaimMode::Lease {
                    if self.unsettled.len() >= MAX_UNSETTLED {
                        self.unsettled.pop_front();
                    }
                    self.unsettled.push_back(token);
                }
                self.resume = None;
                self.drain(run, 0, false)?;
                return Err(e);
            }
        };
        let s = &self.settings;
        let claimed = events.len();
        let lowest = events.iter().map(|e| e.id).min();
        // a full batch: more is waiting, and the next claim starts after this one;
        // anything else (or every RESCAN_EVERY batches) scans from the lowest id.
        // An ordered type's next claim starts at its key cursor instead: its
        // candidates (the keys' first events) have any id; and a store whose
        // leased claims start at a floor resumes the backlog itself.
        let scanned = self.resume.map_or(0, |(_, n)| n);
        self.resume = match events.last() {
            Some(last)
                if claimed >= s.batch_size
                    && scanned + 1 < Relay::RESCAN_EVERY
                    && s.key_order().is_none()
                    && !(s.claim == ClaimMode::Lease && run.store.capabilities().floor_claims) =>
            {
                Some((last.id, scanned + 1))
            }
            _ => None,
        };
        let mut pipelined = false;
        if claimed > 0 {
            for e in &mut events {
                e.destination.clone_from(&self.destination);
            }
            let defective = defects_last(&mut events);
            // a leased batch is registered before it is sent, for a shutdown
            // that times out to release it; past that release it goes back
            if held.is_none() && !run.leased.add(token, &events, run.store)? {
                return Ok(Polled {
                    claimed,
                    scanned: full_scan,
                    released: 0,
                    lowest,
                });
            }
            let started = Instant::now();
            let sendable = &events[..claimed - defective];
            #[cfg(feature = "trace-context")]
            let span = crate::trace::BatchSpan::start(&self.destination, sendable);
            let results = match sendable.is_empty() {
                true => Some(Vec::new()),
                false => {
                    super::probe::sending(Some(self.oldest_sent().unwrap_or(started)));
                    match run.sender.start(sendable) {
                        Started::Done(results) => Some(results),
                        Started::InFlight => None,
                    }
                }
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
                defective,
                #[cfg(feature = "trace-context")]
                span,
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
        let released = self.drain(run, keep, claimed >= self.follow_at())?;
        if released > 0 {
            // the transport failed: the batches still with the broker are
            // waited for and finished first, and the next claim scans again
            self.drain(run, 0, false)?;
            self.resume = None;
        }
        Ok(Polled {
            claimed,
            scanned: full_scan,
            released,
            lowest,
        })
    }

    /// Whether the broker can be reached: told to the relay's probe, and to
    /// the observer when it changes.
    fn broker_ready(&mut self, ready: bool) {
        broker_ready(ready);
        if self.broker_up != Some(ready) {
            self.broker_up = Some(ready);
            self.observer.broker_ready(&self.event_type, ready);
        }
    }

    /// When the oldest batch still with the broker was handed to it.
    fn oldest_sent(&self) -> Option<Instant> {
        self.in_flight.front().map(|b| b.started)
    }

    /// One claim from `after` on (from the key cursor for an ordered type).
    fn claim<S: ClaimStore + ?Sized>(
        &mut self,
        store: &S,
        after: Option<EventId>,
        token: Uuid,
    ) -> Result<HeldClaim> {
        match self.settings.claim {
            ClaimMode::Lease => store
                .claim_after(&self.claim_args(after), token)
                .map(|events| HeldClaim::new(events, None)),
            ClaimMode::Lock => self.claim_held(store, after),
        }
    }

    /// How many events a claim takes for the next claim to follow at once: a full
    /// batch (more is waiting); for an ordered type any event, since finishing
    /// it lets the next event of its key be claimed.
    pub(super) fn follow_at(&self) -> usize {
        match self.settings.ordering {
            crate::EventOrder::Key => 1,
            crate::EventOrder::None => self.settings.batch_size,
        }
    }

    /// What this pipeline's claims take, from `after` on (an ordered type's
    /// from the key cursor on).
    fn claim_args(&self, after: Option<EventId>) -> ClaimArgs<'_> {
        let s = &self.settings;
        ClaimArgs::new(&self.event_type, s.batch_size, s.lease)
            .after(after)
            .delete_acked(self.delete_acked)
            .ordered(s.key_order())
            .from_key(self.key_cursor.as_deref())
            .upto(self.upto)
    }

    /// A held claim, on the connection of a stashed batch together with its finish
    /// when there is one.
    fn claim_held<S: ClaimStore + ?Sized>(
        &mut self,
        store: &S,
        after: Option<EventId>,
    ) -> Result<HeldClaim> {
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
        store.claim_held(&args)
    }

    /// Finishes a stashed held batch on its own.
    pub(super) fn flush_stash(&mut self) -> Result<()> {
        match self.stash.take() {
            Some(st) => self.finish_held(st.held, &st.events, &st.outcomes),
            None => Ok(()),
        }
    }

    /// Waits for and finishes every batch in flight.
    pub(super) fn finish_all<S: ClaimStore + ?Sized>(
        &mut self,
        run: &mut Run<'_, S>,
    ) -> Result<()> {
        self.drain(run, 0, false).map(|_| ())
    }

    /// Waits for and finishes the oldest batches until `keep` are in flight. With
    /// `stash` (the next claim follows at once) the last held batch waits to be
    /// finished together with that claim. Returns how many events went back to
    /// PENDING for a transport failure ([`Outcome::Release`]). A finish that
    /// failed for good is logged; on the caller's thread it is the error, after
    /// the other batches are finished.
    fn drain<S: ClaimStore + ?Sized>(
        &mut self,
        run: &mut Run<'_, S>,
        keep: usize,
        stash: bool,
    ) -> Result<usize> {
        let mut released = 0;
        let mut failed = Ok(());
        while self.in_flight.len() > keep {
            let Some(batch) = self.in_flight.pop_front() else {
                break;
            };
            let mut results = batch.results.unwrap_or_else(|| {
                super::probe::sending(Some(batch.started));
                run.sender.wait()
            });
            // a transport failure: the broker is not ready until the next
            // step's `ready` says it is (said before the wait is, so that a
            // probe never sees neither)
            if results
                .iter()
                .any(|r| r.as_ref().is_err_and(SendError::is_transient))
            {
                self.broker_ready(false);
            }
            super::probe::sending(self.oldest_sent());
            #[cfg(feature = "trace-context")]
            {
                let mut span = batch.span;
                span.failed(results.iter().filter(|r| r.is_err()).count());
            }
            let sent = batch.events.len() - batch.defective;
            if batch.defective > 0 {
                // the refusals follow the sender's results, one per event sent
                let got = results.len();
                results.resize_with(sent, || {
                    Err(SendError::transient(format!(
                        "sender returned {got} results for {sent} events"
                    )))
                });
                results.extend(batch.events[sent..].iter().map(refusal));
            }
            if sent > 0 {
                self.observer.send_latency(batch.started.elapsed());
            }
            let outcomes = outcomes(&batch.events, results, &self.settings, self.delete_acked);
            let done = record(&outcomes, &self.settings, &self.observer);
            released += done.released as usize;
            self.delivered += done;
            let finished = match batch.held {
                Some(held) if stash && self.stash.is_none() && self.in_flight.len() == keep => {
                    self.stash = Some(Stashed {
                        held,
                        events: batch.events,
                        outcomes,
                    });
                    Ok(())
                }
                Some(held) => self.finish_held(held, &batch.events, &outcomes),
                None => {
                    let f = self.finish(run, batch.token, &outcomes, batch.lease_end);
                    run.leased.remove(batch.token);
                    f
                }
            };
            failed = failed.and(finished);
        }
        super::probe::sending(self.oldest_sent());
        if !stash {
            failed = failed.and(self.flush_stash());
        }
        match failed {
            Err(e) if run.relay.is_none() => Err(e),
            _ => Ok(released),
        }
    }

    /// Finishes a held batch in its transaction: once, for a lost connection has
    /// already freed its rows (still PENDING, so sent again).
    fn finish_held(
        &self,
        held: Box<dyn HeldBatch>,
        events: &[Event],
        outcomes: &[(EventId, Outcome)],
    ) -> Result<()> {
        match held.finish(events, outcomes) {
            Ok(_) => Ok(()),
            Err(e) => {
                log::error!(
                    "txbox: poller {}: could not finish {} events ({e}); their claim ended \
                     with the transaction, so they stay pending and are sent again",
                    self.event_type,
                    outcomes.len()
                );
                Err(e)
            }
        }
    }

    /// Finishes a leased batch. On a relay's poller a lost database is retried
    /// until the lease runs out (after that, recovery hands the rows to another
    /// relay and the token fences us out); on the caller's thread the first
    /// error is the answer.
    fn finish<S: ClaimStore + ?Sized>(
        &self,
        run: &Run<'_, S>,
        token: Uuid,
        outcomes: &[(EventId, Outcome)],
        lease_end: Instant,
    ) -> Result<()> {
        let mut backoff = RetryBackoff::doubling(Duration::from_millis(50), Duration::from_secs(2));
        let mut stop_deadline: Option<Instant> = None;
        loop {
            match run.store.finish(token, outcomes) {
                Ok(n) if (n as usize) < outcomes.len() => {
                    log::warn!(
                        "txbox: poller {}: {} of {} events were no longer held by this relay \
                         (lease expired and recovered); their new owner finishes them",
                        self.event_type,
                        outcomes.len() - n as usize,
                        outcomes.len()
                    );
                    return Ok(());
                }
                Ok(_) => return Ok(()),
                Err(e) => {
                    let Some(ctx) = run.relay else {
                        return Err(e);
                    };
                    let now = Instant::now();
                    let wait = backoff.wait();
                    if ctx.stopped() {
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
                        return Err(e);
                    }
                    log::warn!(
                        "txbox: poller {}: finishing batch: {e}; retrying in {wait:?}",
                        self.event_type
                    );
                    std::thread::sleep(wait);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
