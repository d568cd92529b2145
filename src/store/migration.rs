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

/// Splits a migration file into statements, as each dialect's server reads
/// them: a statement ends at a `;` outside a string (`'...'`, `E'...'` with
/// its backslash escapes), a quoted name (`"..."`, `` `...` ``), a
/// dollar-quoted body (`$$ ... $$`, `$fn$ ... $fn$`) and a comment (`--` to
/// the line's end, `/* ... */`), and outside the `BEGIN ... END` body of a
/// trigger, procedure or function written without dollar quotes (SQLite and
/// MySQL); comments outside bodies and strings are dropped, and so are blank
/// lines; everything else keeps its text, line breaks included.
///
/// Not read (no shipped file has them): MySQL's backslash escapes in plain
/// strings and `#` comments, nested `/* */` comments, PL/SQL blocks (a
/// declaration section before `BEGIN`, and the `;` after their `END`, which
/// Oracle needs, would be lost).
pub(crate) fn split_statements(sql: &str) -> Vec<String> {
    let mut split = Splitter::default();
    let mut i = 0;
    while i < sql.len() {
        i += split.step(&sql[i..]);
    }
    split.end_line();
    split.finish();
    split.out
}

/// Where [`split_statements`] is.
#[derive(Default)]
struct Splitter<'a> {
    out: Vec<String>,
    /// The statement so far.
    cur: String,
    /// Inside a string, a quoted name, a body or a block comment: what ends it.
    text: Option<Text<'a>>,
    /// How many words the statement has had so far.
    words: usize,
    /// Its first word is `CREATE`.
    create: bool,
    /// It creates a trigger, procedure or function (`TRIGGER`, `PROCEDURE`
    /// or `FUNCTION` among its first 8 words): its `BEGIN ... END` is a body
    /// (a `BEGIN` of its own starts a transaction).
    body: bool,
    /// The word being read.
    word: String,
    /// `BEGIN`/`CASE` ... `END` depth, in a statement that may have a body.
    depth: usize,
    /// The last word was `END` (an `END IF` or `END LOOP` closes no block).
    after_end: bool,
}

/// What a [`Splitter`] is inside of.
#[derive(Clone, Copy)]
enum Text<'a> {
    /// A string; `true`: an `E'...'` string, where `\` escapes.
    Quoted(char, bool),
    Dollar(&'a str),
    BlockComment,
}

impl<'a> Splitter<'a> {
    /// Reads from the start of `rest`: how many bytes it took.
    fn step(&mut self, rest: &'a str) -> usize {
        let c = rest.chars().next().unwrap_or_default();
        let len = c.len_utf8();
        match self.text {
            Some(Text::Quoted(q, escapes)) => {
                if escapes && c == '\\' {
                    let n = len + rest[len..].chars().next().map_or(0, char::len_utf8);
                    self.cur.push_str(&rest[..n]);
                    return n;
                }
                if c == q {
                    // a doubled quote is one quote in the text
                    if rest[len..].starts_with(q) {
                        self.cur.push_str(&rest[..2 * len]);
                        return 2 * len;
                    }
                    self.text = None;
                }
                self.cur.push(c);
                len
            }
            Some(Text::Dollar(tag)) => {
                if rest.starts_with(tag) {
                    self.text = None;
                    self.cur.push_str(tag);
                    return tag.len();
                }
                self.cur.push(c);
                len
            }
            Some(Text::BlockComment) => {
                if rest.starts_with("*/") {
                    self.text = None;
                    return 2;
                }
                len
            }
            None => self.code(rest, c, len),
        }
    }

    /// [`Splitter::step`] outside any text.
    fn code(&mut self, rest: &'a str, c: char, len: usize) -> usize {
        if c.is_alphanumeric() || c == '_' || (c == '$' && !self.word.is_empty()) {
            self.word.push(c);
            self.cur.push(c);
            return len;
        }
        let escapes = matches!(c, '\'') && self.word.eq_ignore_ascii_case("e");
        self.end_word();
        if !c.is_whitespace() {
            // `END;` then `IF`: that `END` closed a block, the `IF` opens one
            self.after_end = false;
        }
        if rest.starts_with("--") {
            // the comment ends at the line's end, which the next step reads
            return rest.find('\n').unwrap_or(rest.len());
        }
        if rest.starts_with("/*") {
            // what it stood between stays apart
            self.text = Some(Text::BlockComment);
            self.cur.push(' ');
            return 2;
        }
        match c {
            '\'' | '"' | '`' => self.text = Some(Text::Quoted(c, escapes)),
            '$' => {
                if let Some(tag) = dollar_tag(rest) {
                    self.text = Some(Text::Dollar(tag));
                    self.cur.push_str(tag);
                    return tag.len();
                }
            }
            ';' if self.depth == 0 => {
                self.finish();
                return len;
            }
            '\n' => {
                self.end_line();
                return len;
            }
            _ => {}
        }
        self.cur.push(c);
        len
    }

    /// A word ended: counts the blocks of a statement that may have a body.
    fn end_word(&mut self) {
        if self.word.is_empty() {
            return;
        }
        let word = std::mem::take(&mut self.word).to_ascii_uppercase();
        self.words += 1;
        match self.words {
            1 => self.create = word == "CREATE",
            2..=8 if self.create => {
                self.body |= matches!(word.as_str(), "TRIGGER" | "PROCEDURE" | "FUNCTION")
            }
            _ => {}
        }
        let after_end = std::mem::take(&mut self.after_end);
        if !self.body {
            return;
        }
        match word.as_str() {
            // `END IF`, `END LOOP` ...: the `END` closed no block
            "IF" | "LOOP" | "WHILE" | "REPEAT" | "FOR" if after_end => self.depth += 1,
            // `END CASE`: the `END` closed the `CASE`
            "CASE" if after_end => {}
            "BEGIN" | "CASE" => self.depth += 1,
            "END" => {
                self.depth = self.depth.saturating_sub(1);
                self.after_end = true;
            }
            _ => {}
        }
    }

    /// A line ended outside any text: its trailing blanks go, and it goes
    /// too when nothing is left of it.
    fn end_line(&mut self) {
        self.end_word();
        let kept = self.cur.trim_end_matches([' ', '\t', '\r']).len();
        self.cur.truncate(kept);
        if !self.cur.is_empty() && !self.cur.ends_with('\n') {
            self.cur.push('\n');
        }
    }

    /// The statement ended (a `;`, or the file's end).
    fn finish(&mut self) {
        self.end_word();
        let statement = self.cur.trim();
        if !statement.is_empty() {
            self.out.push(statement.to_owned());
        }
        self.cur.clear();
        (self.words, self.create, self.body) = (0, false, false);
        self.depth = 0;
        self.after_end = false;
    }
}

/// The tag a dollar-quoted body opens with at the start of `s` (`$$`,
/// `$body$`), if any: `$1` and a lone `$` are none.
fn dollar_tag(s: &str) -> Option<&str> {
    let inner = s.strip_prefix('$')?;
    let len = inner.find('$')?;
    let tag = &inner[..len];
    let first = tag.chars().next();
    (first.is_none_or(|c| !c.is_ascii_digit())
        && tag.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
    .then(|| &s[..len + 2])
}
