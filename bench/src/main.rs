//! The benchmark: what txbox costs a business transaction and how fast and how
//! safely it drains, each figure beside its baseline in the same run.
//!
//! ```text
//! cargo run --release -p txbox-bench            # quick (< 1 minute)
//! cargo run --release -p txbox-bench -- --full  # the full sizes
//! cargo run --release -p txbox-bench -- --help  # parts, window
//! ```
//! Needs PostgreSQL (`TXBOX_PG_URL`), RabbitMQ and Kafka (as in the tests). Prints one
//! table; docs/BENCHMARKS.md keeps a run.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txbox::{
    ClaimMode, ClaimStore, Config, DeadLetterStore, Event, EventId, EventSettings, InboxStore,
    MaintenanceStore, MemorySender, Outbox, PgStore, Relay, SendError, Sender, Started, Store,
};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn pg_url() -> String {
    std::env::var("TXBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

struct Size {
    txs: usize,
    batches: usize,
    floor: usize,
    brokers: usize,
    idle: Duration,
    rate_secs: u64,
    burst: usize,
    idle_single: Duration,
    /// how many single events after an idle spell are timed
    idle_samples: usize,
    instances: usize,
    /// pending rows under the ordered claim's plan
    plan_rows: usize,
    /// how long each run of the concurrent publishers lasts
    writers_secs: u64,
    /// `--trigger on|off|empty`: the publish overhead with the commit
    /// notification as shipped, its trigger disabled, or its function emptied
    /// (the trigger fires and sends nothing): what NOTIFY itself costs
    trigger: String,
    /// `--rounds N`: how many times the relay floor's turns and the brokers' relay
    /// and direct runs repeat; each figure is the median
    rounds: usize,
    /// `--in-flight N`: the relay's window for the broker rows (default: the
    /// configuration's default)
    in_flight: Option<usize>,
    /// `--delete-acked`: the relay floor and the brokers with `processed_ttl` zero
    delete_acked: bool,
    /// `--claim lock`: the relay floor and the brokers with held claims
    claim: ClaimMode,
}

impl Size {
    /// What the rows' labels add for held claims and deleted acked rows.
    fn mode(&self) -> String {
        let held = match self.claim {
            ClaimMode::Lock => ", held claims",
            ClaimMode::Lease => "",
        };
        let deleted = if self.delete_acked {
            ", acked rows deleted"
        } else {
            ""
        };
        format!("{held}{deleted}")
    }

    /// The configuration of the relay parts: processed rows kept or not, claims
    /// leased or held.
    fn relay_config(&self, prefix: &str, options: EventSettings) -> Config {
        config_with(prefix, options.claim(self.claim), self.delete_acked)
    }
}

/// `sql` with each placeholder `$n` replaced by `values[n - 1]` (a literal),
/// read as a whole number: `$10` is the tenth, not `$1` and a 0. An error for
/// a placeholder without a value.
fn with_literals(sql: &str, values: &[&str]) -> Res<String> {
    let mut out = String::with_capacity(sql.len());
    let mut rest = sql;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let after = &rest[i + 1..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            out.push('$');
            rest = after;
            continue;
        }
        let n: usize = after[..digits].parse()?;
        let value = values
            .get(n.wrapping_sub(1))
            .ok_or_else(|| format!("no value for ${n} in {sql}"))?;
        out.push_str(value);
        rest = &after[digits..];
    }
    out.push_str(rest);
    Ok(out)
}

fn fresh(prefix: &str) -> Res<(Arc<PgStore>, postgres::Client)> {
    let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls)?;
    let t = txbox::Tables::new(prefix)?;
    for table in [
        t.outbox(),
        t.dlq(),
        t.inbox(),
        t.locks(),
        t.schema_version(),
    ] {
        c.batch_execute(&format!("DROP TABLE IF EXISTS {table}"))?;
    }
    let store = Arc::new(PgStore::connect(
        &pg_url(),
        &Config::builder().table_prefix(prefix).build()?,
    )?);
    store.migrate()?;
    Ok((store, c))
}

/// One event type, `bench`; acked rows deleted when `delete_acked`.
fn config_with(prefix: &str, options: EventSettings, delete_acked: bool) -> Config {
    let b = Config::builder()
        .table_prefix(prefix)
        .event("bench", |_| options);
    let b = if delete_acked {
        b.processed_ttl(Duration::ZERO)
    } else {
        b
    };
    b.build().expect("config")
}

fn config(prefix: &str, options: EventSettings) -> Config {
    config_with(prefix, options, false)
}

/// The middle value (the mean of the middle two of an even count).
fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    (v[(n - 1) / 2] + v[n / 2]) / 2.0
}

/// CPU time the whole machine spent busy so far (every process, every core:
/// `/proc/stat`), or None where there is no `/proc/stat`.
fn machine_busy() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let ticks: Vec<f64> = stat
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .map(|t| t.parse().unwrap_or(0.0))
        .collect();
    // user nice system idle iowait irq softirq steal ...; in USER_HZ (100 on Linux);
    // busy: all but idle, iowait and what the hypervisor took (steal)
    let idle = ticks.get(3)? + ticks.get(4).unwrap_or(&0.0);
    let total: f64 = ticks.iter().take(7).sum();
    Some((total - idle) / 100.0)
}

/// Runs `f` and returns its result with the machine's CPU seconds it took (every
/// process: the client, the database, the broker), if they can be read.
fn with_cpu<T>(f: impl FnOnce() -> Res<T>) -> Res<(T, Option<f64>)> {
    let before = machine_busy();
    let r = f()?;
    Ok((r, before.zip(machine_busy()).map(|(b, a)| a - b)))
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

struct Row {
    what: String,
    txbox: String,
    baseline: String,
    ratio: String,
    target: &'static str,
}

fn row(
    what: impl Into<String>,
    txbox: String,
    baseline: String,
    ratio: f64,
    target: &'static str,
) -> Row {
    Row {
        what: what.into(),
        txbox,
        baseline,
        ratio: format!("{ratio:.2}"),
        target,
    }
}

/// A row of two latencies in milliseconds and their ratio.
fn ms_row(what: impl Into<String>, ours: f64, base: f64, target: &'static str) -> Row {
    row(
        what,
        format!("{ours:.3} ms"),
        format!("{base:.3} ms"),
        ours / base,
        target,
    )
}

fn publish_overhead(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_pub_";
    let (_store, mut c) = fresh(p)?;
    c.batch_execute("DROP TABLE IF EXISTS bench_orders; CREATE TABLE bench_orders (id bigserial PRIMARY KEY, total bigint)")?;
    match s.trigger.as_str() {
        "off" => c.batch_execute(&format!(
            "ALTER TABLE {p}outbox_events DISABLE TRIGGER {p}outbox_events_wake"
        ))?,
        "empty" => c.batch_execute(&format!(
            "CREATE OR REPLACE FUNCTION {p}txbox_wake() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$"
        ))?,
        _ => {}
    }
    let outbox = Outbox::new(&config(p, EventSettings::default()))?;
    // the least any outbox adds: the same row inserted by hand in the transaction,
    // with a statement prepared once (one round trip)
    let by_hand = c.prepare(&format!(
        "INSERT INTO {p}outbox_events (id, event_type, event_key, headers, payload) \
         VALUES ($1, $2, NULL, '{{}}', $3)"
    ))?;
    // the same `publish` with its statement prepared once on this connection
    let publisher = outbox.prepare_pg(&mut c)?;
    // in turn: without an event, with `publish`, with the prepared `publish`, with
    // the hand-written insert
    let mut ms: [Vec<f64>; 4] = Default::default();
    for i in 0..s.txs * 4 {
        let t = Instant::now();
        let mut tx = c.transaction()?;
        tx.execute(
            "INSERT INTO bench_orders (total) VALUES ($1)",
            &[&(i as i64)],
        )?;
        let payload = serde_json::json!({"order": i, "total": i});
        match i % 4 {
            1 => {
                outbox.publish(&mut tx, "bench", &payload)?;
            }
            2 => {
                outbox.publish(&mut publisher.on(&mut tx), "bench", &payload)?;
            }
            3 => {
                let id = uuid::Uuid::now_v7();
                tx.execute(&by_hand, &[&id, &"bench", &payload.to_string()])?;
            }
            _ => {}
        }
        tx.commit()?;
        ms[i % 4].push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let [without, with, prepared, hand] = &mut ms;
    let (m0, m1, m2, mh) = (
        median(without),
        median(with),
        median(prepared),
        median(hand),
    );
    out.push(ms_row(
        format!("publish overhead, median ({} tx)", s.txs),
        m1,
        m0,
        "<= 1.3",
    ));
    out.push(ms_row(
        "publish overhead, p99",
        pct(with, 0.99),
        pct(without, 0.99),
        "-",
    ));
    out.push(ms_row(
        "publish overhead, prepared (PgPrepared), median",
        m2,
        m0,
        "<= 1.3",
    ));
    out.push(ms_row(
        "publish overhead, prepared (PgPrepared), p99",
        pct(prepared, 0.99),
        pct(without, 0.99),
        "-",
    ));
    out.push(ms_row(
        "  the row by hand (prepared INSERT) vs no event: what any outbox adds",
        mh,
        m0,
        "-",
    ));
    Ok(())
}

fn batch_publish(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_batch_";
    let (_store, mut c) = fresh(p)?;
    let outbox = Outbox::new(&config(p, EventSettings::default()))?;
    let payloads: Vec<serde_json::Value> =
        (0..100).map(|i| serde_json::json!({"order": i})).collect();
    let (mut ours, mut hand) = (Vec::new(), Vec::new());
    for _ in 0..s.batches {
        let t = Instant::now();
        let mut tx = c.transaction()?;
        outbox.publish_all(&mut tx, txbox::NewEvent::batch("bench", &payloads)?)?;
        tx.commit()?;
        ours.push(t.elapsed().as_secs_f64() * 1000.0);

        // the same 100 rows, one hand-written multi-row INSERT
        let t = Instant::now();
        let mut tx = c.transaction()?;
        let mut sql = format!(
            "INSERT INTO {p}outbox_events (id, event_type, event_key, headers, payload) VALUES "
        );
        let mut params: Vec<Box<dyn postgres::types::ToSql + Sync>> = Vec::new();
        for (i, pl) in payloads.iter().enumerate() {
            if i > 0 {
                sql.push_str(", ");
            }
            let b = i * 3;
            sql.push_str(&format!(
                "(${}, ${}, NULL, '{{}}', ${})",
                b + 1,
                b + 2,
                b + 3
            ));
            params.push(Box::new(uuid::Uuid::now_v7()));
            params.push(Box::new("bench".to_string()));
            params.push(Box::new(pl.to_string()));
        }
        let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
            params.iter().map(|b| b.as_ref()).collect();
        tx.execute(sql.as_str(), &refs)?;
        tx.commit()?;
        hand.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let (a, b) = (median(&mut ours), median(&mut hand));
    out.push(ms_row(
        format!("batch publish of 100, median ({}x)", s.batches),
        a,
        b,
        "<= 1.5",
    ));
    Ok(())
}

fn fill(c: &mut postgres::Client, outbox: &Outbox, n: usize) -> Res<Vec<EventId>> {
    let mut ids = Vec::with_capacity(n);
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut tx = c.transaction()?;
        ids.extend(outbox.publish_all(
            &mut tx,
            txbox::NewEvent::batch("bench", chunk.iter().map(|i| serde_json::json!({"n": i})))?,
        )?);
        tx.commit()?;
    }
    Ok(ids)
}

/// `n` events for the ordered runs: keys `k0`..`k{keys - 1}` taking turns (each
/// key's events spread over the whole table, as a busy aggregate's are), or no
/// key when `keys` is 0.
fn fill_keyed(c: &mut postgres::Client, outbox: &Outbox, n: usize, keys: usize) -> Res<()> {
    for chunk in (0..n).collect::<Vec<_>>().chunks(1000) {
        let mut tx = c.transaction()?;
        let events = chunk
            .iter()
            .map(|i| {
                let e = txbox::NewEvent::new("bench", &serde_json::json!({"n": i}))?;
                Ok(if keys == 0 {
                    e
                } else {
                    e.key(format!("k{}", i % keys))
                })
            })
            .collect::<txbox::Result<Vec<_>>>()?;
        outbox.publish_all(&mut tx, events)?;
        tx.commit()?;
    }
    Ok(())
}

/// The relay floor (PostgreSQL -> memory) of an ordered type: 1,000 keys against
/// the same events unordered, in the same run, and 1 key (one event at a time).
fn ordered_floor(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_ordered_";
    let drain = |n: usize, keys: usize, ordering: txbox::EventOrder| -> Res<f64> {
        let cfg = s.relay_config(p, EventSettings::default().ordering(ordering));
        let (store, mut c) = fresh(p)?;
        fill_keyed(&mut c, &Outbox::new(&cfg)?, n, keys)?;
        let sender = MemorySender::new();
        let t = Instant::now();
        let relay = Relay::start(store, &cfg, sender.clone())?;
        if sender.wait_for(n, Duration::from_secs(600)) < n {
            return Err(format!("ordered floor: {keys} keys: not all {n} sent").into());
        }
        relay.shutdown(Duration::from_secs(10))?;
        // each key's events reached the sender in publish order
        let mut last: HashMap<String, i64> = HashMap::new();
        for e in sender.sent() {
            let i = serde_json::from_slice::<serde_json::Value>(&e.payload)?["n"]
                .as_i64()
                .unwrap_or(-1);
            if let Some(k) = &e.key {
                if ordering == txbox::EventOrder::Key
                    && last.insert(k.clone(), i).is_some_and(|b| b > i)
                {
                    return Err(format!("ordered floor: key {k} out of order").into());
                }
            }
        }
        Ok(n as f64 / t.elapsed().as_secs_f64())
    };
    let (mut ordered, mut unordered) = (Vec::new(), Vec::new());
    for _ in 0..s.rounds {
        unordered.push(drain(s.floor, 1000, txbox::EventOrder::None)?);
        ordered.push(drain(s.floor, 1000, txbox::EventOrder::Key)?);
    }
    let (ordered, unordered) = (median(&mut ordered), median(&mut unordered));
    out.push(row(
        format!("ordered relay floor, 1,000 keys, {} events", s.floor),
        format!("{ordered:.0} ev/s"),
        format!("{unordered:.0} ev/s (unordered)"),
        ordered / unordered,
        ">= 0.7",
    ));
    let one = (s.floor / 10).max(500);
    let rate = drain(one, 1, txbox::EventOrder::Key)?;
    out.push(row(
        format!("ordered relay floor, 1 key, {one} events (one event at a time)"),
        format!("{rate:.0} ev/s"),
        format!("{unordered:.0} ev/s (unordered)"),
        rate / unordered,
        "reported",
    ));
    Ok(())
}

/// The plan of an ordered claim over `s.plan_rows` pending events of 1,000 keys
/// (the first 10 of each key in process, so the look-ups find their keys busy),
/// as `EXPLAIN (ANALYZE)` gives it: printed, and a row with its time and whether
/// every table is read through an index.
fn ordered_plan(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_plan_";
    let cfg = config(p, EventSettings::default().ordering(txbox::EventOrder::Key));
    let (store, mut c) = fresh(p)?;
    fill_keyed(&mut c, &Outbox::new(&cfg)?, s.plan_rows, 1000)?;
    c.batch_execute(&format!("VACUUM ANALYZE {p}outbox_events"))?;
    let token = uuid::Uuid::now_v7();
    let args = txbox::ClaimArgs::new("bench", 200, Duration::from_secs(600))
        .ordered(txbox::OnPoison::Block);
    // the keys' heads in process: the next claim finds every key busy
    for _ in 0..5 {
        store.claim_after(&args, token)?;
    }
    let sql: HashMap<&str, String> = store.statements().into_iter().collect();
    let claim = sql
        .get("claim_returning")
        .ok_or("no claim_returning")?
        // as the store fills it in for an ordered claim with no insert bound:
        // the key walk where the dialect has one, else the rule alone
        .replace(
            "{order}",
            sql.get("walk_block").unwrap_or(&sql["ordered_block"]),
        )
        .replace("{upto_v0}", "")
        .replace("{upto_hd}", "");
    let claim = with_literals(
        &claim,
        &[
            "'bench'",
            "200",
            "gen_random_uuid()",
            "600000",
            "'00000000-0000-0000-0000-000000000000'::uuid",
            "''",
            "200",
        ],
    )?;
    let mut tx = c.transaction()?;
    let plan: Vec<String> = tx
        .query(&format!("EXPLAIN (ANALYZE, BUFFERS) {claim}"), &[])?
        .iter()
        .map(|r| r.get(0))
        .collect();
    tx.rollback()?;
    for line in &plan {
        eprintln!("  {line}");
    }
    let seq = plan.iter().any(|l| l.contains("Seq Scan"));
    let time = plan
        .iter()
        .find_map(|l| l.trim().strip_prefix("Execution Time: "))
        .unwrap_or("?")
        .to_string();
    out.push(row(
        format!(
            "ordered claim over {} pending events of 1,000 keys, every key busy: {}",
            s.plan_rows,
            if seq {
                "a Seq Scan"
            } else {
                "index scans only"
            }
        ),
        time,
        "-".into(),
        0.0,
        "index scans",
    ));
    Ok(())
}

/// The relay's own claim and finish statements, sent by hand in a loop: what
/// draining the outbox costs the database with no relay around it. The SQL is the
/// store's own ([`txbox::SqlStore::statements`]), bound as the relay binds it.
struct HandLoop {
    held: bool,
    delete_acked: bool,
    probe: String,
    claim: String,
    finish: String,
}

impl HandLoop {
    fn new(p: &str, s: &Size) -> Res<HandLoop> {
        let store = PgStore::connect(&pg_url(), &Config::builder().table_prefix(p).build()?)?;
        // an unordered type: the claims' `{order}` condition is empty
        let sql: HashMap<&str, String> = store
            .statements()
            .into_iter()
            .map(|(name, sql)| (name, sql.replace("{order}", "")))
            .collect();
        let get = |name: &str| -> Res<String> {
            sql.get(name)
                .cloned()
                .ok_or_else(|| format!("the store has no statement {name:?}").into())
        };
        let held = s.claim == ClaimMode::Lock;
        let claim = if held {
            // a held claim goes as one script with its values written in, as the
            // relay sends it: the transaction's timeout, then the claim (type $1,
            // after $2, limit $3), deleting its rows when acked rows are not kept
            let open = get("hold_claim.open")?.replace("{ms}", "300000");
            let claim = get(if s.delete_acked {
                "hold_claim.claim_delete"
            } else {
                "claim_select"
            })?;
            let claim = with_literals(&claim, &["E'bench'", "{after}", "200"])?;
            format!("{open}; {claim}")
        } else {
            // type $1, limit $2, token $3, lease ms $4, after $5
            get("claim_returning")?
        };
        let finish = get(match (held, s.delete_acked) {
            (false, false) => "finish.sent",
            (false, true) => "finish.delete",
            (true, false) => "finish_held.sent",
            (true, true) => "finish_held.delete",
        })?;
        Ok(HandLoop {
            held,
            delete_acked: s.delete_acked,
            probe: get("hold_claim.probe")?,
            claim,
            finish,
        })
    }

    /// Claims, "sends" (to memory) and finishes `n` pending events of type
    /// `bench`; returns the time it took.
    fn drain(&self, c: &mut postgres::Client, n: usize) -> Res<Duration> {
        let (held, probe, claim, finish) = (self.held, &self.probe, &self.claim, &self.finish);
        let t = Instant::now();
        let mut done = 0;
        let mut sink = MemorySender::new();
        // like the relay: each full batch's claim starts after the previous one,
        // every RESCAN_EVERY batches from the lowest id again
        let (mut after, mut run) = (uuid::Uuid::nil(), 0);
        // a held batch's finish waiting to go with the next claim
        let mut finish_next: Option<String> = None;
        let event =
            |id: uuid::Uuid, event_type: String, key: Option<String>, payload: String| Event {
                id: EventId::from_uuid(id),
                event_type,
                destination: "bench".into(),
                routing_key: "bench".into(),
                key,
                headers: Default::default(),
                payload: payload.into_bytes(),
                content_type: None,
                attempts: 0,
            };
        while done < n {
            let token = uuid::Uuid::now_v7();
            let mut events: Vec<Event> = if held {
                // the previous full batch's finish goes with this claim, as the
                // relay sends it; outside a backlog the relay first asks whether
                // anything is due
                let prefix = finish_next.take();
                if after.is_nil() && prefix.is_none() {
                    c.query(probe.as_str(), &[&"bench"])?;
                }
                let claim = claim.replace("{after}", &format!("'{after}'::uuid"));
                let script = match prefix {
                    Some(finish) => format!("{finish}; {claim}"),
                    None => claim,
                };
                let mut events = Vec::new();
                for m in c.simple_query(&script)? {
                    if let postgres::SimpleQueryMessage::Row(r) = m {
                        let text = |i: usize| r.get(i).map(str::to_string);
                        let id = text(0).unwrap_or_default().parse()?;
                        let (kind, payload) =
                            (text(1).unwrap_or_default(), text(4).unwrap_or_default());
                        events.push(event(id, kind, text(2), payload));
                    }
                }
                events
            } else {
                c.query(
                    claim.as_str(),
                    &[&"bench", &200i64, &token, &300_000f64, &after],
                )?
                .iter()
                .map(|r| event(r.get(0), r.get(1), r.get(2), r.get(4)))
                .collect()
            };
            events.sort_by_key(|e| e.id);
            let _ = sink.send(&events);
            let ids: Vec<uuid::Uuid> = events.iter().map(|e| e.id.as_uuid()).collect();
            if held {
                let script = if self.delete_acked {
                    "COMMIT".to_string()
                } else {
                    let list: Vec<String> = ids.iter().map(|id| format!("'{id}'::uuid")).collect();
                    format!("{}; COMMIT", finish.replace("{ids}", &list.join(", ")))
                };
                if ids.len() == 200 {
                    finish_next = Some(script);
                } else {
                    c.batch_execute(&script)?;
                }
            } else {
                // the token $1, then one placeholder per id, as the relay renders it
                let list: Vec<String> = (2..ids.len() + 2).map(|k| format!("${k}")).collect();
                let sql = finish.replace("{ids}", &list.join(", "));
                // typed as the relay types them (uuid), its one round trip
                let uuid = postgres::types::Type::UUID;
                let mut params: Vec<(&(dyn postgres::types::ToSql + Sync), _)> =
                    vec![(&token, uuid.clone())];
                params.extend(ids.iter().map(|id| (id as _, uuid.clone())));
                c.execute_typed(sql.as_str(), &params)?;
            }
            done += events.len();
            run += 1;
            after = match ids.last() {
                Some(last) if ids.len() == 200 && run < Relay::RESCAN_EVERY => *last,
                _ => {
                    run = 0;
                    uuid::Uuid::nil()
                }
            };
        }
        if let Some(finish) = finish_next {
            c.batch_execute(&finish)?;
        }
        Ok(t.elapsed())
    }
}

/// The relay floor on a freshly filled table, or (`analyzed`) on one that was
/// `VACUUM ANALYZE`d while the whole backlog was pending, as autovacuum may leave it.
fn relay_floor(s: &Size, analyzed: bool, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_floor_";
    let cfg = s.relay_config(p, EventSettings::default().batch_size(200));
    let outbox = Outbox::new(&cfg)?;
    let hand_loop = HandLoop::new(p, s)?;
    // relay, hand, hand, relay, `rounds` times: each on a freshly filled table, so
    // neither profits from going first or second; each side's median rate, so one
    // slow turn (the machine busy elsewhere) moves neither
    let (mut ours, mut hand) = (Vec::new(), Vec::new());
    let rate = |d: Duration| s.floor as f64 / d.as_secs_f64();
    for turn in [true, false, false, true].repeat(s.rounds) {
        let (store, mut c) = fresh(p)?;
        fill(&mut c, &outbox, s.floor)?;
        if analyzed {
            c.batch_execute(&format!("VACUUM ANALYZE {p}outbox_events"))?;
        }
        if turn {
            let sender = MemorySender::new();
            let t = Instant::now();
            let relay = Relay::start(store, &cfg, sender.clone())?;
            sender.wait_for(s.floor, Duration::from_secs(600));
            relay.shutdown(Duration::from_secs(10))?;
            ours.push(rate(t.elapsed()));
            continue;
        }
        hand.push(rate(hand_loop.drain(&mut c, s.floor)?));
    }
    let (ours, hand) = (median(&mut ours), median(&mut hand));
    out.push(row(
        format!(
            "relay floor, PG -> memory (median of {} x {} events){}{}",
            2 * s.rounds,
            s.floor,
            s.mode(),
            if analyzed {
                ", after VACUUM ANALYZE"
            } else {
                ""
            }
        ),
        format!("{ours:.0} ev/s"),
        format!("{hand:.0} ev/s"),
        ours / hand,
        ">= 0.9, >= 10000 ev/s",
    ));
    Ok(())
}

fn broker_throughput(
    name: &str,
    s: &Size,
    factory: Arc<dyn txbox::SenderFactory>,
    destination: &str,
    reset: &dyn Fn() -> Res<()>,
    out: &mut Vec<Row>,
) -> Res<()> {
    let p = "bench_broker_";
    let cfg = s.relay_config(
        p,
        EventSettings::default()
            .destination(destination)
            .routing_key("txbox-bench")
            .batch_size(200)
            .in_flight(s.in_flight.unwrap_or(EventSettings::default().in_flight)),
    );
    let window = cfg.event("bench").map_or(1, |e| e.in_flight);
    let outbox = Outbox::new(&cfg)?;
    // a message as the relay hands it to the sender
    let event = |payload: String| Event {
        id: EventId::new(),
        event_type: "bench".into(),
        destination: destination.into(),
        routing_key: "txbox-bench".into(),
        key: None,
        headers: Default::default(),
        payload: payload.into_bytes(),
        content_type: None,
        attempts: 0,
    };
    // warm up: connections and metadata are not what is measured
    let warm = event("{}".into());
    let mut direct = factory.create()?;
    if direct
        .send(std::slice::from_ref(&warm))
        .iter()
        .any(|r| r.is_err())
    {
        return Err(format!("{name}: warm-up send failed").into());
    }
    // the same client, same settings, the same messages in batches of 200, directly
    let events: Vec<Event> = (0..s.brokers)
        .map(|i| event(serde_json::json!({"n": i}).to_string()))
        .collect();
    // each round: the relay on a freshly filled table, the same client directly
    // with the relay's window of batches in flight, and the database alone (the
    // relay's statements by hand, no broker); each from an empty queue
    let hand_loop = HandLoop::new(p, s)?;
    let (mut ours, mut windowed, mut db) = (Vec::new(), Vec::new(), Vec::new());
    // the machine's CPU seconds per event of each (client, database and broker)
    let (mut ours_cpu, mut windowed_cpu, mut db_cpu) = (Vec::new(), Vec::new(), Vec::new());
    let per_event = |cpu: Option<f64>, v: &mut Vec<f64>| {
        v.extend(cpu.map(|c| c / s.brokers as f64));
    };
    for _ in 0..s.rounds {
        let (store, mut c) = fresh(p)?;
        fill(&mut c, &outbox, s.brokers)?;
        reset()?;
        let (rate, cpu) = with_cpu(|| relay_rate(name, s, &store, &cfg, &factory))?;
        ours.push(rate);
        per_event(cpu, &mut ours_cpu);
        reset()?;
        let (rate, cpu) = with_cpu(|| direct_rate(name, &mut *direct, &events, window))?;
        windowed.push(rate);
        per_event(cpu, &mut windowed_cpu);
        let (_, mut c) = fresh(p)?;
        fill(&mut c, &outbox, s.brokers)?;
        let (took, cpu) = with_cpu(|| hand_loop.drain(&mut c, s.brokers))?;
        db.push(s.brokers as f64 / took.as_secs_f64());
        per_event(cpu, &mut db_cpu);
    }
    let (ours, windowed, db) = (median(&mut ours), median(&mut windowed), median(&mut db));
    // and the same client one batch at a time, and at its ceiling (every batch
    // handed over before the first ack)
    reset()?;
    let single = direct_rate(name, &mut *direct, &events, 1)?;
    reset()?;
    let ceiling = direct_rate(name, &mut *direct, &events, usize::MAX)?;
    let rounds = if s.rounds > 1 {
        format!(", median of {}", s.rounds)
    } else {
        String::new()
    };
    out.push(row(
        format!(
            "relay to {name} ({} events{}{rounds}), vs direct, {window} batches in flight",
            s.brokers,
            s.mode()
        ),
        format!("{ours:.0} ev/s"),
        format!("{windowed:.0} ev/s"),
        ours / windowed,
        ">= 0.8",
    ));
    out.push(row(
        format!("  {name}: vs direct, one batch at a time"),
        format!("{ours:.0} ev/s"),
        format!("{single:.0} ev/s"),
        ours / single,
        "-",
    ));
    out.push(row(
        format!("  {name}: vs direct, all in flight (client ceiling)"),
        format!("{ours:.0} ev/s"),
        format!("{ceiling:.0} ev/s"),
        ours / ceiling,
        "-",
    ));
    // the relay can go no faster than the slower of its two halves
    out.push(row(
        format!("  {name}: vs the database alone (the floor's hand loop)"),
        format!("{ours:.0} ev/s"),
        format!("{db:.0} ev/s"),
        ours / db,
        "-",
    ));
    if ours_cpu.len() == s.rounds {
        // a relay does the database's work and the client's work for each event:
        // with every core busy it can go no faster than the cores over their sum
        let us = |v: &mut Vec<f64>| median(v) * 1e6;
        let (ours_us, direct_us, db_us) =
            (us(&mut ours_cpu), us(&mut windowed_cpu), us(&mut db_cpu));
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let bound = cores as f64 * 1e6 / (direct_us + db_us);
        out.push(row(
            format!("  {name}: machine CPU per event, relay vs direct + database alone"),
            format!("{ours_us:.1} us"),
            format!("{direct_us:.1} + {db_us:.1} us"),
            ours_us / (direct_us + db_us),
            "-",
        ));
        out.push(row(
            format!("  {name}: CPU bound for any relay ({cores} cores / that sum), vs direct"),
            format!("{bound:.0} ev/s"),
            format!("{windowed:.0} ev/s"),
            bound / windowed,
            "-",
        ));
    }
    Ok(())
}

/// Events/s of a relay draining the `s.brokers` events pending in `store` to
/// the broker; counted by the acks as they come (the rows are finished right
/// after).
fn relay_rate(
    name: &str,
    s: &Size,
    store: &Arc<PgStore>,
    cfg: &Config,
    factory: &Arc<dyn txbox::SenderFactory>,
) -> Res<f64> {
    let t = Instant::now();
    let f = factory.clone();
    let acks = Acks::default();
    let a = acks.clone();
    let relay = Relay::start(
        store.clone(),
        cfg,
        move || -> txbox::Result<Box<dyn Sender>> {
            Ok(Box::new(Timed::new(f.create()?, a.clone())))
        },
    )?;
    while acks.count.load(Ordering::Relaxed) < s.brokers as u64
        && t.elapsed() < Duration::from_secs(600)
    {
        std::thread::sleep(Duration::from_millis(2));
    }
    relay.shutdown(Duration::from_secs(10))?;
    let rate = s.brokers as f64 / t.elapsed().as_secs_f64();
    if store.status()?.iter().any(|x| x.pending + x.in_process > 0) {
        return Err(format!("{name}: events left unfinished").into());
    }
    Ok(rate)
}

/// Events/s of `sender` publishing `events` in batches of 200 with at most
/// `window` batches awaiting acks.
fn direct_rate(name: &str, sender: &mut dyn Sender, events: &[Event], window: usize) -> Res<f64> {
    let t = Instant::now();
    let mut results = Vec::new();
    let mut waiting = 0;
    for chunk in events.chunks(200) {
        match sender.start(chunk) {
            Started::Done(r) => results.extend(r),
            Started::InFlight => waiting += 1,
        }
        if waiting >= window {
            results.extend(sender.wait());
            waiting -= 1;
        }
    }
    for _ in 0..waiting {
        results.extend(sender.wait());
    }
    let failed = events.len() - results.iter().filter(|r| r.is_ok()).count();
    if failed > 0 {
        return Err(format!("{name}: {failed} direct sends failed").into());
    }
    Ok(events.len() as f64 / t.elapsed().as_secs_f64())
}

/// Counts the claims (one statement each on PostgreSQL) that the relay's pollers
/// send through the store; every other call passes through uncounted.
struct Counting(Arc<PgStore>, Arc<AtomicU64>);

impl Store for Counting {
    fn migrate(&self) -> txbox::Result<()> {
        self.0.migrate()
    }
    fn ping(&self) -> txbox::Result<()> {
        self.0.ping()
    }
    fn table_prefix(&self) -> &str {
        self.0.table_prefix()
    }
    fn try_lock(&self, name: &str, owner: uuid::Uuid, lease: Duration) -> txbox::Result<bool> {
        self.0.try_lock(name, owner, lease)
    }
    fn unlock(&self, name: &str, owner: uuid::Uuid) -> txbox::Result<()> {
        self.0.unlock(name, owner)
    }
}

impl ClaimStore for Counting {
    fn claim_after(
        &self,
        args: &txbox::ClaimArgs<'_>,
        token: uuid::Uuid,
    ) -> txbox::Result<Vec<Event>> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.claim_after(args, token)
    }
    fn finish(
        &self,
        token: uuid::Uuid,
        outcomes: &[(EventId, txbox::Outcome)],
    ) -> txbox::Result<u64> {
        self.0.finish(token, outcomes)
    }
    fn can_hold_claims(&self) -> bool {
        self.0.can_hold_claims()
    }
    fn max_connections(&self) -> Option<usize> {
        self.0.max_connections()
    }
    fn can_notify(&self) -> bool {
        self.0.can_notify()
    }
    fn listen(&self) -> txbox::Result<Box<dyn txbox::Notifications>> {
        self.0.listen()
    }
    fn claim_held(&self, args: &txbox::ClaimArgs<'_>) -> txbox::Result<txbox::HeldClaim> {
        self.1.fetch_add(1, Ordering::Relaxed);
        self.0.claim_held(args)
    }
}

impl MaintenanceStore for Counting {
    fn recover_expired(&self, limit: usize) -> txbox::Result<u64> {
        self.0.recover_expired(limit)
    }
    fn delete_processed(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.0.delete_processed(ttl, limit)
    }
    fn status(&self) -> txbox::Result<Vec<txbox::TypeStatus>> {
        self.0.status()
    }
}

impl DeadLetterStore for Counting {
    fn move_failed_to_dlq(&self, limit: usize) -> txbox::Result<u64> {
        self.0.move_failed_to_dlq(limit)
    }
    fn requeue_dlq_retries(&self, limit: usize) -> txbox::Result<u64> {
        self.0.requeue_dlq_retries(limit)
    }
    fn delete_resolved_dlq(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.0.delete_resolved_dlq(ttl, limit)
    }
    fn dlq_list(&self, filter: &txbox::DlqFilter) -> txbox::Result<Vec<txbox::DeadLetter>> {
        self.0.dlq_list(filter)
    }
    fn dlq_count(&self, filter: &txbox::DlqFilter) -> txbox::Result<u64> {
        self.0.dlq_count(filter)
    }
    fn dlq_get(&self, id: EventId) -> txbox::Result<Option<txbox::DeadLetter>> {
        self.0.dlq_get(id)
    }
    fn dlq_set_status(
        &self,
        ids: &[EventId],
        from: &[txbox::DlqStatus],
        to: txbox::DlqStatus,
    ) -> txbox::Result<Vec<EventId>> {
        self.0.dlq_set_status(ids, from, to)
    }
    fn dlq_delete(
        &self,
        ids: &[EventId],
        from: &[txbox::DlqStatus],
    ) -> txbox::Result<Vec<EventId>> {
        self.0.dlq_delete(ids, from)
    }
    fn blocked_keys(
        &self,
        event_type: &str,
        limit: usize,
    ) -> txbox::Result<Vec<txbox::BlockedKey>> {
        self.0.blocked_keys(event_type, limit)
    }
}

impl InboxStore for Counting {
    fn inbox_insert(&self, consumer: &str, ids: &[EventId]) -> txbox::Result<Vec<EventId>> {
        self.0.inbox_insert(consumer, ids)
    }
    fn delete_expired_inbox(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.0.delete_expired_inbox(ttl, limit)
    }
}

/// A sender that acks every event at once: the relay's own work, no broker.
struct Discard;

impl Sender for Discard {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        events.iter().map(|_| Ok(())).collect()
    }
}

/// Publishes as `writers` threads for `secs`, each on its own connection, a
/// business row and an event of `event_type` per transaction; returns the
/// commits.
fn publish_flat_out(cfg: &Config, event_type: &'static str, writers: usize, secs: u64) -> Res<u64> {
    let outbox = Arc::new(Outbox::new(cfg)?);
    let until = Instant::now() + Duration::from_secs(secs);
    let commits = Arc::new(AtomicU64::new(0));
    let threads: Vec<_> = (0..writers)
        .map(|_| {
            let (outbox, commits) = (outbox.clone(), commits.clone());
            std::thread::spawn(move || -> Result<(), String> {
                let e = |e: postgres::Error| e.to_string();
                let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls).map_err(e)?;
                let mut i = 0i64;
                while Instant::now() < until {
                    let mut tx = c.transaction().map_err(e)?;
                    tx.execute("INSERT INTO bench_writer_orders (total) VALUES ($1)", &[&i])
                        .map_err(e)?;
                    outbox
                        .publish(&mut tx, event_type, &serde_json::json!({"order": i}))
                        .map_err(|e| e.to_string())?;
                    tx.commit().map_err(e)?;
                    commits.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
                Ok(())
            })
        })
        .collect();
    for t in threads {
        t.join().map_err(|_| "a publisher panicked")??;
    }
    Ok(commits.load(Ordering::Relaxed))
}

/// How the concurrent publishers' commits wake the relay.
#[derive(Clone, Copy, PartialEq)]
enum WakeUp {
    /// the rationed trigger as shipped (schema 6)
    On,
    /// the trigger disabled: the relay polls
    Off,
    /// schema 3's trigger: every commit notifies
    EveryCommit,
    /// the trigger fires and its function returns at once: what the deferred
    /// trigger itself costs (the relay polls)
    Empty,
}

/// N concurrent publishers through `Outbox::publish` with the wake-up on commit
/// as shipped, off (its trigger disabled) and as schema 3 had it (every commit
/// notifies), a relay draining in each: commits per second and the ratios to
/// off. Each run starts on fresh tables (a run's dead rows would slow the
/// next); the runs take turns, each figure the median of `rounds`.
fn concurrent_publishers(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_writers_";
    let cfg = config_with(p, EventSettings::default(), true);
    let every_commit = include_str!("../../sql/postgres/003_notify_on_commit.sql")
        .lines()
        .filter(|l| l.starts_with("CREATE "))
        .map(|l| l.replace("{prefix}", p))
        .collect::<Vec<_>>()
        .join("\n");
    let empty = format!(
        "CREATE OR REPLACE FUNCTION {p}txbox_wake() RETURNS trigger LANGUAGE plpgsql AS \
         $$ BEGIN RETURN NULL; END $$"
    );
    let modes = [WakeUp::On, WakeUp::Off, WakeUp::EveryCommit, WakeUp::Empty];
    for n in [1usize, 8, 32, 64] {
        let mut tps: [Vec<f64>; 4] = Default::default();
        let mut cpu: [Vec<f64>; 4] = Default::default();
        let mut xids: [Vec<f64>; 4] = Default::default();
        let mut claims: [Vec<f64>; 4] = Default::default();
        for r in 0..s.rounds.max(2) {
            // each round in another order: none always goes first
            for k in 0..modes.len() {
                let i = (r + k) % modes.len();
                let mode = modes[i];
                let (store, mut c) = fresh(p)?;
                c.batch_execute(
                    "DROP TABLE IF EXISTS bench_writer_orders; \
                     CREATE TABLE bench_writer_orders (id bigserial PRIMARY KEY, total bigint)",
                )?;
                if mode == WakeUp::Empty {
                    c.batch_execute(&empty)?;
                }
                if mode == WakeUp::Off || mode == WakeUp::EveryCommit {
                    c.batch_execute(&format!(
                        "ALTER TABLE {p}outbox_events DISABLE TRIGGER {p}outbox_events_wake"
                    ))?;
                }
                if mode == WakeUp::EveryCommit {
                    c.batch_execute(&every_commit)?;
                }
                c.batch_execute("CHECKPOINT")?;
                let acks = Acks::default();
                let count = acks.count.clone();
                let claimed = Arc::new(AtomicU64::new(0));
                let store = Arc::new(Counting(store, claimed.clone()));
                let relay =
                    Relay::start(store, &cfg, move || -> txbox::Result<Box<dyn Sender>> {
                        Ok(Box::new(Timed::new(Discard, acks.clone())))
                    })?;
                // the machine's CPU from the first commit until the relay sent
                // the last event: the publishers, the database and the relay
                let xid = |c: &mut postgres::Client| -> Res<i64> {
                    Ok(c.query_one("SELECT txid_current()", &[])?.get(0))
                };
                let first = xid(&mut c)?;
                let (commits, busy) = with_cpu(|| {
                    let commits = publish_flat_out(&cfg, "bench", n, s.writers_secs)?;
                    // the relay keeps up (or the run says so)
                    let deadline = Instant::now() + Duration::from_secs(60);
                    while count.load(Ordering::Relaxed) < commits && Instant::now() < deadline {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Res::Ok(commits)
                })?;
                if count.load(Ordering::Relaxed) < commits {
                    return Err(format!("the relay sent {count:?} of {commits} events").into());
                }
                // every writing transaction takes an id: the publishers' and
                // the relay's (claims, finishes)
                let writes = (xid(&mut c)? - first - 1) as f64;
                xids[i].push(writes / commits.max(1) as f64);
                claims[i]
                    .push(claimed.load(Ordering::Relaxed) as f64 * 1000.0 / commits.max(1) as f64);
                let rate = commits as f64 / s.writers_secs as f64;
                tps[i].push(rate);
                if let Some(busy) = busy {
                    cpu[i].push(busy * 1e6 / commits.max(1) as f64);
                }
                relay.shutdown(Duration::from_secs(10))?;
            }
        }
        let [on, off, every, _] = &mut tps;
        let (on, off, every) = (median(on), median(off), median(every));
        let target = match n {
            1 => ">= 0.93",
            64 => ">= 0.9",
            _ => ">= 0.95",
        };
        out.push(row(
            format!("{n} concurrent publishers, commits/s, wake-up on vs off"),
            format!("{on:.0}/s"),
            format!("{off:.0}/s"),
            on / off,
            target,
        ));
        out.push(row(
            format!("  {n} publishers, schema 3's trigger (every commit notifies) vs off"),
            format!("{every:.0}/s"),
            format!("{off:.0}/s"),
            every / off,
            "-",
        ));
        if cpu.iter().all(|c| !c.is_empty()) {
            let [on, off, _, empty] = &mut cpu;
            let (on, off, empty) = (median(on), median(off), median(empty));
            // on a machine the publishers keep busy, the commit rate is
            // the inverse of this: the steadier figure of the two
            out.push(row(
                format!("  {n} publishers, machine CPU per commit (and its relaying), on vs off (ratio off/on)"),
                format!("{on:.0} us"),
                format!("{off:.0} us"),
                off / on,
                target,
            ));
            out.push(row(
                format!("  {n} publishers, machine CPU per commit, the trigger firing an empty function vs off"),
                format!("{empty:.0} us"),
                format!("{off:.0} us"),
                off / empty,
                "-",
            ));
        }
        let [on, off, _, _] = &mut claims;
        out.push(row(
            format!("  {n} publishers, the relay's claims per 1,000 commits"),
            format!("{:.1}", median(on)),
            format!("{:.1}", median(off)),
            median(on) / median(off),
            "-",
        ));
        let [on, off, _, _] = &mut xids;
        out.push(row(
            format!("  {n} publishers, writing transactions per commit (the publisher's and the relay's)"),
            format!("{:.3}", median(on)),
            format!("{:.3}", median(off)),
            median(on) / median(off),
            "-",
        ));
    }
    Ok(())
}

fn idle_cost(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_idle_";
    let (store, _c) = fresh(p)?;
    let calls = Arc::new(AtomicU64::new(0));
    let counting = Arc::new(Counting(store, calls.clone()));
    // one idle type, default adaptive polling; the maintenance threads are shared
    // by all types and not counted (the Counting store counts claims only)
    let cfg = Config::builder()
        .table_prefix(p)
        .event("bench", |e| e)
        .build()?;
    let relay = Relay::start(counting, &cfg, MemorySender::new())?;
    std::thread::sleep(s.idle);
    let measured = calls.load(Ordering::Relaxed);
    relay.shutdown(Duration::from_secs(5))?;
    // the same delay sequence over an hour
    let polling = EventSettings::default().polling;
    let (mut model_window, mut model_hour) = (0, 0);
    // the adaptive rule for empty polls: wait the current delay, then grow it
    let mut current = polling.min;
    let mut t = Duration::ZERO;
    while t < Duration::from_secs(3600) {
        if t < s.idle {
            model_window += 1;
        }
        model_hour += 1;
        t += current;
        current = current.mul_f64(polling.multiplier).min(polling.max);
    }
    let steady = (3600.0 / polling.max.as_secs_f64()).round();
    out.push(row(
        format!("idle cost: claims in {:?} (measured vs model)", s.idle),
        format!("{measured}"),
        format!("{model_window}"),
        measured as f64 / model_window.max(1) as f64,
        "-",
    ));
    out.push(row(
        "idle cost: statements per hour (first hour / steady)",
        format!("{model_hour}"),
        format!("{steady}"),
        model_hour as f64 / 70.0,
        "<= 70",
    ));
    Ok(())
}

/// What a [`Timed`] sender saw acked.
#[derive(Clone, Default)]
struct Acks {
    count: Arc<AtomicU64>,
    /// The time of each event's first ack, when wanted.
    times: Option<Arc<Mutex<HashMap<EventId, Instant>>>>,
    /// A file to append `<id> <unix time of the ack in µs>` lines to, for the
    /// relay processes of the many-instances scenarios.
    log: Option<Arc<Mutex<std::fs::File>>>,
}

/// Records what the wrapped sender acked, pipelining as the wrapped one does.
struct Timed<S> {
    inner: S,
    acks: Acks,
    in_flight: std::collections::VecDeque<Vec<EventId>>,
}

impl<S> Timed<S> {
    fn new(inner: S, acks: Acks) -> Self {
        Timed {
            inner,
            acks,
            in_flight: Default::default(),
        }
    }

    fn record(&self, ids: &[EventId], results: &[Result<(), SendError>]) {
        let ok = results.iter().filter(|r| r.is_ok()).count();
        if let Some(times) = &self.acks.times {
            let now = Instant::now();
            let mut times = times.lock().unwrap();
            for (id, r) in ids.iter().zip(results) {
                if r.is_ok() {
                    times.entry(*id).or_insert(now);
                }
            }
        }
        if let Some(log) = &self.acks.log {
            let now = unix_micros();
            let text: String = ids
                .iter()
                .zip(results)
                .filter(|(_, r)| r.is_ok())
                .map(|(id, _)| format!("{id} {now}\n"))
                .collect();
            // a failed write is a failed bench: the parent counts the events as lost
            let _ = log.lock().unwrap().write_all(text.as_bytes());
        }
        self.acks.count.fetch_add(ok as u64, Ordering::Relaxed);
    }
}

/// Wall-clock time in microseconds: the one clock a bench process and its relay
/// processes share.
fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

fn ids(events: &[Event]) -> Vec<EventId> {
    events.iter().map(|e| e.id).collect()
}

impl<S: Sender> Sender for Timed<S> {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        let r = self.inner.send(events);
        self.record(&ids(events), &r);
        r
    }
    fn start(&mut self, events: &[Event]) -> Started {
        match self.inner.start(events) {
            Started::Done(r) => {
                self.record(&ids(events), &r);
                Started::Done(r)
            }
            Started::InFlight => {
                self.in_flight.push_back(ids(events));
                Started::InFlight
            }
        }
    }
    fn wait(&mut self) -> Vec<Result<(), SendError>> {
        let r = self.inner.wait();
        let ids = self.in_flight.pop_front().unwrap_or_default();
        self.record(&ids, &r);
        r
    }
}

/// The broker a pick-up latency run sends to: its name in the rows, a factory
/// of its senders and the destination.
struct PickUpBroker {
    name: &'static str,
    factory: Arc<dyn txbox::SenderFactory>,
    destination: &'static str,
    routing_key: &'static str,
    /// Takes what the bench sent off the broker, as a consumer would
    /// (RabbitMQ confirms slower behind thousands of unread messages).
    drain: fn() -> Res<()>,
}

fn rabbit_url() -> String {
    std::env::var("TXBOX_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

fn kafka_brokers() -> String {
    std::env::var("TXBOX_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// The pick-up runs' broker by name (`rabbitmq` or `kafka`), its queue or topic
/// made ready.
fn pickup_broker(name: &str) -> Res<PickUpBroker> {
    Ok(match name {
        "rabbitmq" => {
            let url = rabbit_url();
            ensure_queue(&url)?;
            PickUpBroker {
                name: "RabbitMQ",
                factory: Arc::new(txbox::rabbitmq::RabbitSender::builder(&url).build()),
                destination: "amq.direct",
                routing_key: "txbox-bench",
                drain: || ensure_queue(&rabbit_url()),
            }
        }
        "kafka" => {
            let brokers = kafka_brokers();
            txbox::kafka::ensure_topic(&brokers, "txbox-bench-latency", 1)?;
            PickUpBroker {
                name: "Kafka",
                factory: Arc::new(txbox::kafka::KafkaSender::builder(&brokers).build()?),
                destination: "txbox-bench-latency",
                routing_key: "txbox-bench",
                drain: || Ok(()), // a topic keeps no queue to empty
            }
        }
        other => return Err(format!("unknown broker `{other}`").into()),
    })
}

impl PickUpBroker {
    /// Event `n` as the relay hands it to this broker's sender.
    fn event(&self, n: usize) -> Event {
        Event {
            id: EventId::new(),
            event_type: "bench".into(),
            destination: self.destination.into(),
            routing_key: self.routing_key.into(),
            key: None,
            headers: Default::default(),
            payload: format!("{{\"n\":{n}}}").into_bytes(),
            content_type: None,
            attempts: 0,
        }
    }
}

fn pickup_latency(s: &Size, broker: PickUpBroker, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_latency_";
    let (store, mut c) = fresh(p)?;
    c.batch_execute(
        "DROP TABLE IF EXISTS bench_writer_orders; \
         CREATE TABLE bench_writer_orders (id bigserial PRIMARY KEY, total bigint)",
    )?;
    // `load`: the other event type that 32 publishers fill at full speed
    // while `bench` is timed
    let at_broker = EventSettings::default()
        .destination(broker.destination)
        .routing_key(broker.routing_key);
    let cfg = Config::builder()
        .table_prefix(p)
        .event("bench", |_| at_broker.clone())
        .event("load", |_| at_broker.clone())
        .build()?;
    let outbox = Outbox::new(&cfg)?;
    let acked = Arc::new(Mutex::new(HashMap::new()));
    let factory = broker.factory.clone();
    // the broker's own share: one event every 10 ms published directly and its
    // ack awaited, by the same client, no database and no relay
    let direct = {
        let mut sender = factory.create()?;
        let mut l = Vec::new();
        let start = Instant::now();
        let mut next = start;
        let mut n = 0;
        while start.elapsed() < Duration::from_secs(s.rate_secs) {
            let e = broker.event(n);
            let t = Instant::now();
            let r = sender.send(std::slice::from_ref(&e));
            if r.iter().all(|r| r.is_ok()) {
                l.push(t.elapsed().as_secs_f64() * 1000.0);
            }
            n += 1;
            next += Duration::from_millis(10);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        l
    };
    let acks = Acks {
        times: Some(acked.clone()),
        ..Acks::default()
    };
    let relay = Relay::start(store, &cfg, move || -> txbox::Result<Box<dyn Sender>> {
        Ok(Box::new(Timed::new(factory.create()?, acks.clone())))
    })?;
    let mut commit = |n: usize| -> Res<Vec<(EventId, Instant)>> {
        let mut tx = c.transaction()?;
        let ids = outbox.publish_all(
            &mut tx,
            txbox::NewEvent::batch("bench", (0..n).map(|i| serde_json::json!({"n": i})))?,
        )?;
        tx.commit()?;
        let t = Instant::now();
        Ok(ids.into_iter().map(|i| (i, t)).collect())
    };
    let latencies = |committed: &[(EventId, Instant)],
                     acked: &Arc<Mutex<HashMap<EventId, Instant>>>|
     -> Vec<f64> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let a = acked.lock().unwrap();
            if committed.iter().all(|(id, _)| a.contains_key(id)) || Instant::now() > deadline {
                return committed
                    .iter()
                    .filter_map(|(id, t)| {
                        a.get(id)
                            .map(|x| x.duration_since(*t).as_secs_f64() * 1000.0)
                    })
                    .collect();
            }
            drop(a);
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    // the relay's senders connect on their first batch: one event through first,
    // so the steady rate measures a running relay, not its start
    let warm = commit(1)?;
    latencies(&warm, &acked);
    // steady 100 events/s: one commit every 10 ms, whatever a commit takes
    let steady = |commit: &mut dyn FnMut(usize) -> Res<Vec<(EventId, Instant)>>| {
        let mut committed = Vec::new();
        let start = Instant::now();
        let mut next = start;
        while start.elapsed() < Duration::from_secs(s.rate_secs) {
            committed.extend(commit(1)?);
            next += Duration::from_millis(10);
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        Res::Ok(committed)
    };
    let committed = steady(&mut commit)?;
    // p50 and p99 of the latencies in `l`, side by side
    let p50_p99 = |what: String, mut l: Vec<f64>| {
        row(
            what,
            format!("{:.1} ms", median(&mut l)),
            format!("{:.1} ms", pct(&mut l, 0.99)),
            0.0,
            "-",
        )
    };
    let name = broker.name;
    let l = latencies(&committed, &acked);
    out.push(p50_p99(
        format!(
            "pick-up, 100 ev/s, commit->{name} ack p50 / p99 ({} ev)",
            l.len()
        ),
        l,
    ));
    // the same while 32 publishers fill the other type at full speed
    let load = {
        let cfg = cfg.clone();
        let secs = s.rate_secs;
        std::thread::spawn(move || {
            publish_flat_out(&cfg, "load", 32, secs).map_err(|e| e.to_string())
        })
    };
    let committed = steady(&mut commit)?;
    let loaded = load.join().map_err(|_| "the load panicked")??;
    let l = latencies(&committed, &acked);
    out.push(row(
        format!(
            "pick-up, 100 ev/s while 32 publishers fill another type ({loaded} events), \
             commit->{name} ack p50 / p99 ({} ev)",
            l.len()
        ),
        format!("{:.1} ms", median(&mut l.clone())),
        format!("{:.1} ms", pct(&mut l.clone(), 0.99)),
        0.0,
        "p99 <= 20 ms",
    ));
    (broker.drain)()?;
    out.push(p50_p99(
        format!(
            "  {name}: one event published directly, publish->ack p50 / p99 ({} ev)",
            direct.len()
        ),
        direct,
    ));
    // a burst in one transaction: each event, and the last one
    let committed = commit(s.burst)?;
    let mut l = latencies(&committed, &acked);
    let last = l.iter().copied().fold(0.0, f64::max);
    out.push(p50_p99(
        format!("pick-up ({name}), burst of {}, p50 / p99", s.burst),
        std::mem::take(&mut l),
    ));
    out.push(row(
        format!("pick-up ({name}), burst of {}, the last event", s.burst),
        format!("{last:.1} ms"),
        "-".into(),
        0.0,
        "<= burst / relay floor rate + 50 ms",
    ));
    // a consumer would have taken the burst: RabbitMQ confirms slower with
    // thousands of messages in the queue (one event after a minute: 0.8 ms on
    // an empty queue, 4.8 ms behind 2,000), which is the bench's, not the relay's
    (broker.drain)()?;
    // idle, then one event, `idle_samples` times
    let mut after_idle = Vec::new();
    for _ in 0..s.idle_samples {
        std::thread::sleep(s.idle_single);
        let committed = commit(1)?;
        after_idle.extend(latencies(&committed, &acked));
    }
    out.push(p50_p99(
        format!(
            "pick-up ({name}), one event after {:?} idle, p50 / p99 ({} samples)",
            s.idle_single, s.idle_samples
        ),
        after_idle,
    ));
    relay.shutdown(Duration::from_secs(10))?;
    Ok(())
}

fn ensure_queue(url: &str) -> Res<()> {
    use amiquip::{Connection, FieldTable, QueueDeclareOptions};
    let mut conn = Connection::insecure_open(url)?;
    let ch = conn.open_channel(None)?;
    let q = QueueDeclareOptions {
        auto_delete: false,
        ..Default::default()
    };
    ch.queue_declare("txbox-bench", q)?;
    ch.queue_bind(
        "txbox-bench",
        "amq.direct",
        "txbox-bench",
        FieldTable::new(),
    )?;
    ch.queue_purge("txbox-bench")?;
    conn.close()?;
    Ok(())
}

/// A relay process of the many-instances scenarios: logs each acked id, with the
/// time of its ack, to a file. `broker` is `none` (the throughput run: a sender
/// that acks at once) or `rabbitmq` / `kafka` (the latency run: the real broker,
/// with the default settings).
fn worker(prefix: &str, file: &str, broker: &str) -> Res<()> {
    struct AckAll;
    impl Sender for AckAll {
        fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
            events.iter().map(|_| Ok(())).collect()
        }
    }
    let store = Arc::new(PgStore::connect(
        &pg_url(),
        &Config::builder().table_prefix(prefix).build()?,
    )?);
    let log = Arc::new(Mutex::new(
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(file)?,
    ));
    let acks = Acks {
        log: Some(log),
        ..Acks::default()
    };
    let _relay = match broker {
        "none" => {
            let cfg = config(
                prefix,
                EventSettings::default().batch_size(200).adaptive_polling(
                    Duration::from_millis(20),
                    Duration::from_millis(500),
                    1.5,
                ),
            );
            Relay::start(store, &cfg, move || -> txbox::Result<Box<dyn Sender>> {
                Ok(Box::new(Timed::new(AckAll, acks.clone())))
            })?
        }
        _ => {
            let b = pickup_broker(broker)?;
            let cfg = config(
                prefix,
                EventSettings::default()
                    .destination(b.destination)
                    .routing_key(b.routing_key),
            );
            let factory = b.factory;
            Relay::start(store, &cfg, move || -> txbox::Result<Box<dyn Sender>> {
                Ok(Box::new(Timed::new(factory.create()?, acks.clone())))
            })?
        }
    };
    std::thread::sleep(Duration::from_secs(600));
    Ok(())
}

/// Starts `n` relay processes (see [`worker`]) on the tables of `prefix`, each
/// logging to its own file; they are killed when the returned guard drops.
struct Workers {
    children: Vec<std::process::Child>,
    files: Vec<std::path::PathBuf>,
}

impl Workers {
    fn start(n: usize, prefix: &str, broker: &str) -> Res<Workers> {
        let mut w = Workers {
            children: Vec::new(),
            files: Vec::new(),
        };
        for i in 0..n {
            let f = std::env::temp_dir().join(format!(
                "txbox-bench-{}-{broker}-{i}.ids",
                std::process::id()
            ));
            let _ = std::fs::remove_file(&f);
            w.children.push(
                std::process::Command::new(std::env::current_exe()?)
                    .args(["--worker", prefix, &f.display().to_string(), broker])
                    .spawn()?,
            );
            w.files.push(f);
        }
        Ok(w)
    }

    /// Every ack logged so far: (id, unix µs), duplicates included.
    fn acks(&self) -> Vec<(EventId, u128)> {
        let mut v = Vec::new();
        for f in &self.files {
            for l in std::fs::read_to_string(f).unwrap_or_default().lines() {
                let mut words = l.split(' ');
                if let (Some(Ok(id)), Some(Ok(t))) = (
                    words.next().map(str::parse),
                    words.next().map(str::parse::<u128>),
                ) {
                    v.push((id, t));
                }
            }
        }
        v
    }
}

impl Drop for Workers {
    fn drop(&mut self) {
        for ch in &mut self.children {
            let _ = ch.kill();
            let _ = ch.wait();
        }
        for f in &self.files {
            let _ = std::fs::remove_file(f);
        }
    }
}

fn many_instances(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_many_";
    let mut base = 0.0;
    for n in [1, 2, 4] {
        let (store, mut c) = fresh(p)?;
        let outbox = Outbox::new(&config(p, EventSettings::default()))?;
        let ids = fill(&mut c, &outbox, s.instances)?;
        let t = Instant::now();
        let workers = Workers::start(n, p, "none")?;
        while store.status()?.iter().any(|x| x.pending + x.in_process > 0)
            && t.elapsed() < Duration::from_secs(600)
        {
            std::thread::sleep(Duration::from_millis(10));
        }
        let secs = t.elapsed().as_secs_f64();
        let acks = workers.acks();
        drop(workers);
        let lines = acks.len();
        let seen: HashSet<EventId> = acks.into_iter().map(|(id, _)| id).collect();
        let rate = s.instances as f64 / secs;
        if n == 1 {
            base = rate;
        }
        let lost = ids.iter().filter(|i| !seen.contains(i)).count();
        out.push(row(
            format!(
                "{n} relay process(es), {} events: duplicates {} lost {lost}",
                s.instances,
                lines - seen.len()
            ),
            format!("{rate:.0} ev/s"),
            format!("{base:.0} ev/s (1 process)"),
            rate / base,
            "0 duplicates, 0 lost",
        ));
    }
    Ok(())
}

/// 4 relay processes on one table, each with its own connection to the real
/// broker and the default settings (wake-up on commit), events committed at
/// 100/s: commit -> ack p50 / p99 over all of them, and the duplicates.
fn many_latency(s: &Size, broker: &str, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_many_latency_";
    let (_store, mut c) = fresh(p)?;
    let outbox = Outbox::new(&config(p, EventSettings::default()))?;
    let name = pickup_broker(broker)?.name;
    let workers = Workers::start(4, p, broker)?;
    let mut commit = || -> Res<(EventId, u128)> {
        let mut tx = c.transaction()?;
        let id = outbox.publish(&mut tx, "bench", &serde_json::json!({"n": 1}))?;
        tx.commit()?;
        Ok((id, unix_micros()))
    };
    // wait until every process's relay has sent once (their senders connect on
    // the first batch), so the timed window measures running relays
    let deadline = Instant::now() + Duration::from_secs(60);
    while workers
        .files
        .iter()
        .any(|f| std::fs::metadata(f).map_or(true, |m| m.len() == 0))
    {
        if Instant::now() > deadline {
            return Err("the relay processes did not all send within 60 s".into());
        }
        commit()?;
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut committed = Vec::new();
    let start = Instant::now();
    let mut next = start;
    while start.elapsed() < Duration::from_secs(s.rate_secs) {
        committed.push(commit()?);
        next += Duration::from_millis(10);
        std::thread::sleep(next.saturating_duration_since(Instant::now()));
    }
    let deadline = Instant::now() + Duration::from_secs(120);
    let acks = loop {
        let acks = workers.acks();
        let seen: HashSet<EventId> = acks.iter().map(|(id, _)| *id).collect();
        if committed.iter().all(|(id, _)| seen.contains(id)) || Instant::now() > deadline {
            break acks;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    drop(workers);
    let mut first: HashMap<EventId, u128> = HashMap::new();
    let mut duplicates = 0;
    for (id, t) in &acks {
        if first.insert(*id, *t).is_some() {
            duplicates += 1;
        }
    }
    let mut l: Vec<f64> = committed
        .iter()
        .filter_map(|(id, t)| first.get(id).map(|a| a.saturating_sub(*t) as f64 / 1000.0))
        .collect();
    let lost = committed.len() - l.len();
    out.push(row(
        format!(
            "4 relay processes, 100 ev/s, commit->{name} ack p50 / p99 ({} ev): duplicates {duplicates} lost {lost}",
            committed.len()
        ),
        format!("{:.1} ms", median(&mut l)),
        format!("{:.1} ms", pct(&mut l, 0.99)),
        0.0,
        "p99 <= 20 ms, 0 duplicates",
    ));
    Ok(())
}

/// The broker's own share of the pick-up after idle: one event published
/// directly (no database, no relay) on a connection that has been quiet for
/// the idle time, its ack awaited, `idle_samples` times per broker.
/// What an upgrade of the schema costs the writers (issue 30): from every
/// earlier schema version (0.1's, which had no version table, and each one
/// after), made with the files `migrate` runs, over a table of `plan_rows`
/// events (a tenth unsent, over 1,000 keys), `migrate` while a publisher
/// commits one event per transaction: how long the upgrade took, and the
/// longest commit meanwhile beside the longest before; then `migrate` on the
/// current schema beside the last upgrade.
fn migration_cost(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_mig_";
    let (store, mut c) = fresh(p)?;
    let rows = s.plan_rows;
    let drop = |c: &mut postgres::Client| {
        c.batch_execute(&format!(
            "DROP TABLE IF EXISTS {p}outbox_events, {p}outbox_dead_letters, {p}inbox_consumed, \
             {p}job_locks, {p}txbox_schema_version, {p}outbox_quiet_types"
        ))
    };
    drop(&mut c)?;
    // every file, as a database without the tables has them to run
    let files = store.pending_migrations()?;
    let latest = files.len();
    let config = Config::builder()
        .table_prefix(p)
        .event("bench", |e| e)
        .build()?;
    let outbox = Outbox::new(&config)?;
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let mut last = Duration::ZERO;
    for from in 0..latest {
        drop(&mut c)?;
        for file in files.iter().take(from.max(1)) {
            for stmt in file.statements() {
                // 0.1 had no version table
                if from > 0 || !stmt.contains("txbox_schema_version") {
                    c.batch_execute(&stmt)?;
                }
            }
        }
        c.batch_execute(&format!(
            "INSERT INTO {p}outbox_events (id, event_type, event_key, payload, status, processed_at) \
             SELECT gen_random_uuid(), 'bench', 'k' || (g % 1000), '{{}}', \
               CASE WHEN g % 10 = 0 THEN 'PENDING' ELSE 'PROCESSED' END, \
               CASE WHEN g % 10 = 0 THEN NULL ELSE now() END \
             FROM generate_series(1, {rows}) g; ANALYZE {p}outbox_events"
        ))?;
        // the longest commit of a publisher running throughout, in microseconds
        let longest = AtomicU64::new(0);
        let stop = std::sync::atomic::AtomicBool::new(false);
        let (upgrade, before, during) = std::thread::scope(|scope| -> Res<_> {
            let publisher = scope.spawn(|| -> Result<(), String> {
                let fail = |e: &dyn std::fmt::Display| e.to_string();
                let mut pc =
                    postgres::Client::connect(&pg_url(), postgres::NoTls).map_err(|e| fail(&e))?;
                while !stop.load(Ordering::Relaxed) {
                    let t = Instant::now();
                    let mut tx = pc.transaction().map_err(|e| fail(&e))?;
                    outbox.publish(&mut tx, "bench", &1).map_err(|e| fail(&e))?;
                    tx.commit().map_err(|e| fail(&e))?;
                    longest.fetch_max(t.elapsed().as_micros() as u64, Ordering::Relaxed);
                }
                Ok(())
            });
            std::thread::sleep(Duration::from_millis(500));
            let before = longest.swap(0, Ordering::Relaxed);
            let t = Instant::now();
            let migrated = store.migrate();
            let upgrade = t.elapsed();
            std::thread::sleep(Duration::from_millis(200));
            let during = longest.load(Ordering::Relaxed);
            stop.store(true, Ordering::Relaxed);
            publisher.join().map_err(|_| "publisher panicked")??;
            migrated?;
            Ok((upgrade, before, during))
        })?;
        let name = if from == 0 {
            "0.1".to_string()
        } else {
            format!("schema {from}")
        };
        out.push(row(
            format!("migrate: upgrade from {name} to {latest} over {rows} events (a tenth unsent)"),
            format!("{:.0} ms", ms(upgrade)),
            "-".into(),
            0.0,
            "measured",
        ));
        out.push(ms_row(
            format!("migrate from {name}: longest publish commit during it (vs before)"),
            during as f64 / 1000.0,
            before as f64 / 1000.0,
            "measured",
        ));
        last = upgrade;
    }
    let t = Instant::now();
    store.migrate()?;
    out.push(ms_row(
        "migrate on the current schema (vs the last upgrade)",
        ms(t.elapsed()),
        ms(last),
        "one read",
    ));
    Ok(())
}

fn idle_direct(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    for name in ["rabbitmq", "kafka"] {
        let broker = pickup_broker(name)?;
        let mut sender = broker.factory.create()?;
        let event = |n: usize| broker.event(n);
        // the connection opened and used, as a running relay's is, and the
        // queue as full as the latency part leaves it (nothing consumes it)
        let burst: Vec<Event> = (0..s.burst).map(event).collect();
        for chunk in burst.chunks(200) {
            let _ = sender.send(chunk);
        }
        let mut l = Vec::new();
        for n in 0..s.idle_samples {
            std::thread::sleep(s.idle_single);
            let t = Instant::now();
            if sender.send(&[event(n + 1)]).iter().all(|r| r.is_ok()) {
                l.push(t.elapsed().as_secs_f64() * 1000.0);
            }
        }
        out.push(row(
            format!(
                "  {}: one event published directly after {:?} idle, p50 / p99 ({} samples)",
                broker.name,
                s.idle_single,
                l.len()
            ),
            format!("{:.1} ms", median(&mut l.clone())),
            format!("{:.1} ms", pct(&mut l, 0.99)),
            0.0,
            "-",
        ));
    }
    Ok(())
}

const PARTS: [&str; 12] = [
    "writers",
    "migrate",
    "publish",
    "batch",
    "floor",
    "ordered",
    "plan",
    "brokers",
    "idle",
    "latency",
    "idle-direct",
    "instances",
];

/// The benchmark: what txbox costs a business transaction and how fast and how
/// safely it drains, each figure beside its baseline in the same run. A bad
/// flag or value is an error, not a silently ignored word that runs
/// everything.
#[derive(clap::Parser)]
#[command(name = "bench")]
struct Args {
    /// The full sizes (100,000 events, 5 minutes idle, 3 rounds; about 10
    /// minutes) instead of the quick run (under a minute).
    #[arg(long)]
    full: bool,
    /// Run only these parts (writers: 1, 8, 32 and 64 concurrent publishers
    /// with the wake-up on commit on and off, a relay draining; migrate: an
    /// upgrade's duration and the longest publish during it over 100,000
    /// events, 1,000,000 with --full; idle-direct: the broker's share of the
    /// pick-up after idle, one event published directly; ordered: the relay
    /// floor of an ordered type; plan: an ordered claim's EXPLAIN over 100,000
    /// pending rows, 1,000,000 with --full).
    #[arg(long, value_name = "PART,PART...", value_delimiter = ',',
          value_parser = clap::builder::PossibleValuesParser::new(PARTS))]
    only: Option<Vec<String>>,
    /// Batches the relay keeps with the broker (default: the relay's
    /// default, 3).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..=16))]
    in_flight: Option<u16>,
    /// The relay floor and the brokers with processed_ttl zero: acked rows
    /// are deleted instead of marked PROCESSED (the hand loop too).
    #[arg(long)]
    delete_acked: bool,
    /// `lock`: the relay floor and the brokers with held claims (rows locked
    /// in an open transaction, not stamped; the hand loop too).
    #[arg(long, value_name = "lease|lock", default_value = "lease")]
    claim: ClaimMode,
    /// Pending events for the relay floor, the brokers and the many
    /// instances (quick 20,000; full 100,000).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    events: Option<u64>,
    /// Transactions for the publish overhead (quick 500; full 5,000); batch
    /// publish runs N/5 batches.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    txs: Option<u64>,
    /// How long the idle cost is observed, and the idle time before the
    /// single-event pick-up (quick 10 and 5; full 300 and 60).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    idle: Option<u64>,
    /// How long events arrive at 100/s for the pick-up latency (quick 3;
    /// full 30).
    #[arg(long, value_name = "SECS", value_parser = clap::value_parser!(u64).range(1..))]
    rate_secs: Option<u64>,
    /// How often the relay floor's turns (relay, hand loop, hand loop, relay)
    /// and the brokers' runs (relay, direct, database alone) repeat; each
    /// figure is their median (quick 1; full 3).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    rounds: Option<u64>,
    /// The publish overhead with PostgreSQL's commit notification `on` (as
    /// shipped), `off` (its trigger disabled) or `empty` (the trigger fires,
    /// its function sends nothing).
    #[arg(long, default_value = "on", value_parser = ["on", "off", "empty"])]
    trigger: String,
}

fn main() -> Res<()> {
    let raw: Vec<String> = std::env::args().skip(1).collect();
    if let [flag, prefix, file, broker] = raw.as_slice() {
        if flag == "--worker" {
            return worker(prefix, file, broker);
        }
    }
    let args = <Args as clap::Parser>::parse();
    let (full, only) = (args.full, args.only.clone());
    let in_flight = args.in_flight.map(usize::from);
    let n = |v: Option<u64>| v.map(|n| n as usize);
    let (events, txs, rounds) = (n(args.events), n(args.txs), n(args.rounds));
    let part = |name: &str| only.as_ref().is_none_or(|o| o.iter().any(|x| x == name));
    let s = if full {
        Size {
            txs: 5000,
            batches: 1000,
            floor: 100_000,
            brokers: 100_000,
            idle: Duration::from_secs(300),
            rate_secs: 30,
            burst: 10_000,
            idle_single: Duration::from_secs(60),
            idle_samples: 10,
            instances: 100_000,
            plan_rows: 1_000_000,
            writers_secs: 8,
            trigger: String::new(),
            rounds: 3,
            in_flight,
            delete_acked: args.delete_acked,
            claim: args.claim,
        }
    } else {
        Size {
            txs: 500,
            batches: 100,
            floor: 20_000,
            brokers: 20_000,
            idle: Duration::from_secs(10),
            rate_secs: 3,
            burst: 2_000,
            idle_single: Duration::from_secs(5),
            idle_samples: 2,
            instances: 20_000,
            plan_rows: 100_000,
            writers_secs: 3,
            trigger: String::new(),
            rounds: 1,
            in_flight,
            delete_acked: args.delete_acked,
            claim: args.claim,
        }
    };
    let s = Size {
        txs: txs.unwrap_or(s.txs),
        batches: txs.map_or(s.batches, |n| (n / 5).max(1)),
        floor: events.unwrap_or(s.floor),
        brokers: events.unwrap_or(s.brokers),
        instances: events.unwrap_or(s.instances),
        idle: args.idle.map_or(s.idle, Duration::from_secs),
        idle_single: args.idle.map_or(s.idle_single, Duration::from_secs),
        rate_secs: args.rate_secs.unwrap_or(s.rate_secs),
        rounds: rounds.unwrap_or(s.rounds),
        trigger: args.trigger.clone(),
        ..s
    };
    let _ = env_logger::builder()
        .filter_level(log::LevelFilter::Error)
        .try_init();
    let (rabbit, brokers) = (rabbit_url(), kafka_brokers());
    let mut out = Vec::new();
    let t = Instant::now();
    let step = |what: &str| eprintln!("bench: {what} done at {:.1}s", t.elapsed().as_secs_f64());
    if part("publish") {
        publish_overhead(&s, &mut out)?;
        step("publish overhead");
    }
    if part("batch") {
        batch_publish(&s, &mut out)?;
        step("batch publish");
    }
    if part("floor") {
        relay_floor(&s, false, &mut out)?;
        relay_floor(&s, true, &mut out)?;
        step("relay floor");
    }
    if part("ordered") {
        ordered_floor(&s, &mut out)?;
        step("ordered relay floor");
    }
    if part("plan") {
        ordered_plan(&s, &mut out)?;
        step("ordered claim plan");
    }
    if part("brokers") {
        ensure_queue(&rabbit)?;
        broker_throughput(
            "RabbitMQ (confirms)",
            &s,
            Arc::new(txbox::rabbitmq::RabbitSender::builder(&rabbit).build()),
            "amq.direct",
            &|| ensure_queue(&rabbit),
            &mut out,
        )?;
        txbox::kafka::ensure_topic(&brokers, "txbox-bench", 3)?;
        broker_throughput(
            "Kafka (acks=all)",
            &s,
            Arc::new(txbox::kafka::KafkaSender::builder(&brokers).build()?),
            "txbox-bench",
            &|| Ok(()), // Tansu keeps no queue to empty
            &mut out,
        )?;
        step("brokers");
    }
    if part("writers") {
        concurrent_publishers(&s, &mut out)?;
        step("concurrent publishers");
    }
    if part("idle") {
        idle_cost(&s, &mut out)?;
        step("idle cost");
    }
    if part("latency") {
        pickup_latency(&s, pickup_broker("rabbitmq")?, &mut out)?;
        pickup_latency(&s, pickup_broker("kafka")?, &mut out)?;
        step("pick-up latency");
    }
    if part("migrate") {
        migration_cost(&s, &mut out)?;
        step("migrate");
    }
    if part("idle-direct") {
        idle_direct(&s, &mut out)?;
        step("direct publish after idle");
    }
    if part("instances") {
        many_instances(&s, &mut out)?;
        for broker in ["rabbitmq", "kafka"] {
            many_latency(&s, broker, &mut out)?;
        }
        step("many instances");
    }

    println!("txbox bench ({})", if full { "full" } else { "quick" });
    let w = out.iter().map(|r| r.what.len()).max().unwrap_or(10);
    println!(
        "| {:w$} | {:>14} | {:>22} | {:>6} | target |",
        "measure", "txbox", "baseline", "ratio"
    );
    println!(
        "|{}|{}|{}|{}|---|",
        "-".repeat(w + 2),
        "-".repeat(16),
        "-".repeat(24),
        "-".repeat(8)
    );
    for r in out {
        let ratio = if r.ratio == "0.00" {
            "-".to_string()
        } else {
            r.ratio
        };
        println!(
            "| {:w$} | {:>14} | {:>22} | {:>6} | {} |",
            r.what, r.txbox, r.baseline, ratio, r.target
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn literals_replace_whole_placeholders() {
        let v: Vec<String> = (1..=10).map(|n| format!("v{n}")).collect();
        let v: Vec<&str> = v.iter().map(String::as_str).collect();
        assert_eq!(
            super::with_literals("$1, $10, $$ x $2", &v).unwrap(),
            "v1, v10, $$ x v2"
        );
        assert!(super::with_literals("$11", &v).is_err());
    }
}
