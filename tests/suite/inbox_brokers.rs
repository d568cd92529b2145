//! The inbox wired to the real consumer loops: a duplicate re-sent raw to the broker
//! is handled once; a message without an event id follows the policy.
#![cfg(all(feature = "kafka", feature = "rabbitmq"))]

use std::time::Duration;

use crate::common::*;
use txbox::{Config, Error, Outbox, Relay, Sender};
use txbox::{Inbox, MissingIdPolicy};

/// Rows of the test's `handled` table, and how many distinct ids they hold.
fn handled(client: &mut postgres::Client, prefix: &str) -> (i64, i64) {
    let r = client
        .query_one(
            &format!("SELECT count(*), count(DISTINCT id) FROM {prefix}handled"),
            &[],
        )
        .unwrap();
    (r.get(0), r.get(1))
}

fn setup(
    prefix: &str,
    destination: &str,
) -> Option<(std::sync::Arc<txbox::PgStore>, postgres::Client, Config)> {
    let (store, mut client) = fresh(prefix)?;
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {prefix}handled; CREATE TABLE {prefix}handled (id uuid)"
        ))
        .unwrap();
    let config = Config::builder()
        .table_prefix(prefix)
        .defaults(|e| e.adaptive_polling(ms(20), ms(200), 1.5))
        .event("paid", |e| e.destination(destination))
        .build()
        .unwrap();
    Some((store, client, config))
}

#[test]
fn kafka_a_duplicate_resent_raw_is_handled_once() {
    use txbox::kafka::{KafkaConsumer, KafkaSender};
    if !service_up("Kafka", &kafka_brokers()) {
        return;
    }
    let topic = format!("txbox-inbox-{}", unique());
    create_topic(&topic, 1);
    let p = "t_inbox_kafka_";
    let Some((store, mut client, config)) = setup(p, &topic) else {
        return;
    };
    let outbox = Outbox::new(&config).unwrap();
    let sender = KafkaSender::builder(&kafka_brokers()).build().unwrap();
    let relay = Relay::start(store.clone(), &config, sender.clone()).unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("paid", 0..20).unwrap())
        .unwrap();
    tx.commit().unwrap();
    wait_until("20 sent", Duration::from_secs(30), || {
        count(&mut client, p, "PROCESSED") == 20
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();

    // the broker gets event 7 once more, raw, with the same id
    let mut raw = sender.clone();
    let dup = txbox::Event {
        id: ids[7],
        event_type: "paid".into(),
        destination: topic.clone(),
        key: None,
        headers: Default::default(),
        payload: b"7".to_vec(),
        content_type: None,
        attempts: 0,
    };
    assert!(raw.send(&[dup])[0].is_ok());

    let inbox = Inbox::new(&config, "payments").unwrap();
    let insert = format!("INSERT INTO {p}handled (id) VALUES ($1)");
    let handler = inbox.handler_pg(
        store.pool().clone(),
        MissingIdPolicy::Reject,
        move |tx, e| {
            tx.execute(&insert, &[&e.event_id()?.as_uuid()])
                .map_err(Error::from)?;
            Ok::<_, Error>(())
        },
    );
    let consumer = KafkaConsumer::builder(&kafka_brokers(), &format!("g-{topic}"))
        .build()
        .unwrap();
    consumer.assign(&topic, &[0]).unwrap();
    let (stop, h) = spawn_loop(move |s| consumer.run_with(s, handler));
    wait_until(
        "21 messages seen, one a duplicate",
        Duration::from_secs(30),
        || inbox.stats().duplicates == 1 && handled(&mut client, p).0 == 20,
    );
    stop.stop();
    h.join().unwrap().unwrap();
    assert_eq!(
        handled(&mut client, p),
        (20, 20),
        "each event handled exactly once"
    );
    assert_eq!(inbox.stats().consumed, 20);
}

#[test]
fn rabbitmq_duplicate_handled_once_and_a_message_without_id_is_rejected_to_the_dlx() {
    use amiquip::{
        AmqpProperties, AmqpValue, Connection, ExchangeDeclareOptions, ExchangeType, FieldTable,
        Publish, QueueDeclareOptions,
    };
    use txbox::rabbitmq::{RabbitConsumer, RabbitSender};
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let u = unique();
    let (exchange, queue, dlx, dead) = (
        format!("txbox-ix-{u}"),
        format!("txbox-iq-{u}"),
        format!("txbox-idlx-{u}"),
        format!("txbox-idq-{u}"),
    );
    let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    ch.exchange_declare(
        ExchangeType::Direct,
        &exchange,
        ExchangeDeclareOptions::default(),
    )
    .unwrap();
    ch.exchange_declare(
        ExchangeType::Fanout,
        &dlx,
        ExchangeDeclareOptions::default(),
    )
    .unwrap();
    let mut args = FieldTable::new();
    args.insert(
        "x-dead-letter-exchange".into(),
        AmqpValue::LongString(dlx.clone()),
    );
    ch.queue_declare(
        &queue,
        QueueDeclareOptions {
            arguments: args,
            ..Default::default()
        },
    )
    .unwrap();
    ch.queue_declare(&dead, QueueDeclareOptions::default())
        .unwrap();
    ch.queue_bind(&queue, &exchange, "paid", FieldTable::new())
        .unwrap();
    ch.queue_bind(&dead, &dlx, "", FieldTable::new()).unwrap();

    let p = "t_inbox_rabbit_";
    let Some((store, mut client, config)) = setup(p, &exchange) else {
        return;
    };
    let outbox = Outbox::new(&config).unwrap();
    let relay = Relay::start(
        store.clone(),
        &config,
        RabbitSender::builder(&rabbit_url()).build().unwrap(),
    )
    .unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("paid", 0..20).unwrap())
        .unwrap();
    tx.commit().unwrap();
    wait_until("20 sent", Duration::from_secs(30), || {
        count(&mut client, p, "PROCESSED") == 20
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();

    // raw: a duplicate of event 3 (same message_id and header), and a message with no id
    let mut headers = FieldTable::new();
    headers.insert(
        txbox::HEADER_EVENT_ID.into(),
        AmqpValue::LongString(ids[3].to_string()),
    );
    let props = AmqpProperties::default()
        .with_message_id(ids[3].to_string())
        .with_headers(headers);
    ch.basic_publish(
        exchange.clone(),
        Publish::with_properties(b"3", "paid", props),
    )
    .unwrap();
    ch.basic_publish(exchange.clone(), Publish::new(b"who am I?", "paid"))
        .unwrap();

    let inbox = Inbox::new(&config, "payments").unwrap();
    let insert = format!("INSERT INTO {p}handled (id) VALUES ($1)");
    let handler = inbox.handler_pg(
        store.pool().clone(),
        MissingIdPolicy::default(),
        move |tx, e| {
            tx.execute(&insert, &[&e.event_id()?.as_uuid()])
                .map_err(Error::from)?;
            Ok::<_, Error>(())
        },
    );
    let consumer = RabbitConsumer::builder(&rabbit_url(), &queue).build();
    let (stop, h) = spawn_loop(move |s| consumer.run_with(s, handler));
    let dead_letter = std::cell::RefCell::new(None);
    wait_until(
        "20 handled, 1 duplicate, 1 dead-lettered",
        Duration::from_secs(30),
        || {
            if dead_letter.borrow().is_none() {
                *dead_letter.borrow_mut() = ch.basic_get(dead.clone(), true).unwrap();
            }
            inbox.stats().duplicates == 1
                && handled(&mut client, p).0 == 20
                && dead_letter.borrow().is_some()
        },
    );
    stop.stop();
    h.join().unwrap().unwrap();
    assert_eq!(handled(&mut client, p), (20, 20));
    assert_eq!(
        dead_letter.into_inner().unwrap().delivery.body,
        b"who am I?"
    );
    for q in [&queue, &dead] {
        let _ = ch.queue_delete(q.clone(), Default::default());
    }
    for x in [&exchange, &dlx] {
        let _ = ch.exchange_delete(x.clone(), false);
    }
}
