//! Held claims (`claim = "lock"`): rows locked in an open transaction and
//! finished in it, beside lease claims, through stores of one's own.

use std::collections::HashSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use txbox::store::ClaimStore;
use txbox::{DeadLetterStore, FullStore, InboxStore, MaintenanceStore, Store};

use crate::common::*;
use serde_json::json;
use txbox::store::{ClaimArgs, Outcome};
use txbox::{
    ClaimMode, Config, DlqStatus, EventId, EventSettings, MemorySender, NewEvent, Outbox, Relay,
};

use super::{fast, ms};

/// `claim = "lock"`: the relay holds each batch's rows locked in an open
/// transaction instead of stamping them, and finishes them in it.
#[test]
fn held_claims_deliver_every_event_and_finish_in_their_transaction() {
    held_claims_leave_no_stamp("t_rel_held_", "txbox_held_test", Drain::Relay);
}

/// `Relay::deliver_pending` claims as the type says too: held claims, not
/// stamped rows.
#[test]
fn deliver_pending_holds_the_claims_of_a_held_type() {
    held_claims_leave_no_stamp("t_rel_heldf_", "txbox_heldf_test", Drain::DeliverPending);
}

fn held_claims_leave_no_stamp(p: &str, app: &str, drain: Drain) {
    let Some((store, mut client)) = fresh_with_url(p, &pg_url_as(app)) else {
        return;
    };
    held_backlog(p, store, &mut client, drain);
    // the refused ones wait for their retry with the attempt counted, never claimed
    // under a token
    let (pending, attempts, stamped): (i64, i64, i64) = {
        let r = client
            .query_one(
                &format!(
                    "SELECT count(*) FILTER (WHERE status = 'PENDING'), \
                       coalesce(sum(attempts) FILTER (WHERE status = 'PENDING'), 0)::int8, \
                       count(*) FILTER (WHERE claim_token IS NOT NULL OR status = 'IN_PROCESS') \
                     FROM {p}outbox_events"
                ),
                &[],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    assert_eq!((pending, attempts, stamped), (100, 100, 0));
    // every held transaction ended: none of the store's sessions is left in one
    assert_eq!(open_transactions(&mut client, app), 0);
}

/// Who drains the backlog.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Drain {
    Relay,
    DeliverPending,
}

/// Drains a backlog of 1,000 events of type "h" with held claims (batches of 40,
/// 3 in flight) from `store` into a sender that refuses every tenth event; checks
/// that each acked event was sent once and the refused ones were not.
fn held_backlog(p: &str, store: Arc<impl FullStore>, client: &mut postgres::Client, drain: Drain) {
    let config = Config::builder()
        .table_prefix(p)
        .defaults(|e: EventSettings| {
            fast(e)
                .batch_size(40)
                .in_flight(3)
                .claim(ClaimMode::Lock)
                .max_retries(5)
                .backoff_delay(ms(3_600_000))
        })
        .event("h", |e| e)
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let sender = MemorySender::new();
    // while a batch is with the sender its rows are locked, not stamped: no
    // row is ever IN_PROCESS (looked at from a session of its own, each tenth send)
    let watcher = Mutex::new(postgres::Client::connect(&pg_url(), postgres::NoTls).unwrap());
    let stamped_seen = Arc::new(AtomicUsize::new(0));
    let seen = stamped_seen.clone();
    let sql = format!("SELECT count(*) FROM {p}outbox_events WHERE status = 'IN_PROCESS'");
    sender.fail_when(move |e| {
        if e.payload.ends_with(b"3") {
            let n: i64 = watcher.lock().unwrap().query_one(&sql, &[]).unwrap().get(0);
            seen.fetch_max(n as usize, Ordering::Relaxed);
        }
        e.payload.ends_with(b"7").then(|| "refused".to_string())
    });
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("h", 0..1000).unwrap())
        .unwrap();
    tx.commit().unwrap();
    if drain == Drain::Relay {
        let relay = Relay::start(store, &config, sender.clone()).unwrap();
        wait_until("the acked rows processed", Duration::from_secs(20), || {
            count(client, p, "PROCESSED") == 900
        });
        relay.shutdown(Duration::from_secs(5)).unwrap();
    } else {
        let report = Relay::deliver_pending(&*store, &config, &mut sender.clone()).unwrap();
        assert_eq!((report.sent(), report.not_sent()), (900, 100));
        assert_eq!(count(client, p, "PROCESSED"), 900);
    }
    assert_eq!(
        stamped_seen.load(Ordering::Relaxed),
        0,
        "rows IN_PROCESS while sent"
    );

    let sent = sender.sent();
    let acked: HashSet<EventId> = sent.iter().map(|e| e.id).collect();
    assert_eq!(acked.len(), 900);
    assert_eq!(sent.len(), 900, "no event sent twice");
    assert!(ids
        .iter()
        .enumerate()
        .all(|(i, id)| (i % 10 == 7) != acked.contains(id)));
}

/// How many sessions of application `app` idle in an open transaction.
fn open_transactions(client: &mut postgres::Client, app: &str) -> i64 {
    client
        .query_one(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE application_name = $1 AND state LIKE 'idle in transaction%'",
            &[&app],
        )
        .unwrap()
        .get(0)
}

#[test]
fn a_held_claim_hides_its_rows_until_it_ends_and_a_lost_one_changes_nothing() {
    held_claim_semantics("t_rel_holdx_", false);
}

/// With acked rows deleted, a held claim deletes its rows in the held transaction:
/// the same guarantees, and the events not acked come back as they were.
#[test]
fn a_deleting_held_claim_hides_its_rows_and_writes_back_what_was_not_acked() {
    held_claim_semantics("t_rel_holdd_", true);
}

/// The rows of `p`'s outbox: id, key, headers, payload, created_at, in id order.
fn snapshot(
    client: &mut postgres::Client,
    p: &str,
) -> Vec<(uuid::Uuid, Option<String>, String, String, String)> {
    client
        .query(
            &format!(
                "SELECT id, event_key, headers::text, payload, created_at::text \
                 FROM {p}outbox_events ORDER BY id"
            ),
            &[],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4)))
        .collect()
}

/// An outbox on the tables of prefix `p` with the one event type `x`.
fn outbox_of_x(p: &str) -> Outbox {
    let config = Config::builder()
        .table_prefix(p)
        .event("x", |e| e)
        .build()
        .unwrap();
    Outbox::new(&config).unwrap()
}

fn held_claim_semantics(p: &str, delete_acked: bool) {
    let app = format!("txbox_{p}test");
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let outbox = outbox_of_x(p);
    let mut tx = client.transaction().unwrap();
    let mut ids = Vec::new();
    for i in 0..10 {
        // keys and headers (quotes, backslashes) must survive a write-back
        let e = NewEvent::new("x", &json!({"n": i, "s": r"it's \ here"}))
            .unwrap()
            .key(format!("k'{i}"))
            .header("h", r#"a"b\c"#);
        ids.push(outbox.publish_all(&mut tx, [e]).unwrap()[0]);
    }
    tx.commit().unwrap();
    let before = snapshot(&mut client, p);
    let other =
        txbox::PgStore::connect(&pg_url_as(&app), &crate::common::prefix_config(p)).unwrap();
    let lease = Duration::from_secs(60);
    let claim_x = ClaimArgs::new("x", 100, lease).delete_acked(delete_acked);
    let token = uuid::Uuid::now_v7();
    let sent = |events: &[txbox::Event]| -> Vec<(EventId, Outcome)> {
        let acked = if delete_acked {
            Outcome::SentDelete
        } else {
            Outcome::Sent
        };
        events.iter().map(|e| (e.id, acked.clone())).collect()
    };

    let (events, held) = store.claim_held(&claim_x).unwrap().into_parts();
    assert_eq!(events.iter().map(|e| e.id).collect::<Vec<_>>(), ids);
    assert_eq!(events[0].key.as_deref(), Some("k'0"));
    assert_eq!(
        events[0].headers.get("h").map(String::as_str),
        Some(r#"a"b\c"#)
    );
    // the rows stay PENDING to others, locked: another relay gets none of them, in
    // either mode
    assert_eq!(count(&mut client, p, "PENDING"), 10);
    let (none, no_tx) = other.claim_held(&claim_x).unwrap().into_parts();
    assert!(none.is_empty() && no_tx.is_none());
    assert!(other.claim("x", 100, lease, token).unwrap().is_empty());
    // a claim dropped unfinished (a panicking poller) rolls back: the rows are free
    drop(held);
    let (again, held) = other.claim_held(&claim_x).unwrap().into_parts();
    assert_eq!(again.len(), 10);
    // its connection dies before the finish: the late finish fails, nothing changes,
    // and the rows are free again at once, not after the lease
    assert!(kill_backends(&mut client, &app) > 0);
    let late = held.unwrap().finish(&again, &sent(&again));
    assert!(late.is_err(), "a finish on a dead connection fails");
    assert_eq!(count(&mut client, p, "PENDING"), 10);
    assert_eq!(snapshot(&mut client, p), before);
    let (last, held) = store.claim_held(&claim_x).unwrap().into_parts();
    assert_eq!(last.len(), 10);
    // failed sends count an attempt: a retry waits, the last one fails
    let mut outcomes = sent(&last);
    outcomes[0].1 = Outcome::Retry {
        delay: Duration::from_secs(3600),
        // written into the finish script as a literal: quotes and backslashes kept
        error: r"broker's \busy\".into(),
    };
    outcomes[1].1 = Outcome::Failed {
        error: "gone".into(),
    };
    assert_eq!(held.unwrap().finish(&last, &outcomes).unwrap(), 10);
    let processed = if delete_acked { 0 } else { 8 };
    assert_eq!(count(&mut client, p, "PROCESSED"), processed);
    assert_eq!(count(&mut client, p, "FAILED"), 1);
    let r = client
        .query_one(
            &format!(
                "SELECT attempts, last_error, next_attempt_at > now() + interval '50 minutes' \
                 FROM {p}outbox_events WHERE status = 'PENDING'"
            ),
            &[],
        )
        .unwrap();
    assert_eq!(
        (
            r.get::<_, i32>(0),
            r.get::<_, String>(1),
            r.get::<_, bool>(2)
        ),
        (1, r"broker's \busy\".to_string(), true)
    );
    // the two events not acked keep their key, headers, payload and age
    let after = snapshot(&mut client, p);
    let kept = if delete_acked {
        &before[..2]
    } else {
        &before[..]
    };
    assert_eq!(after, kept);
    let (later, none) = store.claim_held(&claim_x).unwrap().into_parts();
    assert!(later.is_empty() && none.is_none(), "the retry is not due");
}

#[test]
fn a_held_batch_finishes_and_claims_the_next_in_one_call() {
    finish_and_claim("t_rel_fc_", false);
}

#[test]
fn a_deleting_held_batch_finishes_and_claims_the_next_in_one_call() {
    finish_and_claim("t_rel_fcd_", true);
}

/// `HeldBatch::finish_and_claim`: the finish applies and commits, the next rows
/// are held by a new transaction on the same connection, and when nothing is left
/// that transaction is committed too.
fn finish_and_claim(p: &str, delete: bool) {
    let app = format!("txbox_{p}test");
    let Some((_, mut client)) = fresh(p) else {
        return;
    };
    let store =
        txbox::PgStore::connect(&pg_url_as(&app), &crate::common::prefix_config(p)).unwrap();
    let other = txbox::PgStore::connect(&pg_url(), &crate::common::prefix_config(p)).unwrap();
    let outbox = outbox_of_x(p);
    let mut tx = client.transaction().unwrap();
    let ids = outbox
        .publish_all(&mut tx, txbox::NewEvent::batch("x", 0..10).unwrap())
        .unwrap();
    tx.commit().unwrap();
    let of = |events: &[txbox::Event]| events.iter().map(|e| e.id).collect::<Vec<_>>();
    let acked = if delete {
        Outcome::SentDelete
    } else {
        Outcome::Sent
    };
    let all_acked = |events: &[txbox::Event]| -> Vec<(EventId, Outcome)> {
        events.iter().map(|e| (e.id, acked.clone())).collect()
    };
    let lease = Duration::from_secs(60);

    let first = ClaimArgs::new("x", 4, lease).delete_acked(delete);
    let (a, held) = store.claim_held(&first).unwrap().into_parts();
    assert_eq!(of(&a), ids[..4]);
    let mut outcomes = all_acked(&a);
    outcomes[0].1 = Outcome::Retry {
        delay: Duration::from_secs(3600),
        error: "busy".into(),
    };
    let next = first.after(a.last().map(|e| e.id));
    let (n, claim) = held
        .unwrap()
        .finish_and_claim(&a, &outcomes, &next)
        .unwrap();
    assert_eq!(n, 4);
    let (b, held) = claim
        .expect("the store's batches claim the next one themselves")
        .into_parts();
    assert_eq!(of(&b), ids[4..8]);
    // the finish is committed: three acked, the retry counted and waiting
    assert_eq!(
        count(&mut client, p, "PROCESSED"),
        if delete { 0 } else { 3 }
    );
    let attempts: i32 = client
        .query_one(
            &format!("SELECT attempts FROM {p}outbox_events WHERE id = $1"),
            &[&ids[0].as_uuid()],
        )
        .unwrap()
        .get(0);
    assert_eq!(attempts, 1);
    // the new batch is held: another relay gets only the rest
    let (rest, other_held) = other.claim_held(&first.limit(10)).unwrap().into_parts();
    assert_eq!(of(&rest), ids[8..]);
    drop(other_held); // rolled back: free again

    // all acked, and the next claim after the batch's last id
    let step = |held: Option<Box<dyn txbox::store::HeldBatch>>, events: &[txbox::Event]| {
        let next = next.after(events.last().map(|e| e.id));
        held.unwrap()
            .finish_and_claim(events, &all_acked(events), &next)
            .unwrap()
    };
    let (n, claim) = step(held, &b);
    assert_eq!(n, 4);
    let (c, held) = claim.unwrap().into_parts();
    assert_eq!(of(&c), ids[8..]);
    let (n, claim) = step(held, &c);
    assert_eq!(n, 2);
    let (none, no_tx) = claim.unwrap().into_parts();
    assert!(none.is_empty() && no_tx.is_none());
    // nothing left open on the store's connections
    assert_eq!(
        open_transactions(&mut client, &app),
        0,
        "a transaction was left open"
    );
    let rows: i64 = client
        .query_one(&format!("SELECT count(*) FROM {p}outbox_events"), &[])
        .unwrap()
        .get(0);
    assert_eq!(rows, if delete { 1 } else { 10 });
    assert_eq!(count(&mut client, p, "PENDING"), 1, "the retry");
}

/// An idle type costs one statement per poll with held claims too: the claim first
/// asks whether anything is due, and opens no transaction when nothing is.
#[test]
fn an_idle_held_claim_sends_only_its_probe() {
    let p = "t_rel_holdidle_";
    let app = "txbox_holdidle_test";
    let Some((_, mut client)) = fresh(p) else {
        return;
    };
    let store = txbox::PgStore::connect(&pg_url_as(app), &crate::common::prefix_config(p)).unwrap();
    for delete_acked in [false, true] {
        let args = ClaimArgs::new("x", 100, Duration::from_secs(60)).delete_acked(delete_acked);
        let (events, held) = store.claim_held(&args).unwrap().into_parts();
        assert!(events.is_empty() && held.is_none());
    }
    // each backend's last statement: the probe, and no transaction was opened
    let ran: Vec<(String, String)> = client
        .query(
            "SELECT state, query FROM pg_stat_activity \
             WHERE application_name = $1 AND query <> ''",
            &[&app],
        )
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let probe = format!("SELECT 1 FROM {p}outbox_events WHERE");
    assert!(ran.iter().any(|(_, q)| q.starts_with(&probe)), "{ran:?}");
    assert!(
        ran.iter().all(|(state, q)| state == "idle"
            && !q.contains("FOR UPDATE")
            && !q.contains("COMMIT")),
        "{ran:?}"
    );
}

#[test]
fn held_claims_need_a_store_that_can_hold_them() {
    let config = Config::builder()
        .event("y", |e| e.claim(ClaimMode::Lock))
        .build()
        .unwrap();
    let store = Arc::new(
        txbox::SqliteStore::connect(":memory:", &crate::common::prefix_config("")).unwrap(),
    );
    store.migrate().unwrap();
    let err = Relay::start(store.clone(), &config, MemorySender::new())
        .err()
        .expect("SQLite cannot hold a claim open");
    assert!(
        matches!(&err, txbox::Error::Config { path, .. } if path == "events.y.claim"),
        "{err}"
    );
    assert!(err.to_string().contains("PostgreSQL"), "{err}");
    let err = store
        .claim_held(&ClaimArgs::new("y", 10, Duration::from_secs(1)))
        .expect_err("SQLite cannot hold a claim open");
    assert!(
        matches!(&err, txbox::Error::Unsupported { what, .. } if what.contains("lock")),
        "{err}"
    );
}

/// A held claim sends its statements as one script each, values written as
/// literals: event types with quotes and backslashes (and one that tries to end
/// the statement) are claimed exactly and harm nothing.
#[test]
fn held_claims_write_odd_event_types_as_exact_literals() {
    let p = "t_rel_holdq_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let odd = [
        r"it's",
        r"back\slash\\",
        r"x'); DELETE FROM t_rel_holdq_outbox_events; --",
        r"\'; SELECT 1; --",
        "ünïcödé ✓",
    ];
    let mut b = Config::builder().table_prefix(p);
    for t in odd {
        b = b.event(t, |e| e);
    }
    let config = b.build().unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let mut published = Vec::new();
    for t in odd {
        published.push(
            outbox
                .publish_all(&mut tx, txbox::NewEvent::batch(t, 0..3).unwrap())
                .unwrap(),
        );
    }
    tx.commit().unwrap();
    for (t, ids) in odd.iter().zip(&published) {
        let (events, held) = store
            .claim_held(&ClaimArgs::new(t, 10, Duration::from_secs(60)))
            .unwrap()
            .into_parts();
        assert_eq!(&events.iter().map(|e| e.id).collect::<Vec<_>>(), ids, "{t}");
        assert!(events.iter().all(|e| e.event_type == *t), "{t}");
        let acked: Vec<(EventId, Outcome)> = ids.iter().map(|id| (*id, Outcome::Sent)).collect();
        assert_eq!(held.unwrap().finish(&events, &acked).unwrap(), 3, "{t}");
    }
    assert_eq!(count(&mut client, p, "PROCESSED"), 15);
}

/// Relays with lease claims and relays with held claims share one table: each
/// skips what the others hold, and every event is delivered once.
#[test]
fn lease_and_held_claims_share_a_table_and_deliver_each_event_once() {
    let p = "t_rel_mixed_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = |claim: ClaimMode| {
        Config::builder()
            .table_prefix(p)
            .defaults(|e: EventSettings| fast(e).batch_size(50).claim(claim))
            .event("m", |e| e)
            .build()
            .unwrap()
    };
    let outbox = Outbox::new(&config(ClaimMode::Lease)).unwrap();
    let mut published = HashSet::new();
    for _ in 0..10 {
        let mut tx = client.transaction().unwrap();
        published.extend(
            outbox
                .publish_all(&mut tx, txbox::NewEvent::batch("m", 0..1000).unwrap())
                .unwrap(),
        );
        tx.commit().unwrap();
    }
    let senders: Vec<MemorySender> = (0..4).map(|_| MemorySender::new()).collect();
    // connected first, so the four relays start together
    let stores: Vec<Arc<dyn FullStore>> = (0..4)
        .map(|i| -> Arc<dyn FullStore> {
            if i == 0 {
                store.clone()
            } else {
                Arc::new(
                    txbox::PgStore::connect(&pg_url(), &crate::common::prefix_config(p)).unwrap(),
                )
            }
        })
        .collect();
    let mode = |i: usize| {
        if i % 2 == 0 {
            ClaimMode::Lease
        } else {
            ClaimMode::Lock
        }
    };
    let relays: Vec<Relay> = senders
        .iter()
        .zip(stores)
        .enumerate()
        .map(|(i, (s, store))| Relay::start(store, &config(mode(i)), s.clone()).unwrap())
        .collect();
    wait_until("10,000 rows processed", Duration::from_secs(60), || {
        count(&mut client, p, "PROCESSED") == 10_000
    });
    crate::common::shut_down_and_check_each_once(relays, &senders, &published);
    let share = |m: ClaimMode| -> usize {
        (0..4)
            .filter(|i| mode(*i) == m)
            .map(|i| senders[i].len())
            .sum()
    };
    assert!(
        share(ClaimMode::Lease) > 0 && share(ClaimMode::Lock) > 0,
        "both kinds of relay took a share: {:?}",
        senders.iter().map(MemorySender::len).collect::<Vec<_>>()
    );
}

/// A held batch of someone else's store: it implements only `finish`, so it gets
/// the trait's `finish_and_claim`, which finishes and leaves the next claim to the
/// store.
struct FinishOnly(Box<dyn txbox::store::HeldBatch>, Arc<AtomicUsize>);

impl txbox::store::HeldBatch for FinishOnly {
    fn finish(
        self: Box<Self>,
        events: &[txbox::Event],
        outcomes: &[(EventId, Outcome)],
    ) -> txbox::Result<u64> {
        self.1.fetch_add(1, Ordering::SeqCst);
        self.0.finish(events, outcomes)
    }
}

/// PostgreSQL whose held batches are [`FinishOnly`]; counts its held claims and
/// their finishes. Its next `lose_answers` leased claims that take events
/// commit and fail (their answer lost, as a connection that breaks after
/// the statement went out).
pub(super) struct DefaultHeld {
    pub(super) pg: Arc<txbox::PgStore>,
    pub(super) claims: Arc<AtomicUsize>,
    pub(super) finishes: Arc<AtomicUsize>,
    pub(super) lose_answers: Arc<AtomicUsize>,
}

impl Store for DefaultHeld {
    fn migrate(&self) -> txbox::Result<()> {
        self.pg.migrate()
    }
    fn ping(&self) -> txbox::Result<()> {
        self.pg.ping()
    }
    fn table_prefix(&self) -> &str {
        self.pg.table_prefix()
    }
    fn try_lock(&self, name: &str, owner: uuid::Uuid, lease: Duration) -> txbox::Result<bool> {
        self.pg.try_lock(name, owner, lease)
    }
    fn unlock(&self, name: &str, owner: uuid::Uuid) -> txbox::Result<()> {
        self.pg.unlock(name, owner)
    }
}

impl ClaimStore for DefaultHeld {
    fn claim_after(
        &self,
        args: &ClaimArgs<'_>,
        token: uuid::Uuid,
    ) -> txbox::Result<Vec<txbox::Event>> {
        let events = self.pg.claim_after(args, token)?;
        let lose = |n: usize| n.checked_sub(1);
        if !events.is_empty()
            && self
                .lose_answers
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, lose)
                .is_ok()
        {
            return Err(txbox::Error::Io {
                context: "the claim's answer".into(),
                source: std::io::Error::new(
                    std::io::ErrorKind::ConnectionReset,
                    "the connection broke after the claim was sent",
                ),
            });
        }
        Ok(events)
    }
    fn release_claims(&self, tokens: &[uuid::Uuid]) -> txbox::Result<u64> {
        self.pg.release_claims(tokens)
    }
    fn finish(&self, token: uuid::Uuid, outcomes: &[(EventId, Outcome)]) -> txbox::Result<u64> {
        self.pg.finish(token, outcomes)
    }
    fn capabilities(&self) -> txbox::store::Capabilities {
        self.pg.capabilities()
    }
    fn max_connections(&self) -> Option<usize> {
        self.pg.max_connections()
    }
    fn listen(&self) -> txbox::Result<Box<dyn txbox::store::Notifications>> {
        self.pg.listen()
    }
    fn claim_held(&self, args: &ClaimArgs<'_>) -> txbox::Result<txbox::store::HeldClaim> {
        self.claims.fetch_add(1, Ordering::SeqCst);
        let claimed = self.pg.claim_held(args)?;
        let held = claimed.batch.map(|h| {
            Box::new(FinishOnly(h, self.finishes.clone())) as Box<dyn txbox::store::HeldBatch>
        });
        Ok(txbox::store::HeldClaim::new(claimed.events, held))
    }
}

impl MaintenanceStore for DefaultHeld {
    fn recover_expired(&self, limit: usize) -> txbox::Result<u64> {
        self.pg.recover_expired(limit)
    }
    fn delete_processed(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.pg.delete_processed(ttl, limit)
    }
    fn status(&self) -> txbox::Result<Vec<txbox::TypeStatus>> {
        self.pg.status()
    }
}

impl DeadLetterStore for DefaultHeld {
    fn move_failed_to_dlq(&self, limit: usize) -> txbox::Result<u64> {
        self.pg.move_failed_to_dlq(limit)
    }
    fn requeue_dlq_retries(&self, limit: usize) -> txbox::Result<u64> {
        self.pg.requeue_dlq_retries(limit)
    }
    fn delete_resolved_dlq(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.pg.delete_resolved_dlq(ttl, limit)
    }
    fn dlq_list(&self, filter: &txbox::DlqFilter) -> txbox::Result<Vec<txbox::DeadLetter>> {
        self.pg.dlq_list(filter)
    }
    fn dlq_count(&self, filter: &txbox::DlqFilter) -> txbox::Result<u64> {
        self.pg.dlq_count(filter)
    }
    fn dlq_get(&self, id: EventId) -> txbox::Result<Option<txbox::DeadLetter>> {
        self.pg.dlq_get(id)
    }
    fn dlq_set_status(
        &self,
        ids: &[EventId],
        from: &[DlqStatus],
        to: DlqStatus,
    ) -> txbox::Result<Vec<EventId>> {
        self.pg.dlq_set_status(ids, from, to)
    }
    fn dlq_delete(&self, ids: &[EventId], from: &[DlqStatus]) -> txbox::Result<Vec<EventId>> {
        self.pg.dlq_delete(ids, from)
    }
    fn blocked_keys(
        &self,
        event_type: &str,
        limit: usize,
    ) -> txbox::Result<Vec<txbox::BlockedKey>> {
        self.pg.blocked_keys(event_type, limit)
    }
}

impl InboxStore for DefaultHeld {
    fn inbox_insert(&self, consumer: &str, ids: &[EventId]) -> txbox::Result<Vec<EventId>> {
        self.pg.inbox_insert(consumer, ids)
    }
    fn delete_expired_inbox(&self, ttl: Duration, limit: usize) -> txbox::Result<u64> {
        self.pg.delete_expired_inbox(ttl, limit)
    }
}

/// A store of one's own whose held batches keep the trait's `finish_and_claim`
/// (finish only): the relay claims each next batch through the store instead, and
/// a backlog still drains with every event sent once and every row finished.
#[test]
fn held_batches_without_their_own_finish_and_claim_drain_a_backlog() {
    let p = "t_rel_heldef_";
    let app = "txbox_heldef_test";
    let Some((pg, mut client)) = fresh_with_url(p, &pg_url_as(app)) else {
        return;
    };
    let (claims, finishes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let store = Arc::new(DefaultHeld {
        pg,
        claims: claims.clone(),
        finishes: finishes.clone(),
        lose_answers: Arc::default(),
    });
    held_backlog(p, store, &mut client, Drain::Relay);
    assert_eq!(
        count(&mut client, p, "PENDING"),
        100,
        "the refused wait to retry"
    );
    // 25 full batches, each claimed through the store and finished by its own batch
    let (claims, finishes) = (
        claims.load(Ordering::SeqCst),
        finishes.load(Ordering::SeqCst),
    );
    assert!(claims >= 25, "{claims} claims through the store");
    assert_eq!(finishes, 25, "each batch finished once");
    assert_eq!(
        open_transactions(&mut client, app),
        0,
        "no held transaction left open"
    );
}

/// Bytes published on PostgreSQL, through the prepared statement's transaction
/// too, claimed with held claims whose acked rows are deleted: a refused send
/// writes the row back, bytes and content type included, and the retry sends
/// them unchanged. The relay's sessions have `bytea_output = 'escape'` (a
/// server or role may): the held claim reads its rows as text all the same.
#[test]
fn binary_payloads_survive_a_held_claims_write_back() {
    let p = "t_rel_bytes_";
    let escape = format!(
        "{}&options=-c%20bytea_output%3Descape",
        pg_url_as("t_rel_bytes")
    );
    let Some((store, mut client)) = fresh_with_url(p, &escape) else {
        return;
    };
    let output: String = store
        .pool()
        .get()
        .unwrap()
        .query_one("SHOW bytea_output", &[])
        .unwrap()
        .get(0);
    assert_eq!(output, "escape", "the store's sessions write bytea escaped");
    let config = Config::builder()
        .table_prefix(p)
        .maintenance(|m| m.processed_ttl(Duration::ZERO))
        .defaults(|e: EventSettings| {
            fast(e)
                .claim(ClaimMode::Lock)
                .max_retries(3)
                .backoff_delay(ms(10))
        })
        .event("b", |e| e)
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let prepared = outbox.prepare_pg(&mut client).unwrap();
    let mut tx = client.transaction().unwrap();
    let id = outbox
        .publish_bytes(
            &mut prepared.on(&mut tx),
            "b",
            RAW_BYTES,
            "application/x-protobuf",
        )
        .unwrap();
    let json = outbox.publish(&mut tx, "b", &json!({"n": 1})).unwrap();
    tx.commit().unwrap();
    let sender = MemorySender::new();
    let refused = Arc::new(AtomicUsize::new(0));
    let r = refused.clone();
    sender.fail_when(move |e| {
        (e.content_type.is_some() && r.fetch_add(1, Ordering::SeqCst) == 0)
            .then(|| "refused once".to_string())
    });
    let relay = Relay::start(store, &config, sender.clone()).unwrap();
    wait_until("both sent", Duration::from_secs(20), || {
        sender.sent().iter().any(|e| e.id == id) && sender.sent().iter().any(|e| e.id == json)
    });
    relay.shutdown(Duration::from_secs(5)).unwrap();
    assert_eq!(refused.load(Ordering::SeqCst), 2, "refused once, then sent");
    let sent = sender.sent();
    let bytes = sent.iter().find(|e| e.id == id).unwrap();
    assert_eq!(
        (
            bytes.payload.as_slice(),
            bytes.content_type.as_deref(),
            bytes.attempts
        ),
        (RAW_BYTES, Some("application/x-protobuf"), 1)
    );
    let j = sent.iter().find(|e| e.id == json).unwrap();
    assert_eq!(
        (j.payload_str(), j.content_type.as_deref()),
        (Some(r#"{"n":1}"#), None)
    );
}

/// A held, deleting claim writes back what was not acked: a row whose headers
/// are no JSON object (written by hand) fails alone and at once, FAILED after
/// one attempt though retries are left, never sent; the rest are sent.
#[test]
fn a_row_with_unreadable_headers_fails_alone_through_a_held_write_back() {
    let p = "t_rel_hdrheld_";
    let Some((store, mut client)) = fresh(p) else {
        return;
    };
    let config = Config::builder()
        .table_prefix(p)
        .maintenance(|m| m.processed_ttl(Duration::ZERO))
        .event("x", |e| {
            fast(e)
                .claim(ClaimMode::Lock)
                .max_retries(3)
                .backoff_delay(ms(1))
        })
        .build()
        .unwrap();
    let outbox = Outbox::new(&config).unwrap();
    let mut tx = client.transaction().unwrap();
    let ids: Vec<EventId> = (0..3)
        .map(|i| outbox.publish(&mut tx, "x", &i).unwrap())
        .collect();
    tx.commit().unwrap();
    client
        .execute(
            &format!("UPDATE {p}outbox_events SET headers = '\"text\"' WHERE id = $1"),
            &[&ids[1].as_uuid()],
        )
        .unwrap();
    let mut sender = MemorySender::new();
    let mut sent = HashSet::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let report = Relay::deliver_pending(&*store, &config, &mut sender).unwrap();
        sent.extend(sender.sent().iter().map(|e| e.id));
        let failed = report.by_type.get("x").map_or(0, |t| t.failed);
        if failed == 1 || std::time::Instant::now() > deadline {
            break;
        }
        std::thread::sleep(ms(5)); // the retry's backoff
    }
    assert_eq!(
        sent,
        HashSet::from([ids[0], ids[2]]),
        "the bad one never sent"
    );
    let row = client
        .query_one(
            &format!("SELECT status, attempts, last_error FROM {p}outbox_events WHERE id = $1"),
            &[&ids[1].as_uuid()],
        )
        .unwrap();
    let (status, attempts, error): (String, i32, String) = (row.get(0), row.get(1), row.get(2));
    assert_eq!((status.as_str(), attempts), ("FAILED", 1), "{error}");
    assert!(error.contains("no JSON object"), "{error}");
}
