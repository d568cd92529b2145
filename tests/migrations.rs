//! Migrations on a live database, against the real PostgreSQL, MariaDB and
//! SQLite: `migrate` at start-up must not stall the writers. A binary of its
//! own: its lock timeouts are short, and another test's migration or open
//! transaction beside it would make them miss.

mod common;

use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use crate::common::backend::{Backend, Fixture};
use txbox::{Config, Outbox};

/// One test of this binary at a time: PostgreSQL's migration lock is one
/// for the database, and an online index build waits for every transaction
/// open in it (another test's held one would make a timing fail).
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Instantiates each of the tests named on every dialect built in, with a
/// table prefix of its own (`mig_<tag>_<dialect>_`).
macro_rules! on_every_dialect {
    ($($test:ident => $tag:literal,)*) => {
        mod on_postgres {
            $(#[test]
            fn $test() {
                super::$test(super::Backend::Postgres, concat!("mig_", $tag, "_pg_"));
            })*
        }
        #[cfg(feature = "mysql")]
        mod on_mysql {
            $(#[test]
            fn $test() {
                super::$test(super::Backend::MySql, concat!("mig_", $tag, "_my_"));
            })*
        }
        #[cfg(feature = "sqlite")]
        mod on_sqlite {
            $(#[test]
            fn $test() {
                super::$test(super::Backend::Sqlite, concat!("mig_", $tag, "_lite_"));
            })*
        }
    };
}

on_every_dialect!(
    migrate_on_a_current_schema_waits_for_no_transaction => "live",
    an_upgrade_from_every_earlier_version_keeps_every_row => "from",
    two_processes_migrating_at_once => "two",
);

/// The schema versions `migrate` would run now on `fx`'s tables.
fn pending_versions(fx: &Fixture) -> Vec<i64> {
    let pending = fx.store.pending_migrations().unwrap();
    pending.iter().map(|m| m.version).collect()
}

/// Runs `during` while another connection holds a transaction that
/// published an event of type `e` (at most 20 s), and commits it after.
fn while_a_publish_is_open<R>(fx: &Fixture, outbox: &Outbox, during: impl FnOnce() -> R) -> R {
    let (opened_tx, opened) = channel();
    let (release_tx, release) = channel::<()>();
    std::thread::scope(|s| {
        let holder = s.spawn(move || {
            fx.in_tx(
                |tx| {
                    outbox.publish(tx, "e", &1).unwrap();
                    opened_tx.send(()).unwrap();
                    let _ = release.recv_timeout(Duration::from_secs(20));
                },
                |_| true,
            )
        });
        opened.recv().unwrap();
        let r = during();
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        r
    })
}

/// `migrate` on a current schema while another connection holds a
/// transaction that published (a slow business transaction when a new
/// instance starts in a rolling deploy): it returns at once, and a third
/// connection's publish commits meanwhile (SQLite has one writer at a time:
/// there only the first).
fn migrate_on_a_current_schema_waits_for_no_transaction(b: Backend, p: &str) {
    let _serial = serial();
    let Some(fx) = Fixture::new(b, p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    #[cfg(feature = "sqlite")]
    let one_writer = b == Backend::Sqlite;
    #[cfg(not(feature = "sqlite"))]
    let one_writer = false;
    while_a_publish_is_open(&fx, &outbox, || {
        let other = fx.another_store();
        let started = Instant::now();
        let (migrate_took, publish_took) = std::thread::scope(|s| {
            let migrating = s.spawn(move || other.migrate().map(|()| started.elapsed()));
            let publish_took = (!one_writer).then(|| {
                let t = Instant::now();
                fx.publish(&config, "e", 1, true);
                t.elapsed()
            });
            (migrating.join().unwrap().unwrap(), publish_took)
        });
        assert!(
            migrate_took < Duration::from_secs(1),
            "{b:?}: migrate on a current schema took {migrate_took:?} behind an open transaction"
        );
        if let Some(took) = publish_took {
            assert!(
                took < Duration::from_secs(2),
                "{b:?}: a publish meanwhile took {took:?}"
            );
        }
    });
}

/// An upgrade that must wait for a table's lock (an open transaction wrote
/// the outbox) gives up after `migrate_lock_timeout` with an error that says
/// so, instead of stalling every writer behind its wait; once the
/// transaction ended, the same upgrade goes through.
#[test]
fn postgres_an_upgrade_behind_an_open_transaction_gives_up_in_time() {
    let _serial = serial();
    let p = "mig_lock_pg_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .maintenance(|m| m.migrate_lock_timeout(Duration::from_secs(1)))
        .event("e", |e| e)
        .build()
        .unwrap();
    // schema 8 (and 9 and 10 after it) not applied yet: 8 alters the outbox table
    let mut c = crate::common::client().unwrap();
    c.batch_execute(&format!(
        "DELETE FROM {p}txbox_schema_version WHERE version >= 8"
    ))
    .unwrap();
    let store = txbox::PgStore::connect(&crate::common::pg_url(), &config).unwrap();
    let outbox = Outbox::new(&config).unwrap();
    while_a_publish_is_open(&fx, &outbox, || {
        let started = Instant::now();
        let err = txbox::Store::migrate(&store).unwrap_err();
        let took = started.elapsed();
        assert!(took < Duration::from_secs(3), "gave up after {took:?}");
        let text = err.to_string();
        assert!(
            text.contains("schema version 8")
                && text.contains("gave up waiting for a lock")
                && text.contains("migrate_lock_timeout"),
            "{text}"
        );
    });
    txbox::Store::migrate(&store).unwrap();
    let latest: i32 = c
        .query_one(
            &format!("SELECT max(version) FROM {p}txbox_schema_version"),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(latest, 10);
}

/// A wake-up trigger disabled by hand stays disabled through schema 8, which
/// makes it anew (without its WHEN clause): `migrate` never turns the
/// notifications on again, and its commits send none. One enabled for
/// replicas comes back so, and one dropped by hand stays dropped.
#[test]
fn postgres_schema_8_keeps_the_wake_ups_state() {
    let _serial = serial();
    let p = "mig_wake8_pg_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap();
    let trigger = |c: &mut postgres::Client| -> (String, bool) {
        let row = c
            .query_one(
                "SELECT tgenabled::text, tgqual IS NULL FROM pg_trigger \
                 WHERE tgname = $1 AND tgrelid = to_regclass($2)",
                &[
                    &format!("{p}outbox_events_wake"),
                    &format!("{p}outbox_events"),
                ],
            )
            .unwrap();
        (row.get(0), row.get(1))
    };
    let mut c = crate::common::client().unwrap();
    c.batch_execute(&format!(
        "ALTER TABLE {p}outbox_events DISABLE TRIGGER {p}outbox_events_wake; \
         DELETE FROM {p}txbox_schema_version WHERE version >= 8"
    ))
    .unwrap();
    assert_eq!(pending_versions(&fx), [8, 9, 10]);
    fx.store.migrate().unwrap();
    assert!(fx.store.pending_migrations().unwrap().is_empty());
    assert_eq!(
        trigger(&mut c),
        ("D".to_string(), true),
        "made anew without WHEN, and still disabled"
    );
    let mut listening = crate::common::listening(p);
    fx.publish(&config, "e", 1, true);
    let got = crate::common::heard(&mut listening, Duration::from_millis(500));
    assert!(got.is_empty(), "a disabled wake-up notified: {got:?}");
    // enabled again by hand, the new trigger notifies
    c.batch_execute(&format!(
        "ALTER TABLE {p}outbox_events ENABLE TRIGGER {p}outbox_events_wake"
    ))
    .unwrap();
    fx.publish(&config, "e", 1, true);
    let got = crate::common::heard(&mut listening, Duration::from_millis(1000));
    assert_eq!(got, ["e"]);
    // enabled for replicas only, it comes back so
    c.batch_execute(&format!(
        "ALTER TABLE {p}outbox_events ENABLE REPLICA TRIGGER {p}outbox_events_wake; \
         DELETE FROM {p}txbox_schema_version WHERE version >= 8"
    ))
    .unwrap();
    fx.store.migrate().unwrap();
    assert_eq!(trigger(&mut c), ("R".to_string(), true));
    // dropped by hand, it stays dropped
    c.batch_execute(&format!(
        "DROP TRIGGER {p}outbox_events_wake ON {p}outbox_events; \
         DELETE FROM {p}txbox_schema_version WHERE version >= 8"
    ))
    .unwrap();
    fx.store.migrate().unwrap();
    assert!(fx.store.pending_migrations().unwrap().is_empty());
    let left: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_trigger WHERE tgrelid = to_regclass($1) AND NOT tgisinternal",
            &[&format!("{p}outbox_events")],
        )
        .unwrap()
        .get(0);
    assert_eq!(left, 0, "a dropped wake-up was made again");
}

/// A version that cannot be read (here a role without the grant) is an
/// error, not taken for a database without tables: `pending_migrations`
/// listed every file, and `migrate` ran them all again.
#[test]
fn postgres_a_version_that_cannot_be_read_is_an_error() {
    let _serial = serial();
    let p = "mig_grant_pg_";
    let Some(_fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let mut c = crate::common::client().unwrap();
    c.batch_execute(
        "DO $$ BEGIN CREATE ROLE txbox_no_grant LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$",
    )
    .unwrap();
    let config = Config::builder().table_prefix(p).build().unwrap();
    let url = crate::common::pg_url().replacen("postgres@", "txbox_no_grant@", 1);
    assert!(url.contains("txbox_no_grant@"), "{url}");
    let store = txbox::PgStore::connect(&url, &config).unwrap();
    for e in [
        txbox::Store::pending_migrations(&store)
            .map(|m| m.len())
            .unwrap_err(),
        txbox::Store::migrate(&store).unwrap_err(),
    ] {
        assert!(e.to_string().contains("permission denied"), "{e}");
    }
}

/// Runs `migrate` on a thread of its own, waits until one of its statements
/// whose text is `like` (a LIKE pattern) waits, for a lock or in a sleep,
/// and then publishes one event of type `e`. Returns what `migrate`
/// returned, how long the publish took, and the id of its event.
fn publish_while_migrate_waits<R: Send>(
    fx: &Fixture,
    config: &Config,
    like: &str,
    migrate: impl FnOnce() -> R + Send,
) -> (R, Duration, Vec<txbox::EventId>) {
    let mut c = crate::common::client().unwrap();
    std::thread::scope(|s| {
        let migrating = s.spawn(migrate);
        crate::common::wait_until("the migration waits", Duration::from_secs(10), || {
            let waiting: i64 = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity WHERE query LIKE $1 \
                     AND (wait_event_type = 'Lock' OR wait_event = 'PgSleep')",
                    &[&like],
                )
                .unwrap()
                .get(0);
            waiting > 0
        });
        let t = Instant::now();
        let new = fx.publish(config, "e", 1, true);
        let took = t.elapsed();
        (migrating.join().unwrap(), took, new)
    })
}

/// An upgrade's index build on a table that exists (PostgreSQL, `CREATE
/// INDEX CONCURRENTLY`) lets publishes commit while it waits, and a build
/// that stopped (here its lock timeout, behind a transaction holding an old
/// snapshot: a report, a backup) leaves an INVALID index that the next
/// `migrate` drops and builds again before it records the version.
#[test]
fn postgres_an_index_build_blocks_no_writer_and_an_invalid_one_is_built_again() {
    let _serial = serial();
    let p = "mig_cic_pg_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .maintenance(|m| m.migrate_lock_timeout(Duration::from_secs(2)))
        .event("e", |e| e)
        .build()
        .unwrap();
    let mut c = crate::common::client().unwrap();
    // schema 7 without its last index and unrecorded (and the versions
    // after it): its upgrade builds it
    c.batch_execute(&format!(
        "DROP INDEX {p}outbox_key_seq_idx; \
         DELETE FROM {p}txbox_schema_version WHERE version >= 7"
    ))
    .unwrap();
    let valid = |c: &mut postgres::Client| -> Option<bool> {
        c.query_opt(
            "SELECT indisvalid FROM pg_index WHERE indexrelid = to_regclass($1)",
            &[&format!("{p}outbox_key_seq_idx")],
        )
        .unwrap()
        .map(|r| r.get(0))
    };
    let store = txbox::PgStore::connect(&crate::common::pg_url(), &config).unwrap();
    let mut old = crate::common::client().unwrap();
    old.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1")
        .unwrap();
    let like = format!("CREATE INDEX CONCURRENTLY IF NOT EXISTS {p}outbox_key_seq_idx%");
    let (migrated, publish_took, _) =
        publish_while_migrate_waits(&fx, &config, &like, || txbox::Store::migrate(&store));
    assert!(
        publish_took < Duration::from_secs(1),
        "a publish waited {publish_took:?} for the index build"
    );
    let text = migrated.unwrap_err().to_string();
    assert!(
        text.contains("schema version 7") && text.contains("gave up waiting for a lock"),
        "{text}"
    );
    assert_eq!(
        valid(&mut c),
        Some(false),
        "the stopped build left it INVALID"
    );
    assert_eq!(
        pending_versions(&fx),
        [7, 8, 9, 10],
        "7 (and 8 to 10 after it) still to run"
    );
    old.batch_execute("COMMIT").unwrap();
    txbox::Store::migrate(&store).unwrap();
    assert_eq!(valid(&mut c), Some(true), "built again");
    assert!(fx.store.pending_migrations().unwrap().is_empty());
}

/// Schema 7 numbers the waiting events in a transaction of its own, after
/// the column: publishes commit while it runs (made slow here by a trigger
/// that sleeps for each row it numbers), where before the outbox stayed
/// locked from the column to the end (publishes waited for the whole
/// numbering); the events there before are numbered below the one published
/// meanwhile, and that one below the next.
#[test]
fn postgres_publishes_go_on_while_schema_7_numbers_the_waiting_events() {
    let _serial = serial();
    let p = "mig_num_pg_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    schema_at(&fx, 6);
    let config = Config::builder()
        .table_prefix(p)
        .maintenance(|m| m.migrate_lock_timeout(Duration::from_secs(10)))
        .event("e", |e| e)
        .build()
        .unwrap();
    let old = fx.publish(&config, "e", 3, true);
    // 0.7 s for each event the upgrade numbers
    fx.execute(&format!(
        "CREATE OR REPLACE FUNCTION {p}slow() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
           PERFORM pg_sleep(0.7); RETURN NEW; END $$; \
         CREATE TRIGGER {p}slow BEFORE UPDATE ON {p}outbox_events FOR EACH ROW \
           WHEN (current_query() LIKE 'UPDATE %SET seq%') EXECUTE FUNCTION {p}slow()"
    ));
    let (migrated, publish_took, new) =
        publish_while_migrate_waits(&fx, &config, "UPDATE %outbox_events o SET seq%", || {
            fx.store.migrate()
        });
    let mut c = crate::common::client().unwrap();
    migrated.unwrap();
    assert!(
        publish_took < Duration::from_secs(1),
        "a publish waited {publish_took:?} for the numbering"
    );
    let mut seq = |id: txbox::EventId| -> i64 {
        c.query_one(
            &format!("SELECT seq FROM {p}outbox_events WHERE id = $1"),
            &[&id.as_uuid()],
        )
        .unwrap()
        .get(0)
    };
    let after = fx.publish(&config, "e", 1, true);
    let numbers: Vec<i64> = old
        .iter()
        .chain(&new)
        .chain(&after)
        .map(|id| seq(*id))
        .collect();
    assert!(
        numbers.windows(2).all(|w| w[0] < w[1]),
        "in insert order: {numbers:?}"
    );
}

/// The tables of `fx`'s prefix made again as a txbox at schema `version`
/// made them (0: txbox 0.1, which had no version table), from the files
/// `migrate` runs: the ones of that version and before. MySQL's baseline
/// took the server's character set until schema 5 made it utf8mb4.
fn schema_at(fx: &Fixture, version: usize) {
    let p = &fx.prefix;
    let drop: Vec<String> = crate::common::backend::TABLES
        .iter()
        .chain(&["outbox_quiet_types", "outbox_seq"])
        .map(|t| format!("DROP TABLE IF EXISTS {p}{t}"))
        .collect();
    fx.execute_all(&drop);
    let files = fx.store.pending_migrations().unwrap();
    assert_eq!(
        files[0].version, 1,
        "every file on a database without tables"
    );
    for file in files.iter().take(version.max(1)) {
        let mut sql = file.statements();
        if version == 0 {
            sql.retain(|s| !s.contains("txbox_schema_version"));
        }
        #[cfg(feature = "mysql")]
        if fx.backend == Backend::MySql && file.version == 1 && version < 5 {
            for s in &mut sql {
                *s = s.replace(" DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin", "");
            }
        }
        fx.execute_all(&sql);
    }
}

/// An event id as a literal of `fx`'s dialect.
fn id_sql(fx: &Fixture, id: txbox::EventId) -> String {
    match fx.backend {
        #[cfg(feature = "mysql")]
        Backend::MySql => format!("X'{}'", id.as_uuid().simple()),
        _ => format!("'{id}'"),
    }
}

/// From every earlier schema version of each dialect (0.1's and each one
/// after), with rows of every kind made as that version had them (keyed
/// events waiting, a key held by a dead letter, one event sent, one failed,
/// one in process past its lease, inbox ids), `migrate` to the current
/// schema: every row is there as it was; a key's waiting events go out in
/// their order, one at a time, before one published after the upgrade; the
/// dead letter still holds its key and, retried, goes first; the one in
/// process comes back after its lease, the failed one through the dead
/// letters; the inbox still knows its ids.
fn an_upgrade_from_every_earlier_version_keeps_every_row(b: Backend, p: &str) {
    let _serial = serial();
    use txbox::store::{ClaimArgs, Outcome};
    let Some(current) = Fixture::new(b, p) else {
        return;
    };
    let versions = current.store.pending_migrations().map_or(0, |m| m.len());
    let latest = {
        current.execute(&format!("DELETE FROM {p}txbox_schema_version"));
        current.store.pending_migrations().unwrap().len()
    };
    assert!(versions == 0 && latest >= 5, "{b:?}: {latest} schema files");
    for version in 0..latest {
        let p = format!("{p}{version}_");
        let Some(fx) = Fixture::new(b, &p) else {
            return;
        };
        schema_at(&fx, version);
        let config = Config::builder()
            .table_prefix(&p)
            .event("k", |e| e.ordering(txbox::EventOrder::Key))
            .event("u", |e| e)
            .build()
            .unwrap();
        let keyed = |key: &str, from: usize, n: usize| {
            (from..from + n)
                .map(|i| {
                    txbox::NewEvent::new("k", &i)
                        .unwrap()
                        .key(key)
                        .header("n", i.to_string())
                })
                .collect::<Vec<_>>()
        };
        let poisoned = fx.publish_events(&config, keyed("order-2", 0, 2));
        let waiting = fx.publish_events(&config, keyed("order-1", 0, 3));
        let unordered = fx.publish(&config, "u", 4, true);
        let id = |i: txbox::EventId| id_sql(&fx, i);
        let (sent, failed, in_process) = (unordered[0], unordered[1], unordered[2]);
        let consumer = if version >= 2 { ", consumer" } else { "" };
        let billing = if version >= 2 { ", 'billing'" } else { "" };
        fx.execute_all(&[
            format!(
                "UPDATE {p}outbox_events SET status = 'PROCESSED', processed_at = created_at \
                 WHERE id = {}",
                id(sent)
            ),
            format!(
                "UPDATE {p}outbox_events SET status = 'FAILED', attempts = 1, \
                 last_error = 'refused' WHERE id = {}",
                id(failed)
            ),
            format!(
                "UPDATE {p}outbox_events SET status = 'IN_PROCESS', claim_token = id, \
                 lease_until = created_at WHERE id = {}",
                id(in_process)
            ),
            format!(
                "INSERT INTO {p}outbox_dead_letters (id, event_type, event_key, headers, payload, \
                 attempts, last_error, status, created_at, moved_at, updated_at) \
                 SELECT id, event_type, event_key, headers, payload, 1, 'poison', 'DEAD', \
                 created_at, created_at, created_at FROM {p}outbox_events WHERE id = {}",
                id(poisoned[0])
            ),
            format!(
                "DELETE FROM {p}outbox_events WHERE id = {}",
                id(poisoned[0])
            ),
            format!(
                "INSERT INTO {p}inbox_consumed (event_id, consumed_at{consumer}) \
                 SELECT id, created_at{billing} FROM {p}outbox_events WHERE id IN ({}, {})",
                id(sent),
                id(failed)
            ),
        ]);

        let s = &fx.store;
        s.migrate().unwrap();
        let from = format!("{b:?} from schema {version}");
        assert!(s.pending_migrations().unwrap().is_empty(), "{from}");
        let counts = |t: &str| fx.counts(t);
        assert_eq!((counts("k").pending, counts("u").pending), (4, 1), "{from}");
        assert_eq!(
            (counts("u").in_process, counts("u").failed),
            (1, 1),
            "{from}"
        );
        assert!(
            s.inbox_insert("billing", &[sent, failed])
                .unwrap()
                .is_empty(),
            "{from}: still consumed"
        );
        let dlq = txbox::Dlq::new(s.clone());
        let dead = dlq.get(poisoned[0]).unwrap();
        assert_eq!(
            (dead.key.as_deref(), dead.payload_str(), dead.attempts),
            (Some("order-2"), Some("0"), 1),
            "{from}"
        );

        // the key: its waiting events in order, each as it was published,
        // then one published now
        let later = fx.publish_events(&config, keyed("order-1", 3, 1));
        let ordered =
            ClaimArgs::new("k", 100, Duration::from_secs(60)).ordered(txbox::OnPoison::Block);
        let mut out = Vec::new();
        for n in 0..4 {
            let token = uuid::Uuid::now_v7();
            let got = s.claim_after(&ordered, token).unwrap();
            assert_eq!(got.len(), 1, "{from}: one event of the key at a time");
            let e = &got[0];
            assert_eq!(e.key.as_deref(), Some("order-1"), "{from}");
            assert_eq!(e.payload_str(), Some(n.to_string().as_str()), "{from}");
            assert_eq!(e.headers["n"], n.to_string(), "{from}");
            s.finish(token, &[(e.id, Outcome::Sent)]).unwrap();
            out.push(e.id);
        }
        assert_eq!(out, [waiting, later].concat(), "{from}");
        // the dead letter still holds its key; retried, it goes first
        let token = uuid::Uuid::now_v7();
        assert!(
            s.claim_after(&ordered, token).unwrap().is_empty(),
            "{from}: held back"
        );
        dlq.retry(poisoned[0]).unwrap();
        assert_eq!(s.requeue_dlq_retries(100).unwrap(), 1);
        for want in &poisoned {
            let token = uuid::Uuid::now_v7();
            let got = s.claim_after(&ordered, token).unwrap();
            let ids: Vec<_> = got.iter().map(|e| e.id).collect();
            assert_eq!(ids, vec![*want], "{from}");
            s.finish(token, &[(*want, Outcome::Sent)]).unwrap();
        }

        // the one in process comes back (its lease is over); the failed one
        // goes through the dead letters and back
        assert_eq!(s.recover_expired(100).unwrap(), 1, "{from}");
        assert_eq!(s.move_failed_to_dlq(100).unwrap(), 1, "{from}");
        dlq.retry(failed).unwrap();
        assert_eq!(s.requeue_dlq_retries(100).unwrap(), 1, "{from}");
        let token = uuid::Uuid::now_v7();
        let lease = Duration::from_secs(60);
        let mut got: Vec<_> = s
            .claim_after(&ClaimArgs::new("u", 100, lease), token)
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        got.sort();
        let mut want = vec![unordered[3], in_process, failed];
        want.sort();
        assert_eq!(got, want, "{from}: the rest of the unordered events");
    }
}

/// The MariaDB of `.ci/services.sh` whose server character set is latin1.
#[cfg(feature = "mysql")]
const LATIN1_URL: &str = "mysql://root@127.0.0.1:3308/test";

/// A connection to the latin1 server after dropping `prefix`'s tables; `None`
/// (printed) when it is not running outside CI.
#[cfg(feature = "mysql")]
fn latin1_server(prefix: &str) -> Option<mysql::PooledConn> {
    use mysql::prelude::Queryable;
    if !crate::common::service_up("MariaDB latin1", "127.0.0.1:3308") {
        return None;
    }
    let mut c = mysql::Pool::new(LATIN1_URL).unwrap().get_conn().unwrap();
    for t in crate::common::backend::TABLES {
        c.query_drop(format!("DROP TABLE IF EXISTS {prefix}{t}"))
            .unwrap();
    }
    Some(c)
}

/// On a server whose default character set is latin1, text in any script
/// goes in and comes out as it was published: payloads, headers, keys.
#[cfg(feature = "mysql")]
#[test]
fn mysql_tables_take_any_text_on_a_latin1_server() {
    let _serial = serial();
    let p = "mig_latin1_new_";
    let Some(_c) = latin1_server(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap();
    let store = txbox::MySqlStore::connect(LATIN1_URL, &config).unwrap();
    txbox::Store::migrate(&store).unwrap();
    let pool = mysql::Pool::new(LATIN1_URL).unwrap();
    let mut conn = pool.get_conn().unwrap();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    let text = "注文 🎉 café";
    let e = txbox::NewEvent::new("e", &serde_json::json!({ "note": text }))
        .unwrap()
        .key("キー-🔑")
        .header("memo", "日本語 ✓");
    Outbox::new(&config)
        .unwrap()
        .publish_all(&mut tx, [e])
        .unwrap();
    tx.commit().unwrap();
    let got = txbox::store::ClaimStore::claim(
        &store,
        "e",
        10,
        Duration::from_secs(60),
        uuid::Uuid::now_v7(),
    )
    .unwrap();
    assert_eq!(got.len(), 1);
    let v: serde_json::Value = serde_json::from_slice(&got[0].payload).unwrap();
    assert_eq!(v["note"], text);
    assert_eq!(got[0].key.as_deref(), Some("キー-🔑"));
    assert_eq!(got[0].headers["memo"], "日本語 ✓");
}

/// Tables an earlier txbox made on a latin1 server (schema 2, latin1 text)
/// with a key in them: after `migrate` the old event's key and the same key
/// published now are one key, whose events go out one at a time, in order.
#[cfg(feature = "mysql")]
#[test]
fn mysql_an_upgraded_latin1_table_keeps_each_key_one_key() {
    let _serial = serial();
    use mysql::prelude::Queryable;
    let p = "mig_latin1_old_";
    let Some(mut c) = latin1_server(p) else {
        return;
    };
    // schema 2 as an earlier txbox made it: its tables took the server's
    // character set
    let old = |sql: &str| -> Vec<String> {
        sql.replace("{prefix}", p)
            .lines()
            .map(|l| l.split("--").next().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("\n")
            .replace(" DEFAULT CHARSET = utf8mb4 COLLATE = utf8mb4_bin", "")
            .split(';')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect()
    };
    for s in old(include_str!("../sql/mysql/001_schema.sql"))
        .into_iter()
        .chain(old(include_str!("../sql/mysql/002_inbox_per_consumer.sql")))
    {
        c.query_drop(s).unwrap();
    }
    let charset: String = c
        .query_first(format!(
            "SELECT CCSA.character_set_name FROM information_schema.TABLES T \
             JOIN information_schema.COLLATION_CHARACTER_SET_APPLICABILITY CCSA \
               ON CCSA.collation_name = T.table_collation \
             WHERE T.table_schema = 'test' AND T.table_name = '{p}outbox_events'"
        ))
        .unwrap()
        .unwrap();
    assert_eq!(charset, "latin1", "the old table took the server's default");
    let old_id = txbox::EventId::new();
    c.exec_drop(
        format!(
            "INSERT INTO {p}outbox_events (id, event_type, event_key, headers, payload, next_attempt_at, created_at) \
             VALUES (?, 'e', 'café', '{{}}', '\"old\"', UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))"
        ),
        (old_id.as_uuid().as_bytes().to_vec(),),
    )
    .unwrap();
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.ordering(txbox::EventOrder::Key))
        .build()
        .unwrap();
    let store = txbox::MySqlStore::connect(LATIN1_URL, &config).unwrap();
    txbox::Store::migrate(&store).unwrap();
    let pool = mysql::Pool::new(LATIN1_URL).unwrap();
    let mut conn = pool.get_conn().unwrap();
    let mut tx = conn.start_transaction(mysql::TxOpts::default()).unwrap();
    let new = txbox::NewEvent::new("e", &"new").unwrap().key("café");
    let new_id = Outbox::new(&config)
        .unwrap()
        .publish_all(&mut tx, [new])
        .unwrap()[0];
    tx.commit().unwrap();
    let args = txbox::store::ClaimArgs::new("e", 10, Duration::from_secs(60))
        .ordered(txbox::OnPoison::Block);
    for want in [old_id, new_id] {
        let token = uuid::Uuid::now_v7();
        let got = txbox::store::ClaimStore::claim_after(&store, &args, token).unwrap();
        let ids: Vec<_> = got.iter().map(|e| e.id).collect();
        assert_eq!(ids, vec![want], "one key, one event at a time, in order");
        assert_eq!(got[0].key.as_deref(), Some("café"));
        txbox::store::ClaimStore::finish(&store, token, &[(want, txbox::store::Outcome::Sent)])
            .unwrap();
    }
}

/// The child of [`two_processes_migrating_at_once`]: migrates the tables of
/// `TXBOX_MIGRATE_PREFIX` on `TXBOX_MIGRATE_BACKEND` once it is told to go.
#[test]
#[ignore = "the migrating child process of the concurrent migration tests"]
fn migrate_child_process() {
    let (Ok(prefix), Ok(backend)) = (
        std::env::var("TXBOX_MIGRATE_PREFIX"),
        std::env::var("TXBOX_MIGRATE_BACKEND"),
    ) else {
        return; // only as a child process
    };
    // the name `Backend`'s Debug gives
    let backend = match backend.as_str() {
        #[cfg(feature = "mysql")]
        "MySql" => Backend::MySql,
        #[cfg(feature = "sqlite")]
        "Sqlite" => Backend::Sqlite,
        _ => Backend::Postgres,
    };
    let fx = Fixture::new_existing(backend, &prefix);
    // both children start their migration at the same moment
    let go: u128 = std::env::var("TXBOX_MIGRATE_AT").unwrap().parse().unwrap();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis();
    std::thread::sleep(Duration::from_millis(go.saturating_sub(now) as u64));
    fx.store.migrate().unwrap();
}

/// Two processes migrate one database from nothing at the same moment: both
/// succeed, each version is recorded once, and the schema works.
fn two_processes_migrating_at_once(b: Backend, p: &str) {
    let _serial = serial();
    let name = format!("{b:?}");
    let Some(fx) = Fixture::new(b, p) else {
        return;
    };
    for t in crate::common::backend::TABLES
        .iter()
        .chain(&["outbox_quiet_types", "outbox_seq"])
    {
        fx.execute(&format!("DROP TABLE IF EXISTS {p}{t}"));
    }
    let at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
        + 1500;
    let children: Vec<_> = (0..2)
        .map(|_| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    &crate::common::test_name(module_path!(), "migrate_child_process"),
                ])
                .args(["--ignored", "--quiet"])
                .env("TXBOX_MIGRATE_PREFIX", p)
                .env("TXBOX_MIGRATE_BACKEND", &name)
                .env("TXBOX_MIGRATE_AT", at.to_string())
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(
            c.wait().unwrap().success(),
            "{name}: a migrating process failed"
        );
    }
    let pending = fx.store.pending_migrations().unwrap();
    assert!(pending.is_empty(), "{name}: still to run: {pending:?}");
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.ordering(txbox::EventOrder::Key))
        .build()
        .unwrap();
    let ids = fx.publish_events(
        &config,
        vec![txbox::NewEvent::new("e", &1).unwrap().key("k")],
    );
    let args = txbox::store::ClaimArgs::new("e", 10, Duration::from_secs(60))
        .ordered(txbox::OnPoison::Block);
    let got = fx.store.claim_after(&args, uuid::Uuid::now_v7()).unwrap();
    assert_eq!(got.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
}
