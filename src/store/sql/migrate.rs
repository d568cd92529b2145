//! Migrations: which schema files a database still needs, and applying them
//! without stalling the writers of a live database.

use super::{
    run_query, split_statements, transaction, Conn, Dialect, MigrateLock, OnlineIndex, SqlStore,
    Stmt,
};
use crate::backoff::RetryBackoff;
use crate::error::Error;
use crate::error::Result;
use crate::store::PendingMigration;
use std::time::Duration;

impl<D: Dialect> SqlStore<D> {
    /// The last schema version recorded: 0 where there is no version table
    /// (a new database, or txbox 0.1's) or none is recorded in it yet; any
    /// other error reading it (a lost connection, a missing grant) is an
    /// error, never taken for an empty schema.
    pub(super) fn schema_version(&self, c: &mut dyn Conn) -> Result<i64> {
        let sql = Stmt::new(format!(
            "SELECT COALESCE(MAX(version), 0) FROM {}",
            self.tables.schema_version
        ));
        let read = |c: &mut dyn Conn| {
            let rows = run_query(c, &self.d, &sql, &[], &[])?;
            rows.first().map_or(Ok(0), |r| r.get::<i64>(0))
        };
        match read(c) {
            Ok(at) => Ok(at),
            // read outside a transaction (or in SQLite's, which a failed
            // statement does not end): the connection can ask again
            Err(e) => match run_query(c, &self.d, &self.d.version_table, &[], &[]) {
                Ok(rows) if rows.is_empty() => Ok(0),
                // there now: another migrator made it meanwhile
                Ok(_) => read(c),
                Err(_) => Err(e),
            },
        }
    }

    /// The files a schema at version `at` runs, with their versions: each
    /// version above `at` (the baseline too where there is no version table,
    /// `at` 0).
    fn files_to_run(&self, at: i64) -> Vec<(i64, &'static str)> {
        (1_i64..)
            .zip(self.d.schema.iter().copied())
            .filter(|(version, _)| *version > at)
            .collect()
    }

    /// [`Store::pending_migrations`].
    pub(crate) fn pending(&self) -> Result<Vec<PendingMigration>> {
        let mut conn = self.pool.get()?;
        let at = self.schema_version(&mut *conn)?;
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
    /// (a CREATE INDEX IF NOT EXISTS locks the table before it looks).
    /// Otherwise one migrator at a time (the dialect's lock), each wait for a
    /// lock bounded by `migrate_lock_timeout`, and indexes built online
    /// where the dialect can.
    pub(crate) fn apply_migrations(&self) -> Result<()> {
        let d = &self.d;
        let mut conn = self.pool.get()?;
        if self
            .files_to_run(self.schema_version(&mut *conn)?)
            .is_empty()
        {
            return Ok(());
        }
        let timeout = self.migrate_lock_timeout;
        // where DDL is transactional and no index is built online (SQLite),
        // the whole upgrade is one transaction, which makes migrators take
        // turns; else each file's statements run in transactions of their
        // own where they can, under the dialect's lock
        let whole = d.transactional_ddl && d.online_index.is_none();
        // the files still to run once this migrator holds the lock (another
        // may have run them meanwhile)
        let upgrade = |c: &mut dyn Conn| -> Result<()> {
            // first: the wait for another migrator's lock is bounded too
            if let Some(t) = &d.lock_timeout {
                c.batch(&(t.set)(timeout))?;
            }
            if let Some(lock) = &d.migrate_lock {
                self.take_lock(c, lock)?;
            }
            // indexes of a table there already are built online; a new
            // table's in its transaction
            let online = match &d.online_index {
                Some(o) => !run_query(c, d, &o.existing, &[], &[])?.is_empty(),
                None => false,
            };
            let at = self.schema_version(c)?;
            for (version, file) in self.files_to_run(at) {
                self.run_file(c, file, !whole, online).map_err(|e| {
                    let e = self.gave_up_on(&format!("schema version {version}"), e);
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
        let done = if whole {
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

    /// Runs one schema file. Its statements run in order, each run of them
    /// (up to a `COMMIT` or an online index build) in one transaction where
    /// `in_tx` (and DDL is transactional); an online index build runs on its
    /// own, outside any, after dropping the invalid index a build that
    /// stopped left. The version is the file's
    /// last statement: recorded only once everything before it is done, so
    /// a file that stopped half-way is run again (its statements are
    /// idempotent where they are not one transaction).
    fn run_file(&self, c: &mut dyn Conn, file: &str, in_tx: bool, online: bool) -> Result<()> {
        let d = &self.d;
        let builds = |o: &OnlineIndex, s: &str| s.starts_with(o.build) || s.starts_with(o.drop);
        let mut statements = split_statements(&self.tables.render(file));
        if let (Some(o), false) = (&d.online_index, online) {
            for s in statements.iter_mut().filter(|s| builds(o, s)) {
                *s = s.replacen(o.word, "", 1);
            }
        }
        let online = d.online_index.as_ref().filter(|_| online);
        let outside = |s: &str| online.is_some_and(|o| builds(o, s));
        // where one of a file's transactions ends and the next begins
        let boundary = |s: &str| s.eq_ignore_ascii_case("COMMIT");
        let mut rest = &statements[..];
        while let Some(first) = rest.first() {
            if boundary(first) {
                rest = &rest[1..];
                continue;
            }
            if outside(first) {
                if let Some((o, name)) = online.and_then(|o| Some((o, built_index(o, first)?))) {
                    if !run_query(c, d, &Stmt::new((o.invalid)(name)), &[], &[])?.is_empty() {
                        log::warn!("txbox: migrate: index {name} left invalid: built again");
                        c.batch(&format!("{} IF EXISTS {name}", o.drop))?;
                    }
                }
                c.batch(first)?;
                rest = &rest[1..];
                continue;
            }
            let n = rest
                .iter()
                .position(|s| outside(s) || boundary(s))
                .unwrap_or(rest.len());
            let (run, after) = rest.split_at(n);
            if in_tx && d.transactional_ddl {
                transaction(c, d, |c| self.run_statements(c, run))?;
            } else {
                self.run_statements(c, run)?;
            }
            rest = after;
        }
        Ok(())
    }

    /// Runs statements in order. An error that says its change is there
    /// already is passed over: the baseline is idempotent that way where the
    /// dialect has no IF NOT EXISTS, and where DDL is not transactional an
    /// upgrade that stopped half-way goes on from where it is.
    fn run_statements(&self, c: &mut dyn Conn, statements: &[String]) -> Result<()> {
        let d = &self.d;
        for stmt in statements {
            match c.batch(stmt) {
                Ok(()) => {}
                Err(e)
                    if (d.error_code)(&e).is_some_and(|code| d.exists_errors.contains(&code)) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(())
    }

    /// Takes the lock that makes migrators take turns, within
    /// `migrate_lock_timeout`.
    fn take_lock(&self, c: &mut dyn Conn, lock: &MigrateLock) -> Result<()> {
        let what = "the lock of migrations (another one runs)";
        let deadline = std::time::Instant::now() + self.migrate_lock_timeout;
        // two migrators that poll spread their tries out
        let mut backoff =
            RetryBackoff::doubling(Duration::from_millis(20), Duration::from_millis(100))
                .jittered();
        loop {
            let got = run_query(
                c,
                &self.d,
                &Stmt::new((lock.take)(self.migrate_lock_timeout)),
                &[],
                &[],
            )
            .map_err(|e| self.gave_up_on(what, e))?;
            if got
                .first()
                .map(|r| r.get::<Option<i64>>(0))
                .transpose()?
                .flatten()
                == Some(1)
            {
                return Ok(());
            }
            if !lock.poll || std::time::Instant::now() >= deadline {
                return Err(self.gave_up(what, "not taken in time"));
            }
            std::thread::sleep(backoff.wait());
        }
    }

    /// A lock wait that timed out (or a deadlock with a writer), said
    /// plainly; any other error as it is.
    fn gave_up_on(&self, what: &str, e: Error) -> Error {
        if !e.is_retryable() {
            return e;
        }
        self.gave_up(what, &e.to_string())
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

/// The name of the index an online build statement builds (the word after
/// `build`), `None` for another statement.
fn built_index<'a>(o: &OnlineIndex, statement: &'a str) -> Option<&'a str> {
    statement.strip_prefix(o.build)?.split_whitespace().next()
}
