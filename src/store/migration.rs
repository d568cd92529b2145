//! What a schema migration is made of, for every store: a pending version
//! and its file's statements (the SQL stores apply them,
//! [`Store::migrate`](crate::Store::migrate)).

/// A schema version [`Store::migrate`](crate::Store::migrate) would apply
/// ([`Store::pending_migrations`](crate::Store::pending_migrations)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingMigration {
    /// The version: 1 for the baseline (`001_schema.sql`, idempotent, run
    /// where there is no version table: a new database or one of txbox 0.1),
    /// then the number of its file.
    pub version: i64,
    /// The file's first line, what it is about.
    pub title: String,
    /// Its statements, as `migrate` runs them.
    pub sql: String,
}

impl PendingMigration {
    /// Its statements one by one, for a tool of your own that applies them.
    /// `migrate` runs PostgreSQL's `CREATE INDEX CONCURRENTLY` / `DROP INDEX
    /// CONCURRENTLY` outside any transaction, each on its own, and the runs
    /// of statements between them and `COMMIT`s each in one transaction
    /// (without `CONCURRENTLY` where the table is new).
    pub fn statements(&self) -> Vec<String> {
        split_statements(&self.sql)
    }
}

/// Splits a migration file into statements: a statement ends with a `;` at
/// the end of a line (a one-line trigger or PL/SQL block keeps its inner
/// ones), comments (`--`) are dropped, and neither is looked for inside a
/// quoted string or a dollar-quoted body (`$$ ... $$`, `$fn$ ... $fn$`),
/// which may span lines.
pub(crate) fn split_statements(sql: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    // inside a '...' string, or the tag of the dollar-quoted body we are in
    let mut quoted = false;
    let mut dollar: Option<&str> = None;
    for line in sql.lines() {
        let in_text = quoted || dollar.is_some();
        let mut end = line.len();
        let mut i = 0;
        while i < line.len() {
            let rest = &line[i..];
            if let Some(tag) = dollar {
                if rest.starts_with(tag) {
                    dollar = None;
                    i += tag.len();
                    continue;
                }
            } else if quoted {
                quoted = !rest.starts_with('\'');
            } else if rest.starts_with("--") {
                end = i;
                break;
            } else if rest.starts_with('\'') {
                quoted = true;
            } else if let Some(tag) = dollar_tag(rest) {
                dollar = Some(tag);
                i += tag.len();
                continue;
            }
            i += rest.chars().next().map_or(1, char::len_utf8);
        }
        let code = &line[..end];
        if code.trim().is_empty() && !in_text {
            continue;
        }
        cur.push_str(code);
        cur.push('\n');
        if !quoted && dollar.is_none() && code.trim_end().ends_with(';') {
            out.push(cur.trim().trim_end_matches(';').to_owned());
            cur.clear();
        }
    }
    if !cur.trim().is_empty() {
        out.push(cur.trim().to_owned());
    }
    out
}

/// The tag a dollar-quoted body opens with at the start of `s` (`$$`,
/// `$body$`), if any: `$1` and a lone `$` are none.
fn dollar_tag(s: &str) -> Option<&str> {
    let inner = s.strip_prefix('$')?;
    let len = inner.find('$')?;
    inner[..len]
        .chars()
        .all(|c| c.is_ascii_alphabetic() || c == '_')
        .then(|| &s[..len + 2])
}
