//! `/health` and `/ready`: what the relays' probes say, and the database's
//! answer to a check that runs on a thread of its own, so that a database that
//! does not answer (a frozen or black-holed link) makes them say 503 in time
//! instead of holding the request, and the probes of an orchestrator do not
//! pile up on the pool.

use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::http::Resp;
use super::{json, AdminOptions};
use crate::store::FullStore;

/// The longest a request waits for a check under way before it answers from
/// what is known (an earlier answer, or that the check has not answered):
/// well within a probe's usual timeout of 1 s.
const ANSWER_WITHIN: Duration = Duration::from_millis(500);

/// The same before the first answer, which has nothing earlier to go by (the
/// first check starts with the server).
const FIRST_ANSWER_WITHIN: Duration = Duration::from_millis(900);

/// Checks under way at most: a second starts once the first has waited past
/// the bound (a pooled connection that hangs; a fresh one may answer).
const MAX_CHECKS: usize = 2;

/// The database's part of `/health`: checks on threads of their own, one at
/// a time (two when one hangs); requests wait for them at most
/// [`ANSWER_WITHIN`].
pub(super) struct DatabaseCheck {
    /// Asks the database (a store's [`check`]; a stand-in in unit tests).
    ask: Box<dyn Fn() -> Checked + Send + Sync>,
    state: Mutex<CheckState>,
    done: Condvar,
}

#[derive(Default)]
struct CheckState {
    /// The checks under way: their number and when each began.
    running: Vec<(u64, Instant)>,
    /// The number the next check gets.
    next: u64,
    /// The latest check's answer, and when that check began.
    last: Option<(Instant, Checked)>,
}

impl CheckState {
    /// How long the oldest check under way has waited.
    fn waited(&self) -> Duration {
        self.running
            .iter()
            .map(|(_, began)| began.elapsed())
            .max()
            .unwrap_or_default()
    }
}

/// What a check found.
#[derive(Clone)]
struct Checked {
    /// Whether the database answered (the reason is logged otherwise).
    answered: bool,
    paused: Option<Vec<String>>,
    notify_queue_usage: Option<f64>,
}

impl Checked {
    const NO_ANSWER: Checked = Checked {
        answered: false,
        paused: None,
        notify_queue_usage: None,
    };
}

/// What `/health` says of the database.
enum Database {
    Answered(Checked),
    /// A check has waited this long for an answer (past the bound, or
    /// before the first answer).
    NoAnswer(Duration),
}

impl DatabaseCheck {
    /// The check of `store`, its first run started.
    pub(super) fn new(store: Arc<dyn FullStore>) -> Arc<Self> {
        Self::asking(move || check(&*store))
    }

    /// The check that runs `ask`, its first run started.
    fn asking(ask: impl Fn() -> Checked + Send + Sync + 'static) -> Arc<Self> {
        let check = Arc::new(DatabaseCheck {
            ask: Box::new(ask),
            state: Mutex::default(),
            done: Condvar::new(),
        });
        check.start(&mut check.lock());
        check
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, CheckState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The answer of a check begun after the request arrived, if one comes
    /// within [`ANSWER_WITHIN`]; otherwise, while the checks under way have
    /// waited less than `bound`, the latest answer; past it, or before the
    /// first answer, that the database has not answered (yet).
    fn read(self: &Arc<Self>, bound: Duration) -> Database {
        let arrived = Instant::now();
        let mut state = self.lock();
        loop {
            match &state.last {
                Some((began, checked)) if *began >= arrived => {
                    return Database::Answered(checked.clone())
                }
                _ => {}
            }
            let hanging = state.running.iter().all(|(_, b)| b.elapsed() >= bound);
            if state.running.is_empty() || (state.running.len() < MAX_CHECKS && hanging) {
                self.start(&mut state);
            }
            let limit = match state.last {
                Some(_) => ANSWER_WITHIN,
                None => FIRST_ANSWER_WITHIN,
            };
            let left = limit.saturating_sub(arrived.elapsed());
            if left.is_zero() {
                break;
            }
            // wake when the check under way passes the bound too, to start
            // the second one then rather than at the end of the wait
            // (once past it, a second was started above, or could not be)
            let waited = state.waited();
            let hangs_in = match state.running.len() < MAX_CHECKS && waited < bound {
                true => bound - waited,
                false => left,
            };
            state = self
                .done
                .wait_timeout(state, left.min(hangs_in))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        let waited = state.waited();
        match &state.last {
            Some((_, checked)) if waited < bound => Database::Answered(checked.clone()),
            _ => Database::NoAnswer(waited),
        }
    }

    /// Runs one check on a thread of its own, counted in `state.running`
    /// until it ends (a panic in the store included).
    fn start(self: &Arc<Self>, state: &mut CheckState) {
        let (id, began) = (state.next, Instant::now());
        state.next += 1;
        let me = self.clone();
        let spawned = std::thread::Builder::new()
            .name("txbox-admin-check".into())
            .spawn(move || {
                let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&me.ask))
                    .unwrap_or_else(|_| {
                        log::error!("txbox: admin /health: the database check panicked");
                        Checked::NO_ANSWER
                    });
                let mut state = me.lock();
                state.running.retain(|(i, _)| *i != id);
                if state.last.as_ref().is_none_or(|(b, _)| *b < began) {
                    state.last = Some((began, checked));
                }
                me.done.notify_all();
            });
        match spawned {
            Ok(_) => state.running.push((id, began)),
            Err(e) => log::warn!("txbox: admin /health: no thread for the database check: {e}"),
        }
    }
}

/// Asks the database: does it answer, which types are paused, how full is the
/// notification queue.
fn check(store: &dyn FullStore) -> Checked {
    // a short reason only: the error's text (hosts, users, server
    // messages) goes to the log, not to whoever reaches the port
    if let Err(e) = store.ping() {
        log::warn!("txbox: admin /health: the database does not answer: {e}");
        return Checked::NO_ANSWER;
    }
    let paused = store
        .paused()
        .map_err(|e| log::warn!("txbox: admin /health: reading the paused types: {e}"))
        .ok();
    // PostgreSQL: how full the notification queue is (a listener that
    // stopped reading fills it; at 0.5 commits stop notifying and the
    // relays poll)
    let notify_queue_usage = match store.notify_queue_usage() {
        Ok(usage) => usage,
        Err(e) => {
            log::warn!("txbox: admin /health: reading the notification queue: {e}");
            None
        }
    };
    if let Some(usage) = notify_queue_usage.filter(|u| *u >= 0.5) {
        log::warn!(
            "txbox: the notification queue is {:.0}% full: a listener in the \
                 cluster stopped reading; commits no longer wake the relays, which poll",
            usage * 100.0
        );
    }
    Checked {
        answered: true,
        paused,
        notify_queue_usage,
    }
}

/// `/health` (`readiness` false): the database answers and every relay thread
/// runs, none stuck. `/ready`: that, and every relay's broker can be reached
/// and acks its batches in time. Both answer within about a second whatever
/// the database and the brokers do.
pub(super) fn health(check: &Arc<DatabaseCheck>, options: &AdminOptions, readiness: bool) -> Resp {
    let (database, checked) = match check.read(options.database_timeout) {
        Database::Answered(c) if c.answered => ("ok".to_owned(), Some(c)),
        Database::Answered(_) => ("unreachable".to_owned(), None),
        Database::NoAnswer(waited) => {
            log::warn!(
                "txbox: admin /health: the database has not answered for {waited:?} \
                 (database_timeout {:?})",
                options.database_timeout
            );
            (format!("no answer for {} ms", waited.as_millis()), None)
        }
    };
    let relays: Vec<_> = options
        .relays
        .iter()
        .map(|p| {
            let (running, threads) = p.threads();
            let stuck = p.stuck(options.stuck_after);
            let overdue = p.acks_overdue(options.acks_overdue_after);
            let broker = if p.broker_down() > 0 {
                "unreachable"
            } else if overdue > 0 {
                "acks overdue"
            } else {
                "ok"
            };
            (
                running == threads && stuck == 0,
                broker == "ok",
                serde_json::json!({
                    "running": running,
                    "threads": threads,
                    "stuck": stuck,
                    "broker": broker,
                    "acks_overdue": overdue,
                }),
            )
        })
        .collect();
    let healthy = checked.is_some() && relays.iter().all(|r| r.0);
    let ready = healthy && relays.iter().all(|r| r.1);
    let ok = if readiness { ready } else { healthy };
    let mut body = serde_json::json!({
        "status": if ok { "ok" } else if readiness && healthy { "not ready" } else { "unhealthy" },
        "database": database,
        "relays": relays.into_iter().map(|r| r.2).collect::<Vec<_>>(),
    });
    if let Some(c) = checked {
        if let Some(paused) = c.paused {
            body["paused"] = serde_json::json!(paused);
        }
        if let Some(usage) = c.notify_queue_usage {
            body["notify_queue_usage"] = serde_json::json!(usage);
        }
    }
    json(if ok { 200 } else { 503 }, &body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering::SeqCst};

    const ANSWERED: Checked = Checked {
        answered: true,
        paused: None,
        notify_queue_usage: None,
    };

    fn answered(database: Database) -> bool {
        match database {
            Database::Answered(c) => c.answered,
            Database::NoAnswer(waited) => panic!("no answer for {waited:?}"),
        }
    }

    #[test]
    fn a_check_that_panics_counts_as_no_answer_and_the_next_one_runs() {
        let panics = Arc::new(AtomicBool::new(true));
        let calls = Arc::new(AtomicUsize::new(0));
        let (p, c) = (panics.clone(), calls.clone());
        let check = DatabaseCheck::asking(move || {
            c.fetch_add(1, SeqCst);
            if p.load(SeqCst) {
                // a panic that skips the hook (no backtrace printed)
                std::panic::resume_unwind(Box::new("the store panicked"));
            }
            ANSWERED
        });
        let bound = Duration::from_secs(5);
        let started = Instant::now();
        assert!(!answered(check.read(bound)), "a panic is no answer");
        assert!(!answered(check.read(bound)), "and a second check ran");
        assert!(calls.load(SeqCst) >= 2, "{} checks", calls.load(SeqCst));
        panics.store(false, SeqCst);
        assert!(
            answered(check.read(bound)),
            "a check after the panics answers"
        );
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        assert!(
            check.lock().running.is_empty(),
            "no panicked check counts as running"
        );
    }

    #[test]
    fn a_check_that_hangs_past_the_bound_gets_a_second_and_no_more() {
        // checks hang until `release` drops its sender (a black-holed link
        // that a pooled connection waits on); `hang` says whether new ones do
        let (release, gate) = crossbeam_channel::bounded::<()>(0);
        let hang = Arc::new(AtomicBool::new(true));
        let calls = Arc::new(AtomicUsize::new(0));
        let second = Arc::new(Mutex::new(None));
        let (h, c, at) = (hang.clone(), calls.clone(), second.clone());
        let check = DatabaseCheck::asking(move || {
            let n = c.fetch_add(1, SeqCst);
            if n == 1 {
                *at.lock().unwrap() = Some(Instant::now());
            }
            // the first hangs; the second hangs while `hang` says so
            if n == 0 || h.load(SeqCst) {
                let _ = gate.recv();
            }
            ANSWERED
        });
        let bound = Duration::from_millis(150);
        // first read: the first check hangs; at the bound a second starts
        // and hangs too: no answer, within the first answer's wait
        let asked = Instant::now();
        match check.read(bound) {
            Database::NoAnswer(waited) => assert!(waited >= bound, "{waited:?}"),
            Database::Answered(_) => panic!("an answer from a hung check"),
        }
        assert!(
            asked.elapsed() < Duration::from_secs(2),
            "{:?}",
            asked.elapsed()
        );
        assert_eq!(calls.load(SeqCst), 2, "two checks at most, both hung");
        // the second began when the first passed the bound, not at the end
        // of the request's wait (0.9 s)
        let began = second.lock().unwrap().expect("a second check") - asked;
        assert!(
            began < Duration::from_millis(600),
            "the second began after {began:?}"
        );
        for _ in 0..3 {
            assert!(matches!(check.read(bound), Database::NoAnswer(_)));
        }
        assert_eq!(calls.load(SeqCst), 2, "no third check while two hang");
        // the second returns; the first still hangs: the next read starts a
        // check that answers at once
        hang.store(false, SeqCst);
        release.send(()).expect("a hung check takes it");
        assert!(answered(check.read(bound)), "the database answers again");
        drop(release);
    }
}
