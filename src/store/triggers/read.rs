//! `trigger list` and `trigger show`: read-only, one statement each.

use serde::Serialize;

use crate::db::StoreError;
use crate::db_now_ms;
use crate::store::manage::{ManageError, ProjectStatus};

use super::outcome::TriggerOutcome;

/// One trigger as `trigger list` and `trigger show` print it. Times are Unix ms (database
/// clock); `now_ms` is when the row was read.
#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct TriggerView {
    pub trigger_id: String,
    pub project_id: String,
    pub task_id: String,
    pub revision: i64,
    pub cron_expr: String,
    pub timezone: String,
    pub misfire_policy: String,
    pub misfire_grace_ms: i64,
    pub enabled: bool,
    pub operator_disabled: bool,
    pub disabled_note: Option<String>,
    pub disabled_by: Option<String>,
    pub disabled_at_ms: Option<i64>,
    pub enabled_by: Option<String>,
    pub enabled_at_ms: Option<i64>,
    pub deleted_by: Option<String>,
    pub deleted_at_ms: Option<i64>,
    pub project_status: ProjectStatus,
    /// The schedule cursor: the next occurrence the cron will admit (None: not yet decided).
    pub next_fire_at_ms: Option<i64>,
    pub last_scheduled_at_ms: Option<i64>,
    /// queued − due (the jittered instant; scheduled without a jitter) of the run admitted for
    /// `last_scheduled_at_ms`.
    pub last_lag_ms: Option<i64>,
    pub claim_owner: Option<String>,
    pub claim_expires_at_ms: Option<i64>,
    pub claim_version: i64,
    pub state_version: i64,
    pub now_ms: i64,
    /// Outcome policies and summary (V19).
    pub outcome: TriggerOutcome,
    /// Jitter (ms, 0 = none) and validity window (docs/policies-jitter.md).
    pub jitter_ms: i64,
    pub start_at_ms: Option<i64>,
    pub end_at_ms: Option<i64>,
    /// Past its window: the cursor is after the end (the last occurrence in the window was
    /// admitted), or the end has passed while the row is out of the claim index (disabled,
    /// project inactive). Nothing more is admitted by the schedule.
    pub ended: bool,
    /// The overlap policy (V21): allow, forbid, buffer_one, replace.
    pub overlap_policy: String,
    /// Occurrences not admitted because a run of the trigger was unfinished (reason
    /// `overlap`), and the scheduled instants of the last few, newest last.
    pub skipped_overlap: i64,
    pub last_skipped_ms: Vec<i64>,
    /// buffer_one: the instant of the occurrence kept for when the unfinished run ends.
    pub buffered_for_ms: Option<i64>,
    /// The unfinished runs the policy counts (None: never counted, an allow trigger).
    pub overlap_unfinished: Option<i32>,
}

/// Which triggers `trigger list` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFilter {
    Enabled,
    Disabled,
    All,
    /// Running with a success deadline that passed (`--expect-success-within`).
    Overdue,
}

impl StateFilter {
    fn as_str(self) -> &'static str {
        match self {
            StateFilter::Enabled => "enabled",
            StateFilter::Disabled => "disabled",
            StateFilter::All => "all",
            StateFilter::Overdue => "overdue",
        }
    }
}

/// One page of `trigger list`: keyset on `trigger_id` (`after` = last id of the previous page).
#[derive(Clone, Debug)]
pub struct ListQuery<'a> {
    pub project: Option<&'a str>,
    pub state: StateFilter,
    pub after: Option<&'a str>,
    pub limit: i64,
}

/// The columns of one trigger's view (`trigger show` and `trigger list`), from the aliases
/// `t` (triggers), `s` (schedule), `p` (project), `o` (outcomes), `ov` (overlap), `n` (clock).
/// The overlap count is the overlap row's part plus the schedule row's (V28).
macro_rules! view_columns {
    () => {
        concat!(
            "
                   t.trigger_id, t.project_id, t.task_id, t.revision, t.cron_expr, t.timezone, t.misfire_policy,
                   t.misfire_grace_ms, t.enabled, t.operator_disabled, t.disabled_note, t.disabled_by, t.disabled_at_ms,
                   t.enabled_by, t.enabled_at_ms, t.deleted_by, t.deleted_at_ms, p.status AS project_status,
                   s.next_fire_at_ms, s.last_scheduled_at_ms,
                   (SELECT r.queued_at_ms - coalesce(r.due_at_ms, r.scheduled_for_ms) FROM qlsched.runs r
                     WHERE r.trigger_id = t.trigger_id AND r.scheduled_for_ms = s.last_scheduled_at_ms
                     ORDER BY r.queued_at_ms LIMIT 1) AS last_lag_ms,
                   s.claim_owner, s.claim_expires_at_ms, s.claim_version, s.state_version, n.now_ms,
                   t.jitter_ms, t.start_at_ms, t.end_at_ms,
                   coalesce(s.next_fire_at_ms > t.end_at_ms OR (t.end_at_ms < n.now_ms AND s.claimable_at_ms IS NULL),
                            false) AS ended,
                   t.overlap_policy, coalesce(ov.skipped_overlap, 0) AS skipped_overlap,
                   coalesce(ov.last_skipped_ms, '{}') AS last_skipped_ms,
                   (ov.buffered ->> 'scheduled_for_ms')::bigint AS buffered_for_ms, (ov.unfinished + s.overlap_admitted - ov.overlap_released)::int AS overlap_unfinished, ",
            crate::outcome_columns!()
        )
    };
}

const VIEW_COLUMNS: &str = view_columns!();

/// The page query of `trigger list`, public so a test can EXPLAIN it. A keyset page walks
/// `triggers_pkey` (or `triggers_project_page_idx` with a project) from `$3` in id order and
/// stops after `$4` rows; each row's schedule and last run are primary-key / index probes.
/// Nothing sorts or scans the whole table, however many triggers there are.
pub const LIST_SQL: &str = concat!(
    "WITH n AS MATERIALIZED (SELECT ",
    db_now_ms!(),
    " AS now_ms)
SELECT ",
    view_columns!(),
    "
  FROM qlsched.triggers t
  JOIN qlsched.trigger_schedules s ON s.trigger_id = t.trigger_id
  JOIN qlsched.projects p ON p.project_id = t.project_id
  LEFT JOIN qlsched.trigger_outcomes o ON o.trigger_id = t.trigger_id
  LEFT JOIN qlsched.trigger_overlap ov ON ov.trigger_id = t.trigger_id
  CROSS JOIN n
 WHERE t.deleted_at_ms IS NULL
   AND ($1::text IS NULL OR t.project_id = $1)
   AND ($2::text = 'all'
        OR ($2::text = 'overdue' AND o.success_due_at_ms <= n.now_ms)
        OR ($2::text IN ('enabled', 'disabled') AND t.enabled = ($2::text = 'enabled')))
   AND t.trigger_id > coalesce($3::text, '')
 ORDER BY t.trigger_id
 LIMIT $4"
);

/// A [`TriggerView`] from a row selected with the view columns, by column name.
fn view(r: &tokio_postgres::Row) -> TriggerView {
    TriggerView {
        trigger_id: r.get("trigger_id"),
        project_id: r.get("project_id"),
        task_id: r.get("task_id"),
        revision: r.get("revision"),
        cron_expr: r.get("cron_expr"),
        timezone: r.get("timezone"),
        misfire_policy: r.get("misfire_policy"),
        misfire_grace_ms: r.get("misfire_grace_ms"),
        enabled: r.get("enabled"),
        operator_disabled: r.get("operator_disabled"),
        disabled_note: r.get("disabled_note"),
        disabled_by: r.get("disabled_by"),
        disabled_at_ms: r.get("disabled_at_ms"),
        enabled_by: r.get("enabled_by"),
        enabled_at_ms: r.get("enabled_at_ms"),
        deleted_by: r.get("deleted_by"),
        deleted_at_ms: r.get("deleted_at_ms"),
        project_status: r.get("project_status"),
        next_fire_at_ms: r.get("next_fire_at_ms"),
        last_scheduled_at_ms: r.get("last_scheduled_at_ms"),
        last_lag_ms: r.get("last_lag_ms"),
        claim_owner: r.get("claim_owner"),
        claim_expires_at_ms: r.get("claim_expires_at_ms"),
        claim_version: r.get("claim_version"),
        state_version: r.get("state_version"),
        now_ms: r.get("now_ms"),
        outcome: TriggerOutcome::from_row(r),
        jitter_ms: r.get("jitter_ms"),
        start_at_ms: r.get("start_at_ms"),
        end_at_ms: r.get("end_at_ms"),
        ended: r.get("ended"),
        overlap_policy: r.get("overlap_policy"),
        skipped_overlap: r.get("skipped_overlap"),
        last_skipped_ms: r.get("last_skipped_ms"),
        buffered_for_ms: r.get("buffered_for_ms"),
        overlap_unfinished: r.get("overlap_unfinished"),
    }
}

/// [`LIST_SQL`] narrowed to ids starting with `$5` (the console's search): a filter on the
/// same walk of the primary key, which stops at the page size once enough ids matched.
static PREFIX_LIST_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    LIST_SQL.replace(
        "\n ORDER BY t.trigger_id",
        "\n   AND ($5::text IS NULL OR starts_with(t.trigger_id, $5))\n ORDER BY t.trigger_id",
    )
});

/// [`PREFIX_LIST_SQL`] over the ids `$3` (an array) instead of after an id.
static AMONG_LIST_SQL: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    PREFIX_LIST_SQL.replace(
        "AND t.trigger_id > coalesce($3::text, '')",
        "AND t.trigger_id = ANY ($3::text[])",
    )
});

/// At most `cap` trigger ids after `after` in id order, from `prefix` on (a string that
/// starts with a prefix never sorts before it), in `project` when given: the stretch a
/// filtered page searches, so a filter that matches few rows reads a bounded walk of the
/// primary key (or of `triggers_project_page_idx`), never the whole table.
pub async fn walk_ids(
    client: &impl tokio_postgres::GenericClient,
    project: Option<&str>,
    after: Option<&str>,
    prefix: Option<&str>,
    cap: i64,
) -> Result<Vec<String>, StoreError> {
    let rows = client
        .query(
            "SELECT t.trigger_id FROM qlsched.triggers t
              WHERE ($1::text IS NULL OR t.project_id = $1)
                AND t.trigger_id > coalesce($2::text, '') AND t.trigger_id >= coalesce($3::text, '')
              ORDER BY t.trigger_id LIMIT $4",
            &[&project, &after, &prefix, &cap],
        )
        .await?;
    Ok(rows.iter().map(|r| r.get(0)).collect())
}

/// [`list_with_prefix`] among `ids` (a stretch from [`walk_ids`]).
pub async fn list_among(
    client: &impl tokio_postgres::GenericClient,
    q: &ListQuery<'_>,
    ids: &[String],
    prefix: Option<&str>,
) -> Result<Vec<TriggerView>, StoreError> {
    let rows = client
        .query(
            AMONG_LIST_SQL.as_str(),
            &[&q.project, &q.state.as_str(), &ids, &q.limit, &prefix],
        )
        .await?;
    Ok(rows.iter().map(view).collect())
}

/// Like [`list`], only ids starting with `prefix` (when given).
pub async fn list_with_prefix(
    client: &impl tokio_postgres::GenericClient,
    q: &ListQuery<'_>,
    prefix: Option<&str>,
) -> Result<Vec<TriggerView>, StoreError> {
    let rows = client
        .query(
            PREFIX_LIST_SQL.as_str(),
            &[&q.project, &q.state.as_str(), &q.after, &q.limit, &prefix],
        )
        .await?;
    Ok(rows.iter().map(view).collect())
}

/// One page of live (not deleted) triggers in id order. Read-only, one statement.
pub async fn list(
    client: &impl tokio_postgres::GenericClient,
    q: &ListQuery<'_>,
) -> Result<Vec<TriggerView>, StoreError> {
    let rows = client
        .query(
            LIST_SQL,
            &[&q.project, &q.state.as_str(), &q.after, &q.limit],
        )
        .await?;
    Ok(rows.iter().map(view).collect())
}

/// One trigger, deleted ones included (`trigger show` says so). `UnknownTrigger` if the id
/// was never published.
pub async fn show(
    client: &impl tokio_postgres::GenericClient,
    id: &str,
) -> Result<TriggerView, ManageError> {
    let sql = format!(
        "WITH n AS MATERIALIZED (SELECT {} AS now_ms)
         SELECT {VIEW_COLUMNS}
           FROM qlsched.triggers t
           JOIN qlsched.trigger_schedules s ON s.trigger_id = t.trigger_id
           JOIN qlsched.projects p ON p.project_id = t.project_id
           LEFT JOIN qlsched.trigger_outcomes o ON o.trigger_id = t.trigger_id
           LEFT JOIN qlsched.trigger_overlap ov ON ov.trigger_id = t.trigger_id
           CROSS JOIN n
          WHERE t.trigger_id = $1",
        db_now_ms!()
    );
    match client.query_opt(&sql, &[&id]).await? {
        Some(r) => Ok(view(&r)),
        None => Err(ManageError::UnknownTrigger { id: id.into() }),
    }
}
