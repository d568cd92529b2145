//! An outbox in memory, for unit tests of the relay's delivery logic (the
//! pipeline's claims, outcomes and finishes) without a database. It keeps the
//! claim contract of the SQL stores: a claim takes due PENDING events of one
//! type in id order and stamps them IN_PROCESS under its token; a finish
//! applies only to rows that token still holds; an ordered claim takes a key's
//! event only when no earlier event of that key waits. It has no held claims,
//! no notifications and no leases that expire (nothing recovers its rows).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{ClaimArgs, ClaimStore, HeldClaim, Notifications, Outcome, Store};
use crate::error::{Error, Result};
use crate::event::{Event, EventId};
use crate::OnPoison;

/// Where a row stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Status {
    Pending,
    InProcess,
    Processed,
    Failed,
}

/// One outbox row.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) event: Event,
    pub(crate) status: Status,
    pub(crate) due: Instant,
    pub(crate) token: Option<Uuid>,
    pub(crate) last_error: Option<String>,
}

/// The outbox table, in id order.
#[derive(Default)]
pub(crate) struct MemoryStore {
    rows: Mutex<Vec<Row>>,
}

impl MemoryStore {
    /// Inserts `n` events of `event_type` with `key`, payload `i` each; their ids.
    pub(crate) fn publish(&self, event_type: &str, key: Option<&str>, n: usize) -> Vec<EventId> {
        let mut rows = self.rows.lock().unwrap();
        (0..n)
            .map(|i| {
                let id = EventId::new();
                rows.push(Row {
                    event: Event {
                        id,
                        event_type: event_type.into(),
                        destination: String::new(),
                        key: key.map(str::to_owned),
                        headers: Default::default(),
                        payload: i.to_string().into_bytes(),
                        content_type: None,
                        attempts: 0,
                    },
                    status: Status::Pending,
                    due: Instant::now(),
                    token: None,
                    last_error: None,
                });
                id
            })
            .collect()
    }

    /// The row of `id`.
    pub(crate) fn row(&self, id: EventId) -> Row {
        let rows = self.rows.lock().unwrap();
        rows.iter()
            .find(|r| r.event.id == id)
            .cloned()
            .expect("no such row")
    }

    /// Marks the row of `id` as one the store cannot read as an event
    /// ([`HEADER_DEFECT`](crate::store::HEADER_DEFECT)).
    pub(crate) fn mark_defective(&self, id: EventId, why: &str) {
        let mut rows = self.rows.lock().unwrap();
        for r in rows.iter_mut().filter(|r| r.event.id == id) {
            let h = crate::store::HEADER_DEFECT.to_owned();
            r.event.headers.insert(h, why.to_owned());
        }
    }

    /// Makes the row of `id` due now (its backoff over).
    pub(crate) fn make_due(&self, id: EventId) {
        let mut rows = self.rows.lock().unwrap();
        for r in rows.iter_mut().filter(|r| r.event.id == id) {
            r.due = Instant::now();
        }
    }

    /// How many rows have `status`.
    pub(crate) fn count(&self, status: Status) -> usize {
        let rows = self.rows.lock().unwrap();
        rows.iter().filter(|r| r.status == status).count()
    }
}

impl Store for MemoryStore {
    fn migrate(&self) -> Result<()> {
        Ok(())
    }
    fn ping(&self) -> Result<()> {
        Ok(())
    }
    fn table_prefix(&self) -> &str {
        ""
    }
    fn try_lock(&self, _: &str, _: Uuid, _: Duration) -> Result<bool> {
        Ok(true)
    }
    fn unlock(&self, _: &str, _: Uuid) -> Result<()> {
        Ok(())
    }
}

impl ClaimStore for MemoryStore {
    fn claim_after(&self, args: &ClaimArgs<'_>, token: Uuid) -> Result<Vec<Event>> {
        let mut rows = self.rows.lock().unwrap();
        let now = Instant::now();
        // an ordered key is taken while no earlier event of it waits (FAILED
        // ones too when the key blocks behind its poison)
        let waits = |r: &Row, on_poison: OnPoison| match r.status {
            Status::Pending | Status::InProcess => true,
            Status::Failed => on_poison == OnPoison::Block,
            Status::Processed => false,
        };
        let mut taken = Vec::new();
        for i in 0..rows.len() {
            if taken.len() >= args.limit {
                break;
            }
            let r = &rows[i];
            let candidate = r.event.event_type == args.event_type
                && r.status == Status::Pending
                && r.due <= now
                && args.after.is_none_or(|after| r.event.id > after);
            if !candidate {
                continue;
            }
            if let (Some(on_poison), Some(key)) = (args.ordered, &r.event.key) {
                let behind = rows[..i].iter().any(|e| {
                    e.event.event_type == args.event_type
                        && e.event.key.as_ref() == Some(key)
                        && waits(e, on_poison)
                });
                if behind {
                    continue;
                }
            }
            taken.push(i);
        }
        Ok(taken
            .into_iter()
            .map(|i| {
                let r = &mut rows[i];
                r.status = Status::InProcess;
                r.token = Some(token);
                r.event.clone()
            })
            .collect())
    }

    fn finish(&self, token: Uuid, outcomes: &[(EventId, Outcome)]) -> Result<u64> {
        let mut rows = self.rows.lock().unwrap();
        let mut done = 0;
        for (id, outcome) in outcomes {
            let Some(i) = rows
                .iter()
                .position(|r| r.event.id == *id && r.token == Some(token))
            else {
                continue;
            };
            done += 1;
            let r = &mut rows[i];
            r.token = None;
            match outcome {
                Outcome::Sent => r.status = Status::Processed,
                Outcome::SentDelete => {
                    rows.remove(i);
                }
                Outcome::Retry { delay, error } => {
                    r.status = Status::Pending;
                    r.due = Instant::now() + *delay;
                    r.event.attempts += 1;
                    r.last_error = Some(error.clone());
                }
                Outcome::Failed { error } => {
                    r.status = Status::Failed;
                    r.event.attempts += 1;
                    r.last_error = Some(error.clone());
                }
                Outcome::Release { error } => {
                    r.status = Status::Pending;
                    r.last_error = Some(error.clone());
                }
            }
        }
        Ok(done)
    }

    fn capabilities(&self) -> crate::store::Capabilities {
        crate::store::Capabilities::default()
    }

    fn max_connections(&self) -> Option<usize> {
        None
    }

    fn next_due(&self, event_type: &str) -> Result<Option<Duration>> {
        let rows = self.rows.lock().unwrap();
        Ok(rows
            .iter()
            .filter(|r| r.status == Status::Pending && r.event.event_type == event_type)
            .map(|r| r.due.saturating_duration_since(Instant::now()))
            .min())
    }

    fn claim_held(&self, _: &ClaimArgs<'_>) -> Result<HeldClaim> {
        Err(Error::Unsupported {
            what: "claim mode \"lock\"".into(),
            why: "the memory store holds no claims open".into(),
        })
    }

    fn listen(&self) -> Result<Box<dyn Notifications>> {
        Err(Error::Unsupported {
            what: "commit notifications".into(),
            why: "the memory store has none".into(),
        })
    }
}
