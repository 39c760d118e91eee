//! `admit_occurrence`: the one SERIALIZABLE transaction that turns a decided occurrence into
//! durable work, and `advance_cursor` for decisions that admit nothing.

use uuid::Uuid;

use super::claim::ClaimedRow;
use super::{Conn, Pool, StoreError};

/// The fixed idempotency key of an occurrence.
pub fn idempotency_key(trigger_id: &str, trigger_revision: i64, scheduled_for_ms: i64) -> String {
    format!("ql3:cron:v1:{trigger_id}:{trigger_revision}:{scheduled_for_ms}")
}

/// A decided occurrence, ready to admit.
#[derive(Clone, Debug)]
pub struct Admission {
    pub claim: ClaimedRow,
    pub scheduled_for_ms: i64,
    pub next_fire_at_ms: i64,
    pub run_id: Uuid,
    pub attempt_id: Uuid,
    pub admitted_by: String,
}

impl Admission {
    pub fn key(&self) -> String {
        idempotency_key(
            &self.claim.trigger_id,
            self.claim.def.trigger_revision,
            self.scheduled_for_ms,
        )
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitOutcome {
    /// Committed: exactly one run, one attempt, two events; cursor advanced; claim cleared.
    Admitted { queued_at_ms: i64 },
    /// A verification failed; nothing was written. `why` names the first check that failed.
    Refused { why: Refusal },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Owner, token, version or state changed, or the lease expired (database clock).
    FenceLost,
    /// The trigger, task or project changed or was disabled/suspended since the claim.
    DefinitionChanged,
    /// The pinned execution revision is missing or its digest does not match its spec.
    CorruptExecutionRevision,
    /// The idempotency key already exists (another admission of the same occurrence won).
    DuplicateKey,
}

/// One attempt of the admission transaction.
///
/// Locking: SERIALIZABLE. The schedule row is reached by its TID (tuple-level predicate
/// lock; a primary-key B-tree probe would lock the whole leaf page and make admissions of
/// adjacent trigger ids conflict). The UPDATE's WHERE carries the complete fence (owner,
/// token, version, `claim_expires_at_ms > now` on the database clock), the claimed state
/// (revision, `state_version`, cursor, observation) and every definition check, each a
/// primary-key point read; the inserts take their rows from the UPDATE's RETURNING, so they
/// happen exactly when the fenced UPDATE hit its one row. Any failed write aborts the
/// statement and the transaction rolls back whole.
pub async fn admit_once(conn: &mut Conn<'_>, a: &Admission) -> Result<AdmitOutcome, StoreError> {
    let c = &a.claim;
    let key = a.key();
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 20] = [
        &c.tid,
        &c.trigger_id,
        &c.def.trigger_revision,
        &c.state_version,
        &c.next_fire_at_ms,
        &c.fence.owner,
        &c.fence.token,
        &c.fence.version,
        &c.observed_at_ms,
        &a.scheduled_for_ms,
        &a.next_fire_at_ms,
        &c.def.trigger_digest,
        &c.def.task_id,
        &c.def.task_revision,
        &c.def.task_digest,
        &c.def.execution_revision_id,
        &a.run_id,
        &a.attempt_id,
        &key,
        &a.admitted_by,
    ];
    // BEGIN, the statement and COMMIT are pipelined: one round trip. A statement that hit no
    // row wrote nothing, so committing it is harmless; a statement that failed leaves the
    // transaction aborted and the COMMIT answers ROLLBACK. A broken connection anywhere in
    // the three leaves the outcome unknown (the server may have run all of them).
    let client: &tokio_postgres::Client = conn;
    let (begin, row, commit) = futures::join!(
        client.batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE"),
        client.query_opt(ADMIT_SQL, &params),
        client.batch_execute("COMMIT"),
    );
    let lost = [
        begin.as_ref().err(),
        row.as_ref().err(),
        commit.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    .find(|e| super::connection_lost(e));
    if lost.is_some() {
        return Err(StoreError::OutcomeUnknown);
    }
    begin?;
    let row = match row {
        Ok(row) => row,
        Err(e) => {
            let e = StoreError::from(e);
            if e.is_unique_violation() {
                return Ok(AdmitOutcome::Refused {
                    why: Refusal::DuplicateKey,
                });
            }
            return Err(e);
        }
    };
    commit?;
    match row {
        Some(row) => Ok(AdmitOutcome::Admitted {
            queued_at_ms: row.get(0),
        }),
        None => {
            let why = diagnose(conn, a).await?;
            Ok(AdmitOutcome::Refused { why })
        }
    }
}

const ADMIT_SQL: &str = "
WITH obs AS MATERIALIZED (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), adv AS (
    UPDATE qlsched.trigger_schedules s
       SET next_fire_at_ms = $11, last_scheduled_at_ms = $10,
           claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
           claimable_at_ms = $11, state_version = s.state_version + 1, updated_at_ms = obs.now_ms
      FROM obs, qlsched.triggers t, qlsched.tasks k, qlsched.projects p, qlsched.execution_revisions e
     WHERE s.ctid = $1::text::tid AND s.trigger_id = $2
       AND s.trigger_revision = $3 AND s.state_version = $4
       AND s.next_fire_at_ms IS NOT DISTINCT FROM $5::bigint
       AND s.claim_owner = $6 AND s.claim_token = $7 AND s.claim_version = $8
       AND s.claim_expires_at_ms > obs.now_ms
       AND s.updated_at_ms = $9
       AND s.next_fire_at_ms = $10 AND $10::bigint <= $9::bigint AND $11::bigint > $10::bigint
       AND t.trigger_id = s.trigger_id AND t.revision = $3 AND t.content_digest = $12
       AND t.enabled AND t.kind = 'cron' AND t.task_id = $13
       AND k.task_id = $13 AND k.revision = $14 AND k.content_digest = $15
       AND k.execution_revision_id = $16
       AND p.project_id = s.project_id AND p.status = 'active'
       AND e.execution_revision_id = $16 AND e.kind = 'remote_worker' AND e.project_id = s.project_id
       AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex')
    RETURNING s.trigger_id, s.project_id, obs.now_ms
), run AS (
    INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                              execution_revision_id, idempotency_key, status, scheduled_for_ms,
                              queued_at_ms, admitted_by)
    SELECT $17, adv.project_id, adv.trigger_id, $3, $13, $14, $16, $19, 'queued', $10, adv.now_ms, $20
      FROM adv
    RETURNING run_id, queued_at_ms
), att AS (
    INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
    SELECT $18, run.run_id, 1, 'remote_worker', 'claimed', run.queued_at_ms FROM run
    RETURNING attempt_id
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT run.run_id, e.seq, e.kind, run.queued_at_ms
      FROM run, (VALUES (1, 'run.created'), (2, 'run.queued')) AS e(seq, kind)
    RETURNING seq
)
SELECT run.queued_at_ms, (SELECT count(*) FROM att), (SELECT count(*) FROM ev) FROM run";

/// Why an admission statement hit no row. Read after the rollback, outside the transaction.
async fn diagnose(conn: &Conn<'_>, a: &Admission) -> Result<Refusal, StoreError> {
    let c = &a.claim;
    let row = conn
        .query_one(
            "SELECT
               EXISTS (SELECT 1 FROM qlsched.trigger_schedules s
                        WHERE s.trigger_id = $1 AND s.claim_owner = $2 AND s.claim_token = $3
                          AND s.claim_version = $4 AND s.state_version = $5
                          AND s.claim_expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint),
               EXISTS (SELECT 1 FROM qlsched.execution_revisions e
                        WHERE e.execution_revision_id = $6 AND e.kind = 'remote_worker'
                          AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex'))",
            &[
                &c.trigger_id,
                &c.fence.owner,
                &c.fence.token,
                &c.fence.version,
                &c.state_version,
                &c.def.execution_revision_id,
            ],
        )
        .await?;
    let fence_held: bool = row.get(0);
    let exec_ok: bool = row.get(1);
    Ok(if !fence_held {
        Refusal::FenceLost
    } else if !exec_ok {
        Refusal::CorruptExecutionRevision
    } else {
        Refusal::DefinitionChanged
    })
}

/// What a reader finds after a COMMIT whose reply never arrived.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Resolution {
    /// Our run exists: the transaction committed.
    Committed { queued_at_ms: i64 },
    /// No run for the key and our claim is still in place: the transaction did not commit.
    NotCommittedClaimHeld,
    /// No run by us; the claim is no longer ours (expired and taken over, or republished).
    NotOurs,
}

/// Resolves an unknown outcome by reading the idempotency key and the fence on a fresh
/// connection. Never retries the write blindly: a retry after `NotCommittedClaimHeld` is
/// itself fenced, so a COMMIT still in flight on the old backend makes it lose the fence.
pub async fn resolve_unknown(pool: &Pool, a: &Admission) -> Result<Resolution, StoreError> {
    let conn = super::conn(pool).await?;
    let c = &a.claim;
    let row = conn
        .query_one(
            "SELECT (SELECT queued_at_ms FROM qlsched.runs WHERE idempotency_key = $1 AND run_id = $2),
                    EXISTS (SELECT 1 FROM qlsched.trigger_schedules s
                             WHERE s.trigger_id = $3 AND s.claim_token = $4 AND s.claim_version = $5
                               AND s.state_version = $6)",
            &[&a.key(), &a.run_id, &c.trigger_id, &c.fence.token, &c.fence.version, &c.state_version],
        )
        .await?;
    let queued: Option<i64> = row.get(0);
    let held: bool = row.get(1);
    Ok(match (queued, held) {
        (Some(q), _) => Resolution::Committed { queued_at_ms: q },
        (None, true) => Resolution::NotCommittedClaimHeld,
        (None, false) => Resolution::NotOurs,
    })
}

/// Moves the cursor without admitting (initialise, misfired skip) and clears the claim.
///
/// Locking: one autocommit UPDATE whose WHERE is the complete fence, judged by the database
/// clock in the same statement; under READ COMMITTED a concurrent change of the row is
/// re-checked against that WHERE, so a stale claim moves nothing. Returns whether it did.
pub async fn advance_cursor(
    conn: &Conn<'_>,
    c: &ClaimedRow,
    next_fire_at_ms: i64,
) -> Result<bool, StoreError> {
    let n = conn
        .execute(
            "UPDATE qlsched.trigger_schedules s
                SET next_fire_at_ms = $8, claim_owner = NULL, claim_token = NULL,
                    claim_expires_at_ms = NULL, claimable_at_ms = $8,
                    state_version = s.state_version + 1,
                    updated_at_ms = (extract(epoch FROM clock_timestamp()) * 1000)::bigint
              WHERE s.trigger_id = $1 AND s.trigger_revision = $2 AND s.state_version = $3
                AND s.next_fire_at_ms IS NOT DISTINCT FROM $4::bigint
                AND s.claim_owner = $5 AND s.claim_token = $6 AND s.claim_version = $7
                AND s.claim_expires_at_ms > (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
            &[
                &c.trigger_id,
                &c.def.trigger_revision,
                &c.state_version,
                &c.next_fire_at_ms,
                &c.fence.owner,
                &c.fence.token,
                &c.fence.version,
                &next_fire_at_ms,
            ],
        )
        .await?;
    Ok(n == 1)
}
