//! `txbox relay` and `txbox check`: the relay as a process of its own, from
//! one TOML file: the event types as `Config::from_toml` reads them, the
//! broker (`[kafka]` or `[rabbitmq]`, read by the broker's module), and the
//! process's own sections:
//!
//! ```toml
//! database_url_env = "TXBOX_DATABASE_URL"  # or database_url = "postgres://..."
//! [relay]
//! shutdown_timeout = "30s"   # SIGTERM: the in-flight batches' deadline
//! [admin]                    # optional: /health, /ready, /metrics, the DLQ and pauses
//! addr = "0.0.0.0:9464"
//! token_env = "TXBOX_ADMIN_TOKEN"
//! [log]
//! level = "info"             # RUST_LOG overrides it
//! format = "text"            # or "json"; --log-format overrides it
//! ```
//!
//! Secrets come from environment variables the file names (`*_env`,
//! `[kafka.env]`); their values are never printed or logged.

use std::time::Duration;

use serde::Deserialize;
use txbox::{Config, FullStore, SenderFactory};

use super::Fail;

/// The process's own sections of the file.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct Process {
    database_url: Option<String>,
    database_url_env: Option<String>,
    #[serde(default)]
    relay: RelaySection,
    admin: Option<AdminSection>,
    #[serde(default)]
    log: LogSection,
}

/// `[relay]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RelaySection {
    /// SIGTERM and SIGINT: how long the in-flight batches may take to finish.
    #[serde(default = "default_shutdown", deserialize_with = "duration")]
    shutdown_timeout: Duration,
}

impl Default for RelaySection {
    fn default() -> Self {
        RelaySection {
            shutdown_timeout: default_shutdown(),
        }
    }
}

fn default_shutdown() -> Duration {
    Duration::from_secs(30)
}

/// A duration as the configuration spells it (`"30s"`).
fn duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let s = String::deserialize(d)?;
    humantime::parse_duration(s.trim()).map_err(|_| {
        serde::de::Error::custom(format!(
            "has invalid duration {s:?} (use e.g. \"250ms\", \"10s\", \"1m\")"
        ))
    })
}

/// `[admin]`: the HTTP admin endpoint.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(not(feature = "admin-http"), allow(dead_code))]
struct AdminSection {
    addr: String,
    /// The environment variable that holds the bearer token of the DLQ and
    /// pause routes (none: they are disabled).
    token_env: Option<String>,
    #[serde(default)]
    protect_health_and_metrics: bool,
}

/// `[log]`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct LogSection {
    #[serde(default = "default_level")]
    level: String,
    #[serde(default)]
    format: LogFormat,
}

impl Default for LogSection {
    fn default() -> Self {
        LogSection {
            level: default_level(),
            format: LogFormat::Text,
        }
    }
}

fn default_level() -> String {
    "info".into()
}

/// How the process writes its log.
#[derive(Deserialize, Default, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub(crate) enum LogFormat {
    /// A line of text per record.
    #[default]
    Text,
    /// A JSON object per line: `ts`, `level`, `target`, `msg`.
    Json,
}

/// The sender of the broker the file names: the broker's own, every
/// question of the relay's answered by it.
enum FileSender {
    #[cfg(feature = "kafka")]
    Kafka(txbox::kafka::KafkaSender),
    #[cfg(feature = "rabbitmq")]
    Rabbitmq(txbox::rabbitmq::RabbitSender),
}

impl FileSender {
    fn inner(&self) -> &dyn SenderFactory {
        // by place, not by reference: built without a broker the enum has no
        // variant, and `match *self {}` is then exhaustive (`match self {}`
        // on a reference is not: E0004)
        match *self {
            #[cfg(feature = "kafka")]
            FileSender::Kafka(ref s) => s,
            #[cfg(feature = "rabbitmq")]
            FileSender::Rabbitmq(ref s) => s,
        }
    }
}

impl SenderFactory for FileSender {
    fn create(&self) -> txbox::Result<Box<dyn txbox::Sender>> {
        self.inner().create()
    }
    fn ack_wait(&self) -> Option<Duration> {
        self.inner().ack_wait()
    }
    fn check_destination(&self, destination: &str) -> Result<(), String> {
        self.inner().check_destination(destination)
    }
    fn check_event_types(&self, event_types: &[&str]) -> txbox::Result<()> {
        self.inner().check_event_types(event_types)
    }
}

/// The broker the file names.
enum Broker {
    Kafka,
    Rabbitmq,
}

/// The file, read and checked: the relay's configuration, the process's
/// sections and the broker.
pub(crate) struct RelayFile {
    /// The broker's section is read from it (a build without a broker's
    /// feature reads none).
    #[cfg_attr(not(any(feature = "kafka", feature = "rabbitmq")), allow(dead_code))]
    text: String,
    config: Config,
    process: Process,
    broker: Broker,
}

/// The process's keys, taken out of the file before `Config::from_toml`
/// reads the rest.
const PROCESS_KEYS: [&str; 5] = ["database_url", "database_url_env", "relay", "admin", "log"];

/// A configuration error: exit code 2 (a usage error), the key path first.
fn bad(e: impl std::fmt::Display) -> Fail {
    Fail::Usage(format!("configuration: {e}"))
}

impl RelayFile {
    /// Reads and checks `path`; every error names the key path.
    pub(crate) fn read(path: &str) -> Result<RelayFile, Fail> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Fail::Usage(format!("reading {path}: {e}")))?;
        let mut root: toml::Table = text
            .parse()
            .map_err(|e: toml::de::Error| bad(format!("{path} is no TOML: {}", e.message())))?;
        let mut own = toml::Table::new();
        for key in PROCESS_KEYS {
            if let Some(v) = root.remove(key) {
                own.insert(key.into(), v);
            }
        }
        let process: Process =
            serde_path_to_error::deserialize(toml::Value::Table(own)).map_err(|e| {
                let path = e.path().to_string();
                bad(format!("{path} {}", e.into_inner().message()))
            })?;
        let config = Config::from_toml(&toml::to_string(&root).map_err(bad)?).map_err(bad)?;
        let broker = match (root.contains_key("kafka"), root.contains_key("rabbitmq")) {
            (true, false) => Broker::Kafka,
            (false, true) => Broker::Rabbitmq,
            (true, true) => {
                return Err(bad(
                    "the file names two brokers: keep [kafka] or [rabbitmq]",
                ))
            }
            (false, false) => return Err(bad("no broker: add a [kafka] or a [rabbitmq] table")),
        };
        if config.events().next().is_none() {
            return Err(bad(
                "events: name at least one event type ([events.<type>])",
            ));
        }
        let file = RelayFile {
            text,
            config,
            process,
            broker,
        };
        // the broker's table is read and checked now too
        file.sender()?;
        Ok(file)
    }

    /// The database URL: the file's, or the environment variable it names,
    /// or `TXBOX_DATABASE_URL`.
    fn database_url(&self, cli: Option<&str>) -> Result<String, Fail> {
        let p = &self.process;
        if let Some(url) = cli {
            return Ok(url.to_owned());
        }
        match (&p.database_url, &p.database_url_env) {
            (Some(url), None) => Ok(url.clone()),
            (None, Some(var)) => std::env::var(var).map_err(|_| {
                bad(format!(
                    "database_url_env names the environment variable {var:?}, which is not set"
                ))
            }),
            (Some(_), Some(_)) => Err(bad("database_url and database_url_env: keep one")),
            (None, None) => std::env::var("TXBOX_DATABASE_URL")
                .map_err(|_| bad("database_url: set it, database_url_env, or TXBOX_DATABASE_URL")),
        }
    }

    /// The sender of the file's broker.
    fn sender(&self) -> Result<FileSender, Fail> {
        match self.broker {
            #[cfg(feature = "kafka")]
            Broker::Kafka => Ok(FileSender::Kafka(
                txbox::kafka::KafkaSender::from_toml(&self.text).map_err(bad)?,
            )),
            #[cfg(feature = "rabbitmq")]
            Broker::Rabbitmq => Ok(FileSender::Rabbitmq(
                txbox::rabbitmq::RabbitSender::from_toml(&self.text).map_err(bad)?,
            )),
            #[allow(unreachable_patterns)]
            _ => Err(bad(
                "this txbox was built without that broker's feature (kafka, rabbitmq)",
            )),
        }
    }

    fn broker_name(&self) -> &'static str {
        match self.broker {
            Broker::Kafka => "kafka",
            Broker::Rabbitmq => "rabbitmq",
        }
    }

    /// The store on the file's database, migrated.
    fn store(&self, cli_url: Option<&str>) -> Result<std::sync::Arc<dyn FullStore>, Fail> {
        let store = self.config.connect(&self.database_url(cli_url)?)?;
        store.migrate()?;
        Ok(store)
    }

    /// Sets the process's log up: the file's level (`RUST_LOG` overrides it)
    /// in `format` (the command line's, else the file's).
    pub(crate) fn init_log(&self, format: Option<LogFormat>) {
        init_log(
            &self.process.log.level,
            format.unwrap_or(self.process.log.format),
        );
    }
}

/// env_logger at `level` (unless `RUST_LOG` says), text or JSON lines.
fn init_log(level: &str, format: LogFormat) {
    use std::io::Write;
    let mut b = env_logger::Builder::new();
    b.parse_filters(level);
    if let Ok(filters) = std::env::var("RUST_LOG") {
        b.parse_filters(&filters);
    }
    b.format(move |buf, record| {
        // amiquip's debug records spell out the AMQP login, password and
        // all: none below info is written, whatever the filters ask (a
        // secret is never logged)
        if record.target().starts_with("amiquip") && record.level() > log::Level::Info {
            return Ok(());
        }
        let ts = humantime::format_rfc3339_millis(std::time::SystemTime::now());
        match format {
            LogFormat::Json => writeln!(
                buf,
                "{}",
                serde_json::json!({
                    "ts": ts.to_string(),
                    "level": record.level().as_str(),
                    "target": record.target(),
                    "msg": record.args().to_string(),
                })
            ),
            LogFormat::Text => writeln!(
                buf,
                "{ts} {:<5} {}: {}",
                record.level(),
                record.target(),
                record.args()
            ),
        }
    });
    let _ = b.try_init();
}

/// `txbox check`: the effective settings per event type (the defaults
/// merged), the broker and the process's sections.
pub(crate) fn check(file: &RelayFile, as_json: bool) -> Result<String, Fail> {
    let c = &file.config;
    // each type's settings, once, for either output
    let types: Vec<(&str, Vec<(&str, String)>)> = c
        .events()
        .map(|(t, s)| {
            let settings = vec![
                (
                    "destination",
                    format!("{:?}", s.destination.as_deref().unwrap_or(t)),
                ),
                ("batch_size", s.batch_size.to_string()),
                ("in_flight", s.in_flight.to_string()),
                ("polling", format!("{:?}", s.polling)),
                ("max_retries", s.max_retries.to_string()),
                ("backoff", format!("{:?}", s.backoff)),
                ("lease", format!("{:?}", s.lease)),
                ("claim", s.claim.to_string()),
                ("wake", s.wake.to_string()),
                ("ordering", s.ordering.to_string()),
                ("on_poison", s.on_poison.to_string()),
            ];
            (t, settings)
        })
        .collect();
    let p = &file.process;
    if as_json {
        let events: serde_json::Map<String, serde_json::Value> = types
            .iter()
            .map(|(t, settings)| {
                let fields = settings
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), v.clone().into()));
                ((*t).to_owned(), serde_json::Value::Object(fields.collect()))
            })
            .collect();
        let summary = serde_json::json!({
            "table_prefix": c.table_prefix(),
            "broker": file.broker_name(),
            "shutdown_timeout": format!("{:?}", p.relay.shutdown_timeout),
            "admin": p.admin.as_ref().map(|a| a.addr.clone()),
            "events": events,
        });
        return serde_json::to_string_pretty(&summary).map_err(|e| Fail::Run(e.to_string()));
    }
    let mut out = format!(
        "ok: table prefix {:?}, broker {}, shutdown timeout {:?}{}",
        c.table_prefix(),
        file.broker_name(),
        p.relay.shutdown_timeout,
        p.admin
            .as_ref()
            .map_or(String::new(), |a| format!(", admin on {}", a.addr))
    );
    for (t, settings) in types {
        out.push_str(&format!("\n[events.{}]", super::printable(t)));
        for (k, v) in settings {
            out.push_str(&format!("\n  {k} = {v}"));
        }
    }
    Ok(out)
}

/// `txbox relay --once`: everything due now, on this thread; a summary per
/// type. An error when some event was not sent (retried, failed, released).
pub(crate) fn once(file: &RelayFile, cli_url: Option<&str>, as_json: bool) -> Result<String, Fail> {
    let store = file.store(cli_url)?;
    let mut sender = file.sender()?.create()?;
    let report = txbox::Relay::deliver_pending(&*store, &file.config, &mut *sender)?;
    let lines: Vec<String> = report
        .by_type
        .iter()
        .map(|(t, d)| {
            format!(
                "{}: sent {}, retried {}, failed {}, released {}",
                super::printable(t),
                d.sent,
                d.retried,
                d.failed,
                d.released
            )
        })
        .collect();
    let out = if as_json {
        let by_type: serde_json::Map<String, serde_json::Value> = report
            .by_type
            .iter()
            .map(|(t, d)| {
                (
                    t.clone(),
                    serde_json::json!({"sent": d.sent, "retried": d.retried, "failed": d.failed, "released": d.released}),
                )
            })
            .collect();
        serde_json::json!({"sent": report.sent(), "not_sent": report.not_sent(), "by_type": by_type})
            .to_string()
    } else if lines.is_empty() {
        "nothing was due".into()
    } else {
        lines.join("\n")
    };
    if report.not_sent() > 0 {
        println!("{out}");
        return Err(Fail::Run(format!(
            "{} events were not sent (they wait in the outbox)",
            report.not_sent()
        )));
    }
    Ok(out)
}

/// `txbox relay`: runs until SIGTERM or SIGINT, then stops claiming,
/// finishes the batches in flight within `[relay] shutdown_timeout`,
/// releases what was not sent and exits 0; 1 when the deadline passed with
/// work unfinished. A second signal exits at once (130).
pub(crate) fn run(file: &RelayFile, cli_url: Option<&str>) -> Result<String, Fail> {
    use signal_hook::consts::{SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGTERM, SIGINT])
        .map_err(|e| Fail::Run(format!("listening for signals: {e}")))?;
    // what can still refuse to start is asked before the relay claims
    // anything: a relay dropped without its shutdown would leave its
    // batches to their lease
    #[cfg(feature = "admin-http")]
    let admin_token = match file
        .process
        .admin
        .as_ref()
        .and_then(|a| a.token_env.as_ref())
    {
        Some(var) => Some(std::env::var(var).map_err(|_| {
            bad(format!(
                "admin.token_env names the environment variable {var:?}, which is not set"
            ))
        })?),
        None => None,
    };
    let store = file.store(cli_url)?;
    let relay = txbox::Relay::start(store.clone(), &file.config, file.sender()?)?;
    #[cfg(feature = "admin-http")]
    let admin = match &file.process.admin {
        Some(a) => {
            let mut options = txbox::admin::AdminOptions::new()
                .addr(a.addr.clone())
                .protect_health_and_metrics(a.protect_health_and_metrics)
                .relay(relay.probe());
            if let Some(token) = admin_token {
                options = options.token(token);
            }
            match txbox::admin::AdminServer::start(store.clone(), options) {
                Ok(server) => {
                    log::info!("txbox: admin endpoint on {}", server.addr());
                    Some(server)
                }
                Err(e) => {
                    // stopped as on a signal: nothing left claimed
                    let _ = relay.shutdown(file.process.relay.shutdown_timeout);
                    return Err(e.into());
                }
            }
        }
        None => None,
    };
    log::info!(
        "txbox: relaying {} event types to {}; SIGTERM or SIGINT stops",
        file.config.events().count(),
        file.broker_name()
    );
    let first = signals.forever().next();
    log::info!(
        "txbox: signal {}: finishing the batches in flight (within {:?}; a second signal exits at once)",
        first.unwrap_or_default(),
        file.process.relay.shutdown_timeout
    );
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            log::warn!("txbox: second signal: exiting at once");
            std::process::exit(130);
        }
    });
    #[cfg(feature = "admin-http")]
    if let Some(server) = admin {
        server.shutdown();
    }
    match relay.shutdown(file.process.relay.shutdown_timeout) {
        Ok(()) => Ok("stopped: every batch in flight finished".into()),
        Err(txbox::Error::ShutdownTimeout(n)) => Err(Fail::Run(format!(
            "the shutdown deadline passed with {n} relay threads still busy; their leased \
             batches were released (pending again, sent by the next relay)"
        ))),
        Err(e) => Err(e.into()),
    }
}
