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
    pub(crate) paused: String,
    /// Each dialect's statements for these tables, built when first asked.
    #[cfg(feature = "_sql")]
    pub(crate) shared: std::sync::Arc<shared::Shared>,
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
            paused: format!("{prefix}outbox_paused_types"),
            #[cfg(feature = "_sql")]
            shared: shared::Shared::for_prefix(prefix),
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

    /// The paused event types (schema PostgreSQL 9, the others 6).
    pub fn paused(&self) -> &str {
        &self.paused
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

#[cfg(feature = "_sql")]
pub(crate) mod shared {
    use crate::error::{Error, Result};

    /// What is built once per table prefix and kept with every [`Tables`](super::Tables) of it:
    /// each SQL dialect's statements, in a slot of its own. The values' types are
    /// erased, so that the table names depend on none of the stores that use them.
    #[derive(Default)]
    pub(crate) struct Shared([std::sync::OnceLock<SharedValue>; Shared::SLOTS]);

    type SharedValue = Box<dyn std::any::Any + Send + Sync>;

    impl Shared {
        /// How many slots there are: one per SQL dialect.
        pub(crate) const SLOTS: usize = 4;

        /// The values of the tables of `prefix`: those of every `Tables` of that
        /// prefix made before, shared (a service that makes an `Outbox` per
        /// request looks them up once per `Outbox`, under a lock, and builds them
        /// once per process; a publish then reads them without either).
        pub(super) fn for_prefix(prefix: &str) -> std::sync::Arc<Shared> {
            use std::collections::HashMap;
            use std::sync::{Arc, LazyLock, Mutex};
            static BY_PREFIX: LazyLock<Mutex<HashMap<String, Arc<Shared>>>> =
                LazyLock::new(Default::default);
            let mut all = BY_PREFIX.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = all.get(prefix) {
                return c.clone();
            }
            all.entry(prefix.to_owned()).or_default().clone()
        }

        /// The value in `slot`, built by `build` the first time. An
        /// [`Error::Internal`] for a slot that does not exist or holds a value of
        /// another type (a bug: each dialect has a slot of its own).
        pub(crate) fn get<T: std::any::Any + Send + Sync>(
            &self,
            slot: usize,
            build: impl FnOnce() -> T,
        ) -> Result<&T> {
            let cell = self
                .0
                .get(slot)
                .ok_or_else(|| Error::Internal(format!("no shared slot {slot}")))?;
            cell.get_or_init(|| Box::new(build()))
                .downcast_ref::<T>()
                .ok_or_else(|| {
                    Error::Internal(format!(
                        "shared slot {slot} holds another type than {}",
                        std::any::type_name::<T>()
                    ))
                })
        }
    }

    impl std::fmt::Debug for Shared {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("Shared")
        }
    }

    #[cfg(test)]
    mod tests {
        use super::*;
        use crate::tables::Tables;

        #[test]
        fn tables_of_one_prefix_build_a_slot_once_and_share_it() {
            let (a, b) = (
                Tables::new("t_shared_once_").unwrap(),
                Tables::new("t_shared_once_").unwrap(),
            );
            let mut built = 0;
            let first = a.shared.get(0, || {
                built += 1;
                String::from("statements")
            });
            let again = b.shared.get(0, || {
                built += 1;
                String::from("other")
            });
            assert_eq!(built, 1);
            let (first, again) = (first.unwrap(), again.unwrap());
            assert!(std::ptr::eq(first, again));
            // another prefix builds its own
            let other = Tables::new("t_shared_other_").unwrap();
            assert_eq!(*other.shared.get(0, || String::from("x")).unwrap(), "x");
        }

        #[test]
        fn a_slot_of_another_type_or_past_the_end_is_an_internal_error() {
            let t = Tables::new("t_shared_types_").unwrap();
            t.shared.get(1, || 7_u32).unwrap();
            let e = t.shared.get(1, String::new).unwrap_err();
            assert!(
                matches!(&e, Error::Internal(m) if m.contains("slot 1") && m.contains("String")),
                "{e}"
            );
            let e = t.shared.get(Shared::SLOTS, || 1_u8).unwrap_err();
            assert!(matches!(e, Error::Internal(_)), "{e}");
        }
    }
}
