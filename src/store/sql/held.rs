//! Finishing a batch: the statements of a finish, and a held claim's open
//! transaction.

use crate::metrics::{Observed, StoreCall};
use std::collections::HashMap;

use super::{
    claim_params, claimed_events, missing, ms, stored_payload, Catalog, Finish, HoldClaim, Row,
    ScriptConn, Stmt, Val,
};
use crate::error::{Error, Result};
use crate::event::{Body, Event, EventId};
use crate::store::{ClaimArgs, HeldBatch, HeldClaim, Outcome};
use std::time::Duration;
use uuid::Uuid;

/// One statement of a finish: its template, fixed parameters and ids.
pub(crate) type Step<'a> = (&'a Stmt, Vec<Val>, Vec<Val>);

/// The statements that finish a batch with `sql`: acked rows marked PROCESSED or
/// deleted, in chunks; the others one by one.
pub(crate) fn finish_steps<'a>(
    d: &Catalog,
    sql: &'a Finish,
    token: Uuid,
    outcomes: &[(EventId, Outcome)],
) -> Vec<Step<'a>> {
    let mut steps = Vec::new();
    for (template, want) in [
        (&sql.sent, Outcome::Sent),
        (&sql.delete, Outcome::SentDelete),
    ] {
        let ids: Vec<Val> = outcomes
            .iter()
            .filter(|(_, o)| *o == want)
            .map(|(id, _)| Val::Id(id.as_uuid()))
            .collect();
        for chunk in ids.chunks(d.max_ids) {
            steps.push((template, vec![Val::Id(token)], chunk.to_vec()));
        }
    }
    for (id, outcome) in outcomes {
        let Some((status, delay, error, counted)) = failure(outcome) else {
            continue;
        };
        let fixed = vec![
            status.into(),
            ms(delay),
            error.into(),
            Val::Id(id.as_uuid()),
            Val::Id(token),
            Val::Int(i64::from(counted)),
        ];
        steps.push((&sql.failed, fixed, Vec::new()));
    }
    steps
}

/// What a failed send writes: the status, the delay before the next attempt, the
/// error and whether it counts an attempt; none for an acked event.
pub(crate) fn failure(outcome: &Outcome) -> Option<(&'static str, Duration, &str, bool)> {
    match outcome {
        Outcome::Retry { delay, error } => Some(("PENDING", *delay, error, true)),
        Outcome::Failed { error } => Some(("FAILED", Duration::ZERO, error, true)),
        Outcome::Release { error } => Some(("PENDING", Duration::ZERO, error, false)),
        Outcome::Sent | Outcome::SentDelete => None,
    }
}

/// A held claim: the connection whose open transaction locks the batch's rows.
pub(crate) struct HeldTx {
    pub(crate) conn: Box<dyn ScriptConn + Send>,
    pub(crate) d: std::sync::Arc<Catalog>,
    /// The store's observer, told how long the finish took.
    pub(crate) observer: Observed,
    /// The transaction is open (rolled back on drop).
    pub(crate) open: bool,
    /// What a deleting claim ([`HoldClaim::claim_delete`]) keeps of its rows to
    /// write back those the broker did not ack; none when the claim only locked.
    pub(crate) deleted: Option<Vec<Deleted>>,
}

/// A row of a deleting claim, beyond its [`Event`]: its headers as stored, its
/// creation time and its place in the insert order.
pub(crate) struct Deleted {
    pub(crate) id: EventId,
    pub(crate) headers: String,
    pub(crate) created_at: String,
    pub(crate) seq: Option<i64>,
}

impl HeldTx {
    /// The dialect's held-claim statements (a held claim exists only on a dialect
    /// that has them).
    pub(crate) fn hold(&self) -> Result<&HoldClaim> {
        self.d
            .hold_claim
            .as_ref()
            .ok_or_else(crate::store::cannot_hold_claims)
    }

    /// The statements that finish the batch, the commit last. The rows are locked
    /// by this transaction, so no token is needed to fence.
    pub(crate) fn finish_script(
        &self,
        events: &[Event],
        outcomes: &[(EventId, Outcome)],
    ) -> Result<Vec<String>> {
        let (d, hold) = (&self.d, self.hold()?);
        let steps = match &self.deleted {
            Some(rows) => restore_steps(&hold.restore, rows, events, outcomes)?,
            None => finish_steps(d, &d.common.finish_held, Uuid::nil(), outcomes),
        };
        let mut script: Vec<String> = steps
            .iter()
            .map(|(stmt, fixed, ids)| stmt.inline(fixed, ids, hold.literal))
            .collect::<Result<_>>()?;
        script.push("COMMIT".into());
        Ok(script)
    }

    /// How many rows the finish changed, given its statements' counts.
    pub(crate) fn finished(&self, counts: &[u64], outcomes: usize) -> u64 {
        match self.deleted {
            // every row was deleted by the claim; those not acked are back
            Some(_) => outcomes as u64,
            None => counts.iter().sum(),
        }
    }

    /// The script that opens the transaction, with its idle timeout, and claims.
    pub(crate) fn claim_script(&self, next: &ClaimArgs<'_>) -> Result<String> {
        let hold = self.hold()?;
        let after = Val::Id(next.after.map_or(Uuid::nil(), |id| id.as_uuid()));
        let params = claim_params(
            next,
            vec![next.event_type.into(), after, Val::Int(next.limit as i64)],
        );
        let claim = if next.delete_acked {
            &hold.claim_delete
        } else {
            &self.d.claim_select
        };
        Ok(format!(
            "{}; {}",
            hold.open
                .replace("{ms}", &next.lease.as_millis().to_string()),
            claim
                .claim(&self.d.common, next)
                .inline(&params, &[], hold.literal)?
        ))
    }

    /// The claim's `rows` as a batch held by this open transaction; with none, the
    /// transaction is committed and there is no batch.
    pub(crate) fn take_claim(
        mut self: Box<Self>,
        mut rows: Vec<Row>,
        delete_acked: bool,
    ) -> Result<HeldClaim> {
        if rows.is_empty() {
            self.conn.batch("COMMIT")?;
            self.open = false;
            return Ok(HeldClaim::none());
        }
        let events = claimed_events(&mut rows)?;
        // what a write-back needs beyond the events: the stored headers and the
        // creation time (the rows' other text moved into the events)
        self.deleted = if delete_acked {
            let deleted = rows.into_iter().map(|mut r| {
                Ok(Deleted {
                    id: r.get::<EventId>(0)?,
                    headers: r.take_text(3)?.ok_or_else(|| missing(3))?,
                    created_at: r.take_text(8)?.ok_or_else(|| missing(8))?,
                    // none while schema 7 still numbers the events there
                    seq: r.get::<Option<i64>>(9)?,
                })
            });
            Some(deleted.collect::<Result<Vec<_>>>()?)
        } else {
            None
        };
        Ok(HeldClaim::new(events, Some(self)))
    }
}

impl HeldBatch for HeldTx {
    fn finish(
        mut self: Box<Self>,
        events: &[Event],
        outcomes: &[(EventId, Outcome)],
    ) -> Result<u64> {
        let observer = self.observer.clone();
        observer.timed(StoreCall::Finish, move || {
            // the statements and the commit go in one round trip
            let script = self.finish_script(events, outcomes)?;
            let done = self.conn.script(&script.join("; "))?;
            self.open = false;
            Ok(self.finished(&done.counts, outcomes.len()))
        })
    }

    fn finish_and_claim(
        mut self: Box<Self>,
        events: &[Event],
        outcomes: &[(EventId, Outcome)],
        next: &ClaimArgs<'_>,
    ) -> Result<(u64, Option<HeldClaim>)> {
        let observer = self.observer.clone();
        observer.timed(StoreCall::Finish, move || {
            // the finish, its commit, the next transaction and its claim: one
            // round trip; should any statement fail, the drop rolls back what
            // is open
            let mut script = self.finish_script(events, outcomes)?;
            let statements = script.len() - 1;
            script.push(self.claim_script(next)?);
            let done = self.conn.script(&script.join("; "))?;
            let counts = &done.counts[..statements.min(done.counts.len())];
            let finished = self.finished(counts, outcomes.len());
            Ok((
                finished,
                Some(self.take_claim(done.rows, next.delete_acked)?),
            ))
        })
    }
}

/// The statements that write back the events of a deleting claim (its `events`,
/// and what it kept of their rows) that the broker did not ack: one
/// [`HoldClaim::restore`] each.
pub(crate) fn restore_steps<'a>(
    restore: &'a Stmt,
    rows: &[Deleted],
    events: &[Event],
    outcomes: &[(EventId, Outcome)],
) -> Result<Vec<Step<'a>>> {
    let mut steps = Vec::new();
    // indexed on the first failure: a broker outage fails the whole batch
    type Index<'r> = (HashMap<EventId, &'r Deleted>, HashMap<EventId, &'r Event>);
    let mut index: Option<Index> = None;
    for (id, outcome) in outcomes {
        let Some((status, delay, error, counted)) = failure(outcome) else {
            continue;
        };
        let (by_row, by_event) = index.get_or_insert_with(|| {
            (
                rows.iter().map(|r| (r.id, r)).collect(),
                events.iter().map(|e| (e.id, e)).collect(),
            )
        });
        let (Some(row), Some(e)) = (by_row.get(id), by_event.get(id)) else {
            return Err(Error::Misuse(format!(
                "an outcome for event {id}, which is not in the held batch"
            )));
        };
        let [text, bytes, content_type] = stored_payload(&published(e));
        let fixed = vec![
            status.into(),
            ms(delay),
            error.into(),
            Val::Id(id.as_uuid()),
            e.event_type.as_str().into(),
            e.key.as_deref().into(),
            row.headers.as_str().into(),
            text,
            Val::Int(i64::from(e.attempts) + i64::from(counted)),
            row.created_at.as_str().into(),
            bytes,
            content_type,
            row.seq.map_or(Val::Null, Val::Int),
        ];
        steps.push((restore, fixed, Vec::new()));
    }
    Ok(steps)
}

/// A claimed event's payload as it was published (to write it back as publish
/// wrote it).
fn published(e: &Event) -> Body {
    match &e.content_type {
        None => Body::Json(String::from_utf8_lossy(&e.payload).into_owned()),
        Some(content_type) => Body::Bytes {
            bytes: e.payload.clone(),
            content_type: content_type.clone(),
        },
    }
}

impl Drop for HeldTx {
    fn drop(&mut self) {
        if self.open {
            if let Err(e) = self.conn.batch("ROLLBACK") {
                log::debug!("txbox: rolling back a held claim failed: {e}");
            }
        }
    }
}
