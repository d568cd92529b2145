//! The relay: a fixed pool of std threads that moves events from the outbox table
//! to the broker.
//!
//! Threads (each named `txbox-...`):
//! - one poller per configured event type: claim a batch (`FOR UPDATE SKIP LOCKED`),
//!   send it, wait for the acks, finish the rows under the claim token. With a sender
//!   that pipelines ([`Sender::start`]) the poller claims the next batch while the
//!   broker acks the previous one, up to `in_flight` batches. With held claims
//!   ([`ClaimMode::Lock`]) a backlog drains in one round trip per batch: the
//!   finish of one batch, its commit and the claim of the next go as one script
//!   on its connection ([`crate::HeldBatch::finish_and_claim`]);
//! - `txbox-recovery`: returns expired claims to PENDING (no attempt counted);
//! - `txbox-cleanup`: deletes old PROCESSED rows, under a lease lock (with
//!   `processed_ttl` zero the pollers delete acked rows themselves);
//! - with the DLQ on: `txbox-dlq-move`, `txbox-dlq-retry`, `txbox-dlq-cleanup`.
//!
//! So 2 + n threads, or 5 + n with the DLQ. Every thread sleeps on a channel:
//! [`Relay::shutdown`] and [`Relay::wake`] take effect at once.

use std::collections::{BTreeMap, VecDeque};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver};
use uuid::Uuid;

use crate::config::{ClaimMode, Config, EventSettings};
use crate::error::{Error, Result};
use crate::event::Event;
use crate::metrics::{self, Counter};
use crate::sender::{SendError, Sender, SenderFactory, Started};
use crate::store::{ClaimArgs, HeldBatch, HeldClaim, Outcome, Store};

mod polling;

pub use polling::{PollState, MAX_ERROR_DELAY};

/// Longest `last_error` kept with an event, in bytes (longer messages are cut).
pub const MAX_ERROR_LEN: usize = 2000;

/// While draining a backlog a poller claims each batch after the last id of the
/// previous one ([`Store::claim_after`]); every this many batches it claims from the
/// lowest pending id again, so events with lower ids that became due meanwhile
/// (retries, recovered claims) wait at most this many batches.
pub const RESCAN_EVERY: usize = 50;

/// The running relay. Dropping it stops the threads without waiting; call
/// [`Relay::shutdown`] to let in-flight batches finish.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use txbox::{Config, EventOptions, MemorySender, PgStore, Relay, Store};
///
/// let config = Config::builder().event("order-created", EventOptions::new()).build()?;
/// let store = Arc::new(PgStore::connect("postgres://postgres@127.0.0.1/test", &config.table_prefix)?);
/// store.migrate()?;
/// let relay = Relay::start(store, &config, MemorySender::new())?;
/// // ... the application runs ...
/// relay.shutdown(Duration::from_secs(10))?;
/// # Ok(()) }
/// ```
pub struct Relay {
    stop: Option<crossbeam_channel::Sender<()>>,
    done: Receiver<usize>,
    workers: Vec<(String, JoinHandle<()>)>,
    wakers: BTreeMap<String, crossbeam_channel::Sender<()>>,
    alive: Arc<Vec<AtomicBool>>,
}

/// What every thread shares.
#[derive(Clone)]
struct Ctx {
    store: Arc<dyn Store>,
    stop: Receiver<()>,
    instance: Uuid,
}

enum Wake {
    Stop,
    Go,
}

impl Ctx {
    fn stopped(&self) -> bool {
        matches!(
            self.stop.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    /// Sleeps `d`, or less if stopped or woken.
    fn sleep(&self, d: Duration, wake: Option<&Receiver<()>>) -> Wake {
        let never = crossbeam_channel::never();
        let wake = wake.unwrap_or(&never);
        select! {
            recv(self.stop) -> _ => Wake::Stop,
            recv(wake) -> _ => Wake::Go,
            default(d) => Wake::Go,
        }
    }
}

/// A thread's body.
type Job = Box<dyn FnOnce() + Send>;

/// Sends the thread's index on drop, so `shutdown` learns of its end even after a
/// panic, and clears its alive flag for [`RelayProbe`].
struct DoneGuard(
    crossbeam_channel::Sender<usize>,
    usize,
    Arc<Vec<AtomicBool>>,
);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        if let Some(a) = self.2.get(self.1) {
            a.store(false, Ordering::Relaxed);
        }
        let _ = self.0.send(self.1);
    }
}

/// A cloneable view of a relay's threads, for health checks.
#[derive(Clone)]
pub struct RelayProbe {
    alive: Arc<Vec<AtomicBool>>,
}

impl RelayProbe {
    /// `(threads running, threads started)`.
    pub fn threads(&self) -> (usize, usize) {
        let running = self
            .alive
            .iter()
            .filter(|a| a.load(Ordering::Relaxed))
            .count();
        (running, self.alive.len())
    }

    /// True while every thread runs.
    pub fn healthy(&self) -> bool {
        let (running, all) = self.threads();
        running == all && all > 0
    }
}

impl Relay {
    /// Starts the threads for every event type of `config`. The schema must exist
    /// ([`Store::migrate`]).
    pub fn start(
        store: Arc<dyn Store>,
        config: &Config,
        sender: impl SenderFactory,
    ) -> Result<Relay> {
        if !store.can_hold_claims() {
            if let Some((t, _)) = config
                .events
                .iter()
                .find(|(_, s)| s.claim == ClaimMode::Lock)
            {
                return Err(Error::config(
                    format!("events.{t}.claim"),
                    "is \"lock\", which needs a store that can hold a claim open \
                     (PostgreSQL); use \"lease\" with this store",
                ));
            }
        }
        // its fields are public: checked again as it is now
        config.validate()?;
        if let Some(prefix) = store.table_prefix() {
            if prefix != config.table_prefix {
                return Err(Error::config(
                    "table_prefix",
                    format!(
                        "is {:?} but the store was opened with {prefix:?}: the publisher \
                         and the relay would use different tables (open the store with \
                         Config::connect)",
                        config.table_prefix
                    ),
                ));
            }
        }
        let maintenance = if config.dlq.enabled { 5 } else { 2 };
        check_lease(config, sender.ack_wait())?;
        check_connections(store.as_ref(), config, maintenance)?;
        let sender: Arc<dyn SenderFactory> = Arc::new(sender);
        let threads = config.events.len() + maintenance;
        let (mut relay, ctx, mut spawn) = Relay::launcher(store, threads);
        for (event_type, settings) in &config.events {
            let (wake_tx, wake_rx) = bounded(1);
            relay.wakers.insert(event_type.clone(), wake_tx);
            let poller = Poller {
                ctx: ctx.clone(),
                destination: settings
                    .destination
                    .clone()
                    .unwrap_or_else(|| event_type.clone()),
                routing_key: settings
                    .routing_key
                    .clone()
                    .unwrap_or_else(|| event_type.clone()),
                event_type: event_type.clone(),
                settings: settings.clone(),
                factory: sender.clone(),
                sender: None,
                in_flight: VecDeque::new(),
                resume: None,
                delete_acked: config.maintenance.processed_ttl.is_zero(),
                stash: None,
            };
            // a thread name cannot hold a NUL (configurations refuse control
            // characters in event types; a hand-made one is not trusted)
            let name: String = event_type
                .chars()
                .map(|c| if c.is_control() { '?' } else { c })
                .collect();
            spawn(
                &mut relay,
                format!("txbox-poll-{name}"),
                Box::new(move || poller.run(wake_rx)),
            )?;
        }

        let m = config.maintenance.clone();
        let b = m.batch_size;
        let mut jobs = vec![
            Periodic {
                thread: "txbox-recovery",
                what: "stuck recovery",
                interval: m.recovery_interval,
                lock: None,
                counter: Some(Counter::Recovered),
                limit: b,
                job: Box::new(|s, n| s.recover_expired(n)),
                // the outbox gauges ride along, once per recovery run
                after: Some(|s| {
                    if let Err(e) = metrics::refresh(s) {
                        log::debug!("txbox: refreshing outbox gauges: {e}");
                    }
                }),
            },
            Periodic {
                thread: "txbox-cleanup",
                what: "processed cleanup",
                interval: m.cleanup_interval,
                lock: Some("txbox-cleanup-processed"),
                counter: Some(Counter::Cleaned),
                limit: b,
                job: Box::new(move |s, n| s.delete_processed(m.processed_ttl, n)),
                after: None,
            },
        ];
        if config.dlq.enabled {
            let d = config.dlq.clone();
            jobs.extend([
                Periodic {
                    thread: "txbox-dlq-move",
                    what: "move to DLQ",
                    interval: d.move_interval,
                    lock: None,
                    counter: Some(Counter::MovedToDlq),
                    limit: b,
                    job: Box::new(|s, n| s.move_failed_to_dlq(n)),
                    after: None,
                },
                Periodic {
                    thread: "txbox-dlq-retry",
                    what: "DLQ retry",
                    interval: d.retry_interval,
                    lock: None,
                    counter: None,
                    limit: b,
                    job: Box::new(|s, n| s.requeue_dlq_retries(n)),
                    after: None,
                },
                Periodic {
                    thread: "txbox-dlq-cleanup",
                    what: "DLQ cleanup",
                    interval: d.cleanup_interval,
                    lock: Some("txbox-cleanup-dlq"),
                    counter: Some(Counter::Cleaned),
                    limit: b,
                    job: Box::new(move |s, n| s.delete_resolved_dlq(d.resolved_ttl, n)),
                    after: None,
                },
            ]);
        }
        for job in jobs {
            let c = ctx.clone();
            spawn(&mut relay, job.thread.into(), Box::new(move || job.run(&c)))?;
        }
        log::info!("txbox: relay started with {} threads", relay.workers.len());
        Ok(relay)
    }

    /// An empty relay for `threads` threads, the context they share, and the
    /// function that starts each of them.
    fn launcher(
        store: Arc<dyn Store>,
        threads: usize,
    ) -> (
        Relay,
        Ctx,
        impl FnMut(&mut Relay, String, Job) -> Result<()>,
    ) {
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let ctx = Ctx {
            store,
            stop: stop_rx,
            instance: Uuid::now_v7(),
        };
        let relay = Relay {
            stop: Some(stop_tx),
            done: done_rx,
            workers: Vec::new(),
            wakers: BTreeMap::new(),
            alive: Arc::new((0..threads).map(|_| AtomicBool::new(true)).collect()),
        };
        let spawn = move |relay: &mut Relay, name: String, f: Job| -> Result<()> {
            let guard = DoneGuard(done_tx.clone(), relay.workers.len(), relay.alive.clone());
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    let _guard = guard;
                    f()
                })
                .map_err(|e| Error::Io {
                    context: format!("spawning thread {name}"),
                    source: e,
                })?;
            relay.workers.push((name, handle));
            Ok(())
        };
        (relay, ctx, spawn)
    }

    /// The inbox cleanup alone, on one thread (see [`crate::inbox::InboxCleanup`]).
    pub(crate) fn start_inbox_cleanup(
        store: Arc<dyn Store>,
        s: &crate::config::InboxSettings,
    ) -> Result<Relay> {
        let (mut relay, ctx, mut spawn) = Relay::launcher(store, 1);
        let ttl = s.ttl;
        let job = Periodic {
            thread: "txbox-inbox-cleanup",
            what: "inbox cleanup",
            interval: s.cleanup_interval,
            lock: Some("txbox-cleanup-inbox"),
            counter: Some(Counter::Cleaned),
            limit: s.batch_size,
            job: Box::new(move |st, n| st.delete_expired_inbox(ttl, n)),
            after: None,
        };
        spawn(
            &mut relay,
            job.thread.into(),
            Box::new(move || job.run(&ctx)),
        )?;
        Ok(relay)
    }

    /// A cloneable view of the threads, for a health endpoint.
    pub fn probe(&self) -> RelayProbe {
        RelayProbe {
            alive: self.alive.clone(),
        }
    }

    /// Threads still running.
    pub fn thread_count(&self) -> usize {
        self.probe().threads().0
    }

    /// Names of the relay's threads, in start order.
    pub fn thread_names(&self) -> Vec<String> {
        self.workers.iter().map(|(n, _)| n.clone()).collect()
    }

    /// Makes the poller of `event_type` poll now (e.g. right after a commit). Unknown
    /// types are ignored.
    pub fn wake(&self, event_type: &str) {
        if let Some(w) = self.wakers.get(event_type) {
            let _ = w.try_send(());
        }
    }

    /// Stops claiming, lets in-flight batches finish and joins the threads, waiting
    /// at most `timeout`. [`Error::ShutdownTimeout`] if some threads were still busy.
    pub fn shutdown(mut self, timeout: Duration) -> Result<()> {
        self.stop.take();
        let deadline = Instant::now() + timeout;
        let mut finished = vec![false; self.workers.len()];
        let mut running = self.workers.len();
        while running > 0 {
            match self.done.recv_deadline(deadline) {
                Ok(i) => {
                    if let Some(f) = finished.get_mut(i) {
                        *f = true;
                    }
                    running -= 1;
                }
                Err(_) => break,
            }
        }
        let workers = std::mem::take(&mut self.workers);
        let mut left = 0;
        for ((name, handle), finished) in workers.into_iter().zip(finished) {
            if finished {
                // it has left its loop; joining waits only for the thread to exit
                let _ = handle.join();
            } else {
                log::warn!("txbox: relay thread {name} still running at the shutdown deadline");
                left += 1;
            }
        }
        if left > 0 {
            return Err(Error::ShutdownTimeout(left));
        }
        log::info!("txbox: relay stopped");
        Ok(())
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.stop.take();
    }
}

/// Refuses a lease that runs out while a batch may still wait for its acks: the
/// batch would be recovered and sent again while still in flight.
fn check_lease(config: &Config, ack_wait: Option<Duration>) -> Result<()> {
    let Some(wait) = ack_wait else {
        return Ok(());
    };
    match config.events.iter().find(|(_, s)| s.lease <= wait) {
        Some((t, s)) => Err(Error::config(
            format!("events.{}.lease", t.escape_debug()),
            format!(
                "is {:?}, not longer than the sender's wait for a batch's acks ({wait:?}: \
                 Kafka's message.timeout.ms plus 5s, or RabbitMQ's confirm timeout); a \
                 batch still in flight would be sent again: make the lease longer or the \
                 wait shorter",
                s.lease
            ),
        )),
        None => Ok(()),
    }
}

/// Refuses held claims that need more connections than the store's pool has:
/// one per batch in flight of each held type, one per other poller, one per
/// maintenance thread and one for health checks. Short of them, recovery and
/// health checks would time out waiting for the pool.
fn check_connections(store: &dyn Store, config: &Config, maintenance: usize) -> Result<()> {
    let held: usize = config
        .events
        .values()
        .filter(|s| s.claim == ClaimMode::Lock)
        .map(|s| s.in_flight)
        .sum();
    let (Some(pool), true) = (store.max_connections(), held > 0) else {
        return Ok(());
    };
    let others = config
        .events
        .values()
        .filter(|s| s.claim != ClaimMode::Lock)
        .count();
    let needed = held + others + maintenance + 1;
    if needed > pool {
        return Err(Error::config(
            "events.*.claim",
            format!(
                "held claims need up to {needed} database connections ({held} batches in \
                 flight of held types, {others} other pollers, {maintenance} maintenance \
                 threads, 1 health check), and the store's pool has {pool}: give the store \
                 a larger pool (PgStore::connect_with) or lower in_flight"
            ),
        ));
    }
    Ok(())
}

/// One call of a maintenance job with its row limit: the rows it handled.
type MaintenanceStep = Box<dyn FnMut(&dyn Store, usize) -> Result<u64> + Send>;

/// A maintenance job on its own thread: `job` is called with `limit` and handles
/// up to that many rows per call.
struct Periodic {
    thread: &'static str,
    what: &'static str,
    interval: Duration,
    /// The lease lock the job runs under, when one instance at a time should run it.
    lock: Option<&'static str>,
    counter: Option<Counter>,
    limit: usize,
    job: MaintenanceStep,
    /// Runs once after each run of the job (not per call).
    after: Option<fn(&dyn Store)>,
}

impl Periodic {
    /// Runs the job every `interval` until stopped: called again while it handles a
    /// full batch, under the lease lock when given. Errors are logged and retried.
    fn run(mut self, ctx: &Ctx) {
        let (what, interval) = (self.what, self.interval);
        loop {
            let run = catch_unwind(AssertUnwindSafe(|| {
                let run = self.once(ctx);
                if let Some(after) = self.after {
                    after(ctx.store.as_ref());
                }
                run
            }));
            match run {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    if let Some(c) = self.counter {
                        metrics::add(c, n);
                    }
                    log::info!("txbox: {what}: {n} rows");
                }
                Ok(Err(e)) => {
                    log::warn!("txbox: {what} failed, will try again in {interval:?}: {e}")
                }
                Err(_) => log::error!("txbox: {what} panicked, will try again in {interval:?}"),
            }
            if let Wake::Stop = ctx.sleep(interval, None) {
                return;
            }
        }
    }

    /// One run: the calls until a batch is not full. Returns the rows handled.
    fn once(&mut self, ctx: &Ctx) -> Result<u64> {
        if let Some(name) = self.lock {
            let lease = self.interval.max(Duration::from_secs(60));
            if !ctx.store.try_lock(name, ctx.instance, lease)? {
                log::debug!("txbox: {}: another instance holds {name}", self.what);
                return Ok(0);
            }
        }
        let mut total = 0;
        let result = loop {
            match (self.job)(ctx.store.as_ref(), self.limit) {
                Ok(n) => {
                    total += n;
                    if (n as usize) < self.limit || ctx.stopped() {
                        break Ok(total);
                    }
                }
                Err(e) => break Err(e),
            }
        };
        if let Some(name) = self.lock {
            if let Err(e) = ctx.store.unlock(name, ctx.instance) {
                log::warn!("txbox: {}: releasing {name}: {e}", self.what);
            }
        }
        result
    }
}

struct Poller {
    ctx: Ctx,
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

impl Poller {
    fn run(mut self, wake: Receiver<()>) {
        let mut state = PollState::new(&self.settings.polling);
        let mut delay = self.settings.polling.initial_delay;
        loop {
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
                if let Wake::Stop = self.ctx.sleep(delay, Some(&wake)) {
                    return;
                }
            }
            let next = match catch_unwind(AssertUnwindSafe(|| self.poll_once())) {
                Ok(Ok(claimed)) => state.after_batch(claimed, self.settings.batch_size),
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
        if let Some(Err(e)) = self.sender.as_mut().map(|s| s.ready()) {
            self.resume = None;
            self.drain(0, false);
            return Err(Error::Broker(format!("sender not ready: {e}")));
        }
        let token = Uuid::now_v7();
        let claimed_at = Instant::now();
        let after = self.resume.map(|(id, _)| id);
        let claim = match self.settings.claim {
            ClaimMode::Lease => self
                .ctx
                .store
                .claim_after(
                    &self.event_type,
                    after,
                    self.settings.batch_size,
                    self.settings.lease,
                    token,
                )
                .map(|events| (events, None)),
            ClaimMode::Lock => self.claim_held(after),
        };
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
        // anything else (or every RESCAN_EVERY batches) scans from the lowest id
        let scanned = self.resume.map_or(0, |(_, n)| n);
        self.resume = match events.last() {
            Some(last) if claimed >= s.batch_size && scanned + 1 < RESCAN_EVERY => {
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
                lease_end: claimed_at
                    .checked_add(s.lease)
                    .unwrap_or(claimed_at + crate::config::MAX_LEASE),
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
        let released = self.drain(keep, claimed >= s.batch_size);
        if released > 0 {
            // the transport failed: back off before the next claim (and ask the
            // sender whether it is ready) instead of claiming the same rows again
            self.resume = None;
            return Err(Error::Broker(format!(
                "{released} events went back to pending, no attempt counted: \
                 the broker could not be reached"
            )));
        }
        Ok(claimed)
    }

    /// A held claim, on the connection of a stashed batch together with its finish
    /// when there is one.
    fn claim_held(&mut self, after: Option<crate::EventId>) -> Result<HeldClaim> {
        let stash = self.stash.take();
        let args = ClaimArgs {
            event_type: &self.event_type,
            after,
            limit: self.settings.batch_size,
            lease: self.settings.lease,
            delete_acked: self.delete_acked,
        };
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
        self.ctx.store.claim_held(&args)
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
            let (mut sent, mut retried, mut failed) = (0, 0, 0);
            for (_, o) in &outcomes {
                match o {
                    Outcome::Sent | Outcome::SentDelete => sent += 1,
                    Outcome::Retry { .. } => retried += 1,
                    Outcome::Failed { .. } => failed += 1,
                    Outcome::Release { .. } => released += 1,
                }
            }
            metrics::acked(
                outcomes
                    .iter()
                    .filter_map(|(id, o)| o.is_sent().then_some(*id)),
            );
            metrics::add(Counter::Sent, sent);
            metrics::add(Counter::Retried, retried);
            metrics::add(Counter::Failed, failed);
            match batch.held {
                Some(held) if stash && self.stash.is_none() && self.in_flight.len() == keep => {
                    self.stash = Some(Stashed {
                        held,
                        events: batch.events,
                        outcomes,
                    });
                }
                Some(held) => self.finish_held(held, &batch.events, &outcomes),
                None => self.finish(batch.token, &outcomes, batch.lease_end),
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
            match self.ctx.store.finish(token, outcomes) {
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

/// Turns the sender's per-event results into row outcomes: acked (PROCESSED, or
/// deleted when `delete_acked`), a transport failure back to PENDING with no
/// attempt counted, retry with backoff while retries are left, FAILED after.
fn outcomes(
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
                    if retry > s.max_retries {
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

    fn event(attempts: u32) -> Event {
        Event {
            id: EventId::new(),
            event_type: "t".into(),
            destination: "t".into(),
            routing_key: "t".into(),
            key: None,
            headers: Default::default(),
            payload: "{}".into(),
            attempts,
        }
    }

    #[test]
    fn outcomes_retry_then_fail_and_short_results_fail() {
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
