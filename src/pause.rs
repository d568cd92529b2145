//! Pausing an event type during a downstream incident: every relay on the
//! tables stops claiming it, publishing goes on, and a resume sends what
//! waited.

use std::sync::Arc;

use crate::error::Result;
use crate::store::MaintenanceStore;

/// The pause admin API: the state lives in the database (the table
/// `<prefix>outbox_paused_types`), so every relay instance on the tables
/// stops claiming a paused type at its next poll, and one started while the
/// type is paused sends nothing of it. A resume wakes every relay's poller of
/// the type at once where commits notify (PostgreSQL); elsewhere each finds
/// it at its next poll (at most its polling delay), and
/// [`Relay::wake`](crate::Relay::wake) wakes a relay of this process at once.
/// `txbox pause TYPE`, `txbox resume TYPE` and the admin endpoint's `POST
/// /types/{type}/pause` do the same.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// # let store = std::sync::Arc::new(txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", &txbox::Config::builder().build()?)?);
/// let pauses = txbox::Pauses::new(store);
/// pauses.pause("order-created")?; // the payment provider is down
/// assert_eq!(pauses.list()?, ["order-created"]);
/// pauses.resume("order-created")?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Pauses {
    store: Arc<dyn MaintenanceStore>,
}

impl Pauses {
    /// The API over a store.
    pub fn new(store: Arc<dyn MaintenanceStore>) -> Self {
        Pauses { store }
    }

    /// Pauses `event_type`; `true` when it was running. A type the
    /// configuration does not name can be paused too (a relay started later
    /// with it finds it paused).
    pub fn pause(&self, event_type: &str) -> Result<bool> {
        let paused = self.store.pause(event_type)?;
        if paused {
            log::warn!("txbox: event type {event_type:?} paused: no relay claims it");
        }
        Ok(paused)
    }

    /// Resumes `event_type`; `true` when it was paused.
    pub fn resume(&self, event_type: &str) -> Result<bool> {
        let resumed = self.store.resume(event_type)?;
        if resumed {
            log::info!("txbox: event type {event_type:?} resumed");
        }
        Ok(resumed)
    }

    /// The paused types, by name.
    pub fn list(&self) -> Result<Vec<String>> {
        self.store.paused()
    }
}
