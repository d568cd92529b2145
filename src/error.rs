//! The one error type of txbox.

use crate::id::{EventId, ParseEventIdError};

/// Everything that can go wrong in txbox.
///
/// Each variant names what was wrong, so the message alone tells an operator where
/// to look. Match on the variant to react in code.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// `publish` was called with an event type that the configuration does not know.
    #[error("unknown event type {0:?}: add it to the configuration's `events`")]
    UnknownEventType(String),

    /// A configuration value is wrong. `path` is its key path, e.g.
    /// `events.order-created.polling.multiplier`.
    #[error("{path} {message}")]
    Config {
        /// The key path of the wrong value.
        path: String,
        /// What is wrong with it.
        message: String,
    },

    /// The TOML configuration could not be parsed: the source says where and
    /// what (`line 3, column 7: ...`), and quotes no text of the file (the
    /// parser's own error quotes the line and holds the whole input).
    #[error("configuration file: {0}")]
    ConfigSyntax(#[source] Cause),

    /// A table prefix (or another name spliced into SQL) is not a plain identifier.
    #[error("invalid {what} {value:?}: use ASCII letters, digits and `_`, starting with a letter or `_`, at most {max} characters")]
    InvalidIdentifier {
        /// What the name is for.
        what: &'static str,
        /// The rejected value.
        value: String,
        /// The longest accepted length.
        max: usize,
    },

    /// An argument of a call that txbox refuses (a consumer name, a batch of
    /// ids too large, a query parameter of the admin endpoint), with the
    /// reason.
    #[error("invalid input: {0}")]
    InvalidInput(String),

    /// `publish` refused an event that cannot be stored as it is: a key,
    /// header or content type out of bounds (the payload has its own
    /// [`Error::PayloadTooLarge`], the type [`Error::UnknownEventType`]).
    #[error("event refused: {0}")]
    InvalidEvent(String),

    /// A call txbox cannot serve as it was made (a connection with
    /// autocommit on, an outcome for an event that is not in the batch, a
    /// method that needs a store the value was built without): a mistake in
    /// the calling code.
    #[error("misuse: {0}")]
    Misuse(String),

    /// Something txbox's own code should never let happen: a bug, to report.
    #[error("internal error (a bug in txbox): {0}")]
    Internal(String),

    /// The payload of an event could not be serialized to JSON.
    #[error("payload of event type {event_type:?} cannot be serialized: {source}")]
    Serialize {
        /// The event type being published.
        event_type: String,
        /// The serializer's error.
        source: serde_json::Error,
    },

    /// A received message's payload is not the JSON its handler asked for
    /// ([`ReceivedEvent::json`](crate::ReceivedEvent::json)).
    #[error("payload at {position} cannot be deserialized: {source}")]
    Deserialize {
        /// Where the message was read (topic, partition and offset; queue
        /// and delivery tag).
        position: String,
        /// The deserializer's error.
        source: serde_json::Error,
    },

    /// The serialized payload is larger than `max_payload_bytes`.
    #[error(
        "payload of event type {event_type:?} is {size} bytes, more than max_payload_bytes = {max}"
    )]
    PayloadTooLarge {
        /// The event type being published.
        event_type: String,
        /// The payload's size in bytes.
        size: usize,
        /// The configured limit.
        max: usize,
    },

    /// The database returned an error or could not be reached. `kind` says
    /// whether the same call may succeed if tried again.
    #[error("database: {source}")]
    Database {
        /// What kind of failure it is.
        kind: DatabaseErrorKind,
        /// The driver's error.
        source: Box<dyn std::error::Error + Send + Sync>,
    },

    /// Something this build or this store cannot do: a Cargo feature left out,
    /// or a mode the database does not offer.
    #[error("{what} is not supported: {why}")]
    Unsupported {
        /// What was asked for.
        what: String,
        /// Why it cannot be done, and what to do instead.
        why: String,
    },

    /// A connection to a database, broker or cache could not be opened: the
    /// host refused or did not answer, TLS failed (a certificate that does not
    /// verify, a server without TLS where TLS is required), the login was refused.
    #[error("connecting to {to}: {reason}")]
    Connect {
        /// What was connected to: the service and its host and port.
        to: String,
        /// Why it failed, as the driver or the TLS library said.
        reason: String,
        /// The driver's error, where it has one whose text holds no secret
        /// (RabbitMQ's name the URL, password included: none).
        #[source]
        source: Option<Cause>,
    },

    /// A connection could not be taken from the pool in time: the pool's
    /// error is the source.
    #[error("database pool: {0}")]
    Pool(#[source] Cause),

    /// A received message has no valid `txbox-event-id` header.
    #[error("message at {0} has no valid txbox-event-id header")]
    MissingEventId(String),

    /// A broker (Kafka, RabbitMQ) returned an error or could not be reached.
    #[error("broker: {message}")]
    Broker {
        /// What failed, the client's error included.
        message: String,
        /// The client's error (`rdkafka::error::KafkaError` for Kafka), where
        /// there is one whose text holds no secret: amiquip's name the URL,
        /// password included, and librdkafka's may quote a refused
        /// property's value, so those are in the message only, redacted.
        #[source]
        source: Option<Cause>,
    },

    /// The inbox's cache (Redis) returned an error or could not be reached.
    #[error("cache: {message}")]
    Cache {
        /// What failed, the client's error included.
        message: String,
        /// The client's error (`redis::RedisError`), when there is one.
        #[source]
        source: Option<Cause>,
    },

    /// A consumer loop stopped because a handler asked it to.
    #[error("consumer stopped: {0}")]
    ConsumerStopped(String),

    /// No row with this id.
    #[error("event {0} not found")]
    NotFound(EventId),

    /// A status change that is not allowed (e.g. resolving a row that is being retried).
    #[error("event {id}: {message}")]
    InvalidTransition {
        /// The event.
        id: EventId,
        /// Why the change is refused.
        message: String,
    },

    /// `Relay::shutdown` ran out of time with threads still running.
    #[error("shutdown deadline passed with {0} relay thread(s) still running")]
    ShutdownTimeout(usize),

    /// An I/O error (e.g. reading a configuration file).
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The I/O error.
        source: std::io::Error,
    },
}

/// What kind of database failure an [`Error::Database`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum DatabaseErrorKind {
    /// The same call may succeed if tried again: a deadlock, a lock wait timeout.
    Retryable,
    /// A unique key refused the row (the inbox takes it as a duplicate).
    UniqueViolation,
    /// Anything else: a lost connection, a statement the database refused.
    Other,
}

/// A library's error kept as the source of a txbox [`Error`]
/// ([`std::error::Error::source`]): downcast it to the library's type to read
/// its codes.
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

impl Error {
    /// [`Error::Broker`] with no source.
    pub(crate) fn broker(message: impl Into<String>) -> Self {
        Error::Broker {
            message: message.into(),
            source: None,
        }
    }

    /// [`Error::Broker`] caused by `source`, whose text ends the message.
    pub(crate) fn broker_from(
        what: impl std::fmt::Display,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Error::Broker {
            message: format!("{what}: {source}"),
            source: Some(Box::new(source)),
        }
    }

    /// [`Error::Cache`] with no source.
    #[cfg_attr(not(feature = "redis"), allow(dead_code))]
    pub(crate) fn cache(message: impl Into<String>) -> Self {
        Error::Cache {
            message: message.into(),
            source: None,
        }
    }

    pub(crate) fn config(path: impl Into<String>, message: impl Into<String>) -> Self {
        Error::Config {
            path: path.into(),
            message: message.into(),
        }
    }

    /// A database error of `kind`.
    #[cfg_attr(not(feature = "_sql"), allow(dead_code))]
    pub(crate) fn database(
        kind: DatabaseErrorKind,
        source: impl Into<Box<dyn std::error::Error + Send + Sync>>,
    ) -> Self {
        Error::Database {
            kind,
            source: source.into(),
        }
    }

    /// Whether the same call may succeed if tried again (a database deadlock,
    /// a lock wait timeout, a prepared statement the connection forgot: roll
    /// the transaction back and run it again).
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            Error::Database {
                kind: DatabaseErrorKind::Retryable,
                ..
            }
        )
    }
}

/// A `postgres` error whose message includes the server's text, not just "db error".
#[cfg(feature = "postgres")]
#[derive(Debug)]
pub(crate) struct PgError(pub(crate) postgres::Error);

#[cfg(feature = "postgres")]
impl std::fmt::Display for PgError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0.as_db_error() {
            Some(db) => write!(
                f,
                "{} ({}): {}",
                db.severity(),
                db.code().code(),
                db.message()
            ),
            None => match std::error::Error::source(&self.0) {
                Some(src) => write!(f, "{}: {src}", self.0),
                None => write!(f, "{}", self.0),
            },
        }
    }
}

#[cfg(feature = "postgres")]
impl std::error::Error for PgError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

#[cfg(feature = "postgres")]
impl From<postgres::Error> for Error {
    /// Sorted by SQLSTATE: a deadlock, a serialization failure or a lock that
    /// could not be had is [`DatabaseErrorKind::Retryable`], a duplicate key
    /// [`DatabaseErrorKind::UniqueViolation`].
    fn from(e: postgres::Error) -> Self {
        use postgres::error::SqlState;
        let kind = match e.code() {
            Some(c)
                if *c == SqlState::T_R_DEADLOCK_DETECTED
                    || *c == SqlState::T_R_SERIALIZATION_FAILURE
                    || *c == SqlState::LOCK_NOT_AVAILABLE =>
            {
                DatabaseErrorKind::Retryable
            }
            Some(c) if *c == SqlState::UNIQUE_VIOLATION => DatabaseErrorKind::UniqueViolation,
            _ => DatabaseErrorKind::Other,
        };
        Error::database(kind, PgError(e))
    }
}

#[cfg(feature = "postgres")]
impl From<r2d2::Error> for Error {
    fn from(e: r2d2::Error) -> Self {
        Error::Pool(Box::new(e))
    }
}

impl From<ParseEventIdError> for Error {
    fn from(e: ParseEventIdError) -> Self {
        Error::InvalidInput(e.to_string())
    }
}

/// `Result` with txbox's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
