//! The inbox: ids recorded once, per consumer.

use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use txbox::EventId;
use txbox::Inbox;

use super::{config, ms};

pub(super) fn inbox_inserts_if_absent(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let (x, y) = (txbox::EventId::new(), txbox::EventId::new());
    assert_eq!(
        fx.store.inbox_insert("svc", &[x, y, x]).unwrap(),
        vec![x, y]
    );
    assert!(fx.store.inbox_insert("svc", &[x]).unwrap().is_empty());
    let inbox = Inbox::new(&c, "svc").unwrap();
    let z = txbox::EventId::new();
    assert!(fx.inbox_tx::<()>(&inbox, z, false).is_err());
    assert!(
        !fx.inbox_tx::<()>(&inbox, z, true).unwrap().is_duplicate(),
        "a rolled-back id was not recorded"
    );
    assert!(fx.inbox_tx::<()>(&inbox, z, true).unwrap().is_duplicate());
    assert!(fx.inbox_tx::<()>(&inbox, x, true).unwrap().is_duplicate());
    assert_eq!(
        fx.store
            .delete_expired_inbox(Duration::from_secs(3600), 10)
            .unwrap(),
        0
    );
    std::thread::sleep(ms(30));
    assert_eq!(
        fx.store.delete_expired_inbox(ms(10), 2).unwrap(),
        2,
        "bounded"
    );
    assert_eq!(fx.store.delete_expired_inbox(ms(10), 10).unwrap(), 1);
}

/// Two consumers of the same events in one database (billing and shipping) each
/// handle every event once: the inbox's key is (consumer, event id).
pub(super) fn the_inbox_deduplicates_per_consumer(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let ids: Vec<EventId> = (0..500).map(|_| EventId::new()).collect();
    for consumer in ["billing", "shipping"] {
        assert_eq!(
            fx.store.inbox_insert(consumer, &ids).unwrap(),
            ids,
            "{consumer} sees every id as new"
        );
        assert!(
            fx.store.inbox_insert(consumer, &ids).unwrap().is_empty(),
            "{consumer} sees its redeliveries as duplicates"
        );
    }
    // through each inbox in a business transaction: each runs its handler once
    let (billing, shipping) = (
        Inbox::new(&c, "billing").unwrap(),
        Inbox::new(&c, "shipping").unwrap(),
    );
    let x = EventId::new();
    let mut handled = 0;
    for _ in 0..2 {
        for inbox in [&billing, &shipping] {
            if !fx.inbox_tx::<()>(inbox, x, true).unwrap().is_duplicate() {
                handled += 1;
            }
        }
    }
    assert_eq!(handled, 2, "once per consumer");
    // names are compared as they are written, on every database (MySQL's
    // default collation would fold case): `Billing` is another consumer
    let y = EventId::new();
    for consumer in ["billing", "Billing"] {
        assert_eq!(
            fx.store.inbox_insert(consumer, &[y]).unwrap(),
            vec![y],
            "{consumer} is a consumer of its own"
        );
    }
    // the store refuses a name the inbox would: `*` (the rows from before
    // the upgrade, consumed for everyone) and what the column cannot hold
    for bad in ["*".to_string(), "x".repeat(101), String::new()] {
        let err = fx.store.inbox_insert(&bad, &[EventId::new()]).unwrap_err();
        assert!(
            err.to_string().contains("inbox consumer name"),
            "{bad:?}: {err}"
        );
    }
}

/// Suspected: the MySQL/MariaDB inbox insert (`INSERT IGNORE ... SELECT ...
/// WHERE NOT EXISTS`) takes next-key locks under the caller's default
/// REPEATABLE READ, and new UUIDv7 ids share the last gap, so concurrent
/// consumers could deadlock (error 1213). Eight threads record fresh ids in
/// default-isolation transactions for 10 s, from an empty inbox on: no
/// deadlock, and every id recorded once.
#[cfg(feature = "mysql")]
#[test]
fn mysql_inbox_inserts_from_concurrent_consumers_do_not_deadlock() {
    use ::mysql::prelude::Queryable;
    use std::sync::atomic::{AtomicU64, Ordering};
    let p = "cmy_inbox_race_";
    let Some(_fx) = Fixture::new(Backend::MySql, p) else {
        return;
    };
    let config = txbox::Config::builder().table_prefix(p).build().unwrap();
    let inbox = txbox::Inbox::new(&config, "billing").unwrap();
    let pool = ::mysql::Pool::new(crate::common::backend::mysql_url().as_str()).unwrap();
    let (recorded, deadlocks, other) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let until = std::time::Instant::now() + Duration::from_secs(10);
    std::thread::scope(|s| {
        for _ in 0..8 {
            let (inbox, pool) = (inbox.clone(), pool.clone());
            let (recorded, deadlocks, other) = (&recorded, &deadlocks, &other);
            s.spawn(move || {
                let mut c = pool.get_conn().unwrap();
                while std::time::Instant::now() < until {
                    let mut tx = c.start_transaction(::mysql::TxOpts::default()).unwrap();
                    let r = inbox.handle_in(&mut tx, EventId::new(), |_| Ok::<_, txbox::Error>(()));
                    match r {
                        Ok(h) if !h.is_duplicate() => {
                            tx.commit().unwrap();
                            recorded.fetch_add(1, Ordering::Relaxed);
                        }
                        Ok(_) => panic!("a fresh id was a duplicate"),
                        Err(e) if e.to_string().contains("1213") => {
                            deadlocks.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => {
                            eprintln!("inbox insert: {e}");
                            other.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            });
        }
    });
    let (recorded, deadlocks, other) = (
        recorded.into_inner(),
        deadlocks.into_inner(),
        other.into_inner(),
    );
    eprintln!("mysql inbox, 8 threads for 10 s: {recorded} recorded, {deadlocks} deadlocks, {other} other errors");
    assert_eq!((deadlocks, other), (0, 0));
    let mut c = pool.get_conn().unwrap();
    let rows: u64 = c
        .query_first(format!("SELECT COUNT(*) FROM {p}inbox_consumed"))
        .unwrap()
        .unwrap();
    assert_eq!(rows, recorded, "every id recorded once");
    assert!(recorded > 100, "the consumers made progress: {recorded}");
}
