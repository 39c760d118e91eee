//! The definitions as stored, for `qlsched apply`'s plan and `qlsched export`
//! (src/apply/): projects, tasks with their pinned spec, triggers with every publish option
//! and both switches. One snapshot (a read-only REPEATABLE READ transaction), so the three
//! reads agree; plain reads, no locks.

use crate::db::StoreError;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredProject {
    pub id: String,
    pub status: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTask {
    pub id: String,
    pub project: String,
    /// The spec of the pinned execution revision, as published.
    pub spec: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoredTrigger {
    pub id: String,
    pub project: String,
    pub task: String,
    pub cron: String,
    pub tz: String,
    pub misfire: String,
    pub grace_ms: i64,
    /// Jitter (0: none) and validity window, in ms (V20).
    pub jitter_ms: i64,
    pub start_at_ms: Option<i64>,
    pub end_at_ms: Option<i64>,
    /// The outcome policies (V19; None: not set).
    pub pause_after_failures: Option<i32>,
    pub expect_success_within_ms: Option<i64>,
    /// allow, forbid, buffer_one or replace (V21).
    pub overlap: String,
    /// The publisher's switch (`--disabled` not given).
    pub published_enabled: bool,
    /// An operator's `trigger disable` in force (never drift: apply reports it).
    pub operator_disabled: bool,
    pub deleted: bool,
}

/// Everything stored, or one project's.
#[derive(Clone, Debug, Default)]
pub struct Stored {
    pub projects: Vec<StoredProject>,
    pub tasks: Vec<StoredTask>,
    pub triggers: Vec<StoredTrigger>,
}

/// Reads every project, task and trigger (deleted triggers included: their ids stay taken),
/// or those of `project`, in id order.
pub async fn read(
    client: &mut tokio_postgres::Client,
    project: Option<&str>,
) -> Result<Stored, StoreError> {
    let tx = super::snapshot(client).await?;
    let projects = tx
        .query(
            "SELECT project_id, status FROM qlsched.projects
              WHERE $1::text IS NULL OR project_id = $1 ORDER BY project_id",
            &[&project],
        )
        .await?
        .iter()
        .map(|r| StoredProject {
            id: r.get(0),
            status: r.get(1),
        })
        .collect();
    let tasks = tx
        .query(
            "SELECT k.task_id, k.project_id, e.spec FROM qlsched.tasks k
               JOIN qlsched.execution_revisions e ON e.execution_revision_id = k.execution_revision_id
              WHERE $1::text IS NULL OR k.project_id = $1 ORDER BY k.task_id",
            &[&project],
        )
        .await?
        .iter()
        .map(|r| StoredTask {
            id: r.get(0),
            project: r.get(1),
            spec: r.get(2),
        })
        .collect();
    let triggers = tx
        .query(
            "SELECT trigger_id, project_id, task_id, cron_expr, timezone, misfire_policy,
                    misfire_grace_ms, published_enabled, operator_disabled, deleted_at_ms IS NOT NULL,
                    jitter_ms, start_at_ms, end_at_ms, pause_after_failures,
                    expect_success_within_ms, overlap_policy
               FROM qlsched.triggers
              WHERE $1::text IS NULL OR project_id = $1 ORDER BY trigger_id",
            &[&project],
        )
        .await?
        .iter()
        .map(|r| StoredTrigger {
            id: r.get(0),
            project: r.get(1),
            task: r.get(2),
            cron: r.get(3),
            tz: r.get(4),
            misfire: r.get(5),
            grace_ms: r.get(6),
            published_enabled: r.get(7),
            operator_disabled: r.get(8),
            deleted: r.get(9),
            jitter_ms: r.get(10),
            start_at_ms: r.get(11),
            end_at_ms: r.get(12),
            pause_after_failures: r.get(13),
            expect_success_within_ms: r.get(14),
            overlap: r.get(15),
        })
        .collect();
    tx.commit().await?;
    Ok(Stored {
        projects,
        tasks,
        triggers,
    })
}
