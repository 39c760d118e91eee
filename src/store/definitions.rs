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
    /// Who disabled it (`qlsched`: a system pause after failures), or deleted it.
    pub disabled_by: Option<String>,
    pub deleted: bool,
    pub deleted_by: Option<String>,
    /// The `qlsched apply` source label that owns it (V23); `None`: unlabelled.
    pub source: Option<String>,
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
    let stored = read_in(&tx, project).await?;
    tx.commit().await?;
    Ok(stored)
}

/// [`read`] in the caller's transaction (`qlsched apply` plans and writes in one).
pub async fn read_in(
    tx: &tokio_postgres::Transaction<'_>,
    project: Option<&str>,
) -> Result<Stored, StoreError> {
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
                    expect_success_within_ms, overlap_policy, disabled_by, deleted_by, source_label
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
            disabled_by: r.get(16),
            deleted_by: r.get(17),
            source: r.get(18),
        })
        .collect();
    Ok(Stored {
        projects,
        tasks,
        triggers,
    })
}

/// The advisory lock of `qlsched apply` ("qlsapply" in ASCII): one apply at a time per
/// database.
pub const APPLY_LOCK: i64 = 0x716c_7361_7070_6c79;

/// Takes the apply lock for the caller's transaction, waiting at most `wait`; that bound
/// (`lock_timeout`, `SET LOCAL`) stays on every later lock wait of the transaction. `Err`:
/// the bound in force and the error (SQLSTATE 55P03 when the wait timed out: the caller
/// ends the transaction and names the holder, `db::locks::wait_error`).
///
/// Locking: `pg_advisory_xact_lock`, released at commit or rollback. It serialises applies
/// only; `trigger publish` and the other commands take the row locks they always take, and
/// an apply's publishes take the same ones in the same order.
pub async fn lock_apply(
    tx: &tokio_postgres::Transaction<'_>,
    wait: std::time::Duration,
) -> Result<(), (String, tokio_postgres::Error)> {
    let bound = format!("{}ms", wait.as_millis().max(1));
    tx.execute("SELECT set_config('lock_timeout', $1, true)", &[&bound])
        .await
        .map_err(|e| (bound.clone(), e))?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&APPLY_LOCK])
        .await
        .map_err(|e| (bound, e))?;
    Ok(())
}

/// Names this session in `pg_stat_activity` (`application_name`), so a second apply that
/// waits for this one can say who holds the lock.
///
/// Locking: none.
pub async fn name_session(
    client: &impl tokio_postgres::GenericClient,
    name: &str,
) -> Result<(), StoreError> {
    let name: String = name.chars().take(63).collect();
    client
        .execute("SELECT set_config('application_name', $1, false)", &[&name])
        .await?;
    Ok(())
}
