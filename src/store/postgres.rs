//! PostgreSQL: the [`PgStore`] and `publish` on `postgres::Transaction`.
//!
//! Every statement is sent with its parameter types (`query_typed`), so each is one
//! round trip with no separate prepare.

use std::collections::BTreeMap;
use std::time::Duration;

use postgres::types::{ToSql, Type};
use postgres::{NoTls, Row};
use r2d2_postgres::PostgresConnectionManager;
use uuid::Uuid;

use super::{split_statements, Outcome, Store, Tables, TypeStatus};
use crate::dlq::{DeadLetter, DlqFilter, DlqStatus};
use crate::error::{Error, Result};
use crate::event::{Event, EventId, NewEvent};

/// The schema, embedded: the same file a DBA reads in `sql/postgres/`.
pub const SCHEMA: &str = include_str!("../../sql/postgres/001_schema.sql");

/// A connection pool of the `postgres` crate, as [`PgStore`] uses it.
pub type PgPool = r2d2::Pool<PostgresConnectionManager<NoTls>>;

/// The PostgreSQL [`Store`]: a connection pool and the SQL of this dialect.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// let store = txbox::PgStore::connect("postgres://postgres@127.0.0.1:5432/test", "shop_")?;
/// txbox::Store::migrate(&store)?;
/// # Ok(()) }
/// ```
pub struct PgStore {
    pool: PgPool,
    tables: Tables,
    sql: Sql,
}

impl PgStore {
    /// Connects a pool of up to 16 connections to `url`
    /// (`postgres://user:password@host:port/database` or key=value form).
    pub fn connect(url: &str, table_prefix: &str) -> Result<Self> {
        Self::connect_with(url, table_prefix, 16)
    }

    /// Like [`PgStore::connect`] with the pool's size. A relay uses one connection
    /// per thread at most.
    pub fn connect_with(url: &str, table_prefix: &str, max_connections: u32) -> Result<Self> {
        let config: postgres::Config = url
            .parse()
            .map_err(|e| Error::InvalidInput(format!("database url: {e}")))?;
        let manager = PostgresConnectionManager::new(config, NoTls);
        let pool = r2d2::Pool::builder()
            .max_size(max_connections.max(1))
            .min_idle(Some(1))
            .connection_timeout(Duration::from_secs(10))
            .error_handler(Box::new(LogErrors))
            .build(manager)?;
        Self::from_pool(pool, table_prefix)
    }

    /// A store over an existing pool.
    pub fn from_pool(pool: PgPool, table_prefix: &str) -> Result<Self> {
        let tables = Tables::new(table_prefix)?;
        let sql = Sql::new(&tables);
        Ok(PgStore { pool, tables, sql })
    }

    /// The table names.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// The pool, e.g. to run business transactions on the same connections.
    pub fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn conn(&self) -> Result<r2d2::PooledConnection<PostgresConnectionManager<NoTls>>> {
        Ok(self.pool.get()?)
    }

    fn query(&self, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Result<Vec<Row>> {
        Ok(self.conn()?.query_typed(sql, params)?)
    }

    fn count(&self, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Result<u64> {
        let rows = self.query(sql, params)?;
        Ok(rows.first().map(|r| r.get::<_, i64>(0)).unwrap_or(0) as u64)
    }

    fn ids(&self, sql: &str, params: &[(&(dyn ToSql + Sync), Type)]) -> Result<Vec<EventId>> {
        Ok(self
            .query(sql, params)?
            .iter()
            .map(|r| EventId::from_uuid(r.get(0)))
            .collect())
    }
}

#[derive(Debug)]
struct LogErrors;

impl r2d2::HandleError<postgres::Error> for LogErrors {
    fn handle_error(&self, error: postgres::Error) {
        log::warn!(
            "txbox: database connection failed: {}",
            crate::error::PgError(error)
        );
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn uuids(ids: &[EventId]) -> Vec<Uuid> {
    ids.iter().map(EventId::as_uuid).collect()
}

fn statuses(s: &[DlqStatus]) -> Vec<&'static str> {
    s.iter().map(DlqStatus::as_str).collect()
}

fn parse_headers(text: &str) -> BTreeMap<String, String> {
    match serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(text) {
        Ok(map) => map
            .into_iter()
            .map(|(k, v)| match v {
                serde_json::Value::String(s) => (k, s),
                other => (k, other.to_string()),
            })
            .collect(),
        Err(_) => BTreeMap::new(),
    }
}

fn headers_json(h: &BTreeMap<String, String>) -> String {
    serde_json::to_string(h).unwrap_or_else(|_| "{}".into())
}

/// The statements of this dialect, rendered once with the table names.
struct Sql {
    migrate_lock: String,
    claim: String,
    finish_sent: String,
    finish_failed: String,
    recover: String,
    delete_processed: String,
    move_to_dlq: String,
    requeue: String,
    delete_resolved: String,
    lock: String,
    unlock: String,
    dlq_list: String,
    dlq_count: String,
    dlq_get: String,
    dlq_set_status: String,
    dlq_delete: String,
    status: String,
    inbox_insert: String,
    inbox_delete: String,
}

const DLQ_COLUMNS: &str =
    "id, event_type, event_key, headers::text, payload, attempts, last_error, status, \
     to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), \
     to_char(moved_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')";

impl Sql {
    fn new(t: &Tables) -> Self {
        let (o, d, l, i) = (&t.outbox, &t.dlq, &t.locks, &t.inbox);
        let filter = "($1::text IS NULL OR event_type = $1) AND ($2::text IS NULL OR status = $2)";
        Sql {
            migrate_lock: "SELECT pg_advisory_xact_lock(hashtext('txbox-migrate'))".into(),
            claim: format!(
                "WITH c AS (SELECT id FROM {o} WHERE event_type = $1 AND status = 'PENDING' \
                   AND next_attempt_at <= now() ORDER BY id LIMIT $2 FOR UPDATE SKIP LOCKED) \
                 UPDATE {o} AS e SET status = 'IN_PROCESS', claim_token = $3, \
                   lease_until = now() + $4 * interval '1 millisecond' \
                 FROM c WHERE e.id = c.id \
                 RETURNING e.id, e.event_type, e.event_key, e.headers::text, e.payload, e.attempts"
            ),
            finish_sent: format!(
                "UPDATE {o} SET status = 'PROCESSED', processed_at = now(), claim_token = NULL, \
                   lease_until = NULL \
                 WHERE id = ANY($1) AND claim_token = $2 AND status = 'IN_PROCESS'"
            ),
            finish_failed: format!(
                "UPDATE {o} AS e SET status = u.status, attempts = e.attempts + 1, \
                   next_attempt_at = CASE WHEN u.status = 'PENDING' \
                     THEN now() + u.delay_ms * interval '1 millisecond' ELSE e.next_attempt_at END, \
                   last_error = u.error, claim_token = NULL, lease_until = NULL \
                 FROM unnest($1::uuid[], $2::text[], $3::float8[], $4::text[]) AS u(id, status, delay_ms, error) \
                 WHERE e.id = u.id AND e.claim_token = $5 AND e.status = 'IN_PROCESS'"
            ),
            recover: format!(
                "UPDATE {o} SET status = 'PENDING', claim_token = NULL, lease_until = NULL \
                 WHERE id IN (SELECT id FROM {o} WHERE status = 'IN_PROCESS' AND lease_until < now() \
                   LIMIT $1 FOR UPDATE SKIP LOCKED)"
            ),
            delete_processed: format!(
                "DELETE FROM {o} WHERE id IN (SELECT id FROM {o} WHERE status = 'PROCESSED' \
                   AND processed_at < now() - $1 * interval '1 millisecond' LIMIT $2 \
                   FOR UPDATE SKIP LOCKED)"
            ),
            move_to_dlq: format!(
                "WITH m AS (DELETE FROM {o} WHERE id IN (SELECT id FROM {o} WHERE status = 'FAILED' \
                     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                   RETURNING id, event_type, event_key, headers, payload, attempts, last_error, created_at) \
                 INSERT INTO {d} (id, event_type, event_key, headers, payload, attempts, last_error, \
                   status, created_at, moved_at, updated_at) \
                 SELECT id, event_type, event_key, headers, payload, attempts, last_error, 'DEAD', \
                   created_at, now(), now() FROM m \
                 ON CONFLICT (id) DO UPDATE SET event_type = EXCLUDED.event_type, \
                   event_key = EXCLUDED.event_key, headers = EXCLUDED.headers, \
                   payload = EXCLUDED.payload, attempts = EXCLUDED.attempts, \
                   last_error = EXCLUDED.last_error, status = 'DEAD', moved_at = now(), updated_at = now()"
            ),
            requeue: format!(
                "WITH m AS (DELETE FROM {d} WHERE id IN (SELECT id FROM {d} WHERE status = 'RETRY' \
                     ORDER BY id LIMIT $1 FOR UPDATE SKIP LOCKED) \
                   RETURNING id, event_type, event_key, headers, payload, last_error, created_at) \
                 INSERT INTO {o} (id, event_type, event_key, headers, payload, status, attempts, \
                   next_attempt_at, last_error, created_at) \
                 SELECT id, event_type, event_key, headers, payload, 'PENDING', 0, now(), last_error, \
                   created_at FROM m \
                 ON CONFLICT (id) DO UPDATE SET status = 'PENDING', attempts = 0, next_attempt_at = now(), \
                   claim_token = NULL, lease_until = NULL, processed_at = NULL"
            ),
            delete_resolved: format!(
                "DELETE FROM {d} WHERE id IN (SELECT id FROM {d} WHERE status = 'RESOLVED' \
                   AND updated_at < now() - $1 * interval '1 millisecond' LIMIT $2 \
                   FOR UPDATE SKIP LOCKED)"
            ),
            lock: format!(
                "INSERT INTO {l} (name, owner, locked_at, locked_until) \
                 VALUES ($1, $2, now(), now() + $3 * interval '1 millisecond') \
                 ON CONFLICT (name) DO UPDATE SET owner = EXCLUDED.owner, locked_at = now(), \
                   locked_until = EXCLUDED.locked_until \
                 WHERE {l}.locked_until < now() OR {l}.owner = EXCLUDED.owner \
                 RETURNING owner"
            ),
            unlock: format!("DELETE FROM {l} WHERE name = $1 AND owner = $2"),
            dlq_list: format!(
                "SELECT {DLQ_COLUMNS} FROM {d} WHERE {filter} ORDER BY moved_at, id OFFSET $3 LIMIT $4"
            ),
            dlq_count: format!("SELECT count(*) FROM {d} WHERE {filter}"),
            dlq_get: format!("SELECT {DLQ_COLUMNS} FROM {d} WHERE id = $1"),
            dlq_set_status: format!(
                "UPDATE {d} SET status = $3, updated_at = now() \
                 WHERE id = ANY($1) AND status = ANY($2) RETURNING id"
            ),
            dlq_delete: format!("DELETE FROM {d} WHERE id = ANY($1) AND status = ANY($2) RETURNING id"),
            status: format!(
                "SELECT event_type, \
                   count(*) FILTER (WHERE status = 'PENDING'), \
                   count(*) FILTER (WHERE status = 'IN_PROCESS'), \
                   count(*) FILTER (WHERE status = 'FAILED'), \
                   extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'PENDING'))::float8 \
                 FROM {o} WHERE status IN ('PENDING', 'IN_PROCESS', 'FAILED') \
                 GROUP BY event_type ORDER BY event_type"
            ),
            inbox_insert: inbox_insert_sql(t),
            inbox_delete: format!(
                "DELETE FROM {i} WHERE event_id IN (SELECT event_id FROM {i} \
                   WHERE consumed_at < now() - $1 * interval '1 millisecond' LIMIT $2 \
                   FOR UPDATE SKIP LOCKED)"
            ),
        }
    }
}

fn dead_letter(r: &Row) -> DeadLetter {
    let status: String = r.get(7);
    DeadLetter {
        id: EventId::from_uuid(r.get(0)),
        event_type: r.get(1),
        key: r.get(2),
        headers: parse_headers(r.get(3)),
        payload: r.get(4),
        attempts: r.get::<_, i32>(5).max(0) as u32,
        last_error: r.get(6),
        status: status.parse().unwrap_or(DlqStatus::Dead),
        created_at: r.get(8),
        moved_at: r.get(9),
    }
}

impl Store for PgStore {
    fn migrate(&self) -> Result<()> {
        let mut conn = self.conn()?;
        let mut tx = conn.transaction()?;
        tx.batch_execute(&self.sql.migrate_lock)?;
        for stmt in split_statements(&self.tables.render(SCHEMA)) {
            tx.batch_execute(&stmt)?;
        }
        tx.commit()?;
        Ok(())
    }

    fn claim(
        &self,
        event_type: &str,
        limit: usize,
        lease: Duration,
        token: Uuid,
    ) -> Result<Vec<Event>> {
        let limit = limit as i64;
        let lease = ms(lease);
        let rows = self.query(
            &self.sql.claim,
            &[
                (&event_type, Type::TEXT),
                (&limit, Type::INT8),
                (&token, Type::UUID),
                (&lease, Type::FLOAT8),
            ],
        )?;
        let mut events: Vec<Event> = rows
            .iter()
            .map(|r| Event {
                id: EventId::from_uuid(r.get(0)),
                event_type: r.get(1),
                destination: String::new(),
                routing_key: String::new(),
                key: r.get(2),
                headers: parse_headers(r.get(3)),
                payload: r.get(4),
                attempts: r.get::<_, i32>(5).max(0) as u32,
            })
            .collect();
        events.sort_by_key(|e| e.id);
        Ok(events)
    }

    fn finish(&self, token: Uuid, outcomes: &[(EventId, Outcome)]) -> Result<u64> {
        let mut sent = Vec::new();
        let (mut ids, mut states, mut delays, mut errors) =
            (Vec::new(), Vec::new(), Vec::new(), Vec::new());
        for (id, outcome) in outcomes {
            match outcome {
                Outcome::Sent => sent.push(id.as_uuid()),
                Outcome::Retry { delay, error } => {
                    ids.push(id.as_uuid());
                    states.push("PENDING");
                    delays.push(ms(*delay));
                    errors.push(error.as_str());
                }
                Outcome::Failed { error } => {
                    ids.push(id.as_uuid());
                    states.push("FAILED");
                    delays.push(0.0);
                    errors.push(error.as_str());
                }
            }
        }
        let mut conn = self.conn()?;
        let mut changed = 0;
        if !sent.is_empty() {
            changed += conn.execute_typed(
                &self.sql.finish_sent,
                &[(&sent, Type::UUID_ARRAY), (&token, Type::UUID)],
            )?;
        }
        if !ids.is_empty() {
            changed += conn.execute_typed(
                &self.sql.finish_failed,
                &[
                    (&ids, Type::UUID_ARRAY),
                    (&states, Type::TEXT_ARRAY),
                    (&delays, Type::FLOAT8_ARRAY),
                    (&errors, Type::TEXT_ARRAY),
                    (&token, Type::UUID),
                ],
            )?;
        }
        Ok(changed)
    }

    fn recover_expired(&self, limit: usize) -> Result<u64> {
        let limit = limit as i64;
        Ok(self
            .conn()?
            .execute_typed(&self.sql.recover, &[(&limit, Type::INT8)])?)
    }

    fn delete_processed(&self, ttl: Duration, limit: usize) -> Result<u64> {
        let (ttl, limit) = (ms(ttl), limit as i64);
        Ok(self.conn()?.execute_typed(
            &self.sql.delete_processed,
            &[(&ttl, Type::FLOAT8), (&limit, Type::INT8)],
        )?)
    }

    fn move_failed_to_dlq(&self, limit: usize) -> Result<u64> {
        let limit = limit as i64;
        Ok(self
            .conn()?
            .execute_typed(&self.sql.move_to_dlq, &[(&limit, Type::INT8)])?)
    }

    fn requeue_dlq_retries(&self, limit: usize) -> Result<u64> {
        let limit = limit as i64;
        Ok(self
            .conn()?
            .execute_typed(&self.sql.requeue, &[(&limit, Type::INT8)])?)
    }

    fn delete_resolved_dlq(&self, ttl: Duration, limit: usize) -> Result<u64> {
        let (ttl, limit) = (ms(ttl), limit as i64);
        Ok(self.conn()?.execute_typed(
            &self.sql.delete_resolved,
            &[(&ttl, Type::FLOAT8), (&limit, Type::INT8)],
        )?)
    }

    fn try_lock(&self, name: &str, owner: Uuid, lease: Duration) -> Result<bool> {
        let lease = ms(lease);
        let rows = self.query(
            &self.sql.lock,
            &[
                (&name, Type::VARCHAR),
                (&owner, Type::UUID),
                (&lease, Type::FLOAT8),
            ],
        )?;
        Ok(!rows.is_empty())
    }

    fn unlock(&self, name: &str, owner: Uuid) -> Result<()> {
        self.conn()?.execute_typed(
            &self.sql.unlock,
            &[(&name, Type::VARCHAR), (&owner, Type::UUID)],
        )?;
        Ok(())
    }

    fn dlq_list(&self, f: &DlqFilter) -> Result<Vec<DeadLetter>> {
        let status = f.status.map(|s| s.as_str());
        let (offset, limit) = (f.offset as i64, f.limit as i64);
        let rows = self.query(
            &self.sql.dlq_list,
            &[
                (&f.event_type, Type::TEXT),
                (&status, Type::TEXT),
                (&offset, Type::INT8),
                (&limit, Type::INT8),
            ],
        )?;
        Ok(rows.iter().map(dead_letter).collect())
    }

    fn dlq_count(&self, f: &DlqFilter) -> Result<u64> {
        let status = f.status.map(|s| s.as_str());
        self.count(
            &self.sql.dlq_count,
            &[(&f.event_type, Type::TEXT), (&status, Type::TEXT)],
        )
    }

    fn dlq_get(&self, id: EventId) -> Result<Option<DeadLetter>> {
        let id = id.as_uuid();
        Ok(self
            .query(&self.sql.dlq_get, &[(&id, Type::UUID)])?
            .first()
            .map(dead_letter))
    }

    fn dlq_set_status(
        &self,
        ids: &[EventId],
        from: &[DlqStatus],
        to: DlqStatus,
    ) -> Result<Vec<EventId>> {
        let (ids, from, to) = (uuids(ids), statuses(from), to.as_str());
        self.ids(
            &self.sql.dlq_set_status,
            &[
                (&ids, Type::UUID_ARRAY),
                (&from, Type::TEXT_ARRAY),
                (&to, Type::VARCHAR),
            ],
        )
    }

    fn dlq_delete(&self, ids: &[EventId], from: &[DlqStatus]) -> Result<Vec<EventId>> {
        let (ids, from) = (uuids(ids), statuses(from));
        self.ids(
            &self.sql.dlq_delete,
            &[(&ids, Type::UUID_ARRAY), (&from, Type::TEXT_ARRAY)],
        )
    }

    fn inbox_insert(&self, ids: &[EventId]) -> Result<Vec<EventId>> {
        insert_ids(&mut *self.conn()?, &self.sql.inbox_insert, ids)
    }

    fn delete_expired_inbox(&self, ttl: Duration, limit: usize) -> Result<u64> {
        let (ttl, limit) = (ms(ttl), limit as i64);
        Ok(self.conn()?.execute_typed(
            &self.sql.inbox_delete,
            &[(&ttl, Type::FLOAT8), (&limit, Type::INT8)],
        )?)
    }

    fn status(&self) -> Result<Vec<TypeStatus>> {
        let rows = self.query(&self.sql.status, &[])?;
        Ok(rows
            .iter()
            .map(|r| TypeStatus {
                event_type: r.get(0),
                pending: r.get::<_, i64>(1) as u64,
                in_process: r.get::<_, i64>(2) as u64,
                failed: r.get::<_, i64>(3) as u64,
                oldest_pending_age: r
                    .get::<_, Option<f64>>(4)
                    .map(|s| Duration::from_secs_f64(s.max(0.0))),
            })
            .collect())
    }
}

fn inbox_insert_sql(t: &Tables) -> String {
    format!(
        "INSERT INTO {} (event_id) SELECT DISTINCT unnest($1::uuid[]) ON CONFLICT (event_id) DO NOTHING \
         RETURNING event_id",
        t.inbox
    )
}

/// Records ids in `tx`; returns the new ones.
fn insert_ids(
    tx: &mut impl postgres::GenericClient,
    sql: &str,
    ids: &[EventId],
) -> Result<Vec<EventId>> {
    let ids = uuids(ids);
    Ok(tx
        .query_typed(sql, &[(&ids, Type::UUID_ARRAY)])?
        .iter()
        .map(|r| EventId::from_uuid(r.get(0)))
        .collect())
}

/// `INSERT` of new events into the caller's transaction: one statement, one round
/// trip, however many events.
pub(crate) fn insert_events(
    tx: &mut postgres::Transaction<'_>,
    tables: &Tables,
    events: &[NewEvent],
) -> Result<()> {
    let o = &tables.outbox;
    if let [e] = events {
        let (id, headers) = (e.id.as_uuid(), headers_json(&e.headers));
        tx.execute_typed(
            &format!(
                "INSERT INTO {o} (id, event_type, event_key, headers, payload) \
                 VALUES ($1, $2, $3, $4::jsonb, $5)"
            ),
            &[
                (&id, Type::UUID),
                (&e.event_type, Type::TEXT),
                (&e.key, Type::TEXT),
                (&headers, Type::TEXT),
                (&e.payload, Type::TEXT),
            ],
        )?;
        return Ok(());
    }
    let ids: Vec<Uuid> = events.iter().map(|e| e.id.as_uuid()).collect();
    let types: Vec<&str> = events.iter().map(|e| e.event_type.as_str()).collect();
    let keys: Vec<Option<&str>> = events.iter().map(|e| e.key.as_deref()).collect();
    let headers: Vec<String> = events.iter().map(|e| headers_json(&e.headers)).collect();
    let payloads: Vec<&str> = events.iter().map(|e| e.payload.as_str()).collect();
    tx.execute_typed(
        &format!(
            "INSERT INTO {o} (id, event_type, event_key, headers, payload) \
             SELECT u.id, u.t, u.k, u.h::jsonb, u.p \
             FROM unnest($1::uuid[], $2::text[], $3::text[], $4::text[], $5::text[]) AS u(id, t, k, h, p)"
        ),
        &[
            (&ids, Type::UUID_ARRAY),
            (&types, Type::TEXT_ARRAY),
            (&keys, Type::TEXT_ARRAY),
            (&headers, Type::TEXT_ARRAY),
            (&payloads, Type::TEXT_ARRAY),
        ],
    )?;
    Ok(())
}

impl crate::outbox::sealed::Sealed for postgres::Transaction<'_> {}

impl crate::outbox::OutboxTransaction for postgres::Transaction<'_> {
    fn insert_events(&mut self, tables: &Tables, events: &[NewEvent]) -> Result<()> {
        insert_events(self, tables, events)
    }
}

impl crate::inbox::sealed::Sealed for postgres::Transaction<'_> {}

impl crate::inbox::InboxTransaction for postgres::Transaction<'_> {
    fn insert_new_ids(&mut self, tables: &Tables, ids: &[EventId]) -> Result<Vec<EventId>> {
        insert_ids(self, &inbox_insert_sql(tables), ids)
    }
}

impl crate::inbox::Inbox {
    /// Transactional, on a transaction the inbox opens from `pool`: records `id`,
    /// runs `handler` in the same transaction and commits both, or rolls both back
    /// when the handler fails (its error passes through unchanged). Caches the id
    /// after the commit.
    pub fn handle_pg<T, E, F>(
        &self,
        pool: &PgPool,
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
    /// reads the event id, runs `handler` through [`Inbox::handle_pg`], then lets the
    /// loop commit / ack. A message without a valid id goes to `policy`; a failed
    /// handler is retried (redelivered).
    pub fn handler_pg<E, F>(
        &self,
        pool: PgPool,
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
