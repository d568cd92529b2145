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
//! Mutating routes need `Authorization: Bearer <token>` with the token given to
//! [`AdminOptions::token`]; without a token they are disabled (403). Malformed JSON,
//! unknown routes and bodies over 64 KiB get a 4xx with `{"error": "..."}`.
//!
//! ```no_run
//! # fn main() -> txbox::Result<()> {
//! # let store: std::sync::Arc<dyn txbox::Store> = std::sync::Arc::new(txbox::PgStore::connect("postgres://postgres@127.0.0.1/test", "")?);
//! use txbox::admin::{AdminOptions, AdminServer};
//! let server = AdminServer::start(store, AdminOptions::new().token("s3cret"))?;
//! println!("admin on http://{}", server.addr());
//! # Ok(()) }
//! ```

use std::io::Read;
use std::net::SocketAddr;
use std::sync::Arc;
use std::thread::JoinHandle;

use tiny_http::{Header, Method, Request, Response, Server};

use crate::dlq::{Dlq, DlqFilter, DlqStatus};
use crate::error::{Error, Result};
use crate::relay::RelayProbe;
use crate::store::Store;

/// Largest request body accepted.
pub const MAX_BODY: usize = 64 * 1024;

/// Settings of the admin endpoint.
#[derive(Clone)]
pub struct AdminOptions {
    addr: String,
    token: Option<String>,
    relays: Vec<RelayProbe>,
}

impl Default for AdminOptions {
    fn default() -> Self {
        Self::new()
    }
}

impl AdminOptions {
    /// Loopback, an OS-chosen port, mutating routes disabled.
    pub fn new() -> Self {
        AdminOptions {
            addr: "127.0.0.1:0".into(),
            token: None,
            relays: Vec::new(),
        }
    }

    /// The address to listen on (e.g. `127.0.0.1:9464`).
    pub fn addr(mut self, addr: impl Into<String>) -> Self {
        self.addr = addr.into();
        self
    }

    /// The bearer token mutating routes require.
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
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

impl AdminServer {
    /// Binds and serves on one thread.
    pub fn start(store: Arc<dyn Store>, options: AdminOptions) -> Result<AdminServer> {
        let server = Server::http(&options.addr)
            .map_err(|e| Error::InvalidInput(format!("admin endpoint on {}: {e}", options.addr)))?;
        let addr = server
            .server_addr()
            .to_ip()
            .ok_or_else(|| Error::InvalidInput("admin endpoint: not an IP address".into()))?;
        let server = Arc::new(server);
        let s = server.clone();
        let thread = std::thread::Builder::new()
            .name("txbox-admin-http".into())
            .spawn(move || {
                for mut request in s.incoming_requests() {
                    let call = Call::read(&mut request);
                    let response = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                        handle(&store, &options, &call)
                    }))
                    .unwrap_or_else(|_| err(500, "internal error"));
                    let _ = request.respond(response);
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

    /// Stops serving and joins the thread.
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

/// What `handle` needs of a request: the body is read up to the limit.
struct Call {
    method: Method,
    url: String,
    auth: Option<String>,
    /// `None`: larger than [`MAX_BODY`].
    body: Option<Vec<u8>>,
}

impl Call {
    fn read(r: &mut Request) -> Call {
        let auth = r
            .headers()
            .iter()
            .find(|h| h.field.equiv("Authorization"))
            .map(|h| h.value.as_str().to_string());
        let mut body = Vec::new();
        let _ = r
            .as_reader()
            .take(MAX_BODY as u64 + 1)
            .read_to_end(&mut body);
        let body = (body.len() <= MAX_BODY).then_some(body);
        Call {
            method: r.method().clone(),
            url: r.url().to_string(),
            auth,
            body,
        }
    }
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

fn handle(store: &Arc<dyn Store>, options: &AdminOptions, call: &Call) -> Resp {
    let Some(body) = &call.body else {
        return err(413, &format!("request body larger than {MAX_BODY} bytes"));
    };
    let path = call.url.split('?').next().unwrap_or_default();
    let segments: Vec<&str> = path.trim_matches('/').split('/').collect();
    let dlq = Dlq::new(store.clone());
    let mutating = matches!(call.method, Method::Patch | Method::Delete | Method::Post);
    if mutating {
        let Some(token) = &options.token else {
            return err(
                403,
                "mutating routes are disabled: no admin token is configured",
            );
        };
        if call.auth.as_deref() != Some(format!("Bearer {token}").as_str()) {
            return err(401, "missing or wrong bearer token");
        }
    }
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
    let database = match store.ping() {
        Ok(_) => "ok".to_string(),
        Err(e) => e.to_string(),
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
        .map(|(_, q)| {
            q.split('&')
                .filter(|p| !p.is_empty())
                .map(|p| {
                    let (k, v) = p.split_once('=').unwrap_or((p, ""));
                    (decode(k), decode(v))
                })
                .collect()
        })
        .unwrap_or_default()
}

fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < bytes.len() => {
                match u8::from_str_radix(
                    std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("zz"),
                    16,
                ) {
                    Ok(b) => {
                        out.push(b);
                        i += 2;
                    }
                    Err(_) => out.push(b'%'),
                }
            }
            b => out.push(b),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}
