//! Migrations: which schema files a database still needs, and applying them
//! without stalling the writers of a live database.

#![allow(clippy::wildcard_imports)]
use super::*;
use crate::store::PendingMigration;

impl<D: Dialect> SqlStore<D> {
    /// The last schema version recorded (an error when there is no version
    /// table yet).
    fn schema_version(&self, c: &mut dyn Conn) -> Result<i64> {
        let sql = format!(
            "SELECT COALESCE(MAX(version), 0) FROM {}",
            self.tables.schema_version
        );
        let rows = run_query(c, &self.d, &sql, &[], &[])?;
        Ok(rows.first().map_or(0, |r| r.int(0)))
    }

    /// The files a schema at version `at` runs, with their versions: none on
    /// a current schema; else the baseline (1, idempotent, before every
    /// upgrade) and each version above `at`.
    fn files_to_run(&self, at: i64) -> Vec<(i64, &'static str)> {
        let schema = self.d.schema;
        if at >= schema.len() as i64 {
            return Vec::new();
        }
        (1_i64..)
            .zip(schema.iter().copied())
            .filter(|(version, _)| *version == 1 || *version > at)
            .collect()
    }

    /// [`Store::pending_migrations`].
    pub(crate) fn pending(&self) -> Result<Vec<PendingMigration>> {
        let mut conn = self.pool.get()?;
        // no version table: the baseline creates it
        let at = self.schema_version(&mut *conn).unwrap_or(0);
        Ok(self
            .files_to_run(at)
            .into_iter()
            .map(|(version, file)| {
                let sql = self.tables.render(file);
                let title = sql.lines().next().unwrap_or_default();
                let title = title.trim_start_matches('-').trim().to_string();
                PendingMigration {
                    version,
                    title,
                    sql,
                }
            })
            .collect())
    }

    /// [`Store::migrate`]. A current schema costs one read, with no lock and
    /// no DDL: a migrate at start-up never waits behind an open transaction
    /// that wrote the outbox, nor makes the writers queue behind its own wait
    /// (the baseline's CREATE INDEX IF NOT EXISTS locks the table before it
    /// looks). Otherwise one migrator at a time (the dialect's lock), each
    /// wait for a lock bounded by `migrate_lock_timeout`.
    pub(crate) fn apply_migrations(&self) -> Result<()> {
        let d = &self.d;
        let mut conn = self.pool.get()?;
        // no version table yet: an upgrade from 0.1, or a new schema
        if self
            .schema_version(&mut *conn)
            .is_ok_and(|at| self.files_to_run(at).is_empty())
        {
            return Ok(());
        }
        let timeout = self.migrate_lock_timeout;
        // a lock wait that timed out (or a deadlock with a writer), said plainly
        let gave_up = |what: &str, e: Error| {
            if !e.is_retryable() {
                return e;
            }
            self.gave_up(what, &e.to_string())
        };
        // Runs a file's statements. An error that says its change is there
        // already is passed over: the baseline is idempotent that way where
        // the dialect has no IF NOT EXISTS, and where DDL is not transactional
        // an upgrade that stopped half-way goes on from where it is.
        let run = |c: &mut dyn Conn, file: &str| -> Result<()> {
            for stmt in split_statements(&self.tables.render(file)) {
                match c.batch(&stmt) {
                    Ok(()) => {}
                    Err(e)
                        if (d.error_code)(&e)
                            .is_some_and(|code| d.exists_errors.contains(&code)) => {}
                    Err(e) => return Err(e),
                }
            }
            Ok(())
        };
        // the files still to run once this migrator holds the lock (another
        // may have run them meanwhile); in one transaction where DDL is
        // transactional (PostgreSQL, SQLite)
        let upgrade = |c: &mut dyn Conn| -> Result<()> {
            // first: the wait for another migrator's lock is bounded too
            if let Some(t) = &d.lock_timeout {
                c.batch(&(t.set)(timeout))?;
            }
            if let Some(lock) = &d.migrate_lock {
                let what = "the lock of migrations (another one runs)";
                let got = run_query(c, d, &(lock.take)(timeout), &[], &[])
                    .map_err(|e| gave_up(what, e))?;
                if got.first().map_or(0, |r| r.int(0)) != 1 {
                    return Err(self.gave_up(what, "not taken in time"));
                }
            }
            run(c, d.schema[0]).map_err(|e| gave_up("the baseline", e))?;
            let at = self.schema_version(c)?;
            for (version, file) in self.files_to_run(at).into_iter().skip(1) {
                run(c, file).map_err(|e| {
                    let e = gave_up(&format!("schema version {version}"), e);
                    log::error!("txbox: applying schema version {version}: {e}");
                    e
                })?;
                log::info!(
                    "txbox: schema of prefix {:?} upgraded to version {version}",
                    self.tables.prefix
                );
            }
            Ok(())
        };
        let done = if d.transactional_ddl {
            transaction(&mut *conn, d, upgrade)
        } else {
            upgrade(&mut *conn)
        };
        // a session's lock and setting go before the connection returns to
        // the pool
        let session = [
            d.migrate_lock.as_ref().and_then(|l| l.release),
            d.lock_timeout.as_ref().and_then(|t| t.reset),
        ];
        for sql in session.into_iter().flatten() {
            if let Err(e) = conn.batch(sql) {
                log::warn!("txbox: migrate: {sql}: {e}");
            }
        }
        done
    }

    /// The error of a migration that waited longer than its lock timeout.
    fn gave_up(&self, what: &str, why: &str) -> Error {
        Error::database(
            crate::DatabaseErrorKind::Retryable,
            format!(
                "migrate: {what} of prefix {:?} gave up waiting for a lock within {:?} \
                 (maintenance.migrate_lock_timeout): another transaction or migration holds \
                 it; migrate again once it ended ({why})",
                self.tables.prefix, self.migrate_lock_timeout
            ),
        )
    }
}
