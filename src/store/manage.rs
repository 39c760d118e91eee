//! Management writes (admin role): projects, tasks with their pinned execution revision,
//! and trigger publishing. Each is one transaction.

use sha2::{Digest, Sha256};
use uuid::Uuid;

use super::StoreError;
use crate::schedule::{MisfirePolicy, Schedule, DEFAULT_MISFIRE_GRACE_MS};

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

const NOW: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Creates the project or changes its status. Schedules of a project that is not active
/// leave the claim index (claimable_at_ms NULL) and come back at their cursor when it is.
pub async fn set_project(
    client: &mut tokio_postgres::Client,
    project_id: &str,
    status: &str,
) -> Result<(), StoreError> {
    let tx = client.transaction().await?;
    tx.execute(
        &format!(
            "INSERT INTO qlsched.projects (project_id, status, created_at_ms, updated_at_ms)
             VALUES ($1, $2, {NOW}, {NOW})
             ON CONFLICT (project_id) DO UPDATE SET status = EXCLUDED.status, updated_at_ms = EXCLUDED.updated_at_ms"
        ),
        &[&project_id, &status],
    )
    .await?;
    // Suspending fences out every live claim of the project (its admissions can no longer
    // commit) and takes its rows out of the claim index; resuming puts them back at their
    // cursors.
    tx.execute(
        &format!(
            "UPDATE qlsched.trigger_schedules s
                SET claimable_at_ms = CASE WHEN $2 = 'active' AND t.enabled THEN coalesce(s.next_fire_at_ms, 0) END,
                    claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                    claim_version = s.claim_version + CASE WHEN s.claim_owner IS NULL THEN 0 ELSE 1 END,
                    state_version = s.state_version + 1, updated_at_ms = {NOW}
               FROM qlsched.triggers t
              WHERE s.project_id = $1 AND t.trigger_id = s.trigger_id
                AND (s.claim_owner IS NOT NULL OR s.claimable_at_ms IS DISTINCT FROM
                     CASE WHEN $2 = 'active' AND t.enabled THEN coalesce(s.next_fire_at_ms, 0) END)"
        ),
        &[&project_id, &status],
    )
    .await?;
    tx.commit().await?;
    Ok(())
}

/// Creates or updates a task; a changed spec pins a new immutable execution revision and
/// bumps the task revision. Returns (task revision, execution revision id).
pub async fn publish_task(
    client: &mut tokio_postgres::Client,
    project_id: &str,
    task_id: &str,
    spec: &str,
) -> Result<(i64, Uuid), StoreError> {
    let tx = client.transaction().await?;
    let spec_digest = sha256_hex(spec.as_bytes());
    let content_digest = sha256_hex(format!("task:v1\n{project_id}\n{spec_digest}").as_bytes());
    let current = tx
        .query_opt(
            "SELECT revision, content_digest, execution_revision_id FROM qlsched.tasks WHERE task_id = $1 FOR UPDATE",
            &[&task_id],
        )
        .await?;
    if let Some(r) = &current {
        if r.get::<_, String>(1) == content_digest {
            let out = (r.get(0), r.get(2));
            tx.commit().await?;
            return Ok(out);
        }
    }
    let exec_id = Uuid::new_v4();
    tx.execute(
        &format!(
            "INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
             VALUES ($1, $2, 'remote_worker', $3, $4, {NOW})"
        ),
        &[&exec_id, &project_id, &spec, &spec_digest],
    )
    .await?;
    let revision: i64 = tx
        .query_one(
            &format!(
                "INSERT INTO qlsched.tasks (task_id, project_id, revision, content_digest, execution_revision_id, updated_at_ms)
                 VALUES ($1, $2, 1, $3, $4, {NOW})
                 ON CONFLICT (task_id) DO UPDATE
                   SET revision = qlsched.tasks.revision + 1, content_digest = EXCLUDED.content_digest,
                       execution_revision_id = EXCLUDED.execution_revision_id, updated_at_ms = EXCLUDED.updated_at_ms
                 RETURNING revision"
            ),
            &[&task_id, &project_id, &content_digest, &exec_id],
        )
        .await?
        .get(0);
    tx.commit().await?;
    Ok((revision, exec_id))
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
        }
    }

    pub fn content_digest(&self) -> String {
        sha256_hex(
            format!(
                "trigger:v1\n{}\n{}\n{}\n{}\n{}\n{}\n{}",
                self.project_id,
                self.task_id,
                self.cron_expr,
                self.timezone,
                self.misfire_policy.as_str(),
                self.misfire_grace_ms,
                self.enabled
            )
            .as_bytes(),
        )
    }
}

/// Result of a publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Published {
    pub revision: i64,
    pub changed: bool,
}

/// Upserts the trigger and its schedule row in one transaction. The expression and zone are
/// validated first (nothing is written for a bad one). A changed definition is a new
/// revision: the cursor and any claim are cleared and `state_version` and `claim_version`
/// bumped, so no claim taken under an older revision can ever commit.
pub async fn publish_trigger(
    client: &mut tokio_postgres::Client,
    spec: &TriggerSpec,
) -> Result<Published, StoreError> {
    Schedule::parse(&spec.cron_expr, &spec.timezone)
        .map_err(|e| StoreError::Invalid(format!("trigger {}: {e}", spec.trigger_id)))?;
    if !(0..=86_400_000).contains(&spec.misfire_grace_ms) {
        return Err(StoreError::Invalid(format!(
            "trigger {}: misfire grace {} ms must be within 0..=86400000",
            spec.trigger_id, spec.misfire_grace_ms
        )));
    }
    let digest = spec.content_digest();
    let tx = client.transaction().await?;
    let current = tx
        .query_opt("SELECT revision, content_digest FROM qlsched.triggers WHERE trigger_id = $1 FOR UPDATE", &[&spec.trigger_id])
        .await?;
    if let Some(r) = &current {
        if r.get::<_, String>(1) == digest {
            let revision = r.get(0);
            tx.commit().await?;
            return Ok(Published {
                revision,
                changed: false,
            });
        }
    }
    let revision: i64 = tx
        .query_one(
            &format!(
                "INSERT INTO qlsched.triggers (trigger_id, project_id, task_id, revision, kind, enabled, cron_expr,
                                               timezone, misfire_policy, misfire_grace_ms, content_digest, updated_at_ms)
                 VALUES ($1, $2, $3, 1, 'cron', $4, $5, $6, $7, $8, $9, {NOW})
                 ON CONFLICT (trigger_id) DO UPDATE
                   SET project_id = EXCLUDED.project_id, task_id = EXCLUDED.task_id,
                       revision = qlsched.triggers.revision + 1, enabled = EXCLUDED.enabled,
                       cron_expr = EXCLUDED.cron_expr, timezone = EXCLUDED.timezone,
                       misfire_policy = EXCLUDED.misfire_policy, misfire_grace_ms = EXCLUDED.misfire_grace_ms,
                       content_digest = EXCLUDED.content_digest, updated_at_ms = EXCLUDED.updated_at_ms
                 RETURNING revision"
            ),
            &[
                &spec.trigger_id,
                &spec.project_id,
                &spec.task_id,
                &spec.enabled,
                &spec.cron_expr,
                &spec.timezone,
                &spec.misfire_policy.as_str(),
                &spec.misfire_grace_ms,
                &digest,
            ],
        )
        .await?
        .get(0);
    tx.execute(
        &format!(
            "INSERT INTO qlsched.trigger_schedules AS s (trigger_id, project_id, trigger_revision, claimable_at_ms, updated_at_ms)
             SELECT $1, $2, $3, CASE WHEN $4 AND p.status = 'active' THEN 0 END, {NOW}
               FROM qlsched.projects p WHERE p.project_id = $2
             ON CONFLICT (trigger_id) DO UPDATE
               SET project_id = EXCLUDED.project_id, trigger_revision = EXCLUDED.trigger_revision,
                   next_fire_at_ms = NULL, last_scheduled_at_ms = NULL,
                   claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                   claim_version = s.claim_version + 1, state_version = s.state_version + 1,
                   claimable_at_ms = EXCLUDED.claimable_at_ms, updated_at_ms = EXCLUDED.updated_at_ms"
        ),
        &[&spec.trigger_id, &spec.project_id, &revision, &spec.enabled],
    )
    .await?;
    if spec.enabled {
        // The new revision needs its first cursor now: wake the replicas.
        super::wake::notify(&tx, None).await?;
    }
    tx.commit().await?;
    Ok(Published {
        revision,
        changed: true,
    })
}
