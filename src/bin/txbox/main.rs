//! `txbox`: operate an outbox from the shell (feature `cli`).
//!
//! ```text
//! txbox [--database-url URL] [--table-prefix P] [--json] COMMAND
//!
//!   migrate [--dry-run]             create the tables (idempotent); --dry-run
//!                                   prints what it would run, with the SQL
//!   status                          per event type: pending, in process, failed, lag
//!   dlq list [--type T] [--status DEAD|RETRY|RESOLVED] [--offset N] [--limit N]
//!   dlq show ID                     one dead letter with payload, headers, last error
//!   dlq move                        FAILED outbox events to the dead letters now
//!                                   (the DLQ thread does it; with the DLQ off, this)
//!   dlq retry ID... | --type T      back to the outbox with a fresh retry budget
//!   dlq resolve ID... | --type T
//!   dlq delete ID... | --type T
//! ```
//! `txbox help COMMAND` or `--help` after any command tells more. The URL comes
//! from `--database-url` or `TXBOX_DATABASE_URL` (`postgres://...`, `mysql://...`,
//! `sqlite:PATH`, `oracle://...`). Exit codes: 0 ok, 1 error, 2 bad usage.

use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

mod relay;
use txbox::{Dlq, DlqFilter, DlqStatus, EventId, Pauses};

/// Operate a txbox outbox: migrate, status, pauses, dead letters; run the
/// relay from a file.
#[derive(Parser)]
#[command(name = "txbox", version)]
struct Cli {
    /// The database: postgres://..., mysql://..., sqlite:PATH, oracle://...
    /// (default: $TXBOX_DATABASE_URL)
    #[arg(long, global = true, value_name = "URL")]
    database_url: Option<String>,
    /// The configuration's table prefix
    #[arg(long, global = true, value_name = "P", default_value = "")]
    table_prefix: String,
    /// Print JSON instead of text
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create the tables and apply the schema versions missing (idempotent)
    Migrate {
        /// Print what would run (each version and its SQL) and change nothing
        #[arg(long)]
        dry_run: bool,
    },
    /// Per event type: pending, in process, failed, the oldest pending's age,
    /// and whether it is paused
    Status,
    /// Pause an event type: no relay claims it until it is resumed
    /// (publishing goes on)
    Pause {
        /// The event type
        event_type: String,
    },
    /// Resume a paused event type (the relays send what waited)
    Resume {
        /// The event type
        event_type: String,
    },
    /// Dead letters: list, show, move, retry, resolve, delete
    #[command(subcommand)]
    Dlq(DlqCommand),
    /// Run the relay from a TOML file until SIGTERM or SIGINT (the event
    /// types, the broker, [relay], [admin], [log]); --once: deliver what is
    /// due now and exit
    Relay {
        /// The configuration file
        #[arg(long, value_name = "FILE")]
        config: String,
        /// Deliver every event due now, print a summary per type, and exit
        /// (1 when some event was not sent)
        #[arg(long)]
        once: bool,
        /// The log's format (default: the file's [log] format, text)
        #[arg(long, value_enum, value_name = "text|json")]
        log_format: Option<relay::LogFormat>,
    },
    /// Check a relay's TOML file and print the effective settings of each
    /// event type (the defaults merged); errors name the key path
    Check {
        /// The configuration file
        #[arg(long, value_name = "FILE")]
        config: String,
    },
}

#[derive(Subcommand)]
enum DlqCommand {
    /// Dead letters, oldest moved first
    List {
        /// Only this event type
        #[arg(long = "type", value_name = "T")]
        event_type: Option<String>,
        /// Only this status: DEAD, RETRY or RESOLVED
        #[arg(long, value_name = "S")]
        status: Option<DlqStatus>,
        /// Skip this many
        #[arg(long, default_value_t = 0, value_name = "N")]
        offset: u64,
        /// At most this many
        #[arg(long, default_value_t = 50, value_name = "N")]
        limit: u64,
    },
    /// The keys of an ordered type (ordering = "key", on_poison = "block")
    /// whose later events wait behind a dead letter or a failed event
    Blocked {
        /// The ordered event type
        #[arg(long = "type", value_name = "T")]
        event_type: String,
    },
    /// One dead letter with payload, headers and last error
    Show {
        /// The event id
        id: EventId,
    },
    /// Move FAILED outbox events to the dead letters now (the relay's DLQ thread
    /// does it; with the DLQ off, this is how they are reached)
    Move,
    /// Back to the outbox with a fresh retry budget
    Retry(Target),
    /// Mark handled; deleted after the resolved TTL
    Resolve(Target),
    /// Delete for good
    Delete(Target),
}

/// The dead letters an action applies to: ids, or every one of a type.
#[derive(Args)]
#[group(required = true, multiple = false)]
struct Target {
    /// Event ids
    ids: Vec<EventId>,
    /// Every dead letter of this event type
    #[arg(long = "type", value_name = "T")]
    event_type: Option<String>,
}

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

/// `msg`'s lines, each [`printable`], joined with `sep`.
fn escaped_lines(msg: &str, sep: &str) -> String {
    msg.lines().map(printable).collect::<Vec<_>>().join(sep)
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

fn run(cli: Cli) -> Result<String, Fail> {
    // the relay's commands read the database from their file
    match &cli.command {
        Command::Check { config } => {
            return relay::check(&relay::RelayFile::read(config)?, cli.json)
        }
        Command::Relay {
            config,
            once,
            log_format,
        } => {
            let file = relay::RelayFile::read(config)?;
            file.init_log(*log_format);
            let url = cli.database_url.as_deref();
            return if *once {
                relay::once(&file, url, cli.json)
            } else {
                relay::run(&file, url)
            };
        }
        _ => {}
    }
    let url = cli
        .database_url
        .clone()
        .or_else(|| std::env::var("TXBOX_DATABASE_URL").ok())
        .filter(|u| !u.is_empty())
        .ok_or_else(|| {
            Fail::Usage("no database: pass --database-url or set TXBOX_DATABASE_URL".into())
        })?;
    let as_json = cli.json;
    let store = txbox::Config::builder()
        .table_prefix(&cli.table_prefix)
        .build()?
        .connect(&url)?;
    let dlq = Dlq::new(store.clone());
    Ok(match cli.command {
        Command::Relay { .. } | Command::Check { .. } => {
            return Err(Fail::Run("the relay's commands run above".into()))
        }
        Command::Migrate { dry_run: true } => {
            let pending = store.pending_migrations()?;
            if as_json {
                let list: Vec<_> = pending
                    .iter()
                    .map(|m| serde_json::json!({"version": m.version, "title": m.title, "sql": m.sql}))
                    .collect();
                json(&serde_json::json!({"pending": list}))?
            } else if pending.is_empty() {
                "the schema is current: nothing to run".into()
            } else {
                pending
                    .iter()
                    .map(|m| {
                        format!(
                            "-- version {}: {}\n{}",
                            m.version,
                            m.title,
                            m.sql.trim_end()
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n\n")
            }
        }
        Command::Migrate { dry_run: false } => {
            store.migrate()?;
            if as_json {
                json(&serde_json::json!({"migrated": true}))?
            } else {
                "migrated".into()
            }
        }
        Command::Status => {
            /// A type's status and whether it is paused.
            #[derive(serde::Serialize)]
            struct Row {
                #[serde(flatten)]
                status: txbox::TypeStatus,
                paused: bool,
            }
            let paused = store.paused()?;
            let mut rows: Vec<Row> = store
                .status()?
                .into_iter()
                .map(|status| Row {
                    paused: paused.contains(&status.event_type),
                    status,
                })
                .collect();
            // a paused type with nothing in the outbox is listed too
            for t in &paused {
                if !rows.iter().any(|r| &r.status.event_type == t) {
                    rows.push(Row {
                        status: txbox::TypeStatus {
                            event_type: t.clone(),
                            ..Default::default()
                        },
                        paused: true,
                    });
                }
            }
            rows.sort_by(|a, b| a.status.event_type.cmp(&b.status.event_type));
            listing(
                as_json,
                &rows,
                &[
                    "EVENT TYPE",
                    "PENDING",
                    "IN PROCESS",
                    "FAILED",
                    "OLDEST PENDING",
                    "PAUSED",
                ],
                |r| {
                    let s = &r.status;
                    let lag = s
                        .oldest_pending_age
                        .map_or("-".into(), |d| format!("{:.1}s", d.as_secs_f64()));
                    vec![
                        printable(&s.event_type),
                        s.pending.to_string(),
                        s.in_process.to_string(),
                        s.failed.to_string(),
                        lag,
                        if r.paused { "paused" } else { "-" }.into(),
                    ]
                },
            )?
        }
        Command::Pause { event_type } => {
            let changed = Pauses::new(store.clone()).pause(&event_type)?;
            if as_json {
                json(&serde_json::json!({ "event_type": event_type, "paused": changed }))?
            } else if changed {
                format!(
                    "paused {}: no relay claims it until resumed",
                    printable(&event_type)
                )
            } else {
                format!("{} was paused already", printable(&event_type))
            }
        }
        Command::Resume { event_type } => {
            let changed = Pauses::new(store.clone()).resume(&event_type)?;
            if as_json {
                json(&serde_json::json!({ "event_type": event_type, "resumed": changed }))?
            } else if changed {
                format!("resumed {}", printable(&event_type))
            } else {
                format!("{} was not paused", printable(&event_type))
            }
        }
        Command::Dlq(DlqCommand::List {
            event_type,
            status,
            offset,
            limit,
        }) => {
            let mut filter = DlqFilter::default().offset(offset).limit(limit);
            filter.event_type = event_type;
            filter.status = status;
            let rows = dlq.list(&filter)?;
            listing(
                as_json,
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
        Command::Dlq(DlqCommand::Blocked { event_type }) => {
            let rows = dlq.blocked_keys_of(&event_type)?;
            listing(
                as_json,
                &rows,
                &["EVENT TYPE", "KEY", "BLOCKED BY", "STATUS", "WAITING"],
                |k| {
                    vec![
                        printable(&k.event_type),
                        printable(&k.key),
                        k.blocked_by.to_string(),
                        k.status.clone(),
                        k.waiting.to_string(),
                    ]
                },
            )?
        }
        Command::Dlq(DlqCommand::Show { id }) => {
            let d = dlq.get(id)?;
            if as_json {
                json(&d)?
            } else {
                format!(
                    "id:         {}\nevent type: {}\nstatus:     {}\nkey:        {}\nattempts:   {}\ncreated at: {}\nmoved at:   {}\nlast error: {}\nheaders:    {}\ncontent:    {}\npayload:    {}",
                    d.id,
                    printable(&d.event_type),
                    d.status,
                    printable(d.key.as_deref().unwrap_or("-")),
                    d.attempts,
                    printable(&d.created_at),
                    printable(&d.moved_at),
                    printable(d.last_error.as_deref().unwrap_or("-")),
                    printable(&serde_json::to_string(&d.headers).unwrap_or_default()),
                    printable(d.content_type.as_deref().unwrap_or(txbox::JSON_CONTENT_TYPE)),
                    match &d.content_type {
                        None => printable(&d.payload_text()),
                        Some(_) => format!("{} (base64, {} bytes)", d.payload_text(), d.payload.len()),
                    }
                )
            }
        }
        Command::Dlq(DlqCommand::Move) => {
            let moved = dlq.move_failed(usize::MAX)?;
            if as_json {
                json(&serde_json::json!({ "moved": moved }))?
            } else {
                format!("{moved} failed events moved to the dead letters")
            }
        }
        Command::Dlq(
            action @ (DlqCommand::Retry(_) | DlqCommand::Resolve(_) | DlqCommand::Delete(_)),
        ) => {
            let (name, verb, target) = match action {
                DlqCommand::Retry(t) => ("retry", "marked for retry", t),
                DlqCommand::Resolve(t) => ("resolve", "resolved", t),
                DlqCommand::Delete(t) => ("delete", "deleted", t),
                _ => unreachable!("matched above"),
            };
            let done: Vec<String> = match &target.event_type {
                Some(t) => {
                    let n = match name {
                        "retry" => dlq.retry_type(t)?,
                        "resolve" => dlq.resolve_type(t)?,
                        _ => dlq.delete_type(t)?,
                    };
                    vec![format!("{n} dead letters of type {}", printable(t))]
                }
                None => {
                    let mut done = Vec::new();
                    for id in target.ids {
                        match name {
                            "retry" => dlq.retry(id)?,
                            "resolve" => dlq.resolve(id)?,
                            _ => dlq.delete(id)?,
                        }
                        done.push(id.to_string());
                    }
                    done
                }
            };
            if as_json {
                json(&serde_json::json!({ "action": name, "done": done }))?
            } else {
                format!("{verb}: {}", done.join(", "))
            }
        }
    })
}

fn main() -> ExitCode {
    let cli = utf8_args().and_then(|args| {
        Cli::try_parse_from(std::iter::once("txbox".to_string()).chain(args)).map_err(|e| {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                std::process::exit(0);
            }
            Fail::Usage(
                e.to_string()
                    .trim_start_matches("error: ")
                    .trim_end()
                    .to_string(),
            )
        })
    });
    match cli.and_then(run) {
        Ok(out) => {
            println!("{out}");
            ExitCode::SUCCESS
        }
        // what a message quotes (a bad argument, a database's text) is escaped
        // like the output: usage keeps its lines, a run error is one line
        Err(Fail::Usage(msg)) => {
            eprintln!("txbox: {}", escaped_lines(&msg, "\n"));
            ExitCode::from(2)
        }
        Err(Fail::Run(msg)) => {
            eprintln!("txbox: {}", escaped_lines(&msg, " "));
            ExitCode::from(1)
        }
    }
}
