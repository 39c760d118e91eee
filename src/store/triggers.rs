//! Operator management of triggers (admin role): list and show, disable / enable with a
//! note, delete, fire one occurrence now, and backfill a past window.
//!
//! Every write takes the trigger row first (`FOR UPDATE` to change its state, `FOR SHARE`
//! to admit a run for it), so a fire or a backfill chunk never commits after a disable or
//! delete of the same trigger has returned, and each state change is one transaction.

use serde::Serialize;
use uuid::Uuid;

use super::admit::idempotency_key;
use super::manage::{lock_project_status, ManageError};
use super::StoreError;
use crate::db_now_ms;

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
    pub project_status: String,
    /// The schedule cursor: the next occurrence the cron will admit (None: not yet decided).
    pub next_fire_at_ms: Option<i64>,
    pub last_scheduled_at_ms: Option<i64>,
    /// queued − scheduled of the run admitted for `last_scheduled_at_ms`.
    pub last_lag_ms: Option<i64>,
    pub claim_owner: Option<String>,
    pub claim_expires_at_ms: Option<i64>,
    pub claim_version: i64,
    pub state_version: i64,
    pub now_ms: i64,
}

/// Which triggers `trigger list` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StateFilter {
    Enabled,
    Disabled,
    All,
}

impl StateFilter {
    fn as_str(self) -> &'static str {
        match self {
            StateFilter::Enabled => "enabled",
            StateFilter::Disabled => "disabled",
            StateFilter::All => "all",
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

const VIEW_COLUMNS: &str = "
       t.trigger_id, t.project_id, t.task_id, t.revision, t.cron_expr, t.timezone, t.misfire_policy,
       t.misfire_grace_ms, t.enabled, t.operator_disabled, t.disabled_note, t.disabled_by, t.disabled_at_ms,
       t.enabled_by, t.enabled_at_ms, t.deleted_by, t.deleted_at_ms, p.status,
       s.next_fire_at_ms, s.last_scheduled_at_ms,
       (SELECT r.queued_at_ms - r.scheduled_for_ms FROM qlsched.runs r
         WHERE r.trigger_id = t.trigger_id AND r.scheduled_for_ms = s.last_scheduled_at_ms
         ORDER BY r.queued_at_ms LIMIT 1),
       s.claim_owner, s.claim_expires_at_ms, s.claim_version, s.state_version, n.now_ms";

/// The page query of `trigger list`, public so a test can EXPLAIN it. A keyset page walks
/// `triggers_pkey` (or `triggers_project_page_idx` with a project) from `$3` in id order and
/// stops after `$4` rows; each row's schedule and last run are primary-key / index probes.
/// Nothing sorts or scans the whole table, however many triggers there are.
pub const LIST_SQL: &str = concat!(
    "WITH n AS MATERIALIZED (SELECT ",
    db_now_ms!(),
    " AS now_ms)
SELECT ",
    "t.trigger_id, t.project_id, t.task_id, t.revision, t.cron_expr, t.timezone, t.misfire_policy,
       t.misfire_grace_ms, t.enabled, t.operator_disabled, t.disabled_note, t.disabled_by, t.disabled_at_ms,
       t.enabled_by, t.enabled_at_ms, t.deleted_by, t.deleted_at_ms, p.status,
       s.next_fire_at_ms, s.last_scheduled_at_ms,
       (SELECT r.queued_at_ms - r.scheduled_for_ms FROM qlsched.runs r
         WHERE r.trigger_id = t.trigger_id AND r.scheduled_for_ms = s.last_scheduled_at_ms
         ORDER BY r.queued_at_ms LIMIT 1),
       s.claim_owner, s.claim_expires_at_ms, s.claim_version, s.state_version, n.now_ms
  FROM qlsched.triggers t
  JOIN qlsched.trigger_schedules s ON s.trigger_id = t.trigger_id
  JOIN qlsched.projects p ON p.project_id = t.project_id
  CROSS JOIN n
 WHERE t.deleted_at_ms IS NULL
   AND ($1::text IS NULL OR t.project_id = $1)
   AND ($2::text = 'all' OR t.enabled = ($2::text = 'enabled'))
   AND t.trigger_id > coalesce($3::text, '')
 ORDER BY t.trigger_id
 LIMIT $4"
);

fn view(r: &tokio_postgres::Row) -> TriggerView {
    TriggerView {
        trigger_id: r.get(0),
        project_id: r.get(1),
        task_id: r.get(2),
        revision: r.get(3),
        cron_expr: r.get(4),
        timezone: r.get(5),
        misfire_policy: r.get(6),
        misfire_grace_ms: r.get(7),
        enabled: r.get(8),
        operator_disabled: r.get(9),
        disabled_note: r.get(10),
        disabled_by: r.get(11),
        disabled_at_ms: r.get(12),
        enabled_by: r.get(13),
        enabled_at_ms: r.get(14),
        deleted_by: r.get(15),
        deleted_at_ms: r.get(16),
        project_status: r.get(17),
        next_fire_at_ms: r.get(18),
        last_scheduled_at_ms: r.get(19),
        last_lag_ms: r.get(20),
        claim_owner: r.get(21),
        claim_expires_at_ms: r.get(22),
        claim_version: r.get(23),
        state_version: r.get(24),
        now_ms: r.get(25),
    }
}

/// One page of live (not deleted) triggers in id order. Read-only, one statement.
pub async fn list(
    client: &tokio_postgres::Client,
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
pub async fn show(client: &tokio_postgres::Client, id: &str) -> Result<TriggerView, ManageError> {
    let sql = format!(
        "WITH n AS MATERIALIZED (SELECT {} AS now_ms)
         SELECT {VIEW_COLUMNS}
           FROM qlsched.triggers t
           JOIN qlsched.trigger_schedules s ON s.trigger_id = t.trigger_id
           JOIN qlsched.projects p ON p.project_id = t.project_id
           CROSS JOIN n
          WHERE t.trigger_id = $1",
        db_now_ms!()
    );
    match client.query_opt(&sql, &[&id]).await? {
        Some(r) => Ok(view(&r)),
        None => Err(ManageError::UnknownTrigger { id: id.into() }),
    }
}

/// Whether a state change did anything (repeating one is a no-op).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Yes,
    AlreadyThatWay,
}

/// The trigger row, locked in `mode` until the transaction ends: (enabled, deleted,
/// revision, project). `UnknownTrigger` if absent.
async fn lock_trigger(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    mode: &str,
) -> Result<(bool, bool, i64, String), ManageError> {
    let sql = format!(
        "SELECT enabled, deleted_at_ms IS NOT NULL, revision, project_id
           FROM qlsched.triggers WHERE trigger_id = $1 FOR {mode}"
    );
    match tx.query_opt(&sql, &[&id]).await? {
        Some(r) => Ok((r.get(0), r.get(1), r.get(2), r.get(3))),
        None => Err(ManageError::UnknownTrigger { id: id.into() }),
    }
}

/// Takes the schedule row out of the claim index and fences out any live claim: the
/// claim is cleared and `claim_version` / `state_version` bumped, so the holder's
/// admission (which carries the whole fence in its WHERE) matches no row and commits
/// nothing. An admission already past its UPDATE holds the row lock; we wait for it, so
/// its run is committed before this command returns, never after.
const FENCE_OUT: &str = concat!(
    "UPDATE qlsched.trigger_schedules s
        SET claimable_at_ms = NULL,
            claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
            claim_version = s.claim_version + CASE WHEN s.claim_owner IS NULL THEN 0 ELSE 1 END,
            state_version = s.state_version + 1, updated_at_ms = ",
    db_now_ms!(),
    " WHERE s.trigger_id = $1"
);

/// `trigger disable`: takes effect at once (see [`FENCE_OUT`]); keeps the note, who and
/// when. Disabling a disabled trigger changes nothing.
pub async fn disable(
    client: &mut tokio_postgres::Client,
    id: &str,
    note: Option<&str>,
    by: &str,
) -> Result<Changed, ManageError> {
    let tx = client.transaction().await?;
    let (enabled, deleted, _, _) = lock_trigger(&tx, id, "UPDATE").await?;
    if deleted {
        return Err(ManageError::Deleted { id: id.into() });
    }
    if !enabled {
        tx.commit().await?;
        return Ok(Changed::AlreadyThatWay);
    }
    tx.execute(
        concat!(
            "UPDATE qlsched.triggers
                SET enabled = false, operator_disabled = true, disabled_note = $2, disabled_by = $3,
                    disabled_at_ms = ",
            db_now_ms!(),
            " WHERE trigger_id = $1"
        ),
        &[&id, &note, &by],
    )
    .await?;
    tx.execute(FENCE_OUT, &[&id]).await?;
    tx.commit().await?;
    Ok(Changed::Yes)
}

/// `trigger enable`: the cursor is cleared, so the next claim decides the first occurrence
/// after now (the disabled span is never replayed, whatever the misfire policy). Keeps who
/// and when (the last disable's note stays on record). Enabling an enabled trigger changes
/// nothing.
///
/// Locking: trigger row `FOR UPDATE`, then the project row `FOR SHARE` while its status
/// decides whether the row is claimable (as in publish).
pub async fn enable(
    client: &mut tokio_postgres::Client,
    id: &str,
    by: &str,
) -> Result<Changed, ManageError> {
    let tx = client.transaction().await?;
    let (enabled, deleted, _, project) = lock_trigger(&tx, id, "UPDATE").await?;
    if deleted {
        return Err(ManageError::Deleted { id: id.into() });
    }
    if enabled {
        tx.commit().await?;
        return Ok(Changed::AlreadyThatWay);
    }
    let active = lock_project_status(&tx, &project).await? == "active";
    tx.execute(
        concat!(
            "UPDATE qlsched.triggers
                SET enabled = true, operator_disabled = false, enabled_by = $2, enabled_at_ms = ",
            db_now_ms!(),
            " WHERE trigger_id = $1"
        ),
        &[&id, &by],
    )
    .await?;
    tx.execute(
        concat!(
            "UPDATE qlsched.trigger_schedules s
                SET next_fire_at_ms = NULL, claimable_at_ms = CASE WHEN $2 THEN 0 END,
                    claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                    claim_version = s.claim_version + CASE WHEN s.claim_owner IS NULL THEN 0 ELSE 1 END,
                    state_version = s.state_version + 1, updated_at_ms = ",
            db_now_ms!(),
            " WHERE s.trigger_id = $1"
        ),
        &[&id, &active],
    )
    .await?;
    tx.commit().await?;
    Ok(Changed::Yes)
}

/// `trigger delete`: the trigger stops for good (disabled, fenced out like a disable) and
/// leaves every listing; the row stays so its runs keep their reference and stay readable.
/// Deleting a deleted trigger changes nothing.
pub async fn delete(
    client: &mut tokio_postgres::Client,
    id: &str,
    by: &str,
) -> Result<Changed, ManageError> {
    let tx = client.transaction().await?;
    let (_, deleted, _, _) = lock_trigger(&tx, id, "UPDATE").await?;
    if deleted {
        tx.commit().await?;
        return Ok(Changed::AlreadyThatWay);
    }
    tx.execute(
        concat!(
            "UPDATE qlsched.triggers
                SET enabled = false, deleted_by = $2, deleted_at_ms = ",
            db_now_ms!(),
            " WHERE trigger_id = $1"
        ),
        &[&id, &by],
    )
    .await?;
    tx.execute(FENCE_OUT, &[&id]).await?;
    tx.commit().await?;
    Ok(Changed::Yes)
}

/// The key of a run fired by hand.
pub fn manual_key(trigger_id: &str, revision: i64, request_id: &str) -> String {
    format!("ql3:manual:v1:{trigger_id}:{revision}:{request_id}")
}

/// What `trigger fire` did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Fired {
    pub run_id: Uuid,
    pub idempotency_key: String,
    pub scheduled_for_ms: i64,
    /// false: a run with this request id already existed (nothing new was written).
    pub admitted: bool,
}

/// Admits the trigger's run, its claimed attempt and both events for the given occurrences
/// in one statement, from the trigger's current definition (`$4` trigger id). Per row `d`:
/// scheduled time, run id, attempt id, idempotency key, request id (NULL for cron keys).
/// An occurrence whose key exists (a concurrent cron admission, an earlier fire or chunk)
/// or whose instant already has a run is skipped: `ON CONFLICT DO NOTHING` on the unique key
/// (a concurrent inserter of the same key makes us wait for its outcome, then skip), and the
/// `runs_trigger_idx` probe. The execution revision's digest is re-verified as in a cron
/// admission.
const ADMIT_MANUAL_SQL: &str = concat!(
    "WITH obs AS MATERIALIZED (SELECT ",
    db_now_ms!(),
    " AS now_ms), d AS (
    SELECT * FROM unnest($1::int8[], $2::uuid[], $3::uuid[], $5::text[], $6::text[])
        AS d(sf, run_id, attempt_id, ikey, request_id)
), run AS (
    INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                              execution_revision_id, idempotency_key, status, scheduled_for_ms,
                              queued_at_ms, admitted_by, request_id)
    SELECT d.run_id, t.project_id, t.trigger_id, t.revision, k.task_id, k.revision, k.execution_revision_id,
           d.ikey, 'queued', coalesce(d.sf, obs.now_ms), obs.now_ms, $7, d.request_id
      FROM d, obs, qlsched.triggers t
      JOIN qlsched.tasks k ON k.task_id = t.task_id
      JOIN qlsched.execution_revisions e ON e.execution_revision_id = k.execution_revision_id
     WHERE t.trigger_id = $4 AND e.kind = 'remote_worker' AND e.project_id = t.project_id
       AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex')
       AND (d.sf IS NULL OR NOT EXISTS (SELECT 1 FROM qlsched.runs r
                                         WHERE r.trigger_id = t.trigger_id AND r.scheduled_for_ms = d.sf))
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING run_id, queued_at_ms, scheduled_for_ms
), att AS (
    INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
    SELECT d.attempt_id, run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms
      FROM run JOIN d ON d.run_id = run.run_id
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT run.run_id, e.seq, e.kind, run.queued_at_ms
      FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) AS e(seq, kind)
)
SELECT run_id, scheduled_for_ms FROM run"
);

/// Checks that the trigger may have runs admitted now, with its row `FOR SHARE` and its
/// project `FOR SHARE` until the transaction ends (a disable, delete, republish or project
/// suspension waits for us, or we for it). Returns the revision.
async fn lock_admittable(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
) -> Result<i64, ManageError> {
    let (enabled, deleted, revision, project) = lock_trigger(tx, id, "SHARE").await?;
    if deleted {
        return Err(ManageError::Deleted { id: id.into() });
    }
    if !enabled {
        return Err(ManageError::Disabled { id: id.into() });
    }
    let status = lock_project_status(tx, &project).await?;
    if status != "active" {
        return Err(ManageError::ProjectInactive {
            id: id.into(),
            project,
            status,
        });
    }
    Ok(revision)
}

/// `trigger fire`: admits one occurrence now (scheduled = queued = the database clock) in
/// one transaction: a queued run, its claimed attempt, run.created and run.queued, under
/// the key `ql3:manual:v1:<trigger>:<revision>:<request id>`. The same request id again
/// admits nothing and returns the existing run. A disabled or deleted trigger, or an
/// inactive project, is refused.
pub async fn fire(
    client: &mut tokio_postgres::Client,
    id: &str,
    request_id: &str,
    by: &str,
) -> Result<Fired, ManageError> {
    let tx = client.transaction().await?;
    let revision = lock_admittable(&tx, id).await?;
    let key = manual_key(id, revision, request_id);
    let (run_id, attempt_id) = (Uuid::new_v4(), Uuid::new_v4());
    let rows = tx
        .query(
            ADMIT_MANUAL_SQL,
            &[
                &vec![None::<i64>],
                &vec![run_id],
                &vec![attempt_id],
                &id,
                &vec![key.clone()],
                &vec![request_id.to_string()],
                &by,
            ],
        )
        .await?;
    let fired = match rows.first() {
        Some(r) => Fired {
            run_id: r.get(0),
            idempotency_key: key,
            scheduled_for_ms: r.get(1),
            admitted: true,
        },
        None => match tx
            .query_opt(
                "SELECT run_id, scheduled_for_ms FROM qlsched.runs WHERE idempotency_key = $1",
                &[&key],
            )
            .await?
        {
            Some(r) => Fired {
                run_id: r.get(0),
                idempotency_key: key,
                scheduled_for_ms: r.get(1),
                admitted: false,
            },
            None => return Err(ManageError::CorruptExecutionRevision { id: id.into() }),
        },
    };
    tx.commit().await?;
    Ok(fired)
}

/// Counts of one backfill chunk.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct BackfillCount {
    pub admitted: u64,
    pub already_existed: u64,
}

/// One committed chunk of `trigger backfill`: admits the occurrences (instants in Unix ms)
/// with the ordinary cron key under `revision`, skipping any that already has a run. Refused
/// (nothing written) if the trigger was republished since the backfill began, or is
/// disabled, deleted or its project inactive. A chunk is one transaction, so an interrupted
/// backfill leaves whole chunks; running it again admits only what is missing.
pub async fn backfill_chunk(
    client: &mut tokio_postgres::Client,
    id: &str,
    revision: i64,
    occurrences: &[i64],
    by: &str,
) -> Result<BackfillCount, ManageError> {
    let tx = client.transaction().await?;
    let now_rev = lock_admittable(&tx, id).await?;
    if now_rev != revision {
        return Err(ManageError::RevisionChanged {
            id: id.into(),
            was: revision,
            now: now_rev,
        });
    }
    let sfs: Vec<Option<i64>> = occurrences.iter().map(|&t| Some(t)).collect();
    let runs: Vec<Uuid> = occurrences.iter().map(|_| Uuid::new_v4()).collect();
    let atts: Vec<Uuid> = occurrences.iter().map(|_| Uuid::new_v4()).collect();
    let keys: Vec<String> = occurrences
        .iter()
        .map(|&t| idempotency_key(id, revision, t))
        .collect();
    let none: Vec<Option<String>> = occurrences.iter().map(|_| None).collect();
    let rows = tx
        .query(
            ADMIT_MANUAL_SQL,
            &[&sfs, &runs, &atts, &id, &keys, &none, &by],
        )
        .await?;
    tx.commit().await?;
    let admitted = rows.len() as u64;
    Ok(BackfillCount {
        admitted,
        already_existed: occurrences.len() as u64 - admitted,
    })
}

/// The current revision of a live trigger (for a backfill to pin), refusing what
/// [`backfill_chunk`] would refuse before anything is computed or written.
pub async fn admittable_revision(
    client: &mut tokio_postgres::Client,
    id: &str,
) -> Result<i64, ManageError> {
    let tx = client.transaction().await?;
    let revision = lock_admittable(&tx, id).await?;
    tx.commit().await?;
    Ok(revision)
}
