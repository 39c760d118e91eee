//! `admit_batch_prepared`: the one SERIALIZABLE transaction that turns a batch of decided
//! occurrences into durable work, and `advance_batch` for decisions that admit nothing.

use std::borrow::Cow;

use tokio_postgres::types::Type;
use uuid::Uuid;

use super::claim::ClaimedRow;
use crate::db::StoreError;
use crate::db_now_ms;

/// The fixed idempotency key of an occurrence.
pub fn idempotency_key(trigger_id: &str, trigger_revision: i64, scheduled_for_ms: i64) -> String {
    format!("ql3:cron:v1:{trigger_id}:{trigger_revision}:{scheduled_for_ms}")
}

/// Mints a run id (UUID version 8) laid out as `owner hash (4 bytes) | Unix ms (6 bytes) |
/// random (6 bytes)`.
///
/// Why: SERIALIZABLE admissions insert into `runs_pkey` leaf pages, and the reads of a
/// batch whose outcome is unknown (`resolve_batch`) probe them. (Until migration V7 the
/// foreign-key checks of the attempt and the events also read them.) With random ids, concurrent admissions of
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

/// What a decision to admit adds to its claimed row: the occurrence, where the cursor goes,
/// and the ids minted for it. The claimed row itself travels beside it once (in the engine's
/// job); [`Admission::new`] joins the two for the statement.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Occurrence {
    pub scheduled_for_ms: i64,
    pub next_fire_at_ms: i64,
    pub run_id: Uuid,
    pub attempt_id: Uuid,
}

/// A decided occurrence of a claimed row, ready to admit: the row borrowed from the job
/// that carries it (owned only where a test forges a stale fence), the occurrence, and who
/// admits it. Derefs to the occurrence (`a.scheduled_for_ms`).
#[derive(Clone, Debug)]
pub struct Admission<'a> {
    pub claim: Cow<'a, ClaimedRow>,
    occurrence: Occurrence,
    pub admitted_by: String,
}

impl<'a> Admission<'a> {
    /// The occurrence `o` of `claim`, admitted by the claim's owner.
    pub fn new(claim: &'a ClaimedRow, o: Occurrence) -> Admission<'a> {
        Admission {
            admitted_by: claim.fence.owner.clone(),
            claim: Cow::Borrowed(claim),
            occurrence: o,
        }
    }

    /// The occurrence, without its claimed row.
    pub fn occurrence(&self) -> Occurrence {
        self.occurrence
    }

    /// The claimed trigger's jitter and window.
    pub fn timing(&self) -> crate::schedule::Timing<'_> {
        self.claim.def.timing(&self.claim.trigger_id)
    }

    pub fn key(&self) -> String {
        idempotency_key(
            &self.claim.trigger_id,
            self.claim.def.trigger_revision,
            self.scheduled_for_ms,
        )
    }
}

impl std::ops::Deref for Admission<'_> {
    type Target = Occurrence;
    fn deref(&self) -> &Occurrence {
        &self.occurrence
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmitOutcome {
    /// Committed: exactly one run, one attempt, two events; cursor advanced; claim cleared.
    Admitted { queued_at_ms: i64 },
    /// The occurrence's idempotency key already existed (a backfill, or a run admitted by
    /// other means) or its run was pruned (a tombstone): nothing new was written for it, the
    /// cursor advanced past it under the fence and the claim was cleared.
    AlreadyAdmitted,
    /// The trigger's overlap policy (V21) did not admit it now: a run of the trigger is
    /// unfinished, and the occurrence was recorded as a skip (forbid, buffer_one with one
    /// kept already) or kept for when that run ends (buffer_one). Nothing else was written;
    /// the cursor advanced under the fence and the claim was cleared.
    Overlap,
    /// A verification failed; nothing was written. `why` names what changed.
    Refused { why: Refusal },
}

/// Why an admission's fenced UPDATE hit no row, as [`diagnose`] finds it after the
/// rollback. Each category has its own follow-up in the admit engine.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Owner, token, version or `state_version` changed, or the lease expired (database
    /// clock): the row is no longer ours and must not be touched.
    FenceLost,
    /// The project is no longer active.
    ProjectInactive,
    /// The trigger moved on (new revision or digest, disabled) or its task row is gone:
    /// re-decide at once. (A task deployed since the claim is not a refusal: the admission
    /// pins the task as its own transaction reads it.)
    DefinitionChanged,
    /// The pinned execution revision is missing, not `remote_worker`, or its digest does not
    /// match its spec: a corrupt definition, retried only after a back-off.
    ExecutionRevisionInvalid,
    /// The fence still holds but the row's cursor, revision or observation is not the one the
    /// decision was made from.
    CursorMoved,
    /// The row is unchanged but its physical address moved (`VACUUM FULL`, `CLUSTER`), so
    /// the TID access found nothing: re-decide at once.
    RowMoved,
    /// Every check passes on re-reading: nothing explains the miss.
    Unexplained,
}

impl Refusal {
    /// Whether the claim is still ours after this refusal (so the engine should release it).
    pub fn claim_still_ours(self) -> bool {
        !matches!(self, Refusal::FenceLost)
    }
}

/// One admission transaction for a batch of decided occurrences (distinct rows).
///
/// Locking: SERIALIZABLE. Each schedule row is reached by its TID (`ctid = ANY(…)`: a TID
/// scan takes tuple-level predicate locks; a primary-key B-tree probe would lock whole leaf
/// pages and make admissions of adjacent trigger ids conflict). The UPDATE's WHERE carries,
/// per row, the complete fence (owner, token, version, `claim_expires_at_ms > now` on the
/// database clock), the claimed state (revision, `state_version`, cursor, observation) and
/// every definition check, each a primary-key point read; the run is pinned to the task row
/// (revision and execution revision) as this transaction reads it, whatever the claim read,
/// so a task deployed since the claim refuses nothing; the inserts take their rows from
/// the UPDATE's RETURNING, so an occurrence is written exactly when its fenced UPDATE hit
/// its one row. The run insert skips a key that already exists (`ON CONFLICT DO NOTHING`) or
/// whose run was pruned (a tombstone in `pruned_occurrences`, V15, read in the statement's
/// snapshot, one primary-key scan for the batch's keys): that occurrence was admitted
/// before, so its cursor still advances and nothing else is written for it. A prune records
/// a tombstone only while the schedule row is unclaimed and locked by it, so a claim, and
/// the admission after it, start after the tombstone committed. Admissions never write
/// tombstones, so their predicate locks there conflict with no other admission. A row whose
/// checks fail is simply absent (refused, nothing written for it); any failed write aborts
/// the statement and the whole transaction rolls back. The overlap policy of a forbid or
/// buffer_one trigger is decided here too (V26): one `overlap_decide` call reads each
/// member's `trigger_overlap` row by the TID its claim read, decides and writes it before
/// reading the next (so its tuple-level predicate locks are dropped as it goes and never
/// promoted to page locks); that write is the row's lock, so a run end or a fire that
/// changed the row after this transaction's snapshot fails it to serialize (retried).
///
/// BEGIN, the statement and COMMIT are pipelined, in that order: one round trip and one WAL
/// flush for the whole batch. A broken connection anywhere in the three leaves the outcome
/// unknown. [`ADMIT_SQL`] is prepared on the connection beforehand (`stmt`): not planned
/// again once its plan is cached, and its Bind and Execute go out between the pipelined
/// BEGIN and COMMIT.
pub async fn admit_batch_prepared(
    client: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    batch: &[Admission<'_>],
) -> Result<Vec<AdmitOutcome>, StoreError> {
    admit_with(client, stmt, batch).await
}

async fn admit_with(
    client: &tokio_postgres::Client,
    stmt: &tokio_postgres::Statement,
    batch: &[Admission<'_>],
) -> Result<Vec<AdmitOutcome>, StoreError> {
    use tokio_postgres::types::ToSql;
    let columns = Columns::of(batch);
    let params = columns.params();
    let (begin, rows, commit) = futures::join!(
        // enable_seqscan off: on small tables the planner would seq-scan, and a sequential
        // scan under SERIALIZABLE takes a relation-level predicate lock that conflicts with
        // every concurrent admission (the TID scan and the definition-row probes must stay
        // point accesses).
        // qlsched.in_admission: V28's row triggers know they run inside this statement.
        client.batch_execute(
            "BEGIN ISOLATION LEVEL SERIALIZABLE; SET LOCAL enable_seqscan = off;
             SET LOCAL qlsched.in_admission = on",
        ),
        // The statement is prepared already, so its Bind and Execute go out in order between
        // BEGIN and COMMIT (the test
        // `the_admission_statement_runs_inside_its_serializable_transaction` proves the order).
        async {
            let values: Vec<&(dyn ToSql + Sync)> = params.iter().map(|(v, _)| *v).collect();
            client.query(stmt, &values).await
        },
        client.batch_execute("COMMIT"),
    );
    let lost = [
        begin.as_ref().err(),
        rows.as_ref().err(),
        commit.as_ref().err(),
    ]
    .into_iter()
    .flatten()
    .any(crate::db::connection_lost);
    if lost {
        return Err(StoreError::OutcomeUnknown);
    }
    begin?;
    // An error of the statement: the COMMIT answered ROLLBACK, nothing of the batch was written.
    let rows = rows?;
    commit?;
    outcomes(client, batch, &rows).await
}

/// The admission statement's parameters: one array per column, one element per member.
struct Columns {
    text: [Vec<String>; 7],
    int: [Vec<i64>; 6],
    cursors: Vec<Option<i64>>,
    /// Where the claim index holds the row next (its new cursor's jittered instant; NULL once
    /// the cursor is past the trigger's window), and the jittered instant recorded on the run
    /// (NULL without a jitter): docs/policies-jitter.md.
    claimable: Vec<Option<i64>>,
    due: Vec<Option<i64>>,
    /// The TID of the trigger's overlap row as the claim read it (NULL for allow and replace).
    overlap_tids: Vec<Option<String>>,
    /// Whether the claim found the member's forbid trigger idle (V28's fast path).
    overlap_idle: Vec<bool>,
    uuid: [Vec<Uuid>; 3],
}

impl Columns {
    fn of(batch: &[Admission]) -> Columns {
        let text = |f: fn(&Admission) -> String| batch.iter().map(f).collect::<Vec<String>>();
        let int = |f: fn(&Admission) -> i64| batch.iter().map(f).collect::<Vec<i64>>();
        let uid = |f: fn(&Admission) -> Uuid| batch.iter().map(f).collect::<Vec<Uuid>>();
        Columns {
            text: [
                text(|a| a.claim.tid.clone()),
                text(|a| a.claim.trigger_id.clone()),
                text(|a| a.claim.fence.owner.clone()),
                text(|a| a.claim.def.trigger_digest.clone()),
                text(|a| a.claim.def.task_id.clone()),
                text(|a| a.key()),
                text(|a| a.admitted_by.clone()),
            ],
            int: [
                int(|a| a.claim.def.trigger_revision),
                int(|a| a.claim.state_version),
                int(|a| a.claim.fence.version),
                int(|a| a.claim.observed_at_ms),
                int(|a| a.scheduled_for_ms),
                int(|a| a.next_fire_at_ms),
            ],
            cursors: batch.iter().map(|a| a.claim.next_fire_at_ms).collect(),
            claimable: batch
                .iter()
                .map(|a| a.timing().claimable_at_ms(a.next_fire_at_ms))
                .collect(),
            due: batch
                .iter()
                .map(|a| a.timing().recorded_due_at_ms(a.scheduled_for_ms))
                .collect(),
            overlap_tids: batch.iter().map(|a| a.claim.overlap_tid.clone()).collect(),
            overlap_idle: batch.iter().map(|a| a.claim.overlap_idle).collect(),
            uuid: [
                uid(|a| a.claim.fence.token),
                uid(|a| a.run_id),
                uid(|a| a.attempt_id),
            ],
        }
    }

    /// `$1` … `$21` of [`ADMIT_SQL`], with their types.
    fn params(&self) -> [(&(dyn tokio_postgres::types::ToSql + Sync), Type); 21] {
        let [tids, ids, owners, tdigs, tasks, keys, bys] = &self.text;
        let [revs, svs, cvs, obs, sfs, nexts] = &self.int;
        let [tokens, runs, atts] = &self.uuid;
        let (text_a, int8_a, uuid_a) = (Type::TEXT_ARRAY, Type::INT8_ARRAY, Type::UUID_ARRAY);
        [
            (tids, text_a.clone()),
            (ids, text_a.clone()),
            (revs, int8_a.clone()),
            (svs, int8_a.clone()),
            (&self.cursors, int8_a.clone()),
            (owners, text_a.clone()),
            (tokens, uuid_a.clone()),
            (cvs, int8_a.clone()),
            (obs, int8_a.clone()),
            (sfs, int8_a.clone()),
            (nexts, int8_a.clone()),
            (tdigs, text_a.clone()),
            (tasks, text_a.clone()),
            (runs, uuid_a.clone()),
            (atts, uuid_a.clone()),
            (keys, text_a.clone()),
            (bys, text_a.clone()),
            (&self.claimable, int8_a.clone()),
            (&self.due, int8_a),
            (&self.overlap_tids, text_a),
            (&self.overlap_idle, Type::BOOL_ARRAY),
        ]
    }
}

/// Each member's outcome from the admission's rows: admitted (with its queued time), already
/// admitted (key existed), or refused (absent; diagnosed after the rollback).
async fn outcomes(
    client: &tokio_postgres::Client,
    batch: &[Admission<'_>],
    rows: &[tokio_postgres::Row],
) -> Result<Vec<AdmitOutcome>, StoreError> {
    let mut out = Vec::with_capacity(batch.len());
    for a in batch {
        let hit = rows
            .iter()
            .find(|r| r.get::<_, &str>(0) == a.claim.trigger_id);
        out.push(match hit {
            Some(r) => match (r.get::<_, Option<i64>>(1), r.get::<_, bool>(2)) {
                (Some(queued_at_ms), _) => AdmitOutcome::Admitted { queued_at_ms },
                (None, true) => AdmitOutcome::Overlap,
                (None, false) => AdmitOutcome::AlreadyAdmitted,
            },
            None => AdmitOutcome::Refused {
                why: diagnose(client, a).await?,
            },
        });
    }
    Ok(out)
}

pub const ADMIT_SQL: &str = concat!(
    "
WITH obs AS MATERIALIZED (
    SELECT ",
    db_now_ms!(),
    " AS now_ms
), d AS (
    SELECT * FROM unnest($1::text[], $2::text[], $3::int8[], $4::int8[], $5::int8[], $6::text[], $7::uuid[],
                         $8::int8[], $9::int8[], $10::int8[], $11::int8[], $12::text[], $13::text[], $14::uuid[],
                         $15::uuid[], $16::text[], $17::text[], $18::int8[], $19::int8[], $20::text[], $21::bool[])
        AS d(tid, trigger_id, rev, sv, cursor_ms, owner, token, cv, observed_ms, sf, next_ms, tdig, task_id, run_id,
             attempt_id, ikey, admitted_by, claimable_ms, due_ms, otid, idle)
), adv AS (
    UPDATE qlsched.trigger_schedules s
       SET next_fire_at_ms = d.next_ms, last_scheduled_at_ms = d.sf,
           admitted_through_ms = greatest(s.admitted_through_ms, d.sf),
           claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
           claimable_at_ms = d.claimable_ms, state_version = s.state_version + 1, updated_at_ms = obs.now_ms,
           -- A forbid trigger the claim found idle: its run counted here, on the row this
           -- UPDATE writes anyway (V28), and no overlap row read or written.
           overlap_admitted = s.overlap_admitted + d.idle::int
      FROM obs, d
     WHERE s.ctid = ANY ($1::text[]::tid[]) AND s.ctid = d.tid::tid
       -- Compared as an expression, not as an index key: the schedule row must be reached by
       -- its TID, never by a primary-key probe (page-level predicate locks under SERIALIZABLE).
       AND s.trigger_id || '' = d.trigger_id
       AND s.trigger_revision = d.rev AND s.state_version = d.sv
       AND s.next_fire_at_ms = d.cursor_ms AND s.next_fire_at_ms = d.sf
       AND s.claim_owner = d.owner AND s.claim_token = d.token AND s.claim_version = d.cv
       AND s.claim_expires_at_ms > obs.now_ms
       AND s.updated_at_ms = d.observed_ms AND d.sf <= d.observed_ms AND d.next_ms > d.sf
       -- The definition re-checks are one correlated subquery per member, each row reached by
       -- its primary key: as joins, their order was left to the statistics of the definition
       -- tables, and right after a mass publish (before autovacuum analysed them) the generic
       -- plan walked every trigger of the task through its task index for each member
       -- (tests/it/plans.rs). A missing row makes the subquery NULL: the member is refused.
       -- The task is taken as this transaction reads it, not as the claim read it: a task
       -- deployed since the claim changes what the run executes, not whether or when the
       -- occurrence fires, so it refuses nothing (a refusal would cost the occurrence another
       -- round). Its execution revision is the one the task row pins, checked here.
       AND (SELECT t.revision = d.rev AND t.content_digest = d.tdig AND t.enabled AND t.kind = 'cron'
                   AND t.task_id = d.task_id
                   AND p.status = 'active'
                   AND e.kind = 'remote_worker' AND e.project_id = s.project_id
                   AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex')
              FROM qlsched.triggers t, qlsched.tasks k, qlsched.projects p, qlsched.execution_revisions e
             WHERE t.trigger_id = d.trigger_id AND k.task_id = d.task_id AND p.project_id = s.project_id
               AND e.execution_revision_id = k.execution_revision_id)
    -- The run is pinned to the task row version the check above read: one snapshot for the
    -- whole SERIALIZABLE transaction, so both reads see the same row.
    RETURNING s.trigger_id, s.project_id, obs.now_ms, d.rev, d.task_id,
              (SELECT k.revision FROM qlsched.tasks k WHERE k.task_id = d.task_id) AS krev,
              (SELECT k.execution_revision_id FROM qlsched.tasks k WHERE k.task_id = d.task_id) AS erev,
              -- The revision's pool and executor (V18's generated columns), copied onto the run
              -- for the worker's take (runs_take_idx).
              (SELECT e.pool FROM qlsched.tasks k, qlsched.execution_revisions e
                WHERE k.task_id = d.task_id AND e.execution_revision_id = k.execution_revision_id) AS pool,
              (SELECT e.executor FROM qlsched.tasks k, qlsched.execution_revisions e
                WHERE k.task_id = d.task_id AND e.execution_revision_id = k.execution_revision_id) AS executor,
              -- The trigger's overlap policy (V21), NULL for allow: an allow trigger's run
              -- reads and writes nothing more and calls no function.
              (SELECT nullif(t.overlap_policy, 'allow') FROM qlsched.triggers t
                WHERE t.trigger_id = d.trigger_id) AS opol,
              d.run_id, d.attempt_id, d.ikey, d.sf, d.admitted_by, d.due_ms, d.otid, d.idle,
              s.overlap_admitted AS oadm
), tomb AS MATERIALIZED (
    -- The batch's keys whose run was pruned (V15): one scan of the tombstones' primary key for
    -- the whole batch, skipped (a one-time filter) while there is no tombstone at all, the
    -- usual case (a probe per key of an empty index still reads its metapage each time).
    SELECT p.idempotency_key FROM qlsched.pruned_occurrences p
     WHERE EXISTS (SELECT FROM qlsched.pruned_occurrences) AND p.idempotency_key = ANY ($16::text[])
), ovd AS MATERIALIZED (
    -- The overlap decision of the batch's forbid and buffer_one members (V26): each trigger's
    -- row, its count of unfinished runs as this transaction's snapshot has it, read, decided
    -- on and written in one UPDATE (the owner's function: no role writes the overlap rows),
    -- before the runs are inserted: the count raised for a run inserted as counted below,
    -- the skip recorded for a skipped member. A writer that changed a row after the snapshot
    -- (a run end, a fire) makes that write fail to serialize, one in flight is waited for,
    -- and a later one waits for this commit: the count decided on is the count at the
    -- commit. Each row is read and written in turn, reached by the TID the claim read ($20),
    -- so this transaction never holds more than one predicate lock on the table's pages (a
    -- batch that read its rows first and wrote them after had its tuple locks promoted to page
    -- and relation locks, and conflicted with every concurrent admission's write there). A
    -- trigger without the row was never adopted: absent, not counted. No call without a
    -- forbid or buffer_one member (NULL arguments). A member the claim found idle is not
    -- decided here: counted on its schedule row by adv (V28). The count decided on is the
    -- overlap row's part plus the schedule row's (overlap_admitted as adv left it).
    SELECT o.* FROM (SELECT array_agg(adv.otid::tid) AS tids, array_agg(adv.trigger_id) AS ids,
                            array_agg(adv.opol) AS pols, array_agg(adv.ikey) AS keys,
                            array_agg(EXISTS (SELECT 1 FROM tomb WHERE tomb.idempotency_key = adv.ikey)) AS tombed,
                            array_agg(adv.sf) AS sfs, array_agg(adv.oadm) AS adms
                       FROM adv WHERE adv.opol IN ('forbid', 'buffer_one') AND NOT adv.idle) a,
                    qlsched.overlap_decide_with(a.tids, a.ids, a.pols, a.keys, a.tombed, a.sfs, a.adms) o
), dec AS MATERIALIZED (
    -- busy: a run of the trigger is unfinished and the key is new (a key that exists is left
    -- to the insert's ON CONFLICT: nothing to decide); kept: buffer_one holds an occurrence.
    SELECT adv.*, ovd.trigger_id IS NOT NULL OR adv.idle AS counted,
           EXISTS (SELECT 1 FROM tomb WHERE tomb.idempotency_key = adv.ikey) AS tombed,
           coalesce(ovd.busy, false) AS busy, coalesce(ovd.kept, false) AS kept
      FROM adv LEFT JOIN ovd ON ovd.trigger_id = adv.trigger_id
), run AS (
    -- A busy forbid member (or a buffer_one one with an occurrence kept already) is skipped:
    -- not inserted. A busy buffer_one member with nothing kept goes to V21's row trigger
    -- (overlap_counted NULL), which keeps it; so does a replace member, whose cancels the
    -- trigger makes. Every other counted member is inserted as counted by this statement.
    INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                              execution_revision_id, idempotency_key, status, scheduled_for_ms,
                              queued_at_ms, admitted_by, pool, executor, due_at_ms, overlap_policy,
                              overlap_counted)
    SELECT run_id, project_id, trigger_id, rev, task_id, krev, erev, ikey, 'queued', sf, now_ms, admitted_by,
           pool, executor, due_ms,
           CASE WHEN opol = 'replace' OR counted THEN opol END,
           CASE WHEN counted AND NOT (busy AND opol = 'buffer_one' AND NOT kept) THEN true END
      FROM dec
     WHERE NOT tombed AND NOT (busy AND (opol = 'forbid' OR kept))
    ON CONFLICT (idempotency_key) DO NOTHING
    RETURNING run_id, queued_at_ms, overlap_counted
), att AS (
    INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
    SELECT adv.attempt_id, adv.run_id, 1, 'remote_worker', 'claimed', adv.now_ms
      FROM adv JOIN run ON run.run_id = adv.run_id
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT adv.run_id, e.seq, e.kind, adv.now_ms
      FROM adv JOIN run ON run.run_id = adv.run_id, (VALUES (1, 'run.created'), (2, 'run.queued')) AS e(seq, kind)
), ovu AS MATERIALIZED (
    -- A member whose count ovd raised but whose run was not inserted (its key existed: a
    -- backfill admitted the occurrence): the count lowered again (the owner's function),
    -- one call for the batch, none when there is no such member (the usual case). Read by
    -- the final SELECT so it runs.
    SELECT qlsched.overlap_undo(array_agg(dec.trigger_id)) AS n
      FROM dec LEFT JOIN run ON run.run_id = dec.run_id
     WHERE dec.counted AND NOT dec.idle AND NOT dec.tombed AND NOT dec.busy AND run.run_id IS NULL
), ovr AS MATERIALIZED (
    -- The same for a member counted on its schedule row (V28), whose key existed or was a
    -- tombstone: released on the overlap row (the owner's function), none in the usual case.
    SELECT qlsched.overlap_release(array_agg(dec.trigger_id)) AS n
      FROM dec LEFT JOIN run ON run.run_id = dec.run_id
     WHERE dec.idle AND run.run_id IS NULL
)
SELECT adv.trigger_id, run.queued_at_ms,
       -- Not written although its key is new and not a tombstone: the overlap policy kept it
       -- out (V21). Read only for a counted trigger's missing run (the statement's snapshot:
       -- a key that existed before it is visible, the run it did not insert is not).
       CASE WHEN run.run_id IS NULL AND adv.opol IS NOT NULL
            THEN NOT EXISTS (SELECT 1 FROM tomb WHERE tomb.idempotency_key = adv.ikey)
                 AND NOT EXISTS (SELECT 1 FROM qlsched.runs r WHERE r.idempotency_key = adv.ikey)
            ELSE false END
  FROM adv LEFT JOIN run ON run.run_id = adv.run_id CROSS JOIN ovu CROSS JOIN ovr"
);

/// Why an admission statement hit no row. Read after the rollback, outside the transaction,
/// in one statement: each check of the admission, re-read separately.
pub async fn diagnose(
    client: &tokio_postgres::Client,
    a: &Admission<'_>,
) -> Result<Refusal, StoreError> {
    let c = &a.claim;
    let d = &c.def;
    let row = client
        .query_opt(
            concat!(
                "WITH obs AS MATERIALIZED (SELECT ",
                db_now_ms!(),
                " AS now_ms)
                 SELECT coalesce(s.claim_owner = $2 AND s.claim_token = $3 AND s.claim_version = $4
                                 AND s.state_version = $8 AND s.claim_expires_at_ms > obs.now_ms, false),
                        coalesce(p.status = 'active', false),
                        coalesce(t.revision = $5 AND t.content_digest = $6 AND t.enabled AND t.kind = 'cron'
                                 AND t.task_id = $7 AND k.task_id IS NOT NULL, false),
                        EXISTS (SELECT 1 FROM qlsched.execution_revisions e
                                 WHERE e.execution_revision_id = k.execution_revision_id
                                   AND e.kind = 'remote_worker' AND e.project_id = s.project_id
                                   AND e.spec_digest = encode(sha256(convert_to(e.spec, 'UTF8')), 'hex')),
                        s.trigger_revision = $5 AND s.next_fire_at_ms IS NOT DISTINCT FROM $9
                            AND s.updated_at_ms = $10,
                        s.ctid::text = $11
                   FROM obs, qlsched.trigger_schedules s
                   LEFT JOIN qlsched.projects p ON p.project_id = s.project_id
                   LEFT JOIN qlsched.triggers t ON t.trigger_id = s.trigger_id
                   LEFT JOIN qlsched.tasks k ON k.task_id = $7
                  WHERE s.trigger_id = $1"
            ),
            &[
                &c.trigger_id,
                &c.fence.owner,
                &c.fence.token,
                &c.fence.version,
                &d.trigger_revision,
                &d.trigger_digest,
                &d.task_id,
                &c.state_version,
                &c.next_fire_at_ms,
                &c.observed_at_ms,
                &c.tid,
            ],
        )
        .await?;
    let Some(row) = row else {
        return Ok(Refusal::FenceLost);
    };
    let check = |i: usize| row.get::<_, bool>(i);
    Ok(if !check(0) {
        Refusal::FenceLost
    } else if !check(1) {
        Refusal::ProjectInactive
    } else if !check(2) {
        Refusal::DefinitionChanged
    } else if !check(3) {
        Refusal::ExecutionRevisionInvalid
    } else if !check(4) {
        Refusal::CursorMoved
    } else if !check(5) {
        Refusal::RowMoved
    } else {
        Refusal::Unexplained
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

/// Resolves unknown outcomes of a batch in one read of the idempotency keys and fences on
/// a fresh connection. Never retries the write blindly: a retry after
/// `NotCommittedClaimHeld` is itself fenced, so a COMMIT still in flight on the old backend
/// makes it lose the fence.
pub async fn resolve_batch(
    client: &tokio_postgres::Client,
    batch: &[Admission<'_>],
) -> Result<Vec<Resolution>, StoreError> {
    let keys: Vec<String> = batch.iter().map(|a| a.key()).collect();
    let runs: Vec<Uuid> = batch.iter().map(|a| a.run_id).collect();
    let ids: Vec<&str> = batch.iter().map(|a| a.claim.trigger_id.as_str()).collect();
    let tokens: Vec<Uuid> = batch.iter().map(|a| a.claim.fence.token).collect();
    let cvs: Vec<i64> = batch.iter().map(|a| a.claim.fence.version).collect();
    let svs: Vec<i64> = batch.iter().map(|a| a.claim.state_version).collect();
    let rows = client
        .query(
            "SELECT d.i, r.queued_at_ms,
                    EXISTS (SELECT 1 FROM qlsched.trigger_schedules s
                             WHERE s.trigger_id = d.trigger_id AND s.claim_token = d.token
                               AND s.claim_version = d.cv AND s.state_version = d.sv)
               FROM unnest($1::text[], $2::uuid[], $3::text[], $4::uuid[], $5::int8[], $6::int8[])
                    WITH ORDINALITY AS d(ikey, run_id, trigger_id, token, cv, sv, i)
               LEFT JOIN qlsched.runs r ON r.idempotency_key = d.ikey AND r.run_id = d.run_id
              ORDER BY d.i",
            &[&keys, &runs, &ids, &tokens, &cvs, &svs],
        )
        .await?;
    Ok(rows
        .iter()
        .map(
            |r| match (r.get::<_, Option<i64>>(1), r.get::<_, bool>(2)) {
                (Some(q), _) => Resolution::Committed { queued_at_ms: q },
                (None, true) => Resolution::NotCommittedClaimHeld,
                (None, false) => Resolution::NotOurs,
            },
        )
        .collect())
}

/// Moves the cursors of a batch of claimed rows without admitting; per row, whether it moved.
///
/// Locking: one autocommit UPDATE by primary key whose WHERE is, per row, the complete fence
/// judged by the database clock in the same statement; under READ COMMITTED a concurrent
/// change of a row is re-checked against that WHERE, so a stale claim moves nothing.
pub async fn advance_batch(
    conn: &tokio_postgres::Client,
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
    // The new cursor's jittered instant, or out of the claim index past the trigger's window.
    let claimable: Vec<Option<i64>> = batch
        .iter()
        .map(|(c, n)| c.def.timing(&c.trigger_id).claimable_at_ms(*n))
        .collect();
    let rows = conn
        .query(
            concat!(
                "WITH obs AS MATERIALIZED (SELECT ",
                db_now_ms!(),
                " AS now_ms
             ), d AS (
                 SELECT * FROM unnest($1::text[], $2::int8[], $3::int8[], $4::int8[], $5::text[], $6::uuid[],
                                      $7::int8[], $8::int8[], $9::int8[])
                     AS d(trigger_id, rev, sv, cursor_ms, owner, token, cv, next_ms, claimable_ms)
             )
             UPDATE qlsched.trigger_schedules s
                SET next_fire_at_ms = d.next_ms, claim_owner = NULL, claim_token = NULL,
                    claim_expires_at_ms = NULL, claimable_at_ms = d.claimable_ms,
                    state_version = s.state_version + 1, updated_at_ms = obs.now_ms
               FROM obs, d
              WHERE s.trigger_id = d.trigger_id AND s.trigger_revision = d.rev AND s.state_version = d.sv
                AND s.next_fire_at_ms IS NOT DISTINCT FROM d.cursor_ms
                AND s.claim_owner = d.owner AND s.claim_token = d.token AND s.claim_version = d.cv
                AND s.claim_expires_at_ms > obs.now_ms
             RETURNING s.trigger_id"
            ),
            &[&ids, &revs, &svs, &cursors, &owners, &tokens, &cvs, &nexts, &claimable],
        )
        .await?;
    Ok(ids
        .iter()
        .map(|id| rows.iter().any(|r| r.get::<_, &str>(0) == *id))
        .collect())
}
