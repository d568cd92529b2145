//! The fault suite: tries to make txbox lose an event. Each scenario is bounded in
//! time and prints its counts (published, delivered, duplicates, lost); the numbers
//! of a run are kept in docs/RELIABILITY.md. The broker outages live in
//! tests/broker_outage.rs and the killed database connections in
//! tests/postgres_relay.rs.
//!
//! The relay-process scenario runs this test binary again as the relay process
//! (`relay_worker_process`, an ignored test run only as that child) and kills it
//! with SIGKILL, again and again, while a producer keeps publishing. The worker's
//! sender appends each acked id to a file before it reports the ack: that file is the
//! consumer.

mod common;

use std::collections::HashSet;
use std::io::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::backend::{Backend, Fixture};
use common::wait_until;
use txbox::{ClaimMode, Config, Event, EventId, MemorySender, Relay, SendError, Sender};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn worker_config(prefix: &str, claim: ClaimMode, delete: bool) -> Config {
    let defaults = |e: txbox::EventSettings| {
        e.adaptive_polling(ms(10), ms(100), 1.5)
            .batch_size(50)
            .lease(ms(1500))
    };
    common::mode_config(prefix, defaults, claim, delete)
        .event("k", |e| e)
        .maintenance(|m| m.recovery_interval(ms(300)))
        .build()
        .unwrap()
}

/// A pipelining sender whose "broker" acks a batch when the relay waits for it:
/// it then appends the batch's ids to a file and reports the acks. Batches the
/// relay has started but not waited for are in flight, as with a real broker.
struct FileSender {
    file: std::fs::File,
    in_flight: std::collections::VecDeque<Vec<txbox::EventId>>,
}

impl Sender for FileSender {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        self.start(events);
        self.wait()
    }

    fn start(&mut self, events: &[Event]) -> txbox::sender::Started {
        self.in_flight
            .push_back(events.iter().map(|e| e.id).collect());
        txbox::sender::Started::InFlight
    }

    fn wait(&mut self) -> Vec<Result<(), SendError>> {
        let ids = self.in_flight.pop_front().unwrap_or_default();
        let lines: String = ids.iter().map(|id| format!("{id}\n")).collect();
        match self.file.write_all(lines.as_bytes()) {
            Ok(()) => {
                // the ack reaches the relay a while later: a kill lands here often
                std::thread::sleep(Duration::from_millis(30));
                ids.iter().map(|_| Ok(())).collect()
            }
            Err(e) => ids
                .iter()
                .map(|_| Err(SendError::new(e.to_string())))
                .collect(),
        }
    }
}

/// The relay process of `a_relay_process_killed_again_and_again_loses_nothing`:
/// not a test of its own, so it is ignored and run only as that child process.
#[test]
#[ignore = "the relay child process of a_relay_process_killed_again_and_again_loses_nothing"]
fn relay_worker_process() {
    let (Ok(prefix), Ok(path)) = (
        std::env::var("TXBOX_FAULT_WORKER"),
        std::env::var("TXBOX_FAULT_FILE"),
    ) else {
        return; // only as a child process
    };
    let store = Arc::new(
        txbox::PgStore::connect(&common::pg_url(), &common::prefix_config(&prefix)).unwrap(),
    );
    let factory = move || -> txbox::Result<Box<dyn Sender>> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| txbox::Error::Io {
                context: "the sender's file".into(),
                source,
            })?;
        Ok(Box::new(FileSender {
            file,
            in_flight: Default::default(),
        }))
    };
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let claim: ClaimMode = var("TXBOX_FAULT_CLAIM").parse().unwrap();
    let delete = var("TXBOX_FAULT_DELETE") == "true";
    let config = worker_config(&prefix, claim, delete);
    let _relay = Relay::start(store, &config, factory).unwrap();
    std::thread::sleep(Duration::from_secs(120)); // until killed
}

fn spawn_worker(
    prefix: &str,
    file: &std::path::Path,
    claim: ClaimMode,
    delete: bool,
) -> std::process::Child {
    common::spawn_child(
        "relay_worker_process",
        &[
            ("TXBOX_FAULT_WORKER", prefix),
            ("TXBOX_FAULT_FILE", &file.display().to_string()),
            ("TXBOX_FAULT_CLAIM", &claim.to_string()),
            ("TXBOX_FAULT_DELETE", &delete.to_string()),
        ],
    )
}

each_claim_mode!(killed_again_and_again, "t_fault_kill":
    a_relay_process_killed_again_and_again_loses_nothing,
    a_relay_process_holding_its_claims_killed_again_and_again_loses_nothing,
    a_relay_process_deleting_in_its_held_claims_killed_again_and_again_loses_nothing);

/// Relay processes with claim mode `claim` SIGKILLed while a producer publishes.
/// A held claim that deletes its rows (`delete`) does so before the broker acks
/// them: a kill between the two must roll the deletes back.
fn killed_again_and_again(p: &'static str, claim: ClaimMode, delete: bool) {
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let config = worker_config(p, claim, delete);
    let file = std::env::temp_dir().join(format!("txbox-fault-{}-{p}.ids", std::process::id()));
    let _ = std::fs::remove_file(&file);

    // a producer keeps publishing while relay processes die
    let stop = Arc::new(AtomicBool::new(false));
    let published = Arc::new(Mutex::new(Vec::<EventId>::new()));
    let producer = {
        let (stop, published, c) = (stop.clone(), published.clone(), config.clone());
        std::thread::spawn(move || {
            let fx = Fixture::new_existing(Backend::Postgres, p);
            while !stop.load(Ordering::Relaxed) {
                let ids = fx.publish(&c, "k", 25, true);
                published.lock().unwrap().extend(ids);
                std::thread::sleep(ms(20));
            }
        })
    };
    let mut kills = 0;
    for round in 0..12 {
        let mut child = spawn_worker(p, &file, claim, delete);
        std::thread::sleep(ms(400 + fastrand::u64(0..500) + round * 10));
        // only a relay still running counts as killed (not one that died on its own)
        if child.try_wait().unwrap().is_none() {
            child.kill().unwrap(); // SIGKILL: no shutdown, batches cut in the middle
            kills += 1;
        }
        child.wait().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    producer.join().unwrap();

    // one last relay drains what is left, including the batches the dead ones held
    let mut last = spawn_worker(p, &file, claim, delete);
    wait_until("the outbox drained", Duration::from_secs(60), || {
        let s = fx.counts("k");
        s.pending == 0 && s.in_process == 0
    });
    last.kill().unwrap();
    last.wait().unwrap();

    let published = published.lock().unwrap().clone();
    let text = std::fs::read_to_string(&file).unwrap_or_default();
    let tally = common::Tally::of(
        &published,
        text.lines().filter_map(|l| l.parse::<EventId>().ok()),
    );
    let (lost, duplicates) = (tally.lost(), tally.duplicates());
    eprintln!(
        "relay ({claim} claims, acked rows deleted: {delete}) SIGKILLed {kills} times: published={} delivered={} duplicates={duplicates} lost={}",
        published.len(),
        published.len() - lost.len(),
        lost.len()
    );
    let _ = std::fs::remove_file(&file);
    // the children ran in the mode asked for: acked rows deleted, or kept
    let processed = common::count(&mut common::client().unwrap(), p, "PROCESSED");
    assert_eq!(processed == 0, delete, "{processed} PROCESSED rows");
    assert!(
        kills >= 10,
        "{kills} relay processes were killed while running"
    );
    assert!(
        duplicates > 0,
        "no kill landed between a broker ack and its finish"
    );
    assert!(
        published.len() > 1000,
        "the producer kept publishing: {}",
        published.len()
    );
    assert!(
        lost.is_empty(),
        "lost {} events, e.g. {:?}",
        lost.len(),
        lost.first()
    );
}

/// Hangs past the lease on its first batch, then reports every event failed.
struct Hanging {
    first: bool,
    /// Set when the first batch arrives.
    claimed: Arc<AtomicBool>,
    hang: Duration,
    /// Set when the hung batch's late results are handed back.
    late: Arc<AtomicBool>,
}

impl Sender for Hanging {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        if std::mem::take(&mut self.first) {
            self.claimed.store(true, Ordering::Relaxed);
            std::thread::sleep(self.hang);
            self.late.store(true, Ordering::Relaxed);
        }
        events
            .iter()
            .map(|_| Err(SendError::new("late failure")))
            .collect()
    }
}

each_claim_mode!(hanging_past_the_lease, "t_fault_hang":
    a_sender_hanging_past_the_lease_is_fenced_out,
    a_sender_hanging_past_the_lease_on_a_held_claim_is_fenced_out,
    a_sender_hanging_past_the_lease_on_a_deleting_held_claim_is_fenced_out);

/// A relay whose sender hangs past the lease, and another that takes over. A
/// held claim that deleted its rows has them back when the lease ends its session,
/// and its late failure writes nothing back.
/// `delete`: acked rows are deleted (`processed_ttl` zero).
fn hanging_past_the_lease(p: &str, claim: ClaimMode, delete: bool) {
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let defaults = |e: txbox::EventSettings| {
        e.adaptive_polling(ms(10), ms(100), 1.5)
            .lease(Duration::from_secs(1))
    };
    let config = common::mode_config(p, defaults, claim, delete)
        .event("h", |e| e)
        .maintenance(|m| m.recovery_interval(ms(200)))
        .build()
        .unwrap();
    let ids: HashSet<EventId> = fx.publish(&config, "h", 10, true).into_iter().collect();
    let late = Arc::new(AtomicBool::new(false));
    let claimed = Arc::new(AtomicBool::new(false));
    let (l, c) = (late.clone(), claimed.clone());
    let factory = move || -> txbox::Result<Box<dyn Sender>> {
        Ok(Box::new(Hanging {
            first: true,
            claimed: c.clone(),
            hang: Duration::from_secs(3),
            late: l.clone(),
        }))
    };
    let slow = Relay::start(fx.store.clone(), &config, factory).unwrap();
    wait_until(
        "the slow relay to claim the batch",
        Duration::from_secs(10),
        || claimed.load(Ordering::Relaxed),
    );
    // a lease claim stamps the rows; a held one leaves them PENDING, locked
    let held = fx.counts("h");
    match claim {
        ClaimMode::Lease => assert_eq!(held.in_process, 10),
        ClaimMode::Lock => assert_eq!((held.pending, held.in_process), (10, 0)),
    }
    let started = Instant::now();
    // another relay (another instance) takes over once the lease ran out
    let sender = MemorySender::new();
    let other = Relay::start(fx.another_store(), &config, sender.clone()).unwrap();
    wait_until(
        "the other relay delivers the recovered batch",
        Duration::from_secs(15),
        || sender.len() >= 10,
    );
    let got: HashSet<EventId> = sender.sent().iter().map(|e| e.id).collect();
    assert_eq!(got, ids);
    let duplicates = sender.len() - got.len();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "recovered while the first sender still hung"
    );
    // the first relay finishes late, claiming failure: fenced out, nothing changes
    // (its shutdown waits for that batch to be finished)
    slow.shutdown(Duration::from_secs(10)).unwrap();
    assert!(
        late.load(Ordering::Relaxed),
        "the hung batch came back late"
    );
    other.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        fx.counts("h"),
        txbox::TypeStatus::default(),
        "all processed, no retry scheduled"
    );
    let mut c = common::client().unwrap();
    let (changed, rows): (i64, i64) = {
        let r = c
            .query_one(
                &format!("SELECT coalesce(sum(attempts), 0), count(*) FROM {p}outbox_events"),
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(changed, 0, "the late failure counted no attempt");
    // kept as PROCESSED, or deleted (and not written back by the late failure)
    assert_eq!(rows, if delete { 0 } else { 10 });
    eprintln!(
        "hanging sender ({claim:?} claims, acked rows deleted: {delete}): published={} delivered={} duplicates={duplicates} lost={} late_finish_changed={changed}",
        ids.len(),
        got.len(),
        ids.difference(&got).count()
    );
}
