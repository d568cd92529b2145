//! The crash test against the real brokers: a relay process that sends to RabbitMQ
//! or to Kafka (Tansu) is killed with SIGKILL at random moments, again and again,
//! while a producer keeps writing business rows and their events in one
//! transaction (some rolled back). Then one relay drains what is left, and a
//! consumer that reads the broker directly (amiquip, rdkafka: not through txbox)
//! compares what arrived with the committed business rows: nothing lost, nothing
//! from a rolled-back transaction, duplicates counted and printed. The counts of
//! a run are kept in docs/RELIABILITY.md.
//!
//! The relay process is this test binary run again (`relay_worker_process`, an
//! ignored test run only as that child).
#![cfg(all(feature = "kafka", feature = "rabbitmq"))]

mod common;

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;
use txbox::kafka::KafkaSender;
use txbox::rabbitmq::RabbitSender;
use txbox::{ClaimMode, Config, EventId, Outbox, PgStore, Relay};

/// The two scenarios kill processes and load the machine: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// How many times each scenario kills a relay process that was running.
const KILLS: usize = 30;

/// The relay's configuration: lease claims, or held claims that delete acked rows
/// in the claim and write back what the broker did not ack (`held`).
fn config(prefix: &str, destination: &str, held: bool) -> Config {
    config_ordered(prefix, destination, held, false)
}

/// [`config`], and with `ordered` the events of one key in order.
fn config_ordered(prefix: &str, destination: &str, held: bool, ordered: bool) -> Config {
    let defaults = |e: txbox::EventSettings| {
        e.adaptive_polling(ms(10), ms(100), 1.5)
            .batch_size(50)
            .lease(ms(8000))
    }; // longer than the Kafka sender's 2 s + 5 s wait for acks
    let claim = if held {
        ClaimMode::Lock
    } else {
        ClaimMode::Lease
    };
    mode_config(prefix, defaults, claim, held)
        .event("order-placed", |e| {
            let e = e.destination(destination);
            if ordered {
                e.ordering(txbox::EventOrder::Key)
            } else {
                e
            }
        })
        .maintenance(|m| m.recovery_interval(ms(300)))
        .build()
        .unwrap()
}

/// The relay process of the scenarios below: not a test of its own, so it is
/// ignored and run only as their child process.
#[test]
#[ignore = "the relay child process of the broker crash tests"]
fn relay_worker_process() {
    let var = |name: &str| std::env::var(name).unwrap_or_default();
    let (prefix, broker, destination) = (
        var("TXBOX_CRASH_PREFIX"),
        var("TXBOX_CRASH_BROKER"),
        var("TXBOX_CRASH_DEST"),
    );
    if prefix.is_empty() {
        return; // only as a child process
    }
    let store = Arc::new(PgStore::connect(&pg_url(), &common::prefix_config(&prefix)).unwrap());
    let config = config_ordered(
        &prefix,
        &destination,
        var("TXBOX_CRASH_HELD") == "true",
        var("TXBOX_CRASH_ORDERED") == "true",
    );
    let _relay = if broker == "rabbitmq" {
        let factory = RabbitSender::builder(&rabbit_url())
            .confirm_timeout(ms(2000))
            .build()
            .unwrap();
        Relay::start(store, &config, factory).unwrap()
    } else {
        let sender = KafkaSender::builder(&kafka_brokers())
            .property("message.timeout.ms", "2000")
            .build()
            .unwrap();
        Relay::start(store, &config, sender).unwrap()
    };
    std::thread::sleep(Duration::from_secs(300)); // until killed
}

fn spawn_worker(prefix: &str, broker: &str, destination: &str, held: bool) -> std::process::Child {
    spawn_worker_ordered(prefix, broker, destination, held, false)
}

fn spawn_worker_ordered(
    prefix: &str,
    broker: &str,
    destination: &str,
    held: bool,
    ordered: bool,
) -> std::process::Child {
    spawn_child(
        "relay_worker_process",
        &[
            ("TXBOX_CRASH_PREFIX", prefix),
            ("TXBOX_CRASH_BROKER", broker),
            ("TXBOX_CRASH_DEST", destination),
            ("TXBOX_CRASH_HELD", &held.to_string()),
            ("TXBOX_CRASH_ORDERED", &ordered.to_string()),
        ],
    )
}

/// Rows still to be sent: PENDING or IN_PROCESS, in one snapshot (two counts
/// could both miss a row that went back from IN_PROCESS to PENDING between them).
fn waiting(client: &mut postgres::Client, p: &str) -> i64 {
    client
        .query_one(
            &format!(
                "SELECT count(*) FROM {p}outbox_events WHERE status IN ('PENDING', 'IN_PROCESS')"
            ),
            &[],
        )
        .unwrap()
        .get(0)
}

/// Committed events no longer waiting: acked and marked (or deleted) by a relay.
fn finished(client: &mut postgres::Client, p: &str) -> i64 {
    let orders: i64 = client
        .query_one(&format!("SELECT count(*) FROM {p}orders"), &[])
        .unwrap()
        .get(0);
    orders - waiting(client, p)
}

/// What a scenario counted.
struct Run {
    committed: HashSet<EventId>,
    rolled_back: HashSet<EventId>,
    kills: usize,
    /// Events the killed relays finished (acked and marked) before the drain.
    finished_while_killing: i64,
    /// Kills that cut a batch the relay had claimed and not finished.
    kills_mid_batch: usize,
    held: bool,
    /// How many kills the scenario makes.
    wanted_kills: usize,
}

/// Kills relay processes sending to `broker` while a producer writes orders and
/// their events; then drains with one last relay.
fn kill_relays_under_load(p: &str, broker: &str, destination: &str, held: bool) -> Option<Run> {
    let config = config(p, destination, held);
    let (mut client, load) = Load::start(p, &config, 5, |n| {
        txbox::NewEvent::new("order-placed", &serde_json::json!({ "order": n })).unwrap()
    })?;
    let mut kills = 0;
    let mut kills_mid_batch = 0;
    // the claims the relays killed before left behind (lease claims)
    let mut left_behind: Vec<uuid::Uuid> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    while kills < KILLS && Instant::now() < deadline {
        let mut child = spawn_worker(p, broker, destination, held);
        std::thread::sleep(ms(300 + fastrand::u64(0..700)));
        // until a relay got a first batch through, each one lives until it did:
        // on a loaded machine the first connection to the broker can take
        // longer than the lives above, and the kills would test nothing
        if kills == 0 {
            wait_until(
                "a relay's first batch acked",
                Duration::from_secs(60),
                || finished(&mut client, p) > 0,
            );
        }
        // only a relay still running counts as killed (not one that died on its own)
        if child.try_wait().unwrap().is_none() {
            // at a random moment, or a little later when a batch is claimed and
            // not finished then: most kills cut one
            let look = Instant::now() + ms(300);
            while Instant::now() < look {
                if claimed_unfinished(&mut client, p, held, &left_behind) > 0 {
                    kills_mid_batch += 1;
                    break;
                }
            }
            child.kill().unwrap(); // SIGKILL: no shutdown, batches cut anywhere
            kills += 1;
        }
        child.wait().unwrap();
        left_behind = client
            .query(
                &format!(
                    "SELECT DISTINCT claim_token FROM {p}outbox_events \
                     WHERE status = 'IN_PROCESS' AND claim_token IS NOT NULL"
                ),
                &[],
            )
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
    }
    let rolled_back = load.stop();

    // one last relay drains what is left, including what the dead ones held
    let kills = Kills {
        kills,
        kills_mid_batch,
        held,
        wanted: KILLS,
    };
    Some(drain(&mut client, p, rolled_back, kills, || {
        vec![spawn_worker(p, broker, destination, held)]
    }))
}

/// A producer thread writing orders and their events in one transaction each
/// (every `rollback_every`-th rolled back) until stopped.
struct Load {
    stop: Arc<AtomicBool>,
    rolled_back: Arc<Mutex<HashSet<EventId>>>,
    thread: std::thread::JoinHandle<()>,
}

impl Load {
    /// Fresh tables of `p` (the outbox and `{p}orders`), and the producer of
    /// `event(n)` for the n-th order.
    fn start(
        p: &str,
        config: &Config,
        rollback_every: u64,
        event: fn(u64) -> txbox::NewEvent,
    ) -> Option<(postgres::Client, Load)> {
        let (_store, mut client) = fresh(p)?;
        client
            .batch_execute(&format!(
                "DROP TABLE IF EXISTS {p}orders; \
                 CREATE TABLE {p}orders (id bigserial PRIMARY KEY, event_id uuid NOT NULL)"
            ))
            .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let rolled_back = Arc::new(Mutex::new(HashSet::new()));
        let (s, r, config) = (stop.clone(), rolled_back.clone(), config.clone());
        let insert = format!("INSERT INTO {p}orders (event_id) VALUES ($1)");
        let thread = std::thread::spawn(move || {
            let mut client = common::client().unwrap();
            let outbox = Outbox::new(&config).unwrap();
            let mut n = 0u64;
            while !s.load(Ordering::Relaxed) {
                let mut tx = client.transaction().unwrap();
                let id = outbox.publish_all(&mut tx, [event(n)]).unwrap()[0];
                tx.execute(&insert, &[&id.as_uuid()]).unwrap();
                if n % rollback_every == rollback_every - 1 {
                    tx.rollback().unwrap();
                    r.lock().unwrap().insert(id);
                } else {
                    tx.commit().unwrap();
                }
                n += 1;
                if n % 10 == 0 {
                    std::thread::sleep(ms(2));
                }
            }
        });
        Some((
            client,
            Load {
                stop,
                rolled_back,
                thread,
            },
        ))
    }

    /// Stops the producer; the ids it rolled back.
    fn stop(self) -> HashSet<EventId> {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
        let r = self.rolled_back.lock().unwrap();
        r.clone()
    }
}

/// How a scenario's kills went.
struct Kills {
    kills: usize,
    kills_mid_batch: usize,
    held: bool,
    /// How many kills the scenario makes.
    wanted: usize,
}

/// After the kills: counts what the killed relays got through (committed, no
/// longer waiting), lets the relay processes `drainers` gives send the rest
/// (and what the dead ones held, after its lease), stops them, and reads the
/// committed events.
fn drain(
    client: &mut postgres::Client,
    p: &str,
    rolled_back: HashSet<EventId>,
    k: Kills,
    drainers: impl FnOnce() -> Vec<std::process::Child>,
) -> Run {
    let finished_while_killing = finished(client, p);
    let relays = drainers();
    wait_until("the outbox drained", Duration::from_secs(180), || {
        waiting(client, p) == 0
    });
    for mut r in relays {
        r.kill().unwrap();
        r.wait().unwrap();
    }
    assert_eq!(count(client, p, "FAILED"), 0, "no event failed");
    let committed: HashSet<EventId> = client
        .query(&format!("SELECT event_id FROM {p}orders"), &[])
        .unwrap()
        .iter()
        .map(|r| EventId::from_uuid(r.get(0)))
        .collect();
    Run {
        committed,
        rolled_back,
        kills: k.kills,
        finished_while_killing,
        kills_mid_batch: k.kills_mid_batch,
        held: k.held,
        wanted_kills: k.wanted,
    }
}

/// What the running relay has claimed and not finished: with lease claims its
/// IN_PROCESS rows (under a token no killed relay left behind); with held
/// claims its open claim transactions.
fn claimed_unfinished(
    client: &mut postgres::Client,
    p: &str,
    held: bool,
    left_behind: &[uuid::Uuid],
) -> i64 {
    if held {
        client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE state LIKE 'idle in transaction%' AND query LIKE '%SKIP LOCKED%' \
                 AND query LIKE '%' || $1 || 'outbox_events%'",
                &[&p],
            )
            .unwrap()
            .get(0)
    } else {
        client
            .query_one(
                &format!(
                    "SELECT count(*) FROM {p}outbox_events \
                     WHERE status = 'IN_PROCESS' AND NOT (claim_token = ANY($1))"
                ),
                &[&left_behind],
            )
            .unwrap()
            .get(0)
    }
}

/// Compares what the broker holds (`received`: every message's event id, in
/// arrival order) with the committed business rows, prints the counts and
/// asserts none was lost or invented.
fn check(broker: &str, run: &Run, received: &[EventId]) {
    let tally = Tally::of(&run.committed, received.iter().copied());
    let (lost, duplicates) = (tally.lost(), tally.duplicates());
    let invented: Vec<&EventId> = tally
        .ids()
        .filter(|id| run.rolled_back.contains(id) || !run.committed.contains(id))
        .collect();
    eprintln!(
        "relay -> {broker} ({} claims) SIGKILLed {} times: committed={} rolled back={} finished by the killed relays={} kills mid-batch={} delivered={} duplicates={duplicates} lost={} from rolled-back or unknown={}",
        if run.held { "held, deleting" } else { "lease" },
        run.kills,
        run.committed.len(),
        run.rolled_back.len(),
        run.finished_while_killing,
        run.kills_mid_batch,
        tally.delivered(),
        lost.len(),
        invented.len()
    );
    assert!(
        run.kills >= run.wanted_kills,
        "{} relay processes were killed while running",
        run.kills
    );
    assert!(
        run.finished_while_killing > 0,
        "the killed relays sent and finished events between the kills"
    );
    assert!(
        run.kills_mid_batch * 2 >= run.kills,
        "most kills cut a batch claimed and not finished ({} of {})",
        run.kills_mid_batch,
        run.kills
    );
    assert!(
        run.committed.len() > 500 && !run.rolled_back.is_empty(),
        "the producer kept publishing: {} committed, {} rolled back",
        run.committed.len(),
        run.rolled_back.len()
    );
    assert!(
        lost.is_empty(),
        "lost {} events, e.g. {:?}",
        lost.len(),
        lost.first()
    );
    assert!(
        invented.is_empty(),
        "{} events at the broker were never committed, e.g. {:?}",
        invented.len(),
        invented.first()
    );
}

#[test]
fn a_relay_sending_to_rabbitmq_killed_again_and_again_loses_nothing() {
    rabbitmq_killed("t_crash_rabbit_", false);
}

#[test]
fn a_relay_holding_and_deleting_its_claims_sending_to_rabbitmq_killed_again_and_again_loses_nothing(
) {
    rabbitmq_killed("t_crash_rabbit_held_", true);
}

fn rabbitmq_killed(p: &str, held: bool) {
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let u = unique();
    let (exchange, queue) = (format!("txbox-crash-{u}"), format!("txbox-crash-{u}"));
    durable_queue(&exchange, &queue, "order-placed");
    let Some(run) = kill_relays_under_load(p, "rabbitmq", &exchange, held) else {
        return;
    };
    let received = read_rabbitmq(&exchange, &queue, &run.committed, |_| {});
    check("RabbitMQ", &run, &received);
}

/// Reads every message of `queue` until the ids of `want` arrived and it is
/// quiet ([`read_rabbitmq_queue`]), handing each body to `body`; then deletes
/// the queue and `exchange`. The message ids in arrival order.
fn read_rabbitmq(
    exchange: &str,
    queue: &str,
    want: &HashSet<EventId>,
    body: impl FnMut(&[u8]),
) -> Vec<EventId> {
    let received = read_rabbitmq_queue(queue, want, body);
    let mut conn = amiquip::Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    let _ = ch.queue_delete(queue, Default::default());
    let _ = ch.exchange_delete(exchange, false);
    let _ = conn.close();
    received
}

#[test]
fn a_relay_sending_to_kafka_killed_again_and_again_loses_nothing() {
    kafka_killed("t_crash_kafka_", false);
}

#[test]
fn a_relay_holding_and_deleting_its_claims_sending_to_kafka_killed_again_and_again_loses_nothing() {
    kafka_killed("t_crash_kafka_held_", true);
}

fn kafka_killed(p: &str, held: bool) {
    if !service_up("Kafka", &kafka_brokers()) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let topic = format!("txbox-crash-{}", unique());
    create_topic(&topic, 1);
    let Some(run) = kill_relays_under_load(p, "kafka", &topic, held) else {
        return;
    };
    let consumer = kafka_reader(&topic, 1);
    let received = read_all(&run.committed, || match consumer.poll(ms(200)) {
        Some(Ok(m)) => kafka_event_id(&m),
        _ => None,
    });
    check("Kafka", &run, &received);
}

/// Keys of the ordered scenario, and how many relay processes run at once.
const ORDERED_KEYS: u64 = 200;
const ORDERED_RELAYS: usize = 4;
const ORDERED_KILLS: usize = 10;

/// Four relay processes on one table send an ordered type (200 keys) while a
/// producer publishes; one of them is SIGKILLed and replaced, 10 times. Then
/// what reached the broker is read in arrival order: each key's events in
/// publish order (a re-sent event may repeat the key's latest, never go back
/// to an earlier one), none lost, none invented.
fn ordered_relays_killed(p: &str, broker: &str, destination: &str) -> Option<Run> {
    let config = config_ordered(p, destination, false, true);
    let (mut client, load) = Load::start(p, &config, 17, |n| {
        // each key's sequence number: n / keys (the keys take turns)
        let (key, seq) = (n % ORDERED_KEYS, n / ORDERED_KEYS);
        txbox::NewEvent::new("order-placed", &(key, seq))
            .unwrap()
            .key(format!("order-{key}"))
    })?;
    let spawn = || spawn_worker_ordered(p, broker, destination, false, true);
    let mut workers: Vec<std::process::Child> = (0..ORDERED_RELAYS).map(|_| spawn()).collect();
    let mut kills = 0;
    let mut kills_mid_batch = 0;
    while kills < ORDERED_KILLS {
        std::thread::sleep(ms(500 + fastrand::u64(0..700)));
        let victim = fastrand::usize(0..workers.len());
        if workers[victim].try_wait().unwrap().is_none() {
            let look = Instant::now() + ms(300);
            while Instant::now() < look {
                if claimed_unfinished(&mut client, p, false, &[]) > 0 {
                    kills_mid_batch += 1;
                    break;
                }
            }
            workers[victim].kill().unwrap();
            kills += 1;
        }
        workers[victim].wait().unwrap();
        workers[victim] = spawn();
    }
    let rolled_back = load.stop();
    // the survivors drain the rest, and the killed relays' claims after their lease
    let kills = Kills {
        kills,
        kills_mid_batch,
        held: false,
        wanted: ORDERED_KILLS,
    };
    Some(drain(&mut client, p, rolled_back, kills, || workers))
}

/// Each key's sequence numbers in arrival order never go back.
fn check_order(broker: &str, arrivals: &[(u64, u64)]) {
    let mut last = std::collections::HashMap::new();
    let mut repeats = 0;
    for (key, seq) in arrivals {
        if let Some(before) = last.insert(*key, *seq) {
            assert!(
                *seq >= before,
                "{broker}: key {key}: event {seq} arrived after event {before}"
            );
            repeats += usize::from(*seq == before);
        }
    }
    eprintln!(
        "ordered relay -> {broker}: {} arrivals over {} keys in publish order, {repeats} repeated the key's latest",
        arrivals.len(),
        last.len()
    );
    assert!(last.len() as u64 == ORDERED_KEYS, "every key arrived");
}

/// The ordered scenario's `Run` checked like the others, and each key's order.
fn check_ordered(broker: &str, run: &Run, received: &[EventId], arrivals: &[(u64, u64)]) {
    check(broker, run, received);
    check_order(broker, arrivals);
}

#[test]
fn four_ordered_relays_sending_to_rabbitmq_killed_keep_each_keys_order() {
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let u = unique();
    let (exchange, queue) = (format!("txbox-ord-{u}"), format!("txbox-ord-{u}"));
    durable_queue(&exchange, &queue, "order-placed");
    let Some(run) = ordered_relays_killed("t_crash_ord_rabbit_", "rabbitmq", &exchange) else {
        return;
    };
    let mut arrivals = Vec::new();
    let received = read_rabbitmq(&exchange, &queue, &run.committed, |body| {
        arrivals.push(serde_json::from_slice(body).unwrap());
    });
    check_ordered("RabbitMQ", &run, &received, &arrivals);
}

#[test]
fn four_ordered_relays_sending_to_kafka_killed_keep_each_keys_order() {
    use rdkafka::message::Message;
    if !service_up("Kafka", &kafka_brokers()) {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let topic = format!("txbox-ord-{}", unique());
    create_topic(&topic, 4);
    let Some(run) = ordered_relays_killed("t_crash_ord_kafka_", "kafka", &topic) else {
        return;
    };
    let consumer = kafka_reader(&topic, 4);
    let mut arrivals = Vec::new();
    // each key is one partition's: the record key is the event key
    let mut partition_of = std::collections::HashMap::new();
    let received = read_all(&run.committed, || match consumer.poll(ms(200)) {
        Some(Ok(m)) => {
            let (key, seq): (u64, u64) = serde_json::from_slice(m.payload()?).unwrap();
            let p = *partition_of.entry(key).or_insert(m.partition());
            assert_eq!(p, m.partition(), "key {key} in two partitions");
            assert_eq!(m.key(), Some(format!("order-{key}").as_bytes()));
            arrivals.push((key, seq));
            kafka_event_id(&m)
        }
        _ => None,
    });
    check_ordered("Kafka", &run, &received, &arrivals);
}
