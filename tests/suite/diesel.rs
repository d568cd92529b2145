//! Publishing and the inbox inside a Diesel transaction (feature `diesel`),
//! on PostgreSQL, MariaDB and SQLite: the event rows, the inbox's ids and the
//! service's own Diesel writes commit or roll back together.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use diesel::connection::SimpleConnection;
use diesel::{Connection, RunQueryDsl};
use txbox::{Config, Error, EventId, Outbox};
use txbox::{Handled, Inbox};
use uuid::Uuid;

use crate::common::backend::{mysql_url, Backend, Fixture};
use crate::common::pg_url;

/// A Diesel connection of one backend.
enum Conn {
    Pg(diesel::PgConnection),
    My(diesel::MysqlConnection),
    Lite(diesel::SqliteConnection),
}

/// Runs `$body` in a `txbox::diesel::transaction` on `$conn`, whatever its
/// backend, with `$tx` the transaction.
macro_rules! in_tx {
    ($conn:expr, |$tx:ident| $body:expr) => {
        match $conn {
            Conn::Pg(c) => txbox::diesel::transaction(c, |$tx| $body),
            Conn::My(c) => txbox::diesel::transaction(c, |$tx| $body),
            Conn::Lite(c) => txbox::diesel::transaction(c, |$tx| $body),
        }
    };
}

impl Conn {
    fn open(fx: &Fixture) -> Conn {
        match fx.backend {
            Backend::Postgres => Conn::Pg(diesel::PgConnection::establish(&pg_url()).unwrap()),
            Backend::MySql => Conn::My(diesel::MysqlConnection::establish(&mysql_url()).unwrap()),
            Backend::Sqlite => {
                let path = fx.sqlite_path().to_str().unwrap().to_owned();
                let mut c = diesel::SqliteConnection::establish(&path).unwrap();
                c.batch_execute("PRAGMA busy_timeout = 5000").unwrap();
                Conn::Lite(c)
            }
            #[allow(unreachable_patterns)]
            other => panic!("no Diesel connection for {other:?}"),
        }
    }

    fn batch(&mut self, sql: &str) {
        match self {
            Conn::Pg(c) => c.batch_execute(sql).unwrap(),
            Conn::My(c) => c.batch_execute(sql).unwrap(),
            Conn::Lite(c) => c.batch_execute(sql).unwrap(),
        }
    }
}

fn config(p: &str) -> Config {
    Config::builder()
        .table_prefix(p)
        .event("e", |e| e)
        .event("f", |e| e)
        .build()
        .unwrap()
}

/// The payloads of the pending events of `event_type`, oldest first.
fn pending(fx: &Fixture, event_type: &str) -> Vec<String> {
    fx.store
        .claim(event_type, 100, Duration::from_secs(60), Uuid::now_v7())
        .unwrap()
        .iter()
        .map(|e| e.payload_str().unwrap().to_owned())
        .collect()
}

/// A fresh business table `<p>orders` on the fixture's database.
fn orders(conn: &mut Conn, p: &str) {
    conn.batch(&format!("DROP TABLE IF EXISTS {p}orders"));
    conn.batch(&format!("CREATE TABLE {p}orders (total BIGINT NOT NULL)"));
}

fn insert_order(p: &str, total: i64) -> diesel::query_builder::SqlQuery {
    diesel::sql_query(format!("INSERT INTO {p}orders (total) VALUES ({total})"))
}

/// Commit sends the event with the business row; an error in the closure
/// rolls back both; a savepoint rolled back drops its event and keeps the
/// outer one.
pub(super) fn a_diesel_transaction_commits_or_drops_its_events(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let outbox = Outbox::new(&c).unwrap();
    let mut conn = Conn::open(&fx);
    orders(&mut conn, p);
    let committed: Result<EventId, Error> = in_tx!(&mut conn, |tx| {
        insert_order(p, 1).execute(tx.conn())?;
        outbox.publish(tx, "e", &1)
    });
    committed.unwrap();
    let failed: Result<(), Error> = in_tx!(&mut conn, |tx| {
        insert_order(p, 2).execute(tx.conn())?;
        outbox.publish(tx, "e", &2)?;
        Err(Error::InvalidInput("the order was refused".into()))
    });
    assert!(failed.is_err());
    let nested: Result<(), Error> = in_tx!(&mut conn, |tx| {
        insert_order(p, 3).execute(tx.conn())?;
        outbox.publish(tx, "e", &3)?;
        let inner: Result<(), Error> = tx.transaction(|tx| {
            insert_order(p, 4).execute(tx.conn())?;
            outbox.publish(tx, "e", &4)?;
            Err(Error::InvalidInput("the gift was refused".into()))
        });
        assert!(inner.is_err());
        Ok(())
    });
    nested.unwrap();
    assert_eq!(pending(&fx, "e"), ["1", "3"], "{b:?}");
    let count = |conn: &mut Conn| -> i64 {
        #[derive(diesel::QueryableByName)]
        struct N {
            #[diesel(sql_type = diesel::sql_types::BigInt)]
            n: i64,
        }
        let q = diesel::sql_query(format!("SELECT COUNT(*) AS n FROM {p}orders"));
        let rows: Vec<N> = match conn {
            Conn::Pg(c) => q.load(c).unwrap(),
            Conn::My(c) => q.load(c).unwrap(),
            Conn::Lite(c) => q.load(c).unwrap(),
        };
        rows[0].n
    };
    assert_eq!(
        count(&mut conn),
        2,
        "{b:?}: the orders of the committed transactions"
    );
    // delayed, keyed and binary events go the same way
    let more: Result<Vec<EventId>, Error> = in_tx!(&mut conn, |tx| {
        outbox.publish_all(
            tx,
            [
                txbox::NewEvent::new("f", &"later")?.deliver_after(Duration::from_secs(3600)),
                txbox::NewEvent::bytes("f", vec![0u8, 159, 146, 150], "application/octet-stream")
                    .key("k")
                    .header("source", "diesel"),
            ],
        )
    });
    more.unwrap();
    let f = fx
        .store
        .claim("f", 10, Duration::from_secs(60), Uuid::now_v7())
        .unwrap();
    assert_eq!(f.len(), 1, "{b:?}: the delayed one waits");
    assert_eq!(f[0].payload, [0u8, 159, 146, 150]);
    assert_eq!(f[0].key.as_deref(), Some("k"));
    assert_eq!(f[0].headers["source"], "diesel");
    conn.batch(&format!("DROP TABLE {p}orders"));
}

/// The inbox in a Diesel transaction: a redelivered event runs its handler
/// once, and the handler's follow-up event is sent only when its
/// transaction commits.
pub(super) fn the_inbox_on_diesel_handles_once_and_publishes_on_commit(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = config(p);
    let outbox = Outbox::new(&c).unwrap();
    let inbox = Inbox::new(&c, "billing").unwrap();
    let mut conn = Conn::open(&fx);
    let runs = AtomicUsize::new(0);
    let id = EventId::new();
    for _ in 0..2 {
        let handled: Result<Handled<()>, Error> = in_tx!(&mut conn, |tx| {
            inbox.handle_in(tx, id, |tx| {
                runs.fetch_add(1, Ordering::Relaxed);
                outbox.publish(tx, "f", &"invoice")?;
                Ok(())
            })
        });
        handled.unwrap();
    }
    assert_eq!(
        runs.load(Ordering::Relaxed),
        1,
        "{b:?}: the redelivery was skipped"
    );
    // a handler that fails: its id and its follow-up roll back together
    let other = EventId::new();
    let failed: Result<Handled<()>, Error> = in_tx!(&mut conn, |tx| {
        inbox.handle_in(tx, other, |tx| {
            outbox.publish(tx, "f", &"never")?;
            Err(Error::InvalidInput("the invoice could not be made".into()))
        })
    });
    assert!(failed.is_err());
    assert_eq!(pending(&fx, "f"), ["\"invoice\""], "{b:?}");
    // redelivered after the failure, it runs again
    let again: Result<Handled<()>, Error> =
        in_tx!(&mut conn, |tx| { inbox.handle_in(tx, other, |_| Ok(())) });
    assert!(matches!(again.unwrap(), Handled::Consumed(())), "{b:?}");
}

/// A `diesel::r2d2` pooled connection publishes the same way, through
/// `&mut *pooled`.
#[test]
fn a_pooled_diesel_connection_publishes() {
    use diesel::r2d2::{ConnectionManager, Pool};
    let p = "t_diesel_pool_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let c = config(p);
    let outbox = Outbox::new(&c).unwrap();
    let pool = Pool::builder()
        .max_size(2)
        .build(ConnectionManager::<diesel::PgConnection>::new(pg_url()))
        .unwrap();
    let mut pooled = pool.get().unwrap();
    let published: Result<EventId, Error> =
        txbox::diesel::transaction(&mut *pooled, |tx| outbox.publish(tx, "e", &"pooled"));
    published.unwrap();
    assert_eq!(pending(&fx, "e"), ["\"pooled\""]);
}

/// PostgreSQL's wake-up on commit fires for a Diesel commit too (it is a
/// trigger of the outbox table), and not for a rollback.
#[test]
fn a_diesel_commit_wakes_the_relay_on_postgres() {
    let p = "t_diesel_wake_";
    let Some(fx) = Fixture::new(Backend::Postgres, p) else {
        return;
    };
    let c = config(p);
    let outbox = Outbox::new(&c).unwrap();
    let mut conn = Conn::open(&fx);
    let mut listening = crate::common::listening(p);
    let rolled_back: Result<(), Error> = in_tx!(&mut conn, |tx| {
        outbox.publish(tx, "f", &0)?;
        Err(Error::InvalidInput("no".into()))
    });
    assert!(rolled_back.is_err());
    let committed: Result<EventId, Error> = in_tx!(&mut conn, |tx| outbox.publish(tx, "e", &1));
    committed.unwrap();
    let heard = crate::common::heard(&mut listening, Duration::from_secs(2));
    assert_eq!(heard, ["e"]);
}

macro_rules! on_each_backend {
    ($($test:ident => $short:literal,)*) => {
        mod postgres {
            $(#[test]
            fn $test() {
                super::$test(super::Backend::Postgres, concat!("d_pg_", $short, "_"));
            })*
        }
        mod mysql {
            $(#[test]
            fn $test() {
                super::$test(super::Backend::MySql, concat!("d_my_", $short, "_"));
            })*
        }
        mod sqlite {
            $(#[test]
            fn $test() {
                super::$test(super::Backend::Sqlite, concat!("d_lite_", $short, "_"));
            })*
        }
    };
}

on_each_backend! {
    a_diesel_transaction_commits_or_drops_its_events => "tx",
    the_inbox_on_diesel_handles_once_and_publishes_on_commit => "inbox",
}
