//! txbox in one screen: business transactions publish events into the outbox (some
//! roll back), a relay delivers the committed ones, and the program checks that none
//! was lost, none duplicated, and no rolled-back event escaped. It tells what it
//! does as it goes: the configuration, each order's transaction, what the relay
//! delivered and where the rows are.
//!
//! ```text
//! cargo run --example quickstart                                    # SQLite in a temp file
//! cargo run --example quickstart -- --database-url postgres://postgres@127.0.0.1/test
//! cargo run --features mysql --example quickstart -- --database-url mysql://root@127.0.0.1/test
//! ```
//! The last line is `quickstart: published=N delivered=N rolled_back=M lost=0 duplicates=0`;
//! the exit code is non-zero if anything was lost or duplicated.

use std::collections::{HashMap, HashSet};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};
use txbox::FullStore;

use serde::Serialize;
use txbox::{Config, EventId, MemorySender, Outbox, Relay, Transaction};

#[derive(Serialize)]
struct OrderCreated {
    order: i64,
    customer: String,
    total_cents: i64,
}

const ORDERS: i64 = 10;

fn order(i: i64) -> OrderCreated {
    OrderCreated {
        order: i,
        customer: format!("customer-{}", i % 7),
        total_cents: 1000 + i * 37,
    }
}

/// Every fifth order is declined: its transaction rolls back, order row and event alike.
fn declined(i: i64) -> bool {
    i % 5 == 4
}

/// Publishes the order's event in the caller's open transaction.
fn publish<T: Transaction>(outbox: &Outbox, tx: &mut T, i: i64) -> txbox::Result<EventId> {
    outbox.publish(tx, "order-created", &order(i))
}

type Ids = (HashSet<EventId>, HashSet<EventId>);

/// Ends order `i`'s transaction: a declined order rolls back with its event, any
/// other commits with it. Records the event id as committed or rolled back.
fn end<T, E: Into<Box<dyn std::error::Error>>>(
    ids: &mut Ids,
    i: i64,
    id: EventId,
    tx: T,
    commit: impl FnOnce(T) -> Result<(), E>,
    rollback: impl FnOnce(T) -> Result<(), E>,
) -> Result<(), Box<dyn std::error::Error>> {
    let o = order(i);
    if declined(i) {
        rollback(tx).map_err(Into::into)?;
        ids.1.insert(id);
        println!(
            "  order {i:>2}: declined, rolled back: the order row and event {id} are gone together"
        );
    } else {
        commit(tx).map_err(Into::into)?;
        ids.0.insert(id);
        println!(
            "  order {i:>2}: committed with event {id} ({} cents for {})",
            o.total_cents, o.customer
        );
    }
    Ok(())
}

fn sqlite(path: &std::path::Path, outbox: &Outbox) -> Result<Ids, Box<dyn std::error::Error>> {
    let mut conn = txbox::SqliteStore::connection(path)?;
    conn.execute_batch("CREATE TABLE IF NOT EXISTS quickstart_orders (id INTEGER PRIMARY KEY, total_cents INTEGER)")?;
    let mut ids: Ids = Default::default();
    for i in 0..ORDERS {
        let mut tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
        tx.execute(
            "INSERT INTO quickstart_orders (total_cents) VALUES (?1)",
            [order(i).total_cents],
        )?;
        let id = publish(outbox, &mut tx, i)?;
        end(&mut ids, i, id, tx, |tx| tx.commit(), |tx| tx.rollback())?;
    }
    Ok(ids)
}

fn postgres(url: &str, outbox: &Outbox) -> Result<Ids, Box<dyn std::error::Error>> {
    let mut client = postgres::Client::connect(url, postgres::NoTls)?;
    client.batch_execute("DROP TABLE IF EXISTS quickstart_orders; CREATE TABLE quickstart_orders (id bigserial PRIMARY KEY, total_cents bigint)")?;
    let mut ids: Ids = Default::default();
    for i in 0..ORDERS {
        let mut tx = client.transaction()?;
        tx.execute(
            "INSERT INTO quickstart_orders (total_cents) VALUES ($1)",
            &[&order(i).total_cents],
        )?;
        let id = publish(outbox, &mut tx, i)?;
        end(&mut ids, i, id, tx, |tx| tx.commit(), |tx| tx.rollback())?;
    }
    Ok(ids)
}

#[cfg(feature = "mysql")]
fn mysql(url: &str, outbox: &Outbox) -> Result<Ids, Box<dyn std::error::Error>> {
    use mysql::prelude::Queryable;
    let pool = mysql::Pool::new(url)?;
    let mut conn = pool.get_conn()?;
    conn.query_drop("DROP TABLE IF EXISTS quickstart_orders")?;
    conn.query_drop(
        "CREATE TABLE quickstart_orders (id BIGINT AUTO_INCREMENT PRIMARY KEY, total_cents BIGINT)",
    )?;
    let mut ids: Ids = Default::default();
    for i in 0..ORDERS {
        let mut tx = conn.start_transaction(mysql::TxOpts::default())?;
        tx.exec_drop(
            "INSERT INTO quickstart_orders (total_cents) VALUES (?)",
            (order(i).total_cents,),
        )?;
        let id = publish(outbox, &mut tx, i)?;
        end(&mut ids, i, id, tx, |tx| tx.commit(), |tx| tx.rollback())?;
    }
    Ok(ids)
}

fn database_url() -> Result<Option<String>, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.as_slice() {
        [] => Ok(std::env::var("TXBOX_DATABASE_URL")
            .ok()
            .filter(|u| !u.is_empty())),
        [flag, url] if flag == "--database-url" => Ok(Some(url.clone())),
        _ => Err(format!(
            "unexpected arguments {args:?} (usage: quickstart [--database-url URL])"
        )),
    }
}

fn main() -> ExitCode {
    let _ = env_logger::builder()
        .filter_level(log::LevelFilter::Warn)
        .parse_default_env()
        .try_init();
    match run() {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(e) => {
            eprintln!("quickstart: error: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<bool, Box<dyn std::error::Error>> {
    let config = Config::builder()
        .table_prefix("quickstart_")
        .defaults(|e| e.adaptive_polling(Duration::from_millis(50), Duration::from_secs(2), 1.5))
        .event("order-created", |e| e.destination("orders"))
        .dlq(|d| d.enabled(true))
        .build()?;
    let outbox = Outbox::new(&config)?;
    let url = database_url()?;
    let tmp = std::env::temp_dir().join(format!("txbox-quickstart-{}.db", std::process::id()));

    // The store (schema is idempotent, so every run migrates) and the relay beside
    // the business code.
    let store: Arc<dyn FullStore> = match url.as_deref() {
        None => Arc::new(txbox::SqliteStore::connect(&tmp.to_string_lossy(), &config)?),
        Some(u) if u.starts_with("postgres") => Arc::new(txbox::PgStore::connect(u, &config)?),
        #[cfg(feature = "mysql")]
        Some(u) if u.starts_with("mysql") => Arc::new(txbox::MySqlStore::connect(u, &config)?),
        Some(u) => return Err(format!("unsupported database url {u:?} (sqlite is the default; postgres://, or mysql:// with --features mysql)").into()),
    };
    store.migrate()?;
    let where_ = match url.as_deref() {
        None => format!("SQLite file {} (removed at the end)", tmp.display()),
        Some(u) => u.split('@').next_back().unwrap_or(u).to_string(),
    };
    println!("database: {where_}, schema migrated (tables quickstart_outbox_events, ...)");
    println!(
        "config: event type order-created -> destination \"orders\", adaptive polling 50ms..2s, DLQ on"
    );
    let sender = MemorySender::new();
    let relay = Relay::start(store.clone(), &config, sender.clone())?;
    let threads = relay.probe().threads().1;
    println!(
        "relay: {threads} threads (one poller, recovery, cleanup, three for the DLQ{}), sending to memory",
        if threads > 6 { ", the commit listener" } else { "" }
    );
    println!("publishing {ORDERS} orders, each in its own transaction (every fifth is declined):");
    // PostgreSQL wakes the relay on commit by itself; on SQLite and MySQL the
    // code that commits wakes it, so nothing waits for the next poll
    let waker = relay.waker();

    let (published, rolled_back) = match url.as_deref() {
        None => sqlite(&tmp, &outbox)?,
        #[cfg(feature = "mysql")]
        Some(u) if u.starts_with("mysql") => mysql(u, &outbox)?,
        Some(u) => postgres(u, &outbox)?,
    };
    waker.wake("order-created");

    // Wait until every committed event was delivered (or give up after 30 s).
    let deadline = Instant::now() + Duration::from_secs(30);
    let delivered_all = || {
        let sent: HashSet<_> = sender.sent().iter().map(|e| e.id).collect();
        published.iter().all(|id| sent.contains(id))
    };
    while !delivered_all() && Instant::now() < deadline {
        sender.wait_for(sender.len() + 1, Duration::from_millis(200));
    }
    // long enough for the batches in flight to get their acks
    let deadline = relay.ack_wait().unwrap_or_default() + Duration::from_secs(5);
    relay.shutdown(deadline)?;
    let sent = sender.sent();
    println!(
        "relay: delivered {} events to destination {:?}, each acked before its row was marked PROCESSED",
        sent.len(),
        sent.first().map(|e| e.destination.as_str()).unwrap_or("orders")
    );
    let waiting: u64 = store
        .status()?
        .iter()
        .map(|s| s.pending + s.in_process + s.failed)
        .sum();
    println!(
        "rows: the orders in quickstart_orders, the events in quickstart_outbox_events \
         ({waiting} still to send; PROCESSED rows are cleaned after processed_ttl)"
    );
    if url.is_none() {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", tmp.display()));
        }
    }

    let mut times: HashMap<EventId, usize> = HashMap::new();
    for e in sender.sent() {
        *times.entry(e.id).or_default() += 1;
    }
    let delivered = published.iter().filter(|id| times.contains_key(id)).count();
    let lost = published.len() - delivered;
    let duplicates: usize = times.values().map(|n| n - 1).sum();
    let escaped = rolled_back
        .iter()
        .filter(|id| times.contains_key(id))
        .count();
    if escaped > 0 {
        eprintln!("quickstart: {escaped} rolled-back events were sent");
    }
    println!(
        "quickstart: published={} delivered={delivered} rolled_back={} lost={lost} duplicates={duplicates}",
        published.len(),
        rolled_back.len()
    );
    Ok(lost == 0 && duplicates == 0 && escaped == 0)
}
