//! Migrations: a 0.1 inbox upgraded in place, the order of waiting events kept,
//! two migrators at once, a MySQL upgrade that stopped half way.

use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use txbox::store::{ClaimArgs, Outcome};
use txbox::{Config, EventId};
use uuid::Uuid;

use super::ms;
use super::ordering::keyed;

/// A 0.1 inbox (keyed by the event id alone) is upgraded in place by `migrate`,
/// once: its rows are kept and still count as consumed for every consumer, and
/// new ids are kept per consumer.
pub(super) fn migrate_upgrades_a_0_1_inbox_in_place_keeping_its_rows(b: Backend, p: &str) {
    let old: Vec<EventId> = (0..20).map(|_| EventId::new()).collect();
    let Some(fx) = Fixture::schema_v1(b, p, &old) else {
        return;
    };
    fx.store.migrate().unwrap();
    fx.store.migrate().unwrap(); // version 2 is applied once
    for consumer in ["billing", "shipping"] {
        assert!(
            fx.store.inbox_insert(consumer, &old).unwrap().is_empty(),
            "an id consumed before the upgrade is not handled again by {consumer}"
        );
    }
    let new = EventId::new();
    assert_eq!(fx.store.inbox_insert("billing", &[new]).unwrap(), vec![new]);
    assert_eq!(
        fx.store.inbox_insert("shipping", &[new]).unwrap(),
        vec![new]
    );
    assert!(fx.store.inbox_insert("billing", &[new]).unwrap().is_empty());
    // every row is still there, and the cleanup takes them by age
    std::thread::sleep(ms(30));
    assert_eq!(fx.store.delete_expired_inbox(ms(10), 100).unwrap(), 22);
}

/// Events of a key waiting when the schema is upgraded to the database's
/// insert order keep their order (their ids'), and come before every event
/// published after the upgrade; the key still has one event out at a time.
pub(super) fn an_upgrade_keeps_the_order_of_the_events_waiting(b: Backend, p: &str) {
    let Some(fx) = Fixture::schema_v1(b, p, &[]) else {
        return;
    };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.ordering(txbox::EventOrder::Key))
        .build()
        .unwrap();
    let mut ids = fx.publish_events(&c, keyed("e", &["a"], 3));
    fx.store.migrate().unwrap();
    ids.extend(fx.publish_events(&c, keyed("e", &["a"], 2)));
    let args = ClaimArgs::new("e", 100, Duration::from_secs(60)).ordered(txbox::OnPoison::Block);
    let mut sent = Vec::new();
    for _ in 0..ids.len() {
        let token = Uuid::now_v7();
        let got: Vec<EventId> = fx
            .store
            .claim_after(&args, token)
            .unwrap()
            .iter()
            .map(|e| e.id)
            .collect();
        assert_eq!(got.len(), 1, "one event of the key at a time: {got:?}");
        fx.store.finish(token, &[(got[0], Outcome::Sent)]).unwrap();
        sent.extend(got);
    }
    assert_eq!(sent, ids, "in publish order across the upgrade");
}

/// After the upgrade: ids from before it are consumed for every consumer, new
/// ones are kept per consumer.
pub(super) fn upgraded_inbox_works(fx: &Fixture, old: &[EventId]) {
    assert!(fx.store.inbox_insert("billing", old).unwrap().is_empty());
    let new = EventId::new();
    assert_eq!(fx.store.inbox_insert("billing", &[new]).unwrap(), vec![new]);
    assert_eq!(
        fx.store.inbox_insert("shipping", &[new]).unwrap(),
        vec![new]
    );
}

/// Two instances starting at once on a 0.1 table both migrate without an error,
/// and the upgrade is applied once.
pub(super) fn two_instances_migrating_at_once_both_succeed(b: Backend, p: &str) {
    let old = [EventId::new()];
    let Some(fx) = Fixture::schema_v1(b, p, &old) else {
        return;
    };
    let stores = [fx.another_store(), fx.another_store()];
    let barrier = std::sync::Barrier::new(2);
    std::thread::scope(|s| {
        let runs: Vec<_> = stores
            .iter()
            .map(|st| {
                s.spawn(|| {
                    barrier.wait();
                    st.migrate()
                })
            })
            .collect();
        for r in runs {
            r.join().unwrap().unwrap();
        }
    });
    upgraded_inbox_works(&fx, &old);
}

pub(super) fn migrate_twice_is_fine(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    fx.store.migrate().unwrap();
    fx.store.migrate().unwrap();
    assert!(fx.store.status().unwrap().is_empty());
}

/// MySQL commits each DDL statement: a migration that stopped after its key
/// change (before it recorded its version) is resumed by the next `migrate`.
#[cfg(feature = "mysql")]
#[test]
fn mysql_resumes_an_upgrade_that_stopped_half_way() {
    use ::mysql::prelude::Queryable;
    let p = "cmy_half_";
    let old = [EventId::new()];
    let Some(fx) = Fixture::schema_v1(Backend::MySql, p, &old) else {
        return;
    };
    let pool = ::mysql::Pool::new(crate::common::backend::mysql_url().as_str()).unwrap();
    let mut c = pool.get_conn().unwrap();
    // the first statement of 002 only, as a migration that died after it
    let first = include_str!("../../../sql/mysql/002_inbox_per_consumer.sql")
        .replace("{prefix}", p)
        .lines()
        .filter(|l| !l.starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    let first = first.split(';').next().unwrap().to_string();
    c.query_drop(first).unwrap();
    fx.store.migrate().unwrap();
    fx.store.migrate().unwrap();
    upgraded_inbox_works(&fx, &old);
    let versions: Vec<i32> = c
        .query(format!("SELECT version FROM {p}txbox_schema_version"))
        .unwrap();
    assert_eq!(versions, vec![2, 3, 4, 5, 6]);
}
