//! The listener: one thread per relay that waits for the commit notifications of
//! its store (PostgreSQL's `NOTIFY`) and wakes the poller of each event type
//! named. Its connection lost, it listens again with backoff and wakes every
//! poller once (what was notified meanwhile is gone); polling stays the safety
//! net.

use std::sync::Arc;
use std::time::Duration;

use super::{Ctx, RelayWaker, Slept};
use crate::store::ClaimStore;

/// How long one wait for a notification lasts: how soon a stop is seen (and so
/// how long `Relay::shutdown` may wait for the listener). A wait sends nothing
/// to the database.
const WAIT: Duration = Duration::from_millis(50);
/// The backoff between attempts to listen again.
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

pub(super) struct Listener {
    pub(super) store: Arc<dyn ClaimStore>,
    /// Wakes the pollers whose wake-up is `notify` (and ignores other types).
    pub(super) waker: RelayWaker,
}

impl Listener {
    pub(super) fn run(self, ctx: &Ctx) {
        let mut backoff = MIN_BACKOFF;
        // the pollers claimed once before the LISTEN was in place: a commit in
        // between woke nobody, so the first LISTEN wakes them all, as every later one
        let mut lost = true;
        while !ctx.stopped() {
            match self.store.listen() {
                Ok(mut notifications) => {
                    if lost {
                        log::info!("txbox: listening for commits");
                        self.waker.wake_all();
                    }
                    backoff = MIN_BACKOFF;
                    loop {
                        if ctx.stopped() {
                            return;
                        }
                        match notifications.next(WAIT) {
                            Ok(Some(event_type)) => self.waker.wake(&event_type),
                            Ok(None) => {}
                            Err(e) => {
                                log::warn!("txbox: listener lost its connection: {e}");
                                break;
                            }
                        }
                    }
                }
                Err(e) => log::warn!("txbox: listener cannot listen, next try in {backoff:?}: {e}"),
            }
            lost = true;
            if let Slept::Stop = ctx.sleep(backoff, None) {
                return;
            }
            backoff = (backoff * 2).min(MAX_BACKOFF);
        }
    }
}
