//! The calls of the relay's maintenance threads and of the admin APIs on
//! every SQL dialect: recovery, cleanups, the outbox's status, pauses, the
//! dead letters.

use super::{
    dead_letter, id_vals, ids_of, is, ms, run_execute, run_query, run_query_max, status_list,
    transaction, Dialect, SqlStore, Stmt, Val,
};
use crate::error::Result;
use crate::event::EventId;
use crate::metrics::StoreCall;
use crate::store::{
    BlockedKey, Compaction, DeadLetter, DeadLetterStore, DlqFilter, DlqStatus, MaintenanceStore,
    TypeStatus,
};
use std::time::Duration;

impl<D: Dialect> SqlStore<D> {
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
}

/// An event type given to an admin call: 1 to 255 bytes, no control
/// characters (what a configured type is).
fn plain_type(event_type: &str) -> Result<()> {
    crate::config::plain_name(event_type)
        .map_err(|why| crate::error::Error::InvalidInput(format!("event type {why}")))
}

impl<D: Dialect> MaintenanceStore for SqlStore<D> {
    fn recover_expired(&self, limit: usize) -> Result<u64> {
        let c = &self.d.common;
        let expired = self.select_apply(
            "recovery",
            &self.d.select_expired,
            limit,
            None,
            &[&c.recover],
            &[],
        )?;
        Ok(expired + self.sweep_below_floors(limit)?)
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

    fn compact(&self, timeout: Duration) -> Result<Option<Compaction>> {
        let d = &self.d;
        let Some(c) = &d.compact else {
            return Ok(None);
        };
        let mut conn = self.pool.get()?;
        transaction(&mut *conn, d, |conn| {
            let before = Measure::read(conn, d, &c.measure)?;
            if !before.mostly_free() {
                return Ok(None);
            }
            let ms = Val::Text(timeout.as_millis().max(1).to_string());
            run_query(conn, d, &c.bound, &[ms], &[])?;
            run_execute(conn, d, &c.rewrite, &[], &[]).map_err(|e| {
                if (c.not_owner)(&e) {
                    crate::Error::Unsupported {
                        what: "rewriting the outbox table".into(),
                        why: format!(
                            "the role does not own it (CLUSTER needs the owner; \
                             PostgreSQL 17: the MAINTAIN privilege): {e}"
                        ),
                    }
                } else {
                    e
                }
            })?;
            let after = Measure::read(conn, d, &c.measure)?;
            Ok(Some(Compaction {
                bytes_before: before.bytes,
                bytes_after: after.bytes,
            }))
        })
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

/// What [`super::CompactSql::measure`] reads of the outbox table.
struct Measure {
    pages: i64,
    /// The planner's estimate of the live rows, which VACUUM and ANALYZE
    /// write (-1: never counted); not the statistics collector's counts,
    /// which arrive late and which a reset empties.
    live: f64,
    bytes: u64,
}

impl Measure {
    /// Pages of 8 KiB below which a table is never rewritten (8 MiB).
    const MIN_PAGES: i64 = 1024;

    fn read(conn: &mut dyn super::Conn, d: &super::Catalog, measure: &Stmt) -> Result<Measure> {
        let rows = run_query(conn, d, measure, &[], &[])?;
        let row = rows
            .first()
            .ok_or_else(|| crate::Error::Internal("the outbox table's size: no row".into()))?;
        Ok(Measure {
            pages: row.get::<i64>(0)?,
            live: row.get::<f64>(1)?,
            bytes: row.get::<i64>(2)?.max(0) as u64,
        })
    }

    /// Large, with fewer live rows than pages: mostly empty space.
    fn mostly_free(&self) -> bool {
        self.pages >= Self::MIN_PAGES && (0.0..self.pages as f64).contains(&self.live)
    }
}
