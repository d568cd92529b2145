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

/// Runs `f` in a transaction: commits on `Ok`, rolls back on `Err`.
pub(crate) fn transaction<T>(
    conn: &mut dyn Conn,
    d: &Catalog,
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
