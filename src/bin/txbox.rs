//! `txbox`: operate an outbox from the shell.
//!
//! ```text
//! txbox [--database-url URL] [--table-prefix P] [--json] COMMAND
//!
//!   migrate                         create the tables (idempotent)
//!   status                          per event type: pending, in process, failed, lag
//!   dlq list [--type T] [--status DEAD|RETRY|RESOLVED] [--offset N] [--limit N]
//!   dlq show ID                     one dead letter with payload, headers, last error
//!   dlq move                        FAILED outbox events to the dead letters now
//!                                   (the DLQ thread does it; with the DLQ off, this)
//!   dlq retry ID... | --type T      back to the outbox with a fresh retry budget
//!   dlq resolve ID... | --type T
//!   dlq delete ID... | --type T
//! ```
//! The URL comes from `--database-url` or `TXBOX_DATABASE_URL` (`postgres://...`,
//! `mysql://...`, `sqlite:PATH`, `oracle://...`). Exit codes: 0 ok, 1 error, 2 bad usage.

use std::process::ExitCode;

use txbox::{Dlq, DlqFilter, DlqStatus, EventId};

const USAGE: &str = "usage: txbox [--database-url URL] [--table-prefix P] [--json] \
migrate | status | dlq list [--type T] [--status S] [--offset N] [--limit N] | dlq show ID | \
dlq move | dlq retry|resolve|delete (ID... | --type T)";

/// A failure and its exit code.
enum Fail {
    Usage(String),
    Run(String),
}

impl From<txbox::Error> for Fail {
    fn from(e: txbox::Error) -> Self {
        Fail::Run(e.to_string())
    }
}

struct Args {
    url: Option<String>,
    prefix: String,
    json: bool,
    words: Vec<String>,
    flags: Vec<(String, String)>,
}

/// The arguments, each of which must be UTF-8 (a path or a URL given as other
/// bytes is a usage error, not a panic).
fn utf8_args() -> Result<Vec<String>, Fail> {
    std::env::args_os()
        .skip(1)
        .enumerate()
        .map(|(i, a)| {
            a.into_string().map_err(|a| {
                Fail::Usage(format!(
                    "argument {} is not valid UTF-8: {:?}",
                    i + 1,
                    a.to_string_lossy()
                ))
            })
        })
        .collect()
}

/// `s` safe to print on a terminal: control characters (escape sequences,
/// newlines, NUL) and bidirectional overrides written as escapes, so a payload,
/// an error text or an event type cannot rewrite the screen or forge lines.
fn printable(s: &str) -> String {
    s.chars()
        .map(|c| {
            if c.is_control() || matches!(c, '\u{202a}'..='\u{202e}' | '\u{2066}'..='\u{2069}') {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

fn parse(raw: Vec<String>) -> Result<Args, Fail> {
    let mut args = Args {
        url: None,
        prefix: String::new(),
        json: false,
        words: Vec::new(),
        flags: Vec::new(),
    };
    let mut it = raw.into_iter();
    while let Some(a) = it.next() {
        let mut value = |name: &str| {
            it.next()
                .ok_or_else(|| Fail::Usage(format!("{name} needs a value")))
        };
        match a.as_str() {
            "--json" => args.json = true,
            "--database-url" => args.url = Some(value("--database-url")?),
            "--table-prefix" => args.prefix = value("--table-prefix")?,
            "--type" | "--status" | "--offset" | "--limit" => {
                let v = value(&a)?;
                args.flags.push((a, v));
            }
            "-h" | "--help" => return Err(Fail::Usage(String::new())),
            s if s.starts_with('-') => return Err(Fail::Usage(format!("unknown option {s}"))),
            _ => args.words.push(a),
        }
    }
    Ok(args)
}

impl Args {
    fn flag(&self, name: &str) -> Option<&str> {
        self.flags
            .iter()
            .rev()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    fn number(&self, name: &str, default: u64) -> Result<u64, Fail> {
        match self.flag(name) {
            None => Ok(default),
            Some(v) => v
                .parse()
                .map_err(|_| Fail::Usage(format!("{name} must be a whole number, not {v:?}"))),
        }
    }

    fn ids(&self, from: usize) -> Result<Vec<EventId>, Fail> {
        self.words[from..]
            .iter()
            .map(|w| {
                w.parse()
                    .map_err(|e: txbox::Error| Fail::Usage(e.to_string()))
            })
            .collect()
    }
}

fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers.iter().map(|h| h.len()).collect();
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<String>| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = vec![line(headers.iter().map(|h| h.to_string()).collect())];
    out.extend(rows.iter().map(|r| line(r.clone())));
    out.join("\n")
}

fn json<T: serde::Serialize>(v: &T) -> Result<String, Fail> {
    serde_json::to_string_pretty(v).map_err(|e| Fail::Run(e.to_string()))
}

/// `rows` as JSON, or as a table with `headers` and one line of `cells` per row.
fn listing<T: serde::Serialize>(
    as_json: bool,
    rows: &[T],
    headers: &[&str],
    cells: impl Fn(&T) -> Vec<String>,
) -> Result<String, Fail> {
    if as_json {
        json(&rows)
    } else {
        Ok(table(headers, &rows.iter().map(cells).collect::<Vec<_>>()))
    }
}

fn run(args: Args) -> Result<String, Fail> {
    let cmd: Vec<&str> = args.words.iter().map(String::as_str).collect();
    // usage errors before touching the database
    match cmd.as_slice() {
        ["migrate"] | ["status"] | ["dlq", "list"] | ["dlq", "show", _] | ["dlq", "move"] => {}
        ["dlq", "retry" | "resolve" | "delete", ..] => {
            let by_type = args.flag("--type").is_some();
            if by_type == (cmd.len() > 2) {
                return Err(Fail::Usage(format!(
                    "dlq {} takes ids or --type, not both or neither",
                    cmd[1]
                )));
            }
            args.ids(2)?;
        }
        [] => return Err(Fail::Usage("no command".into())),
        _ => {
            return Err(Fail::Usage(format!(
                "unknown command {:?}",
                args.words.join(" ")
            )))
        }
    }
    let status = args
        .flag("--status")
        .map(str::parse::<DlqStatus>)
        .transpose()
        .map_err(|e| Fail::Usage(e.to_string()))?;
    let (offset, limit) = (args.number("--offset", 0)?, args.number("--limit", 50)?);
    if let ["dlq", "show", id] = cmd.as_slice() {
        id.parse::<EventId>()
            .map_err(|e| Fail::Usage(e.to_string()))?;
    }

    let url = args
        .url
        .clone()
        .or_else(|| std::env::var("TXBOX_DATABASE_URL").ok())
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            Fail::Usage("no database: pass --database-url or set TXBOX_DATABASE_URL".into())
        })?;
    let store = txbox::store::connect(&url, &args.prefix)?;
    let dlq = Dlq::new(store.clone());
    Ok(match cmd.as_slice() {
        ["migrate"] => {
            store.migrate()?;
            if args.json {
                json(&serde_json::json!({"migrated": true}))?
            } else {
                "migrated".into()
            }
        }
        ["status"] => {
            let rows = store.status()?;
            listing(
                args.json,
                &rows,
                &[
                    "EVENT TYPE",
                    "PENDING",
                    "IN PROCESS",
                    "FAILED",
                    "OLDEST PENDING",
                ],
                |s| {
                    let lag = s
                        .oldest_pending_age
                        .map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64()));
                    vec![
                        printable(&s.event_type),
                        s.pending.to_string(),
                        s.in_process.to_string(),
                        s.failed.to_string(),
                        lag,
                    ]
                },
            )?
        }
        ["dlq", "list"] => {
            let filter = DlqFilter {
                event_type: args.flag("--type").map(String::from),
                status,
                offset,
                limit,
            };
            let rows = dlq.list(&filter)?;
            listing(
                args.json,
                &rows,
                &[
                    "ID",
                    "EVENT TYPE",
                    "STATUS",
                    "ATTEMPTS",
                    "MOVED AT",
                    "LAST ERROR",
                ],
                |d| {
                    let err: String = d
                        .last_error
                        .as_deref()
                        .unwrap_or_default()
                        .chars()
                        .take(60)
                        .collect();
                    vec![
                        d.id.to_string(),
                        printable(&d.event_type),
                        d.status.to_string(),
                        d.attempts.to_string(),
                        printable(&d.moved_at),
                        printable(&err),
                    ]
                },
            )?
        }
        ["dlq", "show", id] => {
            let d = dlq.get(
                id.parse()
                    .map_err(|e: txbox::Error| Fail::Usage(e.to_string()))?,
            )?;
            if args.json {
                json(&d)?
            } else {
                format!(
                    "id:         {}\nevent type: {}\nstatus:     {}\nkey:        {}\nattempts:   {}\ncreated at: {}\nmoved at:   {}\nlast error: {}\nheaders:    {}\npayload:    {}",
                    d.id,
                    printable(&d.event_type),
                    d.status,
                    printable(d.key.as_deref().unwrap_or("-")),
                    d.attempts,
                    printable(&d.created_at),
                    printable(&d.moved_at),
                    printable(d.last_error.as_deref().unwrap_or("-")),
                    printable(&serde_json::to_string(&d.headers).unwrap_or_default()),
                    printable(&d.payload)
                )
            }
        }
        ["dlq", "move"] => {
            let mut moved = 0;
            loop {
                let n = dlq.move_failed(10_000)?;
                moved += n;
                if n < 10_000 {
                    break;
                }
            }
            if args.json {
                json(&serde_json::json!({ "moved": moved }))?
            } else {
                format!("{moved} failed events moved to the dead letters")
            }
        }
        ["dlq", action, ..] => {
            let done: Vec<String> = if let Some(t) = args.flag("--type") {
                let n = match *action {
                    "retry" => dlq.retry_type(t)?,
                    "resolve" => dlq.resolve_type(t)?,
                    _ => dlq.delete_type(t)?,
                };
                vec![format!("{n} dead letters of type {t}")]
            } else {
                let mut done = Vec::new();
                for id in args.ids(2)? {
                    match *action {
                        "retry" => dlq.retry(id)?,
                        "resolve" => dlq.resolve(id)?,
                        _ => dlq.delete(id)?,
                    }
                    done.push(id.to_string());
                }
                done
            };
            let verb = match *action {
                "retry" => "marked for retry",
                "resolve" => "resolved",
                _ => "deleted",
            };
            if args.json {
                json(&serde_json::json!({ "action": action, "done": done }))?
            } else {
                format!("{verb}: {}", done.join(", "))
            }
        }
        _ => return Err(Fail::Usage("unknown command".into())),
    })
}

fn main() -> ExitCode {
    let outcome = utf8_args().and_then(parse).and_then(run);
    match outcome {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        Err(Fail::Usage(msg)) => {
            if !msg.is_empty() {
                eprintln!("txbox: {msg}");
            }
            eprintln!("{USAGE}");
            ExitCode::from(2)
        }
        Err(Fail::Run(msg)) => {
            eprintln!("txbox: {}", msg.replace('\n', " "));
            ExitCode::from(1)
        }
    }
}
