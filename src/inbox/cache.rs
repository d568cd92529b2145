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
/// use txbox::{InboxCache, MemoryCache};
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

/// Each insert of an absent key gets a sequence number, kept in the map and in the
/// queue: a queue entry whose number no longer matches the map's is stale (its key
/// expired and was inserted again later) and evicts nothing.
#[derive(Default)]
struct State {
    expires: HashMap<String, (Instant, u64)>,
    order: VecDeque<(String, u64)>,
    next: u64,
}

impl State {
    fn is_current(&self, key: &str, seq: u64) -> bool {
        self.expires.get(key).is_some_and(|e| e.1 == seq)
    }
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
            Some((t, _)) if *t > Instant::now() => Ok(true),
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
        match s.expires.get_mut(key) {
            // a live key keeps its place in the queue
            Some(e) => e.0 = at,
            None => {
                let seq = s.next;
                s.next += 1;
                s.expires.insert(key.to_string(), (at, seq));
                s.order.push_back((key.to_string(), seq));
            }
        }
        while s.expires.len() > self.capacity {
            match s.order.pop_front() {
                Some((old, seq)) => {
                    if s.is_current(&old, seq) {
                        s.expires.remove(&old);
                    }
                }
                None => break,
            }
        }
        // drop stale queue entries (keys that expired and were removed on look-up)
        if s.order.len() > 2 * self.capacity {
            let mut order = std::mem::take(&mut s.order);
            order.retain(|(k, seq)| s.is_current(k, *seq));
            s.order = order;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_inserted_again_after_expiry_is_not_evicted_by_its_old_entry() {
        let cache = MemoryCache::new(2);
        cache.insert("a", Duration::ZERO).unwrap();
        assert!(!cache.contains("a").unwrap(), "expired at once");
        cache.insert("b", Duration::from_secs(60)).unwrap();
        cache.insert("a", Duration::from_secs(60)).unwrap();
        cache.insert("c", Duration::from_secs(60)).unwrap();
        // "b" is the oldest live key; the stale queue entry of the first "a" must not
        // evict the second
        assert!(cache.contains("a").unwrap());
        assert!(!cache.contains("b").unwrap());
        assert!(cache.contains("c").unwrap());
        assert_eq!(cache.len(), 2);
    }

    #[test]
    fn stale_queue_entries_are_dropped() {
        let cache = MemoryCache::new(2);
        for i in 0..100 {
            let k = format!("k{i}");
            cache.insert(&k, Duration::ZERO).unwrap();
            assert!(!cache.contains(&k).unwrap());
        }
        let s = cache.state.lock().unwrap();
        assert!(s.order.len() <= 4, "queue holds {} entries", s.order.len());
        assert!(s.expires.is_empty());
    }
}
