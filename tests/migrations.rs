//! Migrations on a live database, against the real PostgreSQL, MariaDB and
//! SQLite: `migrate` at start-up must not stall the writers.

mod common;

use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use common::backend::{Backend, Fixture};
use txbox::{Config, Outbox};

/// `migrate` on a current schema while another connection holds a
/// transaction that published (a slow business transaction when a new
/// instance starts in a rolling deploy): it returns at once, and a third
/// connection's publish commits meanwhile (SQLite has one writer at a time:
/// there only the first).
fn migrate_on_a_current_schema_waits_for_no_transaction(b: Backend, p: &str) {
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
    let (opened_tx, opened) = channel();
    let (release_tx, release) = channel::<()>();
    std::thread::scope(|s| {
        let (fx_ref, outbox) = (&fx, &outbox);
        let holder = s.spawn(move || {
            fx_ref.in_tx(
                |tx| {
                    outbox.publish(tx, "e", &1).unwrap();
                    opened_tx.send(()).unwrap();
                    // held open until told, or at most 10 s
                    let _ = release.recv_timeout(Duration::from_secs(10));
                },
                |_| true,
            )
        });
        opened.recv().unwrap();
        let other = fx.another_store();
        let started = Instant::now();
        let migrating = s.spawn(move || other.migrate().map(|()| started.elapsed()));
        let publish_took = (!one_writer).then(|| {
            let t = Instant::now();
            fx.publish(&config, "e", 1, true);
            t.elapsed()
        });
        let migrate_took = migrating.join().unwrap().unwrap();
        release_tx.send(()).unwrap();
        holder.join().unwrap();
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

#[test]
fn postgres_migrate_on_a_current_schema_waits_for_no_transaction() {
    migrate_on_a_current_schema_waits_for_no_transaction(Backend::Postgres, "mig_live_pg_");
}

#[cfg(feature = "mysql")]
#[test]
fn mysql_migrate_on_a_current_schema_waits_for_no_transaction() {
    migrate_on_a_current_schema_waits_for_no_transaction(Backend::MySql, "mig_live_my_");
}

#[cfg(feature = "sqlite")]
#[test]
fn sqlite_migrate_on_a_current_schema_waits_for_no_transaction() {
    migrate_on_a_current_schema_waits_for_no_transaction(Backend::Sqlite, "mig_live_lite_");
}

/// An upgrade that must wait for a table's lock (an open transaction wrote
/// the outbox) gives up after `migrate_lock_timeout` with an error that says
/// so, instead of stalling every writer behind its wait; once the
/// transaction ended, the same upgrade goes through.
#[test]
fn postgres_an_upgrade_behind_an_open_transaction_gives_up_in_time() {
    let p = "mig_lock_pg_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .migrate_lock_timeout(Duration::from_secs(1))
        .event("e", |e| e)
        .build()
        .unwrap();
    // the last version not applied yet: it alters the outbox table
    let mut c = common::client().unwrap();
    c.batch_execute(&format!(
        "DELETE FROM {p}txbox_schema_version WHERE version = (SELECT max(version) FROM {p}txbox_schema_version)"
    ))
    .unwrap();
    let store = txbox::PgStore::connect(&common::pg_url(), &config).unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let (opened_tx, opened) = channel();
    let (release_tx, release) = channel::<()>();
    std::thread::scope(|s| {
        let (fx, outbox) = (&fx, &outbox);
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
        let started = Instant::now();
        let err = txbox::Store::migrate(&store).unwrap_err();
        let took = started.elapsed();
        release_tx.send(()).unwrap();
        holder.join().unwrap();
        assert!(took < Duration::from_secs(3), "gave up after {took:?}");
        let text = err.to_string();
        assert!(
            text.contains("gave up waiting for a lock") && text.contains("migrate_lock_timeout"),
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
    assert_eq!(latest, 7);
}
