//! A small synchronous HTTP admin endpoint (feature `admin-http`), started by the
//! application on an address it chooses (loopback by default).
//!
//! | route | |
//! |---|---|
//! | `GET /health` | 200 when the database answers (within [`AdminOptions::database_timeout`]) and every relay thread runs, none stuck (busy with one piece of work longer than [`AdminOptions::stuck_after`]), else 503 |
//! | `GET /ready` | 200 when healthy and every relay's broker can be reached and acks its batches (within [`AdminOptions::acks_overdue_after`]), else 503 (a broker outage: the events wait) |
//! | `GET /metrics` | Prometheus text of the process-wide registry ([`crate::metrics::prometheus`]), or of the one given to [`AdminOptions::metrics`] |
//! | `GET /dlq/events?type=&status=&offset=&limit=` | dead letters, JSON |
//! | `GET /dlq/events/{id}` | one dead letter, JSON |
//! | `PATCH /dlq/events/{id}` `{"status": "RETRY" \| "RESOLVED"}` | mark for retry / resolve |
//! | `DELETE /dlq/events/{id}` | delete |
//! | `GET /dlq/blocked?type=T` | the keys of the ordered type `T` (`on_poison = "block"`) waiting behind a dead letter or a FAILED event, `{"keys": [...]}` |
//! | `POST /dlq/move` | move FAILED outbox events to the dead letters now (with the DLQ off, how they are reached), `{"moved": n}` |
//! | `GET /types/paused` | the paused event types, `{"paused": [...]}` |
//! | `POST /types/{type}/pause` | pause the type ([`Pauses::pause`](crate::Pauses::pause)): no relay claims it, `{"paused": true}` when it was running |
//! | `POST /types/{type}/resume` | resume it, waking the relays, `{"resumed": true}` when it was paused |
//!
//! `/health` and `/ready` list the paused types (`"paused": [...]`).
//! Every DLQ and pause route, reads included (dead letters hold payloads, keys and headers),
//! needs `Authorization: Bearer <token>` with the token given to
//! [`AdminOptions::token`] (compared in constant time, the scheme in any case);
//! without a token they are disabled (403). `/health` and `/metrics` are open
//! unless [`AdminOptions::protect_health_and_metrics`]. The route and the token
//! are checked before any body is read; each request is served on a thread of its
//! own within [`AdminOptions::request_timeout`], so a client that stalls never
//! keeps `/health` from answering nor `shutdown` from returning. Malformed JSON,
//! unknown routes and bodies over 64 KiB get a 4xx with `{"error": "..."}`;
//! `/health` says `"database": "unreachable"` and logs why. Both probes answer
//! within about a second whatever the database does: its check runs on a thread
//! of its own, one at a time.
//!
//! ```no_run
//! # fn main() -> txbox::Result<()> {
//! # let store: std::sync::Arc<dyn txbox::FullStore> = std::sync::Arc::new(txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", &txbox::Config::builder().build()?)?);
//! use txbox::admin::{AdminOptions, AdminServer};
//! let server = AdminServer::start(store, AdminOptions::new().token("s3cret"))?;
//! println!("admin on http://{}", server.addr());
//! # Ok(()) }
//! ```

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;

use self::health::{health, DatabaseCheck};
use self::http::{answer, err, error_json, read_body, read_head, reply, Call, Resp};
mod health;
mod http;

use crate::dlq::Dlq;
use crate::error::{Error, Result};
use crate::event::EventId;
use crate::pause::Pauses;
use crate::relay::RelayProbe;
use crate::store::FullStore;
use crate::store::{DlqFilter, DlqStatus};

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Largest request line and headers accepted.
pub const MAX_HEAD: usize = 16 * 1024;

/// Connections served at once; past it a connection is answered 503 (but for
/// the probes, which have [`PROBE_RESERVE`] slots of their own).
pub const MAX_CONCURRENT_REQUESTS: usize = 32;

/// Slots past [`MAX_CONCURRENT_REQUESTS`] that serve only `/health` and
/// `/metrics`, so stalled clients holding every slot do not make the health
/// check fail; past these too, a connection is answered 503 at once.
pub const PROBE_RESERVE: usize = 8;

/// Settings of the admin endpoint.
#[derive(Clone)]
pub struct AdminOptions {
    addr: String,
    token: Option<String>,
    relays: Vec<RelayProbe>,
    protect_probes: bool,
    request_timeout: Duration,
    stuck_after: Duration,
    database_timeout: Duration,
    acks_overdue_after: Duration,
    /// What `/metrics` serves (`None`: the process-wide registry).
    metrics: Option<Arc<crate::metrics::Registry>>,
}

/// The token is a secret: never printed.
impl std::fmt::Debug for AdminOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminOptions")
            .field("addr", &self.addr)
            .field(
                "token",
                &self.token.as_ref().map(|_| crate::redact::REDACTED),
            )
            .field("relays", &self.relays.len())
            .field("protect_probes", &self.protect_probes)
            .field("request_timeout", &self.request_timeout)
            .field("stuck_after", &self.stuck_after)
            .field("database_timeout", &self.database_timeout)
            .field("acks_overdue_after", &self.acks_overdue_after)
            .field("metrics", &self.metrics.as_ref().map(|_| "of its own"))
            .finish()
    }
}

impl Default for AdminOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl AdminOptions {
    /// The default of [`AdminOptions::database_timeout`].
    pub const DATABASE_TIMEOUT: Duration = Duration::from_secs(5);

    /// Loopback, an OS-chosen port, no token (so the DLQ routes are disabled),
    /// `/health` and `/metrics` open, 5 s per request.
    pub fn new() -> Self {
        AdminOptions {
            addr: "127.0.0.1:0".into(),
            token: None,
            relays: Vec::new(),
            protect_probes: false,
            request_timeout: Duration::from_secs(5),
            stuck_after: RelayProbe::STUCK_AFTER,
            database_timeout: Self::DATABASE_TIMEOUT,
            acks_overdue_after: RelayProbe::ACKS_OVERDUE_AFTER,
            metrics: None,
        }
    }

    /// The registry `/metrics` serves: the one a configuration reports to
    /// ([`Config::observed`](crate::Config::observed)); default the
    /// process-wide one ([`crate::metrics::global`]).
    pub fn metrics(mut self, registry: Arc<crate::metrics::Registry>) -> Self {
        self.metrics = Some(registry);
        self
    }

    /// How long a relay thread may be busy with one piece of work (a claim and
    /// its batch, a cleanup pass) before `/health` counts it stuck and answers
    /// 503 (default [`RelayProbe::STUCK_AFTER`], 120 s: longer than the
    /// timeouts of the connections it waits on).
    pub fn stuck_after(mut self, d: Duration) -> Self {
        self.stuck_after = d;
        self
    }

    /// How long `/health`'s check of the database may wait for its answer
    /// before `/health` and `/ready` say 503 (`"database": "no answer for N
    /// ms"`); default [`AdminOptions::DATABASE_TIMEOUT`]. The check runs on a
    /// thread of its own, one at a time (the first as the server starts; a
    /// second once one has waited past this): a request waits for it at most
    /// 0.5 s (0.9 s before the first answer), then answers with the latest
    /// answer while the check has waited less than this (503 before the
    /// first), so both routes answer within a second whatever the database
    /// does.
    pub fn database_timeout(mut self, d: Duration) -> Self {
        self.database_timeout = d;
        self
    }

    /// How long a relay's batch may wait for the broker's acks before
    /// `/ready` says 503 (`"broker": "acks overdue"`): a broker, or a link to
    /// it, that takes the messages and answers nothing. Default
    /// [`RelayProbe::ACKS_OVERDUE_AFTER`]; the sender's own confirm timeout
    /// still ends the wait (and the batch goes back, pending).
    pub fn acks_overdue_after(mut self, d: Duration) -> Self {
        self.acks_overdue_after = d;
        self
    }

    /// The address to listen on (e.g. `127.0.0.1:9464`).
    pub fn addr(mut self, addr: impl Into<String>) -> Self {
        self.addr = addr.into();
        self
    }

    /// The bearer token every DLQ route requires (reads too: dead letters hold
    /// payloads and headers). Without one the DLQ routes answer 403.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Requires the token on `/health` and `/metrics` too (default: open, for
    /// probes and scrapers).
    pub fn protect_health_and_metrics(mut self, on: bool) -> Self {
        self.protect_probes = on;
        self
    }

    /// The longest one request may take to arrive whole, headers and body
    /// (default 5 s, at most 1 h). A client that is slower gets 408 and its
    /// connection is closed.
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d.clamp(Duration::from_millis(1), Duration::from_secs(3600));
        self
    }

    /// A relay whose threads `/health` checks ([`crate::Relay::probe`]).
    pub fn relay(mut self, probe: RelayProbe) -> Self {
        self.relays.push(probe);
        self
    }
}

/// The running endpoint; dropping it (or [`AdminServer::shutdown`]) stops it.
#[must_use = "dropping it stops it"]
pub struct AdminServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// Counts a connection being served for as long as it lives (a panic included).
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AdminServer {
    /// Binds and serves. One thread accepts connections; each is served on a
    /// thread of its own (at most [`MAX_CONCURRENT_REQUESTS`] at once), one
    /// request per connection, within [`AdminOptions::request_timeout`]: a
    /// client that stalls never keeps `/health` from answering nor `shutdown`
    /// from returning.
    pub fn start(store: Arc<dyn FullStore>, options: AdminOptions) -> Result<AdminServer> {
        let io = |context: String| move |e| Error::Io { context, source: e };
        let listener = TcpListener::bind(&options.addr)
            .map_err(io(format!("admin endpoint on {}", options.addr)))?;
        let addr = listener
            .local_addr()
            .map_err(io("admin endpoint address".into()))?;
        let stop = Arc::new(AtomicBool::new(false));
        let stopped = stop.clone();
        let options = Arc::new(options);
        let busy = Arc::new(AtomicUsize::new(0));
        let reading = Readers::default();
        let check = DatabaseCheck::new(store.clone());
        let thread = std::thread::Builder::new()
            .name("txbox-admin-http".into())
            .spawn(move || {
                for stream in listener.incoming() {
                    if stopped.load(Ordering::Acquire) {
                        return;
                    }
                    let stream = match stream {
                        Ok(s) => s,
                        Err(e) => {
                            log::warn!("txbox: admin endpoint: accept: {e}");
                            std::thread::sleep(Duration::from_millis(10));
                            continue;
                        }
                    };
                    let timeout = options.request_timeout;
                    let _ = stream.set_read_timeout(Some(timeout));
                    let _ = stream.set_write_timeout(Some(timeout));
                    // a connection takes a request slot only once its head has
                    // arrived: clients that connect and stall wait among the
                    // readers, the oldest given up when there are too many
                    let reading = reading.arrive(&stream);
                    let served = Served {
                        store: store.clone(),
                        options: options.clone(),
                        check: check.clone(),
                    };
                    let busy = busy.clone();
                    let spawned = std::thread::Builder::new()
                        .name("txbox-admin-request".into())
                        .spawn(move || serve(&served, stream, reading, &busy));
                    if let Err(e) = spawned {
                        log::warn!("txbox: admin endpoint: no thread for a request: {e}");
                    }
                }
            })
            .map_err(io("spawning the admin thread".into()))?;
        Ok(AdminServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// Where it listens.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting and joins the accepting thread. Requests being served
    /// finish on their own threads within the request timeout.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Release);
        if let Some(t) = self.thread.take() {
            // wake the blocking accept with a connection of our own
            let mut wake = self.addr;
            if wake.ip().is_unspecified() {
                wake.set_ip(match wake {
                    SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
                    SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
                });
            }
            if TcpStream::connect_timeout(&wake, Duration::from_secs(1)).is_ok() {
                let _ = t.join();
            } else {
                log::warn!("txbox: admin endpoint: could not wake its accepting thread");
            }
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves one connection: the head, then route and token, then the body (only
/// a route that takes one reads it), all before the deadline; one answer, then
/// the connection closes.
/// Connections whose request head has not arrived yet, at most
/// [`MAX_READING`]: past it the oldest is closed, so clients that connect and
/// send nothing never keep a probe from being read.
#[derive(Clone, Default)]
struct Readers(Arc<std::sync::Mutex<Waiting>>);

/// The last id handed out, and the connections reading their head, oldest first.
type Waiting = (u64, std::collections::VecDeque<(u64, TcpStream)>);

/// Connections read at once before the oldest is given up.
const MAX_READING: usize = 256;

/// One connection among the [`Readers`], until dropped.
struct Reading(Readers, u64);

impl Readers {
    fn arrive(&self, stream: &TcpStream) -> Reading {
        let mut g = self.0.lock().unwrap_or_else(|p| p.into_inner());
        while g.1.len() >= MAX_READING {
            if let Some((_, oldest)) = g.1.pop_front() {
                let _ = oldest.shutdown(std::net::Shutdown::Both);
            }
        }
        g.0 += 1;
        let id = g.0;
        if let Ok(clone) = stream.try_clone() {
            g.1.push_back((id, clone));
        }
        Reading(self.clone(), id)
    }
}

impl Drop for Reading {
    fn drop(&mut self) {
        let mut g = (self.0).0.lock().unwrap_or_else(|p| p.into_inner());
        g.1.retain(|(id, _)| *id != self.1);
    }
}

/// The 503 of a full server.
fn busy_answer() -> Resp {
    err(503, "too many requests at once")
}

/// What a request is served with.
struct Served {
    store: Arc<dyn FullStore>,
    options: Arc<AdminOptions>,
    check: Arc<DatabaseCheck>,
}

fn serve(served: &Served, mut stream: TcpStream, reading: Reading, busy: &Arc<AtomicUsize>) {
    let options = &served.options;
    let deadline = Instant::now() + options.request_timeout;
    let head = read_head(&mut stream, deadline);
    drop(reading);
    let head = match head {
        Ok(h) => h,
        Err(refused) => return answer(stream, &refused, false),
    };
    let taken = busy.fetch_add(1, Ordering::AcqRel);
    let _slot = Slot(busy.clone());
    let probes_only = taken >= MAX_CONCURRENT_REQUESTS;
    if taken >= MAX_CONCURRENT_REQUESTS + PROBE_RESERVE || (probes_only && !is_probe(&head.call)) {
        return answer(stream, &busy_answer(), false);
    }
    if let Err(refused) = authorize(options, &head.call, head.auth.as_deref()) {
        return answer(stream, &refused, true);
    }
    let call = Call {
        method: head.call.method.clone(),
        url: head.call.url.clone(),
    };
    let body = if call.method == "PATCH" {
        match read_body(&mut stream, head, deadline) {
            Ok(b) => b,
            Err(refused) => return answer(stream, &refused, false),
        }
    } else {
        Vec::new()
    };
    let response = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        handle(served, &call, &body)
    }))
    .unwrap_or_else(|_| err(500, "internal error"));
    answer(stream, &response, true);
}

/// A request for `/health` or `/metrics`.
fn is_probe(call: &Call) -> bool {
    let path = call.url.split('?').next().unwrap_or_default();
    matches!(path.trim_matches('/'), "health" | "ready" | "metrics")
}

/// Whether the request may go on: every DLQ route needs the token, `/health`
/// and `/metrics` only when protected. The token is compared in constant time;
/// the scheme `Bearer` in any case.
fn authorize(
    options: &AdminOptions,
    call: &Call,
    auth: Option<&str>,
) -> std::result::Result<(), Resp> {
    if is_probe(call) && !options.protect_probes {
        return Ok(());
    }
    let Some(token) = &options.token else {
        return Err(err(
            403,
            "this route is disabled: no admin token is configured",
        ));
    };
    let given = auth
        .and_then(|a| a.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, t)| t.trim());
    match given {
        Some(t) if bool::from(t.as_bytes().ct_eq(token.as_bytes())) => Ok(()),
        _ => Err(err(401, "missing or wrong bearer token")),
    }
}

fn handle(served: &Served, call: &Call, body: &[u8]) -> Resp {
    let (store, options) = (&served.store, &served.options);
    let path = call.url.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let dlq = Dlq::new(store.clone());
    let result: Result<Resp> = match (call.method.as_str(), segments.as_slice()) {
        ("GET", ["health"]) => Ok(health(&served.check, options, false)),
        ("GET", ["ready"]) => Ok(health(&served.check, options, true)),
        ("GET", ["metrics"]) => Ok(Resp {
            code: 200,
            content_type: "text/plain; version=0.0.4",
            body: options
                .metrics
                .as_ref()
                .map_or_else(crate::metrics::prometheus, |r| r.prometheus()),
        }),
        ("GET", ["dlq", "events"]) => list(&dlq, &call.url),
        ("GET", ["dlq", "events", id]) => id
            .parse::<EventId>()
            .map_err(Error::from)
            .and_then(|id| dlq.get(id))
            .map(|d| json(200, &d)),
        ("PATCH", ["dlq", "events", id]) => patch(&dlq, id, body),
        ("GET", ["dlq", "blocked"]) => blocked(&dlq, &call.url),
        ("POST", ["dlq", "move"]) => dlq
            .move_failed(MOVE_LIMIT)
            .map(|n| json(200, &serde_json::json!({ "moved": n }))),
        ("GET", ["types", "paused"]) => Pauses::new(store.clone())
            .list()
            .map(|p| json(200, &serde_json::json!({ "paused": p }))),
        ("POST", ["types", t, "pause"]) => decoded(t)
            .and_then(|t| Pauses::new(store.clone()).pause(&t))
            .map(|p| json(200, &serde_json::json!({ "paused": p }))),
        ("POST", ["types", t, "resume"]) => decoded(t)
            .and_then(|t| {
                let resumed = Pauses::new(store.clone()).resume(&t)?;
                // this process's relays poll now, whatever the database
                for relay in &options.relays {
                    relay.wake(&t);
                }
                Ok(resumed)
            })
            .map(|r| json(200, &serde_json::json!({ "resumed": r }))),
        ("DELETE", ["dlq", "events", id]) => id
            .parse::<EventId>()
            .map_err(Error::from)
            .and_then(|id| dlq.delete(id))
            .map(|()| reply(204, "")),
        (
            _,
            ["health"]
            | ["ready"]
            | ["metrics"]
            | ["dlq", "events"]
            | ["dlq", "events", _]
            | ["dlq", "move"]
            | ["dlq", "blocked"]
            | ["types", "paused"]
            | ["types", _, "pause" | "resume"],
        ) => {
            return err(
                405,
                &format!("method {} not allowed on {path}", call.method),
            )
        }
        _ => return err(404, &format!("no route {} {path}", call.method)),
    };
    result.unwrap_or_else(|e| match e {
        Error::NotFound(_) => err(404, &e.to_string()),
        Error::InvalidInput(_) | Error::MissingEventId(_) | Error::InvalidEvent(_) => {
            err(400, &e.to_string())
        }
        Error::InvalidTransition { .. } => err(409, &e.to_string()),
        other => err(500, &other.to_string()),
    })
}

/// Most FAILED events one `POST /dlq/move` moves (call it again for more).
const MOVE_LIMIT: usize = 10_000;

fn json<T: serde::Serialize>(code: u16, v: &T) -> Resp {
    reply(
        code,
        &serde_json::to_string(v).unwrap_or_else(|e| error_json(&e.to_string())),
    )
}

fn list(dlq: &Dlq, url: &str) -> Result<Resp> {
    let mut filter = DlqFilter::default();
    for (k, v) in query_params(url) {
        let number = |v: &str| {
            v.parse::<u64>()
                .map_err(|_| Error::InvalidInput(format!("{k} must be a whole number, not {v:?}")))
        };
        match k.as_str() {
            "type" => filter.event_type = Some(v),
            "status" => filter.status = Some(v.parse()?),
            "offset" => filter.offset = number(&v)?,
            "limit" => filter.limit = number(&v)?,
            other => {
                return Err(Error::InvalidInput(format!(
                    "unknown query parameter {other:?}"
                )))
            }
        }
    }
    let events = dlq.list(&filter)?;
    let total = dlq.count(&filter)?;
    Ok(json(
        200,
        &serde_json::json!({ "total": total, "offset": filter.offset, "events": events }),
    ))
}

/// `GET /dlq/blocked?type=T`: the blocked keys of the ordered type `T`.
fn blocked(dlq: &Dlq, url: &str) -> Result<Resp> {
    let mut event_type = None;
    for (k, v) in query_params(url) {
        match k.as_str() {
            "type" => event_type = Some(v),
            other => {
                return Err(Error::InvalidInput(format!(
                    "unknown query parameter {other:?}"
                )))
            }
        }
    }
    let event_type = event_type.ok_or_else(|| {
        Error::InvalidInput("the query parameter type (an ordered event type) is missing".into())
    })?;
    let keys = dlq.blocked_keys_of(&event_type)?;
    Ok(json(200, &serde_json::json!({ "keys": keys })))
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Patch {
    status: String,
}

fn patch(dlq: &Dlq, id: &str, body: &[u8]) -> Result<Resp> {
    let id = id.parse()?;
    let patch: Patch = serde_json::from_slice(body).map_err(|e| {
        Error::InvalidInput(format!(
            "body must be {{\"status\": \"RETRY\" | \"RESOLVED\"}}: {e}"
        ))
    })?;
    match patch.status.parse::<DlqStatus>()? {
        DlqStatus::Retry => dlq.retry(id)?,
        DlqStatus::Resolved => dlq.resolve(id)?,
        DlqStatus::Dead => {
            return Err(Error::InvalidInput(
                "status DEAD cannot be set; use RETRY or RESOLVED".into(),
            ))
        }
    }
    Ok(json(
        200,
        &dlq.get(id)
            .map(|d| serde_json::to_value(d).unwrap_or_default())
            .unwrap_or_else(|_| serde_json::json!({"id": id, "status": patch.status})),
    ))
}

/// A path segment percent-decoded (an event type may hold any character
/// but `/`); one that is no UTF-8 is a bad request.
fn decoded(segment: &str) -> Result<String> {
    percent_encoding::percent_decode_str(segment)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| Error::InvalidInput(format!("{segment:?} is no UTF-8 once decoded")))
}

fn query_params(url: &str) -> Vec<(String, String)> {
    url.split_once('?')
        .map(|(_, q)| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}
