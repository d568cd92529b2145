//! Per-key ordering: one event per key in order, the key walk, four ordered
//! relays, a poison event.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::backend::{Backend, Fixture};
use crate::common::wait_until;
use txbox::store::{ClaimArgs, Outcome};
use txbox::{Config, Dlq, EventId, MemorySender, Relay};
use uuid::Uuid;

use super::{four_relays_turn, ms};

/// `n` events of type `event_type` for each key of `keys` (payload: the key and
/// its sequence number), published round-robin over the keys so the keys'
/// events interleave by id.
pub(super) fn keyed(event_type: &str, keys: &[&str], n: usize) -> Vec<txbox::NewEvent> {
    (0..n)
        .flat_map(|i| {
            keys.iter().map(move |k| {
                let e = txbox::NewEvent::new(event_type, &serde_json::json!([k, i])).unwrap();
                if k.is_empty() {
                    e
                } else {
                    e.key(*k)
                }
            })
        })
        .collect()
}

/// An ordered claim whose oldest waiting events all wait for keys in process
/// walks the keys in order from the cursor it is given, past the busy ones, to
/// the heads of the keys behind them; from the first key when given none.
pub(super) fn ordered_claims_walk_the_keys_from_a_cursor(b: Backend, p: &str) {
    if !b.walks_keys() {
        eprintln!("SKIPPED: {b:?}'s ordered claims read due events in id order (no key walk)");
        return;
    }
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.ordering(txbox::EventOrder::Key))
        .build()
        .unwrap();
    let names: Vec<String> = (0..10).map(|k| format!("a{k}")).collect();
    let front: Vec<&str> = names.iter().map(String::as_str).collect();
    // ten keys with ten events each first (ids by round: a0 .. a9), then one
    // event each of thirty keys k00 .. k29
    let deep = fx.publish_events(&c, keyed("e", &front, 10));
    let names: Vec<String> = (0..30).map(|k| format!("k{k:02}")).collect();
    let keys: Vec<&str> = names.iter().map(String::as_str).collect();
    let k = fx.publish_events(&c, keyed("e", &keys, 1));
    let claim = |from_key: Option<&str>| -> (Uuid, Vec<EventId>) {
        let args = ClaimArgs::new("e", 10, Duration::from_secs(60))
            .ordered(txbox::OnPoison::Block)
            .from_key(from_key);
        let token = Uuid::now_v7();
        let got = fx.store.claim_after(&args, token).unwrap();
        (token, got.iter().map(|e| e.id).collect())
    };
    let (t, heads) = claim(None);
    assert_eq!(
        heads,
        deep[..10],
        "the oldest events: the ten a-keys' heads"
    );
    // the oldest waiting events are now the a-keys' next ones, all held back
    assert_eq!(claim(None).1, k[..10], "past the ten busy keys: k00 .. k09");
    assert_eq!(
        claim(Some("k25")).1,
        k[25..],
        "from the cursor to the last key"
    );
    assert_eq!(claim(Some("k25")).1, vec![], "k25 .. k29 are busy");
    assert_eq!(claim(None).1, k[10..20]);
    assert_eq!(claim(None).1, k[20..25]);
    assert_eq!(claim(None).1, vec![], "every key busy");
    // the a-keys' heads sent: their next events are the oldest, and go first
    let sent: Vec<(EventId, Outcome)> = heads.iter().map(|id| (*id, Outcome::Sent)).collect();
    fx.store.finish(t, &sent).unwrap();
    assert_eq!(claim(Some("k25")).1, deep[10..20]);
}

/// An ordered type's claim takes the first waiting event of each key (and every
/// event without a key): a key's next event only once the one before it is
/// sent; a retry keeps its place; a failed event holds its key back with
/// `block` (listed by `blocked_keys`, released by resolving its dead letter)
/// and not with `skip`.
pub(super) fn ordered_claims_take_one_event_per_key_in_order(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| e.ordering(txbox::EventOrder::Key))
        .event("s", |e| {
            e.ordering(txbox::EventOrder::Key)
                .on_poison(txbox::OnPoison::Skip)
        })
        .build()
        .unwrap();
    let lease = Duration::from_secs(60);
    let claim = |t: &str, policy: txbox::OnPoison| -> (Uuid, Vec<EventId>) {
        let token = Uuid::now_v7();
        let args = ClaimArgs::new(t, 100, lease).ordered(policy);
        let got = fx.store.claim_after(&args, token).unwrap();
        (token, got.iter().map(|e| e.id).collect())
    };
    let block = txbox::OnPoison::Block;
    // ids by round: a0 b0 -0, a1 b1 -1, a2 b2 -2 (`-`: no key)
    let ids = fx.publish_events(&c, keyed("e", &["a", "b", ""], 3));
    let at = |key: usize, i: usize| ids[i * 3 + key];
    let (t1, first) = claim("e", block);
    assert_eq!(
        first,
        vec![at(0, 0), at(1, 0), at(2, 0), at(2, 1), at(2, 2)],
        "each key's first event and every event without a key"
    );
    assert_eq!(claim("e", block).1, vec![], "the keys' next events wait");
    // a0 sent, b0 to be retried: a1 is next; b0 keeps its place before b1
    let retry = Outcome::Retry {
        delay: Duration::ZERO,
        error: "x".into(),
    };
    let sent: Vec<(EventId, Outcome)> = [at(0, 0), at(2, 0), at(2, 1), at(2, 2)]
        .into_iter()
        .map(|id| (id, Outcome::Sent))
        .chain([(at(1, 0), retry)])
        .collect();
    assert_eq!(fx.store.finish(t1, &sent).unwrap(), 5);
    let (t2, second) = claim("e", block);
    assert_eq!(second, vec![at(1, 0), at(0, 1)], "b0 again, before b1; a1");
    // b0 used up its retries: with `block` b1 waits, in the outbox and as a
    // dead letter, until the dead letter is resolved
    let failed = Outcome::Failed {
        error: "poison".into(),
    };
    fx.store
        .finish(t2, &[(at(0, 1), Outcome::Sent), (at(1, 0), failed.clone())])
        .unwrap();
    assert_eq!(
        claim("e", block).1,
        vec![at(0, 2)],
        "b1 waits behind FAILED b0"
    );
    let dlq = Dlq::new(fx.store.clone());
    let blocked = dlq.blocked_keys(&c).unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(
        (
            blocked[0].key.as_str(),
            blocked[0].blocked_by,
            blocked[0].status.as_str(),
            blocked[0].waiting
        ),
        ("b", at(1, 0), "FAILED", 2)
    );
    assert_eq!(fx.store.move_failed_to_dlq(10).unwrap(), 1);
    assert_eq!(claim("e", block).1, vec![], "b1 waits behind dead b0");
    assert_eq!(dlq.blocked_keys(&c).unwrap()[0].status, "DEAD");
    dlq.resolve(at(1, 0)).unwrap();
    assert!(dlq.blocked_keys(&c).unwrap().is_empty());
    assert_eq!(claim("e", block).1, vec![at(1, 1)], "resolved: b goes on");

    // `skip`: the key goes on past its failed event
    let skip = txbox::OnPoison::Skip;
    let ids = fx.publish_events(&c, keyed("s", &["k"], 2));
    let (t, got) = claim("s", skip);
    assert_eq!(got, vec![ids[0]]);
    fx.store.finish(t, &[(ids[0], failed)]).unwrap();
    assert_eq!(claim("s", skip).1, vec![ids[1]], "skip: k goes on");
    assert!(
        dlq.blocked_keys(&c).unwrap().is_empty(),
        "a skipping type blocks no key"
    );

    // keys are compared byte for byte (MySQL's default collation would fold
    // case, accents and trailing spaces into one key)
    let ids = fx.publish_events(&c, keyed("s", &["Case", "case", "cáse", "case "], 1));
    assert_eq!(claim("s", skip).1, ids, "four keys, four heads");
}

/// Four relays on one table, 200 keys x 50 events and a sender that fails 5%
/// of the sends once: each key's events reach the sender in publish order (a retry may
/// repeat the key's latest, never go back to an earlier one), none lost.
pub(super) fn four_relays_keep_each_keys_order(b: Backend, p: &str) {
    let _turn = four_relays_turn(b);
    let Some(fx) = Fixture::new(b, p) else { return };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", |e| {
            e.ordering(txbox::EventOrder::Key)
                .adaptive_polling(ms(10), ms(100), 1.5)
                .batch_size(50)
                .max_retries(5)
                .backoff_delay(ms(20))
        })
        .build()
        .unwrap();
    let keys: Vec<String> = (0..200).map(|k| format!("key-{k}")).collect();
    let key_refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    // rounds 0..25 before the relays start, 25..50 while they run (in
    // transactions of 200 events, each key's sequence going on)
    let mut ids = fx.publish_events(&c, keyed("e", &key_refs, 25));
    let sender = MemorySender::new();
    let failed_once = Arc::new(Mutex::new(HashSet::new()));
    sender.fail_when(move |e| {
        let unlucky = e.id.as_uuid().as_u128() % 20 == 0;
        (unlucky && failed_once.lock().unwrap().insert(e.id)).then(|| "refused once".to_string())
    });
    let relays: Vec<Relay> = (0..4)
        .map(|i| {
            let store = if i == 0 {
                fx.store.clone()
            } else {
                fx.another_store()
            };
            Relay::start(store, &c, sender.clone()).unwrap()
        })
        .collect();
    for round in 25..50 {
        let events = key_refs
            .iter()
            .map(|k| {
                txbox::NewEvent::new("e", &serde_json::json!([k, round]))
                    .unwrap()
                    .key(*k)
            })
            .collect();
        ids.extend(fx.publish_events(&c, events));
    }
    wait_until("every event sent", Duration::from_secs(120), || {
        fx.counts("e") == txbox::TypeStatus::default()
    });
    for r in relays {
        r.shutdown(Duration::from_secs(10)).unwrap();
    }
    let mut last: HashMap<String, i64> = HashMap::new();
    let mut seen = HashSet::new();
    for e in sender.sent() {
        let (k, i): (String, i64) = serde_json::from_slice(&e.payload).unwrap();
        let before = last.insert(k.clone(), i).unwrap_or(-1);
        assert!(i >= before, "{k}: event {i} arrived after event {before}");
        assert!(
            i <= before + 1,
            "{k}: event {i} arrived before event {}",
            before + 1
        );
        seen.insert(e.id);
    }
    assert_eq!(seen, ids.into_iter().collect::<HashSet<_>>(), "none lost");
}

/// One key's third event always fails. `block`: the key's later events wait,
/// listed by `blocked_keys`, while every other key drains; resolving the dead
/// letter releases them, in order. `skip`: the key goes on once the retries are
/// used up, and the metric counts the skipped event.
pub(super) fn a_poison_event_blocks_or_is_skipped(b: Backend, p: &str) {
    let Some(fx) = Fixture::new(b, p) else { return };
    // a registry of its own: the exact count of skipped events
    let registry = std::sync::Arc::new(txbox::metrics::Registry::new());
    let ordered = |e: txbox::EventSettings| {
        e.ordering(txbox::EventOrder::Key)
            .fixed_polling(ms(20))
            .max_retries(1)
            .backoff_delay(ms(20))
            .backoff_jitter(0.0)
    };
    let c = Config::builder()
        .table_prefix(p)
        .event("e", ordered)
        .event("s", |e| ordered(e).on_poison(txbox::OnPoison::Skip))
        .dlq(|d| d.enabled(true))
        .dlq(|d| d.move_interval(ms(50)))
        .build()
        .unwrap()
        .observed(registry.clone());
    let keys = ["k0", "k1", "k2", "k3"];
    let block = fx.publish_events(&c, keyed("e", &keys, 10));
    let skip = fx.publish_events(&c, keyed("s", &keys, 10));
    // k1's third event (round 2) of each type
    let (poison, poison_s) = (block[2 * 4 + 1], skip[2 * 4 + 1]);
    let sender = MemorySender::new();
    sender.fail_when(move |e| {
        [poison, poison_s]
            .contains(&e.id)
            .then(|| "poison".to_string())
    });
    let relay = Relay::start(fx.store.clone(), &c, sender.clone()).unwrap();
    let dlq = Dlq::new(fx.store.clone());
    let of = |t: &str, key: &str| -> Vec<i64> {
        sender
            .sent()
            .iter()
            .filter(|e| e.event_type == t)
            .map(|e| serde_json::from_slice::<(String, i64)>(&e.payload).unwrap())
            .filter(|(k, _)| k == key)
            .map(|(_, i)| i)
            .collect()
    };
    let k1_blocked = || {
        dlq.blocked_keys(&c)
            .unwrap()
            .iter()
            .any(|k| k.key == "k1" && k.blocked_by == poison && k.status == "DEAD")
    };
    wait_until(
        "the other keys drained, k1 blocked by its dead letter",
        Duration::from_secs(30),
        || ["k0", "k2", "k3"].iter().all(|k| of("e", k).len() == 10) && k1_blocked(),
    );
    let blocked = dlq.blocked_keys(&c).unwrap();
    assert_eq!(blocked.len(), 1, "{blocked:?}");
    assert_eq!(blocked[0].waiting, 7, "k1's events 3..9 wait");
    assert_eq!(of("e", "k1"), vec![0, 1], "nothing of k1 after the poison");
    // the skipping type went on past its poison
    wait_until(
        "every skip event but the poison",
        Duration::from_secs(30),
        || keys.iter().map(|k| of("s", k).len()).sum::<usize>() == 39,
    );
    assert_eq!(of("s", "k1"), vec![0, 1, 3, 4, 5, 6, 7, 8, 9]);
    // the skip type's poison alone: the block type's waits in the DLQ
    assert_eq!(registry.snapshot().ordered_skipped, 1);
    // resolving the dead letter releases k1, in order
    dlq.resolve(poison).unwrap();
    wait_until("k1 released", Duration::from_secs(30), || {
        of("e", "k1").len() == 9
    });
    relay.shutdown(Duration::from_secs(10)).unwrap();
    assert_eq!(of("e", "k1"), vec![0, 1, 3, 4, 5, 6, 7, 8, 9]);
}
