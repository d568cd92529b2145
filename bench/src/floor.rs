//! Parts `floor`, `ordered` and `plan`: the relay's drain rate beside a hand
//! loop on the store's own SQL, an ordered type's, and the ordered claim's plan.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use txbox::store::ClaimStore;
use txbox::{
    ClaimMode, Config, Event, EventId, EventSettings, MemorySender, Outbox, PgStore, Relay, Sender,
};

use crate::common::*;

/// The relay floor (PostgreSQL -> memory) of an ordered type: 1,000 keys against
/// the same events unordered, in the same run, and 1 key (one event at a time).
pub(crate) fn ordered_floor(s: &Size, out: &mut Vec<Row>) -> Res<()> {
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
pub(crate) fn ordered_plan(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    let p = "bench_plan_";
    let cfg = config(p, EventSettings::default().ordering(txbox::EventOrder::Key));
    let (store, mut c) = fresh(p)?;
    fill_keyed(&mut c, &Outbox::new(&cfg)?, s.plan_rows, 1000)?;
    c.batch_execute(&format!("VACUUM ANALYZE {p}outbox_events"))?;
    let token = uuid::Uuid::now_v7();
    let args = txbox::store::ClaimArgs::new("bench", 200, Duration::from_secs(600))
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
pub(crate) struct HandLoop {
    pub(crate) held: bool,
    pub(crate) delete_acked: bool,
    pub(crate) probe: String,
    pub(crate) claim: String,
    pub(crate) finish: String,
}

impl HandLoop {
    pub(crate) fn new(p: &str, s: &Size) -> Res<HandLoop> {
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
    pub(crate) fn drain(&self, c: &mut postgres::Client, n: usize) -> Res<Duration> {
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
pub(crate) fn relay_floor(s: &Size, analyzed: bool, out: &mut Vec<Row>) -> Res<()> {
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
