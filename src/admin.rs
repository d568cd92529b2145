//! A small synchronous HTTP admin endpoint (feature `admin-http`), started by the
//! application on an address it chooses (loopback by default).
//!
//! | route | |
//! |---|---|
//! | `GET /health` | 200 when the database answers and every relay thread runs, else 503 |
//! | `GET /metrics` | Prometheus text ([`crate::metrics::prometheus`]) |
//! | `GET /dlq/events?type=&status=&offset=&limit=` | dead letters, JSON |
//! | `GET /dlq/events/{id}` | one dead letter, JSON |
//! | `PATCH /dlq/events/{id}` `{"status": "RETRY" \| "RESOLVED"}` | mark for retry / resolve |
//! | `DELETE /dlq/events/{id}` | delete |
//! | `POST /dlq/move` | move FAILED outbox events to the dead letters now (with the DLQ off, how they are reached), `{"moved": n}` |
//!
//! Every DLQ route, reads included (dead letters hold payloads, keys and headers),
//! needs `Authorization: Bearer <token>` with the token given to
//! [`AdminOptions::token`] (compared in constant time, the scheme in any case);
//! without a token they are disabled (403). `/health` and `/metrics` are open
//! unless [`AdminOptions::protect_health_and_metrics`]. The route and the token
//! are checked before any body is read; each request is served on a thread of its
//! own within [`AdminOptions::request_timeout`], so a client that stalls never
//! keeps `/health` from answering nor `shutdown` from returning. Malformed JSON,
//! unknown routes and bodies over 64 KiB get a 4xx with `{"error": "..."}`;
//! `/health` says `"database": "unreachable"` and logs why.
//!
//! ```no_run
//! # fn main() -> txbox::Result<()> {
//! # let store: std::sync::Arc<dyn txbox::Store> = std::sync::Arc::new(txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", "")?);
//! use txbox::admin::{AdminOptions, AdminServer};
//! let server = AdminServer::start(store, AdminOptions::new().token("s3cret"))?;
//! println!("admin on http://{}", server.addr());
//! # Ok(()) }
//! ```

use std::net::{SocketAddr, TcpListener, ToSocketAddrs};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use subtle::ConstantTimeEq;
use tiny_http::{Header, Method, Request, Response, Server};

use crate::dlq::{Dlq, DlqFilter, DlqStatus};
use crate::error::{Error, Result};
use crate::relay::RelayProbe;
use crate::store::Store;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Requests served at once; past it a request is answered 503 at once.
pub const MAX_CONCURRENT_REQUESTS: usize = 32;

/// Settings of the admin endpoint.
#[derive(Clone)]
pub struct AdminOptions {
    addr: String,
    token: Option<String>,
    relays: Vec<RelayProbe>,
    protect_probes: bool,
    request_timeout: Duration,
}

/// The token is a secret: never printed.
impl std::fmt::Debug for AdminOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminOptions")
            .field("addr", &self.addr)
            .field("token", &self.token.as_ref().map(|_| "<redacted>"))
            .field("relays", &self.relays.len())
            .field("protect_probes", &self.protect_probes)
            .field("request_timeout", &self.request_timeout)
            .finish()
    }
}

impl Default for AdminOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl AdminOptions {
    /// Loopback, an OS-chosen port, no token (so the DLQ routes are disabled),
    /// `/health` and `/metrics` open, 5 s per request.
    pub fn new() -> Self {
        AdminOptions {
            addr: "127.0.0.1:0".into(),
            token: None,
            relays: Vec::new(),
            protect_probes: false,
            request_timeout: Duration::from_secs(5),
        }
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

    /// The longest one request may take to arrive whole (default 5 s): each read
    /// and write on its socket, and the body as a whole. A client that stalls
    /// past it gets 408 and its connection is closed.
    pub fn request_timeout(mut self, d: Duration) -> Self {
        self.request_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// A relay whose threads `/health` checks ([`crate::Relay::probe`]).
    pub fn relay(mut self, probe: RelayProbe) -> Self {
        self.relays.push(probe);
        self
    }
}

/// The running endpoint; dropping it (or [`AdminServer::shutdown`]) stops it.
pub struct AdminServer {
    server: Arc<Server>,
    addr: SocketAddr,
    thread: Option<JoinHandle<()>>,
}

/// Binds `addr` with read and write timeouts on the listening socket, which
/// every accepted connection takes on (Linux): a client that stalls cannot hold
/// a thread of the endpoint for longer than `timeout` per read or write.
fn bind(addr: &str, timeout: Duration) -> std::io::Result<TcpListener> {
    use socket2::{Domain, Socket, Type};
    let addr = addr
        .to_socket_addrs()?
        .next()
        .ok_or_else(|| std::io::Error::other("no address"))?;
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, None)?;
    socket.set_reuse_address(true)?;
    socket.bind(&addr.into())?;
    socket.listen(128)?;
    socket.set_read_timeout(Some(timeout))?;
    socket.set_write_timeout(Some(timeout))?;
    Ok(socket.into())
}

impl AdminServer {
    /// Binds and serves. One thread accepts requests; each request is served on
    /// a thread of its own (at most [`MAX_CONCURRENT_REQUESTS`] at once), so a
    /// client that stalls never keeps `/health` from answering.
    pub fn start(store: Arc<dyn Store>, options: AdminOptions) -> Result<AdminServer> {
        let listener = bind(&options.addr, options.request_timeout).map_err(|e| Error::Io {
            context: format!("admin endpoint on {}", options.addr),
            source: e,
        })?;
        let server = Server::from_listener(listener, None)
            .map_err(|e| Error::InvalidInput(format!("admin endpoint on {}: {e}", options.addr)))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| Error::InvalidInput("admin endpoint: not an IP address".into()))?;
        let server = Arc::new(server);
        let s = server.clone();
        let options = Arc::new(options);
        let busy = Arc::new(AtomicUsize::new(0));
        let thread = std::thread::Builder::new()
            .name("txbox-admin-http".into())
            .spawn(move || {
                for request in s.incoming_requests() {
                    if busy.fetch_add(1, Ordering::AcqRel) >= MAX_CONCURRENT_REQUESTS {
                        busy.fetch_sub(1, Ordering::AcqRel);
                        let _ = request.respond(err(503, "too many requests at once"));
                        continue;
                    }
                    let (store, options, busy) = (store.clone(), options.clone(), busy.clone());
                    let spawned = std::thread::Builder::new()
                        .name("txbox-admin-request".into())
                        .spawn(move || {
                            serve(&store, &options, request);
                            busy.fetch_sub(1, Ordering::AcqRel);
                        });
                    if let Err(e) = spawned {
                        log::warn!("txbox: admin endpoint: no thread for a request: {e}");
                    }
                }
            })
            .map_err(|e| Error::Io {
                context: "spawning the admin thread".into(),
                source: e,
            })?;
        Ok(AdminServer {
            server,
            addr,
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
        self.server.unblock();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Serves one request: route and token first, the body (only a route that takes
/// one reads it) within the request timeout.
fn serve(store: &Arc<dyn Store>, options: &AdminOptions, mut request: Request) {
    let deadline = Instant::now() + options.request_timeout;
    let auth = request
        .headers()
        .iter()
        .find(|h| h.field.equiv("Authorization"))
        .map(|h| h.value.as_str().to_string());
    let call = Call {
        method: request.method().clone(),
        url: request.url().to_string(),
    };
    let response = match authorize(options, &call, auth.as_deref()) {
        Err(refused) => refused,
        Ok(()) => {
            let body = if call.method == Method::Patch {
                read_body(&mut request, deadline)
            } else {
                Ok(Vec::new())
            };
            match body {
                Err(refused) => refused,
                Ok(body) => std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    handle(store, options, &call, &body)
                }))
                .unwrap_or_else(|_| err(500, "internal error")),
            }
        }
    };
    let _ = request.respond(response);
}

/// Whether the request may go on: every DLQ route needs the token, `/health`
/// and `/metrics` only when protected. The token is compared in constant time;
/// the scheme `Bearer` in any case.
#[allow(clippy::result_large_err)] // the refusal is the response itself
fn authorize(
    options: &AdminOptions,
    call: &Call,
    auth: Option<&str>,
) -> std::result::Result<(), Resp> {
    let path = call.url.split('?').next().unwrap_or_default();
    let probe = matches!(path.trim_matches('/'), "health" | "metrics");
    if probe && !options.protect_probes {
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

/// Reads the body up to [`MAX_BODY`] bytes before `deadline`.
#[allow(clippy::result_large_err)] // the refusal is the response itself
fn read_body(request: &mut Request, deadline: Instant) -> std::result::Result<Vec<u8>, Resp> {
    if request.body_length().is_some_and(|n| n > MAX_BODY) {
        return Err(err(
            413,
            &format!("request body larger than {MAX_BODY} bytes"),
        ));
    }
    let reader = request.as_reader();
    let mut body = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        if Instant::now() > deadline {
            return Err(err(408, "the request body did not arrive in time"));
        }
        match reader.read(&mut chunk) {
            Ok(0) => return Ok(body),
            Ok(n) => {
                body.extend_from_slice(&chunk[..n]);
                if body.len() > MAX_BODY {
                    return Err(err(
                        413,
                        &format!("request body larger than {MAX_BODY} bytes"),
                    ));
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Err(err(408, "the request body did not arrive in time")),
        }
    }
}

/// What `handle` needs of a request.
struct Call {
    method: Method,
    url: String,
}

type Resp = Response<std::io::Cursor<Vec<u8>>>;

fn reply(code: u16, body: &str) -> Resp {
    let ct = Header::from_bytes("Content-Type", "application/json").expect("static header");
    Response::from_string(body)
        .with_status_code(code)
        .with_header(ct)
}

fn error_json(msg: &str) -> String {
    serde_json::json!({ "error": msg }).to_string()
}

fn err(code: u16, msg: &str) -> Resp {
    reply(code, &error_json(msg))
}

fn handle(store: &Arc<dyn Store>, options: &AdminOptions, call: &Call, body: &[u8]) -> Resp {
    let path = call.url.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let dlq = Dlq::new(store.clone());
    let result: Result<Resp> = match (&call.method, segments.as_slice()) {
        (Method::Get, ["health"]) => Ok(health(store, options)),
        (Method::Get, ["metrics"]) => {
            let ct = Header::from_bytes("Content-Type", "text/plain; version=0.0.4")
                .expect("static header");
            Ok(Response::from_string(crate::metrics::prometheus()).with_header(ct))
        }
        (Method::Get, ["dlq", "events"]) => list(&dlq, &call.url),
        (Method::Get, ["dlq", "events", id]) => {
            id.parse().and_then(|id| dlq.get(id)).map(|d| json(200, &d))
        }
        (Method::Patch, ["dlq", "events", id]) => patch(&dlq, id, body),
        (Method::Post, ["dlq", "move"]) => dlq
            .move_failed(MOVE_LIMIT)
            .map(|n| json(200, &serde_json::json!({ "moved": n }))),
        (Method::Delete, ["dlq", "events", id]) => id
            .parse()
            .and_then(|id| dlq.delete(id))
            .map(|()| reply(204, "")),
        (
            _,
            ["health"] | ["metrics"] | ["dlq", "events"] | ["dlq", "events", _] | ["dlq", "move"],
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
        Error::InvalidInput(_) | Error::MissingEventId(_) => err(400, &e.to_string()),
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

fn health(store: &Arc<dyn Store>, options: &AdminOptions) -> Resp {
    // a short reason only: the error's text (hosts, users, server messages) goes
    // to the log, not to whoever reaches the port
    let database = match store.ping() {
        Ok(_) => "ok",
        Err(e) => {
            log::warn!("txbox: admin /health: the database does not answer: {e}");
            "unreachable"
        }
    };
    let threads: Vec<(usize, usize)> = options.relays.iter().map(RelayProbe::threads).collect();
    let relays_ok = threads.iter().all(|(running, all)| running == all);
    let ok = database == "ok" && relays_ok;
    let body = serde_json::json!({
        "status": if ok { "ok" } else { "unhealthy" },
        "database": database,
        "relays": threads.iter().map(|(r, a)| serde_json::json!({"running": r, "threads": a})).collect::<Vec<_>>(),
    });
    json(if ok { 200 } else { 503 }, &body)
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

fn query_params(url: &str) -> Vec<(String, String)> {
    url.split_once('?')
        .map(|(_, q)| form_urlencoded::parse(q.as_bytes()).into_owned().collect())
        .unwrap_or_default()
}
