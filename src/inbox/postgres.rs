//! The inbox on a PostgreSQL pool (feature `postgres`).

use crate::error::{Error, Result};
use crate::event::EventId;
use crate::store::postgres::{PgConnector, PgPool};

impl crate::inbox::Inbox {
    /// Transactional, on a transaction the inbox opens from `pool`: records `id`,
    /// runs `handler` in the same transaction and commits both, or rolls both back
    /// when the handler fails (its error passes through unchanged). Caches the id
    /// after the commit.
    pub fn handle_pg<T, E, F, C: PgConnector>(
        &self,
        pool: &PgPool<C>,
        id: EventId,
        handler: F,
    ) -> Result<crate::inbox::Handled<T>, E>
    where
        E: From<Error>,
        F: FnOnce(&mut postgres::Transaction<'_>) -> Result<T, E>,
    {
        // a cache hit must not even take a connection
        if self.is_cached(id) {
            return Ok(crate::inbox::Handled::Duplicate);
        }
        let mut conn = pool.get().map_err(Error::from)?;
        let mut tx = conn.transaction().map_err(Error::from)?;
        let handled = self.handle_in_uncached(&mut tx, id, handler)?; // Err: tx rolls back on drop
        tx.commit().map_err(Error::from)?;
        if !handled.is_duplicate() {
            self.committed(&[id]);
        }
        Ok(handled)
    }

    /// A handler for [`KafkaConsumer::run_with`](crate::kafka::KafkaConsumer::run_with)
    /// or [`RabbitConsumer::run_with`](crate::rabbitmq::RabbitConsumer::run_with):
    /// reads the event id, runs `handler` through [`Inbox::handle_pg`](crate::inbox::Inbox::handle_pg),
    /// then lets the loop commit / ack. A message without a valid id goes to `policy`;
    /// a failed handler is retried (redelivered).
    pub fn handler_pg<E, F, C: PgConnector>(
        &self,
        pool: PgPool<C>,
        policy: crate::inbox::MissingIdPolicy,
        mut handler: F,
    ) -> impl FnMut(&crate::ReceivedEvent) -> crate::consumer::Verdict
    where
        E: From<Error> + std::fmt::Display,
        F: FnMut(&mut postgres::Transaction<'_>, &crate::ReceivedEvent) -> Result<(), E>,
    {
        let inbox = self.clone();
        move |event| match event.id {
            None => Self::missing_id(policy, event),
            Some(id) => Self::verdict(inbox.handle_pg(&pool, id, |tx| handler(tx, event))),
        }
    }
}
