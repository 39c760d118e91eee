//! The exactly-once invariants (`testkit/sql/invariants.sql`) can fail: each is broken on
//! purpose in a fresh database holding one admitted run, and the check must name it.

use qlsched::store::admission::AdmitOutcome;

use crate::helpers::claimed::Claimed;
use crate::helpers::invariants;
use crate::helpers::{unique_owner, TestDb};

/// (invariant the check must name, what breaks it). The statements run as the superuser with
/// every trigger off, so the guards of the schema do not stop them.
const PLANTED: &[(&str, &str)] = &[
    (
        "duplicate occurrence",
        "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                   task_revision, execution_revision_id, idempotency_key,
                                   scheduled_for_ms, queued_at_ms, admitted_by)
         SELECT gen_random_uuid(), project_id, trigger_id, trigger_revision + 1, task_id,
                task_revision, execution_revision_id,
                'ql3:cron:v1:' || trigger_id || ':' || (trigger_revision + 1) || ':' || scheduled_for_ms,
                scheduled_for_ms, queued_at_ms, admitted_by
           FROM qlsched.runs",
    ),
    (
        "duplicate occurrence",
        "CREATE TEMPORARY TABLE removed_runs AS
         SELECT gen_random_uuid() AS run_id, trigger_id, scheduled_for_ms, request_id,
                'succeeded'::text AS status
           FROM qlsched.runs",
    ),
    (
        "unfinished run removed",
        "CREATE TEMPORARY TABLE removed_runs AS
         SELECT gen_random_uuid() AS run_id, 'gone'::text AS trigger_id, 0::bigint AS scheduled_for_ms,
                NULL::text AS request_id, 'queued'::text AS status",
    ),
    (
        "attempts not numbered 1..n",
        "UPDATE qlsched.attempts SET attempt_no = 2",
    ),
    (
        "live attempt",
        "INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
         SELECT gen_random_uuid(), run_id, 2, 'remote_worker', 'claimed', created_at_ms
           FROM qlsched.attempts",
    ),
    (
        "attempt state of status",
        "UPDATE qlsched.attempts SET state = 'dispatching'",
    ),
    (
        "claimed attempt touched",
        "UPDATE qlsched.attempts SET worker_id = 'w1'",
    ),
    (
        "events not numbered 1..n",
        "UPDATE qlsched.run_events SET seq = 3 WHERE seq = 2",
    ),
    (
        "admission events",
        "UPDATE qlsched.run_events SET kind = 'run.queued' WHERE seq = 1",
    ),
    (
        "event not a step",
        "INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
         SELECT run_id, 3, 'run.queued', at_ms FROM qlsched.run_events WHERE seq = 2",
    ),
    (
        "last event of status",
        "UPDATE qlsched.runs SET status = 'dispatching';
         UPDATE qlsched.attempts SET state = 'dispatching'",
    ),
    (
        "finishing event",
        "UPDATE qlsched.runs SET status = 'succeeded';
         UPDATE qlsched.attempts SET state = 'succeeded'",
    ),
    (
        "orphan attempt",
        "INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
         VALUES (gen_random_uuid(), gen_random_uuid(), 1, 'remote_worker', 'claimed', 0)",
    ),
    (
        "orphan event",
        "INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
         VALUES (gen_random_uuid(), 1, 'run.created', 0)",
    ),
    (
        "dangling run",
        "UPDATE qlsched.runs SET task_id = 'no-such-task'",
    ),
];

async fn one_admitted_run() -> TestDb {
    let db = TestDb::with_due(1).await;
    let c = Claimed::new(&db, &unique_owner("inv"), 30_000).await;
    assert!(matches!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Admitted { .. }
    ));
    db
}

#[tokio::test]
async fn every_invariant_names_what_breaks_it() {
    let db = one_admitted_run().await;
    db.assert_invariants().await;
    let mut failures = Vec::new();
    for (invariant, plant) in PLANTED {
        let db = one_admitted_run().await;
        let sql = db.superuser().await;
        sql.batch_execute("SET session_replication_role = replica")
            .await
            .unwrap();
        sql.batch_execute(plant)
            .await
            .unwrap_or_else(|e| panic!("planting {invariant}: {e:?}"));
        let found = invariants::check(&sql).await;
        if invariants::count(&found, invariant) == 0 {
            failures.push(format!(
                "{invariant}: not named after `{plant}`; found {found:?}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
