//! TLS on every connection and timeouts that free a stuck thread, against the
//! real services with the TLS that `.ci/tls.sh` sets up (a test CA, a server
//! certificate for `localhost` only, a second CA that signed nothing).
#![cfg(all(
    feature = "postgres",
    feature = "rabbitmq",
    feature = "mysql",
    feature = "redis",
    feature = "kafka",
    feature = "admin-http"
))]

use std::net::TcpListener;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::common::*;
use serde_json::json;
use txbox::rabbitmq::{RabbitConsumer, RabbitSender};
use txbox::{Config, InboxCache, Outbox, Relay, Sender, SenderFactory};

/// The test CA's folder (`TXBOX_TLS_DIR`), or `None` with the reason printed
/// (a failure in CI).
fn tls_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(
        std::env::var("TXBOX_TLS_DIR").unwrap_or_else(|_| "/var/lib/txbox-tls".into()),
    );
    if dir.join("ca.pem").exists() {
        return Some(dir);
    }
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{} has no test CA: run .ci/tls.sh", dir.display());
    }
    eprintln!("SKIPPED: no test CA in {} (run .ci/tls.sh)", dir.display());
    None
}

fn ca(dir: &std::path::Path, name: &str) -> String {
    dir.join(name).display().to_string()
}

/// The TLS-only PostgreSQL user, its connections named `app`.
fn pg_tls_url(host: &str, mode: &str, roots: &str, app: &str) -> String {
    format!(
        "postgres://txbox_tls@{host}:5432/test?sslmode={mode}&sslrootcert={roots}&application_name={app}"
    )
}

/// How many of the PostgreSQL connections named `app` are encrypted, as the
/// server sees them (`pg_stat_ssl`), and how many there are.
fn encrypted_connections(plain: &mut postgres::Client, app: &str) -> (i64, i64) {
    let row = plain
        .query_one(
            "SELECT count(*) FILTER (WHERE s.ssl), count(*) FROM pg_stat_activity a \
             JOIN pg_stat_ssl s USING (pid) WHERE a.application_name = $1",
            &[&app],
        )
        .unwrap();
    (row.get(0), row.get(1))
}

/// `r` failed, and its error says `says`.
fn refused<T>(r: txbox::Result<T>, says: &str) {
    match r {
        Ok(_) => panic!("accepted; expected an error saying {says:?}"),
        Err(e) => assert!(e.to_string().contains(says), "{e}"),
    }
}

fn connect_error(r: txbox::Result<impl Sized>) -> (String, String) {
    match r {
        Err(txbox::Error::Connect { to, reason, .. }) => (to, reason),
        Err(e) => panic!("not a connect error: {e}"),
        Ok(_) => panic!("connected"),
    }
}

/// Publish over TLS, relay over TLS to RabbitMQ (`amqps://`), consume over
/// TLS: every PostgreSQL connection of the relay is encrypted as the server
/// sees it (`pg_stat_ssl`), and so is every RabbitMQ connection on 5671.
#[test]
fn postgres_and_rabbitmq_over_tls_publish_relay_and_consume() {
    let Some(dir) = tls_dir() else { return };
    if !service_up("RabbitMQ over TLS", "127.0.0.1:5671") {
        return;
    }
    let p = "t_tls_pg_";
    let app = format!("txbox_tls_{}", unique());
    let url = pg_tls_url("localhost", "verify-full", &ca(&dir, "ca.pem"), &app);
    let Some((store, mut plain)) = fresh_with_url(p, &url) else {
        return;
    };
    let exchange = format!("txbox-tls-{}", unique());
    let queue = format!("{exchange}-q");
    durable_queue(&exchange, &queue, "e");
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| {
            e.adaptive_polling(Duration::from_millis(20), Duration::from_millis(200), 1.5)
        })
        .event("e", |e| e.destination(&exchange))
        .build()
        .unwrap();
    let amqps = format!(
        "amqps://guest:guest@localhost:5671?cacertfile={}",
        ca(&dir, "ca.pem")
    );
    let relay = Relay::start(
        store.clone(),
        &config,
        RabbitSender::builder(&amqps).build().unwrap(),
    )
    .unwrap();

    // the business transaction over TLS too, with txbox's reading of the URL
    let (pg, tls) = txbox::pg_config(&url).unwrap();
    let mut db = pg.connect(tls).unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = db.transaction().unwrap();
    let ids: Vec<_> = (0..20)
        .map(|i| outbox.publish(&mut tx, "e", &json!({ "n": i })).unwrap())
        .collect();
    tx.commit().unwrap();

    let consumer_url = amqps.clone();
    let got = consume_ids(ids.len(), move |h| {
        let consumer = RabbitConsumer::builder(&consumer_url, &queue).build();
        spawn_loop(move |s| consumer.run(s, h).unwrap())
    });
    assert_eq!(
        got.into_iter().collect::<std::collections::BTreeSet<_>>(),
        ids.iter().copied().collect()
    );

    let (encrypted, all) = encrypted_connections(&mut plain, &app);
    assert!(all >= 3, "the pool, the listener and the publisher: {all}");
    assert_eq!(encrypted, all, "every connection of the relay is encrypted");

    let out = std::process::Command::new("rabbitmqctl")
        .args(["-q", "list_connections", "port", "ssl"])
        .output()
        .expect("rabbitmqctl");
    let listed = String::from_utf8_lossy(&out.stdout);
    let on_tls: Vec<&str> = listed
        .lines()
        .filter(|l| l.split_whitespace().next() == Some("5671"))
        .collect();
    assert!(
        !on_tls.is_empty(),
        "the relay's connection on 5671: {listed}"
    );
    assert!(
        on_tls
            .iter()
            .all(|l| l.split_whitespace().nth(1) == Some("true")),
        "{listed}"
    );
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(count(&mut plain, p, "PROCESSED"), 20);

    // a pool of your own with txbox's TLS connector, given to `from_pool`
    let app = format!("txbox_tls_pool_{}", unique());
    let url = pg_tls_url("localhost", "verify-full", &ca(&dir, "ca.pem"), &app);
    let (pg, tls) = txbox::pg_config(&url).unwrap();
    let pool = r2d2::Pool::builder()
        .max_size(2)
        .build(r2d2_postgres::PostgresConnectionManager::new(pg, tls))
        .unwrap();
    let own = txbox::PgStore::from_pool(pool, &config).unwrap();
    own.migrate().unwrap();
    let mut tx = db.transaction().unwrap();
    let id = outbox.publish(&mut tx, "e", &json!({ "n": 20 })).unwrap();
    tx.commit().unwrap();
    let got = txbox::store::ClaimStore::claim(
        &own,
        "e",
        10,
        Duration::from_secs(60),
        uuid::Uuid::now_v7(),
    )
    .unwrap();
    assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), vec![id]);
    let (encrypted, all) = encrypted_connections(&mut plain, &app);
    assert!(all >= 1, "the pool's connections: {all}");
    assert_eq!(encrypted, all, "every connection of the pool is encrypted");
}

/// A certificate that does not verify, or a server without TLS where TLS is
/// required, is an error naming the host, at once; never plaintext.
#[test]
fn postgres_refuses_what_it_cannot_verify() {
    let Some(dir) = tls_dir() else { return };
    if client().is_none() {
        return;
    }
    let config = Config::builder().build().unwrap();
    let root = ca(&dir, "ca.pem");
    // the certificate is for localhost, not 127.0.0.1
    let (to, reason) = connect_error(txbox::PgStore::connect(
        &pg_tls_url("127.0.0.1", "verify-full", &root, "t"),
        &config,
    ));
    assert!(to.contains("127.0.0.1:5432"), "{to}");
    assert!(reason.contains("certificate"), "{reason}");
    // verify-ca does not check the name
    txbox::PgStore::connect(&pg_tls_url("127.0.0.1", "verify-ca", &root, "t"), &config).unwrap();
    // a CA that did not sign it
    let (_, reason) = connect_error(txbox::PgStore::connect(
        &pg_tls_url("localhost", "verify-full", &ca(&dir, "other-ca.pem"), "t"),
        &config,
    ));
    assert!(reason.contains("certificate verify failed"), "{reason}");
    // a server without TLS (the second cluster), within a second, not the pool's 10 s
    let started = Instant::now();
    let (to, reason) = connect_error(txbox::PgStore::connect(
        "postgres://postgres@127.0.0.1:5433/postgres?sslmode=require",
        &config,
    ));
    assert!(to.contains("127.0.0.1:5433"), "{to}");
    assert!(reason.to_lowercase().contains("tls"), "{reason}");
    assert!(started.elapsed() < Duration::from_secs(5));
    // the key=value form, its values quoted
    let kv = format!(
        "host=localhost user=txbox_tls dbname=test sslmode = verify-full sslrootcert='{root}'"
    );
    txbox::PgStore::connect(&kv, &config).unwrap();
    for (bad, says) in [
        ("sslmode=allow", "allow"),
        (
            "sslmode=verify-full&sslrootcert=/nonexistent.pem",
            "/nonexistent.pem",
        ),
        // the system's CAs without the host name would pass any public certificate
        ("sslmode=verify-ca", "sslrootcert"),
    ] {
        let url = format!("postgres://txbox_tls@localhost/test?{bad}");
        refused(txbox::PgStore::connect(&url, &config), says);
    }
    // a password with a `?` in it: the query is still read
    let url = "postgres://u:p?ss@localhost/test?sslmode=allow";
    refused(txbox::PgStore::connect(url, &config), "allow");
}

/// `amqps://`: a host name the certificate does not carry, a CA that did
/// not sign it and a plaintext port each fail the connect with an error
/// naming the broker; the events wait.
#[test]
fn rabbitmq_refuses_what_it_cannot_verify() {
    let Some(dir) = tls_dir() else { return };
    if !service_up("RabbitMQ over TLS", "127.0.0.1:5671") {
        return;
    }
    let cases = [
        (
            format!(
                "amqps://guest:guest@127.0.0.1:5671?cacertfile={}",
                ca(&dir, "ca.pem")
            ),
            "mismatch",
        ),
        (
            format!(
                "amqps://guest:guest@localhost:5671?cacertfile={}",
                ca(&dir, "other-ca.pem")
            ),
            "certificate verify failed",
        ),
        (
            format!(
                "amqps://guest:guest@localhost:5672?cacertfile={}",
                ca(&dir, "ca.pem")
            ),
            "TLS handshake failed",
        ),
    ];
    for (url, says) in cases {
        let mut sender = RabbitSender::builder(&url)
            .build()
            .unwrap()
            .create()
            .unwrap();
        let started = Instant::now();
        let e = sender.ready().expect_err(&url);
        assert_eq!(
            e.kind,
            txbox::sender::SendErrorKind::Transient,
            "{url}: events wait, no attempt counted"
        );
        assert!(
            e.message.contains("RabbitMQ at amqps://"),
            "{url}: {}",
            e.message
        );
        assert!(e.message.contains(says), "{url}: {}", e.message);
        assert!(started.elapsed() < Duration::from_secs(11), "{url}");
    }
    // verify_none: encrypted, unchecked
    let url = "amqps://guest:guest@127.0.0.1:5671?verify=verify_none";
    let mut sender = RabbitSender::builder(url)
        .build()
        .unwrap()
        .create()
        .unwrap();
    sender.ready().unwrap();
}

/// The code and JSON body of an admin route.
fn probe(admin: &txbox::admin::AdminServer, path: &str) -> (u16, serde_json::Value) {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .build()
        .into();
    let mut r = agent
        .get(format!("http://{}{path}", admin.addr()))
        .call()
        .unwrap();
    (
        r.status().as_u16(),
        r.body_mut().read_json::<serde_json::Value>().unwrap(),
    )
}

/// A broker that accepts the connection and never answers: the sender gives
/// up within its connection timeout, the relay is not ready (`/ready` 503,
/// `/health` 200: the relay runs), and `shutdown` returns within its deadline.
/// With a timeout longer than the probe's `stuck_after`, `/health` says the
/// poller is stuck.
#[test]
fn a_broker_that_never_answers_frees_the_thread_and_is_reported() {
    let p = "t_tls_silent_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for s in silent.incoming().flatten() {
            keep.lock().unwrap().push(s);
        }
    });
    // the default timeout, on the sender alone
    let url = format!("amqp://guest:guest@127.0.0.1:{port}");
    let mut sender = RabbitSender::builder(&url)
        .build()
        .unwrap()
        .create()
        .unwrap();
    let started = Instant::now();
    let e = sender.ready().expect_err("a silent broker");
    let took = started.elapsed();
    assert!(
        took >= txbox::rabbitmq::CONNECTION_TIMEOUT - Duration::from_millis(100)
            && took < txbox::rabbitmq::CONNECTION_TIMEOUT + Duration::from_secs(3),
        "gave up after {took:?}: {e:?}"
    );

    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| {
            e.destination("x").fixed_polling(Duration::from_millis(50))
        })
        .build()
        .unwrap();
    let fast = format!("amqp://guest:guest@127.0.0.1:{port}?connection_timeout=500");
    let sender = RabbitSender::builder(&fast).build().unwrap();
    let (relay, admin) = relay_with_admin(&store, &config, sender);
    let get = |path: &str| probe(&admin, path);
    wait_until(
        "/ready says the broker is unreachable",
        Duration::from_secs(10),
        || {
            let (code, body) = get("/ready");
            code == 503 && body["relays"][0]["broker"] == "unreachable"
        },
    );
    let (code, body) = get("/health");
    assert_eq!(code, 200, "the relay runs: {body}");
    let started = Instant::now();
    relay.shutdown(Duration::from_secs(3)).unwrap();
    assert!(started.elapsed() < Duration::from_secs(3));
    admin.shutdown();

    // a timeout longer than stuck_after: the poller is stuck until the
    // broker's connections close
    let slow = format!("amqp://guest:guest@127.0.0.1:{port}?connection_timeout=600000");
    // (a short confirm timeout: a relay counts a thread stuck only past twice
    // its sender's longest wait for an ack)
    let sender = RabbitSender::builder(&slow)
        .confirm_timeout(Duration::from_millis(200))
        .build()
        .unwrap();
    let relay = Relay::start(store.clone(), &config, sender).unwrap();
    let admin = txbox::admin::AdminServer::start(
        store.clone(),
        txbox::admin::AdminOptions::new()
            .relay(relay.probe())
            .stuck_after(Duration::from_millis(500)),
    )
    .unwrap();
    let health = |path: &str| probe(&admin, path);
    wait_until(
        "/health says a thread is stuck",
        Duration::from_secs(10),
        || {
            let (code, body) = health("/health");
            code == 503 && body["relays"][0]["stuck"] == 1
        },
    );
    held.lock().unwrap().clear(); // the broker hangs up: the connect fails
    wait_until("/health is 200 again", Duration::from_secs(10), || {
        health("/health").0 == 200
    });
    relay.shutdown(Duration::from_secs(5)).unwrap();
    admin.shutdown();
}

/// MariaDB over TLS (`ssl_mode`), the session encrypted as the server says;
/// a name the certificate does not carry and a CA that did not sign it fail.
#[test]
fn mysql_over_tls() {
    let Some(dir) = tls_dir() else { return };
    if !service_up("MariaDB", "127.0.0.1:3306") {
        return;
    }
    let config = Config::builder().table_prefix("t_tls_my_").build().unwrap();
    let url = |host: &str, mode: &str, roots: &str| {
        format!("mysql://root@{host}:3306/test?ssl_mode={mode}&root_cert_path={roots}")
    };
    let root = ca(&dir, "ca.pem");
    let store =
        txbox::MySqlStore::connect(&url("localhost", "VERIFY_IDENTITY", &root), &config).unwrap();
    store.migrate().unwrap();
    use mysql::prelude::Queryable;
    let mut c = store.pool().get_conn().unwrap();
    let cipher: Option<(String, String)> = c
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .unwrap();
    assert!(
        cipher.is_some_and(|(_, v)| !v.is_empty()),
        "the session is encrypted"
    );
    // publish on the store's pool and claim through the store, over TLS
    let config = Config::builder()
        .table_prefix("t_tls_my_")
        .event("e", |e| e)
        .build()
        .unwrap();
    let mut tx = c.start_transaction(mysql::TxOpts::default()).unwrap();
    let id = Outbox::new(&config)
        .unwrap()
        .publish(&mut tx, "e", &json!({ "n": 1 }))
        .unwrap();
    tx.commit().unwrap();
    let got = txbox::store::ClaimStore::claim(
        &store,
        "e",
        1000,
        Duration::from_secs(60),
        uuid::Uuid::now_v7(),
    )
    .unwrap();
    assert!(got.iter().any(|e| e.id == id), "claimed over TLS");
    let (to, reason) = connect_error(txbox::MySqlStore::connect(
        &url("127.0.0.1", "VERIFY_IDENTITY", &root),
        &config,
    ));
    assert!(to.contains("127.0.0.1:3306"), "{to}");
    assert!(
        reason.contains("certificate verify failed") && reason.contains("mismatch"),
        "{reason}"
    );
    txbox::MySqlStore::connect(&url("127.0.0.1", "VERIFY_CA", &root), &config).unwrap();
    let (_, reason) = connect_error(txbox::MySqlStore::connect(
        &url("localhost", "VERIFY_IDENTITY", &ca(&dir, "other-ca.pem")),
        &config,
    ));
    assert!(reason.contains("certificate verify failed"), "{reason}");
    let url = "mysql://root@127.0.0.1/test?ssl_mode=PREFERRED";
    refused(txbox::MySqlStore::connect(url, &config), "PREFERRED");
    refused(
        txbox::MySqlStore::connect("mysql://root@127.0.0.1/test?ssl_mode=VERIFY_CA", &config),
        "root_cert_path",
    );
    // a server without TLS (the second one, on 3307), at once
    if service_up("MariaDB without TLS", "127.0.0.1:3307") {
        let started = Instant::now();
        let (to, reason) = connect_error(txbox::MySqlStore::connect(
            "mysql://root@127.0.0.1:3307/mysql?ssl_mode=REQUIRED",
            &config,
        ));
        assert!(to.contains("127.0.0.1:3307"), "{to}");
        assert!(
            reason.to_lowercase().contains("secure") || reason.contains("TLS"),
            "{reason}"
        );
        assert!(started.elapsed() < Duration::from_secs(5));
    }
}

/// The Redis cache over `rediss://` with the test CA; a wrong CA and a
/// plaintext server fail; a Redis that never answers fails within the
/// command timeout.
#[test]
fn redis_over_tls_and_its_timeouts() {
    let Some(dir) = tls_dir() else { return };
    if !service_up("Redis over TLS", "127.0.0.1:6380") {
        return;
    }
    let cache = txbox::RedisCache::builder("rediss://localhost:6380")
        .root_cert_file(dir.join("ca.pem"))
        .build()
        .unwrap();
    let key = format!("txbox-tls-{}", unique());
    cache.insert(&key, Duration::from_secs(60)).unwrap();
    assert!(cache.contains(&key).unwrap());
    for (url, roots, says) in [
        (
            "rediss://localhost:6380",
            "other-ca.pem",
            "certificate verify failed",
        ),
        ("rediss://127.0.0.1:6380", "ca.pem", "mismatch"),
        ("rediss://localhost:6379", "ca.pem", "TLS"),
    ] {
        let cache = txbox::RedisCache::builder(url)
            .root_cert_file(dir.join(roots))
            .build()
            .unwrap();
        let (to, reason) = connect_error(cache.contains("k"));
        let host = url.trim_start_matches("rediss://");
        assert!(to.contains(&format!("Redis at {host}")), "{to}");
        assert!(reason.contains(says), "{url}: {reason}");
    }
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("redis://127.0.0.1:{}", silent.local_addr().unwrap().port());
    let cache = txbox::RedisCache::builder(&url)
        .connect_timeout(Duration::from_millis(300))
        .command_timeout(Duration::from_millis(300))
        .build()
        .unwrap();
    let started = Instant::now();
    assert!(cache.contains("k").is_err());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
}

/// Kafka over TLS (`security.protocol=ssl`, librdkafka's OpenSSL): relayed
/// and read back through the TLS listener; a CA that did not sign the broker's
/// certificate leaves the events pending.
#[test]
fn kafka_over_tls() {
    let Some(dir) = tls_dir() else { return };
    if !service_up("Kafka over TLS", "127.0.0.1:9093") {
        return;
    }
    let p = "t_tls_kafka_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let topic = format!("txbox-tls-{}", unique());
    let out = std::process::Command::new("bash")
        .arg(format!("{}/.ci/kafka.sh", env!("CARGO_MANIFEST_DIR")))
        .args(["topic-tls", &topic, "1"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| {
            e.adaptive_polling(Duration::from_millis(20), Duration::from_millis(200), 1.5)
        })
        .event("e", |e| e.destination(&topic))
        .build()
        .unwrap();
    let ssl = |servers: &str, roots: &str| {
        txbox::kafka::KafkaSender::builder(servers)
            .property("message.timeout.ms", "3000")
            .property("security.protocol", "ssl")
            .property("ssl.ca.location", ca(&dir, roots))
            .build()
            .unwrap()
    };
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let id = outbox
        .publish(&mut tx, "e", &json!({"over": "tls"}))
        .unwrap();
    tx.commit().unwrap();
    // a CA that did not sign the broker's certificate, a host name it was not
    // issued for, a broker without TLS: nothing is sent, nothing counted
    for (servers, roots) in [
        ("localhost:9093", "other-ca.pem"),
        ("127.0.0.1:9093", "ca.pem"),
        ("127.0.0.1:9092", "ca.pem"),
    ] {
        let relay = Relay::start(store.clone(), &config, ssl(servers, roots)).unwrap();
        let probe = relay.probe();
        wait_until(
            &format!("the relay sees {servers} with {roots} unreachable"),
            Duration::from_secs(30),
            || probe.broker_down() > 0,
        );
        relay.shutdown(Duration::from_secs(10)).unwrap();
        assert_eq!(
            count(&mut client, p, "PROCESSED"),
            0,
            "sent to {servers} with {roots}"
        );
        assert_eq!(count(&mut client, p, "PENDING"), 1);
    }

    let relay = Relay::start(store.clone(), &config, ssl("localhost:9093", "ca.pem")).unwrap();
    wait_until("relayed over TLS", Duration::from_secs(30), || {
        count(&mut client, p, "PROCESSED") == 1
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::Message;
    let reader: BaseConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", "localhost:9093")
        .set("security.protocol", "ssl")
        .set("ssl.ca.location", ca(&dir, "ca.pem"))
        .set("group.id", format!("g-{}", unique()))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    reader.subscribe(&[&topic]).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        assert!(Instant::now() < deadline, "nothing read back over TLS");
        if let Some(Ok(m)) = reader.poll(Duration::from_millis(500)) {
            assert_eq!(kafka_event_id(&m), Some(id));
            assert_eq!(m.payload(), Some(&br#"{"over":"tls"}"#[..]));
            break;
        }
    }
}

/// Drops, while it lives, every packet the local ports `ports` send (to the
/// port `to`, when given: a client's ephemeral port may be another
/// connection's too, to another service): a black-holed connection, nothing
/// answers, nothing is refused.
struct BlackHole(Vec<(u16, Option<u16>)>);

impl BlackHole {
    fn new(ports: Vec<u16>, to: Option<u16>) -> BlackHole {
        assert!(!ports.is_empty(), "no connection to black-hole");
        let rules: Vec<_> = ports.into_iter().map(|p| (p, to)).collect();
        for (p, to) in &rules {
            iptables("-I", *p, *to);
        }
        BlackHole(rules)
    }
}

impl Drop for BlackHole {
    fn drop(&mut self) {
        for (p, to) in &self.0 {
            iptables("-D", *p, *to);
        }
    }
}

fn iptables(op: &str, port: u16, to: Option<u16>) {
    let (port, to) = (port.to_string(), to.map(|t| t.to_string()));
    let mut args = vec!["-w", op, "OUTPUT", "-p", "tcp", "--sport", &port];
    if let Some(to) = &to {
        args.extend(["--dport", to]);
    }
    args.extend(["-j", "DROP"]);
    let out = std::process::Command::new("iptables")
        .args(&args)
        .output()
        .expect("iptables (installed by .ci/services.sh)");
    assert!(
        out.status.success(),
        "iptables {op}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `f` on a thread of its own and returns how long it took, failing the
/// test if it has not returned after `limit` (a call that hangs on a dead
/// connection would hang the test too).
fn returns_within<T: Send + 'static>(
    limit: Duration,
    f: impl FnOnce() -> T + Send + 'static,
) -> (T, Duration) {
    let (tx, rx) = std::sync::mpsc::channel();
    let started = Instant::now();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    let out = rx
        .recv_timeout(limit)
        .unwrap_or_else(|_| panic!("still waiting after {limit:?}"));
    (out, started.elapsed())
}

/// A PostgreSQL endpoint that accepts the connection and never answers (a
/// proxy with no backend, a hung server): the driver's `connect_timeout`
/// bounds only the TCP connect, so `PgStore::connect` waited for the TLS
/// request's answer without end. It fails within the connect timeout now,
/// naming the host and the setting.
#[test]
fn a_postgres_that_never_answers_fails_the_connect_in_time() {
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    for mode in ["prefer", "disable"] {
        let url =
            format!("postgres://postgres@127.0.0.1:{port}/test?sslmode={mode}&connect_timeout=1");
        let (r, took) = returns_within(Duration::from_secs(20), move || {
            let config = Config::builder().build().unwrap();
            txbox::PgStore::connect(&url, &config).map(drop)
        });
        let (to, reason) = connect_error(r);
        assert!(to.contains(&format!("127.0.0.1:{port}")), "{to}");
        assert!(reason.contains("connect_timeout"), "{reason}");
        assert!(
            took >= Duration::from_millis(900) && took < Duration::from_secs(4),
            "{mode}: gave up after {took:?}"
        );
    }
    drop(silent);
}

/// A database connection that goes black (a failover, a dropped route: sent
/// data is never acknowledged) fails its call within the connection's
/// timeout, instead of holding the thread for the OS's 15 minutes: the
/// PostgreSQL store through `tcp_user_timeout`, the MySQL store through its
/// read timeout. The next call takes a fresh connection.
#[test]
fn black_holed_database_connections_fail_within_their_timeouts() {
    let Some(mut plain) = client() else { return };
    if !service_up("MariaDB", "127.0.0.1:3306") {
        return;
    }
    let config = Config::builder()
        .table_prefix("t_conn_black_")
        .build()
        .unwrap();

    // PostgreSQL: `tcp_user_timeout` in seconds, as the postgres crate reads it
    let app = format!("txbox_black_{}", unique());
    let url = format!("{}&tcp_user_timeout=2", pg_url_as(&app));
    let store = std::sync::Arc::new(txbox::PgStore::connect(&url, &config).unwrap());
    store.migrate().unwrap();
    txbox::MaintenanceStore::status(store.as_ref()).unwrap();
    let ports = pool_ports(&mut plain, &app, &store);
    // past the pool's tested-recently window: the call tests the connection
    let wait = Duration::from_millis(600);
    let (min, max) = (Duration::from_secs(1), Duration::from_secs(15));
    status_through_black_hole("PostgreSQL", store, (ports, 5432), wait, min, max);

    // MySQL: the read timeout; over TCP (the driver otherwise moves to the
    // local socket), in a database of its own to find every connection
    use mysql::prelude::Queryable;
    let mut admin = mysql::Conn::new("mysql://root@127.0.0.1:3306/test").unwrap();
    admin
        .query_drop("CREATE DATABASE IF NOT EXISTS txbox_black")
        .unwrap();
    let url = "mysql://root@127.0.0.1:3306/txbox_black?prefer_socket=false\
               &read_timeout_ms=1000&write_timeout_ms=1000";
    let store = std::sync::Arc::new(txbox::MySqlStore::connect(url, &config).unwrap());
    store.migrate().unwrap();
    let hosts: Vec<String> = admin
        .query("SELECT HOST FROM information_schema.PROCESSLIST WHERE DB = 'txbox_black'")
        .unwrap();
    let ports = hosts
        .iter()
        .map(|h| h.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    let (min, max) = (Duration::from_millis(900), Duration::from_secs(10));
    let ports = (ports, 3306);
    status_through_black_hole("MySQL", store, ports, Duration::ZERO, min, max);
}

/// The local ports of every connection of `store`'s pool, whose sessions are
/// named `app`: the server lists as many as the pool holds, the same ones
/// twice 300 ms apart (none on its way; the pool opens some in the background
/// after a checkout left it without an idle one).
fn pool_ports(plain: &mut postgres::Client, app: &str, store: &txbox::PgStore) -> Vec<u16> {
    let mut ports: Vec<u16> = Vec::new();
    let mut before: Option<Vec<u16>> = None;
    wait_until(
        "the pool's connections listed",
        Duration::from_secs(10),
        || {
            std::thread::sleep(Duration::from_millis(300));
            ports = plain
                .query(
                    "SELECT client_port FROM pg_stat_activity WHERE application_name = $1 \
                     ORDER BY client_port",
                    &[&app],
                )
                .unwrap()
                .iter()
                .map(|r| r.get::<_, i32>(0) as u16)
                .collect();
            let state = store.pool().state();
            let settled = state.idle_connections == state.connections
                && ports.len() == state.connections as usize
                && before.as_ref() == Some(&ports);
            before = Some(ports.clone());
            settled
        },
    );
    ports
}

/// The code, the body and the time of an admin route's answer, which must
/// come within a second.
fn probe_in_time(admin: &txbox::admin::AdminServer, path: &str) -> (u16, serde_json::Value) {
    let t = Instant::now();
    let answer = probe(admin, path);
    assert!(
        t.elapsed() < Duration::from_secs(1),
        "{path} answered after {:?}: {answer:?}",
        t.elapsed()
    );
    answer
}

/// Probes `path` until it says 503, each answer within a second, at most
/// `timeout`; the body of the 503.
fn until_503(
    admin: &txbox::admin::AdminServer,
    path: &str,
    timeout: Duration,
) -> serde_json::Value {
    let mut said = serde_json::Value::Null;
    wait_until(&format!("{path} says 503"), timeout, || {
        let (code, body) = probe_in_time(admin, path);
        said = body;
        code == 503
    });
    said
}

/// The database's link drops everything (every connection of the pool
/// black-holed: no answer, no reset): `/health` and `/ready` still answer
/// within a second, 503 `"no answer for N ms"` once the check has waited the
/// admin's `database_timeout`, and 200 again once the link is back (the
/// waiting query's retransmission gets through, or the connection is given up
/// at its `tcp_user_timeout` and replaced). Before, `/health` waited on the
/// pool with no deadline, and every request held a thread.
#[test]
fn health_answers_in_time_while_the_database_link_is_black_holed() {
    let Some(mut plain) = client() else { return };
    let config = Config::builder()
        .table_prefix("t_conn_health_")
        .build()
        .unwrap();
    let app = format!("txbox_health_{}", unique());
    let url = format!("{}&tcp_user_timeout=8", pg_url_as(&app));
    let store = std::sync::Arc::new(txbox::PgStore::connect(&url, &config).unwrap());
    store.migrate().unwrap();
    let admin = txbox::admin::AdminServer::start(
        store.clone(),
        txbox::admin::AdminOptions::new().database_timeout(Duration::from_secs(2)),
    )
    .unwrap();
    let (code, body) = probe_in_time(&admin, "/health");
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["database"], "ok");

    let ports = pool_ports(&mut plain, &app, &store);
    let hole = BlackHole::new(ports, Some(5432));
    // past the pool's tested-recently window: the check tests its connection
    std::thread::sleep(Duration::from_millis(600));
    let cut = Instant::now();
    let said = until_503(&admin, "/health", Duration::from_secs(6));
    let took = cut.elapsed();
    assert!(
        said["database"]
            .as_str()
            .is_some_and(|d| d.starts_with("no answer for ")),
        "{said}"
    );
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(4),
        "503 after {took:?}"
    );
    let (code, body) = probe_in_time(&admin, "/ready");
    assert_eq!(code, 503, "{body}");
    drop(hole);
    let back = Instant::now();
    wait_until("/health is 200 again", Duration::from_secs(20), || {
        probe_in_time(&admin, "/health").0 == 200
    });
    eprintln!(
        "database link black-holed: 503 after {took:?}, 200 again {:?} after the link came back",
        back.elapsed()
    );
    admin.shutdown();
}

/// A forwarder on a port of its own to `to`: black-holing its port (the
/// packets it sends: data and acknowledgements) cuts the link of whoever
/// connects through it, and of no one else.
struct Forward {
    port: u16,
    /// The connections it forwarded.
    forwarded: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// While true, it closes each connection it accepts (a service down).
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Forward {
    fn start(to: &str) -> Forward {
        Forward::far(to, Duration::ZERO)
    }

    /// A forwarder that delivers what it reads `delay` later, each way (a
    /// long link, not a narrow one).
    fn far(to: &str, delay: Duration) -> Forward {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let to = to.to_owned();
        let forward = Forward {
            port,
            forwarded: Default::default(),
            down: Default::default(),
        };
        let (forwarded, down) = (forward.forwarded.clone(), forward.down.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if down.load(std::sync::atomic::Ordering::SeqCst) {
                    continue;
                }
                forwarded.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let Ok(server) = std::net::TcpStream::connect(&to) else {
                    continue;
                };
                let _ = (client.set_nodelay(true), server.set_nodelay(true));
                let (Ok(c), Ok(s)) = (client.try_clone(), server.try_clone()) else {
                    continue;
                };
                for (from, into) in [(c, s), (server, client)] {
                    pipe(from, into, delay);
                }
            }
        });
        forward
    }
}

/// Copies `from` into `into`, each chunk `delay` after it was read.
fn pipe(mut from: std::net::TcpStream, mut into: std::net::TcpStream, delay: Duration) {
    use std::io::{Read, Write};
    let (tx, rx) = std::sync::mpsc::channel::<(Instant, Vec<u8>)>();
    let closer = from.try_clone();
    std::thread::spawn(move || {
        for (due, chunk) in rx {
            if let Some(wait) = due.checked_duration_since(Instant::now()) {
                std::thread::sleep(wait);
            }
            if into.write_all(&chunk).is_err() {
                break;
            }
        }
        let _ = into.shutdown(std::net::Shutdown::Both);
        if let Ok(from) = closer {
            let _ = from.shutdown(std::net::Shutdown::Both);
        }
    });
    std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n @ 1..) = from.read(&mut buf) {
            if tx
                .send((Instant::now() + delay, buf[..n].to_vec()))
                .is_err()
            {
                break;
            }
        }
    });
}

/// Whether `e` or an error of its source chain is a `T`.
fn caused_by<T: std::error::Error + 'static>(e: &txbox::Error) -> bool {
    let mut at: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(cause) = at {
        if cause.downcast_ref::<T>().is_some() {
            return true;
        }
        at = cause.source();
    }
    false
}

/// A library's error stays the source of the txbox error that wraps it
/// (0.3 kept its text only): a connect the server refuses, on PostgreSQL and
/// MySQL, carries the driver's error, which the caller can downcast to read
/// its codes; a TOML file that does not parse carries the parser's error
/// (line and column).
#[test]
fn a_library_s_error_is_the_source_of_the_one_that_wraps_it() {
    let e = Config::from_toml("[defaults\n").unwrap_err();
    assert!(matches!(e, txbox::Error::ConfigSyntax(_)), "{e:?}");
    assert!(std::error::Error::source(&e).is_some(), "{e:?}");
    // where, and no text of the file: the parser's own error quotes the
    // line and holds the whole input (a password in a URL, say)
    let text = "[defaults]\nbatch_size = 10\nnote = \"postgres://u:hunter2@db\n";
    let e = Config::from_toml(text).unwrap_err();
    assert!(e.to_string().contains("line 3"), "{e}");
    assert!(!format!("{e} {e:?}").contains("hunter2"), "{e:?}");

    let closed = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = Config::builder().build().unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{closed}/test?sslmode=disable");
    let e = txbox::PgStore::connect(&url, &config)
        .err()
        .expect("nothing listens");
    assert!(
        matches!(
            e,
            txbox::Error::Connect {
                source: Some(_),
                ..
            }
        ),
        "{e:?}"
    );
    assert!(caused_by::<postgres::Error>(&e), "{e:?}");

    let url = format!("mysql://root@127.0.0.1:{closed}/test?prefer_socket=false");
    let e = txbox::MySqlStore::connect(&url, &config)
        .err()
        .expect("nothing listens");
    assert!(caused_by::<mysql::Error>(&e), "{e:?}");
}

/// Five store calls in a row on `store`: each but the first takes
/// `round_trips` of 0.6 s (the forwarder's 300 ms each way), not one more.
fn calls_take(store: &dyn txbox::Store, round_trips: u32) {
    let rtt = Duration::from_millis(600);
    store.ping().unwrap();
    for _ in 0..4 {
        let t = Instant::now();
        store.ping().unwrap();
        let took = t.elapsed();
        assert!(
            took >= rtt * round_trips && took < rtt * round_trips + rtt * 2 / 3,
            "a call took {took:?}: not {round_trips} round trips"
        );
    }
}

/// A database 300 ms away each way: each store call is one round trip (0.6
/// s; two would be 1.2 s). PostgreSQL: the pool tests a connection that has
/// not answered for 0.5 s before it hands it out; it counted that from the
/// connection's check-out, so after any call longer than that (every call,
/// on such a link) the next one was tested first: two round trips per call,
/// and a relay drained 118 events/s to a database 200 ms away where it
/// drains 247 now (docs/BENCHMARKS.md).
#[test]
fn a_far_database_costs_one_round_trip_per_store_call() {
    let Some((_, _plain)) = fresh("t_far_") else {
        return;
    };
    let far = Forward::far("127.0.0.1:5432", Duration::from_millis(300));
    let url = format!(
        "postgres://postgres@127.0.0.1:{}/test?sslmode=disable",
        far.port
    );
    let config = Config::builder().table_prefix("t_far_").build().unwrap();
    calls_take(&txbox::PgStore::connect(&url, &config).unwrap(), 1);
}

/// The same on MySQL/MariaDB, where the driver's pool pings each connection
/// it hands out: two round trips a call (1.2 s), where it took five (3.0 s)
/// when the pool also reset each connection it took back
/// (`COM_RESET_CONNECTION`, the session's settings again, and every
/// statement prepared anew in the next call). The store's connections hold
/// no session state of their own and go back without it.
#[test]
fn a_far_mysql_costs_two_round_trips_per_store_call() {
    if !service_up("MariaDB", "127.0.0.1:3306") {
        return;
    }
    let far = Forward::far("127.0.0.1:3306", Duration::from_millis(300));
    // (the driver would swap a loopback TCP connection for the server's
    // socket, around the forwarder)
    let url = format!(
        "mysql://root@127.0.0.1:{}/test?prefer_socket=false",
        far.port
    );
    let config = Config::builder().table_prefix("t_far_my_").build().unwrap();
    calls_take(&txbox::MySqlStore::connect(&url, &config).unwrap(), 2);
}

/// A test's outbox (tables `p`) and a queue bound to a fresh exchange, with a
/// forwarder to RabbitMQ for the relay under test; `None` (the reason
/// printed) when a service is missing.
fn rabbit_through_forward(
    p: &str,
) -> Option<(
    std::sync::Arc<txbox::PgStore>,
    postgres::Client,
    String,
    String,
    Forward,
)> {
    let (store, plain) = fresh(p)?;
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return None;
    }
    let exchange = format!("txbox-{p}{}", unique());
    let queue = format!("{exchange}-q");
    durable_queue(&exchange, &queue, "e");
    Some((
        store,
        plain,
        exchange,
        queue,
        Forward::start("127.0.0.1:5672"),
    ))
}

/// Publishes `n` events of type `e` in one transaction; their ids go to `ids`.
fn publish_n(
    outbox: &Outbox,
    client: &mut postgres::Client,
    n: i32,
    ids: &mut Vec<txbox::EventId>,
) {
    let mut tx = client.transaction().unwrap();
    for i in 0..n {
        ids.push(outbox.publish(&mut tx, "e", &json!({ "n": i })).unwrap());
    }
    tx.commit().unwrap();
}

/// A relay of `config` on `store` with `sender`, and an admin endpoint that
/// probes it.
fn relay_with_admin(
    store: &std::sync::Arc<txbox::PgStore>,
    config: &Config,
    sender: impl SenderFactory + 'static,
) -> (Relay, txbox::admin::AdminServer) {
    relay_with(store, config, sender, txbox::admin::AdminOptions::new())
}

/// [`relay_with_admin`] with the admin's `options`.
fn relay_with(
    store: &std::sync::Arc<txbox::PgStore>,
    config: &Config,
    sender: impl SenderFactory + 'static,
    options: txbox::admin::AdminOptions,
) -> (Relay, txbox::admin::AdminServer) {
    let relay = Relay::start(store.clone(), config, sender).unwrap();
    let admin =
        txbox::admin::AdminServer::start(store.clone(), options.relay(relay.probe())).unwrap();
    (relay, admin)
}

/// Acks that stop coming make `/ready` say 503 on their own, before anything
/// gives the connection up: a heartbeat of 60 s keeps the black-holed AMQP
/// connection open for two minutes, and `acks_overdue_after` (1 s here, 10 s
/// by default) is what turns `/ready`. `/health` stays 200 (the relay runs);
/// the link back, the acks arrive on the same connection and `/ready` is 200
/// again. Before, `/ready` asked only the sender whether it was connected.
#[test]
fn acks_overdue_make_the_relay_not_ready_while_the_connection_stays_open() {
    let p = "t_part_acks_";
    let Some((store, mut plain, exchange, _queue, forward)) = rabbit_through_forward(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.destination(&exchange))
        .build()
        .unwrap();
    let url = format!("amqp://guest:guest@127.0.0.1:{}?heartbeat=60", forward.port);
    let sender = RabbitSender::builder(&url).build().unwrap();
    let options = txbox::admin::AdminOptions::new().acks_overdue_after(Duration::from_secs(1));
    let (relay, admin) = relay_with(&store, &config, sender, options);
    let outbox = Outbox::new(&config).unwrap();
    let mut ids = Vec::new();
    publish_n(&outbox, &mut plain, 10, &mut ids);
    wait_until("the first events sent", Duration::from_secs(10), || {
        count(&mut plain, p, "PROCESSED") == 10
    });
    assert_eq!(probe_in_time(&admin, "/ready").0, 200);

    let hole = BlackHole::new(vec![forward.port], None);
    let cut = Instant::now();
    publish_n(&outbox, &mut plain, 10, &mut ids);
    let said = until_503(&admin, "/ready", Duration::from_secs(5));
    let found = cut.elapsed();
    assert!(
        found < Duration::from_secs(3),
        "/ready 503 after {found:?}: {said}"
    );
    assert_eq!(said["relays"][0]["broker"], "acks overdue", "{said}");
    assert_eq!(said["relays"][0]["acks_overdue"], 1, "{said}");
    let (code, body) = probe_in_time(&admin, "/health");
    assert_eq!(code, 200, "{body}");
    drop(hole);
    wait_until(
        "the batch in the hole acked on the same connection",
        Duration::from_secs(10),
        || count(&mut plain, p, "PROCESSED") == 20,
    );
    wait_until("/ready is 200 again", Duration::from_secs(2), || {
        probe_in_time(&admin, "/ready").0 == 200
    });
    assert_eq!(
        forward.forwarded.load(std::sync::atomic::Ordering::SeqCst),
        1,
        "one connection throughout"
    );
    eprintln!("acks stopped: /ready 503 after {found:?}");
    relay.shutdown(Duration::from_secs(5)).unwrap();
    admin.shutdown();
}

/// A broker that stays unreachable for a while (each connection closed at
/// once) makes the poller's error backoff grow to its ceiling (5 s by
/// default); the
/// broker back, its events go out within about 2 s all the same: a poller
/// asks an unreachable broker again within a second, and the sender's own
/// backoff (at most 1 s) spaces the connects.
#[test]
fn a_broker_back_after_an_outage_gets_its_events_within_two_seconds() {
    let p = "t_part_back_";
    let Some((store, mut plain)) = fresh(p) else {
        return;
    };
    if !service_up("RabbitMQ", "127.0.0.1:5672") {
        return;
    }
    let exchange = format!("txbox-{p}{}", unique());
    durable_queue(&exchange, &format!("{exchange}-q"), "e");
    // the broker, down until it "comes back"
    let broker = Forward::start("127.0.0.1:5672");
    broker.down.store(true, std::sync::atomic::Ordering::SeqCst);
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.destination(&exchange))
        .build()
        .unwrap();
    let url = format!("amqp://guest:guest@127.0.0.1:{}", broker.port);
    let sender = RabbitSender::builder(&url).build().unwrap();
    let relay = Relay::start(store.clone(), &config, sender).unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut ids = Vec::new();
    publish_n(&outbox, &mut plain, 5, &mut ids);
    // the outage, long enough for the error backoff to reach its ceiling:
    // by that backoff alone the polls come at 0, 0.25, 0.75, 1.75, 3.75,
    // 7.75 and 12.75 s, and the next at 17.75 s, 3.75 s after the broker is
    // back at 14 s (measured so with the 1 s retry taken out)
    std::thread::sleep(Duration::from_secs(14));
    let waiting: i64 = plain
        .query_one(
            &format!(
                "SELECT count(*) FROM {p}outbox_events WHERE status = 'PENDING' AND attempts = 0"
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(waiting, 5, "waiting, no attempt counted");
    broker
        .down
        .store(false, std::sync::atomic::Ordering::SeqCst);
    let back = Instant::now();
    wait_until("the events sent", Duration::from_secs(10), || {
        count(&mut plain, p, "PROCESSED") == 5
    });
    let took = back.elapsed();
    eprintln!("broker back after 14 s: its events sent {took:?} later");
    assert!(
        took < Duration::from_millis(2500),
        "sent {took:?} after the broker came back"
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
}

/// The relay's RabbitMQ link drops everything for 15 s (a partition: no
/// reset, nothing answers, a new connection's SYN lost too). The batch sent
/// into it waits for acks: `/ready` says 503 within 10 s (acks overdue, then
/// the connection closed by its missed heartbeats, 5 s apart, and the broker
/// unreachable), every probe answering within a second, `/health` 200 (the
/// relay runs); the link back, the events published meanwhile are sent
/// within about 2 s (a connect attempt at most every 2 s), none lost, none
/// sent twice but the batch that was in the hole. A shutdown in the hole
/// returns within its deadline, the batch given back. Before, the
/// heartbeat was 60 s, `/ready` stayed 200 and a reconnect could wait 10 s.
#[test]
fn a_rabbitmq_link_that_drops_everything_is_found_in_seconds() {
    let p = "t_part_amqp_";
    let Some((store, mut plain, exchange, queue, forward)) = rabbit_through_forward(p) else {
        return;
    };
    let registry = std::sync::Arc::new(txbox::metrics::Registry::new());
    let config = Config::builder()
        .table_prefix(p)
        // the default polling: a poller's error backoff reaches 5 s, and an
        // unreachable broker is asked again within a second all the same
        .event("e", |e| e.destination(&exchange))
        .build()
        .unwrap()
        .observed(registry.clone());
    let url = format!("amqp://guest:guest@127.0.0.1:{}", forward.port);
    let sender = RabbitSender::builder(&url).build().unwrap();
    let (relay, admin) = relay_with_admin(&store, &config, sender);
    let outbox = Outbox::new(&config).unwrap();
    let mut ids = Vec::new();
    let mut publish =
        |client: &mut postgres::Client, n: i32| publish_n(&outbox, client, n, &mut ids);
    publish(&mut plain, 10);
    wait_until("the first events sent", Duration::from_secs(10), || {
        count(&mut plain, p, "PROCESSED") == 10
    });
    assert_eq!(probe_in_time(&admin, "/ready").0, 200);

    let hole = BlackHole::new(vec![forward.port], None);
    let cut = Instant::now();
    publish(&mut plain, 10);
    let said = until_503(&admin, "/ready", Duration::from_secs(20));
    let found = cut.elapsed();
    assert!(
        found < Duration::from_secs(12),
        "/ready 503 after {found:?}: {said}"
    );
    assert_ne!(said["relays"][0]["broker"], "ok", "{said}");
    // the probe says so to an embedding service's own endpoint too
    assert!(relay.probe().healthy() && !relay.probe().ready());
    // the relay runs: healthy, and not ready until the link is back
    while cut.elapsed() < Duration::from_secs(15) {
        let (code, body) = probe_in_time(&admin, "/health");
        assert_eq!(code, 200, "{body}");
        assert_eq!(probe_in_time(&admin, "/ready").0, 503);
        std::thread::sleep(Duration::from_millis(250));
    }
    assert_eq!(
        count(&mut plain, p, "PROCESSED"),
        10,
        "nothing acked through the hole"
    );
    // the metrics say so once the connection is given up
    let up = |registry: &txbox::metrics::Registry| registry.snapshot().broker_up.get("e").copied();
    wait_until(
        "the metrics say the broker is down",
        Duration::from_secs(10),
        || up(&registry) == Some(false),
    );
    assert!(registry
        .prometheus()
        .contains("txbox_broker_up{event_type=\"e\"} 0"));
    drop(hole);
    let back = Instant::now();
    wait_until(
        "the events published meanwhile sent",
        Duration::from_secs(15),
        || count(&mut plain, p, "PROCESSED") == 20,
    );
    let caught_up = back.elapsed();
    wait_until("/ready is 200 again", Duration::from_secs(5), || {
        probe_in_time(&admin, "/ready").0 == 200
    });
    assert!(relay.probe().ready());
    assert_eq!(
        up(&registry),
        Some(true),
        "the metrics say the broker is up"
    );
    eprintln!(
        "RabbitMQ link black-holed 15 s: /ready 503 after {found:?}, \
         caught up {caught_up:?} after the link came back"
    );
    assert!(
        caught_up < Duration::from_secs(3),
        "caught up after {caught_up:?}"
    );

    // a shutdown while the link drops everything returns within its
    // deadline, the batch in the hole given back (pending, no attempt)
    let hole = BlackHole::new(vec![forward.port], None);
    publish(&mut plain, 5);
    until_503(&admin, "/ready", Duration::from_secs(20));
    let t = Instant::now();
    let stopped = relay.shutdown(Duration::from_secs(2));
    let took = t.elapsed();
    assert!(
        took < Duration::from_millis(2500),
        "shutdown took {took:?}: {stopped:?}"
    );
    assert_eq!(
        count(&mut plain, p, "PENDING"),
        5,
        "given back: {stopped:?}"
    );
    drop(hole);
    admin.shutdown();
    // the batch sent into the hole reached the broker (only what comes back
    // was lost): sent again after the reconnect, it is there twice
    let sent = &ids[..20];
    let want = sent.iter().copied().collect();
    let tally = Tally::of(sent, read_rabbitmq_queue(&queue, &want, |_| {}));
    assert!(tally.lost().is_empty(), "lost {:?}", tally.lost());
    assert!(
        tally.duplicates() <= 10,
        "{} duplicates: more than the batch in the hole",
        tally.duplicates()
    );
    eprintln!("duplicates (the batch in the hole): {}", tally.duplicates());
}

/// Two relays share a type; A's RabbitMQ link drops everything. B goes on
/// sending, and takes A's batch once A gives it back (its confirm timeout,
/// 3 s: a lease must be longer than a sender's wait for acks); A neither
/// marks as sent what B sent nor wedges: the link back, it sends again.
/// Every event arrives; none twice but A's batch in the hole (the broker had it, its
/// acks were lost); none left claimed.
#[test]
fn two_relays_one_partitioned_lose_nothing_and_the_other_takes_over() {
    let p = "t_part_two_";
    let Some((store, mut plain, exchange, queue, forward)) = rabbit_through_forward(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| {
            e.adaptive_polling(Duration::from_millis(20), Duration::from_millis(200), 1.5)
                .lease(Duration::from_secs(5))
                .batch_size(20)
        })
        .event("e", |e| e.destination(&exchange))
        .maintenance(|m| m.recovery_interval(Duration::from_millis(300)))
        .build()
        .unwrap();
    let via = |port: u16| {
        RabbitSender::builder(&format!("amqp://guest:guest@127.0.0.1:{port}"))
            .confirm_timeout(Duration::from_secs(3))
            .build()
            .unwrap()
    };
    let a = Relay::start(store.clone(), &config, via(forward.port)).unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut ids = Vec::new();
    let mut publish =
        |client: &mut postgres::Client, n: i32| publish_n(&outbox, client, n, &mut ids);
    publish(&mut plain, 5);
    wait_until("A sends", Duration::from_secs(10), || {
        count(&mut plain, p, "PROCESSED") == 5
    });
    // A alone claims the next batch, into the hole
    let hole = BlackHole::new(vec![forward.port], None);
    publish(&mut plain, 10);
    wait_until("A claimed the batch", Duration::from_secs(5), || {
        count(&mut plain, p, "IN_PROCESS") == 10
    });
    let b = Relay::start(store.clone(), &config, via(5672)).unwrap();
    publish(&mut plain, 30);
    wait_until(
        "B sent its share, and A's batch A gave back",
        Duration::from_secs(20),
        || count(&mut plain, p, "PROCESSED") == 45,
    );
    drop(hole);
    publish(&mut plain, 20);
    wait_until("both send again", Duration::from_secs(15), || {
        count(&mut plain, p, "PROCESSED") == 65
    });
    a.shutdown(Duration::from_secs(10)).unwrap();
    b.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(count(&mut plain, p, "IN_PROCESS"), 0);
    assert_eq!(count(&mut plain, p, "PENDING"), 0);
    let want = ids.iter().copied().collect();
    let tally = Tally::of(&ids, read_rabbitmq_queue(&queue, &want, |_| {}));
    assert!(tally.lost().is_empty(), "lost {:?}", tally.lost());
    eprintln!(
        "two relays, A partitioned: {} events, {} duplicates (A's batch in the hole: 10)",
        ids.len(),
        tally.duplicates()
    );
    assert!(
        tally.duplicates() <= 10,
        "{} duplicates",
        tally.duplicates()
    );
}

/// The relay's PostgreSQL link drops everything for 15 s (its pool and its
/// listener reach the database through a forwarder whose port is
/// black-holed; the publishers do not). What the relay sends still arrives:
/// a claim may commit with its answer lost, its events left IN_PROCESS
/// under a lease of 60 s (`postgres_relay::connections` makes it happen
/// every time). The probes answer within a second throughout, `/health` says 503; the link
/// back, such a claim is given back at once, the events published meanwhile
/// are sent within 10 s (the pool's reconnects back off up to 5 s, and a
/// connect in flight waits for its SYN's retry; the time is printed), none
/// lost, and `/health` is 200 again.
#[test]
fn a_postgres_link_that_drops_everything_is_found_and_the_relay_catches_up() {
    let p = "t_part_pg_";
    let Some((_, mut plain)) = fresh(p) else {
        return;
    };
    let forward = Forward::start("127.0.0.1:5432");
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e| {
            e.adaptive_polling(Duration::from_millis(20), Duration::from_millis(200), 1.5)
                .lease(Duration::from_secs(60))
        })
        .event("e", |e| e)
        .build()
        .unwrap();
    let url = format!("postgres://postgres@127.0.0.1:{}/test", forward.port);
    let store = std::sync::Arc::new(txbox::PgStore::connect(&url, &config).unwrap());
    let sender = txbox::MemorySender::new();
    let (relay, admin) = relay_with_admin(&store, &config, sender.clone());
    let outbox = Outbox::new(&config).unwrap();
    let publish =
        |client: &mut postgres::Client, n: i32| publish_n(&outbox, client, n, &mut Vec::new());
    publish(&mut plain, 5);
    wait_until("the first events sent", Duration::from_secs(10), || {
        sender.len() == 5
    });
    wait_until("/health is 200", Duration::from_secs(10), || {
        probe_in_time(&admin, "/health").0 == 200
    });
    let hole = BlackHole::new(vec![forward.port], None);
    let cut = Instant::now();
    let (mut published, mut unhealthy, mut answer_lost) = (5, None, 0);
    while cut.elapsed() < Duration::from_secs(15) {
        publish(&mut plain, 1);
        published += 1;
        if probe_in_time(&admin, "/health").0 == 503 && unhealthy.is_none() {
            unhealthy = Some(cut.elapsed());
        }
        answer_lost = answer_lost.max(count(&mut plain, p, "IN_PROCESS"));
        std::thread::sleep(Duration::from_millis(500));
    }
    let unhealthy = unhealthy.expect("/health said 503 during the fault");
    drop(hole);
    let back = Instant::now();
    wait_until(
        "the events published meanwhile sent",
        Duration::from_secs(30),
        || count(&mut plain, p, "PROCESSED") == published,
    );
    let caught_up = back.elapsed();
    wait_until("/health is 200 again", Duration::from_secs(10), || {
        probe_in_time(&admin, "/health").0 == 200
    });
    eprintln!(
        "PostgreSQL link black-holed 15 s: /health 503 after {unhealthy:?}, {answer_lost} \
         events claimed with the answer lost, caught up {caught_up:?} after the link came back"
    );
    assert!(
        caught_up < Duration::from_secs(10),
        "caught up after {caught_up:?}"
    );
    relay.shutdown(Duration::from_secs(10)).unwrap();
    admin.shutdown();
}

/// With `ports` (the pool's, to the server's port) black-holed (after
/// `wait`), a `status` call on `store` returns after `min` (the black hole
/// was in its way) and before `max`; with them back, the next call succeeds.
fn status_through_black_hole(
    what: &str,
    store: std::sync::Arc<dyn txbox::FullStore>,
    ports: (Vec<u16>, u16),
    wait: Duration,
    min: Duration,
    max: Duration,
) {
    let hole = BlackHole::new(ports.0, Some(ports.1));
    std::thread::sleep(wait);
    let s = store.clone();
    let (_, took) = returns_within(Duration::from_secs(30), move || s.status().map(drop));
    assert!(
        took >= min,
        "{what}: the black hole was not in the way ({took:?})"
    );
    assert!(took < max, "{what}: took {took:?}");
    drop(hole);
    store.status().unwrap();
}
