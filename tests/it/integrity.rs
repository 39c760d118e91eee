//! Integrity of admitted work without foreign-key checks (migration V7, docs/design.md
//! "Integrity of admitted work"): a run can never reference a missing definition row, and an
//! attempt or event never a missing run.
//!
//! Two things replace the dropped checks, and each is tried here: definition rows and runs
//! cannot be removed by anyone (not even their owner), and a run is only ever written from
//! definition rows read in the same transaction, so a row that is missing anyway (forced out
//! below by the superuser with every trigger switched off) makes the admission, or a manual
//! fire, write nothing.

use qlsched::store::admission::{AdmitOutcome, Refusal};
use qlsched::store::manage::ManageError;
use qlsched::store::triggers;
use tokio_postgres::error::SqlState;

use crate::helpers::claimed::Claimed;
use crate::helpers::{unique_owner, TestDb};

/// Every way to remove a definition row or an admitted run, as the tables' owner and as
/// the superuser.
const REMOVALS: &[&str] = &[
    "DELETE FROM qlsched.projects",
    "DELETE FROM qlsched.execution_revisions",
    "DELETE FROM qlsched.tasks",
    "DELETE FROM qlsched.triggers WHERE trigger_id = 'trg-00000'",
    "DELETE FROM qlsched.runs",
    "TRUNCATE qlsched.projects CASCADE",
    "TRUNCATE qlsched.execution_revisions CASCADE",
    "TRUNCATE qlsched.tasks CASCADE",
    "TRUNCATE qlsched.triggers CASCADE",
    "TRUNCATE qlsched.runs",
];

#[tokio::test]
async fn definition_rows_and_runs_cannot_be_removed_even_by_their_owner() {
    let db = TestDb::with_due(1).await;
    let c = Claimed::new(&db, &unique_owner("perm"), 30_000).await;
    assert!(matches!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Admitted { .. }
    ));
    let mut failures = Vec::new();
    for role in ["qlsched_owner", "postgres"] {
        let client = db.client(role).await;
        for sql in REMOVALS {
            client.batch_execute("BEGIN").await.unwrap();
            let res = client.batch_execute(sql).await;
            client.batch_execute("ROLLBACK").await.unwrap();
            match &res {
                Err(e) if e.code() == Some(&SqlState::RESTRICT_VIOLATION) => {
                    let msg = e.as_db_error().map(|d| d.message().to_string());
                    if !msg.as_deref().is_some_and(|m| m.contains("are permanent")) {
                        failures.push(format!("{role}: `{sql}`: unexpected message {msg:?}"));
                    }
                }
                other => failures.push(format!("{role}: `{sql}` was not refused: {other:?}")),
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 1);
    assert_eq!(db.count("SELECT count(*) FROM qlsched.triggers").await, 1);
    db.assert_invariants().await;
}

/// The superuser forces a definition row out (every trigger off, so neither the permanence
/// guard nor the schedule row's own foreign keys stop it) after the row was claimed.
async fn remove_behind_the_guard(db: &TestDb, sql: &str) {
    db.superuser()
        .await
        .batch_execute(&format!(
            "SET session_replication_role = replica; {sql}; RESET session_replication_role"
        ))
        .await
        .unwrap();
}

#[tokio::test]
async fn an_admission_whose_definition_row_is_missing_writes_nothing() {
    for (table, sql, why) in [
        (
            "projects",
            "DELETE FROM qlsched.projects",
            Refusal::ProjectInactive,
        ),
        (
            "triggers",
            "DELETE FROM qlsched.triggers",
            Refusal::DefinitionChanged,
        ),
        (
            "tasks",
            "DELETE FROM qlsched.tasks",
            Refusal::DefinitionChanged,
        ),
        (
            "execution_revisions",
            "DELETE FROM qlsched.execution_revisions",
            Refusal::ExecutionRevisionInvalid,
        ),
    ] {
        let db = TestDb::with_due(1).await;
        let c = Claimed::new(&db, &unique_owner("gone"), 30_000).await;
        remove_behind_the_guard(&db, sql).await;
        assert_eq!(
            db.count(&format!("SELECT count(*) FROM qlsched.{table}"))
                .await,
            0,
            "{table} row removed"
        );
        let outcome = c.admit(&c.admission()).await;
        assert_eq!(outcome, AdmitOutcome::Refused { why }, "{table} missing");
        assert_eq!(
            db.count("SELECT count(*) FROM qlsched.runs").await
                + db.count("SELECT count(*) FROM qlsched.attempts").await
                + db.count("SELECT count(*) FROM qlsched.run_events").await,
            0,
            "{table} missing: nothing admitted"
        );
    }
}

#[tokio::test]
async fn a_manual_fire_whose_task_row_is_missing_writes_nothing() {
    let db = TestDb::new().await;
    db.seed(1, "0 0 0 1 1 *").await;
    let mut admin = db.admin().await;
    let fired = triggers::fire(&mut admin, "trg-00000", "before", "ops")
        .await
        .unwrap();
    assert!(fired.admitted);
    remove_behind_the_guard(&db, "DELETE FROM qlsched.tasks").await;
    let err = triggers::fire(&mut admin, "trg-00000", "after", "ops")
        .await
        .unwrap_err();
    assert!(
        matches!(err, ManageError::CorruptExecutionRevision { .. }),
        "{err:?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 1);
    assert_eq!(db.count("SELECT count(*) FROM qlsched.attempts").await, 1);
}
