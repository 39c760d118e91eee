//! Publishing and project status changes under concurrency, and definitions refused at
//! publish. Each test here failed on the code before its fix.

use std::time::Duration;

use qlsched::store;
use qlsched::store::manage::{self, TriggerSpec};

use crate::helpers::{poll_until, wait_until, TestDb};

/// A trigger (re)published while its project is being resumed must end up claimable.
///
/// The interleaving is forced: a superuser holds the trigger's schedule row, so the publish
/// has read the project status and then waits on that row; the resume runs meanwhile. Before
/// the fix the publish had read `suspended` without a lock, the resume did not see the
/// not-yet-enabled trigger, and the publish then wrote `claimable_at_ms = NULL` under an
/// active project: the trigger was never claimed again.
#[tokio::test]
async fn a_trigger_published_while_its_project_is_resumed_becomes_claimable() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let mut spec = TriggerSpec::new("trg-race", "proj", "task", "* * * * * *", "UTC");
    spec.enabled = false;
    manage::publish_trigger(&mut admin, &spec).await.unwrap();
    manage::set_project(&mut admin, "proj", "suspended")
        .await
        .unwrap();

    let holder = db.superuser().await;
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM qlsched.trigger_schedules WHERE trigger_id = 'trg-race' FOR UPDATE",
        )
        .await
        .unwrap();
    spec.enabled = true;
    let publish = {
        let mut c = db.admin().await;
        let spec = spec.clone();
        tokio::spawn(async move { manage::publish_trigger(&mut c, &spec).await.unwrap() })
    };
    wait_until(
        "the publish to wait on the held row",
        Duration::from_secs(10),
        || async { db.lock_waiters().await == 1 },
    )
    .await;
    let resume = {
        let mut c = db.admin().await;
        tokio::spawn(async move { manage::set_project(&mut c, "proj", "active").await.unwrap() })
    };
    // Either the resume completes (old code) or it waits for the publish (fixed code).
    let db_ref = &db;
    let resume_ref = &resume;
    wait_until(
        "the resume to finish or wait",
        Duration::from_secs(10),
        || async move { resume_ref.is_finished() || db_ref.lock_waiters().await == 2 },
    )
    .await;
    holder.batch_execute("COMMIT").await.unwrap();
    publish.await.unwrap();
    resume.await.unwrap();

    let claimable: Option<i64> = db
        .superuser()
        .await
        .query_one(
            "SELECT claimable_at_ms FROM qlsched.trigger_schedules WHERE trigger_id = 'trg-race'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(
        claimable.is_some(),
        "enabled trigger of an active project left out of the claim index"
    );
    let pool = db.runtime_pool(1);
    let rows = poll_until(
        "the trigger claimed once due",
        Duration::from_secs(5),
        || {
            let pool = pool.clone();
            async move {
                let conn = store::conn(&pool).await.unwrap();
                let rows =
                    crate::helpers::drive::claim_due(&conn, "a", 30_000, 10, uuid::Uuid::new_v4())
                        .await
                        .unwrap();
                (!rows.is_empty()).then_some(rows)
            }
        },
    )
    .await;
    assert_eq!(rows.len(), 1, "the trigger is claimable");
}

/// Setting an active project to `active` again is no change: live claims stay.
#[tokio::test]
async fn setting_an_active_project_active_again_keeps_live_claims() {
    let db = TestDb::with_due(2).await;
    let pool = db.runtime_pool(1);
    let conn = store::conn(&pool).await.unwrap();
    let claimed = crate::helpers::drive::claim_due(&conn, "a", 30_000, 10, uuid::Uuid::new_v4())
        .await
        .unwrap();
    assert_eq!(claimed.len(), 2);
    let mut admin = db.admin().await;
    manage::set_project(&mut admin, "proj", "active")
        .await
        .unwrap();
    let still_held = db
        .count(
            "SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner = 'a' AND claim_version = 1",
        )
        .await;
    assert_eq!(still_held, 2, "a no-op status change fenced live claims");
    // A real change still fences.
    manage::set_project(&mut admin, "proj", "suspended")
        .await
        .unwrap();
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL")
            .await,
        0
    );
}

/// An expression whose last occurrence is already past is refused at publish, naming it,
/// and nothing is written.
#[tokio::test]
async fn an_expression_that_never_fires_again_is_refused_at_publish() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let spec = TriggerSpec::new("trg-past", "proj", "task", "0 0 0 1 1 ? 2020", "UTC");
    let err = manage::publish_trigger(&mut admin, &spec)
        .await
        .expect_err("a trigger whose last occurrence was in 2020 must be refused");
    let msg = err.to_string();
    assert!(msg.contains("trg-past"), "{msg}");
    assert!(msg.contains("0 0 0 1 1 ? 2020"), "{msg}");
    assert!(msg.contains("no occurrence after now"), "{msg}");
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.triggers").await,
        0,
        "nothing written"
    );
    // A year still to come is accepted.
    let ok = TriggerSpec::new("trg-future", "proj", "task", "0 0 0 1 1 ? 2099", "UTC");
    manage::publish_trigger(&mut admin, &ok).await.unwrap();
}
