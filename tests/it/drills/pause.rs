//! The pause drill (docs/policies-outcome.md): a replica and a `qlsched worker` executing an
//! every-second trigger whose command always fails, published with
//! `--pause-after-failures 3`. The system disables it after its third failure in a row, like
//! an operator's disable: actor `qlsched`, a note naming the count and the last error, and
//! nothing admitted after the pause. `trigger enable` resumes it and resets the count.

use std::time::Duration;

use qlsched::store::manage::{self, OutcomePolicy, TriggerSpec};

use super::{tail, Fleet, EVERY_SECOND};
use crate::helpers::cli::{ok, ql};
use crate::helpers::worker::{WorkerOptions, WorkerProc};
use crate::helpers::{wait_until, TestDb};

#[tokio::test]
async fn a_trigger_whose_command_keeps_failing_is_paused_after_n_and_enable_resumes_it() {
    let db = TestDb::new().await;
    let mut admin = db.admin().await;
    manage::set_project(&mut admin, "proj", "active")
        .await
        .unwrap();
    let spec = serde_json::json!({
        "executor": "shell",
        "command": ["/bin/sh", "-c", "echo 'disk full' >&2; exit 3"],
    })
    .to_string();
    manage::publish_task(&mut admin, "proj", "broken", &spec)
        .await
        .unwrap();
    let trigger = TriggerSpec {
        outcome_policy: OutcomePolicy {
            pause_after_failures: Some(3),
            expect_success_within_ms: None,
        },
        ..TriggerSpec::new("nightly", "proj", "broken", EVERY_SECOND, "UTC")
    };
    manage::publish_trigger(&mut admin, &trigger).await.unwrap();
    let sql = db.superuser().await;
    let mut worker = WorkerProc::start(
        &db.dsn("qlsched_dispatcher"),
        "w0",
        WorkerOptions {
            worker: "concurrency = 4",
            ..Default::default()
        },
    );
    worker.wait_ready(Duration::from_secs(30)).await;
    let mut fleet = Fleet::new(&db.dsn("qlsched_runtime"), "", &[]);
    fleet.start(&["a"]).await;

    let paused = || async {
        super::scalar(
            &sql,
            "SELECT count(*) FROM qlsched.triggers
              WHERE trigger_id = 'nightly' AND NOT enabled AND operator_disabled
                AND disabled_by = 'qlsched'",
        )
        .await
            == 1
    };
    wait_until(
        "the trigger paused by qlsched",
        Duration::from_secs(60),
        paused,
    )
    .await;
    // Every run admitted before the pause ends (failed), and none is admitted after it.
    wait_until("the runs admitted before the pause ended", Duration::from_secs(30), || async {
        super::scalar(
            &sql,
            "SELECT count(*) FROM qlsched.runs WHERE status IN ('queued', 'dispatching', 'running')",
        )
        .await
            == 0
    })
    .await;
    let row = sql
        .query_one(
            "SELECT t.disabled_note, t.disabled_at_ms,
                    (SELECT count(*) FROM qlsched.runs r WHERE r.trigger_id = t.trigger_id
                        AND r.status = 'failed') AS failed,
                    (SELECT count(*) FROM qlsched.runs r WHERE r.trigger_id = t.trigger_id
                        AND r.status <> 'failed') AS other,
                    (SELECT count(*) FROM qlsched.runs r WHERE r.trigger_id = t.trigger_id
                        AND r.queued_at_ms > t.disabled_at_ms) AS after_pause,
                    o.consecutive_failures, o.system_paused_at_ms IS NOT NULL AS marked
               FROM qlsched.triggers t JOIN qlsched.trigger_outcomes o USING (trigger_id)
              WHERE t.trigger_id = 'nightly'",
            &[],
        )
        .await
        .unwrap();
    let note: String = row.get("disabled_note");
    let (failed, other, after_pause): (i64, i64, i64) =
        (row.get("failed"), row.get("other"), row.get("after_pause"));
    let logs = format!("{}\nworker:\n{}", fleet.logs(), tail(&worker.log(), 30));
    assert!(
        note.contains("3 consecutive") && note.contains("exited with status 3"),
        "the note names the count and the last error: {note}\n{logs}"
    );
    assert!(failed >= 3, "{failed} failed runs\n{logs}");
    assert_eq!(other, 0, "every run of the command failed\n{logs}");
    assert_eq!(after_pause, 0, "a run admitted after the pause\n{logs}");
    assert!(
        row.get::<_, bool>("marked"),
        "the outcome row marks the pause"
    );
    assert!(row.get::<_, i32>("consecutive_failures") >= 3);

    // `trigger enable` resumes it (nothing replayed: the cursor moved on) and resets the count.
    let enabled_at: i64 = super::scalar(&sql, concat!("SELECT ", qlsched::db_now_ms!())).await;
    ok(ql(&db, &["trigger", "enable", "nightly"]));
    assert_eq!(
        super::scalar(
            &sql,
            "SELECT consecutive_failures::bigint FROM qlsched.trigger_outcomes WHERE trigger_id = 'nightly'",
        )
        .await,
        0,
        "enable resets the count"
    );
    wait_until("a run admitted after enable", Duration::from_secs(30), || async {
        super::scalar(
            &sql,
            &format!(
                "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'nightly' AND queued_at_ms > {enabled_at}"
            ),
        )
        .await
            > 0
    })
    .await;
    assert_eq!(
        super::scalar(
            &sql,
            &format!(
                "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'nightly'
                  AND queued_at_ms > {enabled_at} AND scheduled_for_ms < {enabled_at} - 2000"
            ),
        )
        .await,
        0,
        "enable replayed occurrences of the pause"
    );
    fleet.stop_all().await;
    worker.signal(libc::SIGTERM);
    let st = worker.wait_exit(Duration::from_secs(30)).await;
    assert!(st.success(), "worker exited with {st}\n{logs}");
    db.assert_invariants().await;
}
