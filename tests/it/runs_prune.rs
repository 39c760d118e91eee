//! `qlsched runs prune --queued-before T` (issue 21 item 3, migration V12): queued,
//! untouched runs admitted before T go with their attempts and events; younger, taken and
//! finished runs stay (taken ones counted); over `--max` nothing is written; afterwards
//! backfill refuses the pruned window and a cron occurrence is never admitted again; only
//! `qlsched.prune_queued` (EXECUTE to the admin role alone) can delete.

use std::time::Duration;

use qlsched::store::admit::AdmitOutcome;
use qlsched::store::dispatch::{FINISH_SQL, START_SQL, TAKE_SQL};
use qlsched::store::triggers::backfill_chunk;
use serde_json::Value;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::helpers::claimed::{admission, Claimed};
use crate::helpers::cli::{ok, ql, refused};
use crate::helpers::iso;
use crate::helpers::TestDb;

/// 2026-01-01T00:00:00Z in Unix ms.
const FROM_MS: i64 = 1_767_225_600_000;

fn json(out: String) -> Value {
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

/// Backfill runs of trg-00000 at minutes `minutes` of 2026-01-01 (queued now).
async fn admit_minutes(db: &TestDb, minutes: std::ops::Range<i64>) {
    let at: Vec<i64> = minutes.map(|m| FROM_MS + m * 60_000).collect();
    backfill_chunk(&mut db.admin().await, "trg-00000", 1, &at, "backfill:test")
        .await
        .unwrap();
}

/// A bound after every run admitted so far, and not in the future: the database clock once
/// it has passed the latest `queued_at_ms` (bounded wait, milliseconds in practice).
async fn bound_after_admissions(db: &TestDb) -> i64 {
    let latest = db
        .count("SELECT coalesce(max(queued_at_ms), 0) FROM qlsched.runs")
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = db.now_ms().await;
        if now > latest {
            return now;
        }
        assert!(std::time::Instant::now() < deadline, "database clock stuck");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

fn prune(db: &TestDb, before: i64, extra: &[&str]) -> std::process::Output {
    let b = iso(before);
    let mut args = vec!["runs", "prune", "--queued-before", &b];
    args.extend_from_slice(extra);
    ql(db, &args)
}

async fn pruned_through(db: &TestDb) -> Option<i64> {
    db.superuser()
        .await
        .query_one(
            "SELECT pruned_through_ms FROM qlsched.maintenance WHERE task = 'prune'",
            &[],
        )
        .await
        .unwrap()
        .get(0)
}

#[tokio::test]
async fn prune_removes_old_untouched_queued_runs_with_their_rows_and_leaves_the_rest() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    admit_minutes(&db, 0..12).await;
    let d = db.client("qlsched_dispatcher").await;
    // Two taken and committed; one of them finished (succeeded); one cancelled (finished).
    let taken: Vec<Uuid> = d
        .query(TAKE_SQL, &[&2i64])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(taken.len(), 2);
    d.query(START_SQL, &[&vec![taken[0]]]).await.unwrap();
    let done = d
        .query(
            FINISH_SQL,
            &[&vec![taken[0]], &vec!["succeeded"], &vec![None::<String>]],
        )
        .await
        .unwrap();
    assert_eq!(done.len(), 1);
    let victim: Uuid = db
        .superuser()
        .await
        .query_one(
            "SELECT run_id FROM qlsched.runs WHERE status = 'queued' ORDER BY run_id LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    ok(ql(&db, &["runs", "cancel", "--run", &victim.to_string()]));
    // One more held by a take still in progress when the prune runs.
    d.batch_execute("BEGIN").await.unwrap();
    assert_eq!(d.query(TAKE_SQL, &[&1i64]).await.unwrap().len(), 1);
    let before = bound_after_admissions(&db).await;
    // Younger runs, admitted after the bound.
    admit_minutes(&db, 30..33).await;
    let out = json(ok(prune(&db, before, &["--json"])));
    d.batch_execute("COMMIT").await.unwrap();
    // 12 old: 1 succeeded, 1 dispatching, 1 cancelled, 9 queued when read (one of them held).
    assert_eq!(out["matched"], 9, "{out}");
    assert_eq!(out["removed"], 8, "{out}");
    assert_eq!(out["left_alone"], 1, "the run being taken: {out}");
    assert_eq!(out["backfill_refused_before_ms"], before, "{out}");
    assert_eq!(
        db.status_counts().await,
        "cancelled/abandoned:1 dispatching/dispatching:2 queued/claimed:3 succeeded/succeeded:1"
    );
    // The 3 queued runs left are the younger ones.
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM qlsched.runs WHERE status = 'queued' AND queued_at_ms >= {before}"
        ))
        .await,
        3
    );
    // Each removed run took its attempt and its two events: 7 runs, 7 attempts, and the
    // events of 3 queued (2 each), 2 dispatching (3), 1 cancelled (3), 1 succeeded (5).
    assert_eq!(db.count("SELECT count(*) FROM qlsched.attempts").await, 7);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.run_events").await,
        6 + 6 + 3 + 5
    );
    assert_eq!(pruned_through(&db).await, Some(before));
    // Text form of a repeat: nothing left to remove, nothing advanced.
    let text = ok(prune(&db, before, &[]));
    assert!(
        text.contains("0 matched, 0 removed with their attempts and events, 0 left alone"),
        "{text}"
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn backfill_over_the_pruned_window_is_refused_afterwards() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    admit_minutes(&db, 0..5).await;
    let before = bound_after_admissions(&db).await;
    let out = json(ok(prune(&db, before, &["--json"])));
    assert_eq!(out["removed"], 5, "{out}");
    // The window whose runs were removed: refused, nothing admitted again.
    let from = iso(FROM_MS);
    let to = iso(FROM_MS + 3_600_000);
    refused(
        ql(
            &db,
            &[
                "trigger",
                "backfill",
                "trg-00000",
                "--from",
                &from,
                "--to",
                &to,
            ],
        ),
        2,
        &[
            "retention horizon",
            &iso(before)[..19],
            "nothing was written",
        ],
    );
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 0);
    // A window from the bound on is still admitted.
    let now = bound_after_admissions(&db).await;
    let (f, t) = (iso(before), iso(now));
    let out = json(ok(ql(
        &db,
        &[
            "trigger",
            "backfill",
            "trg-00000",
            "--from",
            &f,
            "--to",
            &t,
            "--json",
        ],
    )));
    assert_eq!(
        out["admitted"].as_i64().unwrap(),
        db.count("SELECT count(*) FROM qlsched.runs").await
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_pruned_cron_occurrence_is_never_admitted_again() {
    let db = TestDb::with_due(1).await;
    // A replica admits the due occurrence; its lease is short, so another can claim next.
    let first = Claimed::new(&db, "a", 200).await;
    let occurrence = first.row().next_fire_at_ms.unwrap();
    let out = first.admit(&first.admission()).await;
    assert!(matches!(out, AdmitOutcome::Admitted { .. }), "{out:?}");
    let before = bound_after_admissions(&db).await;
    let out = json(ok(prune(&db, before, &["--json"])));
    assert_eq!(out["removed"], 1, "{out}");
    // The next claim (once the cursor is due again) admits the next occurrence, never the
    // pruned one.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let row = loop {
        let mut rows = first.claim_more("b", 30_000, 1).await;
        if let Some(r) = rows.pop() {
            break r;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the trigger never came due again"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let next = row.next_fire_at_ms.unwrap();
    assert!(next > occurrence, "cursor {next} went back to {occurrence}");
    let out = first.admit(&admission(&row)).await;
    assert!(matches!(out, AdmitOutcome::Admitted { .. }), "{out:?}");
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM qlsched.runs WHERE scheduled_for_ms = {occurrence}"
        ))
        .await,
        0
    );
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 1);
    db.assert_invariants().await;
}

#[tokio::test]
async fn over_max_and_bad_input_refuse_before_writing_anything() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    admit_minutes(&db, 0..10).await;
    let before = bound_after_admissions(&db).await;
    let snapshot = "SELECT sum(hashtext(x::text)) FROM (SELECT r, a FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id)) x";
    let digest = db.count(snapshot).await;
    let b = iso(before);
    refused(
        prune(&db, before, &["--max", "9"]),
        2,
        &["more than 9 queued runs", &b[..19], "nothing was written"],
    );
    refused(prune(&db, before, &["--max", "0"]), 2, &["--max 0"]);
    refused(
        prune(&db, before + 3_600_000, &[]),
        2,
        &["is in the future", "nothing was written"],
    );
    refused(
        ql(&db, &["runs", "prune", "--queued-before", "yesterday"]),
        2,
        &["yesterday"],
    );
    refused(ql(&db, &["runs", "prune"]), 2, &["--queued-before"]);
    assert_eq!(db.count(snapshot).await, digest);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.run_events").await,
        20
    );
    assert_eq!(pruned_through(&db).await, None);
    // Exactly --max is fine.
    let out = json(ok(prune(&db, before, &["--max", "10", "--json"])));
    assert_eq!(out["removed"], 10, "{out}");
    db.assert_invariants().await;
}

#[tokio::test]
async fn only_the_admin_may_call_prune_queued_and_the_guard_still_refuses_other_deletes() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    admit_minutes(&db, 0..2).await;
    let before = bound_after_admissions(&db).await;
    let call =
        format!("SELECT qlsched.prune_queued({before}, ARRAY(SELECT run_id FROM qlsched.runs))");
    for role in [
        "qlsched_runtime",
        "qlsched_dispatcher",
        "qlsched_worker_ingress",
    ] {
        let err = db
            .client(role)
            .await
            .batch_execute(&call)
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{role}: {err}"
        );
    }
    // The owner holds DELETE by privilege; the guard refuses it outside the two functions,
    // from a DO block that sets the setting itself as from a plain statement.
    let owner = db.client("qlsched_owner").await;
    for table in ["runs", "attempts", "run_events"] {
        let err = owner
            .batch_execute(&format!(
                "DO $$ BEGIN PERFORM set_config('qlsched.pruning', 'on', true);
                           DELETE FROM qlsched.{table}; END $$"
            ))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Some(&SqlState::RESTRICT_VIOLATION),
            "{table}: {err}"
        );
        owner.batch_execute("BEGIN").await.unwrap();
        owner
            .batch_execute("SELECT set_config('qlsched.pruning', 'on', true)")
            .await
            .unwrap();
        let err = owner
            .batch_execute(&format!("DELETE FROM qlsched.{table}"))
            .await
            .unwrap_err();
        assert_eq!(
            err.code(),
            Some(&SqlState::RESTRICT_VIOLATION),
            "{table}: {err}"
        );
        owner.batch_execute("ROLLBACK").await.unwrap();
    }
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 2);
    // The admin's call removes them; the setting does not outlive it.
    let admin = db.admin().await;
    let n: i64 = admin.query_one(&call, &[]).await.unwrap().get(0);
    assert_eq!(n, 2);
    assert_eq!(
        db.count("SELECT (SELECT count(*) FROM qlsched.runs) + (SELECT count(*) FROM qlsched.attempts) + (SELECT count(*) FROM qlsched.run_events)")
            .await,
        0
    );
    owner.batch_execute("BEGIN").await.unwrap();
    owner.query_one(&call, &[]).await.unwrap();
    let err = owner
        .batch_execute("DELETE FROM qlsched.runs")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::RESTRICT_VIOLATION), "{err}");
    owner.batch_execute("ROLLBACK").await.unwrap();
}

#[tokio::test]
async fn a_backfill_racing_a_prune_of_its_window_never_admits_a_pruned_occurrence_again() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    admit_minutes(&db, 0..3).await;
    let before = bound_after_admissions(&db).await;
    // The backfill's first chunk is held at its trigger lock, after the command's horizon
    // check passed (nothing was pruned yet).
    let holder = db.superuser().await;
    holder
        .batch_execute(
            "BEGIN; SELECT 1 FROM qlsched.triggers WHERE trigger_id = 'trg-00000' FOR UPDATE",
        )
        .await
        .unwrap();
    let cli_db = db.clone();
    let (from, to) = (iso(FROM_MS), iso(FROM_MS + 180_000));
    let backfill = tokio::task::spawn_blocking(move || {
        ql(
            &cli_db,
            &[
                "trigger",
                "backfill",
                "trg-00000",
                "--from",
                &from,
                "--to",
                &to,
            ],
        )
    });
    crate::helpers::wait_until(
        "the backfill's chunk waits for the trigger row",
        Duration::from_secs(15),
        || async {
            // A session of this database waiting (other tests run beside this one).
            db.count(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
                  WHERE NOT l.granted AND a.datname = current_database()",
            )
            .await
                > 0
        },
    )
    .await;
    // Meanwhile a prune removes the window's three queued runs and commits.
    let out = json(ok(prune(&db, before, &["--json"])));
    assert_eq!(out["removed"], 3, "{out}");
    holder.batch_execute("COMMIT").await.unwrap();
    // The chunk then reads the raised horizon: none of the pruned occurrences comes back.
    refused(
        backfill.await.unwrap(),
        4,
        &["horizon moved to", "nothing more was written"],
    );
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 0);
    db.assert_invariants().await;
}

#[test]
fn the_prune_lock_key_is_the_one_v12_takes() {
    let v12 = include_str!("../../migrations/V12__prune_queued.sql");
    let key = qlsched::store::runs::PRUNE_QUEUED_LOCK.to_string();
    assert!(
        v12.contains(&format!("pg_advisory_xact_lock({key})")),
        "V12 does not lock {key}"
    );
}

/// A backfill writes cron keys ahead of a lagging cursor (replicas were down, a herd, a
/// back-off). `runs prune` removes them; when the cursor reaches those instants the cron
/// admission moves past each of them without a run: a pruned occurrence never comes back.
#[tokio::test]
async fn a_pruned_backfill_ahead_of_the_cursor_is_not_admitted_again_by_the_cron() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    db.make_due(-10_000).await;
    let cursor = db
        .count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules")
        .await;
    let ahead: Vec<i64> = (0..3).map(|i| cursor + i * 1000).collect();
    backfill_chunk(
        &mut db.admin().await,
        "trg-00000",
        1,
        &ahead,
        "backfill:test",
    )
    .await
    .unwrap();
    let before = bound_after_admissions(&db).await;
    let out = json(ok(prune(&db, before, &["--json"])));
    assert_eq!(out["removed"], 3, "{out}");
    // The replicas come back: the cursor reaches each pruned instant in turn.
    let claimed = Claimed::new(&db, "a", 30_000).await;
    let mut outcomes = Vec::new();
    let mut row = claimed.row().clone();
    for &at in &ahead {
        assert_eq!(row.next_fire_at_ms, Some(at));
        outcomes.push(claimed.admit(&admission(&row)).await);
        if at != *ahead.last().unwrap() {
            row = claimed.another("a", 30_000).await;
        }
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs").await,
        0,
        "pruned occurrences admitted again by the cron: {outcomes:?}"
    );
    assert!(
        outcomes.iter().all(|o| *o == AdmitOutcome::AlreadyAdmitted),
        "{outcomes:?}"
    );
    assert_eq!(
        db.count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules")
            .await,
        cursor + 3000,
        "the cursor moved past every pruned instant"
    );
}

/// `qlsched.prune_queued` judges its bound by the database clock itself: a bound in the
/// future (which would raise the recorded horizon past now and refuse every backfill for
/// good) is refused, whoever calls it, and nothing is removed.
#[tokio::test]
async fn prune_queued_refuses_a_bound_in_the_future() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    admit_minutes(&db, 0..3).await;
    let future = db.now_ms().await + 3_600_000;
    let err = db
        .admin()
        .await
        .query_one(
            "SELECT qlsched.prune_queued($1, ARRAY(SELECT run_id FROM qlsched.runs))",
            &[&future],
        )
        .await
        .err();
    assert_eq!(
        err.as_ref().and_then(|e| e.code()),
        Some(&SqlState::INVALID_PARAMETER_VALUE),
        "a future bound was accepted: {err:?}"
    );
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 3);
    assert_eq!(pruned_through(&db).await, None);
}

/// While a trigger's schedule row is claimed, an admission of it may be in flight with a
/// snapshot from before the prune: a backfilled run at or after that cursor is left alone
/// (counted), never removed under it. Once the claim is gone the next prune removes it and
/// keeps its key, and the cron moves past the instant without a run.
#[tokio::test]
async fn a_run_ahead_of_a_claimed_cursor_is_left_for_a_later_prune() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    db.make_due(-10_000).await;
    let cursor = db
        .count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules")
        .await;
    backfill_chunk(
        &mut db.admin().await,
        "trg-00000",
        1,
        &[cursor, cursor + 1000],
        "backfill:test",
    )
    .await
    .unwrap();
    let claimed = Claimed::new(&db, "a", 30_000).await;
    let out = json(ok(prune(
        &db,
        bound_after_admissions(&db).await,
        &["--json"],
    )));
    assert_eq!(
        (out["removed"].as_i64(), out["left_alone"].as_i64()),
        (Some(0), Some(2)),
        "runs at or after a claimed cursor were removed: {out}"
    );
    let first = claimed.admit(&claimed.admission()).await;
    assert_eq!(first, AdmitOutcome::AlreadyAdmitted);
    let out = json(ok(prune(
        &db,
        bound_after_admissions(&db).await,
        &["--json"],
    )));
    assert_eq!(out["removed"], 2, "{out}");
    let row = claimed.another("a", 30_000).await;
    assert_eq!(row.next_fire_at_ms, Some(cursor + 1000));
    let second = claimed.admit(&admission(&row)).await;
    assert_eq!(second, AdmitOutcome::AlreadyAdmitted);
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 0);
}
