//! The listener: one thread per relay that waits for the commit notifications of
//! its store (PostgreSQL's `NOTIFY`) and wakes the poller of each event type
//! named. Its connection lost, it listens again with backoff and wakes every
//! poller once (what was notified meanwhile is gone); polling stays the safety
//! net.
//!
//! Commits are rationed: while one commit of a type notifies, the others of
//! that type commit without a notification (see `sql/postgres/006_*.sql` and `008_*.sql`), and
//! from a notification until the type's poller starts its next claim the
//! listener holds the type's notifications back ([`Notifications::hold`]):
//! commits meanwhile skip theirs too. After waking a poller, and when a hold
//! ends, the listener asks whether publishers that skipped their notification
//! are still committing ([`Notifications::settled`]); while they are, it asks
//! again after 1, 2, 4 and then every 8 ms, and once they are done it wakes the
//! same pollers again: their next claim sees those commits.
//!
//! [`Notifications::settled`]: crate::store::Notifications::settled
//! [`Notifications::hold`]: crate::store::Notifications::hold

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;

use super::{Ctx, Slept};
use crate::backoff::RetryBackoff;
use crate::store::{ClaimStore, Notifications};

/// How long one wait for a notification lasts: how soon a stop is seen (and so
/// how long `Relay::shutdown` may wait for the listener). A wait sends nothing
/// to the database.
const WAIT: Duration = Duration::from_millis(50);
/// The backoff between attempts to listen again.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);
/// While publishers that skipped their notification are committing, the
/// listener asks again after this, doubling up to [`MAX_RECHECK`].
const MIN_RECHECK: Duration = Duration::from_millis(1);
const MAX_RECHECK: Duration = Duration::from_millis(8);
/// After this long without a word on the connection, the listener checks that it
/// still answers, waiting at most [`CHECK_TIMEOUT`]: a connection that went
/// silent is found within 10 s (the keepalives find a dead peer as soon).
const CHECK_AFTER: Duration = Duration::from_secs(5);
/// How often a hold is looked at (no database round trip), and the longest
/// one: a poller busy with a batch takes its next claim later.
const HOLD_POLL: Duration = Duration::from_millis(1);
const MAX_HOLD: Duration = Duration::from_millis(50);
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

pub(super) struct Listener {
    pub(super) store: Arc<dyn ClaimStore>,
    /// The pollers it wakes: those whose wake-up is `notify` (a notification
    /// of any other type is ignored).
    pub(super) types: BTreeMap<String, Listened>,
}

/// A poller the listener wakes.
pub(super) struct Listened {
    pub(super) wake: Sender<()>,
    /// The claims the poller started ([`Notifications::hold`] lasts until
    /// the next one).
    pub(super) claims: Arc<AtomicU64>,
}

/// What went wrong with the listening connection.
struct Lost(crate::Error);

impl Listener {
    pub(super) fn run(self, ctx: &Ctx) {
        let mut backoff = RetryBackoff::doubling(MIN_BACKOFF, MAX_BACKOFF);
        while !ctx.stopped() {
            let listened = self.store.listen();
            if listened.is_ok() {
                backoff.reset();
            }
            let wait = backoff.wait();
            match listened {
                Ok(mut notifications) => {
                    // the pollers claimed once before the LISTEN was in place (or
                    // while the connection was lost): a commit in between woke
                    // nobody, so every LISTEN wakes them all
                    log::info!("txbox: listening for commits");
                    self.wake_all();
                    match self.listen(ctx, notifications.as_mut()) {
                        Ok(()) => return,
                        Err(Lost(e)) => {
                            log::warn!("txbox: listener lost its connection: {e}");
                            reap(notifications);
                        }
                    }
                }
                Err(e) => log::warn!("txbox: listener cannot listen, next try in {wait:?}: {e}"),
            }
            if let Slept::Stop = ctx.sleep(wait, None) {
                return;
            }
        }
    }

    /// Wakes pollers on notifications until stopped (`Ok`) or the connection is
    /// lost.
    fn listen(&self, ctx: &Ctx, n: &mut dyn Notifications) -> Result<(), Lost> {
        // types woken while publishers that skipped their notification were
        // committing: they are woken again once those are done. At first every
        // type: commits that skipped before this LISTEN (beside a hold of a
        // lost connection, or a notification that went to it) are waited for
        let mut owed: BTreeSet<String> = self.types.keys().cloned().collect();
        // types whose notifications this listener holds back, with their
        // poller's claim count and the time when the hold began
        let mut held: BTreeMap<String, (u64, Instant)> = BTreeMap::new();
        let mut recheck = RetryBackoff::doubling(MIN_RECHECK, MAX_RECHECK);
        let mut next_check = Instant::now();
        let mut heard = Instant::now();
        loop {
            if ctx.stopped() {
                return Ok(());
            }
            super::beat();
            let mut wait = WAIT;
            if !owed.is_empty() {
                wait = wait.min(next_check.saturating_duration_since(Instant::now()));
            }
            if !held.is_empty() {
                wait = wait.min(HOLD_POLL);
            }
            let (woken, early, mut settled) = self.step(n, wait, &mut held, &mut heard)?;
            if woken.is_empty() && owed.is_empty() {
                if heard.elapsed() >= CHECK_AFTER {
                    n.check(CHECK_TIMEOUT).map_err(Lost)?;
                    heard = Instant::now();
                }
                continue;
            }
            // asked before the wake-up (by a hold or a release, or now): the
            // claim it causes sees whatever committed before the answer. The
            // owed types are asked about again when their recheck is due.
            let due = Instant::now() >= next_check;
            let ask: Vec<String> = woken
                .iter()
                .chain(owed.iter().filter(|_| due))
                .filter(|t| !settled.contains_key(*t) && self.types.contains_key(*t))
                .cloned()
                .collect();
            if !ask.is_empty() {
                settled.extend(n.settled(&ask).map_err(Lost)?);
            }
            for t in woken.difference(&early) {
                self.wake(t);
            }
            let mut waiting = false;
            for (t, done) in settled {
                if done {
                    // the commits that skipped are visible now: wake it again
                    if owed.remove(&t) && !woken.contains(&t) {
                        self.wake(&t);
                    }
                } else {
                    owed.insert(t);
                    waiting = true;
                }
            }
            if waiting {
                next_check = Instant::now() + recheck.wait();
            } else if owed.is_empty() {
                recheck.reset();
            }
        }
    }

    /// Waits up to `wait` for notifications, holds back the notified types and
    /// releases the holds whose poller has claimed since (or that lasted
    /// [`MAX_HOLD`]). Returns the types to wake (notified or released), those
    /// of them already woken (see below) and, for those a hold or a release
    /// asked about, whether they are settled.
    ///
    /// A notified type whose hold this listener takes is woken before the
    /// hold's round trip, not after it: the notifying commit is visible, and
    /// its poller claims at once. The hold then lasts until that claim has
    /// started (its count is read before the wake-up), and its release wakes
    /// the poller again after asking whether the commits that skipped are
    /// done: those that committed while the first claim ran are seen by the
    /// second. A type whose hold another session has is woken after the
    /// answer, as before (no release of ours follows).
    #[allow(clippy::type_complexity)]
    fn step(
        &self,
        n: &mut dyn Notifications,
        wait: Duration,
        held: &mut BTreeMap<String, (u64, Instant)>,
        heard: &mut Instant,
    ) -> Result<(BTreeSet<String>, BTreeSet<String>, BTreeMap<String, bool>), Lost> {
        let mut woken = BTreeSet::new();
        if let Some(t) = n.next(wait).map_err(Lost)? {
            woken.insert(t);
            // and every notification already here, one wake-up each type
            while let Some(t) = n.next(Duration::ZERO).map_err(Lost)? {
                woken.insert(t);
            }
            *heard = Instant::now();
        }
        let mut settled = BTreeMap::new();
        let mut early = BTreeSet::new();
        // held while the poller has not claimed since: the commits meanwhile
        // skip their notification, and its claim (or the follow-up after the
        // release) sees them
        for t in &woken {
            // only this relay's types: another relay's (configured otherwise)
            // would miss its commits' notifications and their follow-up
            if held.contains_key(t) || !self.types.contains_key(t) {
                continue;
            }
            let claims = self.claims_of(t);
            self.wake(t);
            let (on, s) = n.hold(t).map_err(Lost)?;
            settled.insert(t.clone(), s);
            if on {
                held.insert(t.clone(), (claims, Instant::now()));
                early.insert(t.clone());
            }
        }
        let done: Vec<String> = held
            .iter()
            .filter(|(t, (claims, since))| {
                self.claims_of(t) != *claims || since.elapsed() >= MAX_HOLD
            })
            .map(|(t, _)| t.clone())
            .collect();
        for t in done {
            held.remove(&t);
            // released: the commits that skipped meanwhile are waited for and
            // the poller woken again
            let s = n.release(&t).map_err(Lost)?;
            settled.insert(t.clone(), s);
            // woken after the release's answer, even if woken early this step
            early.remove(&t);
            woken.insert(t);
        }
        Ok((woken, early, settled))
    }

    /// How many claims the poller of `event_type` has started.
    fn claims_of(&self, event_type: &str) -> u64 {
        self.types
            .get(event_type)
            .map_or(0, |l| l.claims.load(Ordering::Relaxed))
    }

    /// Makes the poller of `event_type` claim now (a full channel already
    /// holds a wake-up: they coalesce). Other types are ignored.
    fn wake(&self, event_type: &str) {
        if let Some(l) = self.types.get(event_type) {
            let _ = l.wake.try_send(());
        }
    }

    fn wake_all(&self) {
        for l in self.types.values() {
            let _ = l.wake.try_send(());
        }
    }
}

/// Lets go of a lost listening connection on a thread of its own: one that went
/// silent may block whoever closes it until the OS gives it up (its keepalives,
/// 10 s), and the listener must listen again meanwhile.
fn reap(lost: Box<dyn Notifications>) {
    let reaped = std::thread::Builder::new()
        .name("txbox-listen-closing".into())
        .spawn(move || drop(lost));
    if let Err(e) = reaped {
        log::warn!("txbox: listener: no thread to close its lost connection: {e}");
    }
}
