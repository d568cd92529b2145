//! Configurations refused at start, with the key and the numbers.

use std::sync::Arc;
use std::time::Duration;

use crate::common::*;
use txbox::{ClaimMode, Config, MemorySender, Relay};

/// Held claims keep a connection per batch in flight: a configuration that needs
/// more than the store's pool has is refused at start, with the numbers.
#[test]
fn held_claims_needing_more_connections_than_the_pool_are_refused() {
    let p = "t_rel_poolsize_";
    if fresh(p).is_none() {
        return;
    }
    let pool = r2d2::Pool::builder()
        .max_size(8)
        .build(r2d2_postgres::PostgresConnectionManager::new(
            pg_url().parse().unwrap(),
            postgres::NoTls,
        ))
        .unwrap();
    let store =
        Arc::new(txbox::PgStore::from_pool(pool, &crate::common::prefix_config(p)).unwrap());
    let held = |n: usize| {
        let mut b = Config::builder().table_prefix(p).defaults(|e| {
            e.claim(ClaimMode::Lock)
                .in_flight(3)
                .wake(txbox::Wake::Poll)
        });
        for i in 0..n {
            b = b.event(format!("t{i}"), |e| e);
        }
        b.build().unwrap()
    };
    let err = Relay::start(store.clone(), &held(2), MemorySender::new())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("held claims need up to 12 database connections (6 batches in flight of held types, 0 other pollers, 5 maintenance threads, 1 health check), and the store's pool has 8"),
        "{err}"
    );
    // the commit listener keeps a connection too: 2 + 5 + 1 + 1 = 9 is one too many
    let err = Relay::start(
        store.clone(),
        &Config::builder()
            .table_prefix(p)
            .event("t", |e| e.claim(ClaimMode::Lock).in_flight(2))
            .build()
            .unwrap(),
        MemorySender::new(),
    )
    .err()
    .expect("refused")
    .to_string();
    assert!(
        err.contains(
            "5 maintenance threads, 1 commit listener, 1 health check), and the store's pool has 8"
        ),
        "{err}"
    );
    // one held type with 2 in flight, polling only: 2 + 5 + 1 = 8 fits
    let config = Config::builder()
        .table_prefix(p)
        .event("t", |e| {
            e.claim(ClaimMode::Lock)
                .in_flight(2)
                .wake(txbox::Wake::Poll)
        })
        .build()
        .unwrap();
    Relay::start(store, &config, MemorySender::new())
        .unwrap()
        .shutdown(Duration::from_secs(5))
        .unwrap();
}

/// An event type holding a NUL, or a NaN multiplier: refused with the key by
/// the builder (a configuration cannot be changed after it was validated), where
/// a relay used to panic on the thread name.
#[test]
fn a_configuration_with_a_nul_type_or_nan_multiplier_is_refused() {
    let err = Config::builder()
        .event("bad\0type", |e| e)
        .build()
        .expect_err("refused")
        .to_string();
    assert!(
        err.starts_with("events.bad\\0type event type must not contain control characters"),
        "{err}"
    );
    let err = Config::builder()
        .defaults(|d| d.backoff_multiplier(f64::NAN))
        .build()
        .expect_err("refused")
        .to_string();
    assert!(
        err.starts_with("defaults.backoff.multiplier must be between"),
        "{err}"
    );
}

/// A store opened on other tables than the configuration names would have the
/// relay read tables the publisher never writes: refused at start, naming both.
#[test]
fn a_store_on_other_tables_than_the_configuration_is_refused() {
    let p = "t_rel_prefix_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix("t_rel_other_")
        .event("e", |e| e)
        .build()
        .unwrap();
    let err = Relay::start(store, &config, MemorySender::new())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.starts_with(
            "table_prefix is \"t_rel_other_\" but the store was opened with \"t_rel_prefix_\""
        ),
        "{err}"
    );
    // opened from the configuration, the prefix is given once
    let config = Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .build()
        .unwrap();
    let store = config.connect(&pg_url()).unwrap();
    Relay::start(store, &config, MemorySender::new())
        .unwrap()
        .shutdown(Duration::from_secs(5))
        .unwrap();
}
