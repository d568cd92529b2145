//! An in-memory sender: the recording sender for your tests, for unit tests of
//! the relay and for the demo.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::{SendError, SendErrorKind, Sender, SenderFactory};
use crate::error::Result;
use crate::event::Event;

type FailFn = dyn Fn(&Event) -> Option<String> + Send + Sync;

/// Keeps every "sent" event in memory, in the order sent: the recording sender
/// to assert on in your own integration tests, with a relay
/// ([`Relay::start`](crate::Relay::start); [`MemorySender::wait_for`] waits with
/// a deadline) or without one ([`Relay::deliver_pending`](crate::Relay::deliver_pending)
/// sends what is due on the test's thread). Clones share the same store, so the
/// relay's threads and the test see the same events. [`MemorySender::fail_when`]
/// makes the "broker" refuse the events you pick, to test your retries and dead
/// letters.
///
/// ```
/// let sender = txbox::MemorySender::new();
/// sender.fail_when(|e| (e.event_type == "bad").then(|| "broker says no".to_string()));
/// assert!(sender.sent().is_empty());
/// ```
#[derive(Clone, Default)]
pub struct MemorySender {
    inner: Arc<Inner>,
}

#[derive(Default)]
struct Inner {
    sent: Mutex<Vec<Event>>,
    changed: Condvar,
    fail: Mutex<Option<(Arc<FailFn>, SendErrorKind)>>,
    /// A transient failure happened: the next [`Sender::ready`] fails once, as
    /// a broker that could not be reached at that moment.
    unreachable: AtomicBool,
}

impl MemorySender {
    /// An empty sender that acks everything.
    pub fn new() -> Self {
        Self::default()
    }

    /// From now on, events for which `f` returns `Some(reason)` fail with that
    /// reason, as the broker's verdict on them ([`SendError::new`]: an attempt is
    /// counted).
    pub fn fail_when(&self, f: impl Fn(&Event) -> Option<String> + Send + Sync + 'static) {
        *lock(&self.inner.fail) = Some((Arc::new(f), SendErrorKind::Permanent));
    }

    /// From now on, events for which `f` returns `Some(reason)` fail as if the
    /// broker could not be reached ([`SendError::transient`]: they go back to
    /// PENDING with no attempt counted). After each such failure the sender's
    /// next [`Sender::ready`] fails once.
    ///
    /// ```
    /// let sender = txbox::MemorySender::new();
    /// sender.fail_transiently_when(|_| Some("connection refused".to_string()));
    /// ```
    pub fn fail_transiently_when(
        &self,
        f: impl Fn(&Event) -> Option<String> + Send + Sync + 'static,
    ) {
        *lock(&self.inner.fail) = Some((Arc::new(f), SendErrorKind::Transient));
    }

    /// From now on, every event is acked.
    pub fn succeed_all(&self) {
        *lock(&self.inner.fail) = None;
    }

    /// A copy of every event acked so far, in send order (duplicates included).
    pub fn sent(&self) -> Vec<Event> {
        lock(&self.inner.sent).clone()
    }

    /// How many events were acked so far (duplicates included).
    pub fn len(&self) -> usize {
        lock(&self.inner.sent).len()
    }

    /// True when nothing was acked yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Waits until at least `n` events were acked or `timeout` passes; returns the count.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut sent = lock(&self.inner.sent);
        while sent.len() < n {
            let now = Instant::now();
            if now >= deadline {
                break;
            }
            sent = match self.inner.changed.wait_timeout(sent, deadline - now) {
                Ok((g, _)) => g,
                Err(p) => p.into_inner().0,
            };
        }
        sent.len()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Sender for MemorySender {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        let fail = lock(&self.inner.fail).clone();
        let mut sent = lock(&self.inner.sent);
        let results = events
            .iter()
            .map(|e| {
                let Some((message, kind)) = fail.as_ref().and_then(|(f, k)| Some((f(e)?, *k)))
                else {
                    sent.push(e.clone());
                    return Ok(());
                };
                if kind == SendErrorKind::Transient {
                    self.inner.unreachable.store(true, Ordering::Relaxed);
                }
                Err(SendError { message, kind })
            })
            .collect();
        self.inner.changed.notify_all();
        results
    }

    fn ready(&mut self) -> Result<(), SendError> {
        if self.inner.unreachable.swap(false, Ordering::Relaxed) {
            return Err(SendError::transient(
                "memory sender: the broker could not be reached (simulated)",
            ));
        }
        Ok(())
    }
}

impl SenderFactory for MemorySender {
    fn create(&self) -> Result<Box<dyn Sender>> {
        Ok(Box::new(self.clone()))
    }
}
