//! The inbox cache trait and its in-memory implementation.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::error::Result;

/// A cache of consumed event ids in front of the inbox table. Keys already include
/// the service name. Errors are logged by the inbox and treated as a miss.
pub trait InboxCache: Send + Sync {
    /// True if `key` is cached (and not expired).
    fn contains(&self, key: &str) -> Result<bool>;
    /// Caches `key` for `ttl`.
    fn insert(&self, key: &str, ttl: Duration) -> Result<()>;
}

/// A bounded in-memory cache with a TTL per entry; the oldest entries go first when
/// it is full.
///
/// ```
/// use std::time::Duration;
/// use txbox::inbox::{InboxCache, MemoryCache};
/// let cache = MemoryCache::new(2);
/// cache.insert("a", Duration::from_secs(60)).unwrap();
/// cache.insert("b", Duration::from_secs(60)).unwrap();
/// cache.insert("c", Duration::from_secs(60)).unwrap(); // evicts "a"
/// assert!(!cache.contains("a").unwrap());
/// assert!(cache.contains("c").unwrap());
/// ```
pub struct MemoryCache {
    capacity: usize,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    expires: HashMap<String, Instant>,
    order: VecDeque<String>,
}

impl MemoryCache {
    /// A cache holding at most `capacity` ids (at least 1).
    pub fn new(capacity: usize) -> Self {
        MemoryCache {
            capacity: capacity.max(1),
            state: Mutex::new(State::default()),
        }
    }

    /// How many ids it holds now.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .expires
            .len()
    }

    /// True when it holds nothing.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl InboxCache for MemoryCache {
    fn contains(&self, key: &str) -> Result<bool> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        match s.expires.get(key) {
            Some(t) if *t > Instant::now() => Ok(true),
            Some(_) => {
                s.expires.remove(key);
                Ok(false)
            }
            None => Ok(false),
        }
    }

    fn insert(&self, key: &str, ttl: Duration) -> Result<()> {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let at = Instant::now() + ttl;
        if s.expires.insert(key.to_string(), at).is_none() {
            s.order.push_back(key.to_string());
        }
        while s.expires.len() > self.capacity {
            match s.order.pop_front() {
                Some(old) => {
                    s.expires.remove(&old);
                }
                None => break,
            }
        }
        // drop queue entries of keys that expired and were removed on look-up
        if s.order.len() > 2 * self.capacity {
            let State { expires, order } = &mut *s;
            order.retain(|k| expires.contains_key(k));
        }
        Ok(())
    }
}
