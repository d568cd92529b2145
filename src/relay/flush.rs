//! Delivering what is pending now, on the caller's thread: for tests and batch
//! jobs that want the relay's work done before they go on, with no threads to
//! start, wait for or stop.

use std::collections::BTreeMap;

use super::leased::Leased;
use super::pipeline::{Pipeline, Run};
use super::retry::TypeDelivery;
use super::{check_claim_modes, Relay};
use crate::config::Config;
use crate::error::Result;
use crate::event::EventId;
use crate::sender::Sender;
use crate::store::ClaimStore;

/// What [`Relay::deliver_pending`] did, per event type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Delivery {
    /// Each configured type that had due events, by name.
    pub by_type: BTreeMap<String, TypeDelivery>,
}

impl Delivery {
    /// Events acked, over every type.
    pub fn sent(&self) -> u64 {
        self.by_type.values().map(|t| t.sent).sum()
    }

    /// Events not acked (retried, failed or released), over every type.
    pub fn not_sent(&self) -> u64 {
        self.by_type
            .values()
            .map(|t| t.retried + t.failed + t.released)
            .sum()
    }
}

impl Relay {
    /// Sends every event of the configured types that is due now, on this
    /// thread, and returns what became of them: the relay's work, done once and
    /// synchronously, with no threads. For a blocking integration test (publish,
    /// `deliver_pending`, then assert on a [`MemorySender`](crate::MemorySender)
    /// or the broker) and for a batch job that relays before it exits.
    ///
    /// Each type goes through the poller's own delivery pipeline: claimed,
    /// sent and finished in batches as a poller does it (its batch size, claim
    /// mode, batches in flight, retries, backoff, ordering and the
    /// configuration's `processed_ttl`; the metrics count them as the
    /// relay's), until a claim
    /// finds nothing due among the events the database had inserted when the
    /// call began ([`ClaimStore::insert_mark`]: so a steady stream of
    /// publishes cannot keep it going, and a publisher's clock does not
    /// matter). An event
    /// refused with retries left is due again after its backoff: within the
    /// call when the backoff is shorter, else at a later call. An ordered type
    /// sends one event per key per batch, so a key's events go out one batch
    /// after another, in order. Relays running on the same table meanwhile
    /// take their share (`SKIP LOCKED`), which this call does not report. The
    /// sender is asked before each claim whether its broker can be reached
    /// ([`Sender::ready`]): when not, the call ends with
    /// [`Error::Broker`](crate::Error::Broker) and claims nothing more (what
    /// it sent before is finished: PROCESSED). A database error ends the call
    /// after the batches with the sender are waited for; a leased batch whose
    /// finish failed is claimed again after its lease, a held one at once.
    ///
    /// ```
    /// # fn main() -> txbox::Result<()> {
    /// # let dir = std::env::temp_dir().join(format!("txbox-doc-{}", std::process::id()));
    /// # std::fs::create_dir_all(&dir).unwrap();
    /// # let path = dir.join("deliver.db").display().to_string();
    /// # let _ = std::fs::remove_file(&path);
    /// use txbox::{Config, MemorySender, Outbox, Relay, SqliteStore, Store};
    ///
    /// let config = Config::builder().event("order-created", |e| e).build()?;
    /// let store = SqliteStore::connect(&path, &config)?;
    /// store.migrate()?;
    ///
    /// // the code under test publishes in its transaction
    /// let mut conn = SqliteStore::connection(&path)?;
    /// let mut tx = conn.transaction().unwrap();
    /// let id = Outbox::new(&config)?.publish(&mut tx, "order-created", &serde_json::json!({"id": 7}))?;
    /// tx.commit().unwrap();
    ///
    /// // the relay's work, now: no threads, no sleeps
    /// let sender = MemorySender::new();
    /// let report = Relay::deliver_pending(&store, &config, &mut sender.clone())?;
    /// assert_eq!(report.sent(), 1);
    /// assert_eq!(report.by_type["order-created"].sent, 1);
    /// assert_eq!(sender.sent()[0].id, id);
    /// assert_eq!(sender.sent()[0].payload_str(), Some(r#"{"id":7}"#));
    /// # Ok(()) }
    /// ```
    pub fn deliver_pending<S: ClaimStore + ?Sized>(
        store: &S,
        config: &Config,
        sender: &mut dyn Sender,
    ) -> Result<Delivery> {
        check_claim_modes(store, config)?;
        let delete_acked = config.maintenance.processed_ttl.is_zero();
        // what the database has inserted so far: the claims take no later
        // event, whatever the publishers' clocks say; a store without a mark
        // stops by ids (UUIDv7: an event published from now on has a greater
        // one, on this host's clock)
        let upto = store.insert_mark()?;
        let began = EventId::new();
        let leased = Leased::default();
        let mut delivery = Delivery::default();
        for (event_type, s) in config.events() {
            let mut pipeline =
                Pipeline::new(event_type, s.clone(), delete_acked, config.observer.clone())
                    .upto(upto);
            let mut run = Run {
                store,
                sender: &mut *sender,
                leased: &leased,
                relay: None,
            };
            loop {
                let polled = match pipeline.step(&mut run) {
                    Ok(polled) => polled,
                    Err(e) => {
                        // the batches still with the sender are waited for
                        // and finished: none is left to a later call's waits
                        let _ = pipeline.finish_all(&mut run);
                        return Err(e);
                    }
                };
                // nothing due (a claim after a backlog's last id that finds
                // nothing scans again from the lowest); a transport failure: the broker is away, and
                // the released events are due at once: claiming them again
                // would loop; a batch of only new events: what was due at the
                // call is out
                let only_new = upto.is_none() && polled.lowest.is_some_and(|id| id > began);
                let nothing_due = polled.claimed == 0 && polled.scanned;
                if nothing_due || polled.released > 0 || only_new {
                    pipeline.finish_all(&mut run)?;
                    break;
                }
            }
            if pipeline.delivered != TypeDelivery::default() {
                delivery
                    .by_type
                    .insert(event_type.to_string(), pipeline.delivered);
            }
        }
        Ok(delivery)
    }
}
