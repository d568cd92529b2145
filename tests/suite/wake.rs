//! The wake-up on commit under load and in production's corners, on a real
//! PostgreSQL: rationed notifications that leave no commit behind, `wake =
//! "poll"` at the source, two-phase commit, and a listening connection that
//! goes silent.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::*;
use txbox::{Config, EventId, MemorySender, Outbox, PgStore, Relay, Wake};

/// Starts a relay on `store` with a memory sender (its configuration has the
/// type `n`, woken by commits) and waits until its claims at start are done:
/// from then on it sleeps in its polling delay, and only a wake-up sends an
/// event in time.
fn sleeping_relay(
    store: Arc<PgStore>,
    client: &mut postgres::Client,
    p: &str,
    config: &Config,
) -> (Relay, MemorySender) {
    let sender = MemorySender::new();
    let relay = Relay::start(store, config, sender.clone()).unwrap();
    relay_woken_by_commits(client, p, config, &sender, "n");
    (relay, sender)
}

fn sent_ids(sender: &MemorySender) -> HashSet<EventId> {
    sender.sent().iter().map(|e| e.id).collect()
}

/// 32 publishers at full speed, each commit one event, while the relay sleeps in
/// a 30 s polling delay: most commits skip their notification (one per type is
/// in flight at a time), and still every event is sent within seconds of its
/// commit, not at the next poll. The test's own `LISTEN` counts the
/// notifications: fewer than the commits.
#[test]
fn thirty_two_publishers_are_all_sent_on_commit_not_at_the_poll() {
    let p = "t_wake_many_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = sleepy(p, Duration::from_secs(30), &[("n", Wake::Notify)]);
    let (relay, sender) = sleeping_relay(store, &mut client, p, &config);
    let mut counting = crate::common::listening(p);

    let outbox = Arc::new(Outbox::new(&config).unwrap());
    let published = Arc::new(Mutex::new(Vec::new()));
    let until = Instant::now() + Duration::from_secs(3);
    let writers: Vec<_> = (0..32)
        .map(|w| {
            let (outbox, published) = (outbox.clone(), published.clone());
            std::thread::spawn(move || {
                let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap();
                let mut mine = Vec::new();
                while Instant::now() < until {
                    let mut tx = c.transaction().unwrap();
                    let id = outbox.publish(&mut tx, "n", &w).unwrap();
                    tx.commit().unwrap();
                    mine.push(id);
                }
                published.lock().unwrap().extend(mine);
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    let published: HashSet<EventId> = published.lock().unwrap().iter().copied().collect();
    assert!(published.len() > 100, "only {} commits", published.len());
    // within 10 s of the last commit, a third of the poll's 30 s
    wait_until(
        "every committed event sent",
        Duration::from_secs(10),
        || published.is_subset(&sent_ids(&sender)),
    );
    let notifications = heard(&mut counting, ms(200)).len();
    assert!(
        notifications < published.len(),
        "{notifications} notifications for {} commits: not rationed",
        published.len()
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// The case the rationing must not lose, made slow enough to see: commit A
/// notifies and takes a second to finish its commit; commit B, meanwhile, finds
/// A notifying, skips its own notification, and takes two seconds more to
/// finish. A's notification wakes the poller before B is visible; B is sent
/// as soon as its commit is done (the listener waits for publishers that
/// skipped), not at the poll 30 s later.
#[test]
fn a_commit_that_skipped_its_notification_is_sent_when_it_completes() {
    let p = "t_wake_skipped_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    // a business table whose rows hold their commit for `ms`, after txbox's
    // trigger (deferred triggers fire in the order their rows were written)
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {p}slow; CREATE TABLE {p}slow (ms int); \
             CREATE OR REPLACE FUNCTION {p}slow_commit() RETURNS trigger LANGUAGE plpgsql AS \
               $$ BEGIN PERFORM pg_sleep(NEW.ms / 1000.0); RETURN NULL; END $$; \
             CREATE CONSTRAINT TRIGGER {p}slow_commit AFTER INSERT ON {p}slow \
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {p}slow_commit()"
        ))
        .unwrap();
    let config = sleepy(p, Duration::from_secs(30), &[("n", Wake::Notify)]);
    let (relay, sender) = sleeping_relay(store, &mut client, p, &config);
    let slow_commit = move |slow_ms: i32| {
        let config = config.clone();
        std::thread::spawn(move || {
            let outbox = Outbox::new(&config).unwrap();
            let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap();
            let mut tx = c.transaction().unwrap();
            let id = outbox.publish(&mut tx, "n", &slow_ms).unwrap();
            tx.execute(
                &format!("INSERT INTO {p}slow (ms) VALUES ($1)"),
                &[&slow_ms],
            )
            .unwrap();
            tx.commit().unwrap();
            (id, Instant::now())
        })
    };
    let a = slow_commit(1000);
    // A is in its commit (its business trigger sleeps) before B begins
    wait_until("A committing", Duration::from_secs(5), || {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'PgSleep'",
                &[],
            )
            .map(|r| r.get::<_, i64>(0) >= 1)
            .unwrap_or(false)
    });
    let b = slow_commit(2000);
    let (a, _) = a.join().unwrap();
    wait_until("A sent on its notification", Duration::from_secs(5), || {
        sent_ids(&sender).contains(&a)
    });
    let (b, committed) = b.join().unwrap();
    wait_until("B sent after its commit", Duration::from_secs(5), || {
        sent_ids(&sender).contains(&b)
    });
    assert!(
        committed.elapsed() < Duration::from_secs(5),
        "B waited {:?} after its commit",
        committed.elapsed()
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// `wake = "poll"` turns the notification off at the source: a commit of that
/// type sends none (a `LISTEN` of the test's own hears nothing), while a type
/// that is notified still is. A relay configured otherwise later turns it back
/// on.
#[test]
fn a_type_whose_wake_up_is_poll_sends_no_notification() {
    let p = "t_wake_quiet_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let mut listening = crate::common::listening(p);
    let commit = |client: &mut postgres::Client, config: &Config, t: &str| {
        let outbox = Outbox::new(config).unwrap();
        let mut tx = client.transaction().unwrap();
        outbox.publish(&mut tx, t, &1).unwrap();
        tx.commit().unwrap();
    };
    let config = sleepy(
        p,
        Duration::from_secs(30),
        &[("n", Wake::Notify), ("q", Wake::Poll)],
    );
    let relay = Relay::start(store.clone(), &config, MemorySender::new()).unwrap();
    commit(&mut client, &config, "q");
    assert_eq!(heard(&mut listening, ms(500)), Vec::<String>::new());
    commit(&mut client, &config, "n");
    assert_eq!(heard(&mut listening, ms(2000)), ["n"]);
    relay.shutdown(Duration::from_secs(5)).unwrap();

    // the same type configured to be notified again
    let config = sleepy(p, Duration::from_secs(30), &[("q", Wake::Notify)]);
    let relay = Relay::start(store, &config, MemorySender::new()).unwrap();
    commit(&mut client, &config, "q");
    assert_eq!(heard(&mut listening, ms(2000)), ["q"]);
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// A notification queue at its limit never fails a publish: past
/// `txbox.queue_limit` (0.5 by default; 0 here, as if the queue were full) the
/// commit sends no notification, and the relay sends the event when it polls.
/// The relay reports the queue's usage in the metrics.
#[test]
fn past_the_queue_limit_commits_do_not_notify_and_events_still_go_out() {
    let p = "t_wake_queue_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let mut listening = crate::common::listening(p);
    // this relay's own reading, not another test's
    let registry = std::sync::Arc::new(txbox::metrics::Registry::new());
    let config = Config::builder()
        .table_prefix(p)
        .event("t", |e| e.adaptive_polling(ms(200), ms(400), 1.5))
        .build()
        .unwrap()
        .observed(registry.clone());
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    tx.batch_execute("SET LOCAL txbox.queue_limit = '0'")
        .unwrap();
    let id = outbox.publish(&mut tx, "t", &1).unwrap();
    tx.commit().unwrap();
    assert_eq!(heard(&mut listening, ms(500)), Vec::<String>::new());
    wait_until("sent by polling", Duration::from_secs(10), || {
        sent_ids(&sender).contains(&id)
    });
    // the limit was the transaction's: the next commit notifies
    let mut tx = client.transaction().unwrap();
    outbox.publish(&mut tx, "t", &2).unwrap();
    tx.commit().unwrap();
    assert_eq!(heard(&mut listening, ms(2000)), ["t"]);
    // read on the relay's recovery run, at its start
    let usage = registry.snapshot().notify_queue_usage;
    assert!(usage.is_some_and(|u| (0.0..0.5).contains(&u)), "{usage:?}");
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// Two-phase commit: PostgreSQL refuses `PREPARE TRANSACTION` after a
/// `NOTIFY`, so a transaction that ends in one sets `txbox.wake = 'off'`. It
/// publishes, prepares, commits prepared, and the relay sends the event.
#[test]
fn a_prepared_transaction_publishes_with_the_wake_up_off() {
    let p = "t_wake_2pc_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let max: String = client
        .query_one("SHOW max_prepared_transactions", &[])
        .unwrap()
        .get(0);
    if max == "0" {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI needs max_prepared_transactions > 0 (.ci/services.sh sets it)"
        );
        eprintln!("SKIPPED: max_prepared_transactions is 0 on this server");
        return;
    }
    let config = Config::builder()
        .table_prefix(p)
        .event("t", |e| e.adaptive_polling(ms(20), ms(200), 1.5))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    // the gid is the test's own: a leftover of an earlier run goes first
    let _ = client.batch_execute("ROLLBACK PREPARED 't_wake_2pc'");

    // without the setting, the commit's notification makes PREPARE fail
    let mut tx = client.transaction().unwrap();
    outbox.publish(&mut tx, "t", &0).unwrap();
    let refused = tx.batch_execute("PREPARE TRANSACTION 't_wake_2pc'");
    assert!(refused.is_err(), "PREPARE after a NOTIFY went through");
    drop(tx);

    let mut tx = client.transaction().unwrap();
    tx.batch_execute("SET LOCAL txbox.wake = 'off'").unwrap();
    let id = outbox.publish(&mut tx, "t", &1).unwrap();
    tx.batch_execute("PREPARE TRANSACTION 't_wake_2pc'")
        .unwrap();
    drop(tx); // prepared: the session has no transaction left to roll back
    let sender = MemorySender::new();
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    // an event committed after the prepared one is sent: the relay has
    // claimed past the prepared one, which it did not see
    let mut tx = client.transaction().unwrap();
    let after = outbox.publish(&mut tx, "t", &2).unwrap();
    tx.commit().unwrap();
    wait_until("the later event sent", Duration::from_secs(10), || {
        sent_ids(&sender).contains(&after)
    });
    assert!(
        !sent_ids(&sender).contains(&id),
        "a prepared event was sent before its commit"
    );
    client
        .batch_execute("COMMIT PREPARED 't_wake_2pc'")
        .unwrap();
    wait_until("the prepared event sent", Duration::from_secs(10), || {
        sent_ids(&sender).contains(&id)
    });
    // and nothing else: the event of the refused PREPARE was rolled back
    assert_eq!(sender.len(), 2, "only the committed events");
    assert_eq!(sent_ids(&sender), HashSet::from([after, id]));
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// A TCP proxy to PostgreSQL that can stop forwarding the connections that
/// `LISTEN` (a silent peer: the proxy's own TCP stack still answers
/// keepalives, so only a check with a deadline finds it).
struct SilencingProxy {
    addr: std::net::SocketAddr,
    next: Arc<AtomicU64>,
    /// connections that sent `LISTEN`, and those told to go silent
    listening: Arc<Mutex<HashSet<u64>>>,
    silent: Arc<Mutex<HashSet<u64>>>,
    /// a listening connection that sends this goes silent, the statement
    /// unsent
    tripwire: Arc<Mutex<Option<&'static [u8]>>>,
    closed: Arc<AtomicBool>,
}

impl SilencingProxy {
    fn start(upstream: &'static str) -> SilencingProxy {
        let server = TcpListener::bind("127.0.0.1:0").unwrap();
        let proxy = SilencingProxy {
            addr: server.local_addr().unwrap(),
            next: Arc::default(),
            listening: Arc::default(),
            silent: Arc::default(),
            tripwire: Arc::default(),
            closed: Arc::default(),
        };
        let (next, listening, silent, tripwire, closed) = (
            proxy.next.clone(),
            proxy.listening.clone(),
            proxy.silent.clone(),
            proxy.tripwire.clone(),
            proxy.closed.clone(),
        );
        server.set_nonblocking(true).unwrap();
        std::thread::spawn(move || {
            while !closed.load(Ordering::Relaxed) {
                let Ok((client, _)) = server.accept() else {
                    std::thread::sleep(ms(5));
                    continue;
                };
                client.set_nonblocking(false).unwrap();
                let Ok(db) = TcpStream::connect(upstream) else {
                    continue;
                };
                let id = next.fetch_add(1, Ordering::Relaxed);
                for (from, to, up) in [
                    (client.try_clone().unwrap(), db.try_clone().unwrap(), true),
                    (db, client, false),
                ] {
                    let conn = Forwarded {
                        id,
                        up,
                        listening: listening.clone(),
                        silent: silent.clone(),
                        tripwire: tripwire.clone(),
                        closed: closed.clone(),
                    };
                    std::thread::spawn(move || forward(from, to, &conn));
                }
            }
        });
        proxy
    }

    /// A database URL through the proxy, in plaintext: the proxy reads the
    /// statements to find the listener's connection.
    fn url(&self) -> String {
        format!("postgres://postgres@{}/test?sslmode=disable", self.addr)
    }

    /// The next listening connection to send `statement` stops forwarding,
    /// that statement unsent: it goes silent in the middle of that query.
    fn silence_listener_sending(&self, statement: &'static [u8]) {
        *self.tripwire.lock().unwrap() = Some(statement);
    }

    /// The connections that `LISTEN` now stop forwarding (later ones do not).
    fn silence_listeners(&self) -> usize {
        let listening = self.listening.lock().unwrap();
        self.silent.lock().unwrap().extend(listening.iter());
        listening.len()
    }
}

impl Drop for SilencingProxy {
    fn drop(&mut self) {
        self.closed.store(true, Ordering::Relaxed);
    }
}

/// Copies `from` to `to` until either end closes; while the connection is
/// silenced it reads nothing more and writes nothing (the sockets stay open).
/// One direction of one proxied connection, and what the proxy knows of it.
struct Forwarded {
    id: u64,
    /// client to database
    up: bool,
    listening: Arc<Mutex<HashSet<u64>>>,
    silent: Arc<Mutex<HashSet<u64>>>,
    tripwire: Arc<Mutex<Option<&'static [u8]>>>,
    closed: Arc<AtomicBool>,
}

fn forward(mut from: TcpStream, mut to: TcpStream, c: &Forwarded) {
    let (id, up) = (c.id, c.up);
    let (listening, silent, closed) = (&c.listening, &c.silent, &c.closed);
    from.set_read_timeout(Some(ms(50))).unwrap();
    let mut buf = [0u8; 16 * 1024];
    while !closed.load(Ordering::Relaxed) {
        if silent.lock().unwrap().contains(&id) {
            std::thread::sleep(ms(50));
            continue;
        }
        match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => {
                if up && buf[..n].windows(7).any(|w| w == b"LISTEN ") {
                    listening.lock().unwrap().insert(id);
                }
                let has = |w: &[u8]| buf[..n].windows(w.len()).any(|x| x == w);
                if up && listening.lock().unwrap().contains(&id) {
                    let mut wire = c.tripwire.lock().unwrap();
                    if wire.is_some_and(has) {
                        *wire = None;
                        silent.lock().unwrap().insert(id);
                    }
                }
                // silenced while this read waited: what it read is never sent
                if silent.lock().unwrap().contains(&id) {
                    continue;
                }
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => break,
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

/// Waits until the listening session `pid` is quiet: idle and holding no
/// advisory lock (no hold of a type), seen twice 50 ms apart (nothing commits
/// meanwhile to wake it).
fn wait_listener_quiet(client: &mut postgres::Client, pid: i32) {
    let quiet = |c: &mut postgres::Client| {
        c.query_one(
            "SELECT state = 'idle' AND NOT EXISTS (SELECT 1 FROM pg_locks \
             WHERE pid = $1 AND locktype = 'advisory') FROM pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .map(|r| r.get::<_, bool>(0))
        .unwrap_or(false)
    };
    wait_until(
        "the listener idle, holding nothing",
        Duration::from_secs(5),
        || {
            quiet(client) && {
                std::thread::sleep(ms(50));
                quiet(client)
            }
        },
    );
}

/// The listener's connection goes silent (a proxy in between stops forwarding
/// it, so TCP keepalives are still answered): the relay notices within 10 s
/// (a check after 5 s quiet, answered within 5 s), listens again, and the
/// events published meanwhile are sent, though the poller sleeps in a 90 s
/// delay.
#[test]
fn a_listening_connection_gone_silent_is_noticed_within_ten_seconds() {
    let p = "t_wake_silent_";
    let Some((_, mut client)) = fresh(p) else {
        return;
    };
    let proxy = SilencingProxy::start("127.0.0.1:5432");
    let config = sleepy(p, Duration::from_secs(90), &[("n", Wake::Notify)]);
    let store = Arc::new(PgStore::connect(&proxy.url(), &config).unwrap());
    store.migrate().unwrap();
    let (relay, sender) = sleeping_relay(store, &mut client, p, &config);
    // silenced between two of its queries: what finds it is the check of a
    // quiet connection (cut off in the middle of one, the query's deadline
    // does: the next test). Quiet: idle and holding no lock, seen twice
    // 50 ms apart (nothing commits meanwhile to wake it)
    let pid = listener_pid(&mut client, p).expect("a listener");
    wait_listener_quiet(&mut client, pid);
    assert_eq!(proxy.silence_listeners(), 1);
    let silenced = Instant::now();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let id = outbox.publish(&mut tx, "n", &1).unwrap();
    tx.commit().unwrap();
    wait_until(
        "the event committed while the listener was silent sent",
        Duration::from_secs(60),
        || sent_ids(&sender).contains(&id),
    );
    assert!(
        silenced.elapsed() < Duration::from_secs(15),
        "noticed after {:?}",
        silenced.elapsed()
    );
    // listening again: a later commit is sent on its notification, not at the
    // poll 90 s away (the silent session, ended, holds nothing back)
    let t = Instant::now();
    let mut tx = client.transaction().unwrap();
    let later = outbox.publish(&mut tx, "n", &2).unwrap();
    tx.commit().unwrap();
    wait_until(
        "a later event sent on commit",
        Duration::from_secs(10),
        || sent_ids(&sender).contains(&later),
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// The same, cut off in the middle of a query: the listener's connection goes
/// silent as it sends the release of a hold (right after a notification).
/// The listener gives the query up after its deadline (5 s) instead of waiting for
/// the answer for good, listens again, and ends the silent session, whose
/// hold would keep the type's commits from notifying: a later commit is sent
/// on commit.
#[test]
fn a_listening_connection_gone_silent_mid_query_is_noticed_within_ten_seconds() {
    let p = "t_wake_silent_mid_";
    let Some((_, mut client)) = fresh(p) else {
        return;
    };
    let proxy = SilencingProxy::start("127.0.0.1:5432");
    let config = sleepy(p, Duration::from_secs(90), &[("n", Wake::Notify)]);
    let store = Arc::new(PgStore::connect(&proxy.url(), &config).unwrap());
    store.migrate().unwrap();
    let (relay, sender) = sleeping_relay(store, &mut client, p, &config);
    let silent_pid = listener_pid(&mut client, p).expect("a listener");
    // the warm-up commits' holds released first: armed before, the tripwire
    // would silence the release of the last warm-up hold, and the first
    // event below would skip its notification beside that hold
    wait_listener_quiet(&mut client, silent_pid);
    proxy.silence_listener_sending(b"pg_advisory_unlock");
    let silenced = Instant::now();
    let outbox = Outbox::new(&config).unwrap();
    let commit = |client: &mut postgres::Client, n: i32| {
        let mut tx = client.transaction().unwrap();
        let id = outbox.publish(&mut tx, "n", &n).unwrap();
        tx.commit().unwrap();
        id
    };
    // notified, held, sent; the hold's release never arrives
    let first = commit(&mut client, 1);
    wait_until("the first event sent", Duration::from_secs(10), || {
        sent_ids(&sender).contains(&first)
    });
    wait_until(
        "the silent session ended and another listening",
        Duration::from_secs(60),
        || {
            let gone = client
                .query_one(
                    "SELECT count(*) = 0 FROM pg_stat_activity WHERE pid = $1",
                    &[&silent_pid],
                )
                .map(|r| r.get::<_, bool>(0))
                .unwrap_or(false);
            gone && listener_pid(&mut client, p).is_some()
        },
    );
    assert!(
        silenced.elapsed() < Duration::from_secs(15),
        "noticed after {:?}",
        silenced.elapsed()
    );
    let t = Instant::now();
    let later = commit(&mut client, 2);
    wait_until(
        "a later event sent on commit",
        Duration::from_secs(10),
        || sent_ids(&sender).contains(&later),
    );
    assert!(t.elapsed() < Duration::from_secs(10));
    relay.shutdown(Duration::from_secs(5)).unwrap();
}
