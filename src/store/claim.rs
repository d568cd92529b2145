//! What a claim takes and what a held claim gives back: the arguments a
//! [`ClaimStore`](super::ClaimStore) is called with, and the events with the transaction that
//! holds them.

use std::time::Duration;

use super::HeldBatch;
use crate::event::{Event, EventId};

/// What a claim takes: the arguments of [`ClaimStore::claim_after`](super::ClaimStore::claim_after),
/// [`ClaimStore::claim_held`](super::ClaimStore::claim_held) and
/// [`HeldBatch::finish_and_claim`].
///
/// Built with [`ClaimArgs::new`] and the setters (`#[non_exhaustive]`: a
/// field added later breaks no caller); its fields are there to read.
///
/// ```
/// # use std::time::Duration;
/// let args = txbox::store::ClaimArgs::new("order-events", 100, Duration::from_secs(60))
///     .ordered(txbox::OnPoison::Block)
///     .from_key("order-7");
/// assert_eq!(args.from_key, Some("order-7"));
/// ```
#[derive(Debug, Clone, Copy)]
#[non_exhaustive]
pub struct ClaimArgs<'a> {
    /// The event type.
    pub event_type: &'a str,
    /// Claim only ids greater than this (a backlog's last id).
    pub after: Option<EventId>,
    /// At most this many events.
    pub limit: usize,
    /// The lease of the claimed rows, or (held claims) how long the transaction
    /// may idle before the database ends it.
    pub lease: Duration,
    /// Held claims: delete the rows in the claim (`processed_ttl` zero).
    pub delete_acked: bool,
    /// `Some`: the type is ordered by key ([`EventOrder::Key`](crate::EventOrder::Key)),
    /// with this poison policy: only events with no earlier event of their key
    /// still waiting are claimed, so at most one event per key at a time.
    pub ordered: Option<crate::OnPoison>,
    /// Ordered types: where the claim's key walk starts (in the database's
    /// order of keys), so that a relay serves every key in turn: the poller
    /// passes the last key of its previous batch when that batch was full,
    /// else none. `None`: from the first key.
    pub from_key: Option<&'a str>,
    /// Only events the database numbered up to this mark at insert
    /// ([`ClaimStore::insert_mark`](super::ClaimStore::insert_mark)): [`Relay::deliver_pending`](crate::Relay::deliver_pending)
    /// sends what was there when it was called, whatever the publishers'
    /// clocks say. `None`: no bound.
    pub upto: Option<i64>,
}

impl<'a> ClaimArgs<'a> {
    /// Up to `limit` events of `event_type` from the lowest id, held for at most
    /// `lease`, acked rows kept.
    pub fn new(event_type: &'a str, limit: usize, lease: Duration) -> Self {
        ClaimArgs {
            event_type,
            after: None,
            limit,
            lease,
            delete_acked: false,
            ordered: None,
            from_key: None,
            upto: None,
        }
    }

    /// Only ids greater than `after` (a backlog's last id).
    #[must_use]
    pub fn after(mut self, after: impl Into<Option<EventId>>) -> Self {
        self.after = after.into();
        self
    }

    /// At most `limit` events.
    #[must_use]
    pub fn limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// The lease (or a held claim's idle limit).
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Held claims: delete the rows in the claim.
    #[must_use]
    pub fn delete_acked(mut self, delete_acked: bool) -> Self {
        self.delete_acked = delete_acked;
        self
    }

    /// Ordered by key, with this poison policy (`None`: unordered).
    #[must_use]
    pub fn ordered(mut self, on_poison: impl Into<Option<crate::OnPoison>>) -> Self {
        self.ordered = on_poison.into();
        self
    }

    /// Ordered types: the key walk starts after this key.
    #[must_use]
    pub fn from_key(mut self, key: impl Into<Option<&'a str>>) -> Self {
        self.from_key = key.into();
        self
    }

    /// Only events numbered up to this insert mark.
    #[must_use]
    pub fn upto(mut self, mark: impl Into<Option<i64>>) -> Self {
        self.upto = mark.into();
        self
    }
}

/// What [`ClaimStore::claim_held`](super::ClaimStore::claim_held) returns: the events, sorted by id, and the
/// transaction that holds them (none when nothing was claimed).
///
/// ```
/// let nothing = txbox::store::HeldClaim::none();
/// assert!(nothing.events.is_empty() && nothing.batch.is_none());
/// ```
#[non_exhaustive]
pub struct HeldClaim {
    /// The events claimed, sorted by id.
    pub events: Vec<Event>,
    /// The open transaction that holds their rows; `None` when nothing was
    /// claimed.
    pub batch: Option<Box<dyn HeldBatch>>,
}

impl HeldClaim {
    /// `events`, held by `batch`.
    pub fn new(events: Vec<Event>, batch: Option<Box<dyn HeldBatch>>) -> Self {
        HeldClaim { events, batch }
    }

    /// Nothing claimed, nothing held.
    pub fn none() -> Self {
        HeldClaim::new(Vec::new(), None)
    }

    /// The events and the transaction that holds them.
    pub fn into_parts(self) -> (Vec<Event>, Option<Box<dyn HeldBatch>>) {
        (self.events, self.batch)
    }
}

impl std::fmt::Debug for HeldClaim {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldClaim")
            .field("events", &self.events.len())
            .field("held", &self.batch.is_some())
            .finish()
    }
}
