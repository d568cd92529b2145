//! Parts `publish` and `batch`: what an event adds to a business transaction.

use std::time::Instant;

use txbox::{EventSettings, Outbox};

use crate::common::*;

pub(crate) fn publish_overhead(s: &Size, out: &mut Vec<Row>) -> Res<()> {
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

pub(crate) fn batch_publish(s: &Size, out: &mut Vec<Row>) -> Res<()> {
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

/// Part `diesel`: what an event adds to a Diesel transaction
/// (`txbox::diesel::transaction`), beside the same transaction without one.
pub(crate) fn diesel_overhead(s: &Size, out: &mut Vec<Row>) -> Res<()> {
    use diesel::{Connection, RunQueryDsl};
    let p = "bench_diesel_";
    let (_store, mut c) = fresh(p)?;
    c.batch_execute(
        "DROP TABLE IF EXISTS bench_diesel_orders; \
         CREATE TABLE bench_diesel_orders (id bigserial PRIMARY KEY, total bigint)",
    )?;
    let outbox = Outbox::new(&config(p, EventSettings::default()))?;
    let mut conn = diesel::PgConnection::establish(&pg_url())?;
    // in turn: without an event, with one
    let mut ms: [Vec<f64>; 2] = Default::default();
    for i in 0..s.txs * 2 {
        let t = Instant::now();
        txbox::diesel::transaction(&mut conn, |tx| {
            diesel::sql_query("INSERT INTO bench_diesel_orders (total) VALUES ($1)")
                .bind::<diesel::sql_types::BigInt, _>(i as i64)
                .execute(tx.conn())?;
            if i % 2 == 1 {
                let payload = serde_json::json!({"order": i, "total": i});
                outbox.publish(tx, "bench", &payload)?;
            }
            Ok::<_, txbox::Error>(())
        })?;
        ms[i % 2].push(t.elapsed().as_secs_f64() * 1000.0);
    }
    let [without, with] = &mut ms;
    out.push(ms_row(
        format!("Diesel: publish overhead, median ({} tx)", s.txs),
        median(with),
        median(without),
        "-",
    ));
    out.push(ms_row(
        "Diesel: publish overhead, p99",
        pct(with, 0.99),
        pct(without, 0.99),
        "-",
    ));
    Ok(())
}
