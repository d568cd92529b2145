//! Statements run, transactions.

use super::{Catalog, Conn, Row, Stmt, Val};
use crate::error::Error;
use crate::error::Result;

/// Whether `e` is a database error of `kind`.
pub(crate) fn is(e: &Error, kind: crate::error::DatabaseErrorKind) -> bool {
    matches!(e, Error::Database { kind: k, .. } if *k == kind)
}

/// `template` with every `$n` placeholder replaced by `f(n)`.
pub(crate) fn placeholders(template: &str, mut f: impl FnMut(usize) -> String) -> String {
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

/// Adds `by` to every `$n` placeholder of `template`.
pub(crate) fn shift(template: &str, by: usize) -> String {
    placeholders(template, |n| format!("${}", n + by))
}

/// "now - `ms_param` milliseconds" in a dialect whose "now + n ms" is `plus`.
pub(crate) fn ago(plus: fn(&str) -> String, ms_param: &str) -> String {
    plus(&format!("-{ms_param}"))
}

/// `stmt` run with `fixed` values and `ids` (for its `{ids}`).
pub(crate) fn run_query(
    conn: &mut dyn Conn,
    d: &Catalog,
    stmt: &Stmt,
    fixed: &[Val],
    ids: &[Val],
) -> Result<Vec<Row>> {
    let (sql, params) = stmt.bind(d.style, fixed, ids)?;
    conn.query(&sql, &params)
}

/// `stmt` run, fetching at most `max` rows.
pub(crate) fn run_query_max(
    conn: &mut dyn Conn,
    d: &Catalog,
    stmt: &Stmt,
    fixed: &[Val],
    max: usize,
) -> Result<Vec<Row>> {
    let (sql, params) = stmt.bind(d.style, fixed, &[])?;
    conn.query_max(&sql, &params, max)
}

/// `stmt` run; how many rows it changed.
pub(crate) fn run_execute(
    conn: &mut dyn Conn,
    d: &Catalog,
    stmt: &Stmt,
    fixed: &[Val],
    ids: &[Val],
) -> Result<u64> {
    let (sql, params) = stmt.bind(d.style, fixed, ids)?;
    conn.execute(&sql, &params)
}

/// Runs `f` in a transaction: commits on `Ok`, rolls back on `Err`, and on a
/// panic (rolled back, then the panic goes on): a pooled connection must not
/// go back to its pool inside a transaction, holding its locks for whoever
/// takes it next.
pub(crate) fn transaction<T>(
    conn: &mut dyn Conn,
    d: &Catalog,
    f: impl FnOnce(&mut dyn Conn) -> Result<T>,
) -> Result<T> {
    if !d.begin.is_empty() {
        conn.batch(d.begin)?;
    }
    let rollback = |conn: &mut dyn Conn| {
        if let Err(r) = conn.batch("ROLLBACK") {
            log::debug!("txbox: rollback after an error failed too: {r}");
        }
    };
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&mut *conn))) {
        Ok(Ok(v)) => match conn.batch("COMMIT") {
            Ok(()) => Ok(v),
            Err(e) => {
                // still open where a failed commit keeps it (SQLite busy)
                rollback(conn);
                Err(e)
            }
        },
        Ok(Err(e)) => {
            rollback(conn);
            Err(e)
        }
        Err(panic) => {
            rollback(conn);
            std::panic::resume_unwind(panic)
        }
    }
}
