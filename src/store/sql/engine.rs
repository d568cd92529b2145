//! The engine: [`SqlStore`], the [`Store`] every dialect shares.

use super::HeldTx;
use super::{
    claimed_events, dead_letter, finish_steps, id_vals, ids_of, insert_inbox_ids, is, ms,
    run_execute, run_query, run_query_max, status_list, transaction, Catalog, Conn, Dialect, Stmt,
    Val, WALK_FROM,
};
use crate::backoff::RetryBackoff;
use crate::error::Result;
use crate::event::{Event, EventId};
use crate::metrics::{Observed, StoreCall};
use crate::store::{
    BlockedKey, ClaimArgs, ClaimStore, DeadLetter, DeadLetterStore, DlqFilter, DlqStatus,
    HeldClaim, InboxStore, MaintenanceStore, Outcome, Store, Tables, TypeStatus,
};
use std::time::Duration;
use uuid::Uuid;

/// The store on a SQL database: one engine for every dialect, which only
/// varies the SQL and the driver. Use it through its aliases
/// ([`PgStore`](crate::PgStore), [`MySqlStore`](crate::MySqlStore),
/// [`SqliteStore`](crate::SqliteStore), [`OracleStore`](crate::OracleStore)),
/// opened with the configuration its tables come from, or through
/// [`Config::connect`](crate::Config::connect).
pub struct SqlStore<D: Dialect> {
    pub(crate) pool: D,
    pub(crate) tables: Tables,
    pub(crate) d: std::sync::Arc<Catalog>,
    /// How long a schema upgrade waits for a lock.
    pub(crate) migrate_lock_timeout: Duration,
    /// The configuration's observer, told how long each claim, finish and
    /// maintenance pass took.
    pub(crate) observer: Observed,
}

impl<D: Dialect> SqlStore<D> {
    /// A store on `pool` for the tables of `config`.
    pub(crate) fn with_pool(pool: D, config: &crate::Config) -> Result<Self> {
        let tables = Tables::new(config.table_prefix())?;
        let d = D::cached(&tables)?.clone();
        Ok(SqlStore {
            pool,
            tables,
            d,
            migrate_lock_timeout: config.maintenance.migrate_lock_timeout,
            observer: config.observer.clone(),
        })
    }

    /// The names of the store's tables.
    pub fn tables(&self) -> &Tables {
        &self.tables
    }

    /// [`Store::migrate`](crate::Store::migrate), without the trait in scope.
    pub fn migrate(&self) -> Result<()> {
        self.apply_migrations()
    }

    /// [`Store::pending_migrations`](crate::Store::pending_migrations),
    /// without the trait in scope.
    pub fn pending_migrations(&self) -> Result<Vec<crate::store::PendingMigration>> {
        self.pending()
    }

    /// [`Store::ping`](crate::Store::ping), without the trait in scope.
    pub fn ping(&self) -> Result<()> {
        Store::ping(self)
    }

    /// [`ClaimStore::capabilities`], without the trait in scope: what this
    /// database can do (held claims, commit notifications, a key walk,
    /// transactional DDL).
    pub fn capabilities(&self) -> crate::store::Capabilities {
        self.d.capabilities()
    }

    /// [`MaintenanceStore::status`](crate::MaintenanceStore::status), without
    /// the trait in scope.
    pub fn status(&self) -> Result<Vec<TypeStatus>> {
        MaintenanceStore::status(self)
    }

    /// Every statement template the store runs, by name, with its table names
    /// filled in: for a DBA to read and `EXPLAIN`, or for a baseline that sends
    /// the relay's own SQL by hand (the benchmark's). Placeholders are written
    /// `$1`, `$2`, ...; `{ids}` stands for a list of ids, one placeholder (or, in a
    /// held claim's scripts, one literal) each; `{ms}` in `hold_claim.open` for the
    /// lease in milliseconds; `{order}` in the claims for nothing (an unordered
    /// type) or `ordered_skip` / `ordered_block` (see [`crate::EventOrder::Key`]). The store renders them into its driver's style.
    ///
    /// ```no_run
    /// # fn main() -> txbox::Result<()> {
    /// let config = txbox::Config::builder().build()?;
    /// let store = txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", &config)?;
    /// for (name, sql) in store.statements() {
    ///     println!("{name}: {sql}");
    /// }
    /// # Ok(()) }
    /// ```
    pub fn statements(&self) -> Vec<(&'static str, String)> {
        self.d.statements()
    }

    /// Selects up to `limit` ids with `select` ($1 limit, $2 the TTL in ms when
    /// given) and applies each of `apply` (`apply_fixed`, then {ids}) to them, in one
    /// transaction that is retried on a deadlock; returns how many.
    pub(crate) fn select_apply(
        &self,
        what: &str,
        select: &Stmt,
        limit: usize,
        ttl: Option<Duration>,
        apply: &[&Stmt],
        apply_fixed: &[Val],
    ) -> Result<u64> {
        self.observer.timed(StoreCall::Maintenance, || {
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
        })
    }

    /// Runs `stmt` (`fixed`, then one id as `{ids}`) on each dead letter of `ids` in
    /// one transaction; returns those it changed. One statement per id: the affected
    /// count tells which changed, on every dialect. A dead letter another instance
    /// holds is skipped, not waited for.
    pub(crate) fn each_dead_letter(
        &self,
        ids: &[EventId],
        stmt: &Stmt,
        fixed: &[Val],
    ) -> Result<Vec<EventId>> {
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

    pub(crate) fn with_retry<T>(&self, what: &str, mut f: impl FnMut() -> Result<T>) -> Result<T> {
        // a deadlock or a lost serialization: a few short waits, spread out
        let mut waits = RetryBackoff::doubling(Duration::from_millis(5), Duration::from_millis(40))
            .jittered()
            .take(5);
        loop {
            match f() {
                Err(e) if e.is_retryable() => match waits.next() {
                    Some(wait) => {
                        log::debug!("txbox: {what}: {e}; retrying in {wait:?}");
                        std::thread::sleep(wait);
                    }
                    None => return Err(e),
                },
                other => return other,
            }
        }
    }
}

impl<D: Dialect> Store for SqlStore<D> {
    fn migrate(&self) -> Result<()> {
        self.apply_migrations()
    }

    fn pending_migrations(&self) -> Result<Vec<crate::store::PendingMigration>> {
        self.pending()
    }

    fn ping(&self) -> Result<()> {
        let mut conn = self.pool.get()?;
        run_query(&mut *conn, &self.d, &self.d.ping, &[], &[]).map(|_| ())
    }

    fn table_prefix(&self) -> &str {
        &self.tables.prefix
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
}

/// An event type given to an admin call: 1 to 255 bytes, no control
/// characters (what a configured type is).
fn plain_type(event_type: &str) -> Result<()> {
    crate::config::plain_name(event_type)
        .map_err(|why| crate::error::Error::InvalidInput(format!("event type {why}")))
}

/// The fixed parameters of a claim statement: `first`, then for an ordered
/// claim the key walk's ([`WALK_FROM`], [`WALK_LIMIT`]); what a statement does
/// not name is bound but unused.
pub(crate) fn claim_params(args: &ClaimArgs<'_>, mut first: Vec<Val>) -> Vec<Val> {
    if args.ordered.is_some() {
        first.resize(WALK_FROM - 1, Val::Null);
        first.push(Val::Text(args.from_key.unwrap_or_default().to_owned()));
        first.push(Val::Int(args.limit as i64));
    }
    first
}

/// The claim store's calls as they run, timed by [`ClaimStore`]'s methods below.
impl<D: Dialect> SqlStore<D> {
    /// [`ClaimStore::claim_after`].
    fn claim_leased(&self, args: &ClaimArgs<'_>, token: Uuid) -> Result<Vec<Event>> {
        let (event_type, limit, lease) = (args.event_type, args.limit, args.lease);
        // no lower bound: the nil id, below every UUIDv7
        let after = Val::Id(args.after.map_or(Uuid::nil(), |id| id.as_uuid()));
        let d = &self.d;
        let mut rows = self.with_retry("claim", || {
            let mut conn = self.pool.get()?;
            if let Some(one) = &d.claim_returning {
                let fixed = claim_params(
                    args,
                    vec![
                        event_type.into(),
                        Val::Int(limit as i64),
                        Val::Id(token),
                        ms(lease),
                        after.clone(),
                    ],
                );
                return run_query(&mut *conn, d, &one.claim(&d.common, args), &fixed, &[]);
            }
            transaction(&mut *conn, d, |c| {
                let mut rows = run_query_max(
                    c,
                    d,
                    &d.claim_select.claim(&d.common, args),
                    &claim_params(
                        args,
                        vec![event_type.into(), after.clone(), Val::Int(limit as i64)],
                    ),
                    limit,
                )?;
                if args.ordered.is_some() && !rows.is_empty() {
                    // MySQL's locking read sees rows committed while it scans,
                    // its look-up of earlier rows does not: a key's two events
                    // committed meanwhile could both pass. Asked again in a
                    // statement of its own, after the locks are taken, the
                    // look-up sees every committed row.
                    let kept: std::collections::HashSet<EventId> = run_query(
                        c,
                        d,
                        d.common.order_recheck.rule(&d.common, args.ordered),
                        &[event_type.into()],
                        &id_vals(&rows)?,
                    )?
                    .iter()
                    .map(|r| r.get::<EventId>(0))
                    .collect::<Result<_>>()?;
                    rows.retain(|r| r.get::<EventId>(0).is_ok_and(|id| kept.contains(&id)));
                }
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

    /// [`ClaimStore::finish`].
    fn finish_leased(&self, token: Uuid, outcomes: &[(EventId, Outcome)]) -> Result<u64> {
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

    /// [`ClaimStore::claim_held`].
    fn claim_holding(&self, args: &ClaimArgs<'_>) -> Result<HeldClaim> {
        let d = &self.d;
        let (Some(hold), Some(sessions)) = (&d.hold_claim, self.pool.sessions()) else {
            return Err(crate::store::cannot_hold_claims());
        };
        let mut held = HeldTx {
            conn: sessions.get_owned()?,
            d: d.clone(),
            observer: self.observer.clone(),
            open: false,
            deleted: None,
        };
        // not resuming a backlog: maybe there is nothing to claim (an idle type)
        if args.after.is_none()
            && run_query(
                &mut *held.conn,
                d,
                &hold.probe.claim(&d.common, args),
                &claim_params(args, vec![args.event_type.into()]),
                &[],
            )?
            .is_empty()
        {
            return Ok(HeldClaim::none());
        }
        // the transaction, its idle timeout and the locking claim: one round trip
        let script = held.claim_script(args)?;
        // marked open first: should a statement fail, the drop rolls back
        held.open = true;
        let rows = held.conn.script(&script)?.rows;
        Box::new(held).take_claim(rows, args.delete_acked)
    }
}

impl<D: Dialect> ClaimStore for SqlStore<D> {
    fn claim_after(&self, args: &ClaimArgs<'_>, token: Uuid) -> Result<Vec<Event>> {
        self.observer
            .timed(StoreCall::Claim, || self.claim_leased(args, token))
    }

    fn finish(&self, token: Uuid, outcomes: &[(EventId, Outcome)]) -> Result<u64> {
        self.observer
            .timed(StoreCall::Finish, || self.finish_leased(token, outcomes))
    }

    fn insert_mark(&self) -> Result<Option<i64>> {
        let mut conn = self.pool.get()?;
        let rows = run_query(&mut *conn, &self.d, &self.d.insert_mark, &[], &[])?;
        Ok(Some(rows.first().map_or(Ok(0), |r| r.get::<i64>(0))?))
    }

    fn capabilities(&self) -> crate::store::Capabilities {
        self.d.capabilities()
    }

    fn listen(&self) -> Result<Box<dyn crate::store::Notifications>> {
        match self.pool.sessions() {
            Some(sessions) if self.d.wake.is_some() => sessions.listen(&self.tables.outbox),
            _ => Err(crate::error::Error::Unsupported {
                what: "commit notifications".into(),
                why: "only PostgreSQL has them; wake the relay with a RelayWaker".into(),
            }),
        }
    }

    fn set_commit_wake(&self, notify: &[&str], quiet: &[&str]) -> Result<()> {
        let Some(w) = &self.d.wake else {
            return Ok(());
        };
        let d = &self.d;
        self.with_retry("setting the wake-up on commit", || {
            let mut conn = self.pool.get()?;
            transaction(&mut *conn, d, |c| {
                for (types, stmt) in [(quiet, &w.quiet), (notify, &w.loud)] {
                    for t in types {
                        run_execute(c, d, stmt, &[Val::Text((*t).to_owned())], &[])?;
                    }
                }
                Ok(())
            })
        })
    }

    fn notify_queue_usage(&self) -> Result<Option<f64>> {
        let Some(w) = &self.d.wake else {
            return Ok(None);
        };
        let mut conn = self.pool.get()?;
        let rows = run_query(&mut *conn, &self.d, &w.queue_usage, &[], &[])?;
        Ok(rows
            .first()
            .map(|r| r.get::<Option<f64>>(0))
            .transpose()?
            .flatten())
    }

    fn max_connections(&self) -> Option<usize> {
        self.pool.max_size()
    }

    fn next_due(&self, event_type: &str) -> Result<Option<Duration>> {
        let rows = self.observer.timed(StoreCall::NextDue, || {
            let mut conn = self.pool.get()?;
            let type_ = [event_type.into()];
            run_query(&mut *conn, &self.d, &self.d.next_due, &type_, &[])
        })?;
        let ms = rows
            .first()
            .map(|r| r.get::<Option<f64>>(0))
            .transpose()?
            .flatten();
        // a due time past (or NaN) is "due now"
        Ok(ms.map(|ms| {
            if ms > 0.0 {
                Duration::try_from_secs_f64(ms / 1000.0).unwrap_or(Duration::MAX)
            } else {
                Duration::ZERO
            }
        }))
    }

    fn claim_held(&self, args: &ClaimArgs<'_>) -> Result<HeldClaim> {
        self.observer
            .timed(StoreCall::Claim, || self.claim_holding(args))
    }
}

impl<D: Dialect> MaintenanceStore for SqlStore<D> {
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

    fn pause(&self, event_type: &str) -> Result<bool> {
        plain_type(event_type)?;
        let d = &self.d;
        // two pauses at once: a unique violation (paused already), or on
        // MySQL a deadlock of their gap locks, tried again
        self.with_retry("pause", || {
            let mut conn = self.pool.get()?;
            match run_execute(&mut *conn, d, &d.common.pause, &[event_type.into()], &[]) {
                Ok(n) => Ok(n == 1),
                Err(e) if is(&e, crate::error::DatabaseErrorKind::UniqueViolation) => Ok(false),
                Err(e) => Err(e),
            }
        })
    }

    fn resume(&self, event_type: &str) -> Result<bool> {
        plain_type(event_type)?;
        let d = &self.d;
        let mut conn = self.pool.get()?;
        transaction(&mut *conn, d, |c| {
            let resumed = run_execute(c, d, &d.common.resume, &[event_type.into()], &[])? == 1;
            if let (true, Some(w)) = (resumed, &d.wake) {
                run_query(c, d, &w.nudge, &[event_type.into()], &[])?;
            }
            Ok(resumed)
        })
    }

    fn paused(&self) -> Result<Vec<String>> {
        let mut conn = self.pool.get()?;
        run_query(&mut *conn, &self.d, &self.d.common.paused, &[], &[])?
            .iter()
            .map(|r| r.get::<String>(0))
            .collect()
    }

    fn status(&self) -> Result<Vec<TypeStatus>> {
        let mut conn = self.pool.get()?;
        run_query(&mut *conn, &self.d, &self.d.status, &[], &[])?
            .iter()
            .map(|r| {
                Ok(TypeStatus {
                    event_type: r.get::<String>(0)?,
                    pending: r.get::<u64>(1)?,
                    in_process: r.get::<u64>(2)?,
                    failed: r.get::<u64>(3)?,
                    // a clock a little behind the database's reads below 0
                    oldest_pending_age: r
                        .get::<Option<f64>>(4)?
                        .filter(|s| s.is_finite())
                        .map(|s| Duration::from_secs_f64(s.max(0.0))),
                })
            })
            .collect()
    }
}

impl<D: Dialect> DeadLetterStore for SqlStore<D> {
    fn move_failed_to_dlq(&self, limit: usize) -> Result<u64> {
        let c = &self.d.common;
        let steps = [&c.delete_dlq, &c.copy_to_dlq, &c.delete_outbox];
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
        let steps = [&c.delete_outbox, &c.copy_to_outbox, &c.delete_dlq];
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

    fn dlq_list(&self, f: &DlqFilter) -> Result<Vec<DeadLetter>> {
        let mut conn = self.pool.get()?;
        let fixed = [
            f.event_type.as_deref().into(),
            f.status.map(|s| s.as_str()).into(),
            Val::Int(f.limit as i64),
            Val::Int(f.offset as i64),
        ];
        run_query(&mut *conn, &self.d, &self.d.dlq_list, &fixed, &[])?
            .iter_mut()
            .map(dead_letter)
            .collect()
    }

    fn dlq_count(&self, f: &DlqFilter) -> Result<u64> {
        let mut conn = self.pool.get()?;
        let fixed = [
            f.event_type.as_deref().into(),
            f.status.map(|s| s.as_str()).into(),
        ];
        let rows = run_query(&mut *conn, &self.d, &self.d.dlq_count, &fixed, &[])?;
        rows.first().map_or(Ok(0), |r| r.get::<u64>(0))
    }

    fn blocked_keys(&self, event_type: &str, limit: usize) -> Result<Vec<BlockedKey>> {
        let d = &self.d;
        let mut conn = self.pool.get()?;
        // the rows come by key, then id: the first of each key holds it back;
        // a few per key at most are read (a key rarely has more than one)
        let rows = run_query_max(
            &mut *conn,
            d,
            &d.common.blocked_keys,
            &[event_type.into()],
            limit.saturating_mul(4),
        )?;
        let mut keys: Vec<BlockedKey> = Vec::new();
        let mut seqs = Vec::new();
        for r in &rows {
            let key = r.get::<String>(0)?;
            if keys.last().is_some_and(|k| k.key == key) {
                continue;
            }
            if keys.len() == limit {
                break;
            }
            keys.push(BlockedKey {
                event_type: event_type.to_string(),
                key,
                blocked_by: r.get::<EventId>(1)?,
                status: r.get::<String>(2)?,
                waiting: 0,
            });
            // none while schema 7 still numbers the events there: every
            // waiting event of the key counts
            seqs.push(r.get::<Option<i64>>(3)?.unwrap_or(i64::MIN));
        }
        for (k, seq) in keys.iter_mut().zip(seqs) {
            let fixed = [event_type.into(), k.key.as_str().into(), Val::Int(seq)];
            let n = run_query(&mut *conn, d, &d.common.key_waiting, &fixed, &[])?;
            k.waiting = n.first().map_or(Ok(0), |r| r.get::<u64>(0))?;
        }
        Ok(keys)
    }

    fn dlq_get(&self, id: EventId) -> Result<Option<DeadLetter>> {
        let mut conn = self.pool.get()?;
        let mut rows = run_query(
            &mut *conn,
            &self.d,
            &self.d.dlq_get,
            &[Val::Id(id.as_uuid())],
            &[],
        )?;
        rows.first_mut().map(dead_letter).transpose()
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
            .fill("{from}", &status_list(from));
        self.each_dead_letter(ids, &update, &[to.as_str().into()])
    }

    fn dlq_delete(&self, ids: &[EventId], from: &[DlqStatus]) -> Result<Vec<EventId>> {
        let delete = self
            .d
            .common
            .dlq_delete_status
            .fill("{from}", &status_list(from));
        self.each_dead_letter(ids, &delete, &[])
    }
}

impl<D: Dialect> InboxStore for SqlStore<D> {
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
/// dialect's statements (built once, kept with the tables) and a [`Conn`].
macro_rules! transaction_impls {
    ($tx:ty, $dialect:ty $(, $check:path)?) => {
        impl crate::transaction::sealed::Sealed for $tx {}

        impl crate::transaction::Transaction for $tx {
            fn insert_events(&mut self, tables: &Tables, events: &[NewEvent]) -> Result<()> {
                $($check(self)?;)?
                sql::insert_events(self, <$dialect as sql::Backend>::cached(tables)?, events)
            }

            fn insert_new_ids(
                &mut self,
                tables: &Tables,
                consumer: &str,
                ids: &[EventId],
            ) -> Result<Vec<EventId>> {
                $($check(self)?;)?
                sql::insert_inbox_ids(
                    self,
                    <$dialect as sql::Backend>::cached(tables)?,
                    consumer,
                    ids,
                )
            }
        }
    };
}
pub(crate) use transaction_impls;
