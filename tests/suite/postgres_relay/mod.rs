//! The relay against a real PostgreSQL, with the in-memory sender standing in for
//! the broker (the relay's logic is under test here, not a broker), a module per
//! subject.

use crate::common::ms;

use txbox::EventSettings;

pub(super) fn fast(e: EventSettings) -> EventSettings {
    e.adaptive_polling(ms(10), ms(100), 1.5)
}

mod compact;
mod config;
mod connections;
mod delivery;
mod errors;
pub(super) mod held;
mod snapshot;
mod wake;

/// Waits until every transaction of the cluster (another session's) that
/// began before now and holds a transaction id or a snapshot has ended: what
/// keeps a floor from rising past a number, or VACUUM and a rewrite from
/// dropping a row deleted before now (other tests' writers and held
/// snapshots). A deadline of 60 s.
pub(super) fn older_transactions_ended(c: &mut postgres::Client) {
    let now: String = c
        .query_one("SELECT clock_timestamp()::text", &[])
        .unwrap()
        .get(0);
    crate::common::wait_until(
        "the transactions then running ended",
        std::time::Duration::from_secs(60),
        || {
            c.query_one(
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE (backend_xid IS NOT NULL OR backend_xmin IS NOT NULL) \
                   AND pid <> pg_backend_pid() AND xact_start < $1::text::timestamptz",
                &[&now],
            )
            .unwrap()
            .get::<_, i64>(0)
                == 0
        },
    );
}
