//! The web-service example driven over HTTP, as its clients would: orders placed
//! with `POST /orders` reach the real broker (RabbitMQ, then Kafka), a bad order
//! stores nothing and publishes nothing, `GET /orders/{id}` shows an order.
#![cfg(all(feature = "postgres", feature = "kafka", feature = "rabbitmq"))]

mod common;

#[allow(dead_code)] // the example's `main` and `run` are not called here
#[path = "../examples/web_service.rs"]
mod web_service;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use web_service::{Broker, DESTINATION};

fn agent() -> ureq::Agent {
    ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into()
}

/// Places three orders and a bad one over HTTP; returns the three event ids.
fn place_orders(base: &str) -> Vec<String> {
    let agent = agent();
    let mut events = Vec::new();
    for (item, quantity) in [("book", 1), ("pen", 3), ("lamp", 2)] {
        let mut r = agent
            .post(format!("{base}/orders"))
            .send(format!(r#"{{"item": "{item}", "quantity": {quantity}}}"#))
            .unwrap();
        assert_eq!(r.status(), 201);
        let v: serde_json::Value = r.body_mut().read_json().unwrap();
        let id = v["id"].as_i64().unwrap();
        let event = v["event_id"].as_str().unwrap().to_string();
        let mut shown = agent.get(format!("{base}/orders/{id}")).call().unwrap();
        assert_eq!(shown.status(), 200);
        let s: serde_json::Value = shown.body_mut().read_json().unwrap();
        assert_eq!(
            (
                s["item"].as_str(),
                s["quantity"].as_i64(),
                s["event_id"].as_str()
            ),
            (Some(item), Some(quantity), Some(event.as_str()))
        );
        events.push(event);
    }
    let bad = agent
        .post(format!("{base}/orders"))
        .send(r#"{"item": "", "quantity": 0}"#)
        .unwrap();
    assert_eq!(bad.status(), 400);
    let missing = agent
        .get(format!("{base}/orders/999999999"))
        .call()
        .unwrap();
    assert_eq!(missing.status(), 404);
    events
}

fn rabbitmq_events(want: &HashSet<String>) -> HashSet<String> {
    let mut conn = amiquip::Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    let q = ch.queue_declare_passive(DESTINATION).unwrap();
    let mut got = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !want.is_subset(&got) && Instant::now() < deadline {
        match q.get(true).unwrap() {
            Some(m) => {
                got.extend(m.delivery.properties.message_id().clone());
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    conn.close().unwrap();
    got
}

fn kafka_events(want: &HashSet<String>) -> HashSet<String> {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::message::{Headers, Message};
    let consumer: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", format!("web-{}", unique()))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut partitions = rdkafka::TopicPartitionList::new();
    partitions
        .add_partition_offset(DESTINATION, 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&partitions).unwrap();
    let mut got = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !want.is_subset(&got) && Instant::now() < deadline {
        if let Some(Ok(m)) = consumer.poll(Duration::from_millis(200)) {
            if let Some(id) = m.headers().and_then(|h| {
                h.iter()
                    .find(|h| h.key == txbox::HEADER_EVENT_ID)
                    .and_then(|h| Some(String::from_utf8_lossy(h.value?).into_owned()))
            }) {
                got.insert(id);
            }
        }
    }
    got
}

/// One service at a time: both would relay the same outbox table.
#[test]
fn orders_placed_over_http_reach_each_broker() {
    if client().is_none()
        || !service_up("RabbitMQ", "127.0.0.1:5672")
        || !service_up("Kafka", &kafka_brokers())
    {
        return;
    }
    for broker in [Broker::RabbitMq, Broker::Kafka] {
        let service = web_service::start(&pg_url(), broker, "127.0.0.1:0").unwrap();
        let base = format!("http://{}", service.addr);
        let mut c = client().unwrap();
        // orders are never cleaned up (the outbox's sent rows are)
        let orders = |c: &mut postgres::Client| -> i64 {
            c.query_one("SELECT count(*) FROM web_orders", &[])
                .unwrap()
                .get(0)
        };
        let before = orders(&mut c);
        let events: HashSet<String> = place_orders(&base).into_iter().collect();
        assert_eq!(
            orders(&mut c) - before,
            3,
            "{broker:?}: three orders, none for the bad one"
        );
        let got = match broker {
            Broker::RabbitMq => rabbitmq_events(&events),
            Broker::Kafka => kafka_events(&events),
        };
        assert!(
            events.is_subset(&got),
            "{broker:?}: missing at the broker: {:?}",
            events.difference(&got).collect::<Vec<_>>()
        );
        service.stop().unwrap();
    }
}
