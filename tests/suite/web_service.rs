//! The web-service example driven over HTTP, as its clients would: orders placed
//! with `POST /orders` reach the real broker (RabbitMQ, then Kafka), a bad order
//! stores nothing and publishes nothing, `GET /orders/{id}` shows an order.
#![cfg(all(feature = "postgres", feature = "kafka", feature = "rabbitmq"))]

#[allow(dead_code)] // the example's `main` and `run` are not called here
#[path = "../../examples/web_service.rs"]
mod example;

use std::collections::HashSet;
use std::time::Duration;

use crate::common::*;
use example::{Broker, DESTINATION};

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
        let service = example::start(&pg_url(), broker, "127.0.0.1:0").unwrap();
        let base = format!("http://{}", service.addr);
        let mut c = client().unwrap();
        // orders are never cleaned up (the outbox's sent rows are)
        let orders = |c: &mut postgres::Client| -> i64 {
            c.query_one("SELECT count(*) FROM web_orders", &[])
                .unwrap()
                .get(0)
        };
        let before = orders(&mut c);
        let events: HashSet<txbox::EventId> = place_orders(&base)
            .iter()
            .map(|id| id.parse().unwrap())
            .collect();
        assert_eq!(
            orders(&mut c) - before,
            3,
            "{broker:?}: three orders, none for the bad one"
        );
        // the queue and the topic are the example's own, kept between runs:
        // what earlier runs left there is read too
        let got: HashSet<txbox::EventId> = match broker {
            Broker::RabbitMq => read_rabbitmq_queue(DESTINATION, &events, |_| {}),
            Broker::Kafka => {
                let consumer = kafka_reader(DESTINATION, 1);
                read_all(&events, || {
                    match consumer.poll(Duration::from_millis(200)) {
                        Some(Ok(m)) => kafka_event_id(&m),
                        _ => None,
                    }
                })
            }
        }
        .into_iter()
        .collect();
        assert!(
            events.is_subset(&got),
            "{broker:?}: missing at the broker: {:?}",
            events.difference(&got).collect::<Vec<_>>()
        );
        service.stop().unwrap();
    }
}
