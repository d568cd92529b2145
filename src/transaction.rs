//! The one trait `publish` and the inbox take: an open transaction of a
//! supported driver.

use crate::error::Result;
use crate::event::{EventId, NewEvent};
use crate::tables::Tables;

pub(crate) mod sealed {
    pub trait Sealed {}
}

/// An open database transaction that txbox writes into: `postgres::Transaction`
/// (feature `postgres`), `mysql::Transaction` (`mysql`), `rusqlite::Transaction`
/// (`sqlite`) or an `oracle::Connection` with autocommit off (`oracle`).
/// [`Outbox::publish`](crate::Outbox::publish) writes events into it and the
/// [inbox](crate::inbox::Inbox::handle_in) records consumed ids in it; neither
/// begins, commits or rolls back. A plain connection is not one, so "publish
/// without a transaction" does not compile.
///
/// Sealed: txbox implements it for each supported driver.
pub trait Transaction: sealed::Sealed {
    #[doc(hidden)]
    fn insert_events(&mut self, tables: &Tables, events: &[NewEvent]) -> Result<()>;

    #[doc(hidden)]
    fn insert_new_ids(
        &mut self,
        tables: &Tables,
        consumer: &str,
        ids: &[EventId],
    ) -> Result<Vec<EventId>>;
}
