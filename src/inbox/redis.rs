//! The Redis inbox cache (feature `redis`).

use std::sync::Mutex;
use std::time::Duration;

use super::InboxCache;
use crate::error::{Error, Result};

/// Caches consumed ids in Redis (`SET key 1 PX ttl`, `EXISTS key`), shared by every
/// instance of a service. One connection, opened again after an error.
///
/// ```no_run
/// # fn main() -> txbox::Result<()> {
/// let cache = txbox::RedisCache::new("redis://127.0.0.1:6379")?;
/// # let _ = cache; Ok(()) }
/// ```
pub struct RedisCache {
    client: redis::Client,
    conn: Mutex<Option<redis::Connection>>,
}

fn err(e: redis::RedisError) -> Error {
    Error::Broker(format!("redis: {e}"))
}

impl RedisCache {
    /// A cache on the Redis at `url` (`redis://host:port/db`). Connects lazily.
    pub fn new(url: &str) -> Result<Self> {
        let client = redis::Client::open(url).map_err(err)?;
        Ok(RedisCache {
            client,
            conn: Mutex::new(None),
        })
    }

    fn with<T>(
        &self,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            let c = self
                .client
                .get_connection_with_timeout(Duration::from_secs(2))
                .map_err(err)?;
            c.set_read_timeout(Some(Duration::from_secs(2)))
                .map_err(err)?;
            *guard = Some(c);
        }
        let conn = guard
            .as_mut()
            .ok_or_else(|| Error::Broker("redis: not connected".into()))?;
        let out = f(conn);
        if out.is_err() {
            *guard = None; // open a fresh connection next time
        }
        out.map_err(err)
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
