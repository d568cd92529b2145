//! The table names of one prefix: what the outbox, the inbox and the store share.

use crate::error::{Error, Result};

/// The table names, from a validated prefix (made only by [`Tables::new`], so
/// every name spliced into SQL was checked). A clone shares the statements
/// built for its tables.
#[derive(Debug, Clone)]
pub struct Tables {
    pub(crate) prefix: String,
    pub(crate) outbox: String,
    pub(crate) dlq: String,
    pub(crate) inbox: String,
    pub(crate) locks: String,
    pub(crate) schema_version: String,
    /// Each dialect's statements for these tables, built when first asked.
    #[cfg(any(
        feature = "postgres",
        feature = "mysql",
        feature = "sqlite",
        feature = "oracle"
    ))]
    pub(crate) compiled: std::sync::Arc<crate::store::sql::Compiled>,
}

/// Tables are equal when their names are: they have the same prefix.
impl PartialEq for Tables {
    fn eq(&self, other: &Self) -> bool {
        self.prefix == other.prefix
    }
}

impl Eq for Tables {}

impl Tables {
    /// Validates `prefix` and derives the table names.
    pub fn new(prefix: &str) -> Result<Self> {
        validate_prefix(prefix)?;
        Ok(Tables {
            prefix: prefix.to_owned(),
            outbox: format!("{prefix}outbox_events"),
            dlq: format!("{prefix}outbox_dead_letters"),
            inbox: format!("{prefix}inbox_consumed"),
            locks: format!("{prefix}job_locks"),
            schema_version: format!("{prefix}txbox_schema_version"),
            #[cfg(any(
                feature = "postgres",
                feature = "mysql",
                feature = "sqlite",
                feature = "oracle"
            ))]
            compiled: crate::store::sql::Compiled::for_prefix(prefix),
        })
    }

    /// The validated prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Outbox events.
    pub fn outbox(&self) -> &str {
        &self.outbox
    }

    /// Dead letters.
    pub fn dlq(&self) -> &str {
        &self.dlq
    }

    /// Inbox consumed ids.
    pub fn inbox(&self) -> &str {
        &self.inbox
    }

    /// Lease locks.
    pub fn locks(&self) -> &str {
        &self.locks
    }

    /// The schema versions applied after the baseline.
    pub fn schema_version(&self) -> &str {
        &self.schema_version
    }

    /// Substitutes the prefix into a schema file (`{prefix}`).
    pub fn render(&self, sql: &str) -> String {
        sql.replace("{prefix}", &self.prefix)
    }
}

/// Checks the name of an inbox consumer (the inbox table's `consumer` column,
/// part of each cache key): 1 to 100 ASCII letters, digits, `-`, `_` or `.`. So
/// no consumer is `*`, the name of the rows recorded before the inbox was kept
/// per consumer, which count as consumed for everyone.
pub(crate) fn validate_consumer(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 100
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        return Err(Error::InvalidInput(format!(
            "inbox consumer name {name:?}: use 1 to 100 ASCII letters, digits, '-', '_' or '.'"
        )));
    }
    Ok(())
}

/// Longest table prefix: PostgreSQL names are at most 63 bytes and the longest
/// derived name adds 34.
pub(crate) const MAX_PREFIX_LEN: usize = 24;

/// Checks that a table prefix is a plain SQL identifier (or empty): ASCII letters,
/// digits and `_`, not starting with a digit.
pub(crate) fn validate_prefix(prefix: &str) -> Result<()> {
    let ok = prefix.len() <= MAX_PREFIX_LEN
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !prefix.starts_with(|c: char| c.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidIdentifier {
            what: "table prefix",
            value: prefix.to_owned(),
            max: MAX_PREFIX_LEN,
        })
    }
}
