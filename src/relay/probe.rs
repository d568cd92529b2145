//! What a relay's threads tell a health check ([`RelayProbe`]): whether each
//! runs, how long it has been busy with its current piece of work, and whether
//! a poller's broker can be reached.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What a relay's threads tell its probe, one entry each.
pub(super) struct Threads {
    epoch: Instant,
    /// The shortest "stuck" of this relay: longer than its sender's longest
    /// wait for an ack (a batch legitimately waits that long).
    stuck_floor: AtomicU64,
    each: Vec<ThreadState>,
}

#[derive(Default)]
struct ThreadState {
    alive: AtomicBool,
    /// When the thread's current piece of work began, in ms after `epoch`
    /// plus one; 0 while it sleeps.
    busy_since: AtomicU64,
    /// A poller whose broker is not ready (cannot be connected to).
    broker_down: AtomicBool,
    /// When the oldest batch this poller handed to its broker was sent, in ms
    /// after `epoch` plus one; 0 while none waits for its acks.
    sending_since: AtomicU64,
}

thread_local! {
    /// The relay thread this is, once its body runs.
    static THIS_THREAD: std::cell::RefCell<Option<(Arc<Threads>, usize)>> =
        const { std::cell::RefCell::new(None) };
}

impl Threads {
    pub(super) fn new(n: usize) -> Self {
        Threads {
            epoch: Instant::now(),
            stuck_floor: AtomicU64::new(0),
            each: (0..n)
                .map(|_| ThreadState {
                    alive: AtomicBool::new(true),
                    ..Default::default()
                })
                .collect(),
        }
    }

    /// The thread at `index` has ended.
    pub(super) fn ended(&self, index: usize) {
        if let Some(t) = self.each.get(index) {
            t.alive.store(false, Ordering::Relaxed);
        }
    }

    /// Sets the shortest "stuck" of the relay, in ms.
    pub(super) fn stuck_floor(&self, ms: u64) {
        self.stuck_floor.store(ms, Ordering::Relaxed);
    }

    /// Runs `f` on this thread's entry (nothing off a relay thread), with the
    /// relay's epoch.
    fn mark(f: impl FnOnce(&ThreadState, Instant)) {
        THIS_THREAD.with(|t| {
            if let Some((threads, i)) = t.borrow().as_ref() {
                if let Some(state) = threads.each.get(*i) {
                    f(state, threads.epoch);
                }
            }
        });
    }

    /// `at` as the states count it: ms after the epoch, plus one (0 is "none").
    fn stamp(epoch: Instant, at: Instant) -> u64 {
        at.saturating_duration_since(epoch).as_millis() as u64 + 1
    }

    /// Threads running whose time in `field` began longer than `after` ago.
    fn older_than(&self, after: u64, field: impl Fn(&ThreadState) -> &AtomicU64) -> usize {
        let now = Self::stamp(self.epoch, Instant::now());
        self.each
            .iter()
            .filter(|t| t.alive.load(Ordering::Relaxed))
            .filter(|t| {
                let since = field(t).load(Ordering::Relaxed);
                since != 0 && now.saturating_sub(since) > after
            })
            .count()
    }
}

/// The calling thread is the relay's thread `index`, and starts its work.
pub(super) fn enter(threads: Arc<Threads>, index: usize) {
    THIS_THREAD.with(|t| *t.borrow_mut() = Some((threads, index)));
    beat();
}

/// The calling relay thread sleeps: it is not busy until its next [`beat`].
pub(super) fn idle() {
    Threads::mark(|t, _| t.busy_since.store(0, Ordering::Relaxed));
}

/// The calling poller's oldest batch with the broker was sent at `since`
/// (`None`: no batch waits for its acks).
pub(super) fn sending(since: Option<Instant>) {
    Threads::mark(|t, epoch| {
        let at = since.map_or(0, |s| Threads::stamp(epoch, s));
        t.sending_since.store(at, Ordering::Relaxed)
    });
}

/// The calling relay thread starts a piece of work now (a claim, a batch, a
/// cleanup): one that goes on longer than a probe's `stuck_after` is stuck.
pub(super) fn beat() {
    Threads::mark(|t, epoch| {
        let now = Threads::stamp(epoch, Instant::now());
        t.busy_since.store(now, Ordering::Relaxed)
    });
}

/// The calling poller's broker can (`true`) or cannot be reached.
pub(crate) fn broker_ready(ready: bool) {
    Threads::mark(|t, _| t.broker_down.store(!ready, Ordering::Relaxed));
}

/// A cloneable view of a relay's threads, for health checks.
#[derive(Clone)]
pub struct RelayProbe {
    pub(super) alive: Arc<Threads>,
    /// Wakes the relay's pollers (the admin endpoint's resume).
    pub(super) waker: super::RelayWaker,
}

impl RelayProbe {
    /// How long a thread may be busy with one piece of work (a claim and its
    /// batch, a cleanup pass) before [`RelayProbe::stuck`] counts it: longer
    /// than the timeouts of the connections it waits on (a dead PostgreSQL
    /// or MySQL link is given up within 10 s, a RabbitMQ connect within
    /// 10 s, a batch's acks within the sender's confirm timeout).
    pub const STUCK_AFTER: Duration = Duration::from_secs(120);

    /// `(threads running, threads started)`.
    pub fn threads(&self) -> (usize, usize) {
        let running = self
            .alive
            .each
            .iter()
            .filter(|a| a.alive.load(Ordering::Relaxed))
            .count();
        (running, self.alive.each.len())
    }

    /// Threads running that have been busy with one piece of work for longer
    /// than `after` (and than twice the sender's longest wait for an ack):
    /// blocked on a connection that neither answers nor fails.
    pub fn stuck(&self, after: Duration) -> usize {
        let floor = self.alive.stuck_floor.load(Ordering::Relaxed);
        let after = (after.as_millis() as u64).max(floor);
        self.alive.older_than(after, |t| &t.busy_since)
    }

    /// Pollers whose oldest batch with the broker has waited for its acks
    /// longer than `after`: a broker, or a link to it, that takes the messages
    /// and does not answer (`/ready` says 503 before the sender's confirm
    /// timeout ends the wait).
    pub fn acks_overdue(&self, after: Duration) -> usize {
        self.alive
            .older_than(after.as_millis() as u64, |t| &t.sending_since)
    }

    /// Pollers whose broker cannot be reached now (their events wait, pending).
    pub fn broker_down(&self) -> usize {
        let down = |t: &&ThreadState| {
            t.alive.load(Ordering::Relaxed) && t.broker_down.load(Ordering::Relaxed)
        };
        self.alive.each.iter().filter(down).count()
    }

    /// True while every thread runs and none is stuck ([`RelayProbe::STUCK_AFTER`]).
    pub fn healthy(&self) -> bool {
        let (running, all) = self.threads();
        running == all && all > 0 && self.stuck(Self::STUCK_AFTER) == 0
    }

    /// Makes the relay's poller of `event_type` poll now (unknown types are
    /// ignored): what the admin endpoint's resume does for its relays.
    pub fn wake(&self, event_type: &str) {
        self.waker.wake(event_type);
    }

    /// How long a batch may wait for the broker's acks before
    /// [`RelayProbe::ready`] says no (the admin endpoint's default too).
    pub const ACKS_OVERDUE_AFTER: Duration = Duration::from_secs(10);

    /// Healthy, every poller's broker can be reached, and none has waited
    /// for a batch's acks longer than [`RelayProbe::ACKS_OVERDUE_AFTER`].
    pub fn ready(&self) -> bool {
        self.healthy()
            && self.broker_down() == 0
            && self.acks_overdue(Self::ACKS_OVERDUE_AFTER) == 0
    }
}
