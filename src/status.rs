//! What the outbox holds per event type, as the store counts it and the
//! metrics, the admin endpoint and the CLI show it.

use std::time::Duration;

/// Counts of outbox rows of one event type by status.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct TypeStatus {
    /// The event type.
    pub event_type: String,
    /// Rows waiting to be sent (including those waiting for a retry).
    pub pending: u64,
    /// Rows claimed under a lease by a relay right now (rows of a held claim,
    /// [`ClaimMode::Lock`](crate::ClaimMode::Lock), stay PENDING and count there).
    pub in_process: u64,
    /// Rows that used up their retries and wait for the move to the dead letters.
    pub failed: u64,
    /// Age of the oldest pending row: the relay's lag.
    pub oldest_pending_age: Option<Duration>,
}
