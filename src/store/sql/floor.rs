//! Claims from a floor (PostgreSQL, schema 10): an unordered type's claim
//! reads only the pending index's entries above the highest insert number
//! below which every event is known to be settled, so a long transaction
//! that keeps VACUUM from removing the dead entries below does not make
//! every claim walk them (issue 45; `sql/postgres/010_flat_claims.sql`).
//!
//! The floor is a fact about the table, not about one relay, so the store
//! keeps it, per event type, for every caller of its claims:
//!
//! - A *tick* reads the insert sequence's last number `M`, then takes a
//!   transaction id `X` of its own. Every transaction that took a number up
//!   to `M` had its id before that (the default `txbox_next_seq()` takes the
//!   id first), so its id is below `X`. Once a later tick's snapshot has no
//!   transaction older than `X` running, every event numbered up to `M` is
//!   committed (and seen by any later statement) or rolled back: `M` is
//!   *settled*.
//! - A claim that read everything due above the floor (it came back short of
//!   its limit) raises the floor to the settled mark; a full one raises it to
//!   the last number it took at most. What waits below the floor (a delayed
//!   event, a retry, a released or recovered event, a dead letter sent back)
//!   has a due time after its insert and so an entry in the index of those,
//!   which every claim reads beside.
//! - What a claim skipped because another held it locked, and that one then
//!   gave back by rolling back (a lost connection), is below the floor with no
//!   such entry: stuck recovery ([`SqlStore::sweep_below_floors`], once a
//!   recovery interval, on its own thread) makes such events due again, which
//!   puts them in that index. Its scan is the one cost that still grows with
//!   the dead entries below the floor; on the poller's thread (a claim from
//!   the lowest number every 30 s) it held the claims back for 0.4 s at a
//!   time after 10 minutes at 1,000 events/s under a held snapshot.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uuid::Uuid;

use super::{ms, run_query, Conn, Dialect, Row, SqlStore, Stmt, Val};
use crate::error::Result;
use crate::store::ClaimArgs;

/// A claim ticks when the type's last tick is older than this: the claims
/// between use the mark settled so far (still true, a little behind). A
/// tick is a round trip; at every claim it added 0.5 ms to a trickle's
/// pick-up.
const TICK_EVERY: Duration = Duration::from_millis(50);
/// Ticks kept while none settles (a writing transaction stays open): any
/// subset of them stays sound, only coarser.
const TICKS_KEPT: usize = 64;

/// The statements of claims from a floor.
pub struct FloorSql {
    /// The schema version that gives them what they need (the number's
    /// default, the indexes); an older schema claims as 0.3 did.
    pub since: i64,
    /// -> anything, the insert mark (read after the statement's snapshot),
    /// the snapshot's oldest running transaction id, the statement's own
    /// transaction id (taken after the mark was read).
    pub tick: Stmt,
    /// $1 type, $2 limit, $3 token, $4 lease ms, $5 floor -> the claimed rows
    /// (the columns of every claim, then their `seq`, then 0): the events due
    /// that wait below the floor, then those above it in insert order; and
    /// last one row with no id whose last column is 1 when the type was
    /// paused on the claim's snapshot (else 0).
    pub claim: super::Ordered,
    /// $1 type, $2 floor -> the milliseconds until the type's next event is
    /// due, as [`super::Catalog::next_due`], from the index of those waiting
    /// and the events above the floor.
    pub next_due: Stmt,
    /// $1 type, $2 floor, $3 limit: makes the pending events due at their
    /// insert numbered up to the floor due now (after their insert), so the
    /// claims read them among those that wait -> how many.
    pub sweep: Stmt,
}

/// One tick: see the module's docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Tick {
    /// The insert sequence's last number, read after the snapshot.
    mark: i64,
    /// The snapshot's oldest running transaction id.
    xmin: i64,
    /// The tick's own transaction id, taken after the mark was read.
    xid: i64,
}

/// A type's floor and the ticks not settled yet.
#[derive(Debug, Default)]
pub(crate) struct Floor {
    /// Every event numbered up to this is sent, claimed, or waits with a due
    /// time after its insert (or was given back unclaimed: see the module's
    /// docs); `None`: not known yet (claims scan from the lowest number).
    floor: Option<i64>,
    /// The highest settled mark.
    settled: Option<i64>,
    ticks: VecDeque<Tick>,
    /// While a backlog drains (the last claim was full): the last number it
    /// took, where the next claim starts, with no tick. Such a claim raises
    /// no floor (what it skipped below its start is read again from the
    /// floor once a claim comes back short).
    resume: Option<i64>,
    /// When the last tick was taken.
    ticked: Option<Instant>,
}

impl Floor {
    /// Takes a tick in, settling what it settles. A sequence or a transaction
    /// id that went back (a restore, a failover to a replica behind, a
    /// sequence restarted) forgets all that was known: claims read from the
    /// lowest number until the floor is known again.
    fn tick(&mut self, t: Tick) {
        let back = self
            .ticks
            .back()
            .is_some_and(|last| t.xid < last.xid || t.mark < last.mark)
            || self.settled.is_some_and(|s| t.mark < s);
        if back {
            *self = Floor::default();
        }
        // a mark is settled once a later tick sees no transaction older than
        // the id taken after it was read
        while self.ticks.front().is_some_and(|first| t.xmin >= first.xid) {
            if let Some(done) = self.ticks.pop_front() {
                self.settled = Some(self.settled.map_or(done.mark, |s| s.max(done.mark)));
            }
        }
        self.ticks.push_back(t);
        if self.ticks.len() > TICKS_KEPT {
            self.ticks.remove(1);
        }
    }

    /// Where the next claim starts (`i64::MIN`: the lowest number), and
    /// whether it resumes a backlog (no tick, no floor raised).
    fn start(&self) -> (i64, bool) {
        match self.resume {
            Some(at) => (at, true),
            None => (self.floor.unwrap_or(i64::MIN), false),
        }
    }

    /// After a claim from `from` that took events numbered `taken`, at most
    /// `limit` of them, bounded by `upto`: raises the floor as far as that
    /// claim read everything due.
    /// `resumed`: it resumed a backlog ([`Floor::start`]); `settled` is the
    /// settled mark when the claim began: one settled by a later tick may
    /// cover commits the claim's snapshot did not see.
    fn claimed(
        &mut self,
        from: i64,
        resumed: bool,
        settled: Option<i64>,
        taken: &[i64],
        limit: usize,
        upto: Option<i64>,
    ) {
        let complete = taken.len() < limit;
        // the claim read every due event numbered in (from, read_to]
        let read_to = if complete {
            Some(upto.unwrap_or(i64::MAX))
        } else {
            taken.iter().copied().filter(|s| *s > from).max()
        };
        self.resume = match read_to {
            _ if complete => None,
            Some(to) => Some(to),
            None => Some(from), // waiting events alone filled it
        };
        if resumed {
            return;
        }
        let (Some(settled), Some(to)) = (settled, read_to) else {
            return;
        };
        // what is known below the floor and what this claim read join up
        let joins = match self.floor {
            None => from == i64::MIN,
            Some(f) => from <= f,
        };
        let to = settled.min(to);
        if joins && self.floor.is_none_or(|f| to > f) {
            self.floor = Some(to);
        }
    }
}

/// The floors of a store, by event type (each type's behind a lock of its
/// own: a tick of one type that waits on the database holds no other back),
/// and whether the schema has what they need.
#[derive(Debug, Default)]
pub(crate) struct Floors {
    types: Mutex<HashMap<String, Arc<Mutex<Floor>>>>,
    /// The schema is at version 10 or later: once it is, it stays so.
    schema_ready: AtomicBool,
    /// When the schema was last found older (asked again after
    /// [`SCHEMA_ASKED_EVERY`]).
    schema_asked: Mutex<Option<Instant>>,
}

/// How often a store whose schema is older than the floors asks again.
const SCHEMA_ASKED_EVERY: Duration = Duration::from_secs(30);

impl Floors {
    fn of(&self, event_type: &str) -> Arc<Mutex<Floor>> {
        let mut all = self.types.lock().unwrap_or_else(|p| p.into_inner());
        all.entry(event_type.to_owned()).or_default().clone()
    }

    fn with<R>(&self, event_type: &str, f: impl FnOnce(&mut Floor) -> R) -> R {
        let floor = self.of(event_type);
        let mut floor = floor.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut floor)
    }

    /// The floor of `event_type` as it is (for [`FloorSql::next_due`]).
    pub(crate) fn floor(&self, event_type: &str) -> Option<i64> {
        self.with(event_type, |f| f.floor)
    }

    /// Every type's floor that is known.
    fn all(&self) -> Vec<(String, i64)> {
        let all: Vec<_> = {
            let all = self.types.lock().unwrap_or_else(|p| p.into_inner());
            all.iter().map(|(t, f)| (t.clone(), f.clone())).collect()
        };
        all.into_iter()
            .filter_map(|(t, f)| {
                let floor = f.lock().unwrap_or_else(|p| p.into_inner()).floor?;
                Some((t, floor))
            })
            .collect()
    }

    /// Whether the schema has the floors' default and indexes (version 10):
    /// `ask` reads the version, once until it is, then every
    /// [`SCHEMA_ASKED_EVERY`]. A relay started before `migrate` claims as 0.3
    /// did meanwhile.
    pub(crate) fn schema_ready(&self, ask: impl FnOnce() -> Result<bool>) -> Result<bool> {
        if self.schema_ready.load(Ordering::Relaxed) {
            return Ok(true);
        }
        let mut asked = self.schema_asked.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        if asked.is_some_and(|at| now.duration_since(at) < SCHEMA_ASKED_EVERY) {
            return Ok(false);
        }
        let ready = ask()?;
        *asked = Some(now);
        self.schema_ready.store(ready, Ordering::Relaxed);
        Ok(ready)
    }
}

/// A tick's row: (the session setting it made), mark, xmin, xid.
fn tick_of(row: &Row) -> Result<Tick> {
    Ok(Tick {
        mark: row.get(1)?,
        xmin: row.get(2)?,
        xid: row.get(3)?,
    })
}

impl<D: Dialect> SqlStore<D> {
    /// An unordered claim from the type's floor: a tick, the claim, and the
    /// floor raised as far as the claim read. Returns the claimed rows.
    pub(super) fn claim_floored(
        &self,
        f: &FloorSql,
        args: &ClaimArgs<'_>,
        token: Uuid,
        conn: &mut dyn Conn,
    ) -> Result<Vec<Row>> {
        let d = &self.d;
        let event_type = args.event_type;
        // the ticks of a type are taken one at a time, so each is taken
        // after the one before it
        let (from, resumed, settled) = self.floors.with(event_type, |fl| -> Result<_> {
            let (from, resumed) = fl.start();
            if resumed {
                return Ok((from, true, fl.settled));
            }
            let now = Instant::now();
            // until a mark is settled, at every claim
            if fl.settled.is_none()
                || fl
                    .ticked
                    .is_none_or(|at| now.duration_since(at) >= TICK_EVERY)
            {
                let rows = run_query(conn, d, &f.tick, &[], &[])?;
                fl.tick(tick_of(rows.first().ok_or_else(|| {
                    crate::error::Error::Internal("the floor's tick returned no row".into())
                })?)?);
                fl.ticked = Some(now);
            }
            // `deliver_pending` (bounded by an insert mark) reads from the
            // lowest number: a store of its own has no recovery thread to
            // find what was given back below the floor
            let from = if args.upto.is_some() { i64::MIN } else { from };
            Ok((from, false, fl.settled))
        })?;
        let fixed = [
            Val::Text(event_type.to_owned()),
            Val::Int(args.limit as i64),
            Val::Id(token),
            ms(args.lease),
            Val::Int(from),
        ];
        let mut rows = run_query(conn, d, &f.claim.claim(&d.common, args), &fixed, &[])?;
        // the last row says whether the type was paused
        let paused = match rows.pop() {
            Some(last) if matches!(last.val(0), Val::Null) => last.get::<i64>(9)? != 0,
            _ => {
                return Err(crate::error::Error::Internal(
                    "the floor's claim returned no row of its pause".into(),
                ))
            }
        };
        let seq_at = 8;
        let taken = rows
            .iter()
            .map(|r| r.get::<i64>(seq_at))
            .collect::<Result<Vec<_>>>()?;
        if !paused {
            self.floors.with(event_type, |fl| {
                fl.claimed(from, resumed, settled, &taken, args.limit, args.upto)
            });
        }
        Ok(rows)
    }

    /// Stuck recovery's part of the floors: the events due at their insert
    /// that wait below a floor (claimed by another and given back unchanged)
    /// made due now, at most `limit` per type, so the claims find them among
    /// those that wait. Returns how many.
    pub(crate) fn sweep_below_floors(&self, limit: usize) -> Result<u64> {
        let Some(f) = &self.d.floors else {
            return Ok(0);
        };
        let mut swept = 0;
        for (event_type, floor) in self.floors.all() {
            let params = [
                Val::Text(event_type.clone()),
                Val::Int(floor),
                Val::Int(limit as i64),
            ];
            let n = self.with_retry("recovery below the floor", || {
                let mut conn = self.pool.get()?;
                super::run_execute(&mut *conn, &self.d, &f.sweep, &params, &[])
            })?;
            if n > 0 {
                log::warn!(
                    "txbox: {n} events of type {event_type} were given back unclaimed below \
                     the claims' floor (a claim that did not commit): due again"
                );
            }
            swept += n;
        }
        Ok(swept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(mark: i64, xmin: i64, xid: i64) -> Tick {
        Tick { mark, xmin, xid }
    }

    #[test]
    fn a_mark_settles_once_no_transaction_older_than_its_ticks_id_runs() {
        let mut f = Floor::default();
        f.tick(t(10, 100, 105));
        assert_eq!(f.settled, None, "no later tick yet");
        // transactions that took numbers up to 10 are older than 105
        f.tick(t(20, 101, 107));
        assert_eq!(f.settled, None, "101..104 may still run");
        f.tick(t(30, 105, 110));
        assert_eq!(f.settled, Some(10), "nothing older than 105 runs");
        f.tick(t(31, 111, 112));
        assert_eq!(f.settled, Some(30), "nor older than 110");
        assert_eq!(f.ticks.len(), 1);
    }

    /// A type that has its floor at `floor`, settled up to `settled`.
    fn at(floor: Option<i64>, settled: i64) -> Floor {
        let mut f = Floor::default();
        f.tick(t(settled, 1, 1));
        f.tick(t(settled + 1000, 1, 2));
        assert_eq!(f.settled, Some(settled));
        f.floor = floor;
        f
    }

    #[test]
    fn the_floor_rises_only_as_far_as_a_claim_read() {
        let mut f = Floor::default();
        assert_eq!(f.start(), (i64::MIN, false), "from the lowest number first");
        f.claimed(i64::MIN, f.start().1, f.settled, &[], 10, None);
        assert_eq!(f.floor, None, "nothing settled: no floor");
        assert_eq!(f.start(), (i64::MIN, false), "nor a floor to start from");
        let mut f = at(None, 50);
        // short of the limit: everything up to the settled mark was read
        f.claimed(i64::MIN, f.start().1, f.settled, &[3, 4], 10, None);
        assert_eq!(f.floor, Some(50));
        assert_eq!(f.start(), (50, false));
        let mut f = at(Some(50), 60);
        // a full claim: read up to the last number it took above the floor
        // (7 is a retry from below it); the next resumes there
        f.claimed(50, f.start().1, f.settled, &[7, 55, 58], 3, None);
        assert_eq!(f.floor, Some(58));
        assert_eq!(f.start(), (58, true));
        // a resumed claim raises no floor, and a full one of waiting events
        // alone resumes where it began
        f.claimed(58, f.start().1, f.settled, &[1, 2, 3], 3, None);
        assert_eq!((f.floor, f.start()), (Some(58), (58, true)));
        f.claimed(58, f.start().1, f.settled, &[70, 71, 72], 3, None);
        assert_eq!((f.floor, f.start()), (Some(58), (72, true)));
        // short: the backlog is drained, the next claim is from the floor
        f.claimed(72, f.start().1, f.settled, &[73], 10, None);
        assert_eq!((f.floor, f.start()), (Some(58), (58, false)));
        // bounded by an insert mark: read up to it
        f.claimed(58, f.start().1, f.settled, &[59], 10, Some(59));
        assert_eq!(f.floor, Some(59));
        f.claimed(59, f.start().1, f.settled, &[], 10, None);
        assert_eq!(f.floor, Some(60), "the settled mark bounds it");
        // a claim from a higher number than the floor tells nothing below it
        let mut f = at(None, 60);
        f.claimed(40, f.start().1, f.settled, &[], 10, None);
        assert_eq!(f.floor, None);
    }

    #[test]
    fn a_claim_raises_the_floor_to_the_mark_settled_when_it_began() {
        let mut f = at(Some(10), 50);
        let when_it_began = f.settled;
        // another caller's tick, after this claim's snapshot, settles more
        f.tick(t(1100, 5000, 5001));
        assert_eq!(f.settled, Some(1050));
        f.claimed(10, false, when_it_began, &[], 10, None);
        assert_eq!(f.floor, Some(50));
    }

    #[test]
    fn a_sequence_or_an_id_that_went_back_forgets_the_floor() {
        let mut f = at(Some(40), 50);
        f.tick(t(5, 1, 3));
        assert_eq!((f.floor, f.settled), (None, None), "the sequence restarted");
        let mut f = at(Some(40), 50);
        f.tick(t(2000, 1, 0));
        assert_eq!((f.floor, f.settled), (None, None), "ids from before");
        assert_eq!(f.start(), (i64::MIN, false));
    }

    #[test]
    fn ticks_kept_stay_bounded_while_none_settles() {
        let mut f = Floor::default();
        for i in 0..1000 {
            f.tick(t(i, 5, 10 + i));
        }
        assert_eq!(f.ticks.len(), TICKS_KEPT);
        assert_eq!(f.settled, None);
        // the long transaction ends: every tick kept settles
        f.tick(t(2000, 2000, 2001));
        assert_eq!(f.settled, Some(999));
    }
}
