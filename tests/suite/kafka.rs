//! PostgreSQL -> relay -> Kafka (Tansu here; any Kafka via TXBOX_KAFKA_BROKERS) -> consumer loop.
#![cfg(feature = "kafka")]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::common::*;
use serde_json::json;
use txbox::kafka::{KafkaConsumer, KafkaSender};
use txbox::{Config, Dlq, NewEvent, Outbox, Relay, StopSignal};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn kafka_up() -> bool {
    service_up("Kafka", &kafka_brokers())
}

/// Runs a consumer loop over every partition of `topic` in a thread.
fn consume(
    topic: &str,
    handler: impl FnMut(&txbox::ReceivedEvent) -> Result<(), String> + Send + 'static,
) -> (StopSignal, std::thread::JoinHandle<()>) {
    let consumer = KafkaConsumer::builder(&kafka_brokers(), &format!("g-{topic}"))
        .retry_delay(ms(100))
        .build()
        .unwrap();
    let parts = consumer.partitions(topic, Duration::from_secs(10)).unwrap();
    assert!(!parts.is_empty(), "topic {topic} has partitions");
    consumer.assign(topic, &parts).unwrap();
    spawn_loop(move |s| consumer.run(s, handler).unwrap())
}

/// A relay from a fresh outbox to a new topic `txbox-<name>-...` with `partitions`,
/// and `n` committed events of type `e` on their way; `None` when skipped.
fn relayed(name: &str, partitions: u32, n: usize) -> Option<(String, Relay, Vec<txbox::EventId>)> {
    let topic = format!("txbox-{name}-{}", unique());
    create_topic(&topic, partitions);
    let config = relayed_config(name, &topic);
    let (store, mut client) = fresh(config.table_prefix())?;
    let outbox = Outbox::new(&config).unwrap();
    let sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    let relay = Relay::start(store, &config, sender).unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("e", 0..n).unwrap())
        .unwrap();
    tx.commit().unwrap();
    Some((topic, relay, ids))
}

/// The configuration of [`relayed`]'s relay: type `e` to `topic`, on tables of
/// its own.
fn relayed_config(name: &str, topic: &str) -> Config {
    Config::builder()
        .table_prefix(format!("t_kafka_{name}_"))
        .defaults(|e| e.adaptive_polling(ms(20), ms(200), 1.5))
        .event("e", |e| e.destination(topic))
        .build()
        .unwrap()
}

#[test]
fn events_arrive_with_id_type_key_headers_and_payload() {
    if !kafka_up() {
        return;
    }
    let topic = format!("txbox-rt-{}", unique());
    create_topic(&topic, 3);
    let p = "t_kafka_rt_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(ms(20), ms(200), 1.5))
        .event("order-created", |e| e.destination(&topic))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    let relay = Relay::start(store, &config, sender).unwrap();

    let mut published = HashMap::new();
    let mut tx = client.transaction().unwrap();
    for i in 0..50 {
        let e = NewEvent::new("order-created", &json!({"order": i}))
            .unwrap()
            .key(format!("order-{}", i % 5))
            .header("trace-id", format!("t{i}"));
        published.insert(outbox.publish_all(&mut tx, [e]).unwrap()[0], i);
    }
    tx.commit().unwrap();

    let got = consume_events(50, |h| consume(&topic, h));
    relay.shutdown(Duration::from_secs(10)).unwrap();

    for e in got {
        let id = e.id.expect("event id header");
        let i = published[&id];
        assert_eq!(e.event_type.as_deref(), Some("order-created"));
        assert_eq!(e.key, Some(format!("order-{}", i % 5)));
        assert_eq!(
            e.headers,
            BTreeMap::from([("trace-id".to_string(), format!("t{i}"))])
        );
        assert_eq!(e.payload, format!("{{\"order\":{i}}}").into_bytes());
        assert_eq!(e.json::<serde_json::Value>().unwrap(), json!({"order": i}));
        assert!(matches!(e.position, txbox::Position::Kafka { topic: ref t, .. } if *t == topic));
    }
    assert_eq!(count(&mut client, p, "PROCESSED"), 50);
}

/// Events published as bytes reach the consumer unchanged, with the
/// `content-type` header; JSON events go without one, as before.
#[test]
fn binary_payloads_arrive_unchanged_with_their_content_type() {
    if !kafka_up() {
        return;
    }
    let Some((topic, relay, _)) = relayed("bytes", 1, 0) else {
        return;
    };
    let outbox = Outbox::new(&relayed_config("bytes", &topic)).unwrap();
    let ids = publish_bytes_and_json(&outbox, &mut client().unwrap(), "e");
    let got = consume_events(2, |h| consume(&topic, h));
    relay.shutdown(Duration::from_secs(10)).unwrap();
    check_bytes_and_json(&got, ids, None);
}

#[test]
fn an_oversized_message_fails_alone_and_ends_in_the_dlq() {
    if !kafka_up() {
        return;
    }
    let topic = format!("txbox-big-{}", unique());
    create_topic(&topic, 1);
    let p = "t_kafka_big_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("doc", |e| {
            e.destination(&topic)
                .fixed_polling(ms(50))
                .max_retries(1)
                .backoff_delay(ms(100))
                .backoff_jitter(0.0)
        })
        .dlq(|d| d.enabled(true))
        .dlq(|d| d.move_interval(ms(100)))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = KafkaSender::builder(&kafka_brokers())
        .property("message.max.bytes", "10000")
        .build()
        .unwrap();
    let relay = Relay::start(store.clone(), &config, sender).unwrap();
    let mut tx = client.transaction().unwrap();
    let mut small = Vec::new();
    for i in 0..3 {
        small.push(outbox.publish(&mut tx, "doc", &json!({"i": i})).unwrap());
    }
    let big = outbox.publish(&mut tx, "doc", &"x".repeat(20_000)).unwrap();
    for i in 3..6 {
        small.push(outbox.publish(&mut tx, "doc", &json!({"i": i})).unwrap());
    }
    tx.commit().unwrap();

    let dlq = Dlq::new(store);
    wait_until("the big event in the DLQ", Duration::from_secs(30), || {
        dlq.get(big).is_ok()
    });
    let dead = dlq.get(big).unwrap();
    assert_eq!(dead.attempts, 2);
    let err = dead.last_error.unwrap();
    assert!(
        err.to_lowercase().contains("too large") || err.contains("size"),
        "{err}"
    );
    assert_eq!(
        count(&mut client, p, "PROCESSED"),
        6,
        "the rest of the batch was delivered"
    );

    let got = consume_ids(6, |h| consume(&topic, h));
    assert_eq!(
        got.into_iter().collect::<std::collections::HashSet<_>>(),
        small.into_iter().collect()
    );
    relay.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn a_handler_that_fails_once_sees_the_message_again() {
    if !kafka_up() {
        return;
    }
    let Some((topic, relay, ids)) = relayed("retry", 1, 10) else {
        return;
    };

    let victim = ids[4];
    let calls = Calls::default();
    let (stop, h) = consume(&topic, calls.failing_once_for(victim));
    wait_until("every event handled", Duration::from_secs(30), || {
        ids.iter().all(|id| calls.count(*id) >= 1) && calls.count(victim) >= 2
    });
    stop.stop();
    h.join().unwrap();
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(calls.count(victim), 2, "failed once, then handled again");
    assert!(ids
        .iter()
        .filter(|id| **id != victim)
        .all(|id| calls.count(*id) >= 1));
}

#[test]
fn a_subscribed_consumer_group_receives_and_commits() {
    if !kafka_up() {
        return;
    }
    let Some((topic, relay, ids)) = relayed("sub", 2, 20) else {
        return;
    };
    let ids: std::collections::HashSet<_> = ids.into_iter().collect();

    // group membership (Tansu takes up to ~30 s to settle a join)
    let consumer = KafkaConsumer::builder(&kafka_brokers(), &format!("g-{topic}"))
        .build()
        .unwrap();
    consumer.subscribe(&[topic.as_str()]).unwrap();
    let got = Collected::default();
    let handler = got.handler();
    let (stop, h) = spawn_loop(move |s| consumer.run(s, handler).unwrap());
    wait_until(
        "the group consumer to receive all 20",
        Duration::from_secs(90),
        || got.ids() == ids,
    );
    stop.stop();
    h.join().unwrap();
    relay.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn two_batches_in_flight_get_their_own_reports() {
    use txbox::sender::Started;
    use txbox::Sender;
    if !kafka_up() {
        return;
    }
    let topic = format!("txbox-pipe-{}", unique());
    create_topic(&topic, 1);
    let mut sender = KafkaSender::builder(&kafka_brokers())
        .property("message.max.bytes", "10000")
        .build()
        .unwrap();
    let a: Vec<_> = (0..3)
        .map(|i| claimed(&topic, "doc", format!("{{\"a\":{i}}}")))
        .collect();
    let b = vec![
        claimed(&topic, "doc", "{\"b\":0}".into()),
        claimed(&topic, "doc", format!("\"{}\"", "x".repeat(20_000))),
        claimed(&topic, "doc", "{\"b\":2}".into()),
    ];
    assert!(matches!(sender.start(&a), Started::InFlight));
    assert!(matches!(sender.start(&b), Started::InFlight));
    let ra = sender.wait();
    assert!(ra.iter().all(|r| r.is_ok()), "{ra:?}");
    let rb = sender.wait();
    assert_eq!(rb.len(), 3);
    assert!(rb[0].is_ok() && rb[2].is_ok(), "{rb:?}");
    let err = rb[1].as_ref().unwrap_err().message.to_lowercase();
    assert!(err.contains("too large") || err.contains("size"), "{err}");
    assert!(sender.wait().is_empty(), "nothing else in flight");

    let order = consume_ids(5, |h| consume(&topic, h));
    let expected: Vec<_> = [&a[0], &a[1], &a[2], &b[0], &b[2]]
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(order, expected, "one partition keeps the start order");
}

/// One key's events in eight batches in flight at once, on a topic of four
/// partitions: the record key is the event key, so they all land in one
/// partition, and the idempotent producer keeps their start order there.
#[test]
fn one_keys_events_in_batches_in_flight_keep_their_order() {
    use txbox::sender::Started;
    use txbox::Sender;
    if !kafka_up() {
        return;
    }
    let topic = format!("txbox-keyorder-{}", unique());
    create_topic(&topic, 4);
    let mut sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    let batches: Vec<Vec<txbox::Event>> = (0..8)
        .map(|b| {
            (0..50)
                .map(|i| {
                    let mut e = claimed(&topic, "doc", format!("{}", b * 50 + i));
                    e.key = Some("order-7".into());
                    e
                })
                .collect()
        })
        .collect();
    for b in &batches {
        assert!(matches!(sender.start(b), Started::InFlight));
    }
    for _ in &batches {
        let r = sender.wait();
        assert!(r.len() == 50 && r.iter().all(|r| r.is_ok()), "{r:?}");
    }
    let got = consume_events(400, |h| consume(&topic, h));
    let partitions: std::collections::HashSet<i32> = got
        .iter()
        .map(|e| match e.position {
            txbox::Position::Kafka { partition, .. } => partition,
            _ => -1,
        })
        .collect();
    assert_eq!(
        partitions.len(),
        1,
        "one key, one partition: {partitions:?}"
    );
    let order: Vec<u64> = got.iter().map(|e| e.json::<u64>().unwrap()).collect();
    assert_eq!(order, (0..400).collect::<Vec<_>>(), "the start order");
}

/// A message to handle again that cannot be rewound (its partition was taken away
/// while the handler ran, as a rebalance does) stops the loop with an error naming
/// it, and nothing past it is committed: it is never skipped.
#[test]
fn a_retry_that_cannot_seek_back_stops_the_loop_and_commits_nothing_past_it() {
    use std::sync::Arc;
    use txbox::{Sender, Verdict};
    if !kafka_up() {
        return;
    }
    let (topic, other) = (
        format!("txbox-seek-{}", unique()),
        format!("txbox-seek-other-{}", unique()),
    );
    create_topic(&topic, 1);
    create_topic(&other, 1);
    let mut sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    let events: Vec<_> = (0..3)
        .map(|n| claimed(&topic, "doc", format!("{{\"n\":{n}}}")))
        .collect();
    assert!(sender.send(&events).iter().all(|r| r.is_ok()));

    let group = format!("g-{topic}");
    let consumer = Arc::new(
        KafkaConsumer::builder(&kafka_brokers(), &group)
            .retry_delay(ms(50))
            .build()
            .unwrap(),
    );
    consumer.assign(&topic, &[0]).unwrap();
    let (c, first) = (consumer.clone(), events[0].id);
    let (stop, h) = spawn_loop(move |s| {
        let handler = c.clone();
        c.run_with(s, move |e| {
            if e.id == Some(first) {
                // the partition is taken away while the handler runs
                handler.assign(&other, &[0]).unwrap();
                return Verdict::Retry("not now".into());
            }
            Verdict::Ack
        })
    });
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !h.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(ms(20));
    }
    stop.stop();
    let result = h.join().unwrap();
    let err = result.expect_err("the loop stops instead of skipping the message");
    assert!(err.to_string().contains(&format!("{topic}/0@0")), "{err}");
    // its position is past the message: the same consumer does not run again
    let again = consumer.run(&StopSignal::new(), |_| Ok::<(), String>(()));
    assert!(
        again.is_err(),
        "a consumer that lost its position runs no more"
    );
    // nothing was committed for the partition: the message is read again
    let again = KafkaConsumer::builder(&kafka_brokers(), &group)
        .build()
        .unwrap();
    again.assign(&topic, &[0]).unwrap();
    let got = consume_ids(1, |h| {
        let (stop, j) = spawn_loop(move |s| again.run(s, h).unwrap());
        (stop, j)
    });
    assert_eq!(
        got.first(),
        Some(&first),
        "read again from the message to retry"
    );
}

/// The lease must outlast the Kafka sender's wait for a batch's reports
/// (`message.timeout.ms`, or its alias `delivery.timeout.ms`, plus 5 s): refused
/// at start otherwise; the two aliases set to different values are refused.
#[test]
fn a_lease_shorter_than_the_delivery_timeout_is_refused_at_start() {
    let p = "t_kafka_lease_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.lease(Duration::from_secs(30)))
        .build()
        .unwrap();
    for alias in ["message.timeout.ms", "delivery.timeout.ms"] {
        let sender = KafkaSender::builder(&kafka_brokers())
            .property(alias, "60000")
            .build()
            .unwrap();
        let err = Relay::start(store.clone(), &config, sender)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            err.starts_with(
                "events.e.lease is 30s, not longer than the sender's wait for a batch's acks (65s"
            ),
            "{alias}: {err}"
        );
    }
    let err = KafkaSender::builder(&kafka_brokers())
        .property("message.timeout.ms", "1000")
        .property("delivery.timeout.ms", "90000")
        .build()
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains(
            "delivery.timeout.ms is \"90000\" while its alias message.timeout.ms is \"1000\""
        ),
        "{err}"
    );
    let err = KafkaSender::builder(&kafka_brokers())
        .property("delivery.timeout.ms", "soon")
        .build()
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.starts_with("kafka.delivery.timeout.ms must be a number of milliseconds"),
        "{err}"
    );
    // the default (30 s + 5 s) is within the default lease
    let sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap();
    Relay::start(store, &config, sender)
        .unwrap()
        .shutdown(Duration::from_secs(5))
        .unwrap();
}

/// Produces a record whose headers are raw bytes, as any producer may send them
/// (rdkafka's safe API takes header names as `&str`): through librdkafka itself.
fn produce_raw_headers(
    producer: &rdkafka::producer::BaseProducer,
    topic: &str,
    headers: &[(&[u8], &[u8])],
) {
    use rdkafka::bindings as rd;
    use rdkafka::bindings::rd_kafka_vtype_t::*;
    use rdkafka::producer::Producer;
    use std::ffi::{c_char, c_void, CString};
    let topic = CString::new(topic).unwrap();
    let payload = b"{}";
    // SAFETY: a fresh header list filled with copies of the given bytes; on
    // success `rd_kafka_producev` takes the list (and copies the payload:
    // RD_KAFKA_MSG_F_COPY), on failure it is freed here.
    unsafe {
        let list = rd::rd_kafka_headers_new(headers.len());
        for (name, value) in headers {
            let err = rd::rd_kafka_header_add(
                list,
                name.as_ptr().cast::<c_char>(),
                name.len() as isize,
                value.as_ptr().cast::<c_void>(),
                value.len() as isize,
            );
            assert_eq!(err, rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR);
        }
        let err = rd::rd_kafka_producev(
            producer.client().native_ptr(),
            RD_KAFKA_VTYPE_TOPIC,
            topic.as_ptr(),
            RD_KAFKA_VTYPE_MSGFLAGS,
            rd::RD_KAFKA_MSG_F_COPY,
            RD_KAFKA_VTYPE_VALUE,
            payload.as_ptr().cast::<c_void>(),
            payload.len(),
            RD_KAFKA_VTYPE_HEADERS,
            list,
            RD_KAFKA_VTYPE_END,
        );
        if err != rd::rd_kafka_resp_err_t::RD_KAFKA_RESP_ERR_NO_ERROR {
            rd::rd_kafka_headers_destroy(list);
            panic!("produce: {err:?}");
        }
    }
}

/// A record from another producer whose header name is not UTF-8, and one whose
/// event-id header is not UTF-8: the consumer loop reads both (rdkafka's own header
/// accessor panics on the first), the second without an id, and goes on.
#[test]
fn headers_that_are_not_utf8_neither_panic_nor_stop_the_consumer() {
    use rdkafka::producer::{BaseProducer, Producer};
    if !kafka_up() {
        return;
    }
    let topic = format!("txbox-bytes-{}", unique());
    create_topic(&topic, 1);
    let producer: BaseProducer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .create()
        .unwrap();
    let id = txbox::HEADER_EVENT_ID.as_bytes();
    let (first, third) = (txbox::EventId::new(), txbox::EventId::new());
    let bad: &[u8] = &[0xff, 0xfe, b'x'];
    produce_raw_headers(
        &producer,
        &topic,
        &[(bad, b"v"), (id, first.to_string().as_bytes())],
    );
    produce_raw_headers(&producer, &topic, &[(id, bad)]);
    produce_raw_headers(&producer, &topic, &[(id, third.to_string().as_bytes())]);
    producer.flush(Duration::from_secs(10)).unwrap();

    let got = consume_events(2, |h| consume(&topic, h));
    let ids: Vec<Option<txbox::EventId>> = got.iter().map(|e| e.id).collect();
    assert_eq!(ids, vec![Some(first), None, Some(third)]);
    assert_eq!(
        got[0].headers.get("\u{fffd}\u{fffd}x").map(String::as_str),
        Some("v"),
        "the name read lossily: {:?}",
        got[0].headers
    );
    assert!(
        got[1].event_id().is_err(),
        "no id: the missing-id policy applies"
    );
}

/// Producer settings under which a row could become PROCESSED without a
/// durable ack are refused, naming the property.
#[test]
fn settings_that_ack_before_the_data_is_safe_are_refused() {
    for (key, value) in [
        ("acks", "1"),
        ("acks", "0"),
        ("request.required.acks", "1"),
        ("enable.idempotence", "false"),
    ] {
        let err = KafkaSender::builder(&kafka_brokers())
            .property(key, value)
            .build()
            .err()
            .unwrap_or_else(|| panic!("{key}={value} accepted"))
            .to_string();
        assert!(err.starts_with(&format!("kafka.{key} ")), "{key}: {err}");
    }
    for (key, value) in [
        ("acks", "all"),
        ("acks", "-1"),
        ("request.required.acks", "all"),
        ("enable.idempotence", "true"),
    ] {
        KafkaSender::builder(&kafka_brokers())
            .property(key, value)
            .build()
            .unwrap_or_else(|e| panic!("{key}={value}: {e}"));
    }
}

/// A destination that is no Kafka topic name is refused when the relay
/// starts, not found out at send (where the events would be dead-lettered).
#[test]
fn a_destination_that_is_no_topic_name_is_refused_at_start() {
    let p = "t_kafka_topic_name_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    for bad in ["orders placed", "orders/eu", "..", &"x".repeat(250)] {
        let config = Config::builder()
            .table_prefix(p)
            .event("e", |e| e.destination(bad))
            .build()
            .unwrap();
        let sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
        let err = Relay::start(store.clone(), &config, sender)
            .err()
            .unwrap_or_else(|| panic!("{bad:?} accepted"))
            .to_string();
        assert!(
            err.starts_with("events.e.destination ") && err.contains("Kafka topic"),
            "{bad:?}: {err}"
        );
    }
    // an event type without a destination sends to a topic of its name
    let config = Config::builder()
        .table_prefix(p)
        .event("order placed", |e| e)
        .build()
        .unwrap();
    let sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    let err = Relay::start(store.clone(), &config, sender)
        .err()
        .expect("refused");
    assert!(err.to_string().contains("Kafka topic"), "{err}");
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.destination("orders.eu_v-2"))
        .build()
        .unwrap();
    let sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    Relay::start(store, &config, sender)
        .unwrap()
        .shutdown(Duration::from_secs(10))
        .unwrap();
}

/// The publisher's trace context reaches the consumer's handler through
/// Kafka (feature `trace-context`).
#[cfg(feature = "trace-context")]
#[test]
fn the_trace_context_goes_from_publish_to_the_handler() {
    if !kafka_up() {
        return;
    }
    let topic = format!("txbox-trace-{}", unique());
    create_topic(&topic, 1);
    let sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    crate::trace_context::traced_through("t_kafka_trace_", &topic, sender, |h| consume(&topic, h));
}

/// `[kafka.env]` takes a property's value from the environment variable it
/// names; a variable not set is an error naming the key and the variable,
/// never a value; a property set both ways is refused.
#[test]
fn kafka_properties_come_from_the_environment_variables_the_file_names() {
    let var = format!("T_KAFKA_SECRET_{}", unique());
    let text = |var: &str| {
        format!("[kafka]\n\"bootstrap.servers\" = \"b:9092\"\n[kafka.env]\n\"sasl.password\" = \"{var}\"\n")
    };
    let err = txbox::kafka::properties_from_toml(&text(&var))
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with(&format!(
            "kafka.env.sasl.password names the environment variable \"{var}\", which is not set"
        )),
        "{err}"
    );
    // a variable of this test's own: nothing else reads it
    std::env::set_var(&var, "s3cret-value");
    let properties = txbox::kafka::properties_from_toml(&text(&var)).unwrap();
    assert_eq!(properties["sasl.password"], "s3cret-value");
    assert_eq!(properties["bootstrap.servers"], "b:9092");
    let both =
        format!("[kafka]\n\"sasl.password\" = \"x\"\n[kafka.env]\n\"sasl.password\" = \"{var}\"\n");
    let err = txbox::kafka::properties_from_toml(&both)
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("kafka.env.sasl.password is set in [kafka] too"),
        "{err}"
    );
    assert!(!err.contains("s3cret-value"), "{err}");
    std::env::remove_var(&var);
}
