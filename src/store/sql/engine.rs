//! The engine: [`SqlStore`], the [`Store`] every dialect shares.

use super::HeldTx;
use super::{
    claimed_events, finish_steps, id_vals, insert_inbox_ids, is, ms, run_execute, run_query,
    run_query_max, transaction, Catalog, Conn, Dialect, Val, WALK_FROM,
};
use crate::backoff::RetryBackoff;
use crate::error::Result;
use crate::event::{Event, EventId};
use crate::metrics::{Observed, StoreCall};
use crate::store::{
    ClaimArgs, ClaimStore, HeldClaim, InboxStore, MaintenanceStore, Outcome, Store, Tables,
    TypeStatus,
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
    /// Where each unordered type's claims start ([`FloorSql`]).
    pub(crate) floors: super::Floors,
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
            floors: super::Floors::default(),
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
            if let (Some(f), None, None) = (&d.floors, args.ordered, args.after) {
                let ready = self
                    .floors
                    .schema_ready(|| Ok(self.schema_version(&mut *conn)? >= f.since))?;
                if ready {
                    return self.claim_floored(f, args, token, &mut *conn);
                }
            }
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

    fn release_claims(&self, tokens: &[Uuid]) -> Result<u64> {
        let d = &self.d;
        let tokens: Vec<Val> = tokens.iter().map(|t| Val::Id(*t)).collect();
        self.observer.timed(StoreCall::Finish, || {
            let mut conn = self.pool.get()?;
            let mut released = 0;
            for chunk in tokens.chunks(d.max_ids.max(1)) {
                released += run_execute(&mut *conn, d, &d.common.release_claims, &[], chunk)?;
            }
            Ok(released)
        })
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
            // from the floor once one is known (until then as 0.3 asked)
            if let (Some(f), Some(floor)) = (&self.d.floors, self.floors.floor(event_type)) {
                let params = [event_type.into(), Val::Int(floor)];
                return run_query(&mut *conn, &self.d, &f.next_due, &params, &[]);
            }
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
                sql::insert_events(self, <$dialect as sql::Driver>::cached(tables)?, events)
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
                    <$dialect as sql::Driver>::cached(tables)?,
                    consumer,
                    ids,
                )
            }
        }
    };
}
pub(crate) use transaction_impls;
