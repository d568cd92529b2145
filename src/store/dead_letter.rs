//! The rows of the dead-letter table, as the store returns them and the admin
//! API ([`crate::Dlq`]) shows them.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use crate::error::{Error, Result};
use crate::event::EventId;

/// Status of a dead letter.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DlqStatus {
    /// Waiting for an operator.
    Dead,
    /// Marked for retry; the relay's DLQ retry thread moves it back to the outbox.
    Retry,
    /// Handled by an operator; deleted after the resolved TTL.
    Resolved,
}

impl DlqStatus {
    /// The name stored in the database.
    pub fn as_str(&self) -> &'static str {
        match self {
            DlqStatus::Dead => "DEAD",
            DlqStatus::Retry => "RETRY",
            DlqStatus::Resolved => "RESOLVED",
        }
    }
}

impl fmt::Display for DlqStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for DlqStatus {
    type Err = Error;
    fn from_str(s: &str) -> Result<Self> {
        match s.to_ascii_uppercase().as_str() {
            "DEAD" => Ok(DlqStatus::Dead),
            "RETRY" => Ok(DlqStatus::Retry),
            "RESOLVED" => Ok(DlqStatus::Resolved),
            _ => Err(Error::InvalidInput(format!(
                "unknown dead-letter status {s:?}: expected DEAD, RETRY or RESOLVED"
            ))),
        }
    }
}

/// A dead-lettered event.
///
/// Serialized (the HTTP admin's JSON) with `payload` as text for a JSON event
/// and as standard base64 for one published as bytes (`content_type` not null).
#[derive(Debug, Clone, PartialEq)]
pub struct DeadLetter {
    /// The event id.
    pub id: EventId,
    /// The event type.
    pub event_type: String,
    /// The key, if any.
    pub key: Option<String>,
    /// The user's headers.
    pub headers: BTreeMap<String, String>,
    /// The payload as published: JSON text, or the bytes of an event published
    /// as bytes.
    pub payload: Vec<u8>,
    /// The content type of an event published as bytes; `None` for JSON.
    pub content_type: Option<String>,
    /// Failed send attempts.
    pub attempts: u32,
    /// Why the last send failed.
    pub last_error: Option<String>,
    /// Its status.
    pub status: DlqStatus,
    /// When it was published, as RFC 3339 text from the database clock.
    pub created_at: String,
    /// When it became a dead letter (RFC 3339).
    pub moved_at: String,
}

impl DeadLetter {
    /// The payload as text, when it is UTF-8 (always for a JSON event).
    pub fn payload_str(&self) -> Option<&str> {
        std::str::from_utf8(&self.payload).ok()
    }

    /// The payload as text to show: a JSON event's JSON, or the bytes of one
    /// published as bytes in standard base64 (as the HTTP admin's JSON has it).
    pub fn payload_text(&self) -> std::borrow::Cow<'_, str> {
        use base64::Engine as _;
        match (&self.content_type, self.payload_str()) {
            (None, Some(json)) => json.into(),
            _ => base64::engine::general_purpose::STANDARD
                .encode(&self.payload)
                .into(),
        }
    }
}

impl serde::Serialize for DeadLetter {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = s.serialize_struct("DeadLetter", 11)?;
        st.serialize_field("id", &self.id)?;
        st.serialize_field("event_type", &self.event_type)?;
        st.serialize_field("key", &self.key)?;
        st.serialize_field("headers", &self.headers)?;
        st.serialize_field("payload", &self.payload_text())?;
        st.serialize_field("content_type", &self.content_type)?;
        st.serialize_field("attempts", &self.attempts)?;
        st.serialize_field("last_error", &self.last_error)?;
        st.serialize_field("status", &self.status)?;
        st.serialize_field("created_at", &self.created_at)?;
        st.serialize_field("moved_at", &self.moved_at)?;
        st.end()
    }
}

/// Filters and paging for [`Dlq::list`](crate::Dlq::list): the default (every
/// type and status, the first 50) narrowed by its setters.
///
/// ```
/// use txbox::{DlqFilter, DlqStatus};
/// let filter = DlqFilter::default()
///     .event_type("order-created")
///     .status(DlqStatus::Dead)
///     .offset(50)
///     .limit(50);
/// assert_eq!(filter.event_type.as_deref(), Some("order-created"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct DlqFilter {
    /// Only this event type.
    pub event_type: Option<String>,
    /// Only this status.
    pub status: Option<DlqStatus>,
    /// Rows to skip (ordered by moved-at, then id).
    pub offset: u64,
    /// Rows to return at most (default 50, capped at 1000).
    pub limit: u64,
}

impl DlqFilter {
    /// Only events of `event_type`.
    #[must_use]
    pub fn event_type(mut self, event_type: impl Into<String>) -> Self {
        self.event_type = Some(event_type.into());
        self
    }

    /// Only dead letters in `status`.
    #[must_use]
    pub fn status(mut self, status: DlqStatus) -> Self {
        self.status = Some(status);
        self
    }

    /// Skips the first `offset` rows.
    #[must_use]
    pub fn offset(mut self, offset: u64) -> Self {
        self.offset = offset;
        self
    }

    /// Returns at most `limit` rows (capped at 1000).
    #[must_use]
    pub fn limit(mut self, limit: u64) -> Self {
        self.limit = limit;
        self
    }
}

impl Default for DlqFilter {
    fn default() -> Self {
        DlqFilter {
            event_type: None,
            status: None,
            offset: 0,
            limit: 50,
        }
    }
}

/// A key of an ordered type ([`EventOrder::Key`](crate::EventOrder::Key) with
/// [`OnPoison::Block`](crate::OnPoison::Block)) whose later events wait: see
/// [`Dlq::blocked_keys`](crate::Dlq::blocked_keys).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BlockedKey {
    /// The event type.
    pub event_type: String,
    /// The key.
    pub key: String,
    /// The event that holds the key back: the key's earliest dead letter
    /// waiting for an operator, or its earliest FAILED outbox event (not moved
    /// to the dead letters yet).
    pub blocked_by: EventId,
    /// `DEAD` or `RETRY` (a dead letter), or `FAILED` (an outbox event).
    pub status: String,
    /// The key's pending events behind it.
    pub waiting: u64,
}
