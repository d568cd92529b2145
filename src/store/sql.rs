//! The logic every SQL dialect shares. A dialect supplies its statements (a
//! [`Dialect`]) and a connection adapter ([`Conn`]); the flows below — claim,
//! finish, recovery, dead letters, locks, inbox — are written once.
//!
//! Statements are written with numbered placeholders `$1`, `$2`, ... and an optional
//! `{ids}` list, rendered per call into the driver's style (`$n`, `?`, `?n`, `:n`).

use std::collections::BTreeMap;
use std::time::Duration;

use uuid::Uuid;

use super::{ClaimArgs, HeldBatch, HeldClaim, Outcome, Store, Tables, TypeStatus};
use crate::dlq::{DeadLetter, DlqFilter, DlqStatus};
use crate::error::{Error, Result};
use crate::event::{Event, EventId, NewEvent};

/// A parameter or column value.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Null,
    Int(i64),
    Float(f64),
    Text(String),
    Id(Uuid),
    Bytes(Vec<u8>),
}

impl From<&str> for Val {
    fn from(s: &str) -> Self {
        Val::Text(s.to_string())
    }
}

impl From<Option<&str>> for Val {
    fn from(s: Option<&str>) -> Self {
        s.map_or(Val::Null, Val::from)
    }
}

/// One result row.
#[derive(Debug, Clone)]
pub(crate) struct Row(pub(crate) Vec<Val>);

impl Row {
    fn get(&self, i: usize) -> &Val {
        self.0.get(i).unwrap_or(&Val::Null)
    }

    pub(crate) fn id(&self, i: usize) -> Result<EventId> {
        match self.get(i) {
            Val::Id(u) => Ok(EventId::from_uuid(*u)),
            Val::Bytes(b) if b.len() == 16 => {
                let mut a = [0u8; 16];
                a.copy_from_slice(b);
                Ok(EventId::from_uuid(Uuid::from_bytes(a)))
            }
            Val::Text(s) => s.parse(),
            Val::Bytes(b) => String::from_utf8_lossy(b).parse(),
            other => Err(Error::database(
                crate::error::DatabaseErrorKind::Other,
                format!("expected an id in column {i}, got {other:?}"),
            )),
        }
    }

    pub(crate) fn opt_text(&self, i: usize) -> Option<String> {
        match self.get(i) {
            Val::Null => None,
            Val::Text(s) => Some(s.clone()),
            Val::Bytes(b) => Some(String::from_utf8_lossy(b).into_owned()),
            Val::Int(n) => Some(n.to_string()),
            Val::Float(f) => Some(f.to_string()),
            Val::Id(u) => Some(u.to_string()),
        }
    }

    pub(crate) fn text(&self, i: usize) -> String {
        self.opt_text(i).unwrap_or_default()
    }

    /// Column `i` as text, moved out of the row when it is text (no copy).
    fn take_text(&mut self, i: usize) -> Option<String> {
        match self.0.get_mut(i) {
            Some(Val::Text(s)) => Some(std::mem::take(s)),
            _ => self.opt_text(i),
        }
    }

    pub(crate) fn int(&self, i: usize) -> i64 {
        match self.get(i) {
            Val::Int(n) => *n,
            Val::Float(f) => *f as i64,
            Val::Text(s) => {
                let s = s.trim();
                // whole numbers as such; "3.0" and the like through a float
                s.parse::<i64>()
                    .or_else(|_| s.parse::<f64>().map(|f| f as i64))
                    .unwrap_or(0)
            }
            Val::Bytes(b) => String::from_utf8_lossy(b)
                .trim()
                .parse::<f64>()
                .map(|f| f as i64)
                .unwrap_or(0),
            _ => 0,
        }
    }

    pub(crate) fn opt_float(&self, i: usize) -> Option<f64> {
        match self.get(i) {
            Val::Null => None,
            Val::Int(n) => Some(*n as f64),
            Val::Float(f) => Some(*f),
            Val::Text(s) => s.trim().parse().ok(),
            Val::Bytes(b) => String::from_utf8_lossy(b).trim().parse().ok(),
            Val::Id(_) => None,
        }
    }
}

/// One database connection of a driver.
pub(crate) trait Conn {
    /// Runs a query with parameters (already in the driver's placeholder style).
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>>;
    /// Runs a statement with parameters; returns the affected row count.
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64>;
    /// Runs statements without parameters (transaction control, DDL).
    fn batch(&mut self, sql: &str) -> Result<()>;
    /// Runs statements without parameters in one round trip (values written into
    /// the SQL as literals); returns every row they returned, as text, and each
    /// statement's affected-row count. Only drivers whose dialect holds claims have
    /// it.
    fn script(&mut self, sql: &str) -> Result<Script> {
        let _ = sql;
        Err(Error::InvalidInput(
            "this driver cannot run a statement script".into(),
        ))
    }
    /// Like `query`, fetching at most `max` rows: Oracle limits a `FOR UPDATE SKIP
    /// LOCKED` select by what it fetches (its rows are locked as they are fetched).
    fn query_max(&mut self, sql: &str, params: &[Val], max: usize) -> Result<Vec<Row>> {
        let mut rows = self.query(sql, params)?;
        rows.truncate(max);
        Ok(rows)
    }
}

/// What [`Conn::script`] returns.
#[derive(Debug, Default)]
pub(crate) struct Script {
    /// The rows of every statement, in order, each value as text (or null).
    pub rows: Vec<Row>,
    /// The affected-row count of each statement, in order.
    pub counts: Vec<u64>,
}

/// Implements [`Conn`] for driver types (a client and its transaction, say) whose
/// query, execute and batch (and optionally script) are the same functions.
macro_rules! conn_impls {
    ($query:path, $execute:path, $batch:path $(, $script:path)?;) => {};
    ($query:path, $execute:path, $batch:path $(, $script:path)?; $t:ty $(, $rest:ty)* $(,)?) => {
        impl sql::Conn for $t {
            fn query(&mut self, sql: &str, params: &[sql::Val]) -> Result<Vec<sql::Row>> {
                $query(self, sql, params)
            }
            fn execute(&mut self, sql: &str, params: &[sql::Val]) -> Result<u64> {
                $execute(self, sql, params)
            }
            fn batch(&mut self, sql: &str) -> Result<()> {
                $batch(self, sql)
            }
            $(fn script(&mut self, sql: &str) -> Result<sql::Script> {
                $script(self, sql)
            })?
        }
        sql::conn_impls!($query, $execute, $batch $(, $script)?; $($rest),*);
    };
}
pub(crate) use conn_impls;

/// Implements [`Store`] for a dialect's store type by delegating to its `inner`
/// [`SqlStore`], where the shared logic lives.
macro_rules! delegate_store {
    ($t:ty) => {
        impl $crate::store::Store for $t {
            fn migrate(&self) -> $crate::Result<()> {
                self.inner.migrate()
            }
            fn ping(&self) -> $crate::Result<()> {
                self.inner.ping()
            }
            fn claim_after(
                &self,
                event_type: &str,
                after: Option<$crate::EventId>,
                limit: usize,
                lease: std::time::Duration,
                token: uuid::Uuid,
            ) -> $crate::Result<Vec<$crate::Event>> {
                self.inner
                    .claim_after(event_type, after, limit, lease, token)
            }
            fn finish(
                &self,
                token: uuid::Uuid,
                outcomes: &[($crate::EventId, $crate::store::Outcome)],
            ) -> $crate::Result<u64> {
                self.inner.finish(token, outcomes)
            }
            fn can_hold_claims(&self) -> bool {
                self.inner.can_hold_claims()
            }
            fn max_connections(&self) -> Option<usize> {
                self.inner.max_connections()
            }
            fn table_prefix(&self) -> Option<&str> {
                self.inner.table_prefix()
            }
            fn claim_held(
                &self,
                args: &$crate::store::ClaimArgs<'_>,
            ) -> $crate::Result<$crate::store::HeldClaim> {
                self.inner.claim_held(args)
            }
            fn recover_expired(&self, limit: usize) -> $crate::Result<u64> {
                self.inner.recover_expired(limit)
            }
            fn delete_processed(
                &self,
                ttl: std::time::Duration,
                limit: usize,
            ) -> $crate::Result<u64> {
                self.inner.delete_processed(ttl, limit)
            }
            fn move_failed_to_dlq(&self, limit: usize) -> $crate::Result<u64> {
                self.inner.move_failed_to_dlq(limit)
            }
            fn requeue_dlq_retries(&self, limit: usize) -> $crate::Result<u64> {
                self.inner.requeue_dlq_retries(limit)
            }
            fn delete_resolved_dlq(
                &self,
                ttl: std::time::Duration,
                limit: usize,
            ) -> $crate::Result<u64> {
                self.inner.delete_resolved_dlq(ttl, limit)
            }
            fn try_lock(
                &self,
                name: &str,
                owner: uuid::Uuid,
                lease: std::time::Duration,
            ) -> $crate::Result<bool> {
                self.inner.try_lock(name, owner, lease)
            }
            fn unlock(&self, name: &str, owner: uuid::Uuid) -> $crate::Result<()> {
                self.inner.unlock(name, owner)
            }
            fn dlq_list(
                &self,
                filter: &$crate::DlqFilter,
            ) -> $crate::Result<Vec<$crate::DeadLetter>> {
                self.inner.dlq_list(filter)
            }
            fn dlq_count(&self, filter: &$crate::DlqFilter) -> $crate::Result<u64> {
                self.inner.dlq_count(filter)
            }
            fn dlq_get(&self, id: $crate::EventId) -> $crate::Result<Option<$crate::DeadLetter>> {
                self.inner.dlq_get(id)
            }
            fn dlq_set_status(
                &self,
                ids: &[$crate::EventId],
                from: &[$crate::DlqStatus],
                to: $crate::DlqStatus,
            ) -> $crate::Result<Vec<$crate::EventId>> {
                self.inner.dlq_set_status(ids, from, to)
            }
            fn dlq_delete(
                &self,
                ids: &[$crate::EventId],
                from: &[$crate::DlqStatus],
            ) -> $crate::Result<Vec<$crate::EventId>> {
                self.inner.dlq_delete(ids, from)
            }
            fn status(&self) -> $crate::Result<Vec<$crate::store::TypeStatus>> {
                self.inner.status()
            }
            fn inbox_insert(
                &self,
                consumer: &str,
                ids: &[$crate::EventId],
            ) -> $crate::Result<Vec<$crate::EventId>> {
                self.inner.inbox_insert(consumer, ids)
            }
            fn delete_expired_inbox(
                &self,
                ttl: std::time::Duration,
                limit: usize,
            ) -> $crate::Result<u64> {
                self.inner.delete_expired_inbox(ttl, limit)
            }
        }
    };
}
pub(crate) use delegate_store;

/// A pooled or locked connection, used through the connection it dereferences to.
pub(crate) struct Held<T>(pub(crate) T);

impl<T> Conn for Held<T>
where
    T: std::ops::DerefMut,
    T::Target: Conn,
{
    fn query(&mut self, sql: &str, params: &[Val]) -> Result<Vec<Row>> {
        self.0.query(sql, params)
    }
    fn execute(&mut self, sql: &str, params: &[Val]) -> Result<u64> {
        self.0.execute(sql, params)
    }
    fn batch(&mut self, sql: &str) -> Result<()> {
        self.0.batch(sql)
    }
    fn script(&mut self, sql: &str) -> Result<Script> {
        self.0.script(sql)
    }
    fn query_max(&mut self, sql: &str, params: &[Val], max: usize) -> Result<Vec<Row>> {
        self.0.query_max(sql, params, max)
    }
}

/// Hands out connections.
pub(crate) trait Pool: Send + Sync + 'static {
    fn get(&self) -> Result<Box<dyn Conn + '_>>;
    /// A connection that may outlive the call (a held claim keeps one). Pools of
    /// dialects with [`Dialect::hold_claim`] implement it.
    fn get_owned(&self) -> Result<Box<dyn Conn + Send>> {
        Err(Error::InvalidInput(
            "this store cannot hand out a connection of its own".into(),
        ))
    }
    /// The most connections the pool opens, when it has a bound.
    fn max_size(&self) -> Option<usize> {
        None
    }
}

/// How a driver writes placeholders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Style {
    /// `$1` (PostgreSQL)
    Dollar,
    /// `?`, in order of appearance (MySQL)
    #[cfg_attr(not(feature = "mysql"), allow(dead_code))]
    Question,
    /// `?1` (SQLite)
    QuestionNumbered,
    /// `:1`, `:2`, ... in order of appearance (Oracle)
    #[cfg_attr(not(feature = "oracle"), allow(dead_code))]
    Colon,
}

/// Whether `e` is a database error of `kind`.
fn is(e: &Error, kind: crate::error::DatabaseErrorKind) -> bool {
    matches!(e, Error::Database { kind: k, .. } if *k == kind)
}

/// `template` with every `$n` placeholder replaced by `f(n)`.
fn placeholders(template: &str, mut f: impl FnMut(usize) -> String) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut chars = template.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '$' && chars.peek().is_some_and(|d| d.is_ascii_digit()) {
            let mut n = 0usize;
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n * 10 + d as usize;
                chars.next();
            }
            out.push_str(&f(n));
        } else {
            out.push(c);
        }
    }
    out
}

/// `template` with `{ids}` written out as the placeholders after the `fixed` ones.
fn expand_ids(template: &str, fixed: usize, ids: usize) -> String {
    let list: Vec<String> = (fixed + 1..=fixed + ids).map(|n| format!("${n}")).collect();
    template.replace("{ids}", &list.join(", "))
}

/// Renders `$n` / `{ids}` into `style`; returns the SQL and the order in which the
/// parameters must be passed (indexes into fixed ++ ids).
pub(crate) fn render(
    template: &str,
    style: Style,
    fixed: usize,
    ids: usize,
) -> (String, Vec<usize>) {
    let mut order = Vec::new();
    let out = placeholders(&expand_ids(template, fixed, ids), |n| {
        order.push(n - 1);
        match style {
            Style::Dollar => format!("${n}"),
            Style::Question => "?".into(),
            Style::QuestionNumbered => format!("?{n}"),
            // Oracle binds by position, the order the placeholders appear in,
            // whatever their names: one bind per occurrence, named in that order
            Style::Colon => format!(":{}", order.len()),
        }
    });
    if matches!(style, Style::Dollar | Style::QuestionNumbered) {
        // numbered styles bind every index up to the highest one used
        let highest = order.iter().max().map_or(0, |m| m + 1);
        order = (0..highest).collect();
    }
    (out, order)
}

/// Adds `by` to every `$n` placeholder of `template`.
fn shift(template: &str, by: usize) -> String {
    placeholders(template, |n| format!("${}", n + by))
}

/// "now - `ms_param` milliseconds" in a dialect whose "now + n ms" is `plus`.
pub(crate) fn ago(plus: fn(&str) -> String, ms_param: &str) -> String {
    plus(&format!("-{ms_param}"))
}

/// The statements that finish a claimed batch, each kept to the rows the claim
/// still holds by a `fence` condition.
pub(crate) struct Finish {
    /// $1 token, {ids}
    pub sent: String,
    /// $1 token, {ids}
    pub delete: String,
    /// $1 status, $2 delay ms, $3 error, $4 id, $5 token, $6 attempts to add (0 or 1)
    pub failed: String,
}

impl Finish {
    /// `ids` picks the rows of the statements with an id list, `fence` keeps them
    /// to the claim's, `fence_one` does for the one-row statement (whose token is
    /// `$5`).
    fn new(
        o: &str,
        now: &str,
        plus: fn(&str) -> String,
        ids: &str,
        fence: &str,
        fence_one: &str,
    ) -> Finish {
        Finish {
            sent: format!(
                "UPDATE {o} SET status = 'PROCESSED', processed_at = {now}, claim_token = NULL, lease_until = NULL \
                 WHERE {fence} AND {ids}"
            ),
            delete: format!("DELETE FROM {o} WHERE {fence} AND {ids}"),
            failed: format!(
                "UPDATE {o} SET status = $1, attempts = attempts + $6, \
                   next_attempt_at = CASE WHEN $1 = 'PENDING' THEN {} ELSE next_attempt_at END, \
                   last_error = $3, claim_token = NULL, lease_until = NULL \
                 WHERE id = $4 AND {fence_one}",
                plus("$2")
            ),
        }
    }
}

/// The statements every dialect writes alike but for its clock: `now` is its
/// "current time" expression and `plus("$n")` its "now + $n milliseconds".
pub(crate) struct Common {
    /// $1 token, $2 lease ms, {ids}
    pub claim_update: String,
    /// Finishing a batch claimed under a lease: fenced by its token.
    pub finish: Finish,
    /// Finishing a batch whose rows the claim's open transaction holds locked
    /// ([`crate::ClaimMode::Lock`]): they are still PENDING.
    pub finish_held: Finish,
    /// {ids}
    pub recover: String,
    pub delete_outbox: String,
    pub delete_dlq: String,
    pub copy_to_dlq: String,
    pub copy_to_outbox: String,
    /// $1 TTL ms, {ids}
    pub delete_inbox: String,
    /// $1 owner, $2 lease ms, $3 name -> affected rows 1 when taken
    pub lock_take: String,
    /// $1 name, $2 owner
    pub unlock: String,
    /// $1 to, {from} literal list, {ids}
    pub dlq_set_status: String,
    /// {from} literal list, {ids}
    pub dlq_delete_status: String,
}

/// `id IN ({ids})`, the way most dialects finish a batch by its ids.
pub(crate) const IDS_IN: &str = "id IN ({ids})";

/// The statements of [`Common`] for a dialect whose clock is `now`, whose "now + n
/// ms" is `plus`, and whose finish statements pick their rows with `finish_ids`
/// (usually [`IDS_IN`]).
pub(crate) fn common(t: &Tables, now: &str, plus: fn(&str) -> String, finish_ids: &str) -> Common {
    let (o, d, l, i) = (&t.outbox, &t.dlq, &t.locks, &t.inbox);
    Common {
        claim_update: format!(
            "UPDATE {o} SET status = 'IN_PROCESS', claim_token = $1, lease_until = {} WHERE id IN ({{ids}})",
            plus("$2")
        ),
        // A row holds a claim token exactly while it is IN_PROCESS (every way out
        // clears it), so the token alone fences. Naming the status as well would let
        // PostgreSQL pick the in-process partial index and step over every dead
        // entry in it instead of looking the ids up in the primary key.
        finish: Finish::new(o, now, plus, finish_ids, "claim_token = $1", "claim_token = $5"),
        // a held claim's rows are locked by its transaction: nothing else changes
        // them, and naming their status would again pick the pending index
        finish_held: Finish::new(o, now, plus, finish_ids, "1 = 1", "1 = 1"),
        recover: format!(
            "UPDATE {o} SET status = 'PENDING', claim_token = NULL, lease_until = NULL \
             WHERE status = 'IN_PROCESS' AND id IN ({{ids}})"
        ),
        delete_outbox: format!("DELETE FROM {o} WHERE id IN ({{ids}})"),
        delete_dlq: format!("DELETE FROM {d} WHERE id IN ({{ids}})"),
        copy_to_dlq: format!(
            "INSERT INTO {d} (id, event_type, event_key, headers, payload, attempts, last_error, status, \
               created_at, moved_at, updated_at) \
             SELECT id, event_type, event_key, headers, payload, attempts, last_error, 'DEAD', created_at, \
               {now}, {now} FROM {o} WHERE id IN ({{ids}})"
        ),
        copy_to_outbox: format!(
            "INSERT INTO {o} (id, event_type, event_key, headers, payload, status, attempts, next_attempt_at, \
               last_error, created_at) \
             SELECT id, event_type, event_key, headers, payload, 'PENDING', 0, {now}, last_error, created_at \
             FROM {d} WHERE id IN ({{ids}})"
        ),
        // an event's row of each consumer expires on its own
        delete_inbox: format!(
            "DELETE FROM {i} WHERE consumed_at < {} AND event_id IN ({{ids}})",
            ago(plus, "$1")
        ),
        lock_take: format!(
            "UPDATE {l} SET owner = $1, locked_at = {now}, locked_until = {} \
             WHERE name = $3 AND (locked_until < {now} OR owner = $1)",
            plus("$2")
        ),
        unlock: format!("DELETE FROM {l} WHERE name = $1 AND owner = $2"),
        dlq_set_status: format!(
            "UPDATE {d} SET status = $1, updated_at = {now} WHERE status IN ({{from}}) AND id IN ({{ids}})"
        ),
        dlq_delete_status: format!("DELETE FROM {d} WHERE status IN ({{from}}) AND id IN ({{ids}})"),
    }
}

/// The statements a held claim adds to `claim_select` and [`Common::finish_held`].
pub(crate) struct HoldClaim {
    /// Opens the transaction and has the database end the session once it idled
    /// in it for `{ms}` milliseconds.
    pub open: &'static str,
    /// $1 type -> a row when a due PENDING event may be there (no lock taken), so an
    /// idle type costs one statement per poll, not a transaction of three.
    pub probe: String,
    /// A value as an SQL literal: the claim and the finish go as one
    /// script each (one round trip), their values written into the SQL.
    pub literal: fn(&Val) -> String,
    /// The claim when acked rows are deleted: `claim_select`'s rows deleted in the
    /// held transaction, returning its columns and then `created_at` as text
    /// ($1 type, $2 after, $3 limit).
    pub claim_delete: String,
    /// Writes back a row that such a claim deleted and the broker did not ack:
    /// $1 status, $2 delay ms, $3 error, $4 id (as [`Finish::failed`]), then the
    /// claimed row's $5 type, $6 key, $7 headers, $8 payload, $9 attempts (this
    /// one included when it counts), $10 created_at.
    pub restore: String,
}

/// `template` with `{ids}` and every `$n` written out as literals of `fixed ++ ids`.
fn inline(template: &str, fixed: &[Val], ids: &[Val], literal: fn(&Val) -> String) -> String {
    let all: Vec<&Val> = fixed.iter().chain(ids).collect();
    placeholders(&expand_ids(template, fixed.len(), ids.len()), |n| {
        all.get(n - 1).map_or("NULL".into(), |v| literal(v))
    })
}

/// Every statement of one dialect, with the table names filled in.
pub(crate) struct Dialect {
    pub style: Style,
    /// Opens a transaction ("BEGIN", "START TRANSACTION", "BEGIN IMMEDIATE"; "" when
    /// the driver is always in one).
    pub begin: &'static str,
    /// The schema files in order (with `{prefix}`): the first (`001`) is the
    /// idempotent baseline, applied on every migration; file n (from 2 on) is
    /// applied once, when the version table does not list n yet, and records n
    /// there as its last statement.
    pub schema: &'static [&'static str],
    /// DDL runs inside a transaction (PostgreSQL, SQLite): a migration is all or
    /// nothing. Elsewhere each DDL statement commits on its own.
    pub transactional_ddl: bool,
    /// Serializes concurrent migrations (PostgreSQL's advisory lock), run in the
    /// migration's transaction.
    pub migrate_lock: Option<&'static str>,
    /// DDL errors meaning "already there" (a table, index, column or key that
    /// exists, a key already dropped, a version already recorded), passed over
    /// where the dialect has no IF NOT EXISTS or no transactional DDL.
    pub exists_errors: &'static [&'static str],
    /// A statement that touches no table, for [`crate::Store::ping`].
    pub ping: &'static str,
    /// Largest `{ids}` list per statement.
    pub max_ids: usize,
    /// The statements every dialect writes alike.
    pub common: Common,
    /// One-statement claim with RETURNING ($1 type, $2 limit, $3 token, $4 lease ms,
    /// $5 only ids above this one); without it: `claim_select` then `claim_update` in
    /// a transaction.
    pub claim_returning: Option<String>,
    /// The statements of a held claim ([`crate::ClaimMode::Lock`]); `None`: the
    /// dialect cannot hold claims.
    pub hold_claim: Option<HoldClaim>,
    /// $1 type, $2 only ids above this one, $3 limit (Oracle limits by fetching)
    /// -> id, type, key, headers, payload, attempts
    pub claim_select: String,
    /// $1 limit (and $2 TTL in ms for the cleanups) -> id, for each maintenance selection
    pub select_expired: String,
    pub select_processed: String,
    pub select_failed: String,
    pub select_retry: String,
    pub select_resolved: String,
    pub select_inbox_expired: String,
    /// $1 name, $2 owner, $3 lease ms (insert if absent, never fails on conflict)
    pub lock_insert: String,
    /// $1 type, $2 status, $3 limit, $4 offset
    pub dlq_list: String,
    /// $1 type, $2 status
    pub dlq_count: String,
    /// $1 id
    pub dlq_get: String,
    /// $1 id -> a row when this transaction could lock it (skips a locked row)
    pub dlq_lock: String,
    /// -> type, pending, in process, failed, oldest pending age in seconds
    pub status: String,
    /// $1 consumer, $2 id -> affected rows 1 when new (for this consumer, and
    /// not recorded before the per-consumer key by the consumer `'*'`)
    pub inbox_insert: String,
    /// `INSERT INTO outbox (id, event_type, event_key, headers, payload) VALUES `
    pub insert_events: String,
    /// one row of `insert_events`, with `$1`..`$5`
    pub insert_event_row: String,
    /// between rows (", "; Oracle's INSERT ALL: " ")
    pub insert_events_sep: &'static str,
    /// after the last row ("" ; Oracle: " SELECT 1 FROM dual")
    pub insert_events_suffix: &'static str,
}

/// The statements of `dialect` for `t`, built once per process and table prefix
/// (publish and the inbox ask for them on every call).
pub(crate) fn cached(
    dialect: &'static str,
    t: &Tables,
    build: fn(&Tables) -> Dialect,
) -> std::sync::Arc<Dialect> {
    use std::collections::HashMap;
    use std::sync::{Arc, LazyLock, Mutex};
    // dialect -> table prefix -> statements; a hit allocates nothing
    type Cache = Mutex<HashMap<&'static str, HashMap<String, Arc<Dialect>>>>;
    static CACHE: LazyLock<Cache> = LazyLock::new(Default::default);
    let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
    let by_prefix = cache.entry(dialect).or_default();
    if let Some(d) = by_prefix.get(t.prefix.as_str()) {
        return d.clone();
    }
    by_prefix
        .entry(t.prefix.clone())
        .or_insert_with(|| Arc::new(build(t)))
        .clone()
}

/// A statement rendered for one call.
pub(crate) fn run_query(
    conn: &mut dyn Conn,
    d: &Dialect,
    template: &str,
    fixed: &[Val],
    ids: &[Val],
) -> Result<Vec<Row>> {
    let (sql, params) = prepare(d, template, fixed, ids);
    conn.query(&sql, &params)
}

fn run_query_max(
    conn: &mut dyn Conn,
    d: &Dialect,
    template: &str,
    fixed: &[Val],
    max: usize,
) -> Result<Vec<Row>> {
    let (sql, params) = prepare(d, template, fixed, &[]);
    conn.query_max(&sql, &params, max)
}

pub(crate) fn run_execute(
    conn: &mut dyn Conn,
    d: &Dialect,
    template: &str,
    fixed: &[Val],
    ids: &[Val],
) -> Result<u64> {
    let (sql, params) = prepare(d, template, fixed, ids);
    conn.execute(&sql, &params)
}

fn prepare(d: &Dialect, template: &str, fixed: &[Val], ids: &[Val]) -> (String, Vec<Val>) {
    let (sql, order) = render(template, d.style, fixed.len(), ids.len());
    let all: Vec<&Val> = fixed.iter().chain(ids).collect();
    let params = order
        .iter()
        .filter_map(|i| all.get(*i).map(|v| (*v).clone()))
        .collect();
    (sql, params)
}

/// Runs `f` in a transaction: commits on `Ok`, rolls back on `Err`.
pub(crate) fn transaction<T>(
    conn: &mut dyn Conn,
    d: &Dialect,
    f: impl FnOnce(&mut dyn Conn) -> Result<T>,
) -> Result<T> {
    if !d.begin.is_empty() {
        conn.batch(d.begin)?;
    }
    match f(conn) {
        Ok(v) => {
            conn.batch("COMMIT")?;
            Ok(v)
        }
        Err(e) => {
            if let Err(r) = conn.batch("ROLLBACK") {
                log::debug!("txbox: rollback after an error failed too: {r}");
            }
            Err(e)
        }
    }
}

/// One statement of a finish: its template, fixed parameters and ids.
type Step<'a> = (&'a str, Vec<Val>, Vec<Val>);

/// The statements that finish a batch with `sql`: acked rows marked PROCESSED or
/// deleted, in chunks; the others one by one.
fn finish_steps<'a>(
    d: &Dialect,
    sql: &'a Finish,
    token: Uuid,
    outcomes: &[(EventId, Outcome)],
) -> Vec<Step<'a>> {
    let mut steps = Vec::new();
    for (template, want) in [
        (&sql.sent, Outcome::Sent),
        (&sql.delete, Outcome::SentDelete),
    ] {
        let ids: Vec<Val> = outcomes
            .iter()
            .filter(|(_, o)| *o == want)
            .map(|(id, _)| Val::Id(id.as_uuid()))
            .collect();
        for chunk in ids.chunks(d.max_ids) {
            steps.push((template.as_str(), vec![Val::Id(token)], chunk.to_vec()));
        }
    }
    for (id, outcome) in outcomes {
        let Some((status, delay, error, counted)) = failure(outcome) else {
            continue;
        };
        let fixed = vec![
            status.into(),
            ms(delay),
            error.into(),
            Val::Id(id.as_uuid()),
            Val::Id(token),
            Val::Int(i64::from(counted)),
        ];
        steps.push((sql.failed.as_str(), fixed, Vec::new()));
    }
    steps
}

/// What a failed send writes: the status, the delay before the next attempt, the
/// error and whether it counts an attempt; none for an acked event.
fn failure(outcome: &Outcome) -> Option<(&'static str, Duration, &str, bool)> {
    match outcome {
        Outcome::Retry { delay, error } => Some(("PENDING", *delay, error, true)),
        Outcome::Failed { error } => Some(("FAILED", Duration::ZERO, error, true)),
        Outcome::Release { error } => Some(("PENDING", Duration::ZERO, error, false)),
        Outcome::Sent | Outcome::SentDelete => None,
    }
}

/// A held claim: the connection whose open transaction locks the batch's rows.
struct HeldTx {
    conn: Box<dyn Conn + Send>,
    d: std::sync::Arc<Dialect>,
    /// The transaction is open (rolled back on drop).
    open: bool,
    /// What a deleting claim ([`HoldClaim::claim_delete`]) keeps of its rows to
    /// write back those the broker did not ack; none when the claim only locked.
    deleted: Option<Vec<Deleted>>,
}

/// A row of a deleting claim, beyond its [`Event`]: its headers as stored and its
/// creation time.
struct Deleted {
    id: EventId,
    headers: String,
    created_at: String,
}

impl HeldTx {
    /// The dialect's held-claim statements (a held claim exists only on a dialect
    /// that has them).
    fn hold(&self) -> Result<&HoldClaim> {
        self.d
            .hold_claim
            .as_ref()
            .ok_or_else(super::cannot_hold_claims)
    }

    /// The statements that finish the batch, the commit last. The rows are locked
    /// by this transaction, so no token is needed to fence.
    fn finish_script(
        &self,
        events: &[Event],
        outcomes: &[(EventId, Outcome)],
    ) -> Result<Vec<String>> {
        let (d, hold) = (&self.d, self.hold()?);
        let steps = match &self.deleted {
            Some(rows) => restore_steps(&hold.restore, rows, events, outcomes)?,
            None => finish_steps(d, &d.common.finish_held, Uuid::nil(), outcomes),
        };
        let mut script: Vec<String> = steps
            .iter()
            .map(|(template, fixed, ids)| inline(template, fixed, ids, hold.literal))
            .collect();
        script.push("COMMIT".into());
        Ok(script)
    }

    /// How many rows the finish changed, given its statements' counts.
    fn finished(&self, counts: &[u64], outcomes: usize) -> u64 {
        match self.deleted {
            // every row was deleted by the claim; those not acked are back
            Some(_) => outcomes as u64,
            None => counts.iter().sum(),
        }
    }

    /// The script that opens the transaction, with its idle timeout, and claims.
    fn claim_script(&self, next: &ClaimArgs<'_>) -> Result<String> {
        let hold = self.hold()?;
        let after = Val::Id(next.after.map_or(Uuid::nil(), |id| id.as_uuid()));
        let params = [next.event_type.into(), after, Val::Int(next.limit as i64)];
        let claim = if next.delete_acked {
            &hold.claim_delete
        } else {
            &self.d.claim_select
        };
        Ok(format!(
            "{}; {}",
            hold.open
                .replace("{ms}", &next.lease.as_millis().to_string()),
            inline(claim, &params, &[], hold.literal)
        ))
    }

    /// The claim's `rows` as a batch held by this open transaction; with none, the
    /// transaction is committed and there is no batch.
    fn take_claim(
        mut self: Box<Self>,
        mut rows: Vec<Row>,
        delete_acked: bool,
    ) -> Result<HeldClaim> {
        if rows.is_empty() {
            self.conn.batch("COMMIT")?;
            self.open = false;
            return Ok((Vec::new(), None));
        }
        let events = claimed_events(&mut rows)?;
        // what a write-back needs beyond the events: the stored headers and the
        // creation time (the rows' other text moved into the events)
        self.deleted = delete_acked.then(|| {
            rows.into_iter()
                .map(|mut r| Deleted {
                    id: r.id(0).unwrap_or_default(),
                    headers: r.take_text(3).unwrap_or_default(),
                    created_at: r.take_text(6).unwrap_or_default(),
                })
                .collect()
        });
        Ok((events, Some(self)))
    }
}

impl HeldBatch for HeldTx {
    fn finish(
        mut self: Box<Self>,
        events: &[Event],
        outcomes: &[(EventId, Outcome)],
    ) -> Result<u64> {
        // the statements and the commit go in one round trip
        let script = self.finish_script(events, outcomes)?;
        let done = self.conn.script(&script.join("; "))?;
        self.open = false;
        Ok(self.finished(&done.counts, outcomes.len()))
    }

    fn finish_and_claim(
        mut self: Box<Self>,
        events: &[Event],
        outcomes: &[(EventId, Outcome)],
        next: &ClaimArgs<'_>,
    ) -> Result<(u64, Option<HeldClaim>)> {
        // the finish, its commit, the next transaction and its claim: one round
        // trip; should any statement fail, the drop rolls back what is open
        let mut script = self.finish_script(events, outcomes)?;
        let statements = script.len() - 1;
        script.push(self.claim_script(next)?);
        let done = self.conn.script(&script.join("; "))?;
        let counts = &done.counts[..statements.min(done.counts.len())];
        let finished = self.finished(counts, outcomes.len());
        Ok((
            finished,
            Some(self.take_claim(done.rows, next.delete_acked)?),
        ))
    }
}

/// The statements that write back the events of a deleting claim (its `events`,
/// and what it kept of their rows) that the broker did not ack: one
/// [`HoldClaim::restore`] each.
fn restore_steps<'a>(
    restore: &'a str,
    rows: &[Deleted],
    events: &[Event],
    outcomes: &[(EventId, Outcome)],
) -> Result<Vec<Step<'a>>> {
    let mut steps = Vec::new();
    for (id, outcome) in outcomes {
        let Some((status, delay, error, counted)) = failure(outcome) else {
            continue;
        };
        let (Some(row), Some(e)) = (
            rows.iter().find(|r| r.id == *id),
            events.iter().find(|e| e.id == *id),
        ) else {
            return Err(Error::InvalidInput(format!(
                "event {id} is not in the held batch"
            )));
        };
        let fixed = vec![
            status.into(),
            ms(delay),
            error.into(),
            Val::Id(id.as_uuid()),
            e.event_type.as_str().into(),
            e.key.as_deref().into(),
            row.headers.as_str().into(),
            e.payload.as_str().into(),
            Val::Int(i64::from(e.attempts) + i64::from(counted)),
            row.created_at.as_str().into(),
        ];
        steps.push((restore, fixed, Vec::new()));
    }
    Ok(steps)
}

impl Drop for HeldTx {
    fn drop(&mut self) {
        if self.open {
            if let Err(e) = self.conn.batch("ROLLBACK") {
                log::debug!("txbox: rolling back a held claim failed: {e}");
            }
        }
    }
}

/// The ids in the first column of `rows`, as parameters.
fn id_vals(rows: &[Row]) -> Result<Vec<Val>> {
    rows.iter()
        .map(|r| r.id(0).map(|i| Val::Id(i.as_uuid())))
        .collect()
}

fn ms(d: Duration) -> Val {
    Val::Float(d.as_secs_f64() * 1000.0)
}

fn ids_of(ids: &[EventId]) -> Vec<Val> {
    ids.iter().map(|i| Val::Id(i.as_uuid())).collect()
}

fn status_list(s: &[DlqStatus]) -> String {
    // enum names, never user input
    s.iter()
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn parse_headers(text: &str) -> BTreeMap<String, String> {
    if text == "{}" {
        return BTreeMap::new(); // most events have none
    }
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

pub(crate) fn headers_json(h: &BTreeMap<String, String>) -> String {
    serde_json::to_string(h).unwrap_or_else(|_| "{}".into())
}

/// The event of a claimed row (id, type, key, headers, payload, attempts), its
/// text moved out of the row.
fn event_row(r: &mut Row) -> Result<Event> {
    let id = r.id(0)?;
    // parsed once: later reads of the id find it as such
    r.0[0] = Val::Id(id.as_uuid());
    let headers = match r.get(3) {
        Val::Text(text) => parse_headers(text),
        _ => parse_headers(&r.text(3)),
    };
    Ok(Event {
        id,
        event_type: r.take_text(1).unwrap_or_default(),
        destination: String::new(),
        routing_key: String::new(),
        key: r.take_text(2),
        headers,
        payload: r.take_text(4).unwrap_or_default(),
        attempts: r.int(5).max(0) as u32,
    })
}

/// The events of claimed rows, sorted by id.
fn claimed_events(rows: &mut [Row]) -> Result<Vec<Event>> {
    let mut events = rows.iter_mut().map(event_row).collect::<Result<Vec<_>>>()?;
    events.sort_by_key(|e| e.id);
    Ok(events)
}

fn dead_letter(r: &Row) -> Result<DeadLetter> {
    Ok(DeadLetter {
        id: r.id(0)?,
        event_type: r.text(1),
        key: r.opt_text(2),
        headers: parse_headers(&r.text(3)),
        payload: r.text(4),
        attempts: r.int(5).max(0) as u32,
        last_error: r.opt_text(6),
        status: r.text(7).parse().unwrap_or(DlqStatus::Dead),
        created_at: r.text(8),
        moved_at: r.text(9),
    })
}

/// Splits a migration file into statements (on `;` at line ends, comments dropped).
pub(crate) fn split_statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    for line in sql.lines() {
        let line = match line.find("--") {
            Some(i) => &line[..i],
            None => line,
        };
        if line.trim().is_empty() {
            continue;
        }
        cur.push_str(line);
        cur.push('\n');
        if line.trim_end().ends_with(';') {
            out.push(cur.trim().trim_end_matches(';').to_owned());
            cur.clear();
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_owned());
    }
    out
}

/// Inserts new events: one multi-row `INSERT` (one round trip) per chunk.
pub(crate) fn insert_events(conn: &mut dyn Conn, d: &Dialect, events: &[NewEvent]) -> Result<()> {
    for chunk in events.chunks((d.max_ids / 5).max(1)) {
        let params: Vec<Val> = chunk.iter().flat_map(event_values).collect();
        run_execute(conn, d, &insert_events_sql(d, chunk.len()), &params, &[])?;
    }
    Ok(())
}

/// The dialect's `INSERT` of `rows` events, [`event_values`] of each in turn.
pub(crate) fn insert_events_sql(d: &Dialect, rows: usize) -> String {
    let mut template = d.insert_events.clone();
    for i in 0..rows {
        if i > 0 {
            template.push_str(d.insert_events_sep);
        }
        template.push_str(&shift(&d.insert_event_row, i * 5));
    }
    template.push_str(d.insert_events_suffix);
    template
}

/// What [`insert_events_sql`] writes of one event: id, type, key, headers, payload.
pub(crate) fn event_values(e: &NewEvent) -> [Val; 5] {
    [
        Val::Id(e.id.as_uuid()),
        Val::Text(e.event_type.clone()),
        e.key.as_deref().into(),
        Val::Text(headers_json(&e.headers)),
        Val::Text(e.payload.clone()),
    ]
}

/// Records ids; returns the new ones. The unique key decides: a conflicting insert
/// waits for the other transaction and then affects no row (or, on Oracle, fails
/// with a unique violation).
pub(crate) fn insert_inbox_ids(
    conn: &mut dyn Conn,
    d: &Dialect,
    consumer: &str,
    ids: &[EventId],
) -> Result<Vec<EventId>> {
    let mut new = Vec::new();
    for id in ids {
        let values = [consumer.into(), Val::Id(id.as_uuid())];
        match run_execute(conn, d, &d.inbox_insert, &values, &[]) {
            Ok(1) => new.push(*id),
            Ok(_) => {}
            Err(e) if is(&e, crate::error::DatabaseErrorKind::UniqueViolation) => {}
            Err(e) => return Err(e),
        }
    }
    Ok(new)
}

/// A [`Store`] on any dialect.
pub(crate) struct SqlStore<P: Pool> {
    pub(crate) pool: P,
    pub(crate) tables: Tables,
    pub(crate) d: std::sync::Arc<Dialect>,
}

impl<P: Pool> SqlStore<P> {
    /// Selects up to `limit` ids with `select` ($1 limit, $2 the TTL in ms when
    /// given) and applies each of `apply` (`apply_fixed`, then {ids}) to them, in one
    /// transaction that is retried on a deadlock; returns how many.
    fn select_apply(
        &self,
        what: &str,
        select: &str,
        limit: usize,
        ttl: Option<Duration>,
        apply: &[&str],
        apply_fixed: &[Val],
    ) -> Result<u64> {
        let d = &self.d;
        let mut fixed = vec![Val::Int(limit as i64)];
        fixed.extend(ttl.map(ms));
        self.with_retry(what, || {
            let mut conn = self.pool.get()?;
            transaction(&mut *conn, d, |c| {
                let ids = id_vals(&run_query_max(c, d, select, &fixed, limit)?)?;
                for chunk in ids.chunks(d.max_ids) {
                    for stmt in apply {
                        run_execute(c, d, stmt, apply_fixed, chunk)?;
                    }
                }
                Ok(ids.len() as u64)
            })
        })
    }

    /// Runs `stmt` (`fixed`, then one id as `{ids}`) on each dead letter of `ids` in
    /// one transaction; returns those it changed. One statement per id: the affected
    /// count tells which changed, on every dialect. A dead letter another instance
    /// holds is skipped, not waited for.
    fn each_dead_letter(&self, ids: &[EventId], stmt: &str, fixed: &[Val]) -> Result<Vec<EventId>> {
        let d = &self.d;
        let mut conn = self.pool.get()?;
        let mut changed = Vec::new();
        transaction(&mut *conn, d, |c| {
            for id in ids {
                let one = ids_of(&[*id]);
                if run_query(c, d, &d.dlq_lock, &one, &[])?.is_empty() {
                    continue;
                }
                if run_execute(c, d, stmt, fixed, &one)? == 1 {
                    changed.push(*id);
                }
            }
            Ok(())
        })?;
        Ok(changed)
    }

    fn with_retry<T>(&self, what: &str, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        let mut attempt = 0;
        loop {
            match f() {
                Err(e) if e.is_retryable() && attempt < 5 => {
                    attempt += 1;
                    log::debug!("txbox: {what}: {e}; retrying ({attempt})");
                    std::thread::sleep(Duration::from_millis(5 * attempt + fastrand::u64(0..10)));
                }
                other => return other,
            }
        }
    }
}

impl<P: Pool> Store for SqlStore<P> {
    fn migrate(&self) -> Result<()> {
        let d = &self.d;
        let mut conn = self.pool.get()?;
        let Some((baseline, upgrades)) = d.schema.split_first() else {
            return Ok(());
        };
        let version_query = format!(
            "SELECT COALESCE(MAX(version), 0) FROM {}",
            self.tables.schema_version
        );
        // Runs a file's statements. An error that says its change is there
        // already is passed over: the baseline is idempotent that way where the
        // dialect has no IF NOT EXISTS, and where DDL is not transactional an
        // upgrade that stopped half-way (or that another instance applies at
        // the same time) goes on from where it is.
        let run = |c: &mut dyn Conn, file: &str| -> Result<()> {
            for stmt in split_statements(&self.tables.render(file)) {
                match c.batch(&stmt) {
                    Ok(()) => {}
                    Err(e)
                        if d.exists_errors
                            .iter()
                            .any(|code| e.to_string().contains(code)) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        };
        // the baseline, then each version not yet recorded (each file records
        // itself); in one transaction where DDL is transactional (PostgreSQL,
        // SQLite), whose lock makes one migrator at a time
        let upgrade = |c: &mut dyn Conn| -> Result<()> {
            if let Some(lock) = d.migrate_lock {
                c.batch(lock)?;
            }
            run(c, baseline)?;
            let at = run_query(c, d, &version_query, &[], &[])?
                .first()
                .map_or(0, |r| r.int(0));
            for (version, file) in (2_i64..).zip(upgrades) {
                if version <= at {
                    continue;
                }
                run(c, file).inspect_err(|e| {
                    log::error!("txbox: applying schema version {version}: {e}")
                })?;
                log::info!(
                    "txbox: schema of prefix {:?} upgraded to version {version}",
                    self.tables.prefix
                );
            }
            Ok(())
        };
        if d.transactional_ddl {
            transaction(&mut *conn, d, upgrade)
        } else {
            upgrade(&mut *conn)
        }
    }

    fn claim_after(
        &self,
        event_type: &str,
        after: Option<EventId>,
        limit: usize,
        lease: Duration,
        token: Uuid,
    ) -> Result<Vec<Event>> {
        // no lower bound: the nil id, below every UUIDv7
        let after = Val::Id(after.map_or(Uuid::nil(), |id| id.as_uuid()));
        let d = &self.d;
        let mut rows = self.with_retry("claim", || {
            let mut conn = self.pool.get()?;
            if let Some(one) = &d.claim_returning {
                let fixed = [
                    event_type.into(),
                    Val::Int(limit as i64),
                    Val::Id(token),
                    ms(lease),
                    after.clone(),
                ];
                return run_query(&mut *conn, d, one, &fixed, &[]);
            }
            transaction(&mut *conn, d, |c| {
                let rows = run_query_max(
                    c,
                    d,
                    &d.claim_select,
                    &[event_type.into(), after.clone(), Val::Int(limit as i64)],
                    limit,
                )?;
                if !rows.is_empty() {
                    let ids = id_vals(&rows)?;
                    run_execute(
                        c,
                        d,
                        &d.common.claim_update,
                        &[Val::Id(token), ms(lease)],
                        &ids,
                    )?;
                }
                Ok(rows)
            })
        })?;
        claimed_events(&mut rows)
    }

    fn finish(&self, token: Uuid, outcomes: &[(EventId, Outcome)]) -> Result<u64> {
        let d = &self.d;
        let steps = finish_steps(d, &d.common.finish, token, outcomes);
        let apply = |c: &mut dyn Conn| -> Result<u64> {
            let mut changed = 0;
            for (template, fixed, ids) in &steps {
                changed += run_execute(c, d, template, fixed, ids)?;
            }
            Ok(changed)
        };
        // sent rows and failed rows change together, so a retried deadlock cannot
        // count rows finished by the first try as lost; the all-sent batch (the common
        // case) is one statement without a transaction around it
        self.with_retry("finish", || {
            let mut conn = self.pool.get()?;
            if steps.len() <= 1 {
                apply(&mut *conn)
            } else {
                transaction(&mut *conn, d, apply)
            }
        })
    }

    fn can_hold_claims(&self) -> bool {
        self.d.hold_claim.is_some()
    }

    fn max_connections(&self) -> Option<usize> {
        self.pool.max_size()
    }

    fn table_prefix(&self) -> Option<&str> {
        Some(&self.tables.prefix)
    }

    fn claim_held(&self, args: &ClaimArgs<'_>) -> Result<HeldClaim> {
        let d = &self.d;
        let Some(hold) = &d.hold_claim else {
            return Err(super::cannot_hold_claims());
        };
        let mut held = HeldTx {
            conn: self.pool.get_owned()?,
            d: d.clone(),
            open: false,
            deleted: None,
        };
        // not resuming a backlog: maybe there is nothing to claim (an idle type)
        if args.after.is_none()
            && run_query(
                &mut *held.conn,
                d,
                &hold.probe,
                &[args.event_type.into()],
                &[],
            )?
            .is_empty()
        {
            return Ok((Vec::new(), None));
        }
        // the transaction, its idle timeout and the locking claim: one round trip
        let script = held.claim_script(args)?;
        // marked open first: should a statement fail, the drop rolls back
        held.open = true;
        let rows = held.conn.script(&script)?.rows;
        Box::new(held).take_claim(rows, args.delete_acked)
    }

    fn recover_expired(&self, limit: usize) -> Result<u64> {
        let c = &self.d.common;
        self.select_apply(
            "recovery",
            &self.d.select_expired,
            limit,
            None,
            &[&c.recover],
            &[],
        )
    }

    fn delete_processed(&self, ttl: Duration, limit: usize) -> Result<u64> {
        let c = &self.d.common;
        self.select_apply(
            "cleanup",
            &self.d.select_processed,
            limit,
            Some(ttl),
            &[&c.delete_outbox],
            &[],
        )
    }

    fn move_failed_to_dlq(&self, limit: usize) -> Result<u64> {
        let c = &self.d.common;
        let steps = [&c.delete_dlq, &c.copy_to_dlq, &c.delete_outbox].map(String::as_str);
        self.select_apply(
            "move to DLQ",
            &self.d.select_failed,
            limit,
            None,
            &steps,
            &[],
        )
    }

    fn requeue_dlq_retries(&self, limit: usize) -> Result<u64> {
        let c = &self.d.common;
        let steps = [&c.delete_outbox, &c.copy_to_outbox, &c.delete_dlq].map(String::as_str);
        self.select_apply("DLQ retry", &self.d.select_retry, limit, None, &steps, &[])
    }

    fn delete_resolved_dlq(&self, ttl: Duration, limit: usize) -> Result<u64> {
        let c = &self.d.common;
        self.select_apply(
            "DLQ cleanup",
            &self.d.select_resolved,
            limit,
            Some(ttl),
            &[&c.delete_dlq],
            &[],
        )
    }

    fn try_lock(&self, name: &str, owner: Uuid, lease: Duration) -> Result<bool> {
        let d = &self.d;
        self.with_retry("lock", || {
            let mut conn = self.pool.get()?;
            transaction(&mut *conn, d, |c| {
                match run_execute(
                    c,
                    d,
                    &d.lock_insert,
                    &[name.into(), Val::Id(owner), ms(lease)],
                    &[],
                ) {
                    Ok(_) => {}
                    Err(e) if is(&e, crate::error::DatabaseErrorKind::UniqueViolation) => {} // inserted concurrently: fine
                    Err(e) => return Err(e),
                }
                Ok(run_execute(
                    c,
                    d,
                    &d.common.lock_take,
                    &[Val::Id(owner), ms(lease), name.into()],
                    &[],
                )? == 1)
            })
        })
    }

    fn unlock(&self, name: &str, owner: Uuid) -> Result<()> {
        let mut conn = self.pool.get()?;
        run_execute(
            &mut *conn,
            &self.d,
            &self.d.common.unlock,
            &[name.into(), Val::Id(owner)],
            &[],
        )?;
        Ok(())
    }

    fn dlq_list(&self, f: &DlqFilter) -> Result<Vec<DeadLetter>> {
        let mut conn = self.pool.get()?;
        let fixed = [
            f.event_type.as_deref().into(),
            f.status.map(|s| s.as_str()).into(),
            Val::Int(f.limit as i64),
            Val::Int(f.offset as i64),
        ];
        run_query(&mut *conn, &self.d, &self.d.dlq_list, &fixed, &[])?
            .iter()
            .map(dead_letter)
            .collect()
    }

    fn ping(&self) -> Result<()> {
        let mut conn = self.pool.get()?;
        run_query(&mut *conn, &self.d, self.d.ping, &[], &[]).map(|_| ())
    }

    fn dlq_count(&self, f: &DlqFilter) -> Result<u64> {
        let mut conn = self.pool.get()?;
        let fixed = [
            f.event_type.as_deref().into(),
            f.status.map(|s| s.as_str()).into(),
        ];
        let rows = run_query(&mut *conn, &self.d, &self.d.dlq_count, &fixed, &[])?;
        Ok(rows.first().map(|r| r.int(0)).unwrap_or(0).max(0) as u64)
    }

    fn dlq_get(&self, id: EventId) -> Result<Option<DeadLetter>> {
        let mut conn = self.pool.get()?;
        let rows = run_query(
            &mut *conn,
            &self.d,
            &self.d.dlq_get,
            &[Val::Id(id.as_uuid())],
            &[],
        )?;
        rows.first().map(dead_letter).transpose()
    }

    fn dlq_set_status(
        &self,
        ids: &[EventId],
        from: &[DlqStatus],
        to: DlqStatus,
    ) -> Result<Vec<EventId>> {
        let update = self
            .d
            .common
            .dlq_set_status
            .replace("{from}", &status_list(from));
        self.each_dead_letter(ids, &update, &[to.as_str().into()])
    }

    fn dlq_delete(&self, ids: &[EventId], from: &[DlqStatus]) -> Result<Vec<EventId>> {
        let delete = self
            .d
            .common
            .dlq_delete_status
            .replace("{from}", &status_list(from));
        self.each_dead_letter(ids, &delete, &[])
    }

    fn status(&self) -> Result<Vec<TypeStatus>> {
        let mut conn = self.pool.get()?;
        Ok(run_query(&mut *conn, &self.d, &self.d.status, &[], &[])?
            .iter()
            .map(|r| TypeStatus {
                event_type: r.text(0),
                pending: r.int(1).max(0) as u64,
                in_process: r.int(2).max(0) as u64,
                failed: r.int(3).max(0) as u64,
                oldest_pending_age: r.opt_float(4).map(|s| Duration::from_secs_f64(s.max(0.0))),
            })
            .collect())
    }

    fn inbox_insert(&self, consumer: &str, ids: &[EventId]) -> Result<Vec<EventId>> {
        let d = &self.d;
        let mut conn = self.pool.get()?;
        transaction(&mut *conn, d, |c| insert_inbox_ids(c, d, consumer, ids))
    }

    fn delete_expired_inbox(&self, ttl: Duration, limit: usize) -> Result<u64> {
        let c = &self.d.common;
        self.select_apply(
            "inbox cleanup",
            &self.d.select_inbox_expired,
            limit,
            Some(ttl),
            &[&c.delete_inbox],
            &[ms(ttl)],
        )
    }
}

/// `publish` and the inbox on one driver's transaction type: both only need this
/// dialect's statements (built once per table prefix) and a [`Conn`].
macro_rules! transaction_impls {
    ($tx:ty, $name:literal, $dialect:path $(, $check:path)?) => {
        impl crate::outbox::sealed::Sealed for $tx {}

        impl crate::outbox::OutboxTransaction for $tx {
            fn insert_events(&mut self, tables: &Tables, events: &[NewEvent]) -> Result<()> {
                $($check(self)?;)?
                sql::insert_events(self, &sql::cached($name, tables, $dialect), events)
            }
        }

        impl crate::inbox::sealed::Sealed for $tx {}

        impl crate::inbox::InboxTransaction for $tx {
            fn insert_new_ids(
                &mut self,
                tables: &Tables,
                consumer: &str,
                ids: &[EventId],
            ) -> Result<Vec<EventId>> {
                $($check(self)?;)?
                sql::insert_inbox_ids(self, &sql::cached($name, tables, $dialect), consumer, ids)
            }
        }
    };
}
pub(crate) use transaction_impls;

#[cfg(test)]
impl Dialect {
    /// Every statement template of the dialect, named.
    fn statements(&self) -> Vec<(String, String)> {
        let c = &self.common;
        let mut out: Vec<(&str, &str)> = vec![
            ("claim_select", &self.claim_select),
            ("select_expired", &self.select_expired),
            ("select_processed", &self.select_processed),
            ("select_failed", &self.select_failed),
            ("select_retry", &self.select_retry),
            ("select_resolved", &self.select_resolved),
            ("select_inbox_expired", &self.select_inbox_expired),
            ("lock_insert", &self.lock_insert),
            ("dlq_list", &self.dlq_list),
            ("dlq_count", &self.dlq_count),
            ("dlq_get", &self.dlq_get),
            ("dlq_lock", &self.dlq_lock),
            ("status", &self.status),
            ("inbox_insert", &self.inbox_insert),
            ("insert_event_row", &self.insert_event_row),
            ("claim_update", &c.claim_update),
            ("recover", &c.recover),
            ("delete_outbox", &c.delete_outbox),
            ("delete_dlq", &c.delete_dlq),
            ("copy_to_dlq", &c.copy_to_dlq),
            ("copy_to_outbox", &c.copy_to_outbox),
            ("delete_inbox", &c.delete_inbox),
            ("lock_take", &c.lock_take),
            ("unlock", &c.unlock),
            ("dlq_set_status", &c.dlq_set_status),
            ("dlq_delete_status", &c.dlq_delete_status),
        ];
        for (name, f) in [("finish", &c.finish), ("finish_held", &c.finish_held)] {
            out.push((name, &f.sent));
            out.push((name, &f.delete));
            out.push((name, &f.failed));
        }
        if let Some(r) = &self.claim_returning {
            out.push(("claim_returning", r));
        }
        if let Some(h) = &self.hold_claim {
            out.push(("hold_claim.probe", &h.probe));
            out.push(("hold_claim.claim_delete", &h.claim_delete));
            out.push(("hold_claim.restore", &h.restore));
        }
        out.into_iter()
            .map(|(n, t)| (n.to_string(), t.to_string()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The statement the database runs when the driver binds `bound` to `sql`,
    /// written out with each value in its place: PostgreSQL (`$n`) and SQLite
    /// (`?n`) bind by number; MySQL (`?`) and Oracle bind by position, the order
    /// the placeholders appear in, whatever an Oracle placeholder is named.
    fn as_the_database_binds(sql: &str, style: Style, bound: &[&Val]) -> String {
        let show = |v: &Val| format!("<{v:?}>");
        let mut out = String::new();
        let mut chars = sql.chars().peekable();
        let mut position = 0;
        while let Some(c) = chars.next() {
            let marker = match style {
                Style::Dollar => '$',
                Style::Question | Style::QuestionNumbered => '?',
                Style::Colon => ':',
            };
            let numbered = chars.peek().is_some_and(char::is_ascii_digit);
            if c != marker || (style != Style::Question && !numbered) {
                out.push(c);
                continue;
            }
            let mut n = 0;
            while let Some(d) = chars.peek().and_then(|d| d.to_digit(10)) {
                n = n * 10 + d as usize;
                chars.next();
            }
            position += 1;
            let index = match style {
                Style::Dollar | Style::QuestionNumbered => n,
                Style::Question | Style::Colon => position,
            };
            out.push_str(&bound.get(index - 1).map_or("<unbound>".into(), |v| show(v)));
        }
        out
    }

    /// For every statement of every dialect, the values the store binds reach the
    /// placeholders their numbers name: the same statement as each `$n` written
    /// out as the n-th value. (Oracle binds by position: a statement that names
    /// `$2` before `$1`, or one value twice, would otherwise get the wrong ones.)
    #[test]
    fn every_statement_of_every_dialect_binds_each_value_where_its_number_says() {
        let t = Tables::new("p_").unwrap();
        let dialects: Vec<(&str, Dialect)> = vec![
            #[cfg(feature = "postgres")]
            ("postgres", super::super::postgres::dialect(&t)),
            #[cfg(feature = "mysql")]
            ("mysql", super::super::mysql::dialect(&t)),
            #[cfg(feature = "sqlite")]
            ("sqlite", super::super::sqlite::dialect(&t)),
            #[cfg(feature = "oracle")]
            ("oracle", super::super::oracle::dialect(&t)),
        ];
        let fixed: Vec<Val> = (1..=12).map(|i| Val::Int(100 + i)).collect();
        let ids = [Val::Int(901), Val::Int(902)];
        let show = |v: &Val| format!("<{v:?}>");
        let mut checked = 0;
        for (name, d) in &dialects {
            for (what, template) in d.statements() {
                let template = template.replace("{from}", "'DEAD'");
                let n_ids = if template.contains("{ids}") { 2 } else { 0 };
                let want = inline(&template, &fixed, &ids[..n_ids], show);
                let (sql, params) = prepare(d, &template, &fixed, &ids[..n_ids]);
                let bound: Vec<&Val> = params.iter().collect();
                assert_eq!(
                    as_the_database_binds(&sql, d.style, &bound),
                    want,
                    "{name} {what}: {sql}"
                );
                checked += 1;
            }
        }
        assert!(
            checked > 30 * dialects.len(),
            "{checked} statements checked"
        );
    }

    #[test]
    fn splits_statements() {
        let s =
            split_statements("-- c\nCREATE TABLE a (x int); -- t\n\nCREATE INDEX i\n ON a (x);\n");
        assert_eq!(
            s,
            vec!["CREATE TABLE a (x int)", "CREATE INDEX i\n ON a (x)"]
        );
    }

    #[test]
    fn shifts_placeholders() {
        assert_eq!(
            shift("($1, $2, $3, $4::jsonb, $5)", 100),
            "($101, $102, $103, $104::jsonb, $105)"
        );
    }

    #[test]
    fn renders_placeholders_per_style() {
        let t = "UPDATE t SET a = $2 WHERE b = $1 AND id IN ({ids}) AND c = $1";
        let (sql, order) = render(t, Style::Question, 2, 2);
        assert_eq!(
            sql,
            "UPDATE t SET a = ? WHERE b = ? AND id IN (?, ?) AND c = ?"
        );
        assert_eq!(order, vec![1, 0, 2, 3, 0]);
        // Oracle: one bind per occurrence, in the order they appear
        let (sql, order) = render(t, Style::Colon, 2, 1);
        assert_eq!(
            sql,
            "UPDATE t SET a = :1 WHERE b = :2 AND id IN (:3) AND c = :4"
        );
        assert_eq!(order, vec![1, 0, 2, 0]);
        let (_, order) = render("VALUES ($1, $2)", Style::QuestionNumbered, 3, 0);
        assert_eq!(order, vec![0, 1], "an unused last parameter is not bound");
        let (sql, _) = render(t, Style::QuestionNumbered, 2, 1);
        assert_eq!(
            sql,
            "UPDATE t SET a = ?2 WHERE b = ?1 AND id IN (?3) AND c = ?1"
        );
        let (sql, _) = render("SELECT '$x', $10", Style::Dollar, 10, 0);
        assert_eq!(sql, "SELECT '$x', $10");
    }

    #[test]
    fn inlines_every_placeholder_as_a_literal() {
        let literal = |v: &Val| match v {
            Val::Int(n) => format!("<{n}>"),
            _ => "<?>".into(),
        };
        let t = "UPDATE t SET a = $2 WHERE b = $1 AND id IN ({ids}) AND c = $7";
        let fixed = [Val::Int(1), Val::Int(2)];
        let sql = inline(t, &fixed, &[Val::Int(3), Val::Int(4)], literal);
        assert_eq!(
            sql,
            "UPDATE t SET a = <2> WHERE b = <1> AND id IN (<3>, <4>) AND c = NULL"
        );
    }
}
