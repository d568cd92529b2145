//! The logic every SQL dialect shares. A dialect supplies its statements (a
//! [`Catalog`]) and a connection adapter ([`Conn`]); the flows below — claim,
//! finish, recovery, dead letters, locks, inbox — are written once.
//!
//! Statements are written with numbered placeholders `$1`, `$2`, ... and an optional
//! `{ids}` list, parsed once into a [`Stmt`] that renders them into the driver's
//! style (`$n`, `?`, `?n`, `:n`) once and knows the order its values are bound in.

mod engine;
mod floor;
mod held;
mod maintenance;
mod migrate;
mod render;
mod rows;
mod statements;
mod stmt;
mod values;

pub(crate) use crate::store::split_statements;
pub use engine::SqlStore;
pub(crate) use engine::*;
pub(crate) use floor::{FloorSql, Floors};
pub(crate) use held::*;
pub(crate) use render::*;
pub(crate) use rows::*;
pub(crate) use statements::*;
pub(crate) use stmt::{Ordered, Stmt};
pub use values::Dialect;
pub(crate) use values::*;

impl Catalog {
    /// What the dialect can do, read off the statements it has: the one place
    /// its capabilities are declared.
    pub(crate) fn capabilities(&self) -> crate::store::Capabilities {
        crate::store::Capabilities::default()
            .held_claims(self.hold_claim.is_some())
            .notifications(self.wake.is_some())
            .key_walk(self.common.walk_skip.is_some())
            .transactional_ddl(self.transactional_ddl)
            .floor_claims(self.floors.is_some())
    }

    /// Every statement template of the dialect, named.
    pub(crate) fn statements(&self) -> Vec<(&'static str, String)> {
        let c = &self.common;
        let mut out: Vec<(&str, &str)> = vec![
            ("claim_select", self.claim_select.template()),
            ("order_recheck", c.order_recheck.template()),
        ];
        let stmts: [(&str, &Stmt); 31] = [
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
            ("insert_mark", &self.insert_mark),
            ("blocked_keys", &c.blocked_keys),
            ("key_waiting", &c.key_waiting),
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
            ("finish.sent", &c.finish.sent),
            ("finish.delete", &c.finish.delete),
            ("finish.failed", &c.finish.failed),
            ("insert_event", insert_one(self, Shape::default())),
        ];
        out.extend(stmts.iter().map(|(n, s)| (*n, s.template())));
        for (name, bytes, delayed) in [
            ("insert_event_bytes", true, false),
            ("insert_event_delayed", false, true),
            ("insert_event_bytes_delayed", true, true),
        ] {
            out.push((name, insert_one(self, Shape { bytes, delayed }).template()));
        }
        out.push(("ordered_skip", &c.ordered_skip));
        out.push(("ordered_block", &c.ordered_block));
        out.push(("finish_held.sent", c.finish_held.sent.template()));
        out.push(("finish_held.delete", c.finish_held.delete.template()));
        out.push(("finish_held.failed", c.finish_held.failed.template()));
        if let Some(r) = &self.claim_returning {
            out.push(("claim_returning", r.template()));
        }
        if let Some(f) = &self.floors {
            out.push(("floor_tick", f.tick.template()));
            out.push(("floor_claim", f.claim.template()));
            out.push(("floor_next_due", f.next_due.template()));
            out.push(("floor_sweep", f.sweep.template()));
        }
        if let Some(r) = &self.inbox_legacy {
            out.push(("inbox_legacy", r.template()));
        }
        if let (Some(skip), Some(block)) = (&c.walk_skip, &c.walk_block) {
            out.push(("walk_skip", skip));
            out.push(("walk_block", block));
        }
        if let Some(h) = &self.hold_claim {
            out.push(("hold_claim.open", h.open));
            out.push(("hold_claim.probe", h.probe.template()));
            out.push(("hold_claim.claim_delete", h.claim_delete.template()));
            out.push(("hold_claim.restore", h.restore.template()));
        }
        if let Some(w) = &self.wake {
            out.push(("wake.quiet", w.quiet.template()));
            out.push(("wake.loud", w.loud.template()));
            out.push(("wake.queue_usage", w.queue_usage.template()));
        }
        out.into_iter().map(|(n, t)| (n, t.to_string())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::Error;
    use crate::store::Tables;

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

    /// Every dialect built in, by name, with its statements for `t`.
    fn catalogs(t: &Tables) -> Vec<(&'static str, Catalog)> {
        vec![
            #[cfg(feature = "postgres")]
            ("postgres", super::super::postgres::catalog(t)),
            #[cfg(feature = "mysql")]
            ("mysql", super::super::mysql::catalog(t)),
            #[cfg(feature = "sqlite")]
            ("sqlite", super::super::sqlite::catalog(t)),
            #[cfg(feature = "oracle")]
            ("oracle", super::super::oracle::catalog(t)),
        ]
    }

    /// For every statement of every dialect, the values the store binds reach the
    /// placeholders their numbers name: the same statement as each `$n` written
    /// out as the n-th value. (Oracle binds by position: a statement that names
    /// `$2` before `$1`, or one value twice, would otherwise get the wrong ones.)
    #[test]
    fn every_statement_of_every_dialect_binds_each_value_where_its_number_says() {
        let t = Tables::new("p_").unwrap();
        let dialects = catalogs(&t);
        let fixed: Vec<Val> = (1..=13).map(|i| Val::Int(100 + i)).collect();
        let ids = [Val::Int(901), Val::Int(902)];
        let show = |v: &Val| format!("<{v:?}>");
        let mut checked = 0;
        for (name, d) in &dialects {
            for (what, template) in d.statements() {
                let stmt = Stmt::new(template.replace("{from}", "'DEAD'"));
                let n_ids = if stmt.has_ids() { 2 } else { 0 };
                let want = stmt.inline(&fixed, &ids[..n_ids], show).unwrap();
                let (sql, params) = stmt.bind(d.style, &fixed, &ids[..n_ids]).unwrap();
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

    /// `migrate` takes a file's version from its place in the list (the second
    /// file is version 2) and the file records itself: both must agree, or the
    /// file is applied again on every `migrate`.
    #[test]
    fn each_schema_file_records_the_version_of_its_place() {
        let t = Tables::new("").unwrap();
        let catalogs = catalogs(&t);
        for (name, d) in &catalogs {
            for (version, file) in (2..).zip(&d.schema[1..]) {
                let records: Vec<String> = split_statements(file)
                    .into_iter()
                    .filter(|s| s.contains("INSERT INTO {prefix}txbox_schema_version"))
                    .collect();
                assert_eq!(records.len(), 1, "{name} version {version}: {records:?}");
                assert!(
                    records[0].contains(&format!("VALUES ({version}")),
                    "{name} file {version} records {}",
                    records[0]
                );
            }
        }
    }

    /// Each dialect declares what the documentation says it can do.
    #[test]
    fn each_dialect_has_the_capabilities_its_docs_name() {
        use crate::store::Capabilities;
        let t = Tables::new("p_").unwrap();
        let none = Capabilities::default();
        for (name, d) in catalogs(&t) {
            let want = match name {
                "postgres" => none
                    .held_claims(true)
                    .notifications(true)
                    .key_walk(true)
                    .transactional_ddl(true)
                    .floor_claims(true),
                "sqlite" => none.key_walk(true).transactional_ddl(true),
                _ => none, // MySQL/MariaDB, Oracle
            };
            assert_eq!(d.capabilities(), want, "{name}");
        }
    }

    /// `SqlStore::statements` names each statement once, with the table names in.
    #[test]
    fn statement_names_are_unique_and_tables_filled_in() {
        let t = Tables::new("p_").unwrap();
        for (name, d) in catalogs(&t) {
            let all = d.statements();
            let names: std::collections::HashSet<&str> = all.iter().map(|(n, _)| *n).collect();
            assert_eq!(names.len(), all.len(), "{name}: a name twice");
            for (n, sql) in &all {
                assert!(!sql.contains("{prefix}"), "{name} {n}: {sql}");
            }
            assert!(names.contains("finish.sent") && names.contains("claim_select"));
        }
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

    /// `--` and a line's closing `;` inside a string or a dollar-quoted
    /// body are text, not a comment or a statement's end.
    #[test]
    fn splits_statements_outside_strings_and_bodies() {
        let s = split_statements(
            "INSERT INTO t VALUES ('a -- b'); -- c\n\
             CREATE FUNCTION f() RETURNS int AS $body$\n\
             BEGIN\n  RETURN 1; -- one\n\n  -- none\nEND $body$;\n\
             SELECT 'x;\n-- y';\n\
             SELECT $1 FROM t WHERE s = '$$' AND m ~ '^a$';\n",
        );
        assert_eq!(
            s,
            vec![
                "INSERT INTO t VALUES ('a -- b')",
                "CREATE FUNCTION f() RETURNS int AS $body$\nBEGIN\n  RETURN 1; -- one\n\n  -- none\nEND $body$",
                "SELECT 'x;\n-- y'",
                "SELECT $1 FROM t WHERE s = '$$' AND m ~ '^a$'",
            ]
        );
    }

    /// Bodies that are not dollar-quoted (SQLite and MySQL triggers and
    /// procedures) keep their `;`s over many lines, whatever `END IF`, `CASE
    /// ... END` and `END CASE` they hold; block comments, `E'...'` escapes
    /// and quoted names hide what looks like an end, and a comment between
    /// two words leaves them apart; a `BEGIN` that starts a transaction opens
    /// no body; a `;` inside a line ends a statement there.
    #[test]
    fn splits_statements_around_bodies_comments_and_quotes() {
        let s = split_statements(
            "CREATE TRIGGER t AFTER INSERT ON a\n\
             FOR EACH ROW\n\
             BEGIN\n  UPDATE s SET n = n + 1;\n  \
               UPDATE a SET k = CASE WHEN n > 0 THEN 1 ELSE 0 END;\n\
             END;\n\
             CREATE PROCEDURE p() BEGIN IF 1 THEN SELECT 1; END IF; \
               CASE 1 WHEN 1 THEN SELECT 2; END CASE; END;\n\
             CREATE TRIGGER u BEFORE INSERT ON a FOR EACH ROW BEGIN \
               SET NEW.k = CASE WHEN NEW.n > 0 THEN 1 ELSE 0 END; \
               IF NEW.k = 1 THEN SET NEW.m = 2; END IF; END;\n\
             CREATE PROCEDURE q() BEGIN SET @x = CASE WHEN 1 THEN 1 END; \
               CASE @a WHEN 1 THEN SELECT 1; END CASE; SELECT 2; END;\n\
             BEGIN; SELECT 1 /* ; */; COMMIT;\n\
             BEGIN READ WRITE;\n\
             CREATE TABLE b (id INT/*pk*/PRIMARY KEY);\n\
             SELECT E'it\\'s;', \"a;b\", `c;d` FROM t;\n\
             /* a comment\n over lines; */ SELECT 2;\n",
        );
        assert_eq!(
            s,
            vec![
                "CREATE TRIGGER t AFTER INSERT ON a\nFOR EACH ROW\nBEGIN\n  UPDATE s SET n = n + 1;\n  \
                 UPDATE a SET k = CASE WHEN n > 0 THEN 1 ELSE 0 END;\nEND",
                "CREATE PROCEDURE p() BEGIN IF 1 THEN SELECT 1; END IF; \
                 CASE 1 WHEN 1 THEN SELECT 2; END CASE; END",
                "CREATE TRIGGER u BEFORE INSERT ON a FOR EACH ROW BEGIN \
                 SET NEW.k = CASE WHEN NEW.n > 0 THEN 1 ELSE 0 END; \
                 IF NEW.k = 1 THEN SET NEW.m = 2; END IF; END",
                "CREATE PROCEDURE q() BEGIN SET @x = CASE WHEN 1 THEN 1 END; \
                 CASE @a WHEN 1 THEN SELECT 1; END CASE; SELECT 2; END",
                "BEGIN",
                "SELECT 1",
                "COMMIT",
                "BEGIN READ WRITE",
                "CREATE TABLE b (id INT PRIMARY KEY)",
                "SELECT E'it\\'s;', \"a;b\", `c;d` FROM t",
                "SELECT 2",
            ]
        );
    }

    /// Every file of every dialect splits into statements that start as
    /// statements do (a split inside a body would start one with `RETURN`
    /// or `END`) and close every dollar quote they open.
    #[test]
    fn each_dialect_s_files_split_into_whole_statements() {
        const STARTS: &[&str] = &[
            "CREATE",
            "ALTER",
            "DROP",
            "INSERT",
            "UPDATE",
            "DELETE",
            "SELECT",
            "SET",
            "DO",
            "PREPARE",
            "EXECUTE",
            "DEALLOCATE",
            "COMMENT",
            "ANALYZE",
            "WITH",
            "DECLARE",
            "BEGIN",
            "COMMIT",
            "MERGE",
            "GRANT",
            "REVOKE",
            "PRAGMA",
            "REINDEX",
        ];
        let t = Tables::new("p_").unwrap();
        for (name, d) in catalogs(&t) {
            for (version, file) in (1..).zip(d.schema.iter()) {
                let statements = split_statements(&t.render(file));
                assert!(!statements.is_empty(), "{name} {version}");
                for st in statements {
                    let first = st
                        .split_whitespace()
                        .next()
                        .unwrap_or("")
                        .to_ascii_uppercase();
                    assert!(
                        STARTS.contains(&first.as_str()),
                        "{name} file {version}: a statement starts with {first}: {st}"
                    );
                    let mut rest = st.as_str();
                    while let Some(at) = rest.find("$$") {
                        let after = &rest[at + 2..];
                        let close = after.find("$$").unwrap_or_else(|| {
                            panic!("{name} file {version}: an open $$ body: {st}")
                        });
                        rest = &after[close + 2..];
                    }
                }
            }
        }
    }

    /// A panic inside a transaction (a bug in the store's code, a driver's)
    /// rolls it back before it goes on, on every dialect: the pooled
    /// connection does not go back to its pool inside a transaction, holding
    /// its locks for whoever takes it next. And a commit that fails is rolled
    /// back too (SQLite keeps a busy commit's transaction open).
    #[test]
    fn a_transaction_that_panics_or_fails_its_commit_is_rolled_back() {
        struct Said(Vec<String>, bool);
        impl Conn for Said {
            fn query(&mut self, _: &str, _: &[Val]) -> crate::Result<Vec<Row>> {
                Ok(Vec::new())
            }
            fn execute(&mut self, _: &str, _: &[Val]) -> crate::Result<u64> {
                Ok(0)
            }
            fn batch(&mut self, sql: &str) -> crate::Result<()> {
                self.0.push(sql.to_owned());
                match sql == "COMMIT" && self.1 {
                    true => Err(Error::Internal("the commit failed".into())),
                    false => Ok(()),
                }
            }
        }
        let t = Tables::new("p_").unwrap();
        for (name, d) in catalogs(&t) {
            let mut c = Said(Vec::new(), false);
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                transaction(&mut c, &d, |_| -> crate::Result<()> {
                    // a panic that skips the hook (no backtrace printed)
                    std::panic::resume_unwind(Box::new("a bug"))
                })
            }));
            assert!(r.is_err(), "{name}: the panic goes on");
            assert_eq!(
                c.0.last().map(String::as_str),
                Some("ROLLBACK"),
                "{name}: {:?}",
                c.0
            );
            assert!(!c.0.iter().any(|s| s == "COMMIT"), "{name}: {:?}", c.0);

            let mut c = Said(Vec::new(), true);
            assert!(transaction(&mut c, &d, |_| Ok(())).is_err(), "{name}");
            assert_eq!(
                c.0[c.0.len() - 2..],
                ["COMMIT", "ROLLBACK"],
                "{name}: {:?}",
                c.0
            );
        }
    }

    #[test]
    fn shifts_placeholders() {
        assert_eq!(
            shift("($1, $2, $3, $4::jsonb, $5)", 100),
            "($101, $102, $103, $104::jsonb, $105)"
        );
    }

    /// The SQL and the values in the order the driver binds them, rendered
    /// from one parse.
    fn rendered(t: &str, style: Style, fixed: usize, ids: usize) -> (String, Vec<i64>) {
        let fixed: Vec<Val> = (1..=fixed as i64).map(Val::Int).collect();
        let ids: Vec<Val> = (1..=ids as i64).map(|n| Val::Int(100 + n)).collect();
        let stmt = Stmt::new(t.into());
        let (sql, params) = stmt.bind(style, &fixed, &ids).unwrap();
        let order = params
            .iter()
            .map(|v| match v {
                Val::Int(n) => *n,
                _ => unreachable!("only numbers bound"),
            })
            .collect();
        (sql.into_owned(), order)
    }

    #[test]
    fn renders_placeholders_per_style() {
        let t = "UPDATE t SET a = $2 WHERE b = $1 AND id IN ({ids}) AND c = $1";
        let (sql, order) = rendered(t, Style::Question, 2, 2);
        assert_eq!(
            sql,
            "UPDATE t SET a = ? WHERE b = ? AND id IN (?, ?) AND c = ?"
        );
        assert_eq!(order, vec![2, 1, 101, 102, 1]);
        // Oracle: one bind per occurrence, in the order they appear
        let (sql, order) = rendered(t, Style::Colon, 2, 1);
        assert_eq!(
            sql,
            "UPDATE t SET a = :1 WHERE b = :2 AND id IN (:3) AND c = :4"
        );
        assert_eq!(order, vec![2, 1, 101, 1]);
        let (_, order) = rendered("VALUES ($1, $2)", Style::QuestionNumbered, 3, 0);
        assert_eq!(order, vec![1, 2], "an unused last parameter is not bound");
        let (sql, order) = rendered(t, Style::QuestionNumbered, 2, 1);
        assert_eq!(
            sql,
            "UPDATE t SET a = ?2 WHERE b = ?1 AND id IN (?3) AND c = ?1"
        );
        assert_eq!(order, vec![1, 2, 101]);
        let (sql, _) = rendered("SELECT '$x', $10", Style::Dollar, 10, 0);
        assert_eq!(sql, "SELECT '$x', $10");
        // the ids follow the values the statement names, however many are passed
        let (sql, order) = rendered(
            "DELETE FROM t WHERE a = $1 AND id IN ({ids})",
            Style::Dollar,
            3,
            2,
        );
        assert_eq!(sql, "DELETE FROM t WHERE a = $1 AND id IN ($2, $3)");
        assert_eq!(order, vec![1, 101, 102]);
    }

    /// A statement without ids is rendered once and handed out as it is; one
    /// with ids is written out per call, for the list's length.
    #[test]
    fn a_statement_is_rendered_once() {
        let s = Stmt::new("SELECT a FROM t WHERE b = $1".into());
        let (first, _) = s.bind(Style::Question, &[Val::Int(1)], &[]).unwrap();
        let (again, _) = s.bind(Style::Question, &[Val::Int(2)], &[]).unwrap();
        assert!(matches!(first, std::borrow::Cow::Borrowed(_)));
        assert_eq!(first.as_ptr(), again.as_ptr(), "the same rendered text");
        // another style (never within one catalog) is rendered apart
        let (dollar, _) = s.bind(Style::Dollar, &[Val::Int(1)], &[]).unwrap();
        assert_eq!(dollar, "SELECT a FROM t WHERE b = $1");
        assert_eq!(first, "SELECT a FROM t WHERE b = ?");
    }

    #[test]
    fn inlines_every_placeholder_as_a_literal() {
        let literal = |v: &Val| match v {
            Val::Int(n) => format!("<{n}>"),
            _ => "<?>".into(),
        };
        let fixed = [Val::Int(1), Val::Int(2)];
        let t = Stmt::new("UPDATE t SET a = $2 WHERE b = $1 AND id IN ({ids})".into());
        let sql = t
            .inline(&fixed, &[Val::Int(3), Val::Int(4)], literal)
            .unwrap();
        assert_eq!(
            sql,
            "UPDATE t SET a = <2> WHERE b = <1> AND id IN (<3>, <4>)"
        );
    }

    #[test]
    fn a_placeholder_without_a_value_is_an_error_not_a_null() {
        let literal = |_: &Val| "<v>".to_string();
        for (t, n) in [
            ("UPDATE t SET a = $1 WHERE c = $7", "$7"),
            ("UPDATE t SET a = $1 WHERE c = $0", "$0"),
        ] {
            let t = Stmt::new(t.into());
            let err = t.inline(&[Val::Int(1)], &[], literal).unwrap_err();
            assert!(matches!(&err, Error::Internal(m) if m.contains(n)), "{err}");
            for (name, d) in catalogs(&Tables::new("p_").unwrap()) {
                let err = t.bind(d.style, &[Val::Int(1)], &[]).unwrap_err();
                assert!(
                    matches!(&err, Error::Internal(m) if m.contains(n)),
                    "{name}: {err}"
                );
            }
        }
    }
}
