//! The Redis inbox cache (feature `redis`).

use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::InboxCache;
use crate::backoff::RetryBackoff;
use crate::error::{Error, Result};

/// Caches consumed ids in Redis (`SET key 1 PX ttl`, `EXISTS key`), shared by every
/// instance of a service. Calls run concurrently, each on a connection of its
/// own from a small pool of idle ones.
///
/// It is a cache: when Redis fails (a connect or a command that errs or times
/// out), the call fails at once to the inbox, which asks the database
/// instead, and the cache is skipped for a while (100 ms, doubling to 5 s
/// while it keeps failing): one call then tries again, the others do not
/// wait for it.
///
/// `rediss://` connects over TLS, verifying the server's certificate against
/// the system's CAs, or those of [`RedisCacheBuilder::root_cert_file`];
/// `rediss://host/#insecure` skips the check (redis-rs's spelling). Every
/// connect and every command has a timeout (2 s each by default): a Redis that
/// does not answer fails the call, and the inbox goes on without its cache.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// let cache = txbox::RedisCache::new("redis://127.0.0.1:6379")?;
/// let managed = txbox::RedisCache::builder("rediss://cache.internal:6380")
///     .root_cert_file("/etc/ssl/redis-ca.pem")
///     .command_timeout(std::time::Duration::from_millis(500))
///     .build()?;
/// # let _ = (cache, managed); Ok(()) }
/// ```
pub struct RedisCache {
    client: redis::Client,
    /// For `rediss://`: what the TLS handshake trusts (see [`RedisCache::handshake`]).
    tls: Option<crate::tls::TlsOptions>,
    connect_timeout: Duration,
    command_timeout: Duration,
    state: Mutex<State>,
}

/// The idle connections, and when to try Redis again after a failure.
struct State {
    idle: Vec<redis::Connection>,
    /// Skipped until then, and why (after a failure).
    down: Option<(Instant, String)>,
    /// The waits after failures in a row.
    backoff: RetryBackoff,
    /// A call is trying Redis again after a failure: the others skip it.
    trying: bool,
}

/// Idle connections kept for later calls, at most.
const MAX_IDLE: usize = 16;
const MIN_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Builds a [`RedisCache`]: TLS roots and timeouts.
#[derive(Debug, Clone)]
pub struct RedisCacheBuilder {
    url: String,
    root_cert_file: Option<std::path::PathBuf>,
    connect_timeout: Duration,
    command_timeout: Duration,
}

fn err(e: redis::RedisError) -> Error {
    Error::Cache {
        message: format!("redis: {e}"),
        source: Some(Box::new(e)),
    }
}

impl RedisCacheBuilder {
    /// The CAs (PEM) a `rediss://` server's certificate must be signed by,
    /// instead of the system's.
    pub fn root_cert_file(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.root_cert_file = Some(path.into());
        self
    }

    /// The longest a connect (TLS handshake included) may take; default 2 s.
    pub fn connect_timeout(mut self, d: Duration) -> Self {
        self.connect_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// The longest one command may wait for its answer; default 2 s.
    pub fn command_timeout(mut self, d: Duration) -> Self {
        self.command_timeout = d.max(Duration::from_millis(1));
        self
    }

    /// The cache; connects lazily. A URL that cannot be read, or a roots file
    /// that cannot, is an error now.
    pub fn build(self) -> Result<RedisCache> {
        let client = match &self.root_cert_file {
            None => redis::Client::open(self.url.as_str()).map_err(err)?,
            Some(path) => {
                let pem = std::fs::read(path).map_err(|source| Error::Io {
                    context: format!("reading the TLS root certificates {}", path.display()),
                    source,
                })?;
                let certs = redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                };
                redis::Client::build_with_tls(self.url.as_str(), certs).map_err(err)?
            }
        };
        let tls = match client.get_connection_info().addr() {
            redis::ConnectionAddr::TcpTls { insecure, .. } => {
                let verify = if *insecure {
                    crate::tls::Verify::Nothing
                } else {
                    crate::tls::Verify::Full
                };
                let mut t = crate::tls::TlsOptions::new(verify);
                t.roots = self.root_cert_file.clone();
                t.connector()?; // a roots file that cannot be used fails now
                Some(t)
            }
            _ => None,
        };
        Ok(RedisCache {
            client,
            tls,
            connect_timeout: self.connect_timeout,
            command_timeout: self.command_timeout,
            state: Mutex::new(State {
                idle: Vec::new(),
                down: None,
                backoff: RetryBackoff::doubling(MIN_BACKOFF, MAX_BACKOFF),
                trying: false,
            }),
        })
    }
}

impl RedisCache {
    /// A TLS handshake of its own, with the connect timeout on the socket,
    /// before redis-rs's: redis-rs runs its handshake with no timeout, and a
    /// server that never answers it (a plaintext Redis at a `rediss://` URL)
    /// would hold the calling thread for good.
    fn handshake(&self, tls: &crate::tls::TlsOptions) -> std::result::Result<(), String> {
        let redis::ConnectionAddr::TcpTls { host, port, .. } =
            self.client.get_connection_info().addr()
        else {
            return Ok(());
        };
        let connector = tls.connector().map_err(|e| e.to_string())?;
        let addrs = std::net::ToSocketAddrs::to_socket_addrs(&(host.as_str(), *port))
            .map_err(|e| e.to_string())?;
        let mut last = "no address".to_string();
        for addr in addrs {
            let stream = match std::net::TcpStream::connect_timeout(&addr, self.connect_timeout) {
                Ok(s) => s,
                Err(e) => {
                    last = e.to_string();
                    continue;
                }
            };
            let _ = stream.set_read_timeout(Some(self.connect_timeout));
            let _ = stream.set_write_timeout(Some(self.connect_timeout));
            return match connector.connect(host, stream) {
                Ok(_) => Ok(()),
                Err(native_tls::HandshakeError::Failure(e)) => Err(format!("TLS: {e}")),
                Err(native_tls::HandshakeError::WouldBlock(_)) => Err(format!(
                    "TLS: no handshake within {:?} (is it a TLS port?)",
                    self.connect_timeout
                )),
            };
        }
        Err(last)
    }

    /// A cache on the Redis at `url` (`redis://host:port/db`, `rediss://` for
    /// TLS), with the default timeouts. Connects lazily.
    pub fn new(url: &str) -> Result<Self> {
        Self::builder(url).build()
    }

    /// A builder for a cache on the Redis at `url`.
    pub fn builder(url: &str) -> RedisCacheBuilder {
        RedisCacheBuilder {
            url: url.to_owned(),
            root_cert_file: None,
            connect_timeout: Duration::from_secs(2),
            command_timeout: Duration::from_secs(2),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `f` on a connection: an idle one, or one opened now (outside
    /// the lock, so calls connect concurrently). While Redis is skipped after
    /// a failure, fails at once.
    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let (idle, trying) = {
            let mut s = self.state();
            let mut trying = false;
            if let Some((until, why)) = &s.down {
                let now = Instant::now();
                if now < *until || s.trying {
                    return Err(Error::cache(format!(
                        "redis: skipped for {:?} after a failure ({why})",
                        until.saturating_duration_since(now)
                    )));
                }
                s.trying = true; // this call tries again; the others skip
                trying = true;
            }
            (s.idle.pop(), trying)
        };
        // the try ends with this call, even one that panics (another call's
        // is not this one's to end)
        let _tried = trying.then_some(Tried(self));
        let conn = match idle {
            Some(c) => Ok(c),
            None => self.connect(),
        };
        let out = conn.and_then(|mut c| f(&mut c).map(|v| (v, c)).map_err(err));
        let mut s = self.state();
        match out {
            Ok((v, c)) => {
                s.down = None;
                s.backoff.reset();
                if s.idle.len() < MAX_IDLE {
                    s.idle.push(c);
                }
                Ok(v)
            }
            Err(e) => {
                // the connection is dropped; so are the idle ones, which
                // would likely fail the same way
                s.idle.clear();
                let wait = s.backoff.wait();
                s.down = Some((Instant::now() + wait, e.to_string()));
                Err(e)
            }
        }
    }

    /// A new connection with the timeouts set.
    fn connect(&self) -> Result<redis::Connection> {
        let info = self.client.get_connection_info();
        let failed = |reason: String, source: Option<crate::Cause>| Error::Connect {
            to: format!("Redis at {}", crate::redact::urls(&info.addr().to_string())),
            reason,
            source,
        };
        if let Some(tls) = &self.tls {
            self.handshake(tls).map_err(|why| failed(why, None))?;
        }
        let c = self
            .client
            .get_connection_with_timeout(self.connect_timeout)
            .map_err(|e| failed(e.to_string(), Some(Box::new(e))))?;
        c.set_read_timeout(Some(self.command_timeout))
            .map_err(err)?;
        c.set_write_timeout(Some(self.command_timeout))
            .map_err(err)?;
        Ok(c)
    }
}

/// Clears [`State::trying`] when a call ends.
struct Tried<'a>(&'a RedisCache);

impl Drop for Tried<'_> {
    fn drop(&mut self) {
        self.0.state().trying = false;
    }
}

impl InboxCache for RedisCache {
    fn contains(&self, key: &str) -> Result<bool> {
        self.with(|c| redis::cmd("EXISTS").arg(key).query::<i64>(c))
            .map(|n| n > 0)
    }

    fn insert(&self, key: &str, ttl: Duration) -> Result<()> {
        let ms = ttl.as_millis().max(1) as u64;
        self.with(|c| {
            redis::cmd("SET")
                .arg(key)
                .arg(1)
                .arg("PX")
                .arg(ms)
                .query::<()>(c)
        })
    }
}
