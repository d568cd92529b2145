//! Publishing and configuration against a real PostgreSQL.

use std::time::Duration;

use crate::common::*;
use serde_json::json;
use txbox::{Config, Error, NewEvent, Outbox};

fn config(prefix: &str) -> Config {
    Config::builder()
        .table_prefix(prefix)
        .event("order-created", |e| e)
        .event("order-paid", |e| e)
        .max_payload_bytes(1000)
        .build()
        .unwrap()
}

#[test]
fn rollback_leaves_no_event_and_commit_makes_it_visible() {
    let p = "t_pub_rb_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    let outbox = Outbox::new(&config(p)).unwrap();

    let mut tx = client.transaction().unwrap();
    let rolled = outbox
        .publish(&mut tx, "order-created", &json!({"n": 1}))
        .unwrap();
    tx.rollback().unwrap();

    let mut tx = client.transaction().unwrap();
    let committed = outbox
        .publish(&mut tx, "order-created", &json!({"n": 2}))
        .unwrap();
    // not visible to others before commit
    let mut other = crate::common::client().unwrap();
    assert_eq!(count(&mut other, p, "PENDING"), 0);
    tx.commit().unwrap();

    let ids: Vec<uuid::Uuid> = client
        .query(&format!("SELECT id FROM {p}outbox_events"), &[])
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(ids, vec![committed.as_uuid()]);
    assert_ne!(rolled, committed);
    assert_eq!(committed.as_uuid().get_version_num(), 7, "ids are UUIDv7");
}

#[test]
fn batch_publish_keys_and_headers_are_stored() {
    let p = "t_pub_batch_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    let outbox = Outbox::new(&config(p)).unwrap();
    let mut tx = client.transaction().unwrap();
    let payloads: Vec<_> = (0..500).map(|i| json!({"i": i})).collect();
    let ids = outbox
        .publish_all(
            &mut tx,
            txbox::NewEvent::batch("order-created", &payloads).unwrap(),
        )
        .unwrap();
    let built = NewEvent::new("order-paid", &json!({"paid": true}))
        .unwrap()
        .key("order-7")
        .header("trace-id", "abc");
    let one = outbox.publish_all(&mut tx, [built]).unwrap()[0];
    assert!(outbox
        .publish_all(
            &mut tx,
            txbox::NewEvent::batch("order-created", Vec::<i32>::new()).unwrap()
        )
        .unwrap()
        .is_empty());
    tx.commit().unwrap();

    assert_eq!(ids.len(), 500);
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "UUIDv7 ids are ordered"
    );
    let rows = client
        .query(
            &format!("SELECT id, payload FROM {p}outbox_events WHERE event_type = 'order-created' ORDER BY id"),
            &[],
        )
        .unwrap();
    assert_eq!(rows.len(), 500);
    for (i, r) in rows.iter().enumerate() {
        assert_eq!(r.get::<_, uuid::Uuid>(0), ids[i].as_uuid());
        assert_eq!(r.get::<_, String>(1), format!("{{\"i\":{i}}}"));
    }
    let r = client
        .query_one(
            &format!("SELECT event_key, headers->>'trace-id', status, attempts FROM {p}outbox_events WHERE id = $1"),
            &[&one.as_uuid()],
        )
        .unwrap();
    assert_eq!(r.get::<_, Option<String>>(0).as_deref(), Some("order-7"));
    assert_eq!(r.get::<_, Option<String>>(1).as_deref(), Some("abc"));
    assert_eq!(r.get::<_, String>(2), "PENDING");
    assert_eq!(r.get::<_, i32>(3), 0);
}

#[test]
fn bad_input_is_a_clear_error_and_the_transaction_stays_usable() {
    let p = "t_pub_bad_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    let outbox = Outbox::new(&config(p)).unwrap();
    let mut tx = client.transaction().unwrap();

    let err = outbox
        .publish(&mut tx, "order-shipped", &json!({}))
        .unwrap_err();
    assert!(
        matches!(err, Error::UnknownEventType(ref t) if t == "order-shipped"),
        "{err}"
    );
    assert!(err.to_string().contains("\"order-shipped\""), "{err}");

    let err = outbox
        .publish(&mut tx, "order-created", &"x".repeat(2000))
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::PayloadTooLarge {
                size: 2002,
                max: 1000,
                ..
            }
        ),
        "{err}"
    );

    let mut bad_map = std::collections::HashMap::new();
    bad_map.insert(vec![1u8], 1); // JSON object keys must be strings
    let err = outbox
        .publish(&mut tx, "order-created", &bad_map)
        .unwrap_err();
    assert!(matches!(err, Error::Serialize { .. }), "{err}");

    let reserved = NewEvent::new("order-created", &1)
        .unwrap()
        .header("txbox-event-id", "x");
    let err = outbox.publish_all(&mut tx, [reserved]).unwrap_err();
    assert!(err.to_string().contains("reserved"), "{err}");

    // header names a broker cannot carry: longer than an AMQP short string, or
    // with a NUL (a Kafka consumer would read it cut short)
    for name in ["x".repeat(300), "a\0b".to_string(), String::new()] {
        let event = NewEvent::new("order-created", &1)
            .unwrap()
            .header(name.clone(), "v");
        let err = outbox.publish_all(&mut tx, [event]).unwrap_err();
        assert!(
            matches!(err, Error::InvalidEvent(_))
                && err
                    .to_string()
                    .contains("1 to 255 bytes without control characters"),
            "{name:?}: {err}"
        );
    }

    // bytes: a content type a broker header cannot carry, a second content
    // type in the headers, more bytes than allowed, an unknown type
    for ct in ["", "a\nb", "caf\u{e9}", &"x".repeat(256)] {
        let err = outbox
            .publish_bytes(&mut tx, "order-created", b"\xff", ct)
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidEvent(_))
                && err
                    .to_string()
                    .contains("1 to 255 printable ASCII characters"),
            "{ct:?}: {err}"
        );
    }
    // the content-type header is txbox's on every payload: a JSON event's own
    // would be its content type on Kafka and dropped on RabbitMQ
    let json_ct = NewEvent::new("order-created", &1)
        .unwrap()
        .header("content-type", "text/plain");
    let err = outbox.publish_all(&mut tx, [json_ct]).unwrap_err();
    assert!(
        matches!(err, Error::InvalidEvent(_)) && err.to_string().contains("\"content-type\""),
        "{err}"
    );
    // header values are bounded in total (an AMQP content header must fit one
    // frame): 64 KiB of names and values, and 8 bytes per header
    let big = NewEvent::new("order-created", &1)
        .unwrap()
        .header("a", "x".repeat(40_000))
        .header("b", "x".repeat(40_000));
    let err = outbox.publish_all(&mut tx, [big]).unwrap_err();
    assert!(
        matches!(err, Error::InvalidEvent(_)) && err.to_string().contains("65536"),
        "{err}"
    );
    // many tiny headers count their framing too
    let tiny = (0..10_000).fold(NewEvent::new("order-created", &1).unwrap(), |e, i| {
        e.header(format!("h{i}"), "")
    });
    let err = outbox.publish_all(&mut tx, [tiny]).unwrap_err();
    assert!(err.to_string().contains("65536"), "{err}");
    let fits = NewEvent::new("order-created", &1)
        .unwrap()
        .header("a", "x".repeat(65_536 - 1 - 8));
    outbox.publish_all(&mut tx, [fits]).unwrap();
    let twice = NewEvent::bytes("order-created", vec![0xff], "application/x-protobuf")
        .header("Content-Type", "text/plain");
    let err = outbox.publish_all(&mut tx, [twice]).unwrap_err();
    assert!(err.to_string().contains("\"Content-Type\""), "{err}");
    let err = outbox
        .publish_bytes(
            &mut tx,
            "order-created",
            &[0u8; 1001],
            "application/octet-stream",
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::PayloadTooLarge {
                size: 1001,
                max: 1000,
                ..
            }
        ),
        "{err}"
    );
    let err = outbox
        .publish_bytes(&mut tx, "order-shipped", &[1], "application/octet-stream")
        .unwrap_err();
    assert!(matches!(err, Error::UnknownEventType(_)), "{err}");

    // none of that touched the transaction: it still works and commits two
    // events, the second with the longest content type allowed and a space
    outbox
        .publish(&mut tx, "order-created", &json!({"ok": true}))
        .unwrap();
    let longest = format!("application/{} x", "y".repeat(241));
    assert_eq!(longest.len(), 255);
    outbox
        .publish_bytes(&mut tx, "order-created", &[0xff], &longest)
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(count(&mut client, p, "PENDING"), 3);
}

#[test]
fn bad_table_prefix_is_refused_everywhere() {
    for bad in ["x; DROP TABLE users; --", "1abc", "a-b", "a.b"] {
        let err = Config::builder().table_prefix(bad).build().unwrap_err();
        assert!(matches!(err, Error::InvalidIdentifier { .. }), "{err}");
        assert!(err.to_string().contains("invalid table prefix"), "{err}");
        let err = txbox::store::Tables::new(bad).unwrap_err();
        assert!(matches!(err, Error::InvalidIdentifier { .. }));
    }
    // a store is opened with a Config, whose prefix was checked when it was built
}

#[test]
fn bad_config_values_name_their_key_path() {
    let cases = [
        (
            "[events.order-created.polling]\nmultiplier = 0.5",
            "events.order-created.polling.multiplier must be between 1.0 and 100, not 0.5",
        ),
        (
            "[defaults]\nbatch_size = 0",
            "defaults.batch_size must be between 1 and 10000",
        ),
        (
            "[defaults.polling]\nmin = \"fast\"",
            "defaults.polling.min has invalid duration \"fast\"",
        ),
        (
            "[events.a.polling]\nstrategy = \"sometimes\"",
            "events.a.polling.strategy must be \"fixed\" or \"adaptive\"",
        ),
        (
            "[events.a.polling]\nmin = \"2m\"",
            "events.a.polling.max must be >= polling.min",
        ),
        (
            "[events.a.backoff]\ndelay = \"0\"",
            "events.a.backoff.delay must be > 0",
        ),
        (
            "[events.a.backoff]\njitter = 1.5",
            "events.a.backoff.jitter must be >= 0.0 and < 1.0",
        ),
        (
            "[events.a]\nin_flight = 0",
            "events.a.in_flight must be between 1 and 16",
        ),
        (
            "[events.a]\nlease = \"10ms\"",
            "events.a.lease must be between 1s and 24d, not 10ms",
        ),
        (
            "[events.a]\nclaim = \"locked\"",
            "events.a.claim must be \"lease\" or \"lock\", not \"locked\"",
        ),
        (
            "[maintenance]\ncleanup_interval = \"0\"",
            "maintenance.cleanup_interval must be more than 0 and at most 30d, not 0ns",
        ),
        (
            "[maintenance]\nmigrate_lock_timeout = \"0s\"",
            "maintenance.migrate_lock_timeout must be more than 0 and at most 30d, not 0ns",
        ),
        (
            "[maintenance]\ncompact_timeout = \"2m\"",
            "maintenance.compact_timeout must be more than 0 and at most 60s, not 120s",
        ),
        ("[maintenance]\ncompact = \"yes\"", "maintenance.compact"),
        (
            "table_prefix = \"no way\"",
            "invalid table prefix \"no way\"",
        ),
        (
            "[events]\norder-created = \"orders\"",
            "events.order-created is not valid",
        ),
        (
            "[events.a]\nwake = \"sometimes\"",
            "events.a.wake must be \"notify\" or \"poll\", not \"sometimes\"",
        ),
        (
            "[events.a]\nordering = \"keys\"",
            "events.a.ordering must be \"none\" or \"key\", not \"keys\"",
        ),
        (
            "[defaults]\non_poison = \"drop\"",
            "defaults.on_poison must be \"block\" or \"skip\", not \"drop\"",
        ),
    ];
    for (toml, want) in cases {
        let err = Config::from_toml(toml).unwrap_err().to_string();
        assert!(
            err.starts_with(want),
            "{toml:?}: got {err:?}, want {want:?}"
        );
    }
    let err = Config::from_toml("[defaults]\nbatchsize = 3")
        .unwrap_err()
        .to_string();
    assert!(err.contains("unknown field `batchsize`"), "{err}");

    let err = Config::builder()
        .event("x", |e| {
            e.adaptive_polling(Duration::from_millis(1), Duration::from_secs(1), 0.9)
        })
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "events.x.polling.multiplier must be between 1.0 and 100, not 0.9"
    );
}

/// Numbers that would overflow a duration, a thread name that cannot be one, a
/// lease PostgreSQL cannot hold: each refused with its key, its range and what was
/// given, never a panic later in a relay thread.
#[test]
fn hostile_config_values_are_refused_with_their_range() {
    let cases = [
        (
            "[defaults.polling]\nmultiplier = 1e300",
            "defaults.polling.multiplier must be between 1.0 and 100, not 1e300",
        ),
        (
            "[events.a.backoff]\nmultiplier = inf",
            "events.a.backoff.multiplier must be between 1.0 and 100, not inf",
        ),
        (
            "[events.a.backoff]\nmultiplier = nan",
            "events.a.backoff.multiplier must be between 1.0 and 100, not NaN",
        ),
        (
            "[events.a]\nlease = \"25d\"",
            "events.a.lease must be between 1s and 24d, not 2160000s",
        ),
        (
            "[events.a.polling]\nmax = \"2d\"",
            "events.a.polling.max must be more than 0 and at most 1d, not 172800s",
        ),
        (
            "[defaults.polling]\ninitial_delay = \"1000d\"",
            "defaults.polling.initial_delay must be at most 1d",
        ),
        (
            "[defaults.backoff]\ndelay = \"2d\"",
            "defaults.backoff.delay must be more than 0 and at most 1d",
        ),
        (
            "[dlq]\nmove_interval = \"31d\"",
            "dlq.move_interval must be more than 0 and at most 30d",
        ),
        (
            "[inbox]\nttl = \"4000d\"",
            "inbox.ttl must be more than 0 and at most 3650d",
        ),
        (
            "max_payload_bytes = 1000000000000",
            "max_payload_bytes must be between 1 and 268435456",
        ),
        (
            "[events.\"a\\u0000b\"]",
            "events.a\\0b event type must not contain control characters",
        ),
        ("[events.\"\"]", "events. event type must be 1 to 255 bytes"),
        (
            "[events.a]\ndestination = \"x\\u0007y\"",
            "events.a.destination must not contain control characters",
        ),
        (
            // the RabbitMQ sender reads it now (`[rabbitmq.routing_keys]`,
            // whose checks are rabbitmq::routing_keys_are_checked_where_read)
            "[events.a]\nrouting_key = \"k\\u001b[31m\"",
            "events.a.routing_key has moved to the RabbitMQ sender",
        ),
    ];
    for (toml, want) in cases {
        let err = Config::from_toml(toml).unwrap_err().to_string();
        assert!(
            err.starts_with(want),
            "{toml:?}: got {err:?}, want {want:?}"
        );
    }
    // the builder checks the same
    let err = Config::builder()
        .event("tab\there", |e| e)
        .build()
        .unwrap_err()
        .to_string();
    assert!(err.contains("must not contain control characters"), "{err}");
    let err = Config::builder()
        .defaults(|e| e.lease(Duration::MAX))
        .build()
        .unwrap_err()
        .to_string();
    assert!(
        err.starts_with("defaults.lease must be between 1s and 24d"),
        "{err}"
    );
}

#[test]
fn overrides_inherit_from_defaults() {
    let text = r#"
        [defaults]
        batch_size = 50
        max_retries = 7
        lease = "2m"
        [defaults.backoff]
        delay = "1s"
        enabled = false
        [events.a]
        [events.b]
        destination = "bees"
        batch_size = 10
        in_flight = 1
        claim = "lock"
        wake = "poll"
        ordering = "key"
        on_poison = "skip"
        [events.b.polling]
        strategy = "fixed"
        delay = "300ms"
        initial_delay = "1s"
        [events.b.backoff]
        multiplier = 2.0
        [kafka]
        "bootstrap.servers" = "broker:9092"
        "linger.ms" = 10
        "enable.idempotence" = true
        [maintenance]
        processed_ttl = "0s"
        "#;
    let config = Config::from_toml(text).unwrap();
    assert_eq!(
        config.maintenance().processed_ttl,
        Duration::ZERO,
        "zero: acked rows are deleted at once"
    );
    let a = config.event("a").unwrap();
    assert_eq!(
        (a.batch_size, a.max_retries, a.lease),
        (50, 7, Duration::from_secs(120))
    );
    assert_eq!(a.destination, None);
    assert_eq!(a.polling, txbox::EventSettings::default().polling);
    let b = config.event("b").unwrap();
    assert_eq!(b.destination.as_deref(), Some("bees"));
    assert_eq!(b.batch_size, 10);
    assert_eq!((a.in_flight, b.in_flight), (3, 1));
    assert_eq!(
        (a.claim, b.claim),
        (txbox::ClaimMode::Lease, txbox::ClaimMode::Lock)
    );
    assert_eq!((a.wake, b.wake), (txbox::Wake::Notify, txbox::Wake::Poll));
    assert_eq!(
        (a.ordering, a.on_poison),
        (txbox::EventOrder::None, txbox::OnPoison::Block),
        "the defaults"
    );
    assert_eq!(
        (b.ordering, b.on_poison),
        (txbox::EventOrder::Key, txbox::OnPoison::Skip)
    );
    assert_eq!(b.polling.strategy, txbox::PollingStrategy::Fixed);
    assert_eq!(b.polling.delay, Duration::from_millis(300));
    assert_eq!(b.polling.initial_delay, Duration::from_secs(1));
    assert_eq!(b.backoff.delay, Duration::from_secs(1));
    assert!(!b.backoff.enabled);
    assert_eq!(b.backoff.multiplier, 2.0);
    assert_eq!(b.max_retries, 7);
    // the [kafka] table is the Kafka module's
    #[cfg(feature = "kafka")]
    {
        let kafka = txbox::kafka::properties_from_toml(text).unwrap();
        assert_eq!(kafka["bootstrap.servers"], "broker:9092");
        assert_eq!(kafka["linger.ms"], "10");
        assert_eq!(kafka["enable.idempotence"], "true");
    }
    // built-in defaults
    let d = Config::builder().event("x", |e| e).build().unwrap();
    let x = d.event("x").unwrap();
    assert_eq!(d.maintenance().processed_ttl, Duration::from_secs(86_400));
    assert_eq!(x.batch_size, 200);
    assert_eq!(
        (x.polling.min, x.polling.max, x.polling.multiplier),
        (Duration::from_millis(250), Duration::from_secs(60), 1.5)
    );
    assert_eq!(x.in_flight, 3);
    assert_eq!(x.max_retries, 3);
    assert_eq!(
        (x.backoff.delay, x.backoff.multiplier),
        (Duration::from_secs(10), 3.0)
    );
    assert_eq!(x.lease, Duration::from_secs(300));
    assert!(d.require_event("nope").is_err());
}

/// `PgPrepared`: the same rows as `Outbox::publish`, written with a statement
/// prepared once; the same checks; a clear error on another connection.
#[test]
fn a_prepared_publisher_writes_the_same_rows_and_refuses_another_connection() {
    let p = "t_pub_prep_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    let outbox = Outbox::new(&config(p)).unwrap();
    let publisher = outbox.prepare_pg(&mut client).unwrap();

    let mut tx = client.transaction().unwrap();
    outbox
        .publish(
            &mut publisher.on(&mut tx),
            "order-created",
            &json!({"rolled": true}),
        )
        .unwrap();
    tx.rollback().unwrap();
    let mut tx = client.transaction().unwrap();
    let plain = outbox
        .publish(
            &mut publisher.on(&mut tx),
            "order-created",
            &json!({"n": 1}),
        )
        .unwrap();
    let built = NewEvent::new("order-paid", &json!({"paid": true}))
        .unwrap()
        .key("order-7")
        .header("trace-id", "abc");
    let keyed = outbox
        .publish_all(&mut publisher.on(&mut tx), [built])
        .unwrap()[0];
    // the same checks as the outbox's, and the transaction stays usable after them
    assert!(matches!(
        outbox.publish(&mut publisher.on(&mut tx), "order-lost", &1),
        Err(Error::UnknownEventType(t)) if t == "order-lost"
    ));
    assert!(matches!(
        outbox.publish(&mut publisher.on(&mut tx), "order-paid", &"x".repeat(2000)),
        Err(Error::PayloadTooLarge { .. })
    ));
    let batch = outbox
        .publish_all(
            &mut tx,
            txbox::NewEvent::batch("order-created", [1, 2]).unwrap(),
        )
        .unwrap();
    tx.commit().unwrap();

    let rows: Vec<(uuid::Uuid, String, Option<String>, String, String)> = client
        .query(
            &format!(
                "SELECT id, event_type, event_key, headers::text, payload FROM {p}outbox_events \
                 WHERE status = 'PENDING' ORDER BY id"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect();
    let expected = vec![
        (plain, "order-created", None, "{}", r#"{"n":1}"#),
        (
            keyed,
            "order-paid",
            Some("order-7"),
            r#"{"trace-id": "abc"}"#,
            r#"{"paid":true}"#,
        ),
        (batch[0], "order-created", None, "{}", "1"),
        (batch[1], "order-created", None, "{}", "2"),
    ];
    let expected: Vec<_> = expected
        .into_iter()
        .map(|(id, t, k, h, pl)| {
            (
                id.as_uuid(),
                t.to_string(),
                k.map(str::to_string),
                h.to_string(),
                pl.to_string(),
            )
        })
        .collect();
    assert_eq!(rows, expected, "the rolled-back event is not there");
    // the three single events went through the one prepared statement (PostgreSQL
    // counts the plans each execution used), the batch did not
    let executions: i64 = client
        .query_one(
            &format!(
                "SELECT coalesce(sum(generic_plans + custom_plans), 0)::int8 \
                 FROM pg_prepared_statements WHERE statement LIKE 'INSERT INTO {p}outbox_events%'"
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(executions, 3);

    // on a transaction of another client: a clear error, nothing written, and that
    // client goes on once the aborted transaction is rolled back
    let mut other = crate::common::client().unwrap();
    let mut tx = other.transaction().unwrap();
    let err = outbox
        .publish(
            &mut publisher.on(&mut tx),
            "order-created",
            &json!({"n": 2}),
        )
        .unwrap_err();
    assert!(
        err.is_retryable() && err.to_string().contains("PgPrepared"),
        "{err}"
    );
    tx.rollback().unwrap();
    let mut tx = other.transaction().unwrap();
    outbox
        .publish(&mut tx, "order-created", &json!({"n": 3}))
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(count(&mut client, p, "PENDING"), 5);
}

/// `prepare_pg_pooled`: the statement is kept with the pooled connection, prepared
/// once across check-outs, and prepared again after the session lost it.
#[test]
fn a_pooled_connection_keeps_its_prepared_publisher() {
    let p = "t_pub_pool_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    let outbox = Outbox::new(&config(p)).unwrap();
    // one connection, so every check-out is the same session
    let manager =
        r2d2_postgres::PostgresConnectionManager::new(pg_url().parse().unwrap(), postgres::NoTls);
    let pool = r2d2::Pool::builder().max_size(1).build(manager).unwrap();
    // (statements of this outbox prepared on the session, executions through them)
    let prepared = |c: &mut postgres::Client| -> (i64, i64) {
        let r = c
            .query_one(
                &format!(
                    "SELECT count(*), coalesce(sum(generic_plans + custom_plans), 0)::int8 \
                     FROM pg_prepared_statements \
                     WHERE statement LIKE 'INSERT INTO {p}outbox_events%'"
                ),
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1))
    };
    type Conn = r2d2::PooledConnection<r2d2_postgres::PostgresConnectionManager<postgres::NoTls>>;
    let publish = |conn: &mut Conn, n: i32| -> txbox::Result<()> {
        let publisher = outbox.prepare_pg_pooled(conn)?;
        let mut tx = conn.transaction()?;
        outbox.publish(
            &mut publisher.on(&mut tx),
            "order-created",
            &json!({ "n": n }),
        )?;
        tx.commit()?;
        Ok(())
    };
    for n in 0..3 {
        let mut conn = pool.get().unwrap();
        publish(&mut conn, n).unwrap();
        assert_eq!(prepared(&mut conn), (1, n as i64 + 1), "check-out {n}");
    }
    // the session forgets it: that publish fails by name and writes nothing, the
    // next check-out prepares again
    let mut conn = pool.get().unwrap();
    conn.batch_execute("DEALLOCATE ALL").unwrap();
    let err = publish(&mut conn, 3).unwrap_err();
    assert!(
        err.is_retryable() && err.to_string().contains("PgPrepared"),
        "{err}"
    );
    drop(conn);
    let mut conn = pool.get().unwrap();
    publish(&mut conn, 4).unwrap();
    assert_eq!(prepared(&mut conn), (1, 1));
    assert_eq!(count(&mut client, p, "PENDING"), 4);
}

/// A lock wait that timed out or a deadlock may succeed when tried again, a
/// duplicate key never: `Error::is_retryable` and the kind say which, on
/// PostgreSQL as on the other dialects.
#[test]
fn postgres_errors_say_whether_a_retry_may_succeed() {
    let (Some(mut a), Some(mut b)) = (crate::common::client(), crate::common::client()) else {
        return;
    };
    a.batch_execute(
        "CREATE TABLE IF NOT EXISTS t_err_kinds (id int PRIMARY KEY);
         INSERT INTO t_err_kinds VALUES (1) ON CONFLICT DO NOTHING",
    )
    .unwrap();
    let mut held = a.transaction().unwrap();
    held.batch_execute("SELECT id FROM t_err_kinds WHERE id = 1 FOR UPDATE")
        .unwrap();
    let waited = b
        .batch_execute(
            "SET lock_timeout = '50ms'; SELECT id FROM t_err_kinds WHERE id = 1 FOR UPDATE",
        )
        .unwrap_err();
    let waited = Error::from(waited);
    assert!(waited.is_retryable(), "lock timeout: {waited}");
    held.rollback().unwrap();
    b.batch_execute("RESET lock_timeout").unwrap();

    let duplicate = Error::from(
        b.batch_execute("INSERT INTO t_err_kinds VALUES (1)")
            .unwrap_err(),
    );
    assert!(!duplicate.is_retryable(), "{duplicate}");
    assert!(
        matches!(
            duplicate,
            Error::Database {
                kind: txbox::DatabaseErrorKind::UniqueViolation,
                ..
            }
        ),
        "{duplicate}"
    );
}
