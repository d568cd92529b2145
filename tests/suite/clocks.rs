//! Order and time come from the database, not from the publishers' clocks: a
//! publisher process runs under libfaketime with its clock off by seconds (as a
//! replica on a host with a skewed clock), and
//! - a key's events, published in turns by it and by a process with the right
//!   time, reach the broker (RabbitMQ) in the order they were published;
//! - `Relay::deliver_pending` sends the events that publisher committed before
//!   the call, though their ids (UUIDv7, from its clock) lie in the future.
//!
//! The publisher is this test binary run again (`skewed_publisher_process`, an
//! ignored test run only as that child, under `faketime`).
#![cfg(feature = "rabbitmq")]

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Duration;

use crate::common::*;
use txbox::{Config, EventOrder, MemorySender, NewEvent, Outbox, Relay};

/// The event type of these tests, ordered by key.
const TYPE: &str = "account-changed";

fn config(prefix: &str, destination: &str) -> Config {
    Config::builder()
        .table_prefix(prefix)
        .event(TYPE, |e| {
            e.destination(destination)
                .ordering(EventOrder::Key)
                .batch_size(10)
                .fixed_polling(Duration::from_millis(20))
        })
        .build()
        .unwrap()
}

/// Publishes one event of key `key` with payload `n` in a transaction of its own.
fn publish(client: &mut postgres::Client, outbox: &Outbox, key: &str, n: u64) {
    let mut tx = client.transaction().unwrap();
    let e = NewEvent::new(TYPE, &n).unwrap().key(key);
    outbox.publish_all(&mut tx, [e]).unwrap();
    tx.commit().unwrap();
}

/// The publisher child: reads `key n` lines and publishes each (committed)
/// before it answers `ok`.
#[test]
#[ignore = "the skewed-clock publisher child of the clock tests"]
fn skewed_publisher_process() {
    let Ok(prefix) = std::env::var("TXBOX_CLOCK_PREFIX") else {
        return; // only as a child process
    };
    let config = config(&prefix, "unused");
    let outbox = Outbox::new(&config).unwrap();
    let mut client = postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap();
    let stdout = std::io::stdout();
    for line in std::io::stdin().lock().lines() {
        let line = line.unwrap();
        let (key, n) = line.split_once(' ').unwrap();
        publish(&mut client, &outbox, key, n.parse().unwrap());
        writeln!(stdout.lock(), "ok").unwrap();
    }
}

/// A publisher process whose clock is `offset` off (faketime's `-f`, e.g.
/// "-2s"), and the pipes to give it work.
struct Skewed {
    child: Child,
    input: ChildStdin,
    output: BufReader<ChildStdout>,
}

impl Skewed {
    /// `None` (printed) when faketime is missing outside CI.
    fn start(prefix: &str, offset: &str) -> Option<Skewed> {
        if Command::new("faketime").arg("--version").output().is_err() {
            assert!(
                std::env::var("CI").is_err(),
                "faketime is missing (.ci/services.sh installs it)"
            );
            eprintln!("SKIPPED: faketime is not installed");
            return None;
        }
        let mut child = Command::new("faketime")
            .args(["-f", offset])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                &crate::common::test_name(module_path!(), "skewed_publisher_process"),
            ])
            .args(["--ignored"])
            .args(["--nocapture", "--test-threads", "1", "--quiet"])
            .env("TXBOX_CLOCK_PREFIX", prefix)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            // killed at the end: what its harness says then is noise
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let input = child.stdin.take().unwrap();
        let output = BufReader::new(child.stdout.take().unwrap());
        Some(Skewed {
            child,
            input,
            output,
        })
    }

    /// Has it publish event `n` of `key`, and waits until it committed.
    fn publish(&mut self, key: &str, n: u64) {
        writeln!(self.input, "{key} {n}").unwrap();
        let mut line = String::new();
        loop {
            line.clear();
            assert!(
                self.output.read_line(&mut line).unwrap() > 0,
                "the publisher child ended"
            );
            // the test harness prints its own lines too
            if line.trim() == "ok" {
                return;
            }
        }
    }
}

impl Drop for Skewed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Two publishers take turns on one key, one of them with its clock two
/// seconds behind: the broker receives the key's events in publish order.
#[test]
fn a_keys_events_arrive_in_publish_order_whatever_the_publishers_clocks() {
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let p = "t_clock_order_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let Some(mut behind) = Skewed::start(p, "-2s") else {
        return;
    };
    let u = unique();
    let (exchange, queue) = (format!("txbox-clock-{u}"), format!("txbox-clock-{u}"));
    durable_queue(&exchange, &queue, TYPE);
    let config = config(p, &exchange);
    let outbox = Outbox::new(&config).unwrap();
    let n = 200;
    let mut ids = std::collections::HashSet::new();
    for i in 1..=n {
        if i % 2 == 1 {
            publish(&mut client, &outbox, "account-7", i);
        } else {
            behind.publish("account-7", i);
        }
    }
    let rows = client
        .query(&format!("SELECT id FROM {p}outbox_events"), &[])
        .unwrap();
    ids.extend(rows.iter().map(|r| txbox::EventId::from_uuid(r.get(0))));
    assert_eq!(ids.len(), n as usize);

    let relay = Relay::start(
        store,
        &config,
        txbox::rabbitmq::RabbitSender::builder(&rabbit_url())
            .build()
            .unwrap(),
    )
    .unwrap();
    let mut payloads = Vec::new();
    let received = read_rabbitmq_queue(&queue, &ids, |body| {
        payloads.push(String::from_utf8_lossy(body).parse::<u64>().unwrap());
    });
    relay.shutdown(Duration::from_secs(40)).unwrap();
    assert_eq!(received.len(), n as usize, "each once");
    // events that arrived after a later one of the key
    let mut latest = 0;
    let out_of_order = payloads
        .iter()
        .filter(|&&n| {
            let late = n < latest;
            latest = latest.max(n);
            late
        })
        .count();
    assert_eq!(
        payloads,
        (1..=n).collect::<Vec<_>>(),
        "{out_of_order} events arrived after a later one"
    );
}

/// `deliver_pending` sends what a publisher whose clock runs ahead committed
/// before the call (ids in the future), and then returns.
#[test]
fn deliver_pending_sends_what_a_fast_clock_committed_before_it() {
    let p = "t_clock_deliver_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let Some(mut ahead) = Skewed::start(p, "+30s") else {
        return;
    };
    let config = config(p, "accounts");
    for i in 0..50 {
        ahead.publish(&format!("account-{i}"), i);
    }
    let sender = MemorySender::new();
    let report = Relay::deliver_pending(store.as_ref(), &config, &mut sender.clone()).unwrap();
    assert_eq!(report.sent(), 50, "{report:?}");
    assert_eq!(sender.sent().len(), 50);
}
