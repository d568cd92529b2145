//! The relay: a fixed pool of std threads that moves events from the outbox table
//! to the broker.
//!
//! Threads (each named `txbox-...`):
//! - one poller per configured event type: claim a batch (`FOR UPDATE SKIP LOCKED`),
//!   send it, wait for the acks, finish the rows under the claim token. With a sender
//!   that pipelines ([`Sender::start`](crate::Sender::start)) the poller claims the next batch while the
//!   broker acks the previous one, up to `in_flight` batches. With held claims
//!   ([`ClaimMode::Lock`]) a backlog drains in one round trip per batch: the
//!   finish of one batch, its commit and the claim of the next go as one script
//!   on its connection ([`crate::store::HeldBatch::finish_and_claim`]);
//! - `txbox-recovery`: returns expired claims to PENDING (no attempt counted);
//! - `txbox-cleanup`: deletes old PROCESSED rows, under a lease lock (with
//!   `processed_ttl` zero the pollers delete acked rows themselves);
//! - with the DLQ on: `txbox-dlq-move`, `txbox-dlq-retry`, `txbox-dlq-cleanup`;
//! - on a store with commit notifications (PostgreSQL), when any type's wake-up
//!   is [`Wake::Notify`](crate::Wake::Notify): `txbox-listen`, which wakes the
//!   poller of each event type a commit published.
//!
//! So 2 + n threads, or 5 + n with the DLQ, one more with the listener. Every
//! thread sleeps on a channel: [`Relay::shutdown`] and [`Relay::wake`] (or a
//! [`RelayWaker`]) take effect at once.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, select, Receiver};
use uuid::Uuid;

use crate::config::{ClaimMode, Config, Wake as WakeMode};
use crate::error::{Error, Result};
use crate::metrics::{Count, Observed};
use crate::sender::SenderFactory;
use crate::store::{FullStore, InboxStore};

mod delay;
mod flush;
mod leased;
mod listener;
mod maintenance;
mod pipeline;
mod poller;
mod probe;
mod retry;

pub(crate) use delay::PollState;
use leased::Leased;
use maintenance::Periodic;
use poller::Poller;

pub use flush::Delivery;
use probe::broker_ready;
pub use probe::RelayProbe;
use probe::{beat, Threads};
pub use retry::TypeDelivery;

/// The running relay. Dropping it stops the threads without waiting; call
/// [`Relay::shutdown`] to let in-flight batches finish.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// use std::{sync::Arc, time::Duration};
/// use txbox::{Config, MemorySender, PgStore, Relay, Store};
///
/// let config = Config::builder().event("order-created", |e| e).build()?;
/// let store = Arc::new(PgStore::connect("postgres://postgres@127.0.0.1/test", &config)?);
/// store.migrate()?;
/// let relay = Relay::start(store, &config, MemorySender::new())?;
/// // ... the application runs ...
/// relay.shutdown(Duration::from_secs(10))?;
/// # Ok(()) }
/// ```
#[must_use = "dropping it stops it"]
pub struct Relay {
    stop: Option<crossbeam_channel::Sender<()>>,
    done: Receiver<usize>,
    workers: Vec<(String, JoinHandle<()>)>,
    wakers: RelayWaker,
    alive: Arc<Threads>,
    /// The pollers' leased batches with the broker, and the store that
    /// releases them when a shutdown times out.
    leased: Leased,
    store: Option<Arc<dyn FullStore>>,
    ack_wait: Option<Duration>,
}

/// Wakes a relay's pollers: a cheap, cloneable handle ([`Relay::waker`]) for the
/// code that commits events in the same process as the relay, so an event goes
/// out at once instead of at the next poll. PostgreSQL wakes the relay on
/// commit by itself (`wake = "notify"`); on the other databases, wake it after
/// your commit. A wake-up is a hint: a poller that is busy claims once when it
/// is done, and polling goes on as the safety net.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// # let config = txbox::Config::builder().event("job-done", |e| e).build()?;
/// # let store = config.connect("sqlite:jobs.db")?;
/// let relay = txbox::Relay::start(store, &config, txbox::MemorySender::new())?;
/// let waker = relay.waker();
/// // ... publish "job-done" in a transaction and commit it, then:
/// waker.wake("job-done");
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct RelayWaker(Arc<BTreeMap<String, crossbeam_channel::Sender<()>>>);

impl RelayWaker {
    /// Makes the poller of `event_type` poll now. Unknown types are ignored.
    pub fn wake(&self, event_type: &str) {
        if let Some(w) = self.0.get(event_type) {
            // a full channel already holds a wake-up: they coalesce
            let _ = w.try_send(());
        }
    }

    /// Makes every poller poll now.
    pub fn wake_all(&self) {
        for w in self.0.values() {
            let _ = w.try_send(());
        }
    }
}

impl std::fmt::Debug for RelayWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("RelayWaker")
            .field(&self.0.keys().collect::<Vec<_>>())
            .finish()
    }
}

/// What every thread shares.
#[derive(Clone)]
struct Ctx {
    stop: Receiver<()>,
    instance: Uuid,
    leased: Leased,
    /// The configuration's observer.
    observer: Observed,
}

enum Slept {
    Stop,
    /// Woken before the time was up (a commit's wake-up).
    Woken,
    /// The time was up.
    Timeout,
}

impl Ctx {
    fn stopped(&self) -> bool {
        matches!(
            self.stop.try_recv(),
            Err(crossbeam_channel::TryRecvError::Disconnected)
        )
    }

    /// Sleeps `d`, or less if stopped or woken. A stop wins over a wake-up that
    /// is ready at the same time (`select!` picks among ready ones at random).
    fn sleep(&self, d: Duration, wake: Option<&Receiver<()>>) -> Slept {
        let never = crossbeam_channel::never();
        let wake = wake.unwrap_or(&never);
        probe::idle();
        let slept = select! {
            recv(self.stop) -> _ => Slept::Stop,
            recv(wake) -> _ => Slept::Woken,
            default(d) => Slept::Timeout,
        };
        beat();
        if self.stopped() {
            Slept::Stop
        } else {
            slept
        }
    }
}

/// A thread's body.
type Job = Box<dyn FnOnce() + Send>;

/// Sends the thread's index on drop, so `shutdown` learns of its end even after a
/// panic, and clears its alive flag for [`RelayProbe`].
struct DoneGuard(crossbeam_channel::Sender<usize>, usize, Arc<Threads>);

impl Drop for DoneGuard {
    fn drop(&mut self) {
        self.2.ended(self.1);
        let _ = self.0.send(self.1);
    }
}

impl Relay {
    /// While draining a backlog a poller claims each batch after the last id of the
    /// previous one ([`ClaimStore::claim_after`](crate::store::ClaimStore::claim_after)); every this many batches it claims from the
    /// lowest pending id again, so events with lower ids that became due meanwhile
    /// (retries, recovered claims) wait at most this many batches.
    pub const RESCAN_EVERY: usize = 50;

    /// Starts the threads for every event type of `config`. The schema must exist
    /// ([`Store::migrate`](crate::Store::migrate)).
    pub fn start(
        store: Arc<dyn FullStore>,
        config: &Config,
        sender: impl SenderFactory,
    ) -> Result<Relay> {
        check_claim_modes(store.as_ref(), config)?;
        crate::store::check_same_tables(store.as_ref(), config.table_prefix(), "the relay")?;
        let notify = notify_types(config);
        let jobs = maintenance::jobs(&store, config, &notify);
        // the listener wakes the pollers whose wake-up is `notify` on commit,
        // where the store has commit notifications (PostgreSQL)
        let listens = store.capabilities().notifications && !notify.is_empty();
        check_lease(config, sender.ack_wait())?;
        check_destinations(config, &sender)?;
        let types: Vec<&str> = config.events.keys().map(String::as_str).collect();
        sender.check_event_types(&types)?;
        // the listener keeps a connection of the store's pool
        check_connections(store.as_ref(), config, jobs.len(), listens)?;
        let sender: Arc<dyn SenderFactory> = Arc::new(sender);
        let threads = config.events.len() + jobs.len() + usize::from(listens);
        let (mut relay, ctx, mut spawn) = Relay::launcher(threads, config.observer.clone());
        relay.store = Some(store.clone());
        relay.ack_wait = sender.ack_wait();
        if let Some(wait) = relay.ack_wait {
            let floor = (wait * 2).as_millis() as u64;
            relay.alive.stuck_floor(floor);
        }
        let (pollers, wakers, listened) = pollers(&ctx, &store, config, &sender, &notify);
        for (name, job) in pollers {
            spawn(&mut relay, name, job)?;
        }
        if listens {
            let listener = listener::Listener {
                store: store.clone(),
                types: listened,
            };
            let c = ctx.clone();
            spawn(
                &mut relay,
                "txbox-listen".into(),
                Box::new(move || listener.run(&c)),
            )?;
        }
        relay.wakers = wakers;
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
        threads: usize,
        observer: Observed,
    ) -> (
        Relay,
        Ctx,
        impl FnMut(&mut Relay, String, Job) -> Result<()>,
    ) {
        let (stop_tx, stop_rx) = bounded::<()>(0);
        let (done_tx, done_rx) = crossbeam_channel::unbounded();
        let leased = Leased::default();
        let ctx = Ctx {
            stop: stop_rx,
            instance: Uuid::now_v7(),
            leased: leased.clone(),
            observer,
        };
        let relay = Relay {
            stop: Some(stop_tx),
            done: done_rx,
            workers: Vec::new(),
            wakers: RelayWaker::default(),
            alive: Arc::new(Threads::new(threads)),
            leased,
            store: None,
            ack_wait: None,
        };
        let spawn = move |relay: &mut Relay, name: String, f: Job| -> Result<()> {
            let index = relay.workers.len();
            let guard = DoneGuard(done_tx.clone(), index, relay.alive.clone());
            let threads = relay.alive.clone();
            let handle = std::thread::Builder::new()
                .name(name.clone())
                .spawn(move || {
                    let _guard = guard;
                    probe::enter(threads, index);
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
        store: Arc<dyn InboxStore>,
        config: &Config,
    ) -> Result<Relay> {
        let s = &config.inbox;
        let (mut relay, ctx, mut spawn) = Relay::launcher(1, config.observer.clone());
        let ttl = s.ttl;
        let job = Periodic {
            thread: "txbox-inbox-cleanup",
            store: store.clone(),
            what: "inbox cleanup",
            interval: s.cleanup_interval,
            lock: Some("txbox-cleanup-inbox"),
            counter: Some(Count::Cleaned),
            limit: s.batch_size,
            job: Box::new(move |n| store.delete_expired_inbox(ttl, n)),
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
            waker: self.wakers.clone(),
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
        self.wakers.wake(event_type);
    }

    /// A handle that wakes the pollers from anywhere in the process (see
    /// [`RelayWaker`]).
    pub fn waker(&self) -> RelayWaker {
        self.wakers.clone()
    }

    /// The longest the sender waits for the broker's acks of one batch
    /// ([`SenderFactory::ack_wait`]), when it says: a [`Relay::shutdown`]
    /// deadline a few seconds past it lets every batch in flight finish.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), Box<dyn std::error::Error>> {
    /// # let config = txbox::Config::builder().event("job-done", |e| e).build()?;
    /// # let store = config.connect("sqlite:jobs.db")?;
    /// # let sender = txbox::MemorySender::new();
    /// use std::time::Duration;
    /// let relay = txbox::Relay::start(store, &config, sender)?;
    /// // ... on SIGTERM:
    /// let deadline = relay.ack_wait().unwrap_or(Duration::from_secs(30)) + Duration::from_secs(5);
    /// relay.shutdown(deadline)?;
    /// # Ok(()) }
    /// ```
    pub fn ack_wait(&self) -> Option<Duration> {
        self.ack_wait
    }

    /// Stops claiming, lets in-flight batches finish and joins the threads, waiting
    /// at most `timeout`. [`Error::ShutdownTimeout`] if some threads were still busy.
    ///
    /// A leased batch still waiting for the broker's acks at the deadline is
    /// released then, before this returns: its events are PENDING again with
    /// no attempt counted, and the next relay sends them at once, not after
    /// their lease. Should the broker ack them after all (the thread goes on
    /// waiting in the background while the process lives), its finish no
    /// longer holds the rows, and the events are sent twice: at least once, as
    /// ever. A held batch ([`ClaimMode::Lock`]) goes back when its transaction
    /// ends: when the thread finishes it, or when the process exits and the
    /// database drops the connection. A deadline a few seconds past
    /// [`Relay::ack_wait`] lets every batch finish. Dropping a relay without
    /// `shutdown` stops it in the background; a process that exits meanwhile
    /// leaves its leased batches to recovery after their lease.
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
        if let Some(store) = &self.store {
            self.leased.release(store.as_ref());
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

/// The event types whose wake-up is [`WakeMode::Notify`].
fn notify_types(config: &Config) -> BTreeSet<String> {
    config
        .events
        .iter()
        .filter(|(_, s)| s.wake == WakeMode::Notify)
        .map(|(t, _)| t.clone())
        .collect()
}

/// One poller per event type, as thread names and bodies; the wakers of all,
/// and the pollers the listener wakes (those of `notify`).
fn pollers(
    ctx: &Ctx,
    store: &Arc<dyn FullStore>,
    config: &Config,
    sender: &Arc<dyn SenderFactory>,
    notify: &BTreeSet<String>,
) -> (
    Vec<(String, Job)>,
    RelayWaker,
    BTreeMap<String, listener::Listened>,
) {
    let mut jobs = Vec::new();
    let mut wakers = BTreeMap::new();
    let mut listened = BTreeMap::new();
    for (event_type, settings) in &config.events {
        let (wake_tx, wake_rx) = bounded(1);
        let started = Arc::new(AtomicU64::new(0));
        if notify.contains(event_type) {
            let l = listener::Listened {
                wake: wake_tx.clone(),
                claims: started.clone(),
            };
            listened.insert(event_type.clone(), l);
        }
        wakers.insert(event_type.clone(), wake_tx);
        let poller = Poller::new(
            ctx.clone(),
            store.clone(),
            event_type.clone(),
            settings.clone(),
            sender.clone(),
            config.maintenance.processed_ttl.is_zero(),
            started,
        );
        // a Config is validated when built: the name has no control
        // characters, so it is a valid thread name
        let job: Job = Box::new(move || poller.run(wake_rx));
        jobs.push((format!("txbox-poll-{event_type}"), job));
    }
    (jobs, RelayWaker(Arc::new(wakers)), listened)
}

/// Refuses held claims ([`ClaimMode::Lock`]) on a store that cannot hold a
/// claim open.
fn check_claim_modes<S: crate::store::ClaimStore + ?Sized>(
    store: &S,
    config: &Config,
) -> Result<()> {
    if store.capabilities().held_claims {
        return Ok(());
    }
    match config
        .events
        .iter()
        .find(|(_, s)| s.claim == ClaimMode::Lock)
    {
        Some((t, _)) => Err(Error::config(
            format!("events.{t}.claim"),
            "is \"lock\", which needs a store that can hold a claim open \
             (PostgreSQL); use \"lease\" with this store",
        )),
        None => Ok(()),
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

/// Refuses a destination the sender says its broker cannot have.
fn check_destinations(config: &Config, sender: &dyn SenderFactory) -> Result<()> {
    for (t, s) in &config.events {
        let destination = s.destination_for(t);
        if let Err(why) = sender.check_destination(destination) {
            return Err(Error::config(
                format!("events.{}.destination", t.escape_debug()),
                why,
            ));
        }
    }
    Ok(())
}

/// Refuses held claims that need more connections than the store's pool has:
/// one per batch in flight of each held type, one per other poller, one per
/// maintenance thread and one for health checks. Short of them, recovery and
/// health checks would time out waiting for the pool.
fn check_connections(
    store: &dyn FullStore,
    config: &Config,
    maintenance: usize,
    listener: bool,
) -> Result<()> {
    let held: usize = config
        .events
        .values()
        .filter(|s| s.claim == ClaimMode::Lock)
        .map(|s| s.in_flight)
        .sum();
    let Some(pool) = store.max_connections() else {
        return Ok(());
    };
    if listener && pool < 2 {
        return Err(Error::config(
            "events.*.wake",
            format!(
                "is \"notify\", whose commit listener keeps one of the store's connections \
                 while the relay runs, and the store's pool has {pool}: give the store a \
                 larger pool or set wake = \"poll\""
            ),
        ));
    }
    if held == 0 {
        return Ok(());
    }
    let others = config
        .events
        .values()
        .filter(|s| s.claim != ClaimMode::Lock)
        .count();
    let needed = held + others + maintenance + usize::from(listener) + 1;
    let listening = if listener { ", 1 commit listener" } else { "" };
    if needed > pool {
        return Err(Error::config(
            "events.*.claim",
            format!(
                "held claims need up to {needed} database connections ({held} batches in \
                 flight of held types, {others} other pollers, {maintenance} maintenance \
                 threads{listening}, 1 health check), and the store's pool has {pool}: give the store \
                 a larger pool (PgStore::from_pool) or lower in_flight"
            ),
        ));
    }
    Ok(())
}
