//! `txbox relay`: the relay as a process of its own, spawned from the built
//! binary against the real PostgreSQL and brokers.

use std::collections::HashSet;
use std::io::Read;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::*;
use txbox::{Config, EventId, NewEvent, Outbox, StopSignal};

/// A relay process, its output read as it comes (a full pipe would stop it).
struct Spawned {
    child: Child,
    output: Vec<std::thread::JoinHandle<String>>,
}

impl Spawned {
    /// `txbox <args>` with `env` set.
    fn start(args: &[&str], env: &[(&str, &str)]) -> Spawned {
        let mut child = Command::new(env!("CARGO_BIN_EXE_txbox"))
            .args(args)
            .env_remove("RUST_LOG")
            .env_remove("TXBOX_DATABASE_URL")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        fn drain(mut r: impl Read + Send + 'static) -> std::thread::JoinHandle<String> {
            std::thread::spawn(move || {
                let mut out = String::new();
                let _ = r.read_to_string(&mut out);
                out
            })
        }
        let output = vec![
            drain(child.stdout.take().unwrap()),
            drain(child.stderr.take().unwrap()),
        ];
        Spawned { child, output }
    }

    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([sig, &self.child.id().to_string()])
            .status()
            .unwrap()
            .success();
        assert!(ok, "kill {sig}");
    }

    /// Waits for the exit (within `wait`): its code and everything it wrote.
    fn finish(mut self, wait: Duration) -> (i32, String) {
        let output = std::mem::take(&mut self.output);
        let deadline = Instant::now() + wait;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > deadline {
                let _ = self.child.kill();
                panic!("the relay process did not exit within {wait:?}");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let out: String = output.into_iter().map(|h| h.join().unwrap()).collect();
        (status.code().unwrap_or(-1), out)
    }
}

/// A test that fails midway leaves no relay behind: it would claim the next
/// run's events of its table prefix.
impl Drop for Spawned {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Publishes `n` events of type `e` on the tables of `p`, in one
/// transaction; their ids.
fn publish(client: &mut postgres::Client, p: &str, n: usize) -> Vec<EventId> {
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap();
    let mut tx = client.transaction().unwrap();
    let ids = Outbox::new(&config)
        .unwrap()
        .publish_all(&mut tx, NewEvent::batch("e", 0..n).unwrap())
        .unwrap();
    tx.commit().unwrap();
    ids
}

/// Writes `text` to a file of its own; its path.
fn file(name: &str, text: &str) -> String {
    let path = std::env::temp_dir().join(format!("txbox-{name}-{}.toml", unique()));
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_owned()
}

/// A fresh direct exchange and a queue bound to it with the key `e`.
fn exchange() -> (String, String) {
    let u = unique();
    let (exchange, queue) = (format!("txbox-proc-ex-{u}"), format!("txbox-proc-q-{u}"));
    durable_queue(&exchange, &queue, "e");
    (exchange, queue)
}

fn rabbit_consumer(queue: &str, h: Handler) -> (StopSignal, std::thread::JoinHandle<()>) {
    let consumer = txbox::rabbitmq::RabbitConsumer::builder(&rabbit_url(), queue)
        .prefetch(200)
        .build();
    spawn_loop(move |s| consumer.run(s, h).unwrap())
}

/// The relay file of type `e` to `destination` through RabbitMQ, whose URL
/// is in the environment variable `T_RABBIT_URL`.
fn rabbit_file(p: &str, destination: &str) -> String {
    format!(
        "table_prefix = \"{p}\"\ndatabase_url = \"{}\"\n\
         [defaults.polling]\nmin = \"20ms\"\nmax = \"200ms\"\n\
         [events.e]\ndestination = \"{destination}\"\n\
         [rabbitmq]\nurl_env = \"T_RABBIT_URL\"\n\
         [relay]\nshutdown_timeout = \"20s\"\n[log]\nlevel = \"info\"\n",
        pg_url()
    )
}

/// Events published from Rust and from `psql` through the SQL function
/// (`txbox_publish`) reach RabbitMQ through the relay process, which exits
/// 0 on SIGTERM.
#[test]
fn the_relay_process_sends_what_rust_and_sql_published_and_stops_on_sigterm() {
    let p = "t_proc_rabbit_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let (ex, queue) = exchange();
    // the admin endpoint on a port free a moment ago, its token from the
    // environment
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let text = format!(
        "{}[admin]\naddr = \"127.0.0.1:{port}\"\ntoken_env = \"T_ADMIN_TOKEN\"\n",
        rabbit_file(p, &ex)
    );
    let path = file("rabbit", &text);
    let relay = Spawned::start(
        &["relay", "--config", &path, "--log-format", "json"],
        &[
            ("T_RABBIT_URL", &rabbit_url()),
            ("T_ADMIN_TOKEN", "admin-s3cret"),
        ],
    );
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap();
    let mut tx = client.transaction().unwrap();
    let from_rust = Outbox::new(&config)
        .unwrap()
        .publish(&mut tx, "e", &serde_json::json!({"from": "rust"}))
        .unwrap();
    tx.commit().unwrap();
    let psql = Command::new("psql")
        .args([
            &pg_url(),
            "-v",
            "ON_ERROR_STOP=1",
            "-qtAc",
            &format!(
                "BEGIN; SELECT {p}txbox_publish('e', '{{\"from\":  \"sql\", \"n\": 1e3}}', 'k-1', '{{\"source\": \"psql\"}}'); COMMIT;"
            ),
        ])
        .output()
        .unwrap();
    assert!(
        psql.status.success(),
        "{}",
        String::from_utf8_lossy(&psql.stderr)
    );
    let from_sql: EventId = String::from_utf8_lossy(&psql.stdout)
        .trim()
        .parse()
        .unwrap();
    let got = consume_events(2, |h| rabbit_consumer(&queue, h));
    let ids: HashSet<EventId> = got.iter().filter_map(|e| e.id).collect();
    assert_eq!(ids, HashSet::from([from_rust, from_sql]));
    let sql = got.iter().find(|e| e.id == Some(from_sql)).unwrap();
    assert_eq!(sql.event_type.as_deref(), Some("e"));
    assert_eq!(sql.key.as_deref(), Some("k-1"));
    assert_eq!(sql.headers["source"], "psql");
    // byte for byte, as given (jsonb would have made it {"n": 1000, "from": "sql"})
    assert_eq!(sql.payload, br#"{"from":  "sql", "n": 1e3}"#);
    // the process's admin endpoint: health with its relay, the metrics,
    // the token from the environment on the pause routes
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let base = format!("http://127.0.0.1:{port}");
    let mut health = agent.get(format!("{base}/health")).call().unwrap();
    let body = health.body_mut().read_to_string().unwrap();
    assert_eq!(health.status().as_u16(), 200, "{body}");
    assert!(
        body.contains("\"running\":7"),
        "the relay's threads: {body}"
    );
    let mut metrics = agent.get(format!("{base}/metrics")).call().unwrap();
    assert!(metrics
        .body_mut()
        .read_to_string()
        .unwrap()
        .contains("txbox_events_sent_total"));
    let paused = |token: &str| {
        agent
            .get(format!("{base}/types/paused"))
            .header("Authorization", format!("Bearer {token}"))
            .call()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!((paused("admin-s3cret"), paused("wrong")), (200, 401));
    // a UUIDv7 made by the database: time-ordered, version 7
    assert_eq!(from_sql.as_uuid().get_version_num(), 7);
    assert_eq!(from_sql.as_uuid().get_variant(), uuid::Variant::RFC4122);
    // it refuses what publish refuses
    let refused = Command::new("psql")
        .args([
            &pg_url(),
            "-v",
            "ON_ERROR_STOP=1",
            "-qtAc",
            &format!("SELECT {p}txbox_publish('e', '1', NULL, '{{\"n\": 5}}')"),
        ])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr)
        .contains("headers must be a JSON object of strings"));
    relay.signal("-TERM");
    let (code, out) = relay.finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with('{') && l.contains("\"level\":\"INFO\"")),
        "JSON log lines: {out}"
    );
}

/// SIGTERM during a burst of 10,000: the process exits 0, every event it
/// sent was acked and marked, the rest wait as PENDING, none IN_PROCESS.
#[test]
fn sigterm_during_a_burst_loses_nothing_and_leaves_nothing_in_process() {
    let p = "t_proc_burst_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let (ex, queue) = exchange();
    for _ in 0..10 {
        publish(&mut client, p, 1000);
    }
    let path = file("burst", &rabbit_file(p, &ex));
    let relay = Spawned::start(
        &["relay", "--config", &path],
        &[("T_RABBIT_URL", &rabbit_url())],
    );
    wait_until("the burst under way", Duration::from_secs(60), || {
        count(&mut client, p, "PROCESSED") >= 100
    });
    relay.signal("-TERM");
    let (code, out) = relay.finish(Duration::from_secs(60));
    assert_eq!(code, 0, "{out}");
    assert_eq!(count(&mut client, p, "IN_PROCESS"), 0, "{out}");
    let processed = count(&mut client, p, "PROCESSED");
    let pending = count(&mut client, p, "PENDING");
    assert_eq!(processed + pending, 10_000, "every event sent or waiting");
    assert!(
        pending > 0,
        "the signal came after the burst ({processed} sent)"
    );
    // each one marked sent is at the broker
    let got = consume_events(processed as usize, |h| rabbit_consumer(&queue, h));
    let at_broker: HashSet<EventId> = got.iter().filter_map(|e| e.id).collect();
    let marked: HashSet<EventId> = client
        .query(
            &format!("SELECT id FROM {p}outbox_events WHERE status = 'PROCESSED'"),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| EventId::from_uuid(r.get(0)))
        .collect();
    assert!(
        marked.is_subset(&at_broker),
        "a PROCESSED event never reached RabbitMQ"
    );
}

/// Through Kafka too, and `--once` delivers what is due and exits 0.
#[test]
fn the_relay_process_sends_to_kafka_and_once_exits_when_done() {
    let p = "t_proc_kafka_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    if !service_up("Kafka", &kafka_brokers()) {
        return;
    }
    let topic = format!("txbox-proc-{}", unique());
    create_topic(&topic, 1);
    let text = format!(
        "table_prefix = \"{p}\"\n[events.e]\ndestination = \"{topic}\"\n\
         [kafka]\n\"bootstrap.servers\" = \"{}\"\n",
        kafka_brokers()
    );
    let path = file("kafka", &text);
    let ids = publish(&mut client, p, 5);
    let once = Spawned::start(
        &["relay", "--config", &path, "--once"],
        &[("TXBOX_DATABASE_URL", &pg_url())],
    );
    let (code, out) = once.finish(Duration::from_secs(60));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("e: sent 5, retried 0, failed 0, released 0"),
        "{out}"
    );
    assert_eq!(count(&mut client, p, "PROCESSED"), 5);
    let got = consume_events(5, |h| {
        let consumer =
            txbox::kafka::KafkaConsumer::builder(&kafka_brokers(), &format!("g-{topic}"))
                .build()
                .unwrap();
        let parts = consumer
            .partitions(&topic, Duration::from_secs(10))
            .unwrap();
        consumer.assign(&topic, &parts).unwrap();
        spawn_loop(move |s| consumer.run(s, h).unwrap())
    });
    let at_broker: HashSet<EventId> = got.iter().filter_map(|e| e.id).collect();
    assert_eq!(at_broker, ids.into_iter().collect());
}

/// `--once` exits non-zero when some event was not sent (unroutable:
/// RabbitMQ returned it), saying how many.
#[test]
fn once_exits_non_zero_when_some_event_was_not_sent() {
    let p = "t_proc_once_fail_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    publish(&mut client, p, 3);
    // an exchange no queue is bound to: every message comes back
    let path = file("unroutable", &rabbit_file(p, "amq.direct"));
    let once = Spawned::start(
        &["relay", "--config", &path, "--once"],
        &[("T_RABBIT_URL", &rabbit_url())],
    );
    let (code, out) = once.finish(Duration::from_secs(60));
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("3 events were not sent"), "{out}");
    assert_eq!(count(&mut client, p, "PENDING"), 3, "they wait");
}

/// A bad file: exit 2 with the key path (`relay` and `check` alike); a
/// secret the file names is never in the output, whatever fails; `check`
/// prints the effective settings with the defaults merged.
#[test]
fn a_bad_file_exits_2_with_the_key_path_and_no_secret_is_ever_printed() {
    let secret = "TopSecret-7f3a";
    let url = format!("amqp://guest:{secret}@127.0.0.1:5672");
    let env = [
        ("T_RABBIT_URL", url.as_str()),
        ("TXBOX_DATABASE_URL", "postgres://x"),
    ];
    for (text, want) in [
        (
            "[events.e.polling]\nmultiplier = 0.5\n[rabbitmq]\nurl_env = \"T_RABBIT_URL\"\n",
            "events.e.polling.multiplier must be between 1.0 and 100",
        ),
        (
            "[events.e]\n[rabbitmq]\nurl_env = \"T_RABBIT_URL\"\n[relay]\nshutdown_timeout = \"soon\"\n",
            "relay.shutdown_timeout has invalid duration",
        ),
        (
            "[events.e]\n[rabbitmq]\nurl_env = \"T_NOT_SET\"\n",
            "rabbitmq.url_env names the environment variable \"T_NOT_SET\", which is not set",
        ),
        ("[events.e]\n", "no broker"),
        (
            "[events.e]\n[rabbitmq]\nurl_env = \"T_RABBIT_URL\"\n[admin]\nport = 1\n",
            "admin.port unknown field `port`",
        ),
    ] {
        let path = file("bad", text);
        for command in ["relay", "check"] {
            let (code, out) = Spawned::start(&[command, "--config", &path], &env)
                .finish(Duration::from_secs(30));
            assert_eq!(code, 2, "{command} {text:?}: {out}");
            assert!(out.contains(want), "{command} {text:?}: {out}");
            assert!(!out.contains(secret), "the secret in the output: {out}");
        }
    }
    // a good file: `check` prints each type's settings, the defaults merged
    let path = file(
        "good",
        "[defaults]\nmax_retries = 7\n[events.e]\nbatch_size = 50\n\
         [rabbitmq]\nurl_env = \"T_RABBIT_URL\"\n",
    );
    let (code, out) =
        Spawned::start(&["check", "--config", &path], &env).finish(Duration::from_secs(30));
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("[events.e]") && out.contains("batch_size = 50"),
        "{out}"
    );
    assert!(
        out.contains("max_retries = 7") && out.contains("broker rabbitmq"),
        "{out}"
    );
    assert!(!out.contains(secret), "{out}");
    // the relay connects with the secret (refused: a wrong password) and
    // logs the failure at debug without it
    if service_up("RabbitMQ", "127.0.0.1:5672") {
        let p = "t_proc_secret_";
        if fresh(p).is_none() {
            return;
        }
        let text = format!(
            "table_prefix = \"{p}\"\ndatabase_url = \"{}\"\n[events.e]\n\
             [rabbitmq]\nurl_env = \"T_RABBIT_URL\"\n[log]\nlevel = \"debug\"\n",
            pg_url()
        );
        let path = file("secret", &text);
        publish(&mut client().unwrap(), p, 1);
        let (code, out) = Spawned::start(&["relay", "--config", &path, "--once"], &env)
            .finish(Duration::from_secs(60));
        assert_eq!(code, 1, "{out}");
        assert!(!out.contains(secret), "the secret in the output: {out}");
    }
}

/// A broker that accepts connections and never answers: a relay thread
/// that connects to it stays busy until its connect times out (10 s).
fn silent_broker() -> (String, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("amqp://guest:guest@{}", listener.local_addr().unwrap());
    listener.set_nonblocking(true).unwrap();
    let accepted = std::sync::Arc::new(AtomicUsize::new(0));
    let seen = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            if let Ok((s, _)) = listener.accept() {
                held.push(s);
                seen.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    });
    (url, accepted)
}

/// A relay whose thread is stuck at the shutdown deadline exits 1 saying how
/// many threads were busy; a second signal exits at once (130).
#[test]
fn a_missed_deadline_exits_1_and_a_second_signal_exits_at_once() {
    for (p, second) in [("t_proc_deadline_", false), ("t_proc_twice_", true)] {
        let Some((_store, mut client)) = fresh(p) else {
            return;
        };
        publish(&mut client, p, 1);
        let (url, accepted) = silent_broker();
        let timeout = if second { "30s" } else { "1s" };
        let text = format!(
            "table_prefix = \"{p}\"\ndatabase_url = \"{}\"\n[events.e]\n\
             [rabbitmq]\nurl_env = \"T_RABBIT_URL\"\n[relay]\nshutdown_timeout = \"{timeout}\"\n",
            pg_url()
        );
        let path = file("deadline", &text);
        let relay = Spawned::start(&["relay", "--config", &path], &[("T_RABBIT_URL", &url)]);
        // its poller connects to the silent broker, and waits there
        wait_until(
            "a connection to the silent broker",
            Duration::from_secs(20),
            || accepted.load(std::sync::atomic::Ordering::Relaxed) > 0,
        );
        let stopping = Instant::now();
        relay.signal("-TERM");
        if second {
            std::thread::sleep(Duration::from_millis(500));
            relay.signal("-INT");
        }
        let (code, out) = relay.finish(Duration::from_secs(30));
        if second {
            assert_eq!(code, 130, "{out}");
            assert!(
                stopping.elapsed() < Duration::from_secs(5),
                "{:?}",
                stopping.elapsed()
            );
        } else {
            assert_eq!(code, 1, "{out}");
            assert!(out.contains("1 relay threads still busy"), "{out}");
            // never sent: pending (released at the deadline if it was claimed)
            assert_eq!(count(&mut client, p, "PENDING"), 1, "{out}");
        }
    }
}
