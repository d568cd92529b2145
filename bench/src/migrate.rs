//! Part `migrate`: the upgrade from every earlier schema version beside a
//! publisher.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use txbox::{Config, Outbox};

use crate::common::*;

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
pub(crate) fn migration_cost(s: &Size, out: &mut Vec<Row>) -> Res<()> {
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
