//! The broker stops in the middle of a run: events stay pending (attempts counted,
//! backoff applied), the relay keeps running, and once the broker is back every event
//! is delivered. This binary stops the shared brokers, so it holds only these tests
//! (cargo runs test binaries one after another).
#![cfg(all(feature = "kafka", feature = "rabbitmq"))]

mod common;

use std::collections::HashSet;
use std::time::Duration;

use common::*;
use txbox::{Config, EventId, EventOptions, Outbox, Relay, StopSignal};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// Starts the broker again when dropped, even if the test failed half-way.
struct Restart(&'static str, &'static [&'static str]);

impl Drop for Restart {
    fn drop(&mut self) {
        let _ = std::process::Command::new(self.0).args(self.1).status();
    }
}

fn options(destination: &str) -> EventOptions {
    EventOptions::new()
        .destination(destination)
        .adaptive_polling(ms(20), ms(200), 1.5)
        .max_retries(100)
        .backoff_enabled(false)
        .backoff_delay(ms(500))
}

fn publish(
    client: &mut postgres::Client,
    outbox: &Outbox,
    event_type: &str,
    n: usize,
) -> Vec<EventId> {
    let mut tx = client.transaction().unwrap();
    let ids = outbox.publish_batch(&mut tx, event_type, 0..n).unwrap();
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

/// The common script: 100 delivered, broker down, 100 more published and failing,
/// broker back, all 200 delivered.
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

    stop_broker();
    all.extend(publish(&mut client, &outbox, "e", 100));
    wait_until(
        "failed attempts while the broker is down",
        Duration::from_secs(60),
        || max_attempts(&mut client, prefix) >= 2,
    );
    let pending: i64 = common::count(&mut client, prefix, "PENDING")
        + common::count(&mut client, prefix, "IN_PROCESS");
    assert_eq!(
        pending, 100,
        "nothing is marked sent while the broker is down"
    );
    assert_eq!(common::count(&mut client, prefix, "FAILED"), 0);
    assert_eq!(relay.thread_count(), 3, "the relay keeps running");

    start_broker();
    wait_until(
        "all 200 consumed after the broker came back",
        Duration::from_secs(120),
        || collected.ids() == all,
    );
    wait_until("all rows processed", Duration::from_secs(30), || {
        common::count(&mut client, prefix, "PROCESSED") == 200
    });
    let duplicates = collected.all().len() - 200;
    eprintln!("{prefix}: published 200, delivered 200, duplicates {duplicates}, lost 0");
    relay.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn kafka_broker_stopped_mid_run_loses_nothing() {
    use txbox::kafka::{KafkaConsumer, KafkaSender};
    if !service_up("Kafka", &kafka_brokers()) || std::env::var("TXBOX_KAFKA_BROKERS").is_ok() {
        eprintln!("SKIPPED when TXBOX_KAFKA_BROKERS points at an external Kafka: this test restarts the local Tansu");
        return;
    }
    let topic = format!("txbox-outage-{}", unique());
    create_topic(&topic, 1);
    let p = "t_out_kafka_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", options(&topic))
        .build()
        .unwrap();
    let sender = KafkaSender::builder(&kafka_brokers())
        .property("message.timeout.ms", "2000")
        .build()
        .unwrap();
    let relay = Relay::start(store, &config, sender).unwrap();

    // Tansu's memory storage forgets topics, messages and offsets when it stops, so
    // one consumer reads before the outage and a fresh one (new group) after it.
    let collected = Collected::default();
    let start_consumer = |group: &str| {
        let sink = collected.clone();
        let consumer = KafkaConsumer::builder(&kafka_brokers(), group)
            .build()
            .unwrap();
        consumer.assign(&topic, &[0]).unwrap();
        let stop = StopSignal::new();
        let s = stop.clone();
        let h = std::thread::spawn(move || {
            consumer
                .run(&s, |e| {
                    sink.push(e);
                    Ok::<(), String>(())
                })
                .unwrap()
        });
        (stop, h)
    };
    let before = start_consumer(&format!("g1-{topic}"));
    let after = std::cell::RefCell::new(None);
    let _restart = Restart(
        "bash",
        &[
            concat!(env!("CARGO_MANIFEST_DIR"), "/.ci/kafka.sh"),
            "start",
        ],
    );
    outage(
        p,
        &config,
        relay,
        &collected,
        || {
            before.0.stop();
            ci_script("kafka.sh", &["stop"]);
        },
        || {
            ci_script("kafka.sh", &["start"]);
            create_topic(&topic, 1);
            *after.borrow_mut() = Some(start_consumer(&format!("g2-{topic}")));
        },
    );
    before.1.join().unwrap();
    if let Some((stop, h)) = after.into_inner() {
        stop.stop();
        h.join().unwrap();
    }
}

#[test]
fn rabbitmq_broker_stopped_mid_run_loses_nothing() {
    use amiquip::{
        Connection, ExchangeDeclareOptions, ExchangeType, FieldTable, QueueDeclareOptions,
    };
    use txbox::rabbitmq::{RabbitConsumer, RabbitSenderFactory};
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let u = unique();
    let (exchange, queue) = (format!("txbox-ox-{u}"), format!("txbox-oq-{u}"));
    {
        let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
        let ch = conn.open_channel(None).unwrap();
        let durable = ExchangeDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.exchange_declare(ExchangeType::Direct, &exchange, durable)
            .unwrap();
        let q = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        ch.queue_declare(&queue, q).unwrap();
        ch.queue_bind(&queue, &exchange, "e", FieldTable::new())
            .unwrap();
        conn.close().unwrap();
    }
    let p = "t_out_rabbit_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", options(&exchange))
        .build()
        .unwrap();
    let relay = Relay::start(
        store,
        &config,
        RabbitSenderFactory::new(&rabbit_url()).confirm_timeout(ms(2000)),
    )
    .unwrap();

    let collected = Collected::default();
    let sink = collected.clone();
    let consumer = RabbitConsumer::new(&rabbit_url(), &queue);
    let stop = StopSignal::new();
    let s = stop.clone();
    let h = std::thread::spawn(move || {
        consumer
            .run(&s, |e| {
                sink.push(e);
                Ok::<(), String>(())
            })
            .unwrap()
    });
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
