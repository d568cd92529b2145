//! Placeholders rendered per driver, statements run, transactions.

use super::{Catalog, Conn, Row, Style, Val};
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

/// `template` with `{ids}` written out as the placeholders after the `fixed` ones.
pub(crate) fn expand_ids(template: &str, fixed: usize, ids: usize) -> String {
    let list: Vec<String> = (fixed + 1..=fixed + ids).map(|n| format!("${n}")).collect();
    template.replace("{ids}", &list.join(", "))
}

/// Renders `$n` / `{ids}` into `style`; returns the SQL and the order in which the
/// parameters must be passed (indexes into fixed ++ ids). `$0` is an error: no
/// value has that number.
pub(crate) fn render(
    template: &str,
    style: Style,
    fixed: usize,
    ids: usize,
) -> Result<(String, Vec<usize>)> {
    let mut order = Vec::new();
    let mut zero = false;
    let out = placeholders(&expand_ids(template, fixed, ids), |n| {
        zero |= n == 0;
        order.push(n.saturating_sub(1));
        match style {
            Style::Dollar => format!("${n}"),
            Style::Question => "?".into(),
            Style::QuestionNumbered => format!("?{n}"),
            // Oracle binds by position, the order the placeholders appear in,
            // whatever their names: one bind per occurrence, named in that order
            Style::Colon => format!(":{}", order.len()),
        }
    });
    if zero {
        return Err(no_value(0, template));
    }
    if matches!(style, Style::Dollar | Style::QuestionNumbered) {
        // numbered styles bind every index up to the highest one used
        let highest = order.iter().max().map_or(0, |m| m + 1);
        order = (0..highest).collect();
    }
    Ok((out, order))
}

/// Adds `by` to every `$n` placeholder of `template`.
pub(crate) fn shift(template: &str, by: usize) -> String {
    placeholders(template, |n| format!("${}", n + by))
}

/// "now - `ms_param` milliseconds" in a dialect whose "now + n ms" is `plus`.
pub(crate) fn ago(plus: fn(&str) -> String, ms_param: &str) -> String {
    plus(&format!("-{ms_param}"))
}

/// `template` with `{ids}` and every `$n` written out as literals of `fixed ++ ids`;
/// an error for a placeholder without a value (never a NULL in its place).
pub(crate) fn inline(
    template: &str,
    fixed: &[Val],
    ids: &[Val],
    literal: fn(&Val) -> String,
) -> Result<String> {
    let all: Vec<&Val> = fixed.iter().chain(ids).collect();
    let mut unbound = None;
    let sql = placeholders(&expand_ids(template, fixed.len(), ids.len()), |n| {
        match n.checked_sub(1).and_then(|i| all.get(i)) {
            Some(v) => literal(v),
            None => {
                unbound.get_or_insert(n);
                String::new()
            }
        }
    });
    match unbound {
        Some(n) => Err(no_value(n, template)),
        None => Ok(sql),
    }
}

/// A statement of txbox's own with a placeholder it passes no value for: a bug.
fn no_value(n: usize, template: &str) -> Error {
    Error::Internal(format!("placeholder ${n} has no value in: {template}"))
}

/// A statement rendered for one call.
pub(crate) fn run_query(
    conn: &mut dyn Conn,
    d: &Catalog,
    template: &str,
    fixed: &[Val],
    ids: &[Val],
) -> Result<Vec<Row>> {
    let (sql, params) = prepare(d, template, fixed, ids)?;
    conn.query(&sql, &params)
}

pub(crate) fn run_query_max(
    conn: &mut dyn Conn,
    d: &Catalog,
    template: &str,
    fixed: &[Val],
    max: usize,
) -> Result<Vec<Row>> {
    let (sql, params) = prepare(d, template, fixed, &[])?;
    conn.query_max(&sql, &params, max)
}

pub(crate) fn run_execute(
    conn: &mut dyn Conn,
    d: &Catalog,
    template: &str,
    fixed: &[Val],
    ids: &[Val],
) -> Result<u64> {
    let (sql, params) = prepare(d, template, fixed, ids)?;
    conn.execute(&sql, &params)
}

/// The statement in the driver's placeholder style and its values in bind
/// order; an error for a placeholder without a value (never dropped).
pub(crate) fn prepare(
    d: &Catalog,
    template: &str,
    fixed: &[Val],
    ids: &[Val],
) -> Result<(String, Vec<Val>)> {
    let (sql, order) = render(template, d.style, fixed.len(), ids.len())?;
    let all: Vec<&Val> = fixed.iter().chain(ids).collect();
    let params = order
        .iter()
        .map(|&i| {
            all.get(i)
                .map(|v| (*v).clone())
                .ok_or_else(|| no_value(i + 1, template))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok((sql, params))
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
