//! The inbox against real PostgreSQL (and Redis for the shared cache).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Duration;
use txbox::InboxStore;

use crate::common::*;
use txbox::{Config, Error, EventId, Position, ReceivedEvent};
use txbox::{Handled, Inbox, InboxCache, InboxCleanup, MemoryCache};

fn config(prefix: &str) -> Config {
    Config::builder().table_prefix(prefix).build().unwrap()
}

fn recorded(client: &mut postgres::Client, prefix: &str, id: EventId) -> i64 {
    client
        .query_one(
            &format!("SELECT count(*) FROM {prefix}inbox_consumed WHERE event_id = $1"),
            &[&id.as_uuid()],
        )
        .unwrap()
        .get(0)
}

fn event(id: Option<EventId>) -> ReceivedEvent {
    ReceivedEvent {
        id,
        event_type: Some("e".into()),
        key: None,
        headers: Default::default(),
        payload: b"{}".to_vec(),
        content_type: None,
        position: Position::Kafka {
            topic: "t".into(),
            partition: 0,
            offset: 0,
        },
    }
}

#[test]
fn the_same_event_twice_runs_the_handler_once() {
    let p = "t_inbox_twice_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let inbox = Inbox::new(&config(p), "svc").unwrap();
    let runs = AtomicUsize::new(0);
    let id = EventId::new();
    for _ in 0..2 {
        inbox
            .handle_pg(store.pool(), id, |_tx| {
                runs.fetch_add(1, Ordering::SeqCst);
                Ok::<_, Error>(())
            })
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_eq!(recorded(&mut client, p, id), 1);
    let s = inbox.stats();
    assert_eq!((s.consumed, s.duplicates), (1, 1));
}

#[derive(Debug)]
#[allow(dead_code)] // the payload is read through Debug only
enum AppError {
    Declined(&'static str),
    Txbox(Error),
}

impl From<Error> for AppError {
    fn from(e: Error) -> Self {
        AppError::Txbox(e)
    }
}

#[test]
fn a_failed_handler_rolls_back_and_runs_again_on_redelivery() {
    let p = "t_inbox_fail_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {p}effects; CREATE TABLE {p}effects (id uuid)"
        ))
        .unwrap();
    let inbox = Inbox::new(&config(p), "svc").unwrap();
    let id = EventId::new();
    let effect = format!("INSERT INTO {p}effects VALUES ($1)");
    let err = inbox
        .handle_pg(store.pool(), id, |tx| {
            tx.execute(&effect, &[&id.as_uuid()]).map_err(Error::from)?;
            Err::<(), _>(AppError::Declined("card declined"))
        })
        .unwrap_err();
    assert!(
        matches!(err, AppError::Declined("card declined")),
        "the handler's own error passes through: {err:?}"
    );
    assert_eq!(recorded(&mut client, p, id), 0, "the id is not recorded");
    let effects = format!("SELECT count(*) FROM {p}effects");
    assert_eq!(
        client.query_one(&effects, &[]).unwrap().get::<_, i64>(0),
        0,
        "its writes rolled back"
    );

    let again = inbox
        .handle_pg(store.pool(), id, |tx| {
            tx.execute(&effect, &[&id.as_uuid()]).map_err(Error::from)?;
            Ok::<_, AppError>("charged")
        })
        .unwrap();
    assert_eq!(again, Handled::Consumed("charged"));
    assert_eq!(recorded(&mut client, p, id), 1);
    assert_eq!(client.query_one(&effects, &[]).unwrap().get::<_, i64>(0), 1);
    assert!(inbox
        .handle_pg(store.pool(), id, |_| Ok::<_, Error>(()))
        .unwrap()
        .is_duplicate());
}

#[test]
fn at_most_once_commits_first_and_skips_the_redelivery_of_a_failed_handler() {
    let p = "t_inbox_amo_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let inbox = Inbox::new(&config(p), "svc")
        .unwrap()
        .with_store(store.clone())
        .unwrap();
    let id = EventId::new();
    let err = inbox
        .handle_at_most_once(id, || Err::<(), _>(Error::InvalidInput("smtp down".into())))
        .unwrap_err();
    assert!(err.to_string().contains("smtp down"));
    assert_eq!(
        recorded(&mut client, p, id),
        1,
        "recorded before the handler ran"
    );
    let runs = AtomicUsize::new(0);
    let again = inbox
        .handle_at_most_once(id, || {
            runs.fetch_add(1, Ordering::SeqCst);
            Ok::<_, Error>(())
        })
        .unwrap();
    assert!(again.is_duplicate());
    assert_eq!(runs.load(Ordering::SeqCst), 0, "not retried");
    let no_store = Inbox::new(&config(p), "svc").unwrap();
    let err = no_store
        .handle_at_most_once(EventId::new(), || Ok::<_, Error>(()))
        .unwrap_err();
    assert!(err.to_string().contains("with_store"), "{err}");
}

#[test]
fn a_batch_calls_the_handler_once_with_only_new_events() {
    let p = "t_inbox_batch_";
    let Some((_store, mut client)) = fresh(p) else {
        return;
    };
    let inbox = Inbox::new(&config(p), "svc").unwrap();
    let old: Vec<EventId> = (0..3).map(|_| EventId::new()).collect();
    let mut tx = client.transaction().unwrap();
    let first: Vec<_> = old.iter().map(|id| event(Some(*id))).collect();
    inbox
        .handle_batch_in(&mut tx, &first, |_, new| Ok::<_, Error>(new.len()))
        .unwrap();
    tx.commit().unwrap();

    let fresh_ids: Vec<EventId> = (0..2).map(|_| EventId::new()).collect();
    let mixed: Vec<_> = [old[0], fresh_ids[0], old[1], fresh_ids[1], fresh_ids[1]]
        .iter()
        .map(|id| event(Some(*id)))
        .collect();
    let mut calls = 0;
    let mut tx = client.transaction().unwrap();
    let handled = inbox
        .handle_batch_in(&mut tx, &mixed, |_, new| {
            calls += 1;
            Ok::<_, Error>(new.iter().map(|e| e.id.unwrap()).collect::<Vec<_>>())
        })
        .unwrap();
    tx.commit().unwrap();
    assert_eq!(calls, 1);
    assert_eq!(
        inbox.stats().statements,
        3 + 4,
        "one insert per distinct id"
    );
    let stats = inbox.stats();
    assert_eq!(
        (stats.consumed, stats.duplicates),
        (3 + 2, 3),
        "the second copy of a new id counts as a duplicate"
    );
    match handled {
        Handled::Consumed(ids) => {
            assert_eq!(
                ids, fresh_ids,
                "each new id once, though the batch repeats one"
            );
        }
        Handled::Duplicate => panic!("two events were new"),
    }

    let mut tx = client.transaction().unwrap();
    let dup: Vec<_> = old.iter().map(|id| event(Some(*id))).collect();
    let out = inbox
        .handle_batch_in(&mut tx, &dup, |_, _| -> Result<(), Error> {
            panic!("duplicates only: not called")
        })
        .unwrap();
    assert!(out.is_duplicate());
    let err = inbox
        .handle_batch_in(&mut tx, &[event(None)], |_, _| Ok::<_, Error>(()))
        .unwrap_err();
    assert!(matches!(err, Error::MissingEventId(_)), "{err}");
}

#[test]
fn two_threads_racing_on_one_id_run_the_handler_once() {
    let p = "t_inbox_race_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let inbox = Inbox::new(&config(p), "svc").unwrap();
    for _ in 0..10 {
        let id = EventId::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let barrier = Arc::new(Barrier::new(2));
        let handles: Vec<_> = (0..2)
            .map(|_| {
                let (inbox, store, runs, barrier) =
                    (inbox.clone(), store.clone(), runs.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    inbox
                        .handle_pg(store.pool(), id, |_| {
                            runs.fetch_add(1, Ordering::SeqCst);
                            std::thread::sleep(Duration::from_millis(50)); // hold the row lock
                            Ok::<_, Error>(())
                        })
                        .unwrap()
                })
            })
            .collect();
        let results: Vec<_> = handles.into_iter().map(|h| h.join().unwrap()).collect();
        assert_eq!(runs.load(Ordering::SeqCst), 1);
        assert_eq!(
            results.iter().filter(|r| r.is_duplicate()).count(),
            1,
            "{results:?}"
        );
        assert_eq!(recorded(&mut client, p, id), 1);
    }
}

#[test]
fn a_cache_hit_does_not_touch_the_database() {
    let p = "t_inbox_cache_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let inbox = Inbox::new(&config(p), "svc")
        .unwrap()
        .with_cache(MemoryCache::new(1000));
    let id = EventId::new();
    inbox
        .handle_pg(store.pool(), id, |_| Ok::<_, Error>(()))
        .unwrap();
    let before = inbox.stats();
    assert_eq!((before.cache_misses, before.statements), (1, 1));

    // A transaction that refuses every statement: only a cache hit can answer.
    let mut tx = client.transaction().unwrap();
    assert!(tx.execute("SELECT 1/0", &[]).is_err());
    let out = inbox
        .handle_in(&mut tx, id, |_| -> Result<(), Error> {
            panic!("a duplicate")
        })
        .unwrap();
    assert!(out.is_duplicate());
    // ... and a pool whose database is unreachable
    let nowhere = r2d2::Pool::builder()
        .connection_timeout(Duration::from_millis(300))
        .build_unchecked(r2d2_postgres::PostgresConnectionManager::new(
            "postgres://nobody@127.0.0.1:1/none".parse().unwrap(),
            postgres::NoTls,
        ));
    assert!(inbox
        .handle_pg(&nowhere, id, |_| -> Result<(), Error> {
            panic!("a duplicate")
        })
        .unwrap()
        .is_duplicate());
    let after = inbox.stats();
    assert_eq!(
        after.statements, before.statements,
        "no statement for cache hits"
    );
    assert_eq!(after.cache_hits, 2);
    // a miss does go to the database (and fails here, as it should)
    assert!(inbox
        .handle_pg(&nowhere, EventId::new(), |_| Ok::<_, Error>(()))
        .is_err());
}

#[test]
fn a_rolled_back_handler_leaves_no_cached_id() {
    let p = "t_inbox_cache_rb_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let cache = Arc::new(MemoryCache::new(1000));
    struct Shared(Arc<MemoryCache>);
    impl InboxCache for Shared {
        fn contains(&self, key: &str) -> txbox::Result<bool> {
            self.0.contains(key)
        }
        fn insert(&self, key: &str, ttl: Duration) -> txbox::Result<()> {
            self.0.insert(key, ttl)
        }
    }
    let inbox = Inbox::new(&config(p), "svc")
        .unwrap()
        .with_cache(Shared(cache.clone()));
    let id = EventId::new();
    assert!(inbox
        .handle_pg(store.pool(), id, |_| Err::<(), _>(Error::InvalidInput(
            "boom".into()
        )))
        .is_err());
    assert!(
        !cache.contains(&inbox.cache_key(id)).unwrap(),
        "not cached after a rollback"
    );
    assert!(cache.is_empty());
    inbox
        .handle_pg(store.pool(), id, |_| Ok::<_, Error>(()))
        .unwrap();
    assert!(
        cache.contains(&inbox.cache_key(id)).unwrap(),
        "cached after the commit"
    );
}

#[cfg(feature = "redis")]
#[test]
fn redis_cache_keeps_service_names_apart_and_skips_rollbacks() {
    use txbox::RedisCache;
    let url = std::env::var("TXBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    if !service_up("Redis", "127.0.0.1:6379") {
        return;
    }
    let (pa, pb) = ("t_inbox_redis_a_", "t_inbox_redis_b_");
    let Some((store_a, _c)) = fresh(pa) else {
        return;
    };
    let Some((store_b, _c)) = fresh(pb) else {
        return;
    };
    let a = Inbox::new(&config(pa), "billing")
        .unwrap()
        .with_cache(RedisCache::new(&url).unwrap());
    let b = Inbox::new(&config(pb), "shipping")
        .unwrap()
        .with_cache(RedisCache::new(&url).unwrap());
    let probe = RedisCache::new(&url).unwrap();
    let id = EventId::new();
    assert!(!a
        .handle_pg(store_a.pool(), id, |_| Ok::<_, Error>(()))
        .unwrap()
        .is_duplicate());
    assert!(probe.contains(&a.cache_key(id)).unwrap());
    assert!(!probe.contains(&b.cache_key(id)).unwrap());
    assert_ne!(a.cache_key(id), b.cache_key(id));
    // the same id at another service is new there
    assert!(!b
        .handle_pg(store_b.pool(), id, |_| Ok::<_, Error>(()))
        .unwrap()
        .is_duplicate());
    // and a duplicate at the first is answered by Redis
    assert!(a
        .handle_pg(store_a.pool(), id, |_| Ok::<_, Error>(()))
        .unwrap()
        .is_duplicate());
    assert_eq!(a.stats().cache_hits, 1);

    let failed = EventId::new();
    assert!(a
        .handle_pg(store_a.pool(), failed, |_| Err::<(), _>(
            Error::InvalidInput("no".into())
        ))
        .is_err());
    assert!(
        !probe.contains(&a.cache_key(failed)).unwrap(),
        "a rolled-back id is never cached"
    );
}

#[test]
fn cleanup_honours_the_ttl_and_the_batch_bound() {
    let p = "t_inbox_clean_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let inbox = Inbox::new(&config(p), "svc")
        .unwrap()
        .with_store(store.clone())
        .unwrap();
    let ids: Vec<EventId> = (0..25).map(|_| EventId::new()).collect();
    for id in &ids {
        inbox
            .handle_at_most_once(*id, || Ok::<_, Error>(()))
            .unwrap();
    }
    let old: Vec<uuid::Uuid> = ids[..15].iter().map(|i| i.as_uuid()).collect();
    client
        .execute(
            &format!("UPDATE {p}inbox_consumed SET consumed_at = now() - interval '2 days' WHERE event_id = ANY($1)"),
            &[&old],
        )
        .unwrap();
    assert_eq!(
        store
            .delete_expired_inbox(Duration::from_secs(86_400), 4)
            .unwrap(),
        4,
        "bounded"
    );

    let config = Config::builder()
        .table_prefix(p)
        .inbox(|i| i.ttl(Duration::from_secs(86_400)))
        .inbox(|i| i.cache_ttl(Duration::from_secs(60)))
        .inbox(|i| i.cleanup_interval(Duration::from_millis(100)))
        .inbox(|i| i.batch_size(3))
        .build()
        .unwrap();
    let cleanup = InboxCleanup::start(store, &config).unwrap();
    let total = format!("SELECT count(*) FROM {p}inbox_consumed");
    wait_until("old ids deleted", Duration::from_secs(10), || {
        client.query_one(&total, &[]).unwrap().get::<_, i64>(0) == 10
    });
    cleanup.shutdown(Duration::from_secs(5)).unwrap();
    for id in &ids[15..] {
        assert_eq!(recorded(&mut client, p, *id), 1, "young ids stay");
    }
}

/// Two consumers of the same events in one database (billing and shipping, two
/// handlers in one monolith): 500 shared ids, each delivered twice to each
/// consumer, make 1,000 handled effects, one per (consumer, event).
#[test]
fn two_consumers_of_the_same_events_each_handle_every_event_once() {
    let p = "t_inbox_fan_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    client
        .batch_execute(&format!(
            "DROP TABLE IF EXISTS {p}effects; CREATE TABLE {p}effects (consumer text, id uuid)"
        ))
        .unwrap();
    let effect = format!("INSERT INTO {p}effects VALUES ($1, $2)");
    let ids: Vec<EventId> = (0..500).map(|_| EventId::new()).collect();
    for consumer in ["billing", "shipping"] {
        let inbox = Inbox::new(&config(p), consumer).unwrap();
        for _delivery in 0..2 {
            for id in &ids {
                inbox
                    .handle_pg(store.pool(), *id, |tx| {
                        tx.execute(&effect, &[&consumer, &id.as_uuid()])
                            .map_err(Error::from)?;
                        Ok::<_, Error>(())
                    })
                    .unwrap();
            }
        }
    }
    let row = client
        .query_one(
            &format!("SELECT count(*), count(DISTINCT (consumer, id)) FROM {p}effects"),
            &[],
        )
        .unwrap();
    assert_eq!(
        (row.get::<_, i64>(0), row.get::<_, i64>(1)),
        (1000, 1000),
        "each consumer handled each event exactly once"
    );
}

/// An inbox whose store was opened on other tables than its configuration
/// would record ids in two places (its transaction's tables and the store's),
/// and a cleanup would clean only one: both are refused, naming both prefixes.
#[test]
fn an_inbox_store_on_other_tables_than_the_configuration_is_refused() {
    let p = "t_inbox_prefix_";
    let Some((store, _client)) = fresh(p) else {
        return;
    };
    let other = config("t_inbox_other_");
    let err = Inbox::new(&other, "svc")
        .unwrap()
        .with_store(store.clone())
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.starts_with(
            "table_prefix is \"t_inbox_other_\" but the store was opened with \"t_inbox_prefix_\""
        ),
        "{err}"
    );
    let err = txbox::InboxCleanup::start(store.clone(), &other)
        .err()
        .expect("refused")
        .to_string();
    assert!(
        err.contains("the inbox cleanup would use different tables"),
        "{err}"
    );
    // the same prefix is accepted
    let cleanup = txbox::InboxCleanup::start(store.clone(), &config(p)).unwrap();
    cleanup.shutdown(Duration::from_secs(5)).unwrap();
    Inbox::new(&config(p), "svc")
        .unwrap()
        .with_store(store)
        .unwrap();
}

/// Two inboxes of one service name on other tables (another prefix, or
/// another database that says so) share one Redis without seeing each
/// other's ids: each runs its handler for an id the other consumed.
#[cfg(feature = "redis")]
#[test]
fn redis_cache_keeps_table_prefixes_and_databases_apart() {
    use txbox::RedisCache;
    let url = std::env::var("TXBOX_REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    if !service_up("Redis", "127.0.0.1:6379") {
        return;
    }
    let (pa, pb) = ("t_inbox_scope_a_", "t_inbox_scope_b_");
    let Some((store_a, _c)) = fresh(pa) else {
        return;
    };
    let Some((store_b, _c)) = fresh(pb) else {
        return;
    };
    let inbox = |p: &str| {
        Inbox::new(&config(p), "billing")
            .unwrap()
            .with_cache(RedisCache::new(&url).unwrap())
    };
    let (a, b) = (inbox(pa), inbox(pb));
    let id = EventId::new();
    for (inbox, store) in [(&a, &store_a), (&b, &store_b)] {
        let mut ran = false;
        let handled = inbox
            .handle_pg(store.pool(), id, |_| {
                ran = true;
                Ok::<_, Error>(())
            })
            .unwrap();
        assert!(ran && !handled.is_duplicate(), "new on these tables");
    }
    assert_ne!(a.cache_key(id), b.cache_key(id));
    // one prefix in two databases: the database named for the cache
    let c = Inbox::new(&config(pa), "billing")
        .unwrap()
        .cache_database("orders-eu")
        .with_cache(RedisCache::new(&url).unwrap());
    assert_ne!(a.cache_key(id), c.cache_key(id));
    assert!(!RedisCache::new(&url)
        .unwrap()
        .contains(&c.cache_key(id))
        .unwrap());
}

/// A Redis that takes connections and never answers (a hung server): the
/// inbox goes on without its cache, and its calls do not queue behind one
/// another's timeouts: after the first ones time out together, the cache is
/// skipped at once for a while instead of tried again by every call.
#[cfg(feature = "redis")]
#[test]
fn a_hung_redis_neither_serializes_nor_slows_the_inbox() {
    use txbox::RedisCache;
    let p = "t_inbox_redis_hung_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let counter = accepted.clone();
    std::thread::spawn(move || {
        let mut held = Vec::new();
        for s in listener.incoming().flatten() {
            counter.fetch_add(1, Ordering::SeqCst);
            held.push(s); // read nothing, answer nothing
        }
    });
    let timeout = Duration::from_millis(500);
    let cache = RedisCache::builder(&format!("redis://{addr}"))
        .connect_timeout(timeout)
        .command_timeout(timeout)
        .build()
        .unwrap();
    let inbox = Inbox::new(&config(p), "billing").unwrap().with_cache(cache);
    let (threads, calls) = (8, 5);
    let started = std::time::Instant::now();
    std::thread::scope(|s| {
        for _ in 0..threads {
            let (inbox, store) = (inbox.clone(), store.clone());
            s.spawn(move || {
                for _ in 0..calls {
                    let id = EventId::new();
                    let handled = inbox
                        .handle_pg(store.pool(), id, |_| Ok::<_, Error>(()))
                        .unwrap();
                    assert!(!handled.is_duplicate());
                }
            });
        }
    });
    let took = started.elapsed();
    let total: i64 = client
        .query_one(&format!("SELECT count(*) FROM {p}inbox_consumed"), &[])
        .unwrap()
        .get(0);
    assert_eq!(total, (threads * calls) as i64, "every call handled");
    // one at a time, each waiting for its timeout, 40 calls took 20 s and more
    assert!(
        took < timeout * 6,
        "{} calls took {took:?} with a command timeout of {timeout:?}",
        threads * calls
    );
    assert!(
        accepted.load(Ordering::SeqCst) <= threads,
        "{} connections to the hung Redis",
        accepted.load(Ordering::SeqCst)
    );
}

/// After a failure (its connections killed by the server) the cache is
/// skipped for a moment, then used again.
#[cfg(feature = "redis")]
#[test]
fn the_redis_cache_is_used_again_after_a_failure() {
    use txbox::RedisCache;
    if !service_up("Redis", "127.0.0.1:6379") {
        return;
    }
    // a database of its own: the connections to kill are those on it
    let url = "redis://127.0.0.1:6379/7";
    let redis_cli = |args: &[&str]| {
        let out = std::process::Command::new("redis-cli")
            .args(["-u", url])
            .args(args)
            .output()
            .expect("redis-cli runs");
        assert!(out.status.success(), "{out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let cache = RedisCache::new(url).unwrap();
    let key = format!("txbox:test:{}", unique());
    cache.insert(&key, Duration::from_secs(60)).unwrap();
    assert!(cache.contains(&key).unwrap());
    // the server drops the cache's idle connection
    let ids: Vec<String> = redis_cli(&["CLIENT", "LIST"])
        .lines()
        .filter(|l| l.contains(" db=7 ") && !l.contains("cmd=client"))
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .strip_prefix("id=")
                .map(str::to_owned)
        })
        .collect();
    assert!(!ids.is_empty(), "the cache's connection is listed");
    for id in &ids {
        redis_cli(&["CLIENT", "KILL", "ID", id]);
    }
    let failed = cache.contains(&key);
    assert!(failed.is_err(), "its connection was killed: {failed:?}");
    assert!(cache.contains(&key).is_err(), "skipped right after");
    wait_until("the cache answers again", Duration::from_secs(2), || {
        cache.contains(&key).unwrap_or(false)
    });
}
