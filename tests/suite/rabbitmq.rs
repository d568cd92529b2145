//! PostgreSQL -> relay -> RabbitMQ -> consumer loop, against the real broker.
#![cfg(feature = "rabbitmq")]

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use crate::common::*;
use amiquip::{
    AmqpValue, Connection, ExchangeDeclareOptions, ExchangeType, FieldTable, QueueDeclareOptions,
};
use serde_json::json;
use txbox::rabbitmq::{RabbitConsumer, RabbitSender};
use txbox::{Config, Dlq, NewEvent, Outbox, Relay, SenderFactory, StopSignal};

fn rabbit_up() -> bool {
    service_up("RabbitMQ", "127.0.0.1:5672")
}

/// Declares an exchange and a queue bound to it (auto-deleted with the test's connection
/// gone is not wanted: the relay publishes from other connections).
fn declare(exchange: &str, kind: ExchangeType, queue: &str, routing_key: &str, args: FieldTable) {
    let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    ch.exchange_declare(kind, exchange, ExchangeDeclareOptions::default())
        .unwrap();
    ch.queue_declare(queue, QueueDeclareOptions::default())
        .unwrap();
    ch.queue_bind(queue, exchange, routing_key, args).unwrap();
    conn.close().unwrap();
}

/// A fresh direct exchange and a queue bound to it with `routing_key`.
fn direct(routing_key: &str) -> (String, String) {
    let u = unique();
    let (exchange, queue) = (format!("txbox-ex-{u}"), format!("txbox-q-{u}"));
    declare(
        &exchange,
        ExchangeType::Direct,
        &queue,
        routing_key,
        FieldTable::new(),
    );
    (exchange, queue)
}

fn consume(
    queue: &str,
    handler: impl FnMut(&txbox::ReceivedEvent) -> Result<(), String> + Send + 'static,
) -> (StopSignal, std::thread::JoinHandle<()>) {
    let consumer = RabbitConsumer::builder(&rabbit_url(), queue)
        .prefetch(20)
        .retry_delay(ms(50))
        .build();
    spawn_loop(move |s| consumer.run(s, handler).unwrap())
}

#[test]
fn events_arrive_with_id_type_key_headers_and_payload() {
    if !rabbit_up() {
        return;
    }
    let (exchange, queue) = direct("orders.created");
    let p = "t_rabbit_rt_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(ms(20), ms(200), 1.5))
        .event("order-created", |e| e.destination(&exchange))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = RabbitSender::builder(&rabbit_url())
        .routing_key("order-created", "orders.created")
        .build()
        .unwrap();
    let relay = Relay::start(store, &config, sender).unwrap();

    let mut published = HashMap::new();
    let mut tx = client.transaction().unwrap();
    for i in 0..50 {
        let mut e = NewEvent::new("order-created", &json!({"order": i}))
            .unwrap()
            .header("trace-id", format!("t{i}"));
        if i % 2 == 0 {
            e = e.key(format!("order-{i}"));
        }
        published.insert(outbox.publish_all(&mut tx, [e]).unwrap()[0], i);
    }
    tx.commit().unwrap();

    let got = consume_events(50, |h| consume(&queue, h));
    relay.shutdown(Duration::from_secs(10)).unwrap();

    for e in got {
        let i = published[&e.id.expect("event id")];
        assert_eq!(e.event_type.as_deref(), Some("order-created"));
        assert_eq!(e.key, (i % 2 == 0).then(|| format!("order-{i}")));
        assert_eq!(
            e.headers,
            BTreeMap::from([("trace-id".to_string(), format!("t{i}"))])
        );
        assert_eq!(e.json::<serde_json::Value>().unwrap(), json!({"order": i}));
        assert!(
            matches!(e.position, txbox::Position::RabbitMq { queue: ref q, .. } if *q == queue)
        );
    }
    assert_eq!(count(&mut client, p, "PROCESSED"), 50);
}

/// Events published as bytes reach the consumer unchanged, with their
/// `content_type` property; JSON events keep `application/json`.
#[test]
fn binary_payloads_arrive_unchanged_with_their_content_type() {
    if !rabbit_up() {
        return;
    }
    let (exchange, queue) = direct("e");
    let p = "t_rabbit_bytes_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(ms(20), ms(200), 1.5))
        .event("e", |e| e.destination(&exchange))
        .build()
        .unwrap();
    let sender = RabbitSender::builder(&rabbit_url()).build().unwrap();
    let relay = Relay::start(store, &config, sender).unwrap();
    let ids = publish_bytes_and_json(&Outbox::new(&config).unwrap(), &mut client, "e");
    let got = consume_events(2, |h| consume(&queue, h));
    relay.shutdown(Duration::from_secs(10)).unwrap();
    check_bytes_and_json(&got, ids, Some("application/json"));
}

/// `Relay::deliver_pending` with the real sender: the events are at the broker
/// when it returns, and their rows are PROCESSED.
#[test]
fn deliver_pending_puts_the_events_at_the_broker_before_it_returns() {
    if !rabbit_up() {
        return;
    }
    let (exchange, queue) = direct("order-created");
    let p = "t_rabbit_flush_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("order-created", |e| e.destination(&exchange))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, NewEvent::batch("order-created", 0..5).unwrap())
        .unwrap();
    tx.commit().unwrap();
    let mut sender = RabbitSender::builder(&rabbit_url())
        .build()
        .unwrap()
        .create()
        .unwrap();
    let report = Relay::deliver_pending(&*store, &config, &mut *sender).unwrap();
    assert_eq!(report.sent(), 5);
    assert_eq!(count(&mut client, p, "PROCESSED"), 5);
    // already at the broker: a plain get finds every one
    let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    let q = ch.queue_declare_passive(&queue).unwrap();
    let mut got = Vec::new();
    while let Some(m) = q.get(true).unwrap() {
        got.push(m.delivery.properties.message_id().clone().unwrap());
    }
    let want: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
    assert_eq!(got, want);
    conn.close().unwrap();
}

/// The sender opens its own socket (to set TCP_NODELAY) and reads the URL itself:
/// the virtual host, the parameters and the credentials reach the broker.
#[test]
fn the_sender_reads_the_url_as_amiquip_does() {
    if !rabbit_up() {
        return;
    }
    let (exchange, _queue) = direct("k");
    let base = rabbit_url();
    let event = txbox::Event {
        id: txbox::EventId::new(),
        event_type: "k".into(),
        destination: exchange,
        key: None,
        headers: Default::default(),
        payload: b"{}".to_vec(),
        content_type: None,
        attempts: 0,
    };
    let send = |url: &str| {
        let mut s = RabbitSender::builder(url)
            .confirm_timeout(ms(5000))
            .build()
            .unwrap()
            .create()
            .unwrap();
        s.send(std::slice::from_ref(&event)).remove(0)
    };
    for url in [
        base.clone(),
        format!("{base}/"),
        format!("{base}/%2f"),
        format!("{base}/%2f?heartbeat=30&connection_timeout=5000&channel_max=8"),
        // every address `localhost` resolves to in turn (::1 first here, where
        // the broker may not listen)
        base.replace("127.0.0.1", "localhost"),
    ] {
        assert!(send(&url).is_ok(), "{url}: {:?}", send(&url));
    }
    let wrong = base.replace("guest:guest@", "guest:wrong@");
    assert_ne!(wrong, base, "the test's URL has guest:guest");
    assert!(send(&wrong).is_err(), "a wrong password was accepted");
    let vhost = format!("{base}/no-such-vhost");
    assert!(
        send(&vhost).is_err(),
        "an unknown virtual host was accepted"
    );
}

#[test]
fn an_unroutable_message_fails_alone_and_ends_in_the_dlq() {
    if !rabbit_up() {
        return;
    }
    let u = unique();
    let (exchange, queue) = (format!("txbox-hx-{u}"), format!("txbox-hq-{u}"));
    // a headers exchange that routes only region=eu
    let mut args = FieldTable::new();
    args.insert("x-match".into(), AmqpValue::LongString("all".into()));
    args.insert("region".into(), AmqpValue::LongString("eu".into()));
    declare(&exchange, ExchangeType::Headers, &queue, "", args);
    let p = "t_rabbit_lost_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("shipment", |e| {
            e.destination(&exchange)
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
    let relay = Relay::start(
        store.clone(),
        &config,
        RabbitSender::builder(&rabbit_url()).build().unwrap(),
    )
    .unwrap();
    let mut tx = client.transaction().unwrap();
    let mut routed = Vec::new();
    let mut lost = None;
    for i in 0..6 {
        let region = if i == 2 { "us" } else { "eu" };
        let e = NewEvent::new("shipment", &json!({"i": i}))
            .unwrap()
            .header("region", region);
        let id = outbox.publish_all(&mut tx, [e]).unwrap()[0];
        if i == 2 {
            lost = Some(id);
        } else {
            routed.push(id);
        }
    }
    tx.commit().unwrap();
    let lost = lost.unwrap();

    let dlq = Dlq::new(store);
    wait_until(
        "the unroutable event in the DLQ",
        Duration::from_secs(30),
        || dlq.get(lost).is_ok(),
    );
    let dead = dlq.get(lost).unwrap();
    assert_eq!(dead.attempts, 2);
    assert!(
        dead.last_error
            .as_deref()
            .unwrap_or("")
            .contains("unroutable"),
        "{:?}",
        dead.last_error
    );
    assert_eq!(count(&mut client, p, "PROCESSED"), 5);

    let got = consume_ids(5, |h| consume(&queue, h));
    assert_eq!(
        got.into_iter().collect::<std::collections::HashSet<_>>(),
        routed.into_iter().collect()
    );
    relay.shutdown(Duration::from_secs(10)).unwrap();
}

#[test]
fn a_handler_that_fails_once_sees_the_message_again() {
    if !rabbit_up() {
        return;
    }
    let (exchange, queue) = direct("e");
    let p = "t_rabbit_retry_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(ms(20), ms(200), 1.5))
        .event("e", |e| e.destination(&exchange))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let relay = Relay::start(
        store,
        &config,
        RabbitSender::builder(&rabbit_url()).build().unwrap(),
    )
    .unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("e", 0..10).unwrap())
        .unwrap();
    tx.commit().unwrap();

    let victim = ids[3];
    let calls = Calls::default();
    let (stop, h) = consume(&queue, calls.failing_once_for(victim));
    wait_until("every event handled", Duration::from_secs(30), || {
        ids.iter().all(|id| calls.count(*id) >= 1) && calls.count(victim) >= 2
    });
    stop.stop();
    h.join().unwrap();
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(
        calls.count(victim),
        2,
        "nacked with requeue, then handled again"
    );
}

#[test]
fn two_batches_in_flight_get_their_own_confirms_and_returns() {
    use txbox::sender::Started;
    use txbox::Sender;
    if !rabbit_up() {
        return;
    }
    let (exchange, queue) = direct("k");
    let event =
        |n: &str, routing_key: &str| claimed(&exchange, routing_key, format!("{{\"n\":\"{n}\"}}"));
    let a = vec![event("a0", "k"), event("a1", "k"), event("a2", "k")];
    let b = vec![event("b0", "k"), event("b1", "nowhere"), event("b2", "k")];
    let mut sender = txbox::rabbitmq::RabbitSender::builder(&rabbit_url())
        .confirm_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .create()
        .unwrap();
    assert!(matches!(sender.start(&a), Started::InFlight));
    assert!(matches!(sender.start(&b), Started::InFlight));
    let ra = sender.wait();
    assert!(ra.len() == 3 && ra.iter().all(|r| r.is_ok()), "{ra:?}");
    let rb = sender.wait();
    assert_eq!(rb.len(), 3);
    assert!(rb[0].is_ok() && rb[2].is_ok(), "{rb:?}");
    let err = &rb[1].as_ref().unwrap_err().message;
    assert!(err.contains("unroutable"), "{err}");
    assert!(sender.wait().is_empty(), "nothing else in flight");

    let order = consume_ids(5, |h| consume(&queue, h));
    let expected: Vec<_> = [&a[0], &a[1], &a[2], &b[0], &b[2]]
        .iter()
        .map(|e| e.id)
        .collect();
    assert_eq!(order, expected, "one queue keeps the start order");
}

/// A returned (unroutable) message stays failed when its batch breaks afterwards:
/// here the channel closes on the next message, sent to an exchange that does not
/// exist, after the broker returned and acked the first one.
#[test]
fn a_returned_message_fails_even_when_its_batch_breaks_afterwards() {
    use txbox::sender::{SendErrorKind, Started};
    use txbox::Sender;
    if !rabbit_up() {
        return;
    }
    let (exchange, _queue) = direct("k");
    let missing = format!("txbox-missing-{}", unique());
    let unroutable = claimed(&exchange, "nowhere", "{\"n\":1}".into());
    let to_missing = claimed(&missing, "k", "{\"n\":2}".into());
    let mut sender = txbox::rabbitmq::RabbitSender::builder(&rabbit_url())
        .confirm_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .create()
        .unwrap();
    let r = sender.send(&[unroutable.clone(), to_missing.clone()]);
    assert_eq!(r.len(), 2);
    let first = r[0].as_ref().expect_err("a returned message is never sent");
    assert!(first.message.contains("unroutable"), "{first:?}");
    assert_eq!(first.kind, SendErrorKind::Permanent);
    // a missing exchange is the destination's fault, not the transport's
    let second = r[1].as_ref().expect_err("no exchange took it");
    assert_eq!(second.kind, SendErrorKind::Permanent, "{second:?}");

    // the same with the returned message in a later batch in flight, once the
    // sender has its connection again (it waits a moment before reconnecting)
    wait_until("the sender reconnected", Duration::from_secs(10), || {
        sender.ready().is_ok()
    });
    let (exchange2, _q2) = direct("k");
    let returned = claimed(&exchange2, "nowhere", "{\"n\":3}".into());
    assert!(matches!(sender.start(&[returned]), Started::InFlight));
    assert!(matches!(sender.start(&[to_missing]), Started::InFlight));
    let ra = sender.wait();
    assert!(
        ra.len() == 1
            && ra[0]
                .as_ref()
                .is_err_and(|e| e.message.contains("unroutable")),
        "{ra:?}"
    );
    let rb = sender.wait();
    assert!(rb.len() == 1 && rb[0].is_err(), "{rb:?}");
}

/// A lease that runs out while a batch may still wait for RabbitMQ's confirms
/// would have the batch recovered and sent again while in flight: refused at
/// start, naming both values.
#[test]
fn a_lease_shorter_than_the_confirm_timeout_is_refused_at_start() {
    let p = "t_rabbit_lease_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.lease(Duration::from_secs(20)))
        .build()
        .unwrap();
    let factory = RabbitSender::builder(&rabbit_url())
        .confirm_timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let err = Relay::start(store.clone(), &config, factory)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.starts_with(
            "events.e.lease is 20s, not longer than the sender's wait for a batch's acks (30s"
        ),
        "{err}"
    );
    let factory = RabbitSender::builder(&rabbit_url())
        .confirm_timeout(Duration::from_secs(10))
        .build()
        .unwrap();
    Relay::start(store, &config, factory)
        .unwrap()
        .shutdown(Duration::from_secs(5))
        .unwrap();
}

/// A queue at its length limit with `x-overflow = reject-publish` makes the
/// broker nack what it cannot take: the consumers are behind, which is not the
/// events' fault. The nacks are transient (back to pending, no attempt counted),
/// so a consumer outage does not burn the events' retries into the dead letters.
#[test]
fn a_full_queue_that_rejects_publishes_is_not_the_events_fault() {
    use txbox::sender::SendErrorKind;
    use txbox::Sender;
    if !rabbit_up() {
        return;
    }
    let u = unique();
    let (exchange, queue) = (format!("txbox-ex-{u}"), format!("txbox-q-{u}"));
    let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    ch.exchange_declare(
        ExchangeType::Direct,
        &exchange,
        ExchangeDeclareOptions::default(),
    )
    .unwrap();
    let mut args = FieldTable::new();
    args.insert("x-max-length".into(), AmqpValue::LongInt(1));
    args.insert(
        "x-overflow".into(),
        AmqpValue::LongString("reject-publish".into()),
    );
    ch.queue_declare(
        &queue,
        QueueDeclareOptions {
            arguments: args,
            ..QueueDeclareOptions::default()
        },
    )
    .unwrap();
    ch.queue_bind(&queue, &exchange, "k", FieldTable::new())
        .unwrap();
    conn.close().unwrap();

    let events: Vec<txbox::Event> = (0..3)
        .map(|n| claimed(&exchange, "k", format!("{{\"n\":{n}}}")))
        .collect();
    let mut sender = txbox::rabbitmq::RabbitSender::builder(&rabbit_url())
        .confirm_timeout(Duration::from_secs(10))
        .build()
        .unwrap()
        .create()
        .unwrap();
    let results = sender.send(&events);
    assert!(results[0].is_ok(), "the queue took the first: {results:?}");
    for r in &results[1..] {
        let err = r.as_ref().expect_err("the full queue refused it");
        assert!(err.message.contains("nacked"), "{err:?}");
        assert_eq!(err.kind, SendErrorKind::Transient, "{err:?}");
    }
}

/// The largest message the local RabbitMQ takes (`max_message_size`, which
/// `.ci/services.sh` lowers to 2 MiB), read with rabbitmqctl.
fn broker_max_message() -> usize {
    let out = std::process::Command::new("rabbitmqctl")
        .args([
            "-q",
            "eval",
            "application:get_env(rabbit, max_message_size).",
        ])
        .output()
        .expect("rabbitmqctl runs");
    let text = String::from_utf8_lossy(&out.stdout);
    let digits: String = text.chars().filter(char::is_ascii_digit).collect();
    digits
        .parse()
        .unwrap_or_else(|_| panic!("max_message_size from rabbitmqctl: {text:?}"))
}

/// How many messages `queue` holds, read by a passive declare.
fn queue_depth(queue: &str) -> u32 {
    let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    let q = ch.queue_declare_passive(queue).unwrap();
    let n = q.declared_message_count().unwrap_or(0);
    conn.close().unwrap();
    n
}

/// A message over the broker's `max_message_size` makes RabbitMQ close the
/// channel: only that message fails (a verdict on it), its neighbours in its
/// batch and in the batch in flight behind it go back without one, none that
/// the broker confirmed is failed; and the sender then knows the limit and
/// refuses the next such message before publishing it, the channel kept.
#[test]
fn a_message_over_the_brokers_size_limit_fails_alone() {
    use txbox::sender::{SendErrorKind, Started};
    use txbox::Sender;
    if !rabbit_up() {
        return;
    }
    let limit = broker_max_message();
    let (exchange, queue) = direct("k");
    let small = |n: usize| claimed(&exchange, "k", format!("{{\"n\":{n}}}"));
    let big = claimed(&exchange, "k", format!("\"{}\"", "x".repeat(limit)));
    // the sender assumes a higher limit than the operator set
    let mut sender = RabbitSender::builder(&rabbit_url())
        .max_message_size(limit * 4)
        .build()
        .unwrap()
        .create()
        .unwrap();
    let mut first: Vec<txbox::Event> = (0..150).map(small).collect();
    first.push(big.clone());
    first.extend((150..300).map(small));
    let behind: Vec<txbox::Event> = (300..350).map(small).collect();
    assert!(matches!(sender.start(&first), Started::InFlight));
    assert!(matches!(sender.start(&behind), Started::InFlight));
    let (ra, rb) = (sender.wait(), sender.wait());
    assert_eq!((ra.len(), rb.len()), (301, 50));
    let refused = ra[150].as_ref().expect_err("the broker refused it");
    assert_eq!(refused.kind, SendErrorKind::Permanent, "{refused:?}");
    assert!(refused.message.contains("max size"), "{refused:?}");
    let results: Vec<_> = ra.iter().chain(&rb).enumerate().collect();
    for (i, r) in &results {
        if *i != 150 {
            assert!(
                r.as_ref().is_ok() || r.as_ref().is_err_and(|e| e.is_transient()),
                "message {i} is not the refused one: {r:?}"
            );
        }
    }
    let acked = results.iter().filter(|(_, r)| r.is_ok()).count() as u32;
    wait_until("the acked messages in the queue", ms(5000), || {
        queue_depth(&queue) >= acked
    });

    // the sender learned the limit: the next one is refused before it is
    // published, and its neighbours go through on the same channel
    wait_until("the sender reconnected", Duration::from_secs(10), || {
        sender.ready().is_ok()
    });
    let before = queue_depth(&queue);
    let r = sender.send(&[small(400), big, small(401)]);
    assert!(r[0].is_ok() && r[2].is_ok(), "{r:?}");
    let e = r[1].as_ref().expect_err("refused by its size");
    assert_eq!(e.kind, SendErrorKind::Permanent);
    assert!(e.message.contains(&limit.to_string()), "{e:?}");
    wait_until("the two neighbours in the queue", ms(5000), || {
        queue_depth(&queue) == before + 2
    });
}

/// Through the relay, with no retries: one event over the broker's limit among
/// 300 small ones in one transaction is the only dead letter; the 300 arrive.
#[test]
fn a_relay_dead_letters_only_the_event_the_broker_refused() {
    if !rabbit_up() {
        return;
    }
    let limit = broker_max_message();
    let (exchange, queue) = direct("doc");
    let p = "t_rabbit_too_big_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .max_payload_bytes(limit * 2)
        .event("doc", |e| {
            e.destination(&exchange)
                .fixed_polling(ms(20))
                .batch_size(200)
                .max_retries(0)
        })
        .dlq(|d| d.enabled(true))
        .dlq(|d| d.move_interval(ms(100)))
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let mut small = Vec::new();
    for i in 0..300 {
        if i == 150 {
            outbox.publish(&mut tx, "doc", &"x".repeat(limit)).unwrap();
        }
        small.push(outbox.publish(&mut tx, "doc", &json!({ "i": i })).unwrap());
    }
    tx.commit().unwrap();
    let relay = Relay::start(
        store.clone(),
        &config,
        RabbitSender::builder(&rabbit_url()).build().unwrap(),
    )
    .unwrap();
    let dlq = Dlq::new(store);
    wait_until(
        "the big event dead-lettered",
        Duration::from_secs(30),
        || dlq.count(&Default::default()).unwrap_or(0) >= 1,
    );
    wait_until("the 300 sent", Duration::from_secs(30), || {
        count(&mut client, p, "PROCESSED") == 300
    });
    assert_eq!(
        dlq.count(&Default::default()).unwrap(),
        1,
        "one dead letter"
    );
    let want: std::collections::HashSet<_> = small.iter().copied().collect();
    let got: std::collections::HashSet<_> = read_rabbitmq_queue(&queue, &want, |_| {})
        .into_iter()
        .collect();
    assert!(want.is_subset(&got), "all 300 arrived");
    relay.shutdown(Duration::from_secs(10)).unwrap();
}

/// A content header larger than the connection's `frame_max` is a connection
/// error at the broker (501): the sender refuses that message alone, as its
/// own permanent failure, and its neighbours are sent.
#[test]
fn a_header_too_large_for_a_frame_fails_alone() {
    use txbox::sender::SendErrorKind;
    use txbox::Sender;
    if !rabbit_up() {
        return;
    }
    let (exchange, queue) = direct("k");
    let mut big = claimed(&exchange, "k", "{}".into());
    big.headers.insert("big".into(), "x".repeat(200_000));
    let mut sender = RabbitSender::builder(&rabbit_url())
        .build()
        .unwrap()
        .create()
        .unwrap();
    let r = sender.send(&[
        claimed(&exchange, "k", "1".into()),
        big,
        claimed(&exchange, "k", "2".into()),
    ]);
    assert!(r[0].is_ok() && r[2].is_ok(), "{r:?}");
    let e = r[1].as_ref().expect_err("too large for a frame");
    assert_eq!(e.kind, SendErrorKind::Permanent, "{e:?}");
    assert!(e.message.contains("frame"), "{e:?}");
    wait_until("the two neighbours in the queue", ms(5000), || {
        queue_depth(&queue) == 2
    });
}

/// The routing keys are the RabbitMQ sender's (0.3): read from the file's
/// `[rabbitmq]` table, which `Config::from_toml` leaves to it, and checked
/// where they are read, naming the key path; a type without one is routed
/// by its name.
#[test]
fn routing_keys_are_checked_where_read() {
    let file = "[events.order-created]\ndestination = \"orders\"\n\n\
                [rabbitmq]\nurl = \"amqp://guest:guest@127.0.0.1:5672\"\n\
                confirm_timeout = \"10s\"\n\
                [rabbitmq.routing_keys]\norder-created = \"orders.created\"\n";
    let config = Config::from_toml(file).unwrap();
    assert_eq!(
        config
            .event("order-created")
            .unwrap()
            .destination
            .as_deref(),
        Some("orders")
    );
    let sender = RabbitSender::from_toml(file).unwrap();
    assert_eq!(sender.routing_key("order-created"), "orders.created");
    assert_eq!(sender.routing_key("order-paid"), "order-paid");
    assert_eq!(sender.ack_wait(), Some(Duration::from_secs(10)));
    // one key for every type without its own (0.2's `[defaults] routing_key`)
    let text = "[rabbitmq]\nurl = \"amqp://127.0.0.1\"\ndefault_routing_key = \"all\"\n";
    assert_eq!(
        RabbitSender::from_toml(text).unwrap().routing_key("x"),
        "all"
    );
    let shared = RabbitSender::builder("amqp://127.0.0.1")
        .default_routing_key("all")
        .routing_key("order-created", "orders.created")
        .build()
        .unwrap();
    assert_eq!(shared.routing_key("order-paid"), "all");
    assert_eq!(shared.routing_key("order-created"), "orders.created");
    // a routing key of a type the relay's configuration does not have (a
    // misspelt one would route nothing) is refused at start
    assert!(sender.check_event_types(&["order-created"]).is_ok());
    let err = sender
        .check_event_types(&["order-paid"])
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("rabbitmq.routing_keys.order-created names an event type the configuration does not have"),
        "{err}"
    );
    // ... by Relay::start, before any thread starts
    if let Some((store, _client)) = fresh("t_rabbit_keys_") {
        let config = Config::builder()
            .table_prefix("t_rabbit_keys_")
            .event("order-paid", |e| e)
            .build()
            .unwrap();
        let err = Relay::start(store, &config, sender)
            .err()
            .map(|e| e.to_string());
        assert!(
            err.as_deref()
                .is_some_and(|e| e.starts_with("rabbitmq.routing_keys.order-created names")),
            "{err:?}"
        );
    }

    let url = "[rabbitmq]\nurl = \"amqp://127.0.0.1\"\n";
    for (text, want) in [
        (
            format!("{url}[rabbitmq.routing_keys]\na = \"k\\u001b[31m\""),
            "rabbitmq.routing_keys.a must not contain control characters",
        ),
        (
            format!("{url}[rabbitmq.routing_keys]\na = \"{}\"", "k".repeat(256)),
            "rabbitmq.routing_keys.a must be at most 255 bytes",
        ),
        (
            format!("{url}confirm_timeout = \"soon\""),
            "rabbitmq.confirm_timeout has invalid duration \"soon\"",
        ),
        (
            format!("{url}exchange = \"x\""),
            "rabbitmq.exchange is not valid: unknown field `exchange`",
        ),
        ("[events.a]".to_owned(), "rabbitmq must be set"),
    ] {
        let err = RabbitSender::from_toml(&text).unwrap_err().to_string();
        assert!(
            err.starts_with(want),
            "{text:?}: got {err:?}, want {want:?}"
        );
    }
    // the builder checks the same
    let err = RabbitSender::builder("amqp://127.0.0.1")
        .routing_key("tab", "a\tb")
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("rabbitmq.routing_keys.tab must not contain control characters"),
        "{err}"
    );
}

/// The publisher's trace context reaches the consumer's handler through
/// RabbitMQ (feature `trace-context`).
#[cfg(feature = "trace-context")]
#[test]
fn the_trace_context_goes_from_publish_to_the_handler() {
    if !rabbit_up() {
        return;
    }
    let (exchange, queue) = direct("e");
    let sender = RabbitSender::builder(&rabbit_url()).build().unwrap();
    crate::trace_context::traced_through("t_rabbit_trace_", &exchange, sender, |h| {
        consume(&queue, h)
    });
}
