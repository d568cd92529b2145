//! What the bench parts share: sizes, the table, statistics, CPU readings,
//! fresh tables, the claims counted and the senders.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txbox::sender::Started;
use txbox::{ClaimMode, Config, Event, EventId, EventSettings, Outbox, PgStore, SendError, Sender};

pub(crate) type Res<T> = Result<T, Box<dyn std::error::Error>>;

pub(crate) fn pg_url() -> String {
    std::env::var("TXBOX_PG_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into())
}

pub(crate) struct Size {
    pub(crate) txs: usize,
    pub(crate) batches: usize,
    pub(crate) floor: usize,
    pub(crate) brokers: usize,
    pub(crate) idle: Duration,
    pub(crate) rate_secs: u64,
    pub(crate) burst: usize,
    pub(crate) idle_single: Duration,
    /// how many single events after an idle spell are timed
    pub(crate) idle_samples: usize,
    pub(crate) instances: usize,
    /// pending rows under the ordered claim's plan
    pub(crate) plan_rows: usize,
    /// how long each run of the concurrent publishers lasts
    pub(crate) writers_secs: u64,
    /// `--writers N,N`: the numbers of concurrent publishers (1, 8, 32, 64)
    pub(crate) writers: Vec<usize>,
    /// `--trigger on|off|empty`: the publish overhead with the commit
    /// notification as shipped, its trigger disabled, or its function emptied
    /// (the trigger fires and sends nothing): what NOTIFY itself costs
    pub(crate) trigger: String,
    /// `--rounds N`: how many times the relay floor's turns and the brokers' relay
    /// and direct runs repeat; each figure is the median
    pub(crate) rounds: usize,
    /// `--in-flight N`: the relay's window for the broker rows (default: the
    /// configuration's default)
    pub(crate) in_flight: Option<usize>,
    /// `--delete-acked`: the relay floor and the brokers with `processed_ttl` zero
    pub(crate) delete_acked: bool,
    /// `--claim lock`: the relay floor and the brokers with held claims
    pub(crate) claim: ClaimMode,
}

impl Size {
    /// What the rows' labels add for held claims and deleted acked rows.
    pub(crate) fn mode(&self) -> String {
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
    pub(crate) fn relay_config(&self, prefix: &str, options: EventSettings) -> Config {
        config_with(prefix, options.claim(self.claim), self.delete_acked)
    }
}

/// `sql` with each placeholder `$n` replaced by `values[n - 1]` (a literal),
/// read as a whole number: `$10` is the tenth, not `$1` and a 0. An error for
/// a placeholder without a value.
pub(crate) fn with_literals(sql: &str, values: &[&str]) -> Res<String> {
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

/// Every table txbox makes under `prefix`, on any dialect: a fresh run
/// drops them first.
pub(crate) fn tables_of(prefix: &str) -> Res<Vec<String>> {
    let t = txbox::store::Tables::new(prefix)?;
    Ok(vec![
        t.outbox().to_owned(),
        t.dlq().to_owned(),
        t.inbox().to_owned(),
        t.locks().to_owned(),
        t.schema_version().to_owned(),
        // a type left `poll` here by an earlier run would not notify
        format!("{prefix}outbox_quiet_types"),
        format!("{prefix}outbox_paused_types"),
        // SQLite's counter of insert numbers
        format!("{prefix}outbox_seq"),
    ])
}

pub(crate) fn fresh(prefix: &str) -> Res<(Arc<PgStore>, postgres::Client)> {
    let mut c = postgres::Client::connect(&pg_url(), postgres::NoTls)?;
    for table in tables_of(prefix)? {
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
pub(crate) fn config_with(prefix: &str, options: EventSettings, delete_acked: bool) -> Config {
    let b = Config::builder()
        .table_prefix(prefix)
        .event("bench", |_| options);
    let b = if delete_acked {
        b.maintenance(|m| m.processed_ttl(Duration::ZERO))
    } else {
        b
    };
    b.build().expect("config")
}

pub(crate) fn config(prefix: &str, options: EventSettings) -> Config {
    config_with(prefix, options, false)
}

/// The middle value (the mean of the middle two of an even count).
/// The median of `v`; NaN when it is empty (a row that says nothing was
/// measured, not a panic).
pub(crate) fn p50(v: &[f64]) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    median(&mut v.to_vec())
}

pub(crate) fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    (v[(n - 1) / 2] + v[n / 2]) / 2.0
}

/// CPU time the whole machine spent busy so far (every process, every core:
/// `/proc/stat`), or None where there is no `/proc/stat`.
pub(crate) fn machine_busy() -> Option<f64> {
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
pub(crate) fn with_cpu<T>(f: impl FnOnce() -> Res<T>) -> Res<(T, Option<f64>)> {
    let before = machine_busy();
    let r = f()?;
    Ok((r, before.zip(machine_busy()).map(|(b, a)| a - b)))
}

pub(crate) fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[((v.len() - 1) as f64 * p).round() as usize]
}

pub(crate) struct Row {
    pub(crate) what: String,
    pub(crate) txbox: String,
    pub(crate) baseline: String,
    pub(crate) ratio: String,
    pub(crate) target: &'static str,
}

pub(crate) fn row(
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
pub(crate) fn ms_row(what: impl Into<String>, ours: f64, base: f64, target: &'static str) -> Row {
    row(
        what,
        format!("{ours:.3} ms"),
        format!("{base:.3} ms"),
        ours / base,
        target,
    )
}

pub(crate) fn fill(c: &mut postgres::Client, outbox: &Outbox, n: usize) -> Res<Vec<EventId>> {
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
pub(crate) fn fill_keyed(
    c: &mut postgres::Client,
    outbox: &Outbox,
    n: usize,
    keys: usize,
) -> Res<()> {
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

/// Counts the claims (one statement each on PostgreSQL) a store makes, and
/// keeps how long each took: the store reports each call to its
/// configuration's observer.
#[derive(Default)]
pub(crate) struct Claims {
    count: AtomicU64,
    /// a quiet poller's questions when its type's next event is due
    asked: AtomicU64,
    /// store calls of any kind, and those that failed
    calls: AtomicU64,
    failed: AtomicU64,
    /// when each claim ended, and how long it took (ms)
    took_ms: Mutex<Vec<(Instant, f64)>>,
    /// only the claims made on the thread of this name are timed (a poller
    /// is `txbox-poll-<type>`); all when `None`
    timed: Option<String>,
}

impl Claims {
    /// Counts every claim; times only those of the poller of `event_type`.
    pub(crate) fn timing(event_type: &str) -> Self {
        Claims {
            timed: Some(format!("txbox-poll-{event_type}")),
            ..Claims::default()
        }
    }

    pub(crate) fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The statements of the pollers: claims and questions when the next
    /// event is due.
    pub(crate) fn statements(&self) -> u64 {
        self.count() + self.asked.load(Ordering::Relaxed)
    }

    /// Store calls of any kind, and how many of them failed.
    pub(crate) fn calls(&self) -> (u64, u64) {
        (
            self.calls.load(Ordering::Relaxed),
            self.failed.load(Ordering::Relaxed),
        )
    }

    /// The claims made since the last call: when each ended and how long it
    /// took (ms).
    pub(crate) fn take_durations(&self) -> Vec<(Instant, f64)> {
        std::mem::take(&mut *self.took_ms.lock().unwrap())
    }
}

impl txbox::metrics::Observer for Claims {
    fn store_call(&self, call: txbox::metrics::StoreCall, took: Duration, ok: bool) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if !ok {
            self.failed.fetch_add(1, Ordering::Relaxed);
        }
        if call == txbox::metrics::StoreCall::NextDue {
            // a quiet type's poll: one statement in place of a claim
            self.asked.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if call == txbox::metrics::StoreCall::Claim {
            self.count.fetch_add(1, Ordering::Relaxed);
            let thread = std::thread::current();
            if self
                .timed
                .as_deref()
                .is_some_and(|t| thread.name() != Some(t))
            {
                return;
            }
            self.took_ms
                .lock()
                .unwrap()
                .push((Instant::now(), took.as_secs_f64() * 1000.0));
        }
    }
}

/// A store on the tables of `cfg` whose claims are counted (the relay's
/// other metrics go where `cfg` says).
pub(crate) fn counted(cfg: &Config) -> Res<(Arc<PgStore>, Arc<Claims>)> {
    counted_by(cfg, Claims::default())
}

/// A store on the tables of `cfg` that reports its claims to `claims`.
pub(crate) fn counted_by(cfg: &Config, claims: Claims) -> Res<(Arc<PgStore>, Arc<Claims>)> {
    let claims = Arc::new(claims);
    let observed = cfg.clone().observed(claims.clone());
    Ok((Arc::new(PgStore::connect(&pg_url(), &observed)?), claims))
}

/// A sender that acks every event at once: the relay's own work, no broker.
pub(crate) struct Discard;

impl Sender for Discard {
    fn send(&mut self, events: &[Event]) -> Vec<Result<(), SendError>> {
        events.iter().map(|_| Ok(())).collect()
    }
}

/// Publishes as `writers` threads for `secs`, each on its own connection, a
/// business row and an event of `event_type` per transaction; returns the
/// commits.
pub(crate) fn publish_flat_out(
    cfg: &Config,
    event_type: &'static str,
    writers: usize,
    secs: u64,
) -> Res<u64> {
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

/// What a [`Timed`] sender saw acked.
#[derive(Clone, Default)]
pub(crate) struct Acks {
    pub(crate) count: Arc<AtomicU64>,
    /// The time of each event's first ack, when wanted.
    pub(crate) times: Option<Arc<Mutex<HashMap<EventId, Instant>>>>,
    /// A file to append `<id> <unix time of the ack in µs>` lines to, for the
    /// relay processes of the many-instances scenarios.
    pub(crate) log: Option<Arc<Mutex<std::fs::File>>>,
}

/// Records what the wrapped sender acked, pipelining as the wrapped one does.
pub(crate) struct Timed<S> {
    pub(crate) inner: S,
    pub(crate) acks: Acks,
    pub(crate) in_flight: std::collections::VecDeque<Vec<EventId>>,
}

impl<S> Timed<S> {
    pub(crate) fn new(inner: S, acks: Acks) -> Self {
        Timed {
            inner,
            acks,
            in_flight: Default::default(),
        }
    }

    pub(crate) fn record(&self, ids: &[EventId], results: &[Result<(), SendError>]) {
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
pub(crate) fn unix_micros() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_micros())
        .unwrap_or(0)
}

pub(crate) fn ids(events: &[Event]) -> Vec<EventId> {
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

/// The bench's RabbitMQ sender: its event types go to the queue bound with
/// the routing key `txbox-bench`.
pub(crate) fn rabbit_sender(url: &str) -> Res<txbox::rabbitmq::RabbitSender> {
    Ok(txbox::rabbitmq::RabbitSender::builder(url)
        .default_routing_key("txbox-bench")
        .build()?)
}

pub(crate) fn rabbit_url() -> String {
    std::env::var("TXBOX_RABBITMQ_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672".into())
}

pub(crate) fn kafka_brokers() -> String {
    std::env::var("TXBOX_KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

pub(crate) const PARTS: [&str; 17] = [
    "soak",
    "slow-link",
    "soak-mysql",
    "diesel",
    "delayed",
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

/// Per thread id: its name, its nanoseconds waited on a run queue, how often
/// it was scheduled.
pub(crate) type ThreadWaits = HashMap<u64, (String, u64, u64)>;

/// How long this process's threads named `txbox-...` (the relay's) waited on a
/// run queue for a core, and how often they were scheduled, per thread id
/// (`/proc/self/task/*/schedstat`; empty where the kernel keeps none).
pub(crate) fn relay_thread_waits() -> ThreadWaits {
    let mut out = HashMap::new();
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return out;
    };
    for task in tasks.flatten() {
        let Ok(tid) = task.file_name().to_string_lossy().parse::<u64>() else {
            continue;
        };
        let path = task.path();
        let Ok(name) = std::fs::read_to_string(path.join("comm")) else {
            continue;
        };
        let name = name.trim().to_string();
        if !name.starts_with("txbox-") {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(path.join("schedstat")) else {
            continue;
        };
        let f: Vec<u64> = stat
            .split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect();
        if let [_, waited_ns, slices] = f[..] {
            out.insert(tid, (name, waited_ns, slices));
        }
    }
    out
}

/// The mean run-queue wait (ms) per scheduling of the threads named `thread`
/// (as the kernel keeps it: 15 bytes at most), between two
/// [`relay_thread_waits`] readings.
pub(crate) fn mean_wait(before: &ThreadWaits, after: &ThreadWaits, thread: &str) -> Option<f64> {
    let (mut waited, mut slices) = (0u64, 0u64);
    for (tid, (name, w, n)) in after {
        if name != thread {
            continue;
        }
        let (w0, n0) = before.get(tid).map_or((0, 0), |b| (b.1, b.2));
        waited += w.saturating_sub(w0);
        slices += n.saturating_sub(n0);
    }
    (slices > 0).then(|| waited as f64 / 1e6 / slices as f64)
}
