//! The leased batches a relay's pollers are sending: what a shutdown that
//! times out puts back to PENDING, so the next relay sends them at once
//! instead of after their lease.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard};

use uuid::Uuid;

use crate::event::{Event, EventId};
use crate::store::{ClaimStore, Outcome};

/// The leased batches a relay's pollers are sending and have not yet
/// finished, by claim token (shared by the relay and its pollers).
#[derive(Clone, Default)]
pub(super) struct Leased(Arc<Mutex<Batches>>);

#[derive(Default)]
struct Batches {
    batches: BTreeMap<Uuid, Vec<EventId>>,
    /// The shutdown released them: a batch claimed since is not sent.
    closed: bool,
}

/// The outcomes of a batch that goes back without an attempt.
fn released(ids: impl IntoIterator<Item = EventId>, why: &str) -> Vec<(EventId, Outcome)> {
    ids.into_iter()
        .map(|id| {
            let error = why.to_string();
            (id, Outcome::Release { error })
        })
        .collect()
}

impl Leased {
    fn lock(&self) -> MutexGuard<'_, Batches> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers a batch before it is sent. After the shutdown's release it
    /// is not registered: `store` takes it back at once, and this says
    /// `false` (the batch must not be sent).
    pub(super) fn add(
        &self,
        token: Uuid,
        events: &[Event],
        store: &(impl ClaimStore + ?Sized),
    ) -> crate::Result<bool> {
        let ids = events.iter().map(|e| e.id);
        {
            let mut l = self.lock();
            if !l.closed {
                l.batches.insert(token, ids.collect());
                return Ok(true);
            }
        }
        store.finish(token, &released(ids, "the relay shut down"))?;
        Ok(false)
    }

    /// The batch is finished: nothing to release.
    pub(super) fn remove(&self, token: Uuid) {
        self.lock().batches.remove(&token);
    }

    /// Releases the batches not finished (PENDING, no attempt): those of
    /// threads still waiting for acks, or of a poller that panicked; none is
    /// registered after it.
    pub(super) fn release(&self, store: &dyn ClaimStore) {
        let batches = {
            let mut l = self.lock();
            l.closed = true;
            std::mem::take(&mut l.batches)
        };
        for (token, ids) in batches {
            let n = ids.len();
            let outcomes = released(ids, "the relay shut down before the broker's acks came");
            match store.finish(token, &outcomes) {
                Ok(0) => {}
                Ok(n) => log::warn!(
                    "txbox: relay shutdown: released {n} events of a batch still waiting for \
                     the broker's acks; the next relay sends them (twice, should the acks come after all)"
                ),
                Err(e) => log::error!(
                    "txbox: relay shutdown: could not release {n} events still waiting for \
                     the broker's acks ({e}); they are sent again after their lease"
                ),
            }
        }
    }
}
