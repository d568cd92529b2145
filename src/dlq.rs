//! Dead letters: events that used up their retries, and the admin API over them.
//!
//! An event whose sends failed `max_retries + 1` times becomes FAILED; the relay's
//! move thread (DLQ enabled) moves it here in one transaction. An operator then
//! [`retry`](Dlq::retry)s it (the retry thread moves it back to the outbox as PENDING
//! with a fresh retry budget), [`resolve`](Dlq::resolve)s it (kept until the
//! resolved TTL, then cleaned up) or [`delete`](Dlq::delete)s it.

use std::sync::Arc;

use crate::error::{Error, Result};
use crate::event::EventId;
use crate::store::DeadLetterStore;
use crate::store::{BlockedKey, DeadLetter, DlqFilter, DlqStatus};

/// The dead-letter admin API.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// # let store = std::sync::Arc::new(txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", &txbox::Config::builder().build()?)?);
/// let dlq = txbox::Dlq::new(store);
/// for dead in dlq.list(&txbox::DlqFilter::default())? {
///     println!("{} {} {:?}", dead.id, dead.event_type, dead.last_error);
///     dlq.retry(dead.id)?;
/// }
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Dlq {
    store: Arc<dyn DeadLetterStore>,
}

impl Dlq {
    /// Most ids one batch call accepts.
    pub const MAX_BATCH_IDS: usize = 1000;

    /// The API over a store.
    pub fn new(store: Arc<dyn DeadLetterStore>) -> Self {
        Dlq { store }
    }

    /// Dead letters matching the filter, ordered by moved-at then id.
    pub fn list(&self, filter: &DlqFilter) -> Result<Vec<DeadLetter>> {
        let mut f = filter.clone();
        f.limit = f.limit.clamp(1, Self::MAX_BATCH_IDS as u64);
        self.store.dlq_list(&f)
    }

    /// How many dead letters match the filter (paging ignored).
    pub fn count(&self, filter: &DlqFilter) -> Result<u64> {
        self.store.dlq_count(filter)
    }

    /// The keys of ordered types ([`EventOrder::Key`](crate::EventOrder::Key)
    /// with [`OnPoison::Block`](crate::OnPoison::Block) in `config`) whose later
    /// events wait, each with the event that holds it back and how many wait
    /// behind it; at most [`Dlq::MAX_BATCH_IDS`] keys per type. A key goes on
    /// when its event is sent by a retry ([`Dlq::retry`]), or its dead letter is
    /// resolved ([`Dlq::resolve`]) or deleted ([`Dlq::delete`]).
    ///
    /// ```no_run
    /// # fn main() -> txbox::Result<()> {
    /// let config = txbox::Config::from_toml(r#"
    ///     [events.order-events]
    ///     ordering = "key"
    /// "#)?;
    /// # let store = std::sync::Arc::new(txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", &config)?);
    /// let dlq = txbox::Dlq::new(store);
    /// for k in dlq.blocked_keys(&config)? {
    ///     println!("{} {}: {} wait behind {} ({})", k.event_type, k.key, k.waiting, k.blocked_by, k.status);
    /// }
    /// # Ok(()) }
    /// ```
    pub fn blocked_keys(&self, config: &crate::Config) -> Result<Vec<BlockedKey>> {
        let mut out = Vec::new();
        for (event_type, s) in config.events() {
            if s.ordering == crate::EventOrder::Key && s.on_poison == crate::OnPoison::Block {
                out.extend(self.blocked_keys_of(event_type)?);
            }
        }
        Ok(out)
    }

    /// [`Dlq::blocked_keys`] of one type, which the caller knows to be ordered
    /// with `on_poison = "block"` (what the CLI and the HTTP route ask, having
    /// no configuration of the types): the keys with a dead letter waiting for
    /// an operator or a FAILED event, at most [`Dlq::MAX_BATCH_IDS`].
    pub fn blocked_keys_of(&self, event_type: &str) -> Result<Vec<BlockedKey>> {
        self.store.blocked_keys(event_type, Self::MAX_BATCH_IDS)
    }

    /// One dead letter.
    pub fn get(&self, id: EventId) -> Result<DeadLetter> {
        self.store.dlq_get(id)?.ok_or(Error::NotFound(id))
    }

    /// Moves up to `limit` FAILED outbox events (retries used up) to the dead
    /// letters now, one transaction per [`Dlq::MAX_BATCH_IDS`]; returns how many
    /// moved (`usize::MAX`: all of them). The relay's DLQ
    /// thread does this on its own; with the DLQ off
    /// ([`ConfigBuilder::dlq`](crate::ConfigBuilder::dlq)`(|d| d.enabled(false))`) this is how an
    /// operator reaches FAILED events, to list, retry, resolve or delete them.
    ///
    /// ```no_run
    /// # fn main() -> txbox::Result<()> {
    /// # let store: std::sync::Arc<dyn txbox::FullStore> = std::sync::Arc::new(txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", &txbox::Config::builder().build()?)?);
    /// let moved = txbox::Dlq::new(store).move_failed(1000)?;
    /// println!("{moved} failed events are now dead letters");
    /// # Ok(()) }
    /// ```
    pub fn move_failed(&self, limit: usize) -> Result<u64> {
        let mut total = 0;
        while (total as usize) < limit {
            let batch = (limit - total as usize).min(Self::MAX_BATCH_IDS);
            let n = self.store.move_failed_to_dlq(batch)?;
            total += n;
            if (n as usize) < batch {
                break;
            }
        }
        Ok(total)
    }

    /// Marks a dead letter for retry: it goes back to the outbox as PENDING with a
    /// fresh retry budget, through the relay's DLQ retry thread.
    pub fn retry(&self, id: EventId) -> Result<()> {
        self.one(
            id,
            &[DlqStatus::Dead, DlqStatus::Resolved],
            DlqStatus::Retry,
        )
    }

    /// Marks a dead letter resolved; it is deleted after the resolved TTL.
    pub fn resolve(&self, id: EventId) -> Result<()> {
        self.one(id, &[DlqStatus::Dead], DlqStatus::Resolved)
    }

    /// Deletes a dead letter for good (not one marked for retry: it may be on its way
    /// back to the outbox).
    pub fn delete(&self, id: EventId) -> Result<()> {
        const FROM: &[DlqStatus] = &[DlqStatus::Dead, DlqStatus::Resolved];
        if self.store.dlq_delete(&[id], FROM)?.is_empty() {
            return Err(self.refusal(id, "delete", FROM)?);
        }
        Ok(())
    }

    /// Deletes many; returns the ids deleted.
    pub fn delete_many(&self, ids: &[EventId]) -> Result<Vec<EventId>> {
        check_batch(ids)?;
        self.store
            .dlq_delete(ids, &[DlqStatus::Dead, DlqStatus::Resolved])
    }

    /// Marks every dead letter of `event_type` (DEAD or RESOLVED) for retry; returns how many.
    pub fn retry_type(&self, event_type: &str) -> Result<u64> {
        self.by_type(event_type, &[DlqStatus::Dead, DlqStatus::Resolved], |ids| {
            self.retry_many(ids)
        })
    }

    /// Resolves every DEAD dead letter of `event_type`; returns how many.
    pub fn resolve_type(&self, event_type: &str) -> Result<u64> {
        self.by_type(event_type, &[DlqStatus::Dead], |ids| self.resolve_many(ids))
    }

    /// Deletes every DEAD or RESOLVED dead letter of `event_type`; returns how many.
    pub fn delete_type(&self, event_type: &str) -> Result<u64> {
        self.by_type(event_type, &[DlqStatus::Dead, DlqStatus::Resolved], |ids| {
            self.delete_many(ids)
        })
    }

    /// Applies `f` to the ids of `event_type` in `statuses`, a page at a time.
    fn by_type(
        &self,
        event_type: &str,
        statuses: &[DlqStatus],
        f: impl Fn(&[EventId]) -> Result<Vec<EventId>>,
    ) -> Result<u64> {
        let mut total = 0;
        for status in statuses {
            let filter = DlqFilter {
                event_type: Some(event_type.to_string()),
                status: Some(*status),
                offset: 0,
                limit: Self::MAX_BATCH_IDS as u64,
            };
            loop {
                let ids: Vec<EventId> =
                    self.store.dlq_list(&filter)?.iter().map(|d| d.id).collect();
                if ids.is_empty() {
                    break;
                }
                let done = f(&ids)?;
                total += done.len() as u64;
                if done.is_empty() {
                    break; // the rest is held by another instance
                }
            }
        }
        Ok(total)
    }

    /// Marks many for retry; returns the ids changed (others were absent or refused).
    pub fn retry_many(&self, ids: &[EventId]) -> Result<Vec<EventId>> {
        check_batch(ids)?;
        self.store.dlq_set_status(
            ids,
            &[DlqStatus::Dead, DlqStatus::Resolved],
            DlqStatus::Retry,
        )
    }

    /// Resolves many; returns the ids changed.
    pub fn resolve_many(&self, ids: &[EventId]) -> Result<Vec<EventId>> {
        check_batch(ids)?;
        self.store
            .dlq_set_status(ids, &[DlqStatus::Dead], DlqStatus::Resolved)
    }

    fn one(&self, id: EventId, from: &[DlqStatus], to: DlqStatus) -> Result<()> {
        if self.store.dlq_set_status(&[id], from, to)?.is_empty() {
            return Err(self.refusal(id, &format!("mark {to}"), from)?);
        }
        Ok(())
    }

    /// Why a change did not happen: absent, held by another instance, or a status
    /// that does not allow it.
    fn refusal(&self, id: EventId, action: &str, from: &[DlqStatus]) -> Result<Error> {
        Ok(match self.store.dlq_get(id)? {
            None => Error::NotFound(id),
            Some(d) if from.contains(&d.status) => Error::InvalidTransition {
                id,
                message: format!(
                    "cannot {action}: another instance holds this dead letter right now; try again"
                ),
            },
            Some(d) => Error::InvalidTransition {
                id,
                message: format!("cannot {action} a dead letter in status {}", d.status),
            },
        })
    }
}

fn check_batch(ids: &[EventId]) -> Result<()> {
    if ids.len() > Dlq::MAX_BATCH_IDS {
        return Err(Error::InvalidInput(format!(
            "{} ids given, at most {} per call",
            ids.len(),
            Dlq::MAX_BATCH_IDS
        )));
    }
    Ok(())
}
