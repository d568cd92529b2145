//! Event ids: UUIDv7, ordered by creation time. A module of its own, below the
//! error type that names them.

use std::fmt;
use std::str::FromStr;

use uuid::Uuid;

/// The id of an event: a UUIDv7, so ids are ordered by creation time.
///
/// ```
/// let id = txbox::EventId::new();
/// let parsed: txbox::EventId = id.to_string().parse().unwrap();
/// assert_eq!(id, parsed);
/// ```
#[derive(
    Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, serde::Deserialize,
)]
#[serde(transparent)]
pub struct EventId(Uuid);

impl EventId {
    /// A new time-ordered id (UUIDv7).
    pub fn new() -> Self {
        EventId(Uuid::now_v7())
    }

    /// Wraps an existing UUID.
    pub fn from_uuid(uuid: Uuid) -> Self {
        EventId(uuid)
    }

    /// The UUID inside.
    pub fn as_uuid(&self) -> Uuid {
        self.0
    }
}

impl Default for EventId {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Display for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.hyphenated().fmt(f)
    }
}

impl fmt::Debug for EventId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EventId({})", self.0.hyphenated())
    }
}

impl FromStr for EventId {
    type Err = ParseEventIdError;
    fn from_str(s: &str) -> Result<Self, ParseEventIdError> {
        Uuid::parse_str(s.trim())
            .map(EventId)
            .map_err(|e| ParseEventIdError {
                input: s.to_owned(),
                reason: e.to_string(),
            })
    }
}

/// A text that is not an event id. It converts into [`crate::Error::InvalidInput`]
/// with the same message, so `?` works in functions returning `txbox::Result`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseEventIdError {
    input: String,
    reason: String,
}

impl fmt::Display for ParseEventIdError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:?} is not an event id (a UUID): {}",
            self.input, self.reason
        )
    }
}

impl std::error::Error for ParseEventIdError {}

impl From<Uuid> for EventId {
    fn from(u: Uuid) -> Self {
        EventId(u)
    }
}
