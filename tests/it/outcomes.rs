//! Trigger outcomes (V19, docs/policies-outcome.md): the summary kept where a run's outcome
//! is recorded, the pause after N consecutive failures (fenced like `trigger disable`), the
//! expected-success deadline and the gauges' counts.

use qlsched::store::manage::{self, ManageError, OutcomePolicy, TriggerSpec};
use qlsched::store::runs::cancel_chunk;
use qlsched::store::triggers::{self, outcome, ListQuery, StateFilter, TriggerOutcome};
use uuid::Uuid;

use crate::helpers::TestDb;

/// Trigger `t` (every minute) with `policy`, and `n` queued runs of it (a backfill of the
/// past day's first minutes), oldest first.
async fn trigger_with_runs(db: &TestDb, policy: OutcomePolicy, n: usize) -> Vec<Uuid> {
    let mut admin = db.admin_with_project().await;
    let spec = TriggerSpec {
        outcome_policy: policy,
        ..TriggerSpec::new("t", "proj", "task", "0 * * * * *", "UTC")
    };
    manage::publish_trigger(&mut admin, &spec).await.unwrap();
    let start = (db.now_ms().await / 60_000 - 24 * 60) * 60_000;
    let instants: Vec<i64> = (0..n as i64).map(|i| start + i * 60_000).collect();
    let c = triggers::backfill_chunk(&mut admin, "t", 1, &instants, "backfill:test")
        .await
        .unwrap();
    assert_eq!(c.admitted, n as u64);
    db.superuser()
        .await
        .query(
            "SELECT run_id FROM qlsched.runs WHERE trigger_id = 't' ORDER BY scheduled_for_ms",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Takes the oldest queued run through the protocol (lease `lease_ms`); (run, attempt, token).
async fn take_one(d: &tokio_postgres::Client, lease_ms: i64) -> (Uuid, Uuid, Uuid) {
    let r = d
        .query_one(
            "SELECT run_id, attempt_id, lease_token FROM qlsched.dispatch_take('w', NULL, 1, $1)",
            &[&lease_ms],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// Takes the oldest queued run, starts it and finishes it `outcome` with `error`; its id.
async fn run_to(db: &TestDb, outcome: &str, error: Option<&str>) -> Uuid {
    let d = db.client("qlsched_dispatcher").await;
    let (run, attempt, token) = take_one(&d, 30_000).await;
    let started: bool = d
        .query_one(
            "SELECT qlsched.dispatch_start($1, $2, 30000)",
            &[&attempt, &token],
        )
        .await
        .unwrap()
        .get(0);
    assert!(started);
    let finished: bool = d
        .query_one(
            "SELECT qlsched.dispatch_finish($1, $2, $3, 1, 'tail', $4, NULL)",
            &[&attempt, &token, &outcome, &error],
        )
        .await
        .unwrap()
        .get(0);
    assert!(finished);
    run
}

/// Takes the oldest queued run and lets its lease lapse; dispatch_expire marks it lost (one
/// attempt allowed: the run fails). Its id.
async fn run_lost(db: &TestDb) -> Uuid {
    let d = db.client("qlsched_dispatcher").await;
    let (run, ..) = take_one(&d, 30_000).await;
    db.superuser()
        .await
        .batch_execute(
            "ALTER TABLE qlsched.attempts DISABLE TRIGGER attempts_follow_the_protocol;
             UPDATE qlsched.attempts SET lease_expires_at_ms = lease_expires_at_ms - 86400000
              WHERE lease_id IS NOT NULL AND state IN ('dispatching', 'running');
             ALTER TABLE qlsched.attempts ENABLE TRIGGER attempts_follow_the_protocol;",
        )
        .await
        .unwrap();
    let r = d
        .query_one(
            "SELECT lost, retried FROM qlsched.dispatch_expire(100)",
            &[],
        )
        .await
        .unwrap();
    assert_eq!((r.get::<_, i64>(0), r.get::<_, i64>(1)), (1, 0));
    run
}

async fn outcome_of(db: &TestDb, id: &str) -> TriggerOutcome {
    triggers::show(&db.admin().await, id).await.unwrap().outcome
}

fn id(run: Uuid) -> Option<String> {
    Some(run.to_string())
}

#[tokio::test]
async fn the_summary_follows_success_failure_lost_and_cancel() {
    let db = TestDb::new().await;
    let runs = trigger_with_runs(&db, OutcomePolicy::default(), 5).await;
    assert_eq!(outcome_of(&db, "t").await, TriggerOutcome::default());

    let ok = run_to(&db, "succeeded", None).await;
    let o = outcome_of(&db, "t").await;
    assert_eq!(o.last_success_run_id, id(ok));
    assert!(o.last_success_at_ms.is_some());
    assert_eq!((o.consecutive_failures, o.last_failure_at_ms), (0, None));

    // dispatch_finish writes the error after the run's status: the summary has it anyway.
    let failed = run_to(&db, "failed", Some("boom: exit 3")).await;
    let o = outcome_of(&db, "t").await;
    assert_eq!(o.last_failure_run_id, id(failed));
    assert_eq!(o.last_failure_error.as_deref(), Some("boom: exit 3"));
    assert_eq!(o.consecutive_failures, 1);
    assert_eq!(o.last_success_run_id, id(ok), "the last success stays");

    let lost = run_lost(&db).await;
    let o = outcome_of(&db, "t").await;
    assert_eq!(o.last_failure_run_id, id(lost));
    assert!(
        o.last_failure_error
            .as_deref()
            .is_some_and(|e| e.starts_with("lost: lease expired")),
        "{o:?}"
    );
    assert_eq!(o.consecutive_failures, 2, "a lost run is a failure");

    // A cancelled run neither counts as a failure nor ends the streak.
    let queued = runs[3];
    assert_eq!(
        cancel_chunk(&mut db.admin().await, &[queued])
            .await
            .unwrap(),
        1
    );
    let o = outcome_of(&db, "t").await;
    assert_eq!(o.last_cancelled_run_id, id(queued));
    assert_eq!(o.consecutive_failures, 2);

    let ok2 = run_to(&db, "succeeded", None).await;
    assert_eq!(ok2, runs[4]);
    let o = outcome_of(&db, "t").await;
    assert_eq!(
        (o.last_success_run_id, o.consecutive_failures),
        (id(ok2), 0)
    );
    assert_eq!(o.last_failure_run_id, id(lost), "the last failure stays");
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_long_error_is_kept_bounded() {
    let db = TestDb::new().await;
    trigger_with_runs(&db, OutcomePolicy::default(), 1).await;
    let long = "é".repeat(4000);
    run_to(&db, "failed", Some(&long)).await;
    let e = outcome_of(&db, "t").await.last_failure_error.unwrap();
    assert_eq!(e.chars().count(), 1000);
}

#[tokio::test]
async fn n_failures_pause_the_trigger_like_a_disable_and_enable_resets_the_count() {
    let db = TestDb::new().await;
    let policy = OutcomePolicy {
        pause_after_failures: Some(2),
        expect_success_within_ms: None,
    };
    trigger_with_runs(&db, policy, 4).await;
    let su = db.superuser().await;
    let versions = "SELECT state_version FROM qlsched.trigger_schedules WHERE trigger_id = 't'";
    let before: i64 = su.query_one(versions, &[]).await.unwrap().get(0);

    run_to(&db, "failed", Some("first")).await;
    let v = triggers::show(&db.admin().await, "t").await.unwrap();
    assert!(v.enabled, "one failure of two: still running");
    assert_eq!(v.outcome.consecutive_failures, 1);

    run_to(&db, "failed", Some("disk full")).await;
    let v = triggers::show(&db.admin().await, "t").await.unwrap();
    assert!(!v.enabled && v.operator_disabled, "{v:?}");
    assert_eq!(v.disabled_by.as_deref(), Some("qlsched"));
    let note = v.disabled_note.clone().unwrap();
    assert!(
        note.contains("2 consecutive failed runs") && note.contains("disk full"),
        "{note}"
    );
    assert!(v.outcome.system_paused_at_ms.is_some());
    // Fenced as `trigger disable` fences: out of the claim index, versions bumped.
    let row = su
        .query_one(
            "SELECT claimable_at_ms, claim_owner, state_version FROM qlsched.trigger_schedules WHERE trigger_id = 't'",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(row.get::<_, Option<i64>>(0), None);
    assert_eq!(row.get::<_, Option<String>>(1), None);
    assert!(row.get::<_, i64>(2) > before);
    // Nothing is admitted for it any more: a fire is refused as for a disabled trigger.
    let fired = triggers::fire(&mut db.admin().await, "t", "after-pause", "test").await;
    assert!(
        matches!(fired, Err(ManageError::Disabled { .. })),
        "{fired:?}"
    );
    assert_eq!(
        outcome::gauges(&su).await.unwrap(),
        vec![("proj".to_string(), 0, 1)]
    );

    // `trigger enable` resumes it and resets the count; one more failure does not pause it.
    assert_eq!(
        triggers::enable(&mut db.admin().await, "t", "alice")
            .await
            .unwrap(),
        triggers::Changed::Yes
    );
    let o = outcome_of(&db, "t").await;
    assert_eq!((o.consecutive_failures, o.system_paused_at_ms), (0, None));
    assert!(outcome::gauges(&su).await.unwrap().is_empty());
    run_to(&db, "failed", Some("again")).await;
    let v = triggers::show(&db.admin().await, "t").await.unwrap();
    assert!(v.enabled, "1 failure after the enable of 2 allowed");
    assert_eq!(v.outcome.consecutive_failures, 1);
    db.assert_invariants().await;
}

/// A pause by the system appends one audit row in the run end's transaction (V26): source
/// `system`, actor `qlsched`, action `pause` on the trigger, the switch and the count as
/// changes, the note naming both; `qlsched audit --trigger` shows it.
#[tokio::test]
async fn a_system_pause_appends_one_audit_row_that_audit_trigger_shows() {
    let db = TestDb::new().await;
    let policy = OutcomePolicy {
        pause_after_failures: Some(2),
        expect_success_within_ms: None,
    };
    trigger_with_runs(&db, policy, 3).await;
    let pauses = "SELECT count(*) FROM qlsched.audit_log WHERE action = 'pause'";
    run_to(&db, "failed", Some("first")).await;
    assert_eq!(db.count(pauses).await, 0, "one failure of two: no pause");
    run_to(&db, "failed", Some("disk full")).await;
    assert_eq!(db.count(pauses).await, 1, "the pause appended one row");

    let page: serde_json::Value = serde_json::from_str(&crate::helpers::cli::ok(
        crate::helpers::cli::ql(&db, &["audit", "--json", "--trigger", "t", "--limit", "1"]),
    ))
    .unwrap();
    let e = &page["entries"][0];
    assert_eq!(
        (
            &e["source"],
            &e["actor"],
            &e["object_kind"],
            &e["object_id"]
        ),
        (
            &serde_json::json!("system"),
            &serde_json::json!("qlsched"),
            &serde_json::json!("trigger"),
            &serde_json::json!("t")
        ),
        "{e}"
    );
    assert_eq!(
        (&e["action"], &e["project_id"]),
        (&serde_json::json!("pause"), &serde_json::json!("proj")),
        "{e}"
    );
    assert_eq!(
        e["changes"],
        serde_json::json!({
            "enabled": {"before": true, "after": false},
            "consecutive_failures": {"before": 1, "after": 2}
        }),
        "{e}"
    );
    let note = e["note"].as_str().unwrap_or_default();
    assert!(
        note.contains("2 consecutive failed runs") && note.contains("disk full"),
        "{e}"
    );
    let text = crate::helpers::cli::ok(crate::helpers::cli::ql(
        &db,
        &["audit", "--trigger", "t", "--limit", "1"],
    ));
    assert!(text.contains("trigger t pause"), "{text}");
    db.assert_invariants().await;
}

#[tokio::test]
async fn an_operator_disabled_trigger_is_not_paused_again() {
    let db = TestDb::new().await;
    let policy = OutcomePolicy {
        pause_after_failures: Some(1),
        expect_success_within_ms: None,
    };
    trigger_with_runs(&db, policy, 1).await;
    let d = db.client("qlsched_dispatcher").await;
    let (_, attempt, token) = take_one(&d, 30_000).await;
    triggers::disable(&mut db.admin().await, "t", Some("maintenance"), "bob")
        .await
        .unwrap();
    d.query_one(
        "SELECT qlsched.dispatch_finish($1, $2, 'failed', 1, NULL, 'x', NULL)",
        &[&attempt, &token],
    )
    .await
    .unwrap();
    let v = triggers::show(&db.admin().await, "t").await.unwrap();
    assert_eq!(
        v.disabled_by.as_deref(),
        Some("bob"),
        "the operator's note stays"
    );
    assert_eq!(v.outcome.system_paused_at_ms, None);
    assert_eq!(v.outcome.consecutive_failures, 1);
}

/// Moves `t`'s outcome clock back by `ms` (its start and deadline), as if that long had passed.
async fn age(db: &TestDb, ms: i64) {
    db.superuser()
        .await
        .execute(
            "UPDATE qlsched.trigger_outcomes
                SET enabled_since_ms = enabled_since_ms - $1, success_due_at_ms = success_due_at_ms - $1
              WHERE trigger_id = 't'",
            &[&ms],
        )
        .await
        .unwrap();
}

async fn overdue_ids(db: &TestDb) -> Vec<String> {
    let q = ListQuery {
        project: None,
        state: StateFilter::Overdue,
        after: None,
        limit: 100,
    };
    triggers::list(&db.admin().await, &q)
        .await
        .unwrap()
        .into_iter()
        .map(|v| v.trigger_id)
        .collect()
}

#[tokio::test]
async fn a_trigger_without_a_success_within_its_window_is_overdue_until_one() {
    let db = TestDb::new().await;
    let policy = OutcomePolicy {
        pause_after_failures: None,
        expect_success_within_ms: Some(60_000),
    };
    trigger_with_runs(&db, policy, 2).await;
    let mut admin = db.admin().await;
    // A trigger without the window is never overdue.
    manage::publish_trigger(
        &mut admin,
        &TriggerSpec::new("plain", "proj", "task", "0 * * * * *", "UTC"),
    )
    .await
    .unwrap();
    let o = outcome_of(&db, "t").await;
    let due = o
        .success_due_at_ms
        .expect("a running trigger with a window has a deadline");
    assert!((due - db.now_ms().await - 60_000).abs() < 5_000, "{o:?}");
    assert!(!o.overdue);
    assert!(overdue_ids(&db).await.is_empty());

    age(&db, 120_000).await;
    assert_eq!(overdue_ids(&db).await, vec!["t".to_string()]);
    assert!(outcome_of(&db, "t").await.overdue);
    let su = db.superuser().await;
    assert_eq!(
        outcome::gauges(&su).await.unwrap(),
        vec![("proj".to_string(), 1, 0)]
    );

    // A failure does not help; a success does: the deadline is a window from it.
    run_to(&db, "failed", Some("no")).await;
    assert_eq!(overdue_ids(&db).await, vec!["t".to_string()]);
    run_to(&db, "succeeded", None).await;
    let o = outcome_of(&db, "t").await;
    assert_eq!(
        o.success_due_at_ms,
        o.last_success_at_ms.map(|s| s + 60_000)
    );
    assert!(overdue_ids(&db).await.is_empty());
    assert!(outcome::gauges(&su).await.unwrap().is_empty());

    // Disabled: no deadline. Enabled again: a full window from the enable.
    age(&db, 120_000).await;
    triggers::disable(&mut admin, "t", None, "bob")
        .await
        .unwrap();
    assert_eq!(outcome_of(&db, "t").await.success_due_at_ms, None);
    assert!(overdue_ids(&db).await.is_empty());
    triggers::enable(&mut admin, "t", "bob").await.unwrap();
    let due = outcome_of(&db, "t").await.success_due_at_ms.unwrap();
    assert!((due - db.now_ms().await - 60_000).abs() < 5_000);
}

#[tokio::test]
async fn publish_checks_the_bounds_and_a_changed_policy_is_a_new_revision() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let with = |p: OutcomePolicy| TriggerSpec {
        outcome_policy: p,
        ..TriggerSpec::new("t", "proj", "task", "0 * * * * *", "UTC")
    };
    for (p, want) in [
        (Some(0), None),
        (Some(1001), None),
        (None, Some(59_999)),
        (None, Some(31_622_400_001)),
    ] {
        let spec = with(OutcomePolicy {
            pause_after_failures: p,
            expect_success_within_ms: want,
        });
        let err = manage::publish_trigger(&mut admin, &spec)
            .await
            .unwrap_err();
        assert!(
            matches!(
                err,
                ManageError::PauseAfterFailures { .. } | ManageError::ExpectSuccessWithin { .. }
            ),
            "{err}"
        );
        assert!(err.to_string().contains("must be within"), "{err}");
    }
    // The database refuses them too, whoever writes.
    let plain = with(OutcomePolicy::default());
    manage::publish_trigger(&mut admin, &plain).await.unwrap();
    let su = db.superuser().await;
    let e = su
        .execute("UPDATE qlsched.triggers SET pause_after_failures = 0", &[])
        .await
        .unwrap_err();
    assert_eq!(
        e.code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION)
    );
    // Without policies the digest is the one before V19: a republish stays a no-op.
    let old = qlsched::store::manage::sha256_hex(
        "trigger:v1\nproj\ntask\n0 * * * * *\nUTC\nskip\n60000\ntrue".as_bytes(),
    );
    assert_eq!(plain.content_digest(), old);
    assert!(
        !manage::publish_trigger(&mut admin, &plain)
            .await
            .unwrap()
            .changed
    );
    let p = with(OutcomePolicy {
        pause_after_failures: Some(3),
        expect_success_within_ms: Some(3_600_000),
    });
    let r = manage::publish_trigger(&mut admin, &p).await.unwrap();
    assert_eq!((r.revision, r.changed), (2, true));
    assert!(
        !manage::publish_trigger(&mut admin, &p)
            .await
            .unwrap()
            .changed
    );
    let o = outcome_of(&db, "t").await;
    assert_eq!(
        (o.pause_after_failures, o.expect_success_within_ms),
        (Some(3), Some(3_600_000))
    );
}

/// Only the owner writes outcomes (through V19's triggers); the admin and runtime roles read
/// them, the dispatcher does not; no role may call the trigger functions.
#[tokio::test]
async fn no_role_writes_an_outcome_by_hand() {
    let db = TestDb::new().await;
    trigger_with_runs(&db, OutcomePolicy::default(), 1).await;
    run_to(&db, "failed", Some("x")).await;
    for role in [
        "qlsched_admin",
        "qlsched_runtime",
        "qlsched_dispatcher",
        "qlsched_worker_ingress",
    ] {
        let c = db.client(role).await;
        for sql in [
            "UPDATE qlsched.trigger_outcomes SET consecutive_failures = 0",
            "INSERT INTO qlsched.trigger_outcomes (trigger_id, project_id, updated_at_ms) VALUES ('x', 'proj', 0)",
            "DELETE FROM qlsched.trigger_outcomes",
            "SELECT qlsched.trigger_outcome_of_run()",
        ] {
            let e = c.batch_execute(sql).await.unwrap_err();
            assert!(
                e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE)
                    || e.code() == Some(&tokio_postgres::error::SqlState::FEATURE_NOT_SUPPORTED),
                "{role}: {sql}: {e:?}"
            );
        }
        let read = c
            .query_one("SELECT count(*) FROM qlsched.trigger_outcomes", &[])
            .await;
        assert_eq!(
            read.is_ok(),
            matches!(role, "qlsched_admin" | "qlsched_runtime"),
            "{role}: {read:?}"
        );
    }
    assert_eq!(outcome_of(&db, "t").await.consecutive_failures, 1);
}

/// The gauge statement reads only the deadlines already passed: 20,000 triggers with a
/// deadline, 30 of them past, and the due index's scan returns those 30 (the clock is its
/// index condition, not a filter over every deadline), whatever the plan's shape.
#[tokio::test]
async fn the_overdue_count_reads_only_the_passed_deadlines_from_its_index() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute(concat!(
        "INSERT INTO qlsched.trigger_outcomes (trigger_id, project_id, expect_success_within_ms,
                                               enabled_since_ms, success_due_at_ms, updated_at_ms)
         SELECT 'o' || g, 'p' || (g % 7), 86400000, n, n + CASE WHEN g <= 30 THEN -1000 ELSE 86400000 END, n
           FROM generate_series(1, 20000) g, (SELECT ",
        qlsched::db_now_ms!(),
        " AS n) x"
    ))
    .await
    .unwrap();
    su.batch_execute("VACUUM ANALYZE qlsched.trigger_outcomes")
        .await
        .unwrap();
    let p = crate::helpers::plan(
        &su,
        &format!("EXPLAIN (ANALYZE, BUFFERS) {}", outcome::OUTCOME_GAUGES_SQL),
        &[],
    )
    .await;
    let due_scan = p
        .lines()
        .position(|l| l.contains("trigger_outcomes_due_idx"))
        .unwrap_or_else(|| panic!("the due index is not read:\n{p}"));
    let scan_lines: Vec<&str> = p.lines().skip(due_scan).take(3).collect();
    assert!(
        scan_lines
            .iter()
            .any(|l| l.contains("Index Cond") && l.contains("success_due_at_ms")),
        "the clock is not the index condition:\n{p}"
    );
    assert!(!p.contains("Rows Removed by Filter"), "{p}");
    let total: i64 = outcome::gauges(&su)
        .await
        .unwrap()
        .iter()
        .map(|g| g.1)
        .sum();
    assert_eq!(total, 30);
}

/// The real binary's `trigger show`, `trigger list --state overdue` and `--json`, and a
/// replica's console, show the summary; an error holding markup is shown as text.
#[tokio::test]
async fn the_cli_and_the_console_show_the_outcome_with_its_error_escaped() {
    use crate::helpers::cli::{ok, ql};
    let db = TestDb::new().await;
    let policy = OutcomePolicy {
        pause_after_failures: Some(5),
        expect_success_within_ms: Some(60_000),
    };
    trigger_with_runs(&db, policy, 1).await;
    run_to(
        &db,
        "failed",
        Some("<script>window.__xss=1</script> & <b>x</b>"),
    )
    .await;
    age(&db, 120_000).await;

    let show = ok(ql(&db, &["trigger", "show", "t"]));
    for want in [
        "policies     pause after 5 failures; expect success within 1 min",
        "failures     1 in a row",
        "(OVERDUE)",
        "<script>window.__xss=1</script>",
    ] {
        assert!(show.contains(want), "`{want}` missing:\n{show}");
    }
    let list = ok(ql(&db, &["trigger", "list", "--state", "overdue"]));
    assert!(
        list.contains("OUTCOME")
            && list
                .lines()
                .any(|l| l.starts_with("t ") && l.trim_end().ends_with("OVERDUE 1 failed")),
        "{list}"
    );
    let json: serde_json::Value =
        serde_json::from_str(&ok(ql(&db, &["trigger", "show", "t", "--json"]))).unwrap();
    assert_eq!(json["outcome"]["consecutive_failures"], 1, "{json}");
    assert_eq!(json["outcome"]["overdue"], true, "{json}");
    assert_eq!(json["outcome"]["pause_after_failures"], 5, "{json}");

    let mut r = crate::helpers::replica::ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "outcome1",
        "",
        &[],
    );
    r.wait_ready(std::time::Duration::from_secs(30)).await;
    let (status, _, page) = crate::console::get(r.http, "/triggers/t", &[]);
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("&lt;script&gt;window.__xss=1&lt;/script&gt; &amp; &lt;b&gt;x&lt;/b&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<script>window") && !page.contains("<b>x"),
        "{page}"
    );
    assert!(page.contains("id=\"overdue\""), "{page}");
    let (status, _, page) = crate::console::get(r.http, "/triggers?state=overdue", &[]);
    assert_eq!(status, 200, "{page}");
    assert!(page.contains("OVERDUE 1 failed"), "{page}");
    assert!(r
        .terminate(std::time::Duration::from_secs(30))
        .await
        .success());
}
