//! `admit_occurrence`: the one SERIALIZABLE transaction that turns a decided occurrence into
//! durable work, and `advance_cursor` for decisions that admit nothing.

use uuid::Uuid;

use super::claim::ClaimedRow;
use super::{Conn, Pool, StoreError};

/// The fixed idempotency key of an occurrence.
pub fn idempotency_key(trigger_id: &str, trigger_revision: i64, scheduled_for_ms: i64) -> String {
    format!("ql3:cron:v1:{trigger_id}:{trigger_revision}:{scheduled_for_ms}")
}

/// Mints a run id (UUID version 8) laid out as `owner hash (4 bytes) | Unix ms (6 bytes) |
/// random (6 bytes)`.
///
/// Why: SERIALIZABLE admissions read `runs_pkey` leaf pages (the foreign-key checks of the
/// attempt and the events) and insert into them. With random ids, concurrent admissions of
/// different replicas hit the same leaf pages and SSI reports page-level rw-conflicts
/// (serialization failures that grow with batch size). With this layout each replica
/// appends to its own key range, so concurrent admissions touch disjoint pages, and one
/// replica's admissions never run concurrently with each other.
pub fn mint_run_id(owner: &str) -> Uuid {
    use sha2::{Digest, Sha256};
    let mut b = [0u8; 16];
    b[..4].copy_from_slice(&Sha256::digest(owner.as_bytes())[..4]);
    let ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    b[4..10].copy_from_slice(&ms.to_be_bytes()[2..]);
    b[10..].copy_from_slice(&Uuid::new_v4().as_bytes()[10..]);
    Uuid::new_v8(b)
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

/// One admission transaction for one occurrence (a batch of one).
pub async fn admit_once(conn: &mut Conn<'_>, a: &Admission) -> Result<AdmitOutcome, StoreError> {
    let mut out = admit_batch(conn, std::slice::from_ref(a)).await?;
    Ok(out.remove(0))
}

/// One admission transaction for a batch of decided occurrences (distinct rows).
///
/// Locking: SERIALIZABLE. Each schedule row is reached by its TID (`ctid = ANY(…)`: a TID
/// scan takes tuple-level predicate locks; a primary-key B-tree probe would lock whole leaf
/// pages and make admissions of adjacent trigger ids conflict). The UPDATE's WHERE carries,
/// per row, the complete fence (owner, token, version, `claim_expires_at_ms > now` on the
/// database clock), the claimed state (revision, `state_version`, cursor, observation) and
/// every definition check, each a primary-key point read; the inserts take their rows from
/// the UPDATE's RETURNING, so an occurrence is written exactly when its fenced UPDATE hit
/// its one row. A row whose checks fail is simply absent (refused, nothing written for it);
/// any failed write aborts the statement and the whole transaction rolls back.
///
/// BEGIN, the statement and COMMIT are pipelined, in that order: one round trip and one WAL
/// flush for the whole batch. A broken connection anywhere in the three leaves the outcome unknown.
pub async fn admit_batch(
    conn: &mut Conn<'_>,
    batch: &[Admission],
) -> Result<Vec<AdmitOutcome>, StoreError> {
    let text = |f: fn(&Admission) -> String| batch.iter().map(f).collect::<Vec<String>>();
    let int = |f: fn(&Admission) -> i64| batch.iter().map(f).collect::<Vec<i64>>();
    let uid = |f: fn(&Admission) -> Uuid| batch.iter().map(f).collect::<Vec<Uuid>>();
    let tids = text(|a| a.claim.tid.clone());
    let ids = text(|a| a.claim.trigger_id.clone());
    let revs = int(|a| a.claim.def.trigger_revision);
    let svs = int(|a| a.claim.state_version);
    let cursors: Vec<Option<i64>> = batch.iter().map(|a| a.claim.next_fire_at_ms).collect();
    let owners = text(|a| a.claim.fence.owner.clone());
    let tokens = uid(|a| a.claim.fence.token);
    let cvs = int(|a| a.claim.fence.version);
    let obs = int(|a| a.claim.observed_at_ms);
    let sfs = int(|a| a.scheduled_for_ms);
    let nexts = int(|a| a.next_fire_at_ms);
    let tdigs = text(|a| a.claim.def.trigger_digest.clone());
    let tasks = text(|a| a.claim.def.task_id.clone());
    let krevs = int(|a| a.claim.def.task_revision);
    let kdigs = text(|a| a.claim.def.task_digest.clone());
    let erevs = uid(|a| a.claim.def.execution_revision_id);
    let runs = uid(|a| a.run_id);
    let atts = uid(|a| a.attempt_id);
    let keys = text(|a| a.key());
    let bys = text(|a| a.admitted_by.clone());
    use tokio_postgres::types::{ToSql, Type};
    let (text_a, int8_a, uuid_a) = (Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::UUID_ARRAY);
    let params: [(&(dyn ToSql + Sync), Type); 20] = [
        (&tids, text_a.clone()),
        (&ids, text_a.clone()),
        (&revs, int8_a.clone()),
        (&svs, int8_a.clone()),
        (&cursors, int8_a.clone()),
        (&owners, text_a.clone()),
        (&tokens, uuid_a.clone()),
        (&cvs, int8_a.clone()),
        (&obs, int8_a.clone()),
        (&sfs, int8_a.clone()),
        (&nexts, int8_a.clone()),
        (&tdigs, text_a.clone()),
        (&tasks, text_a.clone()),
        (&krevs, int8_a.clone()),
        (&kdigs, text_a.clone()),
        (&erevs, uuid_a.clone()),
        (&runs, uuid_a.clone()),
        (&atts, uuid_a.clone()),
        (&keys, text_a.clone()),
        (&bys, text_a),
    ];
    let client: &tokio_postgres::Client = conn;
    let (begin, rows, commit) = futures::join!(
        // enable_seqscan off: on small tables the planner would seq-scan, and a sequential
        // scan under SERIALIZABLE takes a relation-level predicate lock that conflicts with
        // every concurrent admission (the TID scan and the foreign-key probes must stay
        // point accesses).
        client.batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE; SET LOCAL enable_seqscan = off"),
        // `query_typed` sends Parse/Bind/Execute in one message on its first poll; plain
        // `query` would first prepare (a round trip) and so run after the pipelined COMMIT,
        // outside the transaction (the test
        // `the_admission_statement_runs_inside_its_serializable_transaction` proves the order).
        client.query_typed(ADMIT_SQL, &params),
        client.batch_execute("COMMIT"),
    );
    let lost = [
        begin.as_ref().err(),
        rows.as_ref().err(),
        commit.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    .any(super::connection_lost);
    if lost {
        return Err(StoreError::OutcomeUnknown);
    }
    begin?;
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            // The COMMIT answered ROLLBACK: nothing of the batch was written.
            let e = StoreError::from(e);
            if e.is_unique_violation() && batch.len() == 1 {
                return Ok(vec![AdmitOutcome::Refused {
                    why: Refusal::DuplicateKey,
                }]);
            }
            return Err(e);
        }
    };
    commit?;
    let mut out = Vec::with_capacity(batch.len());
    for a in batch {
        match rows
            .iter()
            .find(|r| r.get::<_, &str>(0) == a.claim.trigger_id)
        {
            Some(r) => out.push(AdmitOutcome::Admitted {
                queued_at_ms: r.get(1),
            }),
            None => out.push(AdmitOutcome::Refused {
                why: diagnose(conn, a).await?,
            }),
        }
    }
    Ok(out)
}

const ADMIT_SQL: &str = "
WITH obs AS MATERIALIZED (
    SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
), d AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::text[], $7::uuid[],
                         $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::text[], $13::text[], $14::int8[],
                         $15::text[], $16::uuid[], $17::uuid[], $18::uuid[], $19::text[], $20::text[])
        AS d(tid, trigger_id, rev, sv, cursor_ms, owner, token, cv, observed_ms, sf, next_ms, tdig, task_id, krev,
             kdig, erev, run_id, attempt_id, ikey, admitted_by)
), adv AS (
    UPDATE qlsched.trigger_schedules s
       SET next_fire_at_ms = d.next_ms, last_scheduled_at_ms = d.sf,
           claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
           claimable_at_ms = d.next_ms, state_version = s.state_version + 1, updated_at_ms = obs.now_ms
      FROM obs, d, qlsched.triggers t, qlsched.tasks k, qlsched.projects p, qlsched.execution_revisions e
     WHERE s.ctid = ANY ($1::text[]::tid[]) AND s.ctid = d.tid::tid AND s.trigger_id = d.trigger_id
       AND s.trigger_revision = d.rev AND s.state_version = d.sv
       AND s.next_fire_at_ms = d.cursor_ms AND s.next_fire_at_ms = d.sf
       AND s.claim_owner = d.owner AND s.claim_token = d.token AND s.claim_version = d.cv
       AND s.claim_expires_at_ms > obs.now_ms
       AND s.updated_at_ms = d.observed_ms AND d.sf <= d.observed_ms AND d.next_ms > d.sf
       AND t.trigger_id = s.trigger_id AND t.revision = d.rev AND t.content_digest = d.tdig
       AND t.enabled AND t.kind = 'cron' AND t.task_id = d.task_id
       AND k.task_id = d.task_id AND k.revision = d.krev AND k.content_digest = d.kdig
       AND k.execution_revision_id = d.erev
       AND p.project_id = s.project_id AND p.status = 'active'
       AND e.execution_revision_id = d.erev AND e.kind = 'remote_worker' AND e.project_id = s.project_id
       AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex')
    RETURNING s.trigger_id, s.project_id, obs.now_ms, d.rev, d.task_id, d.krev, d.erev, d.run_id,
              d.attempt_id, d.ikey, d.sf, d.admitted_by
), run AS (
    INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                              execution_revision_id, idempotency_key, status, scheduled_for_ms,
                              queued_at_ms, admitted_by)
    SELECT run_id, project_id, trigger_id, rev, task_id, krev, erev, ikey, 'queued', sf, now_ms, admitted_by
      FROM adv
    RETURNING trigger_id, queued_at_ms
), att AS (
    INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
    SELECT attempt_id, run_id, 1, 'remote_worker', 'claimed', now_ms FROM adv
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT adv.run_id, e.seq, e.kind, adv.now_ms
      FROM adv, (VALUES (1, 'run.created'), (2, 'run.queued')) AS e(seq, kind)
)
SELECT trigger_id, queued_at_ms FROM run";

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
pub async fn advance_cursor(
    conn: &Conn<'_>,
    c: &ClaimedRow,
    next_fire_at_ms: i64,
) -> Result<bool, StoreError> {
    Ok(advance_batch(conn, &[(c.clone(), next_fire_at_ms)]).await?[0])
}

/// Moves the cursors of a batch of claimed rows without admitting; per row, whether it moved.
///
/// Locking: one autocommit UPDATE by primary key whose WHERE is, per row, the complete fence
/// judged by the database clock in the same statement; under READ COMMITTED a concurrent
/// change of a row is re-checked against that WHERE, so a stale claim moves nothing.
pub async fn advance_batch(
    conn: &Conn<'_>,
    batch: &[(ClaimedRow, i64)],
) -> Result<Vec<bool>, StoreError> {
    let ids: Vec<&str> = batch.iter().map(|(c, _)| c.trigger_id.as_str()).collect();
    let revs: Vec<i64> = batch.iter().map(|(c, _)| c.def.trigger_revision).collect();
    let svs: Vec<i64> = batch.iter().map(|(c, _)| c.state_version).collect();
    let cursors: Vec<Option<i64>> = batch.iter().map(|(c, _)| c.next_fire_at_ms).collect();
    let owners: Vec<&str> = batch.iter().map(|(c, _)| c.fence.owner.as_str()).collect();
    let tokens: Vec<Uuid> = batch.iter().map(|(c, _)| c.fence.token).collect();
    let cvs: Vec<i64> = batch.iter().map(|(c, _)| c.fence.version).collect();
    let nexts: Vec<i64> = batch.iter().map(|(_, n)| *n).collect();
    let rows = conn
        .query(
            "WITH obs AS MATERIALIZED (
                 SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now_ms
             ), d AS (
                 SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::text[], $6::uuid[],
                                      $7::int8[], $8::int8[])
                     AS d(trigger_id, rev, sv, cursor_ms, owner, token, cv, next_ms)
             )
             UPDATE qlsched.trigger_schedules s
                SET next_fire_at_ms = d.next_ms, claim_owner = NULL, claim_token = NULL,
                    claim_expires_at_ms = NULL, claimable_at_ms = d.next_ms,
                    state_version = s.state_version + 1, updated_at_ms = obs.now_ms
               FROM obs, d
              WHERE s.trigger_id = d.trigger_id AND s.trigger_revision = d.rev AND s.state_version = d.sv
                AND s.next_fire_at_ms IS NOT DISTINCT FROM d.cursor_ms
                AND s.claim_owner = d.owner AND s.claim_token = d.token AND s.claim_version = d.cv
                AND s.claim_expires_at_ms > obs.now_ms
             RETURNING s.trigger_id",
            &[&ids, &revs, &svs, &cursors, &owners, &tokens, &cvs, &nexts],
        )
        .await?;
    Ok(ids
        .iter()
        .map(|id| rows.iter().any(|r| r.get::<_, &str>(0) == *id))
        .collect())
}
