//! Management writes (admin role): projects, tasks with their pinned execution revision,
//! and trigger publishing. Each is one transaction.

use sha2::{Digest, Sha256};
use tokio_postgres::types::Type;
use uuid::Uuid;

use super::audit::{self, ObjectKind};
use crate::db::StoreError;
use crate::db_now_ms;
use crate::schedule::{
    min_gap, MisfirePolicy, Schedule, ScheduleError, Timing, DEFAULT_MISFIRE_GRACE_MS,
};
pub use crate::store::overlap::OverlapPolicy;

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// A project's status (`qlsched.projects.status`, V1's CHECK): only an active project's
/// triggers are claimed, admitted, run by hand or backfilled.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProjectStatus {
    Active,
    Suspended,
    Archived,
}

impl ProjectStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ProjectStatus::Active => "active",
            ProjectStatus::Suspended => "suspended",
            ProjectStatus::Archived => "archived",
        }
    }
}

impl std::fmt::Display for ProjectStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for ProjectStatus {
    type Err = String;
    fn from_str(s: &str) -> Result<ProjectStatus, String> {
        match s {
            "active" => Ok(ProjectStatus::Active),
            "suspended" => Ok(ProjectStatus::Suspended),
            "archived" => Ok(ProjectStatus::Archived),
            other => Err(format!("unknown project status `{other}`")),
        }
    }
}

impl<'a> tokio_postgres::types::FromSql<'a> for ProjectStatus {
    fn from_sql(
        ty: &tokio_postgres::types::Type,
        raw: &'a [u8],
    ) -> Result<ProjectStatus, Box<dyn std::error::Error + Sync + Send>> {
        Ok(<&str as tokio_postgres::types::FromSql>::from_sql(ty, raw)?.parse()?)
    }
    fn accepts(ty: &tokio_postgres::types::Type) -> bool {
        <&str as tokio_postgres::types::FromSql>::accepts(ty)
    }
}

/// Creates the project or changes its status. Schedules of a project that is not active
/// leave the claim index (claimable_at_ms NULL) and come back at their cursor when it is.
///
/// Locking: the project row is taken `FOR UPDATE` before its status is compared. A trigger
/// publish (or enable) holds the same row `FOR SHARE` from the moment it reads the status
/// until it commits its schedule row, so a status change either waits for that publish and
/// then sees (and fixes) its row, or makes the publish wait and read the new status. Only a
/// real change touches schedules: setting the status a project already has is a no-op and
/// never fences a live claim.
pub async fn set_project(
    client: &mut tokio_postgres::Client,
    project_id: &str,
    status: &str,
) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    set_project_in(&tx, project_id, status).await?;
    tx.commit().await?;
    Ok(())
}

/// [`set_project`] in the caller's transaction (`qlsched apply` writes its whole plan in
/// one); the caller commits.
pub async fn set_project_in(
    tx: &tokio_postgres::Transaction<'_>,
    project_id: &str,
    status: &str,
) -> Result<(), StoreError> {
    let created = tx
        .query_opt(
            concat!(
                "INSERT INTO qlsched.projects (project_id, status, created_at_ms, updated_at_ms)
                 VALUES ($1, $2, ",
                db_now_ms!(),
                ", ",
                db_now_ms!(),
                ") ON CONFLICT (project_id) DO NOTHING RETURNING true"
            ),
            &[&project_id, &status],
        )
        .await?
        .is_some();
    let current: String = tx
        .query_one(
            "SELECT status FROM qlsched.projects WHERE project_id = $1 FOR UPDATE",
            &[&project_id],
        )
        .await?
        .get(0);
    let before = match created {
        true => None,
        false => audit::snapshot(tx, ObjectKind::Project, project_id).await?,
    };
    if current == status {
        if created {
            audit::append_change(tx, ObjectKind::Project, project_id, "set", None, None).await?;
        }
        return Ok(());
    }
    tx.execute(
        concat!(
            "UPDATE qlsched.projects SET status = $2, updated_at_ms = ",
            db_now_ms!(),
            " WHERE project_id = $1"
        ),
        &[&project_id, &status],
    )
    .await?;
    // Suspending fences out every live claim of the project (its admissions can no longer
    // commit) and takes its rows out of the claim index; resuming puts them back at their
    // cursors.
    tx.execute(
        concat!(
            "UPDATE qlsched.trigger_schedules s
                SET claimable_at_ms = CASE WHEN $2 = 'active' AND t.enabled THEN ",
            claimable_at_sql!("s.trigger_id", "s.next_fire_at_ms"),
            " END,
                    ",
            fence_out_claim!(),
            "
               FROM qlsched.triggers t
              -- through triggers_project_idx and the schedule's primary key (V7)
              WHERE t.project_id = $1 AND s.trigger_id = t.trigger_id AND s.project_id = $1
                AND (s.claim_owner IS NOT NULL OR s.claimable_at_ms IS DISTINCT FROM
                     CASE WHEN $2 = 'active' AND t.enabled THEN ",
            claimable_at_sql!("s.trigger_id", "s.next_fire_at_ms"),
            " END)"
        ),
        &[&project_id, &status],
    )
    .await?;
    if status.parse() == Ok(ProjectStatus::Active) {
        // Resumed rows are claimable at their cursors (or pending): wake the replicas.
        super::wake::notify(tx, None).await?;
    }
    audit::append_change(
        tx,
        ObjectKind::Project,
        project_id,
        "set",
        before.as_ref(),
        None,
    )
    .await?;
    Ok(())
}

/// The database clock in Unix milliseconds.
pub async fn db_now(client: &impl tokio_postgres::GenericClient) -> Result<i64, StoreError> {
    Ok(client
        .query_one(concat!("SELECT ", db_now_ms!()), &[])
        .await?
        .get(0))
}

/// Creates or updates a task; a changed spec pins a new immutable execution revision and
/// bumps the task revision. Returns (task revision, execution revision id). A task stays in
/// the project it was first published in: publishing its id under another project is
/// refused (its execution revisions, and the triggers that run it, are that project's).
pub async fn publish_task(
    client: &mut tokio_postgres::Client,
    project_id: &str,
    task_id: &str,
    spec: &str,
) -> Result<(i64, Uuid), ManageError> {
    let tx = client.transaction().await?;
    let (revision, exec_id, _) = publish_task_in(&tx, project_id, task_id, spec).await?;
    tx.commit().await?;
    Ok((revision, exec_id))
}

/// [`publish_task`] in the caller's transaction; the caller commits. Returns (task
/// revision, execution revision id, whether anything was written).
pub async fn publish_task_in(
    tx: &tokio_postgres::Transaction<'_>,
    project_id: &str,
    task_id: &str,
    spec: &str,
) -> Result<(i64, Uuid, bool), ManageError> {
    let spec_digest = sha256_hex(spec.as_bytes());
    let content_digest = sha256_hex(format!("task:v1\n{project_id}\n{spec_digest}").as_bytes());
    let current = tx
        .query_opt(
            "SELECT revision, content_digest, execution_revision_id, project_id FROM qlsched.tasks
              WHERE task_id = $1 FOR UPDATE",
            &[&task_id],
        )
        .await?;
    if let Some(r) = &current {
        let task_project: String = r.get(3);
        if task_project != project_id {
            return Err(ManageError::TaskInOtherProject {
                task: task_id.into(),
                task_project,
                project: project_id.into(),
            });
        }
        if r.get::<_, String>(1) == content_digest {
            return Ok((r.get(0), r.get(2), false));
        }
    }
    let before = audit::snapshot(tx, ObjectKind::Task, task_id).await?;
    let exec_id = Uuid::new_v4();
    tx.execute(
        &format!(
            "INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
             VALUES ($1, $2, 'remote_worker', $3, $4, {})",
            db_now_ms!()
        ),
        &[&exec_id, &project_id, &spec, &spec_digest],
    )
    .await?;
    let revision: i64 = tx
        .query_one(
            &format!(
                "INSERT INTO qlsched.tasks (task_id, project_id, revision, content_digest, execution_revision_id, updated_at_ms)
                 VALUES ($1, $2, 1, $3, $4, {})
                 ON CONFLICT (task_id) DO UPDATE
                   SET revision = qlsched.tasks.revision + 1, content_digest = EXCLUDED.content_digest,
                       execution_revision_id = EXCLUDED.execution_revision_id, updated_at_ms = EXCLUDED.updated_at_ms
                 RETURNING revision",
                db_now_ms!()
            ),
            &[&task_id, &project_id, &content_digest, &exec_id],
        )
        .await?
        .get(0);
    audit::append_change(
        tx,
        ObjectKind::Task,
        task_id,
        "publish",
        before.as_ref(),
        None,
    )
    .await?;
    Ok((revision, exec_id, true))
}

/// What an operator publishes for a cron trigger.
#[derive(Clone, Debug)]
pub struct TriggerSpec {
    pub trigger_id: String,
    pub project_id: String,
    pub task_id: String,
    pub cron_expr: String,
    pub timezone: String,
    pub misfire_policy: MisfirePolicy,
    pub misfire_grace_ms: i64,
    pub enabled: bool,
    /// Jitter (ms, 0 = none) and validity window (docs/policies-jitter.md).
    pub jitter_ms: i64,
    pub start_at_ms: Option<i64>,
    pub end_at_ms: Option<i64>,
    /// Pause after failures and expected success (docs/policies-outcome.md).
    pub outcome_policy: OutcomePolicy,
    /// What an occurrence due while a run of the trigger is unfinished does (V21).
    pub overlap_policy: OverlapPolicy,
}

/// The outcome policies of a trigger (`--pause-after-failures`, `--expect-success-within`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OutcomePolicy {
    /// Disable the trigger (by `qlsched`) after this many consecutive failed runs.
    pub pause_after_failures: Option<i32>,
    /// Overdue when no run succeeded within this long of it starting to run or its last success.
    pub expect_success_within_ms: Option<i64>,
}

/// Bounds of [`OutcomePolicy`], checked at publish and by the table's CHECKs (V19).
pub const PAUSE_AFTER_FAILURES: std::ops::RangeInclusive<i32> = 1..=1000;
pub const EXPECT_SUCCESS_WITHIN_MS: std::ops::RangeInclusive<i64> = 60_000..=31_622_400_000;

impl OutcomePolicy {
    /// What the policies add to the trigger's content digest: nothing when neither is set,
    /// so a trigger published before them keeps its digest (a republish is a no-op).
    fn digest_suffix(&self) -> String {
        let mut s = String::new();
        if let Some(n) = self.pause_after_failures {
            s.push_str(&format!("\npause_after_failures={n}"));
        }
        if let Some(ms) = self.expect_success_within_ms {
            s.push_str(&format!("\nexpect_success_within_ms={ms}"));
        }
        s
    }
}

impl TriggerSpec {
    pub fn new(
        trigger_id: &str,
        project_id: &str,
        task_id: &str,
        cron_expr: &str,
        timezone: &str,
    ) -> Self {
        TriggerSpec {
            trigger_id: trigger_id.into(),
            project_id: project_id.into(),
            task_id: task_id.into(),
            cron_expr: cron_expr.into(),
            timezone: timezone.into(),
            misfire_policy: MisfirePolicy::Skip,
            misfire_grace_ms: DEFAULT_MISFIRE_GRACE_MS,
            enabled: true,
            jitter_ms: 0,
            start_at_ms: None,
            end_at_ms: None,
            outcome_policy: OutcomePolicy::default(),
            overlap_policy: OverlapPolicy::Allow,
        }
    }

    /// The trigger's jitter and window.
    pub fn timing(&self) -> Timing<'_> {
        Timing {
            trigger_id: &self.trigger_id,
            jitter_ms: self.jitter_ms,
            start_at_ms: self.start_at_ms,
            end_at_ms: self.end_at_ms,
        }
    }

    /// The digest of the definition. A policy at its default adds nothing to the digested
    /// text, so a trigger published before the policy existed keeps its digest (an unchanged
    /// publish stays a no-op); a set one is a line of its own.
    pub fn content_digest(&self) -> String {
        let mut text = format!(
            "trigger:v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
            self.project_id,
            self.task_id,
            self.cron_expr,
            self.timezone,
            self.misfire_policy.as_str(),
            self.misfire_grace_ms,
            self.enabled
        );
        if self.jitter_ms > 0 {
            text.push_str(&format!("\njitter_ms={}", self.jitter_ms));
        }
        if let Some(at) = self.start_at_ms {
            text.push_str(&format!("\nstart_at_ms={at}"));
        }
        if let Some(at) = self.end_at_ms {
            text.push_str(&format!("\nend_at_ms={at}"));
        }
        text.push_str(&self.outcome_policy.digest_suffix());
        // Only a policy other than allow joins the text: every digest published before V21
        // (allow) stays the same, so republishing it is still a no-op.
        if self.overlap_policy != OverlapPolicy::Allow {
            text.push_str(&format!("\noverlap:{}", self.overlap_policy.as_str()));
        }
        sha256_hex(text.as_bytes())
    }
}

/// Result of a publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub revision: i64,
    pub changed: bool,
}

/// Why a management command refused, or failed. Each variant names the object at fault.
#[derive(Debug, thiserror::Error)]
pub enum ManageError {
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The expression or zone does not parse.
    #[error("trigger {id}: {source}")]
    Definition { id: String, source: ScheduleError },
    /// The expression's last occurrence is already past (e.g. a 7-field year gone by).
    #[error("trigger {id}: the expression `{expr}` has no occurrence after now in {zone}; it would never fire")]
    NeverFiresAgain {
        id: String,
        expr: String,
        zone: String,
    },
    #[error("trigger {id}: misfire grace {grace_ms} ms must be within 0..=86400000")]
    MisfireGrace { id: String, grace_ms: i64 },
    #[error(
        "trigger {id}: --pause-after-failures {n} must be within 1..=1000 consecutive failed runs"
    )]
    PauseAfterFailures { id: String, n: i32 },
    #[error("trigger {id}: --expect-success-within {ms} ms must be within 1 minute..=366 days (60000..=31622400000 ms)")]
    ExpectSuccessWithin { id: String, ms: i64 },
    #[error("trigger {id}: jitter {jitter_ms} ms must be within 0..=86400000")]
    JitterBound { id: String, jitter_ms: i64 },
    /// The jitter is not shorter than the shortest gap between two consecutive occurrences.
    #[error(
        "trigger {id}: jitter {jitter_ms} ms must be shorter than the shortest gap between two \
         consecutive occurrences, {gap_ms} ms (after the occurrence at {after}); nothing was \
         written"
    )]
    JitterTooLong {
        id: String,
        jitter_ms: i64,
        gap_ms: i64,
        /// The earlier occurrence of the shortest pair, in RFC 3339 (UTC).
        after: String,
    },
    #[error(
        "trigger {id}: the window's start {start_at_ms} ms must be before its end {end_at_ms} ms"
    )]
    Window {
        id: String,
        start_at_ms: i64,
        end_at_ms: i64,
    },
    #[error("unknown project `{id}`")]
    UnknownProject { id: String },
    #[error("unknown trigger `{id}`")]
    UnknownTrigger { id: String },
    /// A deleted trigger id stays taken: its runs still reference it.
    #[error("trigger {id} was deleted; a deleted trigger id is never reused")]
    Deleted { id: String },
    #[error("trigger {id} is disabled; enable it first (`qlsched trigger enable {id}`)")]
    Disabled { id: String },
    #[error("trigger {id}: project {project} is {status}, not active")]
    ProjectInactive {
        id: String,
        project: String,
        status: ProjectStatus,
    },
    /// The trigger was republished while a multi-transaction command was running.
    #[error("trigger {id} changed to revision {now} while the command ran (started at revision {was}); nothing more was written")]
    RevisionChanged { id: String, was: i64, now: i64 },
    /// `runs prune` raised the horizon past the occurrences of a backfill still running.
    #[error("trigger {id}: the horizon moved to {horizon} while the backfill ran (`runs prune`): the runs of earlier occurrences may be gone, so admitting them could admit them twice; nothing more was written")]
    HorizonMoved { id: String, horizon: String },
    /// The task's pinned execution revision is missing or its digest does not match.
    #[error(
        "trigger {id}: the task's execution revision is missing or corrupt; nothing was written"
    )]
    CorruptExecutionRevision { id: String },
    /// `trigger fire` while a run of the trigger is unfinished, under forbid or buffer_one.
    #[error("trigger {id}: a run of the trigger is unfinished; {}", if *buffered { "kept by overlap policy buffer_one: admitted when that run ends" } else { "not admitted by its overlap policy, recorded as a skip (reason overlap); `--overlap allow` fires anyway" })]
    Overlap { id: String, buffered: bool },
    #[error("unknown task `{id}` (publish it first: `qlsched task publish --project P --id {id} --spec ...`)")]
    UnknownTask { id: String },
    /// A task belongs to the project it was first published in; a trigger must be in it too.
    #[error("task {task} belongs to project {task_project}, not {project}; nothing was written")]
    TaskInOtherProject {
        task: String,
        task_project: String,
        project: String,
    },
    /// `trigger enable` of a trigger its publisher disabled: only a publish turns it on.
    #[error(
        "trigger {id} was published disabled; `trigger enable` only withdraws an operator's \
         disable: publish it without --disabled to start it; nothing was written"
    )]
    PublishedDisabled { id: String },
}

impl From<tokio_postgres::Error> for ManageError {
    fn from(e: tokio_postgres::Error) -> Self {
        ManageError::Store(StoreError::Db(e))
    }
}

/// Upserts the trigger and its schedule row in one transaction. The expression and zone are
/// validated first, and an expression with no occurrence after now (database clock) is
/// refused (nothing is written for either), as is a task of another project. A changed
/// definition is a new revision: any claim is cleared and `state_version` and
/// `claim_version` bumped, so no claim taken under an older revision can ever commit, and
/// the cursor is set to the first occurrence after this transaction's clock reading — so an
/// occurrence that falls due between the publish and the first claim is admitted, not
/// skipped. The publisher's `enabled` and an operator's `trigger disable` are separate
/// switches (docs/design.md, "Who turns a trigger on and off"); a deleted trigger id is
/// refused.
///
/// The first cursor is never at or before an instant already admitted under any revision
/// (see [`lock_cursor_floor`]): a republish racing an admission, or a database clock that
/// stepped back, cannot admit an instant twice under two revisions' keys.
///
/// Locking: the trigger row `FOR UPDATE` (one publish at a time per trigger, serialised
/// with disable/enable/delete), then the project row `FOR SHARE` while the status decides
/// `claimable_at_ms` and until commit, so a concurrent `project set` cannot change the status
/// between that read and this schedule row becoming visible (see [`set_project`]); the task
/// row `FOR SHARE` while its project is compared; then the schedule row `FOR UPDATE`
/// *before* the clock is read (see [`lock_cursor_floor`]).
pub async fn publish_trigger(
    client: &mut tokio_postgres::Client,
    spec: &TriggerSpec,
) -> Result<Published, ManageError> {
    let tx = client.transaction().await?;
    let published = publish_trigger_in(&tx, spec, None).await?;
    tx.commit().await?;
    Ok(published)
}

/// [`publish_trigger`] in the caller's transaction; the caller commits. `source`: the
/// `qlsched apply` source label the trigger is to carry (V23); `None` leaves the label as it
/// is (a `trigger publish` never changes who owns a trigger). A changed label alone is no
/// new revision: the row's `source_label` is set, nothing is fenced, nobody is woken.
pub async fn publish_trigger_in(
    tx: &tokio_postgres::Transaction<'_>,
    spec: &TriggerSpec,
    source: Option<&str>,
) -> Result<Published, ManageError> {
    let id = &spec.trigger_id;
    let schedule = validate(spec)?;
    let digest = spec.content_digest();
    // The reads and locks of a publish are typed queries: one round trip each instead of a
    // prepare and an execute (`qlsched apply` runs them for every trigger it changes).
    let current = tx
        .query_typed_opt(
            "SELECT revision, content_digest, deleted_at_ms IS NOT NULL, published_enabled,
                    source_label
               FROM qlsched.triggers WHERE trigger_id = $1 FOR UPDATE",
            &[(id, Type::TEXT)],
        )
        .await?;
    if let Some(r) = &current {
        if r.get::<_, bool>(2) {
            return Err(ManageError::Deleted { id: id.clone() });
        }
    }
    let before = audit::snapshot(tx, ObjectKind::Trigger, id).await?;
    let project_active = lock_project_status(tx, &spec.project_id).await? == ProjectStatus::Active;
    lock_task_in_project(tx, &spec.task_id, &spec.project_id).await?;
    let floor = lock_cursor_floor(tx, id).await?;
    let now = db_now(tx).await?;
    let Some(first) = floor.first(&schedule, now, spec.start_at_ms) else {
        return Err(ManageError::NeverFiresAgain {
            id: id.clone(),
            expr: spec.cron_expr.clone(),
            zone: spec.timezone.clone(),
        });
    };
    check_jitter(spec, &schedule, first)?;
    if let Some(r) = &current {
        // The digest encodes the publisher's `enabled`; comparing the column as well catches
        // a row an operator enabled against a publish-disabled definition before V8.
        if r.get::<_, String>(1) == digest && r.get::<_, bool>(3) == spec.enabled {
            let revision = r.get(0);
            let label: Option<String> = r.get(4);
            if let Some(source) = source.filter(|s| label.as_deref() != Some(*s)) {
                // Only the owner changes (`qlsched apply --adopt`): no revision, no fence.
                tx.execute(
                    "UPDATE qlsched.triggers SET source_label = $2 WHERE trigger_id = $1",
                    &[id, &source],
                )
                .await?;
                audit::append_change(tx, ObjectKind::Trigger, id, "adopt", before.as_ref(), None)
                    .await?;
            }
            return Ok(Published {
                revision,
                changed: false,
            });
        }
    }
    let (revision, enabled) = upsert_trigger(tx, spec, &digest, source).await?;
    super::overlap::set_policy(tx, id, spec.overlap_policy).await?;
    let claimable = enabled && project_active;
    let claimable_at = spec.timing().claimable_at_ms(first).filter(|_| claimable);
    upsert_schedule(tx, spec, revision, claimable_at, first).await?;
    if let Some(first) = claimable_at {
        // Wake the replicas for the first occurrence (delivered at commit).
        super::wake::notify(tx, Some(first)).await?;
    }
    audit::append_change(
        tx,
        ObjectKind::Trigger,
        id,
        "publish",
        before.as_ref(),
        None,
    )
    .await?;
    Ok(Published {
        revision,
        changed: true,
    })
}

/// Writes the trigger row of a new revision (the first, or the next): the publisher's
/// switch as given, the running state as both switches allow. Returns (revision, enabled).
async fn upsert_trigger(
    tx: &tokio_postgres::Transaction<'_>,
    spec: &TriggerSpec,
    digest: &str,
    source: Option<&str>,
) -> Result<(i64, bool), ManageError> {
    let id = &spec.trigger_id;
    let row = tx
        .query_one(
            concat!(
                "INSERT INTO qlsched.triggers (trigger_id, project_id, task_id, revision, kind, enabled, published_enabled,
                                               cron_expr, timezone, misfire_policy, misfire_grace_ms, content_digest,
                                               pause_after_failures, expect_success_within_ms, jitter_ms, start_at_ms, end_at_ms,
                                               source_label, updated_at_ms)
                 VALUES ($1, $2, $3, 1, 'cron', $4, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, ",
                db_now_ms!(),
                ")
                 ON CONFLICT (trigger_id) DO UPDATE
                   SET project_id = EXCLUDED.project_id, task_id = EXCLUDED.task_id,
                       revision = qlsched.triggers.revision + 1,
                       published_enabled = EXCLUDED.published_enabled,
                       enabled = EXCLUDED.published_enabled AND NOT qlsched.triggers.operator_disabled,
                       cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone,
                       misfire_policy = EXCLUDED.misfire_policy, misfire_grace_ms = EXCLUDED.misfire_grace_ms,
                       content_digest = EXCLUDED.content_digest, updated_at_ms = EXCLUDED.updated_at_ms,
                       pause_after_failures = EXCLUDED.pause_after_failures,
                       expect_success_within_ms = EXCLUDED.expect_success_within_ms,
                       jitter_ms = EXCLUDED.jitter_ms,
                       start_at_ms = EXCLUDED.start_at_ms, end_at_ms = EXCLUDED.end_at_ms,
                       source_label = coalesce(EXCLUDED.source_label, qlsched.triggers.source_label)
                 RETURNING revision, enabled"
            ),
            &[
                id,
                &spec.project_id,
                &spec.task_id,
                &spec.enabled,
                &spec.cron_expr,
                &spec.timezone,
                &spec.misfire_policy.as_str(),
                &spec.misfire_grace_ms,
                &digest,
                &spec.outcome_policy.pause_after_failures,
                &spec.outcome_policy.expect_success_within_ms,
                &spec.jitter_ms,
                &spec.start_at_ms,
                &spec.end_at_ms,
                &source,
            ],
        )
        .await?;
    Ok((row.get(0), row.get(1)))
}

/// The task exists and is in `project_id`, its row held `FOR SHARE` until the transaction
/// ends. A trigger whose task is in another project could never be admitted (the admission
/// requires one project for trigger, task and execution revision): refused here instead.
async fn lock_task_in_project(
    tx: &tokio_postgres::Transaction<'_>,
    task_id: &str,
    project_id: &str,
) -> Result<(), ManageError> {
    let row = tx
        .query_typed_opt(
            "SELECT project_id FROM qlsched.tasks WHERE task_id = $1 FOR SHARE",
            &[(&task_id, Type::TEXT)],
        )
        .await?;
    match row {
        None => Err(ManageError::UnknownTask { id: task_id.into() }),
        Some(r) if r.get::<_, &str>(0) != project_id => Err(ManageError::TaskInOtherProject {
            task: task_id.into(),
            task_project: r.get(0),
            project: project_id.into(),
        }),
        Some(_) => Ok(()),
    }
}

/// The expression and zone parse, and the misfire grace is in bounds.
fn validate(spec: &TriggerSpec) -> Result<Schedule, ManageError> {
    let id = &spec.trigger_id;
    let schedule = Schedule::parse(&spec.cron_expr, &spec.timezone).map_err(|source| {
        ManageError::Definition {
            id: id.clone(),
            source,
        }
    })?;
    if !(0..=86_400_000).contains(&spec.misfire_grace_ms) {
        return Err(ManageError::MisfireGrace {
            id: id.clone(),
            grace_ms: spec.misfire_grace_ms,
        });
    }
    let p = spec.outcome_policy;
    if let Some(n) = p
        .pause_after_failures
        .filter(|n| !PAUSE_AFTER_FAILURES.contains(n))
    {
        return Err(ManageError::PauseAfterFailures { id: id.clone(), n });
    }
    if let Some(ms) = p
        .expect_success_within_ms
        .filter(|ms| !EXPECT_SUCCESS_WITHIN_MS.contains(ms))
    {
        return Err(ManageError::ExpectSuccessWithin { id: id.clone(), ms });
    }
    if !(0..=MAX_JITTER_MS).contains(&spec.jitter_ms) {
        return Err(ManageError::JitterBound {
            id: id.clone(),
            jitter_ms: spec.jitter_ms,
        });
    }
    if let (Some(start), Some(end)) = (spec.start_at_ms, spec.end_at_ms) {
        if start >= end {
            return Err(ManageError::Window {
                id: id.clone(),
                start_at_ms: start,
                end_at_ms: end,
            });
        }
    }
    Ok(schedule)
}

/// The largest jitter a trigger may have: a day.
pub const MAX_JITTER_MS: i64 = 86_400_000;

/// A jitter must be shorter than the shortest gap between two consecutive occurrences from
/// the first cursor on, within the window (`schedule::min_gap`, its horizon and bound
/// documented there): otherwise an occurrence could fall due after the next one.
fn check_jitter(spec: &TriggerSpec, schedule: &Schedule, first: i64) -> Result<(), ManageError> {
    if spec.jitter_ms == 0 {
        return Ok(());
    }
    match min_gap(schedule, first - 1, spec.end_at_ms, spec.jitter_ms) {
        Some(gap) if gap.gap_ms <= spec.jitter_ms => Err(ManageError::JitterTooLong {
            id: spec.trigger_id.clone(),
            jitter_ms: spec.jitter_ms,
            gap_ms: gap.gap_ms,
            after: chrono::DateTime::from_timestamp_millis(gap.after_ms)
                .map_or_else(|| format!("{} ms", gap.after_ms), |t| t.to_rfc3339()),
        }),
        _ => Ok(()),
    }
}

/// Creates the schedule row of a new revision, or resets an existing one to it: the cursor
/// at `first` (claimable at `claimable_at`: its jittered instant, or NULL while disabled, in
/// an inactive project or past the window's end), the claim cleared, versions bumped.
async fn upsert_schedule(
    tx: &tokio_postgres::Transaction<'_>,
    spec: &TriggerSpec,
    revision: i64,
    claimable_at: Option<i64>,
    first: i64,
) -> Result<(), ManageError> {
    let id = &spec.trigger_id;
    tx.execute(
        concat!(
            "INSERT INTO qlsched.trigger_schedules AS s (trigger_id, project_id, trigger_revision, next_fire_at_ms,
                                                         claimable_at_ms, updated_at_ms)
             VALUES ($1, $2, $3, $5, $4, ",
            db_now_ms!(),
            ")
             ON CONFLICT (trigger_id) DO UPDATE
               SET project_id = EXCLUDED.project_id, trigger_revision = EXCLUDED.trigger_revision,
                   next_fire_at_ms = EXCLUDED.next_fire_at_ms, last_scheduled_at_ms = NULL,
                   admitted_through_ms = greatest(s.admitted_through_ms, s.last_scheduled_at_ms),
                   claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                   claim_version = s.claim_version + 1, state_version = s.state_version + 1,
                   claimable_at_ms = EXCLUDED.claimable_at_ms, updated_at_ms = EXCLUDED.updated_at_ms"
        ),
        &[id, &spec.project_id, &revision, &claimable_at, &first],
    )
    .await?;
    Ok(())
}

/// What a new first cursor must respect, read with the trigger's schedule row locked (see
/// [`lock_cursor_floor`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct CursorFloor {
    /// The latest instant ever admitted for the trigger by a cron admission or a backfill,
    /// under any revision: the schedule's `admitted_through_ms` (V14; raised by every cron
    /// admission, never cleared), its `last_scheduled_at_ms` (also set by binaries before
    /// V14) and the latest cron-keyed run (a backfill's runs). `None`: nothing yet.
    pub admitted_through_ms: Option<i64>,
    /// The cursor of a live row (claimable: enabled, project active): an occurrence that is
    /// due but not admitted yet is still owed when the definition changes under it.
    pub live_cursor_ms: Option<i64>,
}

impl CursorFloor {
    /// The first cursor of a new revision of `schedule` (or of an enable), `now` being the
    /// database clock read after the lock: the first occurrence strictly after the clock —
    /// or at or after a live row's cursor that is due and not admitted yet — and always
    /// strictly after every instant already admitted. An enable finds no live cursor (a
    /// disabled row is not claimable), so a disabled span is never replayed. Never before the
    /// trigger's `start_at_ms` (an occurrence at the start itself is in the window).
    pub fn first(&self, schedule: &Schedule, now: i64, start_at_ms: Option<i64>) -> Option<i64> {
        let from = match self.live_cursor_ms {
            Some(c) if c <= now => c - 1,
            _ => now,
        };
        let from = from.max(self.admitted_through_ms.unwrap_or(i64::MIN));
        schedule.next_after_ms(start_at_ms.map_or(from, |start| from.max(start - 1)))
    }
}

/// Locks the trigger's schedule row (if it has one) and reads its [`CursorFloor`].
///
/// Locking: the schedule row `FOR UPDATE`, taken before the caller reads the clock and held
/// until it commits. An admission that committed before the lock is seen here (its
/// instant is in the floor); one still running holds the row and we wait for it; one that
/// comes later waits for our commit and then fails its fence (a serialization failure or a
/// changed `state_version`), so it never admits under the old revision an instant our new
/// cursor also covers. Without the lock, an admission could commit between our clock read
/// and our schedule write, and the new revision would admit the same instant again.
pub(crate) async fn lock_cursor_floor(
    tx: &tokio_postgres::Transaction<'_>,
    trigger_id: &str,
) -> Result<CursorFloor, ManageError> {
    let row = tx
        .query_typed_opt(
            "SELECT greatest(s.admitted_through_ms, s.last_scheduled_at_ms,
                             (SELECT max(r.scheduled_for_ms) FROM qlsched.runs r
                               WHERE r.trigger_id = s.trigger_id
                                 AND r.idempotency_key LIKE 'ql3:cron:%')),
                    CASE WHEN s.claimable_at_ms IS NOT NULL THEN s.next_fire_at_ms END
               FROM qlsched.trigger_schedules s WHERE s.trigger_id = $1
                FOR UPDATE OF s",
            &[(&trigger_id, Type::TEXT)],
        )
        .await?;
    Ok(row
        .map(|r| CursorFloor {
            admitted_through_ms: r.get(0),
            live_cursor_ms: r.get(1),
        })
        .unwrap_or_default())
}

/// The project's status, with its row held `FOR SHARE` until the transaction ends (a
/// status change waits for us; see [`set_project`]).
pub(crate) async fn lock_project_status(
    tx: &tokio_postgres::Transaction<'_>,
    project_id: &str,
) -> Result<ProjectStatus, ManageError> {
    match tx
        .query_typed_opt(
            "SELECT status FROM qlsched.projects WHERE project_id = $1 FOR SHARE",
            &[(&project_id, Type::TEXT)],
        )
        .await?
    {
        Some(r) => Ok(r.get(0)),
        None => Err(ManageError::UnknownProject {
            id: project_id.to_string(),
        }),
    }
}
