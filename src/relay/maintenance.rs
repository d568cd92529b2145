//! The maintenance jobs: each on its own thread, every interval, under a lease
//! lock when one instance at a time should run it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use super::{Ctx, Slept};
use crate::error::Result;
use crate::metrics::Count;
use crate::store::Store;

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
