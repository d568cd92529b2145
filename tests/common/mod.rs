//! Shared helpers of the integration tests: real PostgreSQL, one table prefix per test.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use txbox::{PgStore, Store};

/// The test database; override with `TXBOX_PG_URL`.
pub fn pg_url() -> String {
    std::env::var("TXBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

/// A plain client, or `None` (with the reason printed) when PostgreSQL is not
/// reachable outside CI. In CI (`CI=true`) a missing database fails the test.
pub fn client() -> Option<postgres::Client> {
    let _ = env_logger::builder().is_test(true).try_init();
    match postgres::Client::connect(&pg_url(), postgres::NoTls) {
        Ok(c) => Some(c),
        Err(e) => {
            if std::env::var("CI").map(|v| v == "true").unwrap_or(false) {
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
    for t in [
        "outbox_events",
        "outbox_dead_letters",
        "inbox_consumed",
        "job_locks",
    ] {
        client
            .batch_execute(&format!("DROP TABLE IF EXISTS {prefix}{t}"))
            .expect("drop table");
    }
    let store = Arc::new(PgStore::connect(url, prefix).expect("connect store"));
    store.migrate().expect("migrate");
    Some((store, client))
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
