//! A trigger's outcome policies and summary (V19, docs/policies-outcome.md): what
//! `qlsched.trigger_outcomes` holds, as `trigger show/list` and the console read it, and the
//! per-project counts of overdue and system-paused triggers the replicas export.
//!
//! The table is written only by V19's triggers, as the owner: `trigger_outcome_of_run` when a
//! run reaches succeeded, failed or cancelled (and the pause after N failures), and
//! `trigger_outcome_follows_trigger` when a trigger is published, disabled, enabled or deleted.

use serde::Serialize;

use crate::db::StoreError;
use crate::db_now_ms;

/// The columns of [`TriggerOutcome`], read from `qlsched.triggers t` and
/// `qlsched.trigger_outcomes o` (left-joined) and `n.now_ms`.
#[macro_export]
macro_rules! outcome_columns {
    () => {
        "t.pause_after_failures, t.expect_success_within_ms,
       o.last_success_at_ms, o.last_success_run_id::text AS last_success_run_id,
       o.last_failure_at_ms, o.last_failure_run_id::text AS last_failure_run_id, o.last_failure_error,
       o.last_cancelled_at_ms, o.last_cancelled_run_id::text AS last_cancelled_run_id,
       coalesce(o.consecutive_failures, 0) AS consecutive_failures, o.system_paused_at_ms,
       o.success_due_at_ms, coalesce(o.success_due_at_ms <= n.now_ms, false) AS overdue"
    };
}

/// A trigger's outcome policies and the summary of its runs' outcomes since V19 (all `None`
/// and 0 until a run of it ends). Times are Unix ms, database clock.
#[derive(Clone, Debug, Default, Serialize, PartialEq, Eq)]
pub struct TriggerOutcome {
    /// `--pause-after-failures`.
    pub pause_after_failures: Option<i32>,
    /// `--expect-success-within`, in ms.
    pub expect_success_within_ms: Option<i64>,
    pub last_success_at_ms: Option<i64>,
    pub last_success_run_id: Option<String>,
    pub last_failure_at_ms: Option<i64>,
    pub last_failure_run_id: Option<String>,
    /// The failed run's last attempt's error (`lost: …` when its lease ended), at most 1000
    /// characters.
    pub last_failure_error: Option<String>,
    pub last_cancelled_at_ms: Option<i64>,
    pub last_cancelled_run_id: Option<String>,
    /// Failed runs since the last success or enable; cancelled runs do not count.
    pub consecutive_failures: i32,
    /// When the system paused the trigger after `pause_after_failures` failures (until an
    /// enable).
    pub system_paused_at_ms: Option<i64>,
    /// When it becomes overdue without a success (running triggers with a window only).
    pub success_due_at_ms: Option<i64>,
    /// `success_due_at_ms` has passed.
    pub overdue: bool,
}

impl TriggerOutcome {
    /// From a row selected with [`outcome_columns!`], by column name.
    pub fn from_row(r: &tokio_postgres::Row) -> TriggerOutcome {
        TriggerOutcome {
            pause_after_failures: r.get("pause_after_failures"),
            expect_success_within_ms: r.get("expect_success_within_ms"),
            last_success_at_ms: r.get("last_success_at_ms"),
            last_success_run_id: r.get("last_success_run_id"),
            last_failure_at_ms: r.get("last_failure_at_ms"),
            last_failure_run_id: r.get("last_failure_run_id"),
            last_failure_error: r.get("last_failure_error"),
            last_cancelled_at_ms: r.get("last_cancelled_at_ms"),
            last_cancelled_run_id: r.get("last_cancelled_run_id"),
            consecutive_failures: r.get("consecutive_failures"),
            system_paused_at_ms: r.get("system_paused_at_ms"),
            success_due_at_ms: r.get("success_due_at_ms"),
            overdue: r.get("overdue"),
        }
    }
}

/// Per project: triggers overdue (a success deadline passed) and triggers paused by the
/// system. The clock is read once, in a sub-select, so it is the index condition (a
/// volatile `clock_timestamp()` in the comparison itself would be a filter over every
/// deadline). Reads only index entries: the deadlines up to now in `trigger_outcomes_due_idx`
/// (only running triggers with a window have one) and the paused rows in
/// `trigger_outcomes_paused_idx`; a trigger that is neither costs nothing, so 100,000 triggers
/// with a window and none overdue read no row at all (docs/benchmark.md, row O1). Each count
/// reads at most 10,000 entries (a total of 10,000 means that many or more, as
/// `qlsched_old_queued_runs`): the gauge exists for an alert on "more than 0", and 100,000
/// overdue triggers would otherwise cost about 30 ms per evaluation.
pub const OUTCOME_GAUGES_SQL: &str = concat!(
    "SELECT project_id, sum(overdue)::bigint AS overdue, sum(paused)::bigint AS paused
       FROM ((SELECT o.project_id, 1 AS overdue, 0 AS paused FROM qlsched.trigger_outcomes o
              WHERE o.success_due_at_ms IS NOT NULL AND o.success_due_at_ms <= (SELECT ",
    db_now_ms!(),
    ")
              LIMIT 10000)
             UNION ALL
             (SELECT o.project_id, 0, 1 FROM qlsched.trigger_outcomes o
              WHERE o.system_paused_at_ms IS NOT NULL LIMIT 10000)) x
      GROUP BY project_id ORDER BY project_id"
);

/// Overdue and system-paused triggers per project, through [`OUTCOME_GAUGES_SQL`]:
/// (project, overdue, paused), sorted by project.
pub async fn gauges(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Vec<(String, i64, i64)>, StoreError> {
    Ok(client
        .query(OUTCOME_GAUGES_SQL, &[])
        .await?
        .iter()
        .map(|r| (r.get("project_id"), r.get("overdue"), r.get("paused")))
        .collect())
}
