//! The claim: pick and lease due schedule rows in one autocommit statement ([`CLAIM_DUE_SQL`]).

use uuid::Uuid;

use crate::db::StoreError;
use crate::db_now_ms;

/// The four-part lease fence, plus where the claimed row version lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fence {
    pub owner: String,
    pub token: Uuid,
    pub version: i64,
    pub expires_at_ms: i64,
}

/// What the admission re-verifies about the definition the decision was made from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TriggerDef {
    pub project_id: String,
    pub trigger_revision: i64,
    pub trigger_digest: String,
    pub cron_expr: String,
    pub timezone: String,
    /// Parsed where the row is read; a stored spelling qlsched does not know stays an error
    /// here, so the decision rejects the row (release with back-off and a diagnostic).
    pub misfire_policy: Result<crate::schedule::MisfirePolicy, crate::schedule::ScheduleError>,
    pub misfire_grace_ms: i64,
    pub task_id: String,
    /// The task as the claim read it. Not re-verified: the admission pins the task as its
    /// own transaction reads it (a deployment since the claim refuses nothing).
    pub task_revision: i64,
    pub task_digest: String,
    pub execution_revision_id: Uuid,
    /// The trigger's jitter (0: none) and validity window (docs/policies-jitter.md).
    pub jitter_ms: i64,
    pub start_at_ms: Option<i64>,
    pub end_at_ms: Option<i64>,
}

impl TriggerDef {
    /// The jitter and window of the trigger `trigger_id` of this definition.
    pub fn timing<'a>(&self, trigger_id: &'a str) -> crate::schedule::Timing<'a> {
        crate::schedule::Timing {
            trigger_id,
            jitter_ms: self.jitter_ms,
            start_at_ms: self.start_at_ms,
            end_at_ms: self.end_at_ms,
        }
    }
}

/// One leased schedule row as the claim statement left it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClaimedRow {
    pub trigger_id: String,
    /// Physical address of the claimed row version; the admission re-locks by it (a TID
    /// scan takes a tuple-level predicate lock, not a B-tree page lock).
    pub tid: String,
    /// Physical address of the trigger's `trigger_overlap` row version as the claim read it,
    /// for a forbid or buffer_one trigger that has the row (V26): the admission reads and
    /// writes the row by it, for the same reason. `None` otherwise (allow: nothing read).
    pub overlap_tid: Option<String>,
    /// A forbid trigger with no unfinished run and nothing kept as the claim read it (V28):
    /// the admission counts its run on the schedule row and reads no overlap row
    /// (`overlap_tid` is then `None`).
    pub overlap_idle: bool,
    pub next_fire_at_ms: Option<i64>,
    pub state_version: i64,
    pub fence: Fence,
    /// Database clock when the claim was taken (`claimAcquiredAtMs`); the decision's input.
    pub observed_at_ms: i64,
    pub def: TriggerDef,
}

/// The replica-id guard a claim round is conditioned on: it leases only while `incarnation`
/// still holds the guard row, and extends the guard in the same statement, so that an idle
/// replica issues one statement per round.
#[derive(Clone, Copy, Debug, Default)]
pub struct Extras {
    /// The incarnation that must hold the guard, and the TTL (ms) to extend it by this
    /// round (0 = not this round). `None` = no guard (tests driving the actors directly).
    pub guard: Option<(Uuid, i64)>,
}

/// The rows a claim lane may lease: free (or expired) and due by the statement's clock, with a
/// trigger that is enabled, of kind cron and at the schedule row's revision, in an active
/// project, while the replica-id guard is held. Both lanes of [`CLAIM_DUE_SQL`] read these
/// rows, in opposite orders.
macro_rules! due_rows {
    ($incarnation:literal) => {
        concat!(
            "    SELECT s.trigger_id
      FROM qlsched.trigger_schedules s
     WHERE s.claimable_at_ms <= (SELECT now_ms FROM obs)
       AND (s.claim_expires_at_ms IS NULL OR s.claim_expires_at_ms <= (SELECT now_ms FROM obs))
       AND (SELECT t.enabled AND t.kind = 'cron' AND t.revision = s.trigger_revision AND p.status = 'active'
              FROM qlsched.triggers t, qlsched.projects p
             WHERE t.trigger_id = s.trigger_id AND p.project_id = s.project_id)
       AND (",
            $incarnation,
            "::uuid = '00000000-0000-0000-0000-000000000000' OR EXISTS (SELECT 1 FROM held))
"
        )
    };
}

/// What one claim round found: the rows it leased, the database clock it observed, and
/// when the next row becomes claimable (the earliest `claimable_at_ms` after the
/// observation, read from the head of the claim index in the same statement).
#[derive(Clone, Debug)]
pub struct ClaimRound {
    pub rows: Vec<ClaimedRow>,
    pub now_ms: i64,
    pub next_due_ms: Option<i64>,
    /// Whether the guard was extended (`None`: not asked to).
    pub guard_extended: Option<bool>,
    /// Whether the guard row was still this incarnation's (`None`: no guard); when not,
    /// nothing was leased.
    pub guard_held: Option<bool>,
}

/// One claim round: one of [`CLAIM_VARIANTS`] ([`claim_variant`]) prepared on this connection,
/// returning the round's observation and next due instant too.
pub async fn claim_round(
    conn: &tokio_postgres::Client,
    variant: &tokio_postgres::Statement,
    owner: &str,
    lease_ms: i64,
    round: Uuid,
    extras: Extras,
) -> Result<ClaimRound, StoreError> {
    let (incarnation, ttl) = extras.guard.unwrap_or((Uuid::nil(), 0));
    let rows = conn
        .query(variant, &[&owner, &lease_ms, &round, &incarnation, &ttl])
        .await?;
    let mut out = parse_round(&rows);
    match extras.guard {
        None => (out.guard_extended, out.guard_held) = (None, None),
        Some((_, 0)) => out.guard_extended = None,
        Some(_) => {}
    }
    Ok(out)
}

/// What a claim statement returned, as a round (its rows, the clock, the next due instant).
pub fn parse_round(rows: &[tokio_postgres::Row]) -> ClaimRound {
    let mut out = ClaimRound {
        rows: Vec::with_capacity(rows.len()),
        now_ms: 0,
        next_due_ms: None,
        guard_extended: None,
        guard_held: None,
    };
    for r in rows {
        match r.get::<_, Option<String>>("trigger_id") {
            Some(_) => out.rows.push(claimed_row(r)),
            None => {
                out.now_ms = r.get("observed_at_ms");
                out.next_due_ms = r.get("next_due_ms");
                out.guard_extended = Some(r.get::<_, i64>("guard_extended") > 0);
                out.guard_held = Some(r.get::<_, i64>("guard_held") > 0);
            }
        }
    }
    out
}

/// The claim statement: leases up to a limit of due rows for `$1` for `$2` ms, stamped with
/// a round id, under the replica-id guard of an incarnation, whose TTL it extends. The text
/// is a macro of the two lanes' limits and the round, incarnation and guard TTL
/// placeholders, filled in once for each of [`CLAIM_VARIANTS`] (what the daemon prepares)
/// and once for [`CLAIM_DUE_SQL`] (the limit as a parameter, for tools).
///
/// Locking: one statement, autocommit READ COMMITTED. `FOR UPDATE OF s SKIP LOCKED` makes
/// concurrent claimers take disjoint rows without waiting; a row another claimer updated
/// after our snapshot is re-checked against the WHERE (its `claimable_at_ms` moved to the new
/// expiry, so it drops out). The scan is a range of the partial index on
/// `(claimable_at_ms, project_id, trigger_id)`, which holds only free-and-due rows at its
/// head: live claims sit at their expiry, disabled rows are absent. The clock is read once
/// (materialised CTE) and used for due-ness, expiry and the returned observation. No cron is
/// evaluated and no id is minted while the row locks are held.
///
/// Two lanes share the limit: three quarters of it oldest due first (`picked`: a backlog
/// drains in cursor order and no due row waits forever), a quarter newest due first
/// (`fresh`: a row that has just fallen due is not queued behind the backlog). Both are
/// ranges of the same index, one read forwards and one backwards, each stopped by its limit.
///
/// Every row leased is stamped with `round`, so that a round whose reply never arrived can
/// be found and released by [`super::release::release_rounds`].
macro_rules! claim_due_sql {
    ($oldest:literal, $newest:literal, $round:literal, $incarnation:literal, $guard_ttl:literal) => {
        concat!(
    "
WITH obs AS MATERIALIZED (
    SELECT ",
    db_now_ms!(),
    " AS now_ms
), held AS (
    -- The replica-id guard, locked for the statement (the nil incarnation: no guard, tests
    -- only). A takeover committed before this statement, or while it waits for the lock,
    -- leaves it empty, and then nothing is leased under the shared owner name; a takeover
    -- after it waits for this statement (and then releases what it leased).
    SELECT 1 FROM qlsched.replicas r
     WHERE r.replica_id = $1 AND r.incarnation = ", $incarnation, "::uuid AND r.stopped_at_ms IS NULL
       FOR SHARE
), guard AS (
    -- The replica-id guard's heartbeat (a TTL of 0: not this round), and the database session
    -- the holder works on, recorded whenever it differs from this one by backend pid or
    -- start (a new claim connection; after a server restart, possibly the old pid with a
    -- new start); a recorded start that is NULL is unknown and never this session's. A
    -- successor judges the holder alive by that session (store::replicas).
    UPDATE qlsched.replicas r
       SET heartbeat_at_ms = CASE WHEN ", $guard_ttl, "::bigint > 0 THEN obs.now_ms ELSE r.heartbeat_at_ms END,
           expires_at_ms = CASE WHEN ", $guard_ttl, "::bigint > 0 THEN obs.now_ms + ", $guard_ttl, "::bigint ELSE r.expires_at_ms END,
           session_pid = me.pid,
           session_started_at = me.started
      FROM obs, held,
           (SELECT pg_backend_pid() AS pid,
                   (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a) AS started) me
     WHERE r.replica_id = $1 AND r.incarnation = ", $incarnation, "::uuid AND r.stopped_at_ms IS NULL
       AND (", $guard_ttl, "::bigint > 0
            OR (r.session_pid = me.pid AND r.session_started_at = me.started) IS NOT TRUE)
    RETURNING ", $guard_ttl, "::bigint > 0 AS extended
), picked AS (
    -- The schedule table is the only relation of this scan, so its plan is always the claim
    -- index's range in order, stopped by the LIMIT: the trigger and project re-checks are a
    -- correlated subquery (evaluated per row, never turned into a join). As joins, their
    -- order was left to the statistics of `projects`, a table of a few rows that autovacuum
    -- never analyses; unanalysed, it made the generic plan a sequential scan of every due row,
    -- a hash join and a sort per round (tests/it/plans.rs).
",
    due_rows!($incarnation),
    "     ORDER BY s.claimable_at_ms, s.project_id, s.trigger_id
     LIMIT ", $oldest, "
       FOR UPDATE OF s SKIP LOCKED
), fresh AS (
    -- The fresh lane: a quarter of the limit read from the other end of the same range,
    -- newest due first (a backward scan of the claim index from the clock). While a backlog
    -- drains oldest first, an occurrence that has just fallen due (an every-second trigger
    -- one second into a 100,000-row boundary) is leased in the next round instead of after
    -- the whole backlog. A row both lanes reach is leased once (locked by this statement,
    -- it is not skipped; the update takes the union). Limits below 4 have no fresh lane.
",
    due_rows!($incarnation),
    "     ORDER BY s.claimable_at_ms DESC, s.project_id DESC, s.trigger_id DESC
     LIMIT ", $newest, "
       FOR UPDATE OF s SKIP LOCKED
), claimed AS (
UPDATE qlsched.trigger_schedules s
   SET claim_owner = $1,
       claim_token = gen_random_uuid(),
       claim_version = s.claim_version + 1,
       claim_expires_at_ms = obs.now_ms + $2,
       claim_round = ", $round, ",
       claimable_at_ms = obs.now_ms + $2,
       state_version = s.state_version + 1,
       updated_at_ms = obs.now_ms
  FROM obs, qlsched.triggers t, qlsched.tasks k
 WHERE s.trigger_id = ANY (ARRAY(SELECT trigger_id FROM picked UNION ALL SELECT trigger_id FROM fresh))
   AND t.trigger_id = s.trigger_id
   AND k.task_id = t.task_id
RETURNING s.trigger_id, s.ctid::text AS tid, s.next_fire_at_ms, s.state_version,
          s.claim_owner, s.claim_token, s.claim_version, s.claim_expires_at_ms,
          obs.now_ms AS observed_at_ms, s.project_id, s.trigger_revision,
          t.content_digest AS trigger_digest, t.cron_expr, t.timezone, t.misfire_policy,
          t.misfire_grace_ms, t.task_id, k.revision AS task_revision,
          k.content_digest AS task_digest, k.execution_revision_id,
          t.jitter_ms, t.start_at_ms, t.end_at_ms,
          -- Only for a policy the admission decides (a one-time filter: an allow trigger
          -- reads nothing here): 'idle' for a forbid trigger with no unfinished run (V28:
          -- the admission then counts its run on the schedule row alone), else the TID.
          (SELECT CASE WHEN t.overlap_policy = 'forbid' AND o.buffered IS NULL
                            AND o.unfinished + s.overlap_admitted - o.overlap_released = 0
                       THEN 'idle' ELSE o.ctid::text END
             FROM qlsched.trigger_overlap o
            WHERE t.overlap_policy IN ('forbid', 'buffer_one') AND o.trigger_id = s.trigger_id) AS overlap_tid
)
SELECT claimed.*, NULL::bigint AS next_due_ms, NULL::bigint AS guard_extended,
       NULL::bigint AS guard_held
  FROM claimed
UNION ALL
-- The probe row: the clock and the next instant a row becomes claimable (index head).
SELECT NULL::text, NULL::text, NULL::bigint, NULL::bigint, NULL::text, NULL::uuid, NULL::bigint,
       NULL::bigint, obs.now_ms, NULL::text, NULL::bigint, NULL::text, NULL::text, NULL::text,
       NULL::text, NULL::bigint, NULL::text, NULL::bigint, NULL::text, NULL::uuid,
       NULL::bigint, NULL::bigint, NULL::bigint, NULL::text,
       (SELECT n.claimable_at_ms FROM qlsched.trigger_schedules n
         WHERE n.claimable_at_ms > obs.now_ms ORDER BY n.claimable_at_ms LIMIT 1),
       (SELECT count(*) FROM guard WHERE extended), (SELECT count(*) FROM held)
  FROM obs"
        )
    };
}

/// [`claim_due_sql!`] with the limit as parameter `$3` (three quarters, rounded up, oldest
/// first; a quarter newest first) and then `$4` round id, `$5` guard incarnation, `$6` guard
/// TTL ms: one text for every limit, for tools that pass the limit (the benchmark's pgbench
/// scripts, EXPLAIN runs). The daemon prepares [`CLAIM_VARIANTS`] instead.
pub const CLAIM_DUE_SQL: &str = claim_due_sql!(
    "$3::bigint - $3::bigint / 4",
    "$3::bigint / 4",
    "$4",
    "$5",
    "$6"
);

/// The claim statement as the daemon prepares it, one text per limit rounded down to a power
/// of two (1 ..= 256): the limits of both lanes written in as constants, and the parameters
/// `$1` owner, `$2` lease ms, `$3` round id, `$4` guard incarnation, `$5` guard TTL ms. A
/// constant limit keeps the generic plan (used once a prepared statement has run a few times)
/// on the claim index and on primary-key probes; with the limit as a parameter the generic
/// plan hash-joins a sequential scan of the whole table (`tests/it/plans.rs`). Each text is
/// [`claim_due_sql!`] filled in at compile time: what is prepared is what is written here.
pub const CLAIM_VARIANTS: [(u32, &str); 9] = [
    (1, claim_due_sql!("1", "0", "$3", "$4", "$5")),
    (2, claim_due_sql!("2", "0", "$3", "$4", "$5")),
    (4, claim_due_sql!("3", "1", "$3", "$4", "$5")),
    (8, claim_due_sql!("6", "2", "$3", "$4", "$5")),
    (16, claim_due_sql!("12", "4", "$3", "$4", "$5")),
    (32, claim_due_sql!("24", "8", "$3", "$4", "$5")),
    (64, claim_due_sql!("48", "16", "$3", "$4", "$5")),
    (128, claim_due_sql!("96", "32", "$3", "$4", "$5")),
    (256, claim_due_sql!("192", "64", "$3", "$4", "$5")),
];

/// The [`CLAIM_VARIANTS`] text for `limit` rounded down to a power of two (1 ..= 256), and
/// the limit it carries.
pub fn claim_variant(limit: u32) -> (&'static str, u32) {
    let (limit, sql) = CLAIM_VARIANTS[limit.clamp(1, 256).ilog2() as usize];
    (sql, limit)
}

/// What the claim's `overlap_tid` column holds for an idle forbid trigger (instead of a TID).
const IDLE: &str = "idle";

/// A leased row of [`CLAIM_DUE_SQL`] (or a variant), by column name.
fn claimed_row(r: &tokio_postgres::Row) -> ClaimedRow {
    let overlap: Option<String> = r.get("overlap_tid");
    let overlap_idle = overlap.as_deref() == Some(IDLE);
    ClaimedRow {
        trigger_id: r.get("trigger_id"),
        tid: r.get("tid"),
        overlap_tid: overlap.filter(|_| !overlap_idle),
        overlap_idle,
        next_fire_at_ms: r.get("next_fire_at_ms"),
        state_version: r.get("state_version"),
        fence: Fence {
            owner: r.get("claim_owner"),
            token: r.get("claim_token"),
            version: r.get("claim_version"),
            expires_at_ms: r.get("claim_expires_at_ms"),
        },
        observed_at_ms: r.get("observed_at_ms"),
        def: TriggerDef {
            project_id: r.get("project_id"),
            trigger_revision: r.get("trigger_revision"),
            trigger_digest: r.get("trigger_digest"),
            cron_expr: r.get("cron_expr"),
            timezone: r.get("timezone"),
            misfire_policy: r.get::<_, String>("misfire_policy").parse(),
            misfire_grace_ms: r.get("misfire_grace_ms"),
            task_id: r.get("task_id"),
            task_revision: r.get("task_revision"),
            task_digest: r.get("task_digest"),
            execution_revision_id: r.get("execution_revision_id"),
            jitter_ms: r.get("jitter_ms"),
            start_at_ms: r.get("start_at_ms"),
            end_at_ms: r.get("end_at_ms"),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::{claim_variant, CLAIM_DUE_SQL, CLAIM_VARIANTS};

    #[test]
    fn each_variant_splits_its_constant_limit_between_the_two_lanes() {
        for (asked, limit, oldest, newest) in [
            (1, 1, 1, 0),
            (3, 2, 2, 0),
            (16, 16, 12, 4),
            (100, 64, 48, 16),
            (999, 256, 192, 64),
        ] {
            let (sql, got) = claim_variant(asked);
            assert_eq!(got, limit);
            assert!(!sql.contains("$6") && !sql.contains("$3::bigint"), "{sql}");
            assert!(sql.contains(&format!("LIMIT {oldest}\n")), "{sql}");
            assert!(sql.contains(&format!("LIMIT {newest}\n")), "{sql}");
        }
    }

    /// Each variant is the tools' statement with the limit written in and the later
    /// parameters moved down by one: the same statement.
    #[test]
    fn each_variant_is_the_tools_statement_with_its_limit_written_in() {
        for (limit, sql) in CLAIM_VARIANTS {
            let from_tools = CLAIM_DUE_SQL
                .replace(
                    "LIMIT $3::bigint - $3::bigint / 4",
                    &format!("LIMIT {}", limit - limit / 4),
                )
                .replace("LIMIT $3::bigint / 4", &format!("LIMIT {}", limit / 4))
                .replace("$4", "$3")
                .replace("$5", "$4")
                .replace("$6", "$5");
            assert_eq!(sql, from_tools, "LIMIT {limit}");
        }
    }
}
