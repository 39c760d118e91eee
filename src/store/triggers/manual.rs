//! Runs an operator admits: `trigger fire` (one occurrence now, its own key kind) and the
//! chunks of `trigger backfill` (past occurrences, the cron key).

use serde::Serialize;
use uuid::Uuid;

use super::{lock_trigger, LockedTrigger};
use crate::db_now_ms;
use crate::store::admission::{idempotency_key, mint_run_id};
use crate::store::audit::{self, ObjectKind};
use crate::store::manage::{lock_project_status, ManageError, ProjectStatus};
use crate::store::overlap::OverlapPolicy;

/// The key of a run fired by hand: one request id is one run of the trigger, whatever its
/// revision (a fire retried after a republish finds the first one).
pub fn manual_key(trigger_id: &str, request_id: &str) -> String {
    format!("ql3:manual:v2:{trigger_id}:{request_id}")
}

/// The keys a fire with `request_id` had under revisions `1..=revision` before V8 (the
/// revision was part of the key then); a fire looks them up so a request id used before the
/// upgrade still admits nothing new.
fn legacy_manual_keys(trigger_id: &str, revision: i64, request_id: &str) -> Vec<String> {
    (1..=revision)
        .map(|r| format!("ql3:manual:v1:{trigger_id}:{r}:{request_id}"))
        .collect()
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
/// or whose instant already has a cron-keyed run (of any revision; a manual run at the same
/// millisecond is another run) is skipped: `ON CONFLICT DO NOTHING` on the unique key
/// (a concurrent inserter of the same key makes us wait for its outcome, then skip), and the
/// `runs_trigger_idx` probe. The execution revision's digest is re-verified as in a cron
/// admission. `$8` is the request's overlap policy (NULL: the trigger's); an occurrence
/// the policy does not admit is absent from the result (recorded as a skip, or buffered).
const ADMIT_MANUAL_SQL: &str = concat!(
    "WITH obs AS MATERIALIZED (SELECT ",
    db_now_ms!(),
    " AS now_ms), d AS (
    SELECT * FROM unnest($1::int8[], $2::uuid[], $3::uuid[], $5::text[], $6::text[])
        AS d(sf, run_id, attempt_id, ikey, request_id)
), run AS (
    INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                              execution_revision_id, idempotency_key, status, scheduled_for_ms,
                              queued_at_ms, admitted_by, request_id, pool, executor, overlap_policy)
    SELECT d.run_id, t.project_id, t.trigger_id, t.revision, k.task_id, k.revision, k.execution_revision_id,
           d.ikey, 'queued', coalesce(d.sf, obs.now_ms), obs.now_ms, $7, d.request_id, e.pool, e.executor,
           -- Counted when the trigger's policy is not allow (V21): the request's own policy
           -- ($8, NULL: the trigger's) decides in qlsched.overlap_admit.
           CASE WHEN t.overlap_policy = 'allow' THEN NULL ELSE coalesce($8::text, t.overlap_policy) END
      FROM d, obs, qlsched.triggers t
      JOIN qlsched.tasks k ON k.task_id = t.task_id
      JOIN qlsched.execution_revisions e ON e.execution_revision_id = k.execution_revision_id
     WHERE t.trigger_id = $4 AND e.kind = 'remote_worker' AND e.project_id = t.project_id
       AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex')
       AND (d.sf IS NULL OR NOT EXISTS (SELECT 1 FROM qlsched.runs r
                                         WHERE r.trigger_id = t.trigger_id AND r.scheduled_for_ms = d.sf
                                           AND r.idempotency_key LIKE 'ql3:cron:%'))
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
/// suspension waits for us, or we for it), and that its task's execution revision is intact
/// (a run is never written that the admission would refuse). Returns the trigger as read.
async fn lock_admittable(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
) -> Result<LockedTrigger, ManageError> {
    let t = lock_trigger(tx, id, "SHARE").await?;
    if t.deleted {
        return Err(ManageError::Deleted { id: id.into() });
    }
    if !t.enabled {
        return Err(ManageError::Disabled { id: id.into() });
    }
    let status = lock_project_status(tx, &t.project).await?;
    if status != ProjectStatus::Active {
        return Err(ManageError::ProjectInactive {
            id: id.into(),
            project: t.project,
            status,
        });
    }
    let intact: bool = tx.query_one(EXECUTION_INTACT_SQL, &[&id]).await?.get(0);
    if !intact {
        return Err(ManageError::CorruptExecutionRevision { id: id.into() });
    }
    Ok(t)
}

/// Whether the trigger's task pins an execution revision of the trigger's project whose
/// digest matches its spec: the same test [`ADMIT_MANUAL_SQL`] (and a cron admission)
/// applies, asked once so that a refusal is named instead of counted as "already existed".
const EXECUTION_INTACT_SQL: &str = "SELECT EXISTS (
    SELECT 1 FROM qlsched.triggers t
      JOIN qlsched.tasks k ON k.task_id = t.task_id
      JOIN qlsched.execution_revisions e ON e.execution_revision_id = k.execution_revision_id
     WHERE t.trigger_id = $1 AND e.kind = 'remote_worker' AND e.project_id = t.project_id
       AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex'))";

/// `trigger fire`: admits one occurrence now (scheduled = queued = the database clock) in
/// one transaction: a queued run, its claimed attempt, run.created and run.queued, under
/// the key `ql3:manual:v2:<trigger>:<request id>`. The same request id again — before or
/// after a republish — admits nothing and returns the existing run. A disabled or deleted
/// trigger, an inactive project or a corrupt execution revision is refused.
pub async fn fire(
    client: &mut tokio_postgres::Client,
    id: &str,
    request_id: &str,
    by: &str,
) -> Result<Fired, ManageError> {
    fire_with(client, id, request_id, by, None).await
}

/// [`fire`] under the overlap policy `overlap` instead of the trigger's (`trigger fire
/// --overlap`; None: the trigger's). An occurrence the policy does not admit is refused
/// ([`ManageError::Overlap`]), recorded as a skip or, under buffer_one, kept.
pub async fn fire_with(
    client: &mut tokio_postgres::Client,
    id: &str,
    request_id: &str,
    by: &str,
    overlap: Option<OverlapPolicy>,
) -> Result<Fired, ManageError> {
    let overlap = overlap.map(OverlapPolicy::as_str);
    let tx = client.transaction().await?;
    let t = lock_admittable(&tx, id).await?;
    let legacy = tx
        .query_opt(
            "SELECT run_id, scheduled_for_ms, idempotency_key FROM qlsched.runs
              WHERE idempotency_key = ANY($1) LIMIT 1",
            &[&legacy_manual_keys(id, t.revision, request_id)],
        )
        .await?;
    if let Some(r) = legacy {
        let fired = Fired {
            run_id: r.get(0),
            scheduled_for_ms: r.get(1),
            idempotency_key: r.get(2),
            admitted: false,
        };
        tx.commit().await?;
        return Ok(fired);
    }
    let key = manual_key(id, request_id);
    // Run ids laid out like a replica's (see `mint_run_id`), in the operator's own key range.
    let (run_id, attempt_id) = (mint_run_id(by), Uuid::new_v4());
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
                &overlap,
            ],
        )
        .await?;
    let fired = match rows.first() {
        Some(r) => {
            let fired = Fired {
                run_id: r.get(0),
                idempotency_key: key,
                scheduled_for_ms: r.get(1),
                admitted: true,
            };
            let changes = serde_json::json!({
                "run_id": fired.run_id.to_string(), "request_id": request_id,
                "idempotency_key": fired.idempotency_key, "scheduled_for_ms": fired.scheduled_for_ms,
            });
            let entry = audit::Entry {
                kind: ObjectKind::Trigger,
                id,
                project: Some(&t.project),
                action: "fire",
                changes,
                note: None,
                origin: None,
            };
            audit::append(&tx, &entry).await?;
            fired
        }
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
            // Not written and not there: the overlap policy kept it out (the execution
            // revision was checked under the trigger's lock), or kept it for later.
            None => {
                let buffered: Option<bool> = tx
                    .query_opt(
                        "SELECT coalesce(o.buffered ->> 'idempotency_key' = $2, false)
                           FROM qlsched.trigger_overlap o WHERE o.trigger_id = $1",
                        &[&id, &key],
                    )
                    .await?
                    .map(|r| r.get(0));
                let Some(buffered) = buffered else {
                    return Err(ManageError::CorruptExecutionRevision { id: id.into() });
                };
                tx.commit().await?;
                return Err(ManageError::Overlap {
                    id: id.into(),
                    buffered,
                });
            }
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
    backfill_chunk_with(client, id, revision, occurrences, by, OverlapPolicy::Allow).await
}

/// [`backfill_chunk`] under the overlap policy `overlap` (`trigger backfill --overlap`; a
/// backfill admits every occurrence asked for, allow, unless told otherwise). Occurrences
/// the policy does not admit count as already existing.
pub async fn backfill_chunk_with(
    client: &mut tokio_postgres::Client,
    id: &str,
    revision: i64,
    occurrences: &[i64],
    by: &str,
    overlap: OverlapPolicy,
) -> Result<BackfillCount, ManageError> {
    let tx = client.transaction().await?;
    let t = lock_admittable(&tx, id).await?;
    let now_rev = t.revision;
    if now_rev != revision {
        return Err(ManageError::RevisionChanged {
            id: id.into(),
            was: revision,
            now: now_rev,
        });
    }
    // `runs prune` (V12 qlsched.prune_queued) holds this lock exclusively while it removes
    // queued runs and raises the horizon: a chunk either waits for it and then sees the new
    // horizon, or keeps it waiting until the chunk commits. Without it, a chunk that passed
    // the command's horizon check could re-admit an occurrence whose run a prune had just
    // removed. Any role may take an advisory lock, so the wait (and every later one of the
    // chunk) is bounded (db::locks), and a time-out names who holds it.
    let bound = crate::db::locks::bound_waits(&tx).await?;
    let locked = tx
        .execute(
            "SELECT pg_advisory_xact_lock_shared($1)",
            &[&crate::store::queued_prune::PRUNE_QUEUED_LOCK],
        )
        .await;
    if let Err(e) = locked {
        tx.rollback().await?;
        let lock = (
            crate::store::queued_prune::PRUNE_LOCK_NAME,
            crate::store::queued_prune::PRUNE_QUEUED_LOCK,
        );
        let why = crate::db::locks::wait_error(client, e, "trigger backfill", lock, bound);
        return Err(why.await.into());
    }
    let pruned_through: Option<i64> = tx
        .query_opt(
            "SELECT pruned_through_ms FROM qlsched.maintenance WHERE task = 'prune'",
            &[],
        )
        .await?
        .and_then(|r| r.get(0));
    if let (Some(h), Some(&first)) = (pruned_through, occurrences.iter().min()) {
        if first < h {
            return Err(ManageError::HorizonMoved {
                id: id.into(),
                horizon: chrono::DateTime::from_timestamp_millis(h)
                    .map(|d| d.format("%Y-%m-%dT%H:%M:%S%.3fZ").to_string())
                    .unwrap_or_else(|| h.to_string()),
            });
        }
    }
    let sfs: Vec<Option<i64>> = occurrences.iter().map(|&t| Some(t)).collect();
    let runs: Vec<Uuid> = occurrences.iter().map(|_| mint_run_id(by)).collect();
    let atts: Vec<Uuid> = occurrences.iter().map(|_| Uuid::new_v4()).collect();
    let keys: Vec<String> = occurrences
        .iter()
        .map(|&t| idempotency_key(id, revision, t))
        .collect();
    let none: Vec<Option<String>> = occurrences.iter().map(|_| None).collect();
    let rows = tx
        .query(
            ADMIT_MANUAL_SQL,
            &[
                &sfs,
                &runs,
                &atts,
                &id,
                &keys,
                &none,
                &by,
                &overlap.as_str(),
            ],
        )
        .await?;
    let admitted = rows.len() as u64;
    if admitted > 0 {
        let instants = rows.iter().map(|r| r.get::<_, i64>(1));
        let changes = serde_json::json!({
            "revision": revision, "admitted": admitted,
            "already_existed": occurrences.len() as u64 - admitted,
            "first_scheduled_for_ms": instants.clone().min(),
            "last_scheduled_for_ms": instants.max(),
        });
        let entry = audit::Entry {
            kind: ObjectKind::Trigger,
            id,
            project: Some(&t.project),
            action: "backfill",
            changes,
            note: None,
            origin: None,
        };
        audit::append(&tx, &entry).await?;
    }
    tx.commit().await?;
    Ok(BackfillCount {
        admitted,
        already_existed: occurrences.len() as u64 - admitted,
    })
}

/// The definition a backfill computes its instants from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackfillDefinition {
    pub revision: i64,
    pub cron_expr: String,
    pub timezone: String,
}

/// Expression, zone and revision of a live trigger from one row version (one statement),
/// refusing what [`backfill_chunk`] would refuse before anything is computed or written.
/// The read takes no lock and so never waits for a publish in flight: it is the definition
/// last committed, and every chunk then holds the trigger `FOR SHARE` and refuses if its
/// revision is no longer this one — instants are never admitted under another revision's
/// keys.
pub async fn backfill_definition(
    client: &mut tokio_postgres::Client,
    id: &str,
) -> Result<BackfillDefinition, ManageError> {
    backfill_definition_in(&*client, id).await
}

/// [`backfill_definition`] on any client (the console reads it in its action's transaction).
pub async fn backfill_definition_in(
    client: &impl tokio_postgres::GenericClient,
    id: &str,
) -> Result<BackfillDefinition, ManageError> {
    let row = client
        .query_opt(
            "SELECT t.enabled, t.deleted_at_ms IS NOT NULL, t.revision, t.cron_expr, t.timezone,
                    t.project_id, p.status
               FROM qlsched.triggers t JOIN qlsched.projects p ON p.project_id = t.project_id
              WHERE t.trigger_id = $1",
            &[&id],
        )
        .await?
        .ok_or_else(|| ManageError::UnknownTrigger { id: id.into() })?;
    if row.get::<_, bool>(1) {
        return Err(ManageError::Deleted { id: id.into() });
    }
    if !row.get::<_, bool>(0) {
        return Err(ManageError::Disabled { id: id.into() });
    }
    let status: ProjectStatus = row.get(6);
    if status != ProjectStatus::Active {
        return Err(ManageError::ProjectInactive {
            id: id.into(),
            project: row.get(5),
            status,
        });
    }
    let intact: bool = client.query_one(EXECUTION_INTACT_SQL, &[&id]).await?.get(0);
    if !intact {
        return Err(ManageError::CorruptExecutionRevision { id: id.into() });
    }
    Ok(BackfillDefinition {
        revision: row.get(2),
        cron_expr: row.get(3),
        timezone: row.get(4),
    })
}
