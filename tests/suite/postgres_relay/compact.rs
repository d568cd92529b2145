//! The outbox table recovers (issue 45): a table that a long transaction kept
//! VACUUM from cleaning, then drained, is mostly empty space that VACUUM does
//! not give back; the cleanup rewrites it (`MaintenanceStore::compact`,
//! PostgreSQL's `CLUSTER`), within a bound on its exclusive lock, so that no
//! writer waits behind it for long. These tests run a manual `VACUUM` (this
//! machine's image ships autovacuum off).

use std::time::{Duration, Instant};

use txbox::{Config, MaintenanceStore, Outbox};

use crate::common::*;

fn config(p: &str) -> Config {
    Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap()
}

/// Bytes of the outbox table and its indexes.
fn size(c: &mut postgres::Client, p: &str) -> i64 {
    c.query_one(
        "SELECT pg_total_relation_size($1::text::regclass)::int8",
        &[&format!("{p}outbox_events")],
    )
    .unwrap()
    .get(0)
}

/// Fills the outbox with `n` rows of about 200 bytes, then `tail` pending
/// ones after them, deletes the `n` and vacuums: the table keeps its size
/// (the pending rows at its end keep VACUUM from cutting it short), mostly
/// empty.
fn drained_table(c: &mut postgres::Client, p: &str, n: i64, tail: i64) {
    let insert = |status: &str| {
        format!(
            "INSERT INTO {p}outbox_events (id, event_type, headers, payload, status) \
             SELECT gen_random_uuid(), 'e', '{{}}'::jsonb, \
               ('\"' || repeat('x', 200) || '\"')::jsonb, '{status}' \
             FROM generate_series(1, $1::int8)"
        )
    };
    c.execute(&insert("PROCESSED"), &[&n]).unwrap();
    c.execute(&insert("PENDING"), &[&tail]).unwrap();
    c.execute(
        &format!("DELETE FROM {p}outbox_events WHERE status = 'PROCESSED'"),
        &[],
    )
    .unwrap();
    // the rows deleted are dead to every transaction once those that began
    // before have ended (other tests' snapshots): then VACUUM counts them gone
    super::older_transactions_ended(c);
    c.batch_execute(&format!("VACUUM {p}outbox_events"))
        .unwrap();
}

/// A mostly empty outbox is rewritten to the size of what lives in it, the
/// pending events kept; a small table, or one with its rows alive, is not.
#[test]
fn a_mostly_empty_outbox_is_rewritten_and_keeps_its_pending_events() {
    let p = "t_compact_";
    let Some((store, mut c)) = fresh(p) else {
        return;
    };
    // a small table: nothing to do
    assert_eq!(store.compact(Duration::from_secs(1)).unwrap(), None);
    drained_table(&mut c, p, 60_000, 5);
    let before = size(&mut c, p);
    assert!(before > 8 << 20, "the table is {before} bytes");
    // a transaction of another test that began before the delete keeps its
    // rows alive, and the rewrite copies them: tried again (after a VACUUM,
    // as autovacuum would) until none is left
    let mut done = None;
    wait_until("the table rewritten small", Duration::from_secs(60), || {
        c.batch_execute(&format!("VACUUM {p}outbox_events"))
            .unwrap();
        done = store.compact(Duration::from_secs(5)).unwrap();
        done.is_some_and(|d| d.bytes_after < d.bytes_before / 20)
    });
    let done = done.unwrap();
    let after = size(&mut c, p);
    assert!(done.bytes_before as i64 <= before);
    assert_eq!(done.bytes_after as i64, after);
    assert!(after < before / 20, "{before} -> {after} bytes");
    assert_eq!(count(&mut c, p, "PENDING"), 5, "the pending events kept");
    // rewritten, it is small: nothing more to do
    assert_eq!(store.compact(Duration::from_secs(1)).unwrap(), None);
    eprintln!("compacted: {before} -> {after} bytes");

    // a table whose rows live is left alone
    drained_table(&mut c, p, 60_000, 60_000);
    assert!(size(&mut c, p) > 8 << 20);
    assert_eq!(store.compact(Duration::from_secs(1)).unwrap(), None);
}

/// A long reader of the outbox holds a lock the rewrite's exclusive lock
/// waits for: the rewrite gives up after its timeout, the table as it was,
/// and a publisher queued behind that wait goes on within about as long.
/// With the reader gone, the next try rewrites the table. The relay's
/// cleanup does it by itself (`maintenance.compact`).
#[test]
fn a_rewrite_behind_a_long_reader_gives_up_in_time_and_the_cleanup_does_it_later() {
    let p = "t_compact_reader_";
    let Some((store, mut c)) = fresh(p) else {
        return;
    };
    let config = config(p);
    drained_table(&mut c, p, 60_000, 1);
    let before = size(&mut c, p);
    let mut reader = client().unwrap();
    reader
        .batch_execute(&format!("BEGIN; SELECT count(*) FROM {p}outbox_events"))
        .unwrap();
    let timeout = Duration::from_millis(500);
    let s = store.clone();
    let rewrite = std::thread::spawn(move || {
        let t = Instant::now();
        (s.compact(timeout), t.elapsed())
    });
    // a publisher while the rewrite waits for its lock
    std::thread::sleep(Duration::from_millis(100));
    let outbox = Outbox::new(&config).unwrap();
    let t = Instant::now();
    let mut publisher = client().unwrap();
    let mut tx = publisher.transaction().unwrap();
    outbox.publish(&mut tx, "e", &1).unwrap();
    tx.commit().unwrap();
    let publish = t.elapsed();
    let (result, took) = rewrite.join().unwrap();
    let e = result.expect_err("the rewrite gives up behind the reader");
    // the statement's timeout, which its lock wait is part of
    assert!(e.to_string().contains("timeout"), "{e}");
    assert!(
        took >= timeout && took < timeout + Duration::from_secs(2),
        "gave up after {took:?}"
    );
    assert!(
        publish < timeout + Duration::from_secs(1),
        "the publisher waited {publish:?}"
    );
    assert_eq!(size(&mut c, p), before, "the table as it was");
    reader.batch_execute("COMMIT").unwrap();

    // the relay's cleanup rewrites it now
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .maintenance(|m| {
            m.cleanup_interval(Duration::from_millis(200))
                .compact_timeout(Duration::from_secs(5))
        })
        .build()
        .unwrap();
    let relay = txbox::Relay::start(store.clone(), &config, txbox::MemorySender::new()).unwrap();
    // (a VACUUM now and then, as autovacuum would: a rewrite that copied
    // the rows a transaction of another test could still see is tried
    // again once VACUUM has counted them gone)
    wait_until(
        "the cleanup rewrote the table",
        Duration::from_secs(60),
        || {
            c.batch_execute(&format!("VACUUM {p}outbox_events"))
                .unwrap();
            std::thread::sleep(Duration::from_millis(200));
            size(&mut c, p) < before / 20
        },
    );
    relay.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(count(&mut c, p, "PROCESSED"), 2, "the events sent, kept");
}

/// A role that does not own the outbox table cannot rewrite it (CLUSTER needs
/// the owner): `compact` says so as `Unsupported`, naming why, and the
/// table is as it was.
#[test]
fn a_role_that_does_not_own_the_table_is_told_why() {
    let p = "t_compact_role_";
    let Some((_, mut c)) = fresh(p) else {
        return;
    };
    drained_table(&mut c, p, 60_000, 1);
    let role = "txbox_compact_not_owner";
    // its own tables only: a GRANT on every table of the schema updates
    // their catalog rows, which other tests' DROP TABLE then conflicts with
    c.batch_execute(&format!(
        "DO $$ BEGIN CREATE ROLE {role} LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$; \
         DO $$ DECLARE t text; BEGIN \
           FOR t IN SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = 'public' AND c.relkind IN ('r', 'S') AND c.relname LIKE '{p}%' \
           LOOP EXECUTE format('GRANT ALL ON %I TO {role}', t); END LOOP; END $$"
    ))
    .unwrap();
    let url = format!("postgres://{role}@127.0.0.1:5432/test");
    let store = txbox::PgStore::connect(&url, &config(p)).unwrap();
    let before = size(&mut c, p);
    let e = store.compact(Duration::from_secs(5)).unwrap_err();
    assert!(
        matches!(e, txbox::Error::Unsupported { .. }) && e.to_string().contains("does not own"),
        "{e}"
    );
    assert_eq!(size(&mut c, p), before, "the table as it was");
}
