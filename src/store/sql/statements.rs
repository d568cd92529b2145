//! The statement catalog: what a dialect supplies, and the statements every
//! dialect writes alike.

use super::{ago, Ordered, Stmt, Style, Val};
use crate::error::Error;
use crate::store::{ClaimArgs, Tables};
use std::time::Duration;

/// The statements that finish a claimed batch, each kept to the rows the claim
/// still holds by a `fence` condition.
pub struct Finish {
    /// $1 token, {ids}
    pub sent: Stmt,
    /// $1 token, {ids}
    pub delete: Stmt,
    /// $1 status, $2 delay ms, $3 error, $4 id, $5 token, $6 attempts to add (0 or 1)
    pub failed: Stmt,
}

impl Finish {
    /// `ids` picks the rows of the statements with an id list, `fence` keeps them
    /// to the claim's, `fence_one` does for the one-row statement (whose token is
    /// `$5`).
    pub(crate) fn new(
        o: &str,
        now: &str,
        plus: fn(&str) -> String,
        ids: &str,
        fence: &str,
        fence_one: &str,
    ) -> Finish {
        Finish {
            sent: format!(
                "UPDATE {o} SET status = 'PROCESSED', processed_at = {now}, claim_token = NULL, lease_until = NULL \
                 WHERE {fence} AND {ids}"
            ).into(),
            delete: format!("DELETE FROM {o} WHERE {fence} AND {ids}").into(),
            failed: format!(
                "UPDATE {o} SET status = $1, attempts = attempts + $6, \
                   next_attempt_at = CASE WHEN $1 = 'PENDING' THEN {} ELSE next_attempt_at END, \
                   last_error = $3, claim_token = NULL, lease_until = NULL \
                 WHERE id = $4 AND {fence_one}",
                plus("$2")
            ).into(),
        }
    }
}

/// The statements every dialect writes alike but for its clock: `now` is its
/// "current time" expression and `plus("$n")` its "now + $n milliseconds".
pub struct Common {
    /// $1 token, $2 lease ms, {ids}
    pub claim_update: Stmt,
    /// Finishing a batch claimed under a lease: fenced by its token.
    pub finish: Finish,
    /// Finishing a batch whose rows the claim's open transaction holds locked
    /// ([`crate::ClaimMode::Lock`]): they are still PENDING.
    pub finish_held: Finish,
    /// {ids}
    pub recover: Stmt,
    /// {ids} the tokens: the rows those claims took, back to PENDING, due
    /// now ([`crate::store::ClaimStore::release_claims`])
    pub release_claims: Stmt,
    pub delete_outbox: Stmt,
    pub delete_dlq: Stmt,
    pub copy_to_dlq: Stmt,
    pub copy_to_outbox: Stmt,
    /// $1 TTL ms, {ids}
    pub delete_inbox: Stmt,
    /// $1 owner, $2 lease ms, $3 name -> affected rows 1 when taken
    pub lock_take: Stmt,
    /// $1 name, $2 owner
    pub unlock: Stmt,
    /// $1 to, {from} literal list, {ids}
    pub dlq_set_status: Stmt,
    /// {from} literal list, {ids}
    pub dlq_delete_status: Stmt,
    /// $1 type, {ids} -> the ids of those rows that pass the claims' `{order}`
    /// (asked again after a locking claim on a dialect without RETURNING)
    pub order_recheck: Ordered,
    /// $1 type -> key, id, status, seq of the dead letters (DEAD, RETRY) and
    /// FAILED outbox events that hold a key of an ordered type back, by key
    /// and insert order
    pub blocked_keys: Stmt,
    /// $1 type, $2 key, $3 seq -> how many events of the key are pending after
    /// that one in insert order
    pub key_waiting: Stmt,
    /// The rule of an ordered type that skips poison events: no earlier event
    /// of the candidate's key pending or in process.
    pub ordered_skip: String,
    /// ... and of one that blocks on them: no earlier event of the key pending,
    /// in process or failed, and no earlier dead letter of it waiting.
    pub ordered_block: String,
    /// Where a claim of an ordered type that skips poison events looks for
    /// candidates (see [`walk`]): `None` when the dialect has no walk, and its
    /// claims read due events in id order.
    pub walk_skip: Option<String>,
    /// ... and of one that blocks on them.
    pub walk_block: Option<String>,
    /// The outbox table, whose `seq` bounds a claim ([`ClaimArgs::upto`]).
    outbox: String,
    /// The condition that keeps a claim of type `$1` from a paused type.
    pub not_paused: String,
    /// $1 type -> affected rows 1 when it was not paused yet (a concurrent
    /// pause may fail the insert with a unique violation: paused all the same)
    pub pause: Stmt,
    /// $1 type -> affected rows 1 when it was paused
    pub resume: Stmt,
    /// -> the paused types, by name
    pub paused: Stmt,
    /// The dialect's clock: its "now" ...
    pub now: &'static str,
    /// ... and its "now + `$n` milliseconds".
    pub plus: fn(&str) -> String,
}

impl Common {
    /// A claim `template` with its `{order}` filled in for `ordered` (`None`: an
    /// unordered type, no condition): where the dialect has a key walk, the
    /// walk's candidates, which pass the rule by construction (asked in the
    /// same statement, on the same snapshot; the claim takes the parameters
    /// [`WALK_FROM`] and [`WALK_LIMIT`]); elsewhere the rule.
    pub(crate) fn order(&self, template: &str, args: &ClaimArgs<'_>) -> String {
        // only rows inserted up to a mark (a number, written out): the claimed
        // rows, and in a walk its candidates and heads too, or candidates
        // past the mark could crowd out the rest
        let upto = |alias: &str| {
            args.upto
                .map_or(String::new(), |n| format!("AND {alias}.seq <= {n} "))
        };
        // a paused type claims nothing (`$1` is every claim's type)
        let claimed = upto(&self.outbox) + &self.not_paused;
        let (walk, rule) = match args.ordered {
            None => return template.replace("{order}", &claimed),
            Some(crate::OnPoison::Skip) => (&self.walk_skip, &self.ordered_skip),
            Some(crate::OnPoison::Block) => (&self.walk_block, &self.ordered_block),
        };
        let condition = match walk {
            Some(w) => w
                .replace("{upto_v0}", &upto("v0"))
                .replace("{upto_hd}", &upto("hd")),
            None => rule.clone(),
        };
        template.replace("{order}", &(claimed + &condition))
    }

    /// `template` with its `{order}` filled in with the rule alone.
    pub(crate) fn order_rule(&self, template: &str, ordered: Option<crate::OnPoison>) -> String {
        template.replace(
            "{order}",
            match ordered {
                None => "",
                Some(crate::OnPoison::Skip) => &self.ordered_skip,
                Some(crate::OnPoison::Block) => &self.ordered_block,
            },
        )
    }
}

/// The parameter of an ordered claim with a key walk that holds the key the
/// walk starts at (`''`: the first key).
pub(crate) const WALK_FROM: usize = 6;
/// ... and the one that holds how many candidates it looks for (the claim's limit).
pub(crate) const WALK_LIMIT: usize = 7;
/// At most this many keys are walked per claim: a bound for a pathological
/// table (keys all in flight or blocked cost a few look-ups each).
pub(crate) const WALK_KEYS: usize = 100_000;

/// What a dialect writes differently in the key walk.
pub(crate) struct WalkStyle {
    /// The candidates' query `q` as a condition on the claimed row's id
    /// (`IN (q)`; PostgreSQL `= ANY(ARRAY(q))`, which it looks up in the
    /// primary key).
    pub within: fn(&str) -> String,
    /// A NULL of the id column's type (the walk's first row has no head yet).
    pub null_id: &'static str,
}

/// How a dialect makes an ordered claim's look-up of a candidate's key (one per
/// candidate row) read the key index, whatever the table's statistics say.
pub(crate) struct KeyLookup {
    /// Written after the table of the look-up, given the key index's name.
    pub hint: fn(&str) -> String,
    /// Written at the end of the look-up.
    pub tail: &'static str,
    /// How its claims walk the keys; `None`: no walk (MySQL/MariaDB, see
    /// there; Oracle, untested here), the claims read due events in id order.
    pub walk: Option<WalkStyle>,
}

impl KeyLookup {
    /// No hint: the planner finds the key index on its own (SQLite, Oracle).
    #[cfg(any(feature = "sqlite", feature = "oracle"))]
    pub(crate) fn plain(walk: Option<WalkStyle>) -> Self {
        KeyLookup {
            hint: |_| String::new(),
            tail: "",
            walk,
        }
    }
}

/// `IN (q)`: how most dialects take the walk's candidates.
#[cfg(feature = "sqlite")]
pub(crate) fn within_in(q: &str) -> String {
    format!("IN ({q})")
}

/// Where an ordered claim looks for candidates, in two parts of which the
/// second runs only when the first found fewer than half of [`WALK_LIMIT`]
/// (a walk costs a few look-ups per key; a short batch is followed by the
/// next claim at once):
/// - the oldest pending events, at most four times the limit of them, that
///   pass `rule` (as the claim's own rule, for the alias `v`): the heads at the
///   front of a backlog, and the events without a key, oldest first, for a
///   look-up each;
/// - the walk: the head of each key, keys walked in key order from the key in
///   [`WALK_FROM`] on (the poller starts it from the first key again after a
///   short batch, so every key gets its turn), one index look-up per key,
///   until [`WALK_LIMIT`] claimable heads are found or [`WALK_KEYS`] keys were
///   walked. A key's head is its earliest event in `live` (the statuses that
///   hold a key back); it is claimable when it is PENDING and due and
///   `head_rule` (the dead letters that block it, for the alias `hd`) lets it.
///
/// So a claim whose front events all wait for busy or blocked keys reads one
/// index entry per such key, not every waiting event of them, however deep
/// the backlog. Every candidate passes the rule on the claim's snapshot (a
/// head has no earlier event of its key in `live`), so the claim does not ask
/// it again; the claim's lock skips candidates another claim holds, and reads
/// the status of one changed since again.
fn walk(o: &str, now: &str, live: &str, rule: &str, head_rule: &str, style: &WalkStyle) -> String {
    let null_id = style.null_id;
    // the next key with an event in `live` past `from`
    let next = |alias: &str, from: &str| {
        format!(
            "(SELECT {alias}.event_key FROM {o} {alias} WHERE {alias}.event_type = $1 \
               AND {alias}.status IN ({live}) AND {alias}.event_key {from} \
               ORDER BY {alias}.event_key LIMIT 1)"
        )
    };
    let (first, after) = (next("f", &format!(">= ${WALK_FROM}")), next("x", "> w.k"));
    let query = format!(
        "WITH RECURSIVE walk (k, n, found, hid) AS (\
           SELECT {first}, 0, 0, {null_id} \
           UNION ALL \
           SELECT {after}, w.n + 1, w.found + CASE WHEN hd.id IS NULL THEN 0 ELSE 1 END, hd.id \
           FROM walk w LEFT JOIN {o} hd ON hd.id = (SELECT y.id FROM {o} y \
               WHERE y.event_type = $1 AND y.event_key = w.k AND y.status IN ({live}) \
               ORDER BY y.seq LIMIT 1) \
             AND hd.status = 'PENDING' AND hd.next_attempt_at <= {now} {{upto_hd}}{head_rule} \
           WHERE w.k IS NOT NULL AND w.n < {WALK_KEYS} AND w.found < ${WALK_LIMIT}), \
         front (id) AS (\
           SELECT v.id FROM (SELECT v0.id, v0.event_type, v0.event_key, v0.next_attempt_at, v0.seq \
               FROM {o} v0 WHERE v0.event_type = $1 AND v0.status = 'PENDING' {{upto_v0}}\
               ORDER BY v0.id LIMIT 4 * ${WALK_LIMIT}) v \
             WHERE v.next_attempt_at <= {now} {rule} LIMIT ${WALK_LIMIT}) \
         SELECT c.id FROM (\
           SELECT id FROM front \
           UNION ALL SELECT hid FROM walk WHERE hid IS NOT NULL \
             AND (SELECT COUNT(*) FROM front) * 2 < ${WALK_LIMIT}) c \
         LIMIT ${WALK_LIMIT}"
    );
    format!("AND {o}.id {}", (style.within)(&query))
}

/// `id IN ({ids})`, the way most dialects finish a batch by its ids.
#[cfg(any(feature = "sqlite", feature = "mysql", feature = "oracle"))]
pub(crate) const IDS_IN: &str = "id IN ({ids})";

/// The statements of [`Common`] for a dialect whose clock is `now`, whose "now + n
/// ms" is `plus`, whose finish statements pick their rows with `finish_ids`
/// (usually [`IDS_IN`]) and whose ordered claims look keys up with `lookup`.
pub(crate) fn common(
    t: &Tables,
    now: &'static str,
    dual: &str,
    plus: fn(&str) -> String,
    finish_ids: &str,
    lookup: &KeyLookup,
) -> Common {
    let (o, d, l, i, p) = (&t.outbox, &t.dlq, &t.locks, &t.inbox, &t.paused);
    // a candidate row (the claim's own `{o}`) waits for an earlier row of its key
    // in `table` with one of `statuses`: one look-up in the key index per row
    let earlier_of = |row: &str, table: &str, statuses: &str| {
        // the key indexes of schema 7 (PostgreSQL) / 5 (the others)
        let index = if table == o.as_str() {
            "outbox_key_seq_idx"
        } else {
            "dead_letters_key_seq_idx"
        };
        let hint = (lookup.hint)(&format!("{}{index}", t.prefix));
        format!(
            "AND NOT EXISTS (SELECT 1 FROM {table} k {hint} WHERE k.event_type = {row}.event_type \
               AND k.event_key = {row}.event_key AND k.status IN ({statuses}) AND k.seq < {row}.seq{})",
            lookup.tail
        )
    };
    let (live_skip, live_block) = (
        "'PENDING', 'IN_PROCESS'",
        "'PENDING', 'IN_PROCESS', 'FAILED'",
    );
    // the rules of the two poison policies for a candidate row named `row`
    let dead = |row: &str| earlier_of(row, d, "'DEAD', 'RETRY'");
    let skip_rule = |row: &str| earlier_of(row, o, live_skip);
    let block_rule = |row: &str| format!("{} {}", earlier_of(row, o, live_block), dead(row));
    let (walk_skip, walk_block) = lookup
        .walk
        .as_ref()
        .map(|style| {
            (
                walk(o, now, live_skip, &skip_rule("v"), "", style),
                walk(o, now, live_block, &block_rule("v"), &dead("hd"), style),
            )
        })
        .unzip();
    // due now, which is after its insert: where claims start at a floor, it
    // waits among the events due after their insert, which every claim reads
    // ([`super::FloorSql`])
    let pending_now = format!(
        "UPDATE {o} SET status = 'PENDING', claim_token = NULL, lease_until = NULL, \
         next_attempt_at = {now}"
    );
    Common {
        order_recheck: format!("SELECT id FROM {o} WHERE event_type = $1 AND id IN ({{ids}}) {{order}}").into(),
        blocked_keys: format!(
            "SELECT event_key, id, status, seq FROM {d} WHERE event_type = $1 AND event_key IS NOT NULL \
               AND status IN ('DEAD', 'RETRY') \
             UNION ALL SELECT event_key, id, status, seq FROM {o} WHERE event_type = $1 \
               AND event_key IS NOT NULL AND status = 'FAILED' \
             ORDER BY 1, 4"
        ).into(),
        key_waiting: format!(
            "SELECT COUNT(*) FROM {o} WHERE event_type = $1 AND event_key = $2 AND status = 'PENDING' \
             AND seq > $3"
        ).into(),
        ordered_skip: skip_rule(o),
        ordered_block: block_rule(o),
        walk_skip,
        walk_block,
        outbox: o.clone(),
        not_paused: format!("AND NOT EXISTS (SELECT 1 FROM {p} WHERE event_type = $1) "),
        pause: format!(
            "INSERT INTO {p} (event_type, paused_at) SELECT $1, {now}{dual} \
             WHERE NOT EXISTS (SELECT 1 FROM {p} WHERE event_type = $1)"
        )
        .into(),
        resume: format!("DELETE FROM {p} WHERE event_type = $1").into(),
        paused: format!("SELECT event_type FROM {p} ORDER BY event_type").into(),
        now,
        plus,
        claim_update: format!(
            "UPDATE {o} SET status = 'IN_PROCESS', claim_token = $1, lease_until = {} WHERE id IN ({{ids}})",
            plus("$2")
        ).into(),
        // A row holds a claim token exactly while it is IN_PROCESS (every way out
        // clears it), so the token alone fences. Naming the status as well would let
        // PostgreSQL pick the in-process partial index and step over every dead
        // entry in it instead of looking the ids up in the primary key.
        finish: Finish::new(o, now, plus, finish_ids, "claim_token = $1", "claim_token = $5"),
        // a held claim's rows are locked by its transaction: nothing else changes
        // them, and naming their status would again pick the pending index
        finish_held: Finish::new(o, now, plus, finish_ids, "1 = 1", "1 = 1"),
        recover: format!("{pending_now} WHERE status = 'IN_PROCESS' AND id IN ({{ids}})").into(),
        release_claims: format!(
            "{pending_now} WHERE status = 'IN_PROCESS' AND claim_token IN ({{ids}})"
        ).into(),
        delete_outbox: format!("DELETE FROM {o} WHERE id IN ({{ids}})").into(),
        delete_dlq: format!("DELETE FROM {d} WHERE id IN ({{ids}})").into(),
        // an event keeps its place in its key's order (`seq`) both ways
        copy_to_dlq: format!(
            "INSERT INTO {d} (id, event_type, event_key, headers, payload, payload_bytes, content_type, \
               attempts, last_error, status, created_at, moved_at, updated_at, seq) \
             SELECT id, event_type, event_key, headers, payload, payload_bytes, content_type, attempts, \
               last_error, 'DEAD', created_at, {now}, {now}, seq FROM {o} WHERE id IN ({{ids}})"
        ).into(),
        copy_to_outbox: format!(
            "INSERT INTO {o} (id, event_type, event_key, headers, payload, payload_bytes, content_type, \
               status, attempts, next_attempt_at, last_error, created_at, seq) \
             SELECT id, event_type, event_key, headers, payload, payload_bytes, content_type, 'PENDING', 0, \
               {now}, last_error, created_at, seq FROM {d} WHERE id IN ({{ids}})"
        ).into(),
        // an event's row of each consumer expires on its own
        delete_inbox: format!(
            "DELETE FROM {i} WHERE consumed_at < {} AND event_id IN ({{ids}})",
            ago(plus, "$1")
        ).into(),
        lock_take: format!(
            "UPDATE {l} SET owner = $1, locked_at = {now}, locked_until = {} \
             WHERE name = $3 AND (locked_until < {now} OR owner = $1)",
            plus("$2")
        ).into(),
        unlock: format!("DELETE FROM {l} WHERE name = $1 AND owner = $2").into(),
        dlq_set_status: format!(
            "UPDATE {d} SET status = $1, updated_at = {now} WHERE status IN ({{from}}) AND id IN ({{ids}})"
        ).into(),
        dlq_delete_status: format!("DELETE FROM {d} WHERE status IN ({{from}}) AND id IN ({{ids}})").into(),
    }
}

/// The statements a held claim adds to `claim_select` and [`Common::finish_held`].
pub struct HoldClaim {
    /// Opens the transaction and has the database end the session once it idled
    /// in it for `{ms}` milliseconds.
    pub open: &'static str,
    /// $1 type -> a row when a due PENDING event may be there (no lock taken), so an
    /// idle type costs one statement per poll, not a transaction of three.
    pub probe: Ordered,
    /// A value as an SQL literal: the claim and the finish go as one
    /// script each (one round trip), their values written into the SQL.
    pub literal: fn(&Val) -> String,
    /// The claim when acked rows are deleted: `claim_select`'s rows deleted in the
    /// held transaction, returning its columns (payload bytes and content type
    /// included) and then `created_at` as text
    /// ($1 type, $2 after, $3 limit).
    pub claim_delete: Ordered,
    /// Writes back a row that such a claim deleted and the broker did not ack:
    /// $1 status, $2 delay ms, $3 error, $4 id (as [`Finish::failed`]), then the
    /// claimed row's $5 type, $6 key, $7 headers, $8 payload, $9 attempts (this
    /// one included when it counts), $10 created_at, $11 payload bytes, $12
    /// content type, $13 seq (its place in the insert order, kept).
    pub restore: Stmt,
}

/// The statements of the wake-up on commit (PostgreSQL's rationed `NOTIFY`).
pub struct WakeSql {
    /// $1 type: its commits send no notification (its wake-up is `poll`)
    pub quiet: Stmt,
    /// $1 type: its commits notify again
    pub loud: Stmt,
    /// -> how full the cluster's notification queue is, 0 to 1
    pub queue_usage: Stmt,
    /// $1 type: wakes every relay's poller of it at the commit (a resume)
    pub nudge: Stmt,
}

/// The rewrite of a mostly empty outbox table, in one transaction
/// ([`crate::store::MaintenanceStore::compact`]).
pub struct CompactSql {
    /// -> pages, live rows (the planner's estimate, kept by VACUUM and
    /// ANALYZE), bytes of the outbox table and its indexes
    pub measure: Stmt,
    /// $1 the timeout in ms, as text: the transaction's lock, statement and
    /// idle timeouts
    pub bound: Stmt,
    /// Rewrites the table and its indexes (only the rows that live)
    pub rewrite: Stmt,
    /// The rewrite was refused because the role does not own the table.
    pub not_owner: fn(&Error) -> bool,
}

/// The lock that makes migrations of one database take turns.
pub struct MigrateLock {
    /// -> 1 once taken, waiting at most the given time (0 when not taken:
    /// MySQL's named lock; PostgreSQL's waits as long as its lock timeout).
    pub take: fn(Duration) -> String,
    /// Releases a session's lock (`None`: it ends with the transaction).
    pub release: Option<&'static str>,
    /// `take` answers at once (0: another migrator holds it) and is asked
    /// again every 50 ms until the timeout: no statement of a migrator waits
    /// for it (PostgreSQL: an online index build waits for every open
    /// transaction, a waiting take's too, which would be a deadlock).
    pub poll: bool,
}

/// How a dialect bounds a migration's waits for locks.
pub struct LockTimeout {
    /// The statement that sets the timeout (run first).
    pub set: fn(Duration) -> String,
    /// The one that resets a session's setting afterwards (`None`: the
    /// setting ends with the transaction).
    pub reset: Option<&'static str>,
}

/// How a dialect builds an index while writers go on (PostgreSQL's
/// `CREATE INDEX CONCURRENTLY`): such statements run outside a transaction,
/// each on its own.
pub struct OnlineIndex {
    /// How a statement that builds one starts; the index's name follows.
    pub build: &'static str,
    /// How a statement that drops one without blocking writers starts.
    pub drop: &'static str,
    /// The word of `build` and `drop` that makes them online (with its
    /// leading space): taken out where the outbox table is new, whose
    /// indexes its own transaction builds at once, waiting for nobody (an
    /// online build waits for every transaction open in the database).
    pub word: &'static str,
    /// An index name -> a row when a build that stopped (a lock timeout, a
    /// crash) left that index invalid: dropped and built again.
    pub invalid: fn(&str) -> String,
    /// -> a row when the outbox table exists (asked before the baseline).
    pub existing: Stmt,
}

/// Every statement of one dialect, with the table names filled in.
pub struct Catalog {
    pub style: Style,
    /// Opens a transaction ("BEGIN", "START TRANSACTION", "BEGIN IMMEDIATE"; "" when
    /// the driver is always in one).
    pub begin: &'static str,
    /// The schema files in order (with `{prefix}`): the first (`001`) is the
    /// idempotent baseline, which creates the version table (applied where
    /// there is none: a new database or one of txbox 0.1); file n (from 2
    /// on) is applied once, when the version table does not list n yet, and
    /// records n there as its last statement.
    pub schema: &'static [&'static str],
    /// DDL runs inside a transaction (PostgreSQL, SQLite): a file is all or
    /// nothing (the whole upgrade, where no index is built online).
    /// Elsewhere each DDL statement commits on its own.
    pub transactional_ddl: bool,
    /// Index builds that let writers go on; `None`: the dialect has none
    /// that fits (MySQL's online DDL is said in its files).
    pub online_index: Option<OnlineIndex>,
    /// Makes concurrent migrations take turns (PostgreSQL's advisory lock,
    /// MySQL's named lock), taken first in the migration; `None`: the
    /// migration's transaction does (SQLite) or nothing can (Oracle).
    pub migrate_lock: Option<MigrateLock>,
    /// How an upgrade bounds its waits for locks; `None`: the connection's
    /// own timeout applies (SQLite's busy timeout).
    pub lock_timeout: Option<LockTimeout>,
    /// The codes of the DDL errors meaning "already there" (a table, index,
    /// column or key that exists, a key already dropped, a version already
    /// recorded), passed over where the dialect has no IF NOT EXISTS or no
    /// transactional DDL: MySQL's error numbers, Oracle's ORA numbers.
    pub exists_errors: &'static [i64],
    /// The database's own code of an error (MySQL's error number, Oracle's
    /// ORA number), read from the driver's error, never from its text.
    pub error_code: fn(&Error) -> Option<i64>,
    /// -> a row when the version table exists (asked when reading the
    /// version failed: no table is schema 0, any other error is one).
    pub version_table: Stmt,
    /// A statement that touches no table, for [`crate::Store::ping`].
    pub ping: Stmt,
    /// -> a number at least as high as every outbox `seq` given so far
    /// ([`crate::store::ClaimStore::insert_mark`])
    pub insert_mark: Stmt,
    /// Largest `{ids}` list per statement.
    pub max_ids: usize,
    /// The statements every dialect writes alike.
    pub common: Common,
    /// One-statement claim with RETURNING ($1 type, $2 limit, $3 token, $4 lease ms,
    /// $5 only ids above this one); without it: `claim_select` then `claim_update` in
    /// a transaction.
    pub claim_returning: Option<Ordered>,
    /// Unordered claims from a floor ([`super::FloorSql`]); `None`: every
    /// claim reads the type's due events from the lowest id.
    pub floors: Option<super::FloorSql>,
    /// A delayed event's due time at publish, "`$n` milliseconds after the
    /// publish call"; `None`: [`Common::plus`], where "now" is the
    /// statement's time already (PostgreSQL's `now()` is the transaction's).
    pub publish_plus: Option<fn(&str) -> String>,
    /// The statements of a held claim ([`crate::ClaimMode::Lock`]); `None`: the
    /// dialect cannot hold claims.
    pub hold_claim: Option<HoldClaim>,
    /// The statements of the wake-up on commit; `None`: the dialect has no
    /// commit notifications.
    pub wake: Option<WakeSql>,
    /// The rewrite of a mostly empty outbox; `None`: the dialect's space is
    /// reused as it is (InnoDB, SQLite, Oracle).
    pub compact: Option<CompactSql>,
    /// $1 type, $2 only ids above this one, $3 limit (Oracle limits by fetching)
    /// -> id, type, key, headers, payload, attempts, payload bytes, content type
    pub claim_select: Ordered,
    /// $1 type -> the milliseconds until its earliest PENDING event is due
    /// (0 or less: one is due), by the database's clock; NULL when none is
    /// pending. Read through the due-time index (schema 9 / 6).
    pub next_due: Stmt,
    /// $1 limit (and $2 TTL in ms for the cleanups) -> id, for each maintenance selection
    pub select_expired: Stmt,
    pub select_processed: Stmt,
    pub select_failed: Stmt,
    pub select_retry: Stmt,
    pub select_resolved: Stmt,
    pub select_inbox_expired: Stmt,
    /// $1 name, $2 owner, $3 lease ms (insert if absent, never fails on conflict)
    pub lock_insert: Stmt,
    /// $1 type, $2 status, $3 limit, $4 offset
    pub dlq_list: Stmt,
    /// $1 type, $2 status
    pub dlq_count: Stmt,
    /// $1 id
    pub dlq_get: Stmt,
    /// $1 id -> a row when this transaction could lock it (skips a locked row)
    pub dlq_lock: Stmt,
    /// -> type, pending, in process, failed, oldest pending age in seconds
    pub status: Stmt,
    /// $1 consumer, $2 id -> affected rows 1 when new (for this consumer, and,
    /// unless `inbox_legacy` asks that first, not recorded before the
    /// per-consumer key by the consumer `'*'`)
    pub inbox_insert: Stmt,
    /// {ids} -> those the consumer `'*'` recorded (before the per-consumer
    /// key), asked once before `inbox_insert` by a plain read:
    /// MySQL/MariaDB, whose `INSERT ... SELECT` would lock the gap the id
    /// goes in, under REPEATABLE READ, and deadlock concurrent consumers
    /// (new ids share the last gap). `None`: `inbox_insert` asks it itself.
    pub inbox_legacy: Option<Stmt>,
    /// `INSERT INTO outbox (id, event_type, event_key, headers, payload{bytes_columns}) VALUES `
    /// (`{bytes_columns}` is filled in by [`insert_events_sql`])
    pub insert_events: String,
    /// one row of `insert_events`, with `$1`..`$5{bytes_values}`
    pub insert_event_row: String,
    /// What `{bytes_values}` becomes in a statement that writes binary payloads:
    /// `$6` the bytes, `$7` the content type.
    pub insert_bytes_values: &'static str,
    /// between rows (", "; Oracle's INSERT ALL: " ")
    pub insert_events_sep: &'static str,
    /// after the last row ("" ; Oracle: " SELECT 1 FROM dual")
    pub insert_events_suffix: &'static str,
    /// The insert of one event, for each of: binary payload columns or not,
    /// delayed or not; built the first time and kept (most publishes are of
    /// one event).
    pub insert_one: [std::sync::OnceLock<Stmt>; 4],
    /// Most events per insert statement (Oracle: 1, since its multi-table
    /// insert gives every row of a statement the same identity number,
    /// `seq`, which orders a key's events)
    pub insert_rows_max: usize,
}
