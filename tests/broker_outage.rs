//! The broker stops in the middle of a run for longer than the events' whole retry
//! budget: events stay pending with no attempt counted (an outage is not their
//! fault), none becomes FAILED, the relay keeps running, and once the broker is back
//! every event is delivered. With lease claims and with held claims. This binary stops the shared brokers, so it holds only these tests
//! (cargo runs test binaries one after another).
#![cfg(all(feature = "kafka", feature = "rabbitmq"))]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;

use txbox::{ClaimMode, Config, EventId, EventSettings, Outbox, Relay};

/// Starts the broker again when dropped, even if the test failed half-way.
struct Restart(&'static str, &'static [&'static str]);

impl Drop for Restart {
    fn drop(&mut self) {
        let _ = std::process::Command::new(self.0).args(self.1).status();
    }
}

fn options(e: EventSettings, destination: &str) -> EventSettings {
    e.destination(destination)
        .adaptive_polling(ms(20), ms(200), 1.5)
        // a retry budget of about 5 s, far shorter than the outage
        .max_retries(3)
        .backoff_delay(ms(1000))
        .backoff_multiplier(1.5)
        .backoff_jitter(0.0)
}

fn publish(
    client: &mut postgres::Client,
    outbox: &Outbox,
    event_type: &str,
    n: usize,
) -> Vec<EventId> {
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch(event_type, 0..n).unwrap())
        .unwrap();
    tx.commit().unwrap();
    ids
}

fn max_attempts(client: &mut postgres::Client, prefix: &str) -> i32 {
    client
        .query_one(
            &format!("SELECT coalesce(max(attempts), 0) FROM {prefix}outbox_events"),
            &[],
        )
        .unwrap()
        .get(0)
}

/// The common script: 100 delivered, broker down for 30 s while events keep being
/// published, broker back, every event delivered; no attempt was counted.
fn outage(
    prefix: &str,
    config: &Config,
    relay: Relay,
    collected: &Collected,
    stop_broker: impl FnOnce(),
    start_broker: impl FnOnce(),
) {
    let Some(mut client) = common::client() else {
        return;
    };
    let outbox = Outbox::new(config).unwrap();
    let mut all: HashSet<EventId> = publish(&mut client, &outbox, "e", 100)
        .into_iter()
        .collect();
    wait_until("the first 100 consumed", Duration::from_secs(60), || {
        collected.ids().len() == 100
    });
    // consumed is not yet acked to the relay: the broker must stop only once the
    // relay has finished them, or the count below races the last confirms
    wait_until("the first 100 processed", Duration::from_secs(30), || {
        common::count(&mut client, prefix, "PROCESSED") == 100
    });

    stop_broker();
    // 30 s without a broker, under load
    let down = std::time::Instant::now();
    let mut during = 0;
    while down.elapsed() < Duration::from_secs(30) {
        all.extend(publish(&mut client, &outbox, "e", 10));
        during += 10;
        std::thread::sleep(ms(200));
    }
    // one statement: counted in two, a row claimed between them counts twice
    let pending: i64 = client
        .query_one(
            &format!(
                "SELECT count(*) FROM {prefix}outbox_events \
                 WHERE status IN ('PENDING', 'IN_PROCESS')"
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(
        pending, during,
        "nothing is marked sent while the broker is down"
    );
    assert_eq!(common::count(&mut client, prefix, "FAILED"), 0);
    assert_eq!(
        max_attempts(&mut client, prefix),
        0,
        "an outage counts no attempt"
    );
    // one poller, five maintenance threads, the commit listener: all running
    assert_eq!(relay.thread_count(), 7, "the relay keeps running");

    start_broker();
    let total = all.len();
    wait_until(
        "every event consumed after the broker came back",
        Duration::from_secs(120),
        || collected.ids() == all,
    );
    let mut processed = 0;
    wait_until("all rows processed", Duration::from_secs(30), || {
        processed = common::count(&mut client, prefix, "PROCESSED");
        processed == total as i64
    });
    let delivered = collected.ids();
    let duplicates = collected.all().len() - delivered.len();
    let lost = all.difference(&delivered).count();
    assert_eq!(common::count(&mut client, prefix, "FAILED"), 0);
    assert_eq!(max_attempts(&mut client, prefix), 0);
    eprintln!("{prefix}: broker down 30 s (retry budget 5 s) under load: published={total} delivered={} duplicates={duplicates} lost={lost} failed=0 attempts=0", delivered.len());
    relay.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn kafka_broker_stopped_mid_run_loses_nothing() {
    kafka_outage("t_out_kafka_", ClaimMode::Lease);
}

#[test]
fn kafka_broker_stopped_mid_run_loses_nothing_with_held_claims() {
    kafka_outage("t_out_kafka_held_", ClaimMode::Lock);
}

/// Each broker is stopped by one test at a time (the two brokers' tests overlap).
static KAFKA: std::sync::Mutex<()> = std::sync::Mutex::new(());
static RABBITMQ: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The lock on the local Kafka (Tansu), which the caller may freeze; `None`
/// (printed) when the tests use another Kafka, or none is up outside CI.
fn local_kafka() -> Option<std::sync::MutexGuard<'static, ()>> {
    let one = KAFKA.lock().unwrap_or_else(|e| e.into_inner());
    if std::env::var("TXBOX_KAFKA_BROKERS").is_ok() {
        eprintln!("SKIPPED when TXBOX_KAFKA_BROKERS points at an external Kafka: this test freezes the local Tansu");
        return None;
    }
    service_up("Kafka", &kafka_brokers()).then_some(one)
}

fn kafka_outage(p: &str, claim: ClaimMode) {
    use txbox::kafka::{KafkaConsumer, KafkaSender};
    let Some(_one) = local_kafka() else {
        return;
    };
    let topic = format!("txbox-outage-{}", unique());
    create_topic(&topic, 1);
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.claim(claim))
        .event("e", |e| options(e, &topic))
        .build()
        .unwrap();
    let sender = KafkaSender::builder(&kafka_brokers())
        .property("message.timeout.ms", "2000")
        .build()
        .unwrap();
    let relay = Relay::start(store, &config, sender).unwrap();

    let collected = Collected::default();
    let handler = collected.handler();
    let consumer = KafkaConsumer::builder(&kafka_brokers(), &format!("g-{topic}"))
        .build()
        .unwrap();
    consumer.assign(&topic, &[0]).unwrap();
    let (stop, h) = spawn_loop(move |s| consumer.run(s, handler).unwrap());
    // The broker is frozen (SIGSTOP), not killed: Tansu's memory storage would forget
    // its topics on a restart, which a real Kafka does not.
    let _resume = Restart(
        "bash",
        &[
            concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/kafka.sh"),
            "resume",
        ],
    );
    outage(
        p,
        &config,
        relay,
        &collected,
        || ci_script("kafka.sh", &["pause"]),
        || ci_script("kafka.sh", &["resume"]),
    );
    stop.stop();
    h.join().unwrap();
}

#[test]
fn rabbitmq_broker_stopped_mid_run_loses_nothing() {
    rabbitmq_outage("t_out_rabbit_", ClaimMode::Lease);
}

#[test]
fn rabbitmq_broker_stopped_mid_run_loses_nothing_with_held_claims() {
    rabbitmq_outage("t_out_rabbit_held_", ClaimMode::Lock);
}

fn rabbitmq_outage(p: &str, claim: ClaimMode) {
    use amiquip::Connection;
    let _one = RABBITMQ.lock().unwrap_or_else(|e| e.into_inner());
    use txbox::rabbitmq::{RabbitConsumer, RabbitSender};
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let u = unique();
    let (exchange, queue) = (format!("txbox-ox-{u}"), format!("txbox-oq-{u}"));
    durable_queue(&exchange, &queue, "e");
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.claim(claim))
        .event("e", |e| options(e, &exchange))
        .build()
        .unwrap();
    let relay = Relay::start(
        store,
        &config,
        RabbitSender::builder(&rabbit_url())
            .confirm_timeout(ms(2000))
            .build()
            .unwrap(),
    )
    .unwrap();

    let collected = Collected::default();
    let handler = collected.handler();
    let consumer = RabbitConsumer::builder(&rabbit_url(), &queue).build();
    let (stop, h) = spawn_loop(move |s| consumer.run(s, handler).unwrap());
    let _restart = Restart("rabbitmqctl", &["start_app"]);
    let ctl = |cmd: &str| {
        let ok = std::process::Command::new("rabbitmqctl")
            .arg(cmd)
            .status()
            .map(|s| s.success());
        assert!(matches!(ok, Ok(true)), "rabbitmqctl {cmd}");
    };
    outage(
        p,
        &config,
        relay,
        &collected,
        || ctl("stop_app"),
        || ctl("start_app"),
    );
    stop.stop();
    h.join().unwrap();
    let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    let _ = ch.queue_delete(queue, Default::default());
    let _ = ch.exchange_delete(exchange, false);
}

/// A shutdown whose deadline comes while a batch still waits for the broker's
/// acks (Kafka frozen: its default wait is 35 s) releases the batch at once:
/// its rows are PENDING when `shutdown` returns, with no attempt counted,
/// instead of IN_PROCESS until the lease runs out; and the next relay sends
/// them once the broker is back.
#[test]
fn a_shutdown_that_times_out_releases_the_batches_in_flight() {
    use txbox::kafka::KafkaSender;
    let Some(_one) = local_kafka() else {
        return;
    };
    let p = "t_out_shutdown_";
    let topic = format!("txbox-shutdown-{}", unique());
    create_topic(&topic, 1);
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.destination(&topic).fixed_polling(ms(20)))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let relay = Relay::start(
        store.clone(),
        &config,
        KafkaSender::builder(&kafka_brokers()).build().unwrap(),
    )
    .unwrap();
    let first = publish(&mut client, &outbox, "e", 1);
    wait_until("the first event sent", Duration::from_secs(30), || {
        common::count(&mut client, p, "PROCESSED") == 1
    });
    let _resume = Restart(
        "bash",
        &[
            concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/kafka.sh"),
            "resume",
        ],
    );
    ci_script("kafka.sh", &["pause"]);
    let stuck: HashSet<EventId> = publish(&mut client, &outbox, "e", 20).into_iter().collect();
    wait_until(
        "the batch with the frozen broker",
        Duration::from_secs(10),
        || common::count(&mut client, p, "IN_PROCESS") == 20,
    );
    let err = relay.shutdown(Duration::from_secs(2)).unwrap_err();
    assert!(matches!(err, txbox::Error::ShutdownTimeout(1)), "{err}");
    assert_eq!(
        common::count(&mut client, p, "PENDING"),
        20,
        "released when shutdown returned"
    );
    assert_eq!(max_attempts(&mut client, p), 0, "no attempt counted");

    ci_script("kafka.sh", &["resume"]);
    let relay = Relay::start(
        store,
        &config,
        KafkaSender::builder(&kafka_brokers()).build().unwrap(),
    )
    .unwrap();
    wait_until(
        "all sent after the broker came back",
        Duration::from_secs(60),
        || common::count(&mut client, p, "PROCESSED") == 21,
    );
    relay.shutdown(Duration::from_secs(40)).unwrap();
    let consumer = kafka_reader(&topic, 1);
    let want: HashSet<EventId> = stuck.iter().chain(&first).copied().collect();
    let got: HashSet<EventId> = read_all(&want, || match consumer.poll(ms(200)) {
        Some(Ok(m)) => kafka_event_id(&m),
        _ => None,
    })
    .into_iter()
    .collect();
    assert!(want.is_subset(&got), "every event at the broker");
}
