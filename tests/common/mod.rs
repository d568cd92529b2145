//! Shared helpers of the integration tests: real PostgreSQL, one table prefix per test.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use txbox::PgStore;

/// `n` milliseconds.
pub fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A configuration on prefix `p` whose event `types` sleep in a long polling
/// delay (adaptive from `min` to twice that), each woken as given: only a
/// wake-up sends their events in time.
pub fn sleepy(p: &str, min: Duration, types: &[(&str, txbox::Wake)]) -> txbox::Config {
    let mut b = txbox::Config::builder()
        .table_prefix(p)
        .defaults(|e| e.adaptive_polling(min, min * 2, 1.5));
    for (t, wake) in types {
        let wake = *wake;
        b = b.event(*t, move |e| e.wake(wake));
    }
    b.build().unwrap()
}

/// The test database; override with `TXBOX_PG_URL`.
pub fn pg_url() -> String {
    std::env::var("TXBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// The test database's URL with its connections named `app`, to find them in
/// `pg_stat_activity`.
pub fn pg_url_as(app: &str) -> String {
    let url = pg_url();
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}application_name={app}")
}

/// Terminates every backend connected as `app`; returns how many were listed.
pub fn kill_backends(c: &mut postgres::Client, app: &str) -> i64 {
    c.query_one(
        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE application_name = $1",
        &[&app],
    )
    .expect("terminate backends")
    .get(0)
}

/// A plain client, or `None` (with the reason printed) when PostgreSQL is not
/// reachable outside CI. In CI (`CI=true`) a missing database fails the test.
pub fn client() -> Option<postgres::Client> {
    let _ = env_logger::builder().is_test(true).try_init();
    match postgres::Client::connect(&pg_url(), postgres::NoTls) {
        Ok(c) => Some(c),
        Err(e) => {
            if in_ci() {
                panic!("PostgreSQL at {} is required in CI: {e}", pg_url());
            }
            eprintln!("SKIPPED: PostgreSQL at {} is not reachable: {e}", pg_url());
            None
        }
    }
}

/// Drops the tables of `prefix` and migrates them anew; returns the store and a client.
pub fn fresh(prefix: &str) -> Option<(Arc<PgStore>, postgres::Client)> {
    fresh_with_url(prefix, &pg_url())
}

/// Like [`fresh`] with the store connected to `url`.
pub fn fresh_with_url(prefix: &str, url: &str) -> Option<(Arc<PgStore>, postgres::Client)> {
    let mut client = client()?;
    for t in backend::TABLES.iter().chain(&["outbox_quiet_types"]) {
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {prefix}{t}"))
            .expect("drop table");
    }
    let store = Arc::new(PgStore::connect(url, &prefix_config(prefix)).expect("connect store"));
    store.migrate().expect("migrate");
    Some((store, client))
}

/// The backend of a relay's listener on the outbox of `p`, if one listens: its
/// last statement is the `LISTEN`, or one of the advisory-lock checks it makes
/// after it (which name the table).
pub fn listener_pid(client: &mut postgres::Client, p: &str) -> Option<i32> {
    let listening = format!("LISTEN {p}outbox_events");
    let table = format!("{p}outbox_events");
    client
        .query_opt(
            "SELECT pid FROM pg_stat_activity WHERE query = $1 \
             OR (query LIKE '%advisory%' AND strpos(query, $2) > 0) LIMIT 1",
            &[&listening, &table],
        )
        .expect("pg_stat_activity")
        .map(|r| r.get(0))
}

/// Waits until a backend `LISTEN`s on the outbox of `p` (a relay's listener).
pub fn wait_for_listener(client: &mut postgres::Client, p: &str) {
    wait_until("the listener listens", Duration::from_secs(10), || {
        listener_pid(client, p).is_some()
    });
}

/// Waits until the relay on the outbox of `p` listens and has sent two events
/// of `event_type`, each committed (here, through `config`, on `client`) after
/// the one before was sent, and returns their ids. The relay's claims at start
/// (its first poll, the wake-up of every poller once it listens, and the one
/// after the listener's first answer, a few milliseconds later) are behind it
/// by the second one: an event it sends in time after this was sent because a
/// commit woke it, not because a first poll found it. If the wake-up on commit
/// does not work, this fails (the second waits for a poll).
pub fn relay_woken_by_commits(
    client: &mut postgres::Client,
    p: &str,
    config: &txbox::Config,
    sender: &txbox::MemorySender,
    event_type: &str,
) -> [txbox::EventId; 2] {
    wait_for_listener(client, p);
    let outbox = txbox::Outbox::new(config).expect("outbox");
    let mut sent_on_commit = |n: usize| {
        let mut tx = client.transaction().expect("begin");
        let id = outbox.publish(&mut tx, event_type, &n).expect("publish");
        tx.commit().expect("commit");
        wait_until("the relay sends on commit", Duration::from_secs(10), || {
            sender.sent().iter().any(|e| e.id == id)
        });
        id
    };
    [sent_on_commit(1), sent_on_commit(2)]
}

/// A client of the test's own that `LISTEN`s on the outbox of `p`.
pub fn listening(p: &str) -> postgres::Client {
    let mut c = client().expect("PostgreSQL");
    c.batch_execute(&format!("LISTEN {p}outbox_events"))
        .expect("LISTEN");
    c
}

/// The notifications (their payloads: event types) `c` receives within `wait`.
pub fn heard(c: &mut postgres::Client, wait: Duration) -> Vec<String> {
    use postgres::fallible_iterator::FallibleIterator;
    let mut got = Vec::new();
    let mut n = c.notifications();
    let mut it = n.timeout_iter(wait);
    while let Some(n) = it.next().expect("notifications") {
        got.push(n.payload().to_string());
    }
    got
}

/// Waits until `cond` holds, polling every 20 ms; panics with `what` after `timeout`.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for {what}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Rows of the outbox by status.
pub fn count(client: &mut postgres::Client, prefix: &str, status: &str) -> i64 {
    client
        .query_one(
            &format!("SELECT count(*) FROM {prefix}outbox_events WHERE status = $1"),
            &[&status],
        )
        .expect("count")
        .get(0)
}

fn in_ci() -> bool {
    std::env::var("CI").map(|v| v == "true").unwrap_or(false)
}

fn reachable(addr: &str) -> bool {
    use std::net::ToSocketAddrs;
    addr.to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| std::net::TcpStream::connect_timeout(&a, Duration::from_secs(2)).is_ok())
        .unwrap_or(false)
}

/// `true` if the service at `addr` answers; otherwise prints why the test skips, or
/// panics in CI.
pub fn service_up(name: &str, addr: &str) -> bool {
    if reachable(addr) {
        return true;
    }
    if in_ci() {
        panic!("{name} at {addr} is required in CI and does not answer");
    }
    eprintln!("SKIPPED: {name} at {addr} does not answer");
    false
}

/// Kafka bootstrap servers; override with `TXBOX_KAFKA_BROKERS`.
pub fn kafka_brokers() -> String {
    std::env::var("TXBOX_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// RabbitMQ URL; override with `TXBOX_RABBITMQ_URL`.
pub fn rabbit_url() -> String {
    std::env::var("TXBOX_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

/// Runs one of the project's `.ci` scripts.
pub fn ci_script(script: &str, args: &[&str]) {
    let path = format!("{}/.ci/{script}", env!("CARGO_MANIFEST_DIR"));
    let out = std::process::Command::new("bash")
        .arg(&path)
        .args(args)
        .output()
        .expect("run script");
    assert!(
        out.status.success(),
        "{script} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Creates a Kafka topic. Tansu does not auto-create topics; against a real Kafka
/// set `TXBOX_KAFKA_CREATE_TOPICS=0` and let the broker auto-create them.
pub fn create_topic(name: &str, partitions: u32) {
    if std::env::var("TXBOX_KAFKA_CREATE_TOPICS")
        .map(|v| v == "0")
        .unwrap_or(false)
    {
        return;
    }
    ci_script("kafka.sh", &["topic", name, &partitions.to_string()]);
}

/// A short unique suffix for topic, queue and table names.
pub fn unique() -> String {
    uuid::Uuid::now_v7().simple().to_string()[20..].to_string()
}

/// An event of `event_type` as the relay hands it to a sender, for sender
/// tests (RabbitMQ routes it by its type's name unless its sender was given a
/// routing key for it).
pub fn claimed(destination: &str, event_type: &str, payload: String) -> txbox::Event {
    txbox::Event {
        id: txbox::EventId::new(),
        event_type: event_type.into(),
        destination: destination.into(),
        key: None,
        headers: Default::default(),
        payload: payload.into_bytes(),
        content_type: None,
        attempts: 0,
    }
}

/// Collects what a consumer loop hands to its handler.
#[derive(Clone, Default)]
pub struct Collected(pub Arc<std::sync::Mutex<Vec<txbox::ReceivedEvent>>>);

impl Collected {
    pub fn push(&self, e: &txbox::ReceivedEvent) {
        self.0.lock().unwrap().push(e.clone());
    }
    pub fn all(&self) -> Vec<txbox::ReceivedEvent> {
        self.0.lock().unwrap().clone()
    }
    pub fn ids(&self) -> std::collections::HashSet<txbox::EventId> {
        self.0.lock().unwrap().iter().filter_map(|e| e.id).collect()
    }
    /// A consumer-loop handler that collects here and acks.
    pub fn handler(&self) -> Handler {
        let sink = self.clone();
        Box::new(move |e| {
            sink.push(e);
            Ok(())
        })
    }
}

/// Runs a consumer loop on its own thread until the returned signal stops it.
pub fn spawn_loop<R: Send + 'static>(
    run: impl FnOnce(&txbox::StopSignal) -> R + Send + 'static,
) -> (txbox::StopSignal, std::thread::JoinHandle<R>) {
    let stop = txbox::StopSignal::new();
    let s = stop.clone();
    (stop, std::thread::spawn(move || run(&s)))
}

/// A handler for a consumer loop, boxed so one helper serves both brokers.
pub type Handler = Box<dyn FnMut(&txbox::ReceivedEvent) -> Result<(), String> + Send>;

/// Runs the consumer loop that `start` starts with a collecting handler until `n`
/// distinct events arrived (within 60 s), stops it, and returns what it received,
/// in arrival order.
pub fn consume_events(
    n: usize,
    start: impl FnOnce(Handler) -> (txbox::StopSignal, std::thread::JoinHandle<()>),
) -> Vec<txbox::ReceivedEvent> {
    let got = Collected::default();
    let (stop, h) = start(got.handler());
    wait_until(
        &format!("{n} events consumed"),
        Duration::from_secs(60),
        || got.ids().len() >= n,
    );
    stop.stop();
    h.join().unwrap();
    got.all()
}

/// The ids of [`consume_events`], in arrival order.
pub fn consume_ids(
    n: usize,
    start: impl FnOnce(Handler) -> (txbox::StopSignal, std::thread::JoinHandle<()>),
) -> Vec<txbox::EventId> {
    consume_events(n, start)
        .iter()
        .filter_map(|e| e.id)
        .collect()
}

pub mod backend;

/// What arrived at a consumer, against what was published: how often each id
/// arrived, which published ones never did, and the repeats.
pub struct Tally {
    times: std::collections::HashMap<txbox::EventId, usize>,
    lost: Vec<txbox::EventId>,
}

impl Tally {
    /// Counts `received` (every arrival, repeats included) against `published`.
    pub fn of<'a>(
        published: impl IntoIterator<Item = &'a txbox::EventId>,
        received: impl IntoIterator<Item = txbox::EventId>,
    ) -> Tally {
        let mut times = std::collections::HashMap::new();
        for id in received {
            *times.entry(id).or_insert(0) += 1;
        }
        let lost = published
            .into_iter()
            .filter(|id| !times.contains_key(*id))
            .copied()
            .collect();
        Tally { times, lost }
    }

    /// Published ids that never arrived.
    pub fn lost(&self) -> &[txbox::EventId] {
        &self.lost
    }

    /// Arrivals beyond the first of each id.
    pub fn duplicates(&self) -> usize {
        self.times.values().map(|n| n - 1).sum()
    }

    /// Distinct ids that arrived.
    pub fn delivered(&self) -> usize {
        self.times.len()
    }

    /// The distinct ids that arrived.
    pub fn ids(&self) -> impl Iterator<Item = &txbox::EventId> {
        self.times.keys()
    }
}

/// The name the test harness knows the test `name` of module `module` (its
/// `module_path!()`) by: its path without the binary's crate, as
/// `--exact` wants it (`clocks::skewed_publisher_process` in the suite
/// binary, `name` alone at a binary's root).
pub fn test_name(module: &str, name: &str) -> String {
    match module.split_once("::") {
        Some((_, path)) => format!("{path}::{name}"),
        None => name.to_owned(),
    }
}

/// Runs the ignored test `test` of this test binary as a child process with
/// `env` set (a relay process for the crash tests), its output discarded.
pub fn spawn_child(test: &str, env: &[(&str, &str)]) -> std::process::Child {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            test,
            "--ignored",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap()
}

/// Declares a durable direct exchange and a durable queue bound to it with
/// `routing_key` (left in place: the relay publishes from its own connections).
#[cfg(feature = "rabbitmq")]
pub fn durable_queue(exchange: &str, queue: &str, routing_key: &str) {
    use amiquip::{
        Connection, ExchangeDeclareOptions, ExchangeType, FieldTable, QueueDeclareOptions,
    };
    let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    let durable = ExchangeDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.exchange_declare(ExchangeType::Direct, exchange, durable)
        .unwrap();
    let q = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queue, q).unwrap();
    ch.queue_bind(queue, exchange, routing_key, FieldTable::new())
        .unwrap();
    conn.close().unwrap();
}

/// How often a handler saw each event id.
#[derive(Clone, Default)]
pub struct Calls(Arc<std::sync::Mutex<std::collections::HashMap<txbox::EventId, usize>>>);

impl Calls {
    pub fn count(&self, id: txbox::EventId) -> usize {
        self.0.lock().unwrap().get(&id).copied().unwrap_or(0)
    }

    /// A handler that counts every call and fails the first one for `victim`.
    pub fn failing_once_for(
        &self,
        victim: txbox::EventId,
    ) -> impl FnMut(&txbox::ReceivedEvent) -> Result<(), String> + Send + 'static {
        let calls = self.0.clone();
        move |e| {
            let id = e.event_id().map_err(|e| e.to_string())?;
            let mut calls = calls.lock().unwrap();
            let n = calls.entry(id).or_default();
            *n += 1;
            if id == victim && *n == 1 {
                return Err("database hiccup".into());
            }
            Ok(())
        }
    }
}

/// Shuts the relays down, then checks that the senders together delivered each of
/// `published` exactly once.
pub fn shut_down_and_check_each_once(
    relays: Vec<txbox::Relay>,
    senders: &[txbox::MemorySender],
    published: &std::collections::HashSet<txbox::EventId>,
) {
    for r in relays {
        r.shutdown(Duration::from_secs(10)).unwrap();
    }
    let mut seen = std::collections::HashSet::new();
    for e in senders.iter().flat_map(txbox::MemorySender::sent) {
        assert!(seen.insert(e.id), "{} delivered twice", e.id);
    }
    assert_eq!(&seen, published);
}

/// Three tests of one scenario, one per claim mode: `body(prefix, claim, delete)`
/// with lease claims, held claims, and held claims deleting acked rows
/// (`processed_ttl` zero); the table prefixes are `$prefix` followed by `_`, `h_`
/// and `d_`.
#[macro_export]
macro_rules! each_claim_mode {
    ($body:ident, $prefix:literal: $lease:ident, $held:ident, $deleting:ident) => {
        #[test]
        fn $lease() {
            $body(concat!($prefix, "_"), txbox::ClaimMode::Lease, false);
        }

        #[test]
        fn $held() {
            $body(concat!($prefix, "h_"), txbox::ClaimMode::Lock, false);
        }

        #[test]
        fn $deleting() {
            $body(concat!($prefix, "d_"), txbox::ClaimMode::Lock, true);
        }
    };
}

/// A configuration for the tables of `prefix` whose defaults are `defaults` with
/// claim mode `claim`, acked rows deleted (`processed_ttl` zero) when `delete`,
/// else kept for a day: what one test of [`each_claim_mode!`] builds on.
pub fn mode_config(
    prefix: &str,
    defaults: impl FnOnce(txbox::EventSettings) -> txbox::EventSettings,
    claim: txbox::ClaimMode,
    delete: bool,
) -> txbox::ConfigBuilder {
    let ttl = if delete {
        Duration::ZERO
    } else {
        Duration::from_secs(86_400)
    };
    txbox::Config::builder()
        .table_prefix(prefix)
        .defaults(|d| defaults(d).claim(claim))
        .maintenance(|m| m.processed_ttl(ttl))
}

/// A configuration with no event types on the tables of `prefix`: what a store
/// is opened with.
pub fn prefix_config(prefix: &str) -> txbox::Config {
    txbox::Config::builder()
        .table_prefix(prefix)
        .build()
        .expect("table prefix")
}

/// Bytes no text could carry: invalid UTF-8, NULs, and what PostgreSQL writes
/// a `bytea` as in text (`\x41`).
pub const RAW_BYTES: &[u8] = &[
    0xff, 0x00, 0xfe, b'\\', b'x', b'4', b'1', 0x80, 0x00, 0xc3, 0x28,
];

/// Publishes, in one committed transaction of `client`, an event of
/// `event_type` as [`RAW_BYTES`] (content type `application/x-protobuf`, a
/// header) and a JSON one; returns their ids.
pub fn publish_bytes_and_json(
    outbox: &txbox::Outbox,
    client: &mut postgres::Client,
    event_type: &str,
) -> (txbox::EventId, txbox::EventId) {
    let mut tx = client.transaction().unwrap();
    let bytes = txbox::NewEvent::bytes(event_type, RAW_BYTES, "application/x-protobuf")
        .header("schema", "order.v1");
    let bytes = outbox.publish_all(&mut tx, [bytes]).unwrap()[0];
    let json = outbox
        .publish(&mut tx, event_type, &serde_json::json!({"n": 1}))
        .unwrap();
    tx.commit().unwrap();
    (bytes, json)
}

/// Checks what a consumer got of [`publish_bytes_and_json`]: the bytes
/// unchanged with their content type and header, and the JSON with
/// `json_content_type` (what the broker's message names for it).
pub fn check_bytes_and_json(
    got: &[txbox::ReceivedEvent],
    (bytes, json): (txbox::EventId, txbox::EventId),
    json_content_type: Option<&str>,
) {
    let of = |id| got.iter().find(|e| e.id == Some(id)).expect("consumed");
    let b = of(bytes);
    assert_eq!(
        (b.payload.as_slice(), b.content_type.as_deref()),
        (RAW_BYTES, Some("application/x-protobuf"))
    );
    assert_eq!(
        b.headers,
        std::collections::BTreeMap::from([("schema".to_string(), "order.v1".to_string())]),
        "the content type is not among the user's headers"
    );
    let j = of(json);
    assert_eq!(
        (j.payload.as_slice(), j.content_type.as_deref()),
        (&br#"{"n":1}"#[..], json_content_type)
    );
    assert!(j.headers.is_empty());
}

/// Reads until every id of `want` arrived and the source is quiet for a second,
/// or 60 s pass; `next` returns the next message's event id, `None` when none came
/// within its wait. The ids in arrival order, repeats included.
pub fn read_all(
    want: &std::collections::HashSet<txbox::EventId>,
    mut next: impl FnMut() -> Option<txbox::EventId>,
) -> Vec<txbox::EventId> {
    let mut received = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut quiet_since = Instant::now();
    while Instant::now() < deadline {
        match next() {
            Some(id) => {
                received.push(id);
                seen.insert(id);
                quiet_since = Instant::now();
            }
            None if want.is_subset(&seen) && quiet_since.elapsed() > Duration::from_secs(1) => {
                break
            }
            None => {}
        }
    }
    received
}

/// Consumes `queue` (no ack: the messages are taken) with [`read_all`], handing
/// each body to `body`; the message ids in arrival order.
#[cfg(feature = "rabbitmq")]
pub fn read_rabbitmq_queue(
    queue: &str,
    want: &std::collections::HashSet<txbox::EventId>,
    mut body: impl FnMut(&[u8]),
) -> Vec<txbox::EventId> {
    use amiquip::{Connection, ConsumerMessage, ConsumerOptions};
    let mut conn = Connection::insecure_open(&rabbit_url()).unwrap();
    let ch = conn.open_channel(None).unwrap();
    let options = ConsumerOptions {
        no_ack: true,
        ..Default::default()
    };
    let consumer = ch.basic_consume(queue, options).unwrap();
    let received = read_all(want, || {
        match consumer.receiver().recv_timeout(Duration::from_millis(200)) {
            Ok(ConsumerMessage::Delivery(d)) => {
                body(&d.body);
                d.properties
                    .message_id()
                    .as_deref()
                    .and_then(|m| m.parse().ok())
            }
            _ => None,
        }
    });
    drop(consumer);
    let _ = conn.close();
    received
}

/// A reader of `topic`'s partitions `0..partitions` from their beginning, in a
/// group of its own that commits nothing.
#[cfg(feature = "kafka")]
pub fn kafka_reader(topic: &str, partitions: i32) -> rdkafka::consumer::BaseConsumer {
    use rdkafka::consumer::Consumer;
    let consumer: rdkafka::consumer::BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", kafka_brokers())
        .set("group.id", format!("read-{topic}-{}", unique()))
        .set("enable.auto.commit", "false")
        .create()
        .unwrap();
    let mut list = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        list.add_partition_offset(topic, p, rdkafka::Offset::Beginning)
            .unwrap();
    }
    consumer.assign(&list).unwrap();
    consumer
}

/// The event id of a Kafka record: its `txbox-event-id` header.
#[cfg(feature = "kafka")]
pub fn kafka_event_id(m: &impl rdkafka::message::Message) -> Option<txbox::EventId> {
    use rdkafka::message::Headers;
    m.headers().and_then(|h| {
        h.iter()
            .find(|h| h.key == txbox::HEADER_EVENT_ID)
            .and_then(|h| std::str::from_utf8(h.value?).ok()?.parse().ok())
    })
}
