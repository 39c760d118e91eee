//! Everyday edits of a trigger — republish, enable, disable, fire, backfill — lose no
//! occurrence and duplicate none (docs/design.md, "Who turns a trigger on and off",
//! "Manual fire", "Backfill").

use std::process::Stdio;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use qlsched::store::manage::{self, ManageError, TriggerSpec};
use qlsched::store::triggers;

use crate::helpers::cli::{backfill_args, command, ok, ql, refused};
use crate::helpers::replica::ReplicaProc;
use crate::helpers::{poll_until, wait_until, TestDb};

const EVERY_SECOND: &str = "* * * * * *";

fn local_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Aims a change at "5 ms before a whole second" of the database clock: the change reads
/// the clock a few round trips after it starts, so it starts that much earlier (`lead_ms`,
/// learnt from the previous try). Returns the second aimed at.
async fn until_just_before_a_second(db: &TestDb, lead_ms: i64) -> i64 {
    let skew = db.now_ms().await - local_ms();
    let boundary = (db.now_ms().await / 1000 + 2) * 1000;
    let wait = boundary - 5 - lead_ms - (local_ms() + skew);
    tokio::time::sleep(Duration::from_millis(wait.max(0) as u64)).await;
    boundary
}

/// Whether the change read the database clock within 50 ms before `boundary`; if not (a
/// slow moment), the caller tries again, starting earlier or later by what this try missed
/// by (at most 20 tries).
fn just_before(read_at: i64, boundary: i64, lead_ms: &mut i64, tries: &mut u32) -> bool {
    *tries += 1;
    assert!(
        *tries <= 20,
        "the change never read the clock within 50 ms before its second"
    );
    *lead_ms = (*lead_ms + read_at - (boundary - 5)).clamp(0, 500);
    (boundary - 50..boundary).contains(&read_at)
}

/// Starts a replica once the database clock is past `boundary` (so that its first claim
/// comes after the occurrence fell due), waits until it admitted the occurrence one second
/// after `boundary`, and returns the revisions of the runs admitted for `boundary`.
async fn runs_at_boundary_after_a_late_first_claim(
    db: &TestDb,
    trigger: &str,
    boundary: i64,
) -> Vec<i64> {
    wait_until(
        "the database clock past the boundary",
        Duration::from_secs(5),
        || async { db.now_ms().await > boundary + 50 },
    )
    .await;
    let mut replica = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "a", "", &[]);
    replica.wait_ready(Duration::from_secs(30)).await;
    let su = db.superuser().await;
    wait_until(
        "a run one second after the boundary",
        Duration::from_secs(20),
        || async {
            su.query_one(
                "SELECT count(*) FROM qlsched.runs WHERE trigger_id = $1 AND scheduled_for_ms > $2",
                &[&trigger, &boundary],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
                >= 1
        },
    )
    .await;
    replica.terminate(Duration::from_secs(20)).await;
    db.assert_invariants().await;
    su.query(
        "SELECT trigger_revision FROM qlsched.runs WHERE trigger_id = $1 AND scheduled_for_ms = $2",
        &[&trigger, &boundary],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The database clock at which a trigger's last change read "now" (its `updated_at_ms`).
async fn changed_at(db: &TestDb, trigger: &str) -> i64 {
    db.superuser()
        .await
        .query_one(
            "SELECT updated_at_ms FROM qlsched.triggers WHERE trigger_id = $1",
            &[&trigger],
        )
        .await
        .unwrap()
        .get(0)
}

/// The publisher publishes `spec` enabled: a change of the definition.
async fn publish_enabled(admin: &mut tokio_postgres::Client, spec: &mut TriggerSpec) {
    spec.enabled = true;
    assert!(manage::publish_trigger(admin, spec).await.unwrap().changed);
}

/// A database with trigger `id` (project `proj`, task `task`, `cron` in UTC) published
/// enabled or not; the admin session that published it and its spec.
async fn published(
    id: &str,
    cron: &str,
    enabled: bool,
) -> (TestDb, tokio_postgres::Client, TriggerSpec) {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let mut spec = TriggerSpec::new(id, "proj", "task", cron, "UTC");
    spec.enabled = enabled;
    manage::publish_trigger(&mut admin, &spec).await.unwrap();
    (db, admin, spec)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_republish_5_ms_before_an_occurrence_admits_that_occurrence() {
    let (db, mut admin, mut spec) = published("edit-1", EVERY_SECOND, true).await;
    let (mut tries, mut lead) = (0, 0);
    let boundary = loop {
        let boundary = until_just_before_a_second(&db, lead).await;
        // A changed definition: a new revision, which fences out anything of the old one.
        spec.misfire_grace_ms -= 1;
        assert!(
            manage::publish_trigger(&mut admin, &spec)
                .await
                .unwrap()
                .changed
        );
        if just_before(
            changed_at(&db, "edit-1").await,
            boundary,
            &mut lead,
            &mut tries,
        ) {
            break boundary;
        }
    };
    let revisions = runs_at_boundary_after_a_late_first_claim(&db, "edit-1", boundary).await;
    let last_revision = spec_revision(&db, "edit-1").await;
    assert_eq!(
        revisions,
        vec![last_revision],
        "one run for the occurrence due 5 ms after the republish, under the new revision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enable_5_ms_before_an_occurrence_admits_that_occurrence() {
    let (db, mut admin, _) = published("edit-2", EVERY_SECOND, true).await;
    let (mut tries, mut lead) = (0, 0);
    let boundary = loop {
        triggers::disable(&mut admin, "edit-2", Some("maintenance"), "tester")
            .await
            .unwrap();
        let boundary = until_just_before_a_second(&db, lead).await;
        triggers::enable(&mut admin, "edit-2", "tester")
            .await
            .unwrap();
        let enabled_at = db
            .count("SELECT enabled_at_ms FROM qlsched.triggers WHERE trigger_id = 'edit-2'")
            .await;
        if just_before(enabled_at, boundary, &mut lead, &mut tries) {
            break boundary;
        }
    };
    let revisions = runs_at_boundary_after_a_late_first_claim(&db, "edit-2", boundary).await;
    assert_eq!(
        revisions.len(),
        1,
        "one run for the occurrence due 5 ms after the enable"
    );
}

async fn spec_revision(db: &TestDb, trigger: &str) -> i64 {
    db.superuser()
        .await
        .query_one(
            "SELECT revision FROM qlsched.triggers WHERE trigger_id = $1",
            &[&trigger],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fire_retried_after_a_republish_admits_no_second_run() {
    let (db, mut admin, mut spec) = published("edit-3", "0 2 * * *", true).await;
    let fire = || {
        serde_json::from_str::<serde_json::Value>(&ok(ql(
            &db,
            &[
                "trigger",
                "fire",
                "edit-3",
                "--request-id",
                "deploy-9",
                "--json",
            ],
        )))
        .unwrap()
    };
    let first = fire();
    assert_eq!(first["admitted"], true, "{first}");
    assert_eq!(first["idempotency_key"], "ql3:manual:v2:edit-3:deploy-9");
    // The reply was lost; meanwhile the trigger is republished with a changed expression.
    spec.cron_expr = "0 3 * * *".into();
    assert!(
        manage::publish_trigger(&mut admin, &spec)
            .await
            .unwrap()
            .changed
    );
    let retried = fire();
    assert_eq!(retried["admitted"], false, "{retried}");
    assert_eq!(
        retried["run_id"], first["run_id"],
        "the first run is reported"
    );
    let runs = "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'edit-3'";
    assert_eq!(db.count(runs).await, 1);

    // A request id used before V8 (its key carried the revision) admits nothing new either.
    let su = db.superuser().await;
    let legacy = "ql3:manual:v1:edit-3:1:deploy-9";
    su.execute(
        "UPDATE qlsched.runs SET idempotency_key = $1 WHERE trigger_id = 'edit-3'",
        &[&legacy],
    )
    .await
    .unwrap();
    let again = fire();
    assert_eq!(again["admitted"], false, "{again}");
    assert_eq!(again["idempotency_key"], legacy);
    assert_eq!(db.count(runs).await, 1);
    db.assert_invariants().await;
}

async fn state(db: &TestDb, trigger: &str) -> (bool, bool, bool) {
    let r = db
        .superuser()
        .await
        .query_one(
            "SELECT enabled, published_enabled, operator_disabled FROM qlsched.triggers
              WHERE trigger_id = $1",
            &[&trigger],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// Whether the schedule row is in the claim index (something will fire).
async fn claimable(db: &TestDb, trigger: &str) -> bool {
    db.superuser()
        .await
        .query_one(
            "SELECT claimable_at_ms IS NOT NULL FROM qlsched.trigger_schedules WHERE trigger_id = $1",
            &[&trigger],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trigger_published_disabled_is_started_only_by_its_publisher() {
    let (db, mut admin, mut spec) = published("edit-4", EVERY_SECOND, false).await;
    // The operator cannot override the publisher's --disabled ...
    refused(
        ql(&db, &["trigger", "enable", "edit-4"]),
        4,
        &["edit-4", "published disabled"],
    );
    assert_eq!(state(&db, "edit-4").await, (false, false, false));
    // ... so the same publish again is "unchanged" and the trigger stays off.
    let p = manage::publish_trigger(&mut admin, &spec).await.unwrap();
    assert!(!p.changed);
    assert_eq!(state(&db, "edit-4").await, (false, false, false));
    assert!(!claimable(&db, "edit-4").await);
    // The publisher turns it on.
    publish_enabled(&mut admin, &mut spec).await;
    assert_eq!(state(&db, "edit-4").await, (true, true, false));
    assert!(claimable(&db, "edit-4").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_disable_of_a_publish_disabled_trigger_survives_the_publish_that_enables_it() {
    let (db, mut admin, mut spec) = published("edit-5", EVERY_SECOND, false).await;
    let out = ok(ql(
        &db,
        &[
            "trigger",
            "disable",
            "edit-5",
            "--note",
            "incident 42",
            "--json",
        ],
    ));
    assert!(out.contains("\"changed\": true"), "recorded: {out}");
    assert_eq!(state(&db, "edit-5").await, (false, false, true));
    // The publisher's enable does not start what the operator stopped.
    publish_enabled(&mut admin, &mut spec).await;
    assert_eq!(state(&db, "edit-5").await, (false, true, true));
    assert!(!claimable(&db, "edit-5").await);
    // The operator's enable does.
    ok(ql(&db, &["trigger", "enable", "edit-5"]));
    assert_eq!(state(&db, "edit-5").await, (true, true, false));
    assert!(claimable(&db, "edit-5").await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_whose_trigger_is_republished_while_it_waits_refuses() {
    let (db, _, _) = published("edit-6", "* * * * *", true).await;
    // A republish in flight: the definition changes, the revision is bumped, not committed.
    let mut holder = db.superuser().await;
    let bump = holder.transaction().await.unwrap();
    bump.execute(
        "UPDATE qlsched.triggers SET revision = revision + 1, cron_expr = '*/2 * * * *'
          WHERE trigger_id = 'edit-6'",
        &[],
    )
    .await
    .unwrap();
    let now = db.now_ms().await;
    let (from, to) = (now - 3_600_000, now - 60_000);
    let rfc = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339()
    };
    let child = command(&db, &backfill_args("edit-6", &rfc(from), &rfc(to), &[]))
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The backfill now waits for the trigger row.
    poll_until(
        "the backfill waiting on the trigger row",
        Duration::from_secs(20),
        || async {
            let waiting = db
                .count(
                    "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND usename = 'qlsched_admin'
                    AND wait_event_type = 'Lock'",
                )
                .await;
            (waiting == 1).then_some(())
        },
    )
    .await;
    bump.commit().await.unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    refused(out, 4, &["edit-6", "changed to revision 2"]);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'edit-6'")
            .await,
        0,
        "nothing admitted under either revision"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backfill_on_a_corrupt_execution_revision_refuses_like_fire() {
    let (db, _, _) = published("edit-7", "* * * * *", true).await;
    db.superuser()
        .await
        .batch_execute("ALTER TABLE qlsched.execution_revisions DISABLE TRIGGER execution_revisions_are_immutable; UPDATE qlsched.execution_revisions SET spec = spec || 'tampered'; ALTER TABLE qlsched.execution_revisions ENABLE TRIGGER execution_revisions_are_immutable")
        .await
        .unwrap();
    let now = db.now_ms().await;
    let rfc = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .unwrap()
            .to_rfc3339()
    };
    let args = [
        "trigger",
        "backfill",
        "edit-7",
        "--from",
        &rfc(now - 600_000),
        "--to",
        &rfc(now - 60_000),
    ];
    refused(ql(&db, &args), 4, &["edit-7", "execution revision"]);
    refused(
        ql(&db, &["trigger", "fire", "edit-7"]),
        4,
        &["edit-7", "execution revision"],
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs").await,
        0,
        "nothing written"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_of_another_project_is_refused_at_publish_naming_both_projects() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await; // project `proj` with task `task`
    manage::set_project(&mut admin, "other", "active")
        .await
        .unwrap();
    // A trigger in `other` running `proj`'s task would never be admitted.
    let out = ql(
        &db,
        &[
            "trigger",
            "publish",
            "--id",
            "edit-8",
            "--project",
            "other",
            "--task",
            "task",
            "--cron",
            "* * * * *",
        ],
    );
    refused(out, 2, &["task task", "proj", "other"]);
    let err = manage::publish_trigger(
        &mut admin,
        &TriggerSpec::new("edit-8", "other", "task", "* * * * *", "UTC"),
    )
    .await
    .unwrap_err();
    assert!(
        matches!(&err, ManageError::TaskInOtherProject { task_project, project, .. }
                 if task_project == "proj" && project == "other"),
        "{err:?}"
    );
    // Publishing the task itself under another project is refused too: its execution
    // revisions and its triggers are `proj`'s.
    let out = ql(
        &db,
        &[
            "task",
            "publish",
            "--project",
            "other",
            "--id",
            "task",
            "--spec",
            "{}",
        ],
    );
    refused(out, 2, &["task task", "proj", "other"]);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.triggers WHERE trigger_id = 'edit-8'")
            .await,
        0
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.execution_revisions WHERE project_id = 'other'")
            .await,
        0
    );
}
