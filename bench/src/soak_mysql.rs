//! Part `soak-mysql`: what a held consistent snapshot does to a claim on
//! MySQL/MariaDB (issue 45), where the claims still read from the lowest id.
//! Twice on fresh tables, without and with `START TRANSACTION WITH
//! CONSISTENT SNAPSHOT` held by another session: `--events` events published
//! and drained (claim, finish) through the store, then 40 claims of the
//! drained type, their mean time (the server's handler counters do not count
//! the delete-marked records InnoDB steps over). InnoDB's purge cannot
//! remove the old versions (and the delete-marked index records) the
//! snapshot may still read.

use std::time::{Duration, Instant};

use mysql::prelude::Queryable;
use txbox::store::{ClaimArgs, ClaimStore, Outcome};
use txbox::{Config, MySqlStore, NewEvent, Outbox};
use uuid::Uuid;

use crate::common::*;

fn mysql_url() -> String {
    std::env::var("TXBOX_MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306/test".into())
}

/// The mean time of a claim of the drained type, in ms.
fn one(events: usize, held: bool) -> Res<f64> {
    let p = if held {
        "bench_myso_held_"
    } else {
        "bench_myso_"
    };
    let pool = mysql::Pool::new(mysql_url().as_str())?;
    let mut c = pool.get_conn()?;
    for table in tables_of(p)? {
        c.query_drop(format!("DROP TABLE IF EXISTS {table}"))?;
    }
    let cfg = Config::builder()
        .table_prefix(p)
        .event("bench", |e| e)
        .build()?;
    let store = MySqlStore::connect(&mysql_url(), &cfg)?;
    store.migrate()?;
    let mut snapshot = pool.get_conn()?;
    if held {
        snapshot.query_drop("START TRANSACTION WITH CONSISTENT SNAPSHOT")?;
        snapshot.query_drop(format!("SELECT count(*) FROM {p}outbox_events"))?;
    }
    let outbox = Outbox::new(&cfg)?;
    let args = ClaimArgs::new("bench", 200, Duration::from_secs(60));
    let mut published = 0;
    while published < events {
        let n = 500.min(events - published);
        let mut tx = c.start_transaction(mysql::TxOpts::default())?;
        outbox.publish_all(&mut tx, NewEvent::batch("bench", published..published + n)?)?;
        tx.commit()?;
        published += n;
        // drained as it goes, as a relay does
        loop {
            let token = Uuid::now_v7();
            let got = store.claim_after(&args, token)?;
            if got.is_empty() {
                break;
            }
            let done: Vec<_> = got.iter().map(|e| (e.id, Outcome::Sent)).collect();
            store.finish(token, &done)?;
        }
    }
    let started = Instant::now();
    for _ in 0..40 {
        if !store.claim_after(&args, Uuid::now_v7())?.is_empty() {
            return Err("soak-mysql: a drained type claimed something".into());
        }
    }
    let took = started.elapsed().as_secs_f64() * 1000.0 / 40.0;
    drop(snapshot);
    Ok(took)
}

pub(crate) fn soak_mysql(events: usize, out: &mut Vec<Row>) -> Res<()> {
    let plain_ms = one(events, false)?;
    let held_ms = one(events, true)?;
    out.push(ms_row(
        format!("soak-mysql: a claim's time after {events} events, snapshot held / without"),
        held_ms,
        plain_ms,
        "report",
    ));
    Ok(())
}
