//! The maintenance jobs: each on its own thread, every interval, under a lease
//! lock when one instance at a time should run it.

use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::{Ctx, Slept};
use crate::config::Config;
use crate::error::Result;
use crate::metrics::Count;
use crate::store::{FullStore, Store};

/// One call of a maintenance job with its row limit: the rows it handled.
pub(super) type MaintenanceStep = Box<dyn FnMut(usize) -> Result<u64> + Send>;

/// A maintenance job on its own thread: `job` is called with `limit` and handles
/// up to that many rows per call.
pub(super) struct Periodic {
    pub(super) thread: &'static str,
    /// Where the lease lock is taken (the job holds its own store).
    pub(super) store: Arc<dyn Store>,
    pub(super) what: &'static str,
    pub(super) interval: Duration,
    /// The lease lock the job runs under, when one instance at a time should run it.
    pub(super) lock: Option<&'static str>,
    pub(super) counter: Option<Count>,
    pub(super) limit: usize,
    pub(super) job: MaintenanceStep,
    /// Runs once after each run of the job (not per call).
    pub(super) after: Option<Box<dyn FnMut() + Send>>,
}

impl Periodic {
    /// Runs the job every `interval` until stopped: called again while it handles a
    /// full batch, under the lease lock when given. Errors are logged and retried.
    pub(super) fn run(mut self, ctx: &Ctx) {
        let (what, interval) = (self.what, self.interval);
        loop {
            let run = catch_unwind(AssertUnwindSafe(|| {
                let run = self.once(ctx);
                if let Some(after) = &mut self.after {
                    after();
                }
                run
            }));
            match run {
                Ok(Ok(0)) => {}
                Ok(Ok(n)) => {
                    if let Some(c) = self.counter {
                        ctx.observer.add(c, n);
                    }
                    log::info!("txbox: {what}: {n} rows");
                }
                Ok(Err(e)) => {
                    log::warn!("txbox: {what} failed, will try again in {interval:?}: {e}")
                }
                Err(_) => log::error!("txbox: {what} panicked, will try again in {interval:?}"),
            }
            if let Slept::Stop = ctx.sleep(interval, None) {
                return;
            }
        }
    }

    /// One run: the calls until a batch is not full. Returns the rows handled.
    fn once(&mut self, ctx: &Ctx) -> Result<u64> {
        if let Some(name) = self.lock {
            let lease = self.interval.max(Duration::from_secs(60));
            if !self.store.try_lock(name, ctx.instance, lease)? {
                log::debug!("txbox: {}: another instance holds {name}", self.what);
                return Ok(0);
            }
        }
        let mut total = 0;
        let result = loop {
            super::beat();
            match (self.job)(self.limit) {
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
            if let Err(e) = self.store.unlock(name, ctx.instance) {
                log::warn!("txbox: {}: releasing {name}: {e}", self.what);
            }
        }
        result
    }
}

/// The maintenance jobs of a relay on `config`: recovery (which also refreshes
/// the outbox gauges and tells the store which types notify on commit),
/// cleanup, and with the DLQ on its move, retry and cleanup.
/// `notify` are the types whose commits notify.
pub(super) fn jobs(
    store: &Arc<dyn FullStore>,
    config: &Config,
    notify: &BTreeSet<String>,
) -> Vec<Periodic> {
    let m = config.maintenance.clone();
    let b = m.batch_size;
    let periodic = |thread, what, interval, lock, counter, job: MaintenanceStep| Periodic {
        thread,
        store: store.clone(),
        what,
        interval,
        lock,
        counter,
        limit: b,
        job,
        after: None,
    };
    let s = store.clone();
    let gauges = store.clone();
    let observer = config.observer.clone();
    let dlq_enabled = config.dlq.enabled;
    // which types' commits notify (PostgreSQL): told to the database now,
    // and again by the recovery thread until that succeeds
    let mut commit_wake = Some(CommitWake::of(config, notify));
    CommitWake::tell(&mut commit_wake, store.as_ref());
    let mut jobs = vec![
        Periodic {
            // the outbox gauges ride along, once per recovery run
            after: Some(Box::new(move || {
                CommitWake::tell(&mut commit_wake, gauges.as_ref());
                let counts = gauges
                    .status()
                    .and_then(|status| Ok((status, gauges.dlq_count(&Default::default())?)));
                match counts {
                    Ok((status, dlq)) => observer.outbox_status(&status, dlq),
                    Err(e) => log::debug!("txbox: refreshing outbox gauges: {e}"),
                }
                match gauges.paused() {
                    Ok(paused) => observer.paused(&paused),
                    Err(e) => log::debug!("txbox: reading the paused types: {e}"),
                }
                match gauges.notify_queue_usage() {
                    Ok(Some(usage)) => observer.notify_queue_usage(usage),
                    Ok(None) => {}
                    Err(e) => log::debug!("txbox: reading the notification queue's usage: {e}"),
                }
            })),
            ..periodic(
                "txbox-recovery",
                "stuck recovery",
                m.recovery_interval,
                None,
                Some(Count::Recovered),
                // with the DLQ threads off, dead letters an operator marked
                // for retry go back to the outbox here (else they would wait
                // for a thread that never runs)
                Box::new(move |n| {
                    if !dlq_enabled {
                        s.requeue_dlq_retries(n)?;
                    }
                    s.recover_expired(n)
                }),
            )
        },
        {
            let s = store.clone();
            periodic(
                "txbox-cleanup",
                "processed cleanup",
                m.cleanup_interval,
                Some("txbox-cleanup-processed"),
                Some(Count::Cleaned),
                {
                    let mut compact = CompactTurns::new(&m);
                    Box::new(move |n| {
                        let cleaned = s.delete_processed(m.processed_ttl, n)?;
                        // the run's last call: the table as clean as it gets
                        if (cleaned as usize) < n {
                            compact.turn(s.as_ref());
                        }
                        Ok(cleaned)
                    })
                },
            )
        },
    ];
    if config.dlq.enabled {
        let d = config.dlq.clone();
        let (s1, s2, s3) = (store.clone(), store.clone(), store.clone());
        jobs.extend([
            periodic(
                "txbox-dlq-move",
                "move to DLQ",
                d.move_interval,
                None,
                Some(Count::MovedToDlq),
                Box::new(move |n| s1.move_failed_to_dlq(n)),
            ),
            periodic(
                "txbox-dlq-retry",
                "DLQ retry",
                d.retry_interval,
                None,
                None,
                Box::new(move |n| s2.requeue_dlq_retries(n)),
            ),
            periodic(
                "txbox-dlq-cleanup",
                "DLQ cleanup",
                d.cleanup_interval,
                Some("txbox-cleanup-dlq"),
                Some(Count::Cleaned),
                Box::new(move |n| s3.delete_resolved_dlq(d.resolved_ttl, n)),
            ),
        ]);
    }
    jobs
}

/// The event types of a configuration whose commits notify the relay, and those
/// whose do not ([`Wake::Poll`](crate::Wake::Poll)), for [`ClaimStore::set_commit_wake`](crate::store::ClaimStore::set_commit_wake).
struct CommitWake {
    notify: Vec<String>,
    quiet: Vec<String>,
}

impl CommitWake {
    /// The types of `config`, those of `notify` notifying.
    fn of(config: &Config, notify: &BTreeSet<String>) -> CommitWake {
        let quiet = config.events.keys().filter(|t| !notify.contains(*t));
        CommitWake {
            notify: notify.iter().cloned().collect(),
            quiet: quiet.cloned().collect(),
        }
    }

    /// Tells `store` what `untold` holds, if anything, and forgets it once told;
    /// a failure is logged and the next call (the recovery thread's) tries
    /// again.
    fn tell(untold: &mut Option<CommitWake>, store: &dyn FullStore) {
        fn names(v: &[String]) -> Vec<&str> {
            v.iter().map(String::as_str).collect()
        }
        let Some(w) = untold else {
            return;
        };
        match store.set_commit_wake(&names(&w.notify), &names(&w.quiet)) {
            Ok(()) => *untold = None,
            Err(e) => log::warn!(
                "txbox: cannot tell the database which event types notify on commit \
                 (the recovery thread tries again): {e}"
            ),
        }
    }
}

/// When the cleanup rewrites a mostly empty outbox
/// ([`MaintenanceStore::compact`](crate::store::MaintenanceStore::compact)):
/// after a run, unless off; after a rewrite, not in the next 64 runs (a table
/// that churns, `processed_ttl = 0` under a steady load, is mostly empty
/// space again soon: its exclusive lock is not taken at every run); after
/// one that gave up (its lock not had, or the table too large to rewrite,
/// within the timeout) or gained little, after 1, 2, 4 ... 64 runs; for good
/// after the database refused it (a role that does not own the table).
struct CompactTurns {
    /// `None`: off.
    timeout: Option<Duration>,
    /// Runs still to skip, and how many the next give-up skips.
    skip: u32,
    backoff: u32,
}

impl CompactTurns {
    const MAX_SKIP: u32 = 64;

    fn new(m: &crate::config::MaintenanceSettings) -> Self {
        CompactTurns {
            timeout: m.compact.then_some(m.compact_timeout),
            skip: 0,
            backoff: 1,
        }
    }

    fn turn(&mut self, store: &dyn FullStore) {
        let Some(timeout) = self.timeout else { return };
        if self.skip > 0 {
            self.skip -= 1;
            return;
        }
        match store.compact(timeout) {
            Ok(None) => self.backoff = 1,
            // rows an open transaction may see were copied: little gained
            Ok(Some(c)) if c.bytes_after > c.bytes_before / 2 => {
                self.wait();
                log::info!(
                    "txbox: the outbox table, mostly empty, rewritten to {} of {} bytes \
                     (rows an open transaction may see kept); tried again after {} cleanups",
                    c.bytes_after,
                    c.bytes_before,
                    self.skip
                );
            }
            Ok(Some(c)) => {
                self.backoff = 1;
                self.skip = Self::MAX_SKIP;
                log::info!(
                    "txbox: the outbox table, mostly empty, rewritten: {} -> {} bytes",
                    c.bytes_before,
                    c.bytes_after
                );
            }
            Err(e @ crate::Error::Unsupported { .. }) => {
                self.timeout = None;
                log::warn!("txbox: the outbox table is not rewritten (maintenance.compact): {e}");
            }
            Err(e) => {
                self.wait();
                log::warn!(
                    "txbox: rewriting the mostly empty outbox table gave up within {timeout:?} \
                     (maintenance.compact_timeout: a long reader of the table held its lock, \
                     or the table is too large to rewrite in that time), tried again after {} \
                     cleanups: {e}",
                    self.skip
                );
            }
        }
    }

    /// The next `backoff` runs skip the rewrite, and the one after a next
    /// give-up twice as many.
    fn wait(&mut self) {
        self.skip = self.backoff;
        self.backoff = (self.backoff * 2).min(Self::MAX_SKIP);
    }
}
