//! Retention of finished runs (migration V11, docs/design.md "Retention"): the pruner
//! removes finished runs past the horizon with their attempts and events, never an
//! unfinished one, one replica at a time under the 'prune' lease, without blocking
//! admissions, and only through the owner-owned function.

use std::time::Duration;

use qlsched::config::RetentionConfig;
use qlsched::metrics::Metrics;
use qlsched::retention::Pruner;
use qlsched::store::admission::AdmitOutcome;
use qlsched::store::retention;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::helpers::claimed::Claimed;
use crate::helpers::{discard_log, TestDb};

const DAY_MS: i64 = 86_400_000;
const STATUSES: [&str; 6] = [
    "queued",
    "dispatching",
    "running",
    "succeeded",
    "failed",
    "cancelled",
];

/// Writes a run with `status`, admitted (and scheduled) `age_ms` ago by the database clock,
/// with its attempt and its two events, as the superuser (the dispatcher role that finishes
/// runs is issue 21 item 1); returns its id.
pub(crate) async fn run_aged(db: &TestDb, trigger: &str, status: &str, age_ms: i64) -> Uuid {
    let state = match status {
        "queued" => "claimed",
        "cancelled" => "abandoned",
        s => s,
    };
    db.superuser()
        .await
        .query_one(
            "WITH t AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $3 AS ms),
                  run AS (
                INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                          task_revision, execution_revision_id, idempotency_key,
                                          status, scheduled_for_ms, queued_at_ms, admitted_by)
                SELECT gen_random_uuid(), 'proj', $1, 1, 'task', 1, gen_random_uuid(),
                       'ql3:cron:v1:' || $1 || ':1:' || t.ms, $2, t.ms, t.ms, 'test' FROM t
                RETURNING run_id, queued_at_ms),
                  att AS (
                INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
                SELECT gen_random_uuid(), run_id, 1, 'remote_worker', $4, queued_at_ms FROM run),
                  ev AS (
                INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
                SELECT run_id, s, CASE s WHEN 1 THEN 'run.created' ELSE 'run.queued' END, queued_at_ms
                  FROM run, generate_series(1, 2) s)
             SELECT run_id FROM run",
            &[&trigger, &status, &age_ms, &state],
        )
        .await
        .unwrap()
        .get(0)
}

/// (runs, attempts, events) of `run`.
async fn rows_of(db: &TestDb, run: Uuid) -> (i64, i64, i64) {
    let r = db
        .superuser()
        .await
        .query_one(
            "SELECT (SELECT count(*) FROM qlsched.runs WHERE run_id = $1),
                    (SELECT count(*) FROM qlsched.attempts WHERE run_id = $1),
                    (SELECT count(*) FROM qlsched.run_events WHERE run_id = $1)",
            &[&run],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

pub(crate) fn cfg(finished_after: Duration, batch: u32) -> RetentionConfig {
    RetentionConfig {
        finished_after: Some(finished_after),
        batch,
        interval: Duration::from_secs(1),
        queued_alert_after: Duration::from_secs(3600),
        audit_after: None,
    }
}

pub(crate) fn pruner(owner: &str, cfg: RetentionConfig) -> Pruner {
    Pruner {
        owner: owner.into(),
        cfg,
        metrics: Metrics::default(),
        log: discard_log(),
    }
}

#[tokio::test]
async fn finished_runs_past_the_horizon_go_with_their_attempts_and_events_unfinished_ones_stay() {
    let db = TestDb::new().await;
    let mut old = Vec::new();
    let mut young = Vec::new();
    for s in STATUSES {
        old.push((s, run_aged(&db, "trg-a", s, 400 * DAY_MS).await));
        young.push((s, run_aged(&db, "trg-a", s, 60_000).await));
    }
    // Batches of 2: the pass goes on until a batch comes back short.
    let p = pruner("a", cfg(Duration::from_secs(86_400), 2));
    let runtime = db.client("qlsched_runtime").await;
    let report = p.pass(&runtime).await.unwrap();
    assert!(report.held_lease);
    assert_eq!(report.pruned, 3, "{report:?}");
    assert_eq!(report.batches, 2, "{report:?}");
    for (s, run) in &old {
        let want = if retention::FINISHED.contains(s) {
            (0, 0, 0)
        } else {
            (1, 1, 2)
        };
        assert_eq!(rows_of(&db, *run).await, want, "old {s} run");
    }
    for (s, run) in &young {
        assert_eq!(rows_of(&db, *run).await, (1, 1, 2), "young {s} run");
    }
    let text = p.metrics.render();
    for s in retention::FINISHED {
        assert!(
            text.contains(&format!("qlsched_runs_pruned_total{{status=\"{s}\"}} 1")),
            "{s} not counted:\n{text}"
        );
    }
    // The old queued run (400 days > queued_alert_after) is the one old queued run.
    assert!(text.contains("qlsched_old_queued_runs 1\n"), "{text}");
    // The oldest retained finished run is a young one (about a minute old).
    let age = p.metrics.oldest_finished_run_age_seconds.get();
    assert!((59.0..600.0).contains(&age), "oldest finished age {age}");
    // The horizon is recorded for `trigger backfill`.
    let v = retention::view(&runtime, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(v.finished_after_ms, Some(DAY_MS));
    assert!(v.pruned_through_ms.is_some());
    // Nothing else was removed: only the three old finished runs' rows are gone.
    assert_eq!(db.count("SELECT count(*) FROM qlsched.attempts").await, 9);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.run_events").await,
        18
    );
}

#[tokio::test]
async fn retention_zero_keeps_everything_and_still_counts_old_queued_runs() {
    let db = TestDb::new().await;
    let run = run_aged(&db, "trg-a", "succeeded", 400 * DAY_MS).await;
    run_aged(&db, "trg-a", "queued", 2 * 3_600_000).await;
    let mut c = cfg(Duration::from_secs(60), 10);
    c.finished_after = None;
    let p = pruner("a", c);
    let report = p.pass(&db.client("qlsched_runtime").await).await.unwrap();
    assert!(!report.held_lease);
    assert_eq!(rows_of(&db, run).await, (1, 1, 2));
    assert_eq!(p.metrics.old_queued_runs.get(), 1);
}

#[tokio::test]
async fn one_replica_prunes_at_a_time_and_a_dead_holders_turn_is_taken_over() {
    let db = TestDb::new().await;
    run_aged(&db, "trg-a", "succeeded", 400 * DAY_MS).await;
    let keep = Duration::from_secs(86_400);
    let a = db.client("qlsched_runtime").await;
    let b = db.client("qlsched_runtime").await;
    let la = retention::claim_lease(&a, "a", Duration::from_secs(2), keep)
        .await
        .unwrap()
        .expect("a takes the free lease");
    assert_eq!(
        retention::claim_lease(&b, "b", Duration::from_secs(60), keep)
            .await
            .unwrap(),
        None,
        "b must not take a live lease"
    );
    // Without the lease (a guessed token) the function refuses.
    let err = retention::prune_batch(&b, keep, 10, "b", Uuid::new_v4())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::LOCK_NOT_AVAILABLE), "{err}");
    let err = retention::prune_batch(&b, keep, 10, "a", Uuid::new_v4())
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::LOCK_NOT_AVAILABLE), "{err}");

    // a's batch held open: even once a's lease has expired, b skips the locked row.
    a.batch_execute("BEGIN").await.unwrap();
    let pruned = retention::prune_batch(&a, keep, 10, "a", la.token)
        .await
        .unwrap();
    assert_eq!(pruned.total(), 1);
    tokio::time::sleep(la.remaining + Duration::from_millis(200)).await;
    assert_eq!(
        retention::claim_lease(&b, "b", Duration::from_secs(60), keep)
            .await
            .unwrap(),
        None,
        "b must not take the turn while a's batch is open"
    );
    a.batch_execute("COMMIT").await.unwrap();

    // a dies holding the lease (its connection closes without giving it back): b takes the
    // turn once the lease has expired by the database clock.
    let la = retention::claim_lease(&a, "a", Duration::from_secs(2), keep)
        .await
        .unwrap()
        .expect("a takes its turn again");
    drop(a);
    assert_eq!(
        retention::claim_lease(&b, "b", Duration::from_secs(60), keep)
            .await
            .unwrap(),
        None
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let lb = loop {
        if let Some(l) = retention::claim_lease(&b, "b", Duration::from_secs(60), keep)
            .await
            .unwrap()
        {
            break l;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b did not take over the expired lease within 20 s"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // a's token is dead; b's works.
    let a2 = db.client("qlsched_runtime").await;
    let err = retention::prune_batch(&a2, keep, 10, "a", la.token)
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::LOCK_NOT_AVAILABLE), "{err}");
    retention::prune_batch(&b, keep, 10, "b", lb.token)
        .await
        .unwrap();
}

#[tokio::test]
async fn an_open_prune_batch_never_blocks_an_admission() {
    let db = TestDb::with_due(2).await;
    let old: Vec<Uuid> = {
        let mut v = Vec::new();
        for _ in 0..20 {
            v.push(run_aged(&db, "trg-00000", "succeeded", 400 * DAY_MS).await);
        }
        v
    };
    let keep = Duration::from_secs(86_400);
    let pruner = db.client("qlsched_runtime").await;
    let lease = retention::claim_lease(&pruner, "p", Duration::from_secs(60), keep)
        .await
        .unwrap()
        .unwrap();
    pruner.batch_execute("BEGIN").await.unwrap();
    let pruned = retention::prune_batch(&pruner, keep, 100, "p", lease.token)
        .await
        .unwrap();
    assert_eq!(pruned.total(), 20);
    // The batch's row locks and deletes are held; admissions of both due triggers commit.
    let claimed = Claimed::up_to(&db, "a", 30_000, 2).await;
    assert_eq!(claimed.rows.len(), 2);
    for a in claimed.admissions() {
        let out = tokio::time::timeout(Duration::from_secs(10), claimed.admit(&a))
            .await
            .expect("an admission waited on the open prune batch");
        assert!(matches!(out, AdmitOutcome::Admitted { .. }), "{out:?}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE admitted_by = 'a'")
            .await,
        2
    );
    pruner.batch_execute("COMMIT").await.unwrap();
    for run in old {
        assert_eq!(rows_of(&db, run).await, (0, 0, 0));
    }
    db.assert_invariants().await;
}

#[tokio::test]
async fn only_the_owner_owned_function_can_delete_admitted_work() {
    let db = TestDb::new().await;
    let run = run_aged(&db, "trg-a", "succeeded", 400 * DAY_MS).await;
    let deletes = [
        "DELETE FROM qlsched.runs",
        "DELETE FROM qlsched.attempts",
        "DELETE FROM qlsched.run_events",
    ];
    // Runtime and admin hold no DELETE: refused by privilege, GUC or not.
    for role in ["qlsched_runtime", "qlsched_admin"] {
        let c = db.client(role).await;
        for d in deletes {
            for guc in [false, true] {
                c.batch_execute("BEGIN").await.unwrap();
                if guc {
                    c.batch_execute("SELECT set_config('qlsched.pruning', 'on', true)")
                        .await
                        .unwrap();
                }
                let err = c.batch_execute(d).await.unwrap_err();
                assert_eq!(
                    err.code(),
                    Some(&SqlState::INSUFFICIENT_PRIVILEGE),
                    "{role} {d} guc={guc}: {err}"
                );
                c.batch_execute("ROLLBACK").await.unwrap();
            }
        }
    }
    // The owner (and the superuser) may DELETE by privilege, but the permanence triggers
    // refuse it outside prune_finished, the setting notwithstanding.
    for role in ["qlsched_owner", "postgres"] {
        let c = db.client(role).await;
        for d in deletes {
            c.batch_execute("BEGIN; SELECT set_config('qlsched.pruning', 'on', true)")
                .await
                .unwrap();
            crate::helpers::assert_removal_refused(&c, d).await;
            c.batch_execute("ROLLBACK").await.unwrap();
        }
    }
    // Nor from inside another function (a DO block) that sets the setting itself.
    let owner = db.client("qlsched_owner").await;
    crate::helpers::assert_removal_refused(
        &owner,
        "DO $$ BEGIN PERFORM set_config('qlsched.pruning', 'on', true);
                   DELETE FROM qlsched.runs; END $$",
    )
    .await;
    drop(owner);
    // The admin cannot call the function.
    let admin = db.admin().await;
    let err = admin
        .batch_execute(&format!(
            "SELECT * FROM qlsched.prune_finished(0, 1, 'x', '{}')",
            Uuid::nil()
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{err}");
    assert_eq!(rows_of(&db, run).await, (1, 1, 2));
    // The setting does not outlive the function: after a batch, a DELETE in the same
    // transaction is refused again.
    let owner = db.client("qlsched_owner").await;
    let keep = Duration::from_secs(86_400);
    let lease = retention::claim_lease(&owner, "o", Duration::from_secs(60), keep)
        .await
        .unwrap()
        .unwrap();
    owner.batch_execute("BEGIN").await.unwrap();
    retention::prune_batch(&owner, keep, 10, "o", lease.token)
        .await
        .unwrap();
    crate::helpers::assert_removal_refused(&owner, "DELETE FROM qlsched.runs").await;
    owner.batch_execute("ROLLBACK").await.unwrap();
}

/// `n` bare runs (no attempts, no events; scheduled and queued at 1, 2, … ms), every
/// `every`-th of status `some`, the others `rest`; then ANALYZE.
async fn bare_runs(su: &tokio_postgres::Client, n: i64, every: i64, some: &str, rest: &str) {
    su.execute(
        "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                   task_revision, execution_revision_id, idempotency_key, status,
                                   scheduled_for_ms, queued_at_ms, admitted_by)
         SELECT gen_random_uuid(), 'proj', 't', 1, 'task', 1, gen_random_uuid(),
                'ql3:cron:v1:t:1:' || g, CASE WHEN g % $2::bigint = 0 THEN $3 ELSE $4 END,
                g, g, 'test'
           FROM generate_series(1, $1::bigint) g",
        &[&n, &every, &some, &rest],
    )
    .await
    .unwrap();
    su.batch_execute("ANALYZE qlsched.runs").await.unwrap();
}

fn backfill(db: &TestDb, from: i64, to: i64) -> std::process::Output {
    crate::helpers::cli::backfill(db, "trg-00000", from, to, &[])
}

#[tokio::test]
async fn backfill_refuses_a_window_past_the_retention_horizon() {
    use crate::helpers::cli::{ok, refused};
    let db = TestDb::new().await;
    db.seed(1, "0 * * * *").await;
    let now = db.now_ms().await;
    // No replica has pruned or recorded a retention: any past window is admitted.
    ok(backfill(
        &db,
        now - 10 * DAY_MS,
        now - 10 * DAY_MS + 3_600_001,
    ));
    // A pruning replica recorded finished_after = 2 days.
    let runtime = db.client("qlsched_runtime").await;
    let l = retention::claim_lease(
        &runtime,
        "a",
        Duration::from_secs(60),
        Duration::from_secs(2 * 86_400),
    )
    .await
    .unwrap()
    .unwrap();
    retention::release_lease(&runtime, "a", l.token)
        .await
        .unwrap();
    let before = db.count("SELECT count(*) FROM qlsched.runs").await;
    let err = refused(
        backfill(&db, now - 3 * DAY_MS, now - 3 * DAY_MS + 3 * 3_600_000),
        2,
        &[
            "retention horizon",
            "retention.finished_after 2d",
            "nothing was written",
        ],
    );
    // Within the margin (one hour inside the horizon) is refused too.
    refused(
        backfill(&db, now - 2 * DAY_MS + 1_800_000, now - DAY_MS),
        2,
        &["retention horizon"],
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs").await,
        before,
        "{err}"
    );
    // Inside the horizon: admitted.
    ok(backfill(&db, now - DAY_MS, now - DAY_MS + 3 * 3_600_000));
    assert!(db.count("SELECT count(*) FROM qlsched.runs").await > before);
    // Retention turned off (0 = forever) after a prune reached a horizon: that horizon
    // still holds, since runs before it may be gone.
    db.superuser()
        .await
        .execute(
            "UPDATE qlsched.maintenance SET pruned_through_ms = $1 WHERE task = 'prune'",
            &[&(now - 5 * DAY_MS)],
        )
        .await
        .unwrap();
    retention::claim_lease(&runtime, "a", Duration::from_secs(60), Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    refused(
        backfill(&db, now - 6 * DAY_MS, now - 6 * DAY_MS + 3_600_001),
        2,
        &["retention horizon", "the latest horizon pruned"],
    );
    ok(backfill(
        &db,
        now - 4 * DAY_MS,
        now - 4 * DAY_MS + 3_600_001,
    ));
}

#[tokio::test]
async fn status_shows_the_retention_line() {
    let db = TestDb::new().await;
    run_aged(&db, "trg-a", "succeeded", 3 * DAY_MS).await;
    run_aged(&db, "trg-a", "queued", 3 * 3_600_000).await;
    run_aged(&db, "trg-a", "queued", 60_000).await;
    let mut c = cfg(Duration::from_secs(30 * 86_400), 10);
    c.queued_alert_after = Duration::from_secs(2 * 3600);
    pruner("a", c)
        .pass(&db.client("qlsched_runtime").await)
        .await
        .unwrap();
    let out = crate::helpers::cli::ok(crate::helpers::cli::ql(&db, &["status"]));
    let line = out
        .lines()
        .find(|l| l.starts_with("retention:"))
        .unwrap_or_else(|| panic!("no retention line:\n{out}"));
    assert!(line.contains("finished runs kept 30d"), "{line}");
    assert!(line.contains("oldest finished run 3d old"), "{line}");
    assert!(line.contains("queued runs older than 2h: 1"), "{line}");
}

/// A running replica prunes on its own (the pruner task spawned at start) and exports the
/// retention metrics.
#[tokio::test]
async fn a_running_replica_prunes_and_exports_the_retention_metrics() {
    use crate::helpers::replica::ReplicaProc;
    let db = TestDb::new().await;
    let old = run_aged(&db, "trg-a", "failed", 400 * DAY_MS).await;
    let queued = run_aged(&db, "trg-a", "queued", 400 * DAY_MS).await;
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "pr",
        "",
        &[
            ("QLSCHED__RETENTION__INTERVAL", "1s"),
            ("QLSCHED__RETENTION__FINISHED_AFTER", "1d"),
        ],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    crate::helpers::wait_until(
        "the old failed run is pruned",
        Duration::from_secs(30),
        || async { rows_of(&db, old).await == (0, 0, 0) },
    )
    .await;
    let mut body = String::new();
    crate::helpers::wait_until("the metrics show the pass", Duration::from_secs(30), || {
        body = r.get("/metrics").map(|x| x.1).unwrap_or_default();
        let done = body.contains("qlsched_runs_pruned_total{status=\"failed\"} 1")
            && body.contains("qlsched_old_queued_runs 1\n");
        async move { done }
    })
    .await;
    assert!(
        body.contains("qlsched_prune_duration_seconds_count"),
        "{body}"
    );
    r.terminate(Duration::from_secs(20)).await;
    assert_eq!(
        rows_of(&db, queued).await,
        (1, 1, 2),
        "a queued run is never pruned"
    );
}

/// A prune batch reaches old finished runs through `runs_finished_idx`, not by walking the
/// old queued runs in front of them (with no dispatcher, every run stays queued).
#[tokio::test]
async fn a_prune_batch_reads_finished_runs_through_their_own_index() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    bare_runs(&su, 50000, 100, "succeeded", "queued").await;
    let plan = crate::helpers::plan(
        &su,
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
             SELECT r.run_id FROM qlsched.runs r
              WHERE r.queued_at_ms < 40000 AND r.scheduled_for_ms < 40000
                AND r.status IN ('succeeded', 'failed', 'cancelled')
                AND NOT EXISTS (SELECT 1 FROM qlsched.attempts a
                                 WHERE a.run_id = r.run_id AND a.finished_at_ms >= 40000)
                AND NOT EXISTS (SELECT 1 FROM qlsched.run_events e
                                 WHERE e.run_id = r.run_id AND e.at_ms >= 40000)
              ORDER BY r.queued_at_ms LIMIT 100 FOR UPDATE OF r SKIP LOCKED",
        &[],
    )
    .await;
    assert!(plan.contains("runs_finished_idx"), "{plan}");
    // The same statement the function runs selects exactly the 100 oldest finished runs.
    let keep = Duration::from_millis(u64::try_from(db.now_ms().await - 40_000).unwrap());
    let runtime = db.client("qlsched_runtime").await;
    let l = retention::claim_lease(&runtime, "a", Duration::from_secs(60), keep)
        .await
        .unwrap()
        .unwrap();
    let pruned = retention::prune_batch(&runtime, keep, 100, "a", l.token)
        .await
        .unwrap();
    assert_eq!(pruned.by_status, vec![("succeeded".to_owned(), 100)]);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'succeeded'")
            .await,
        400
    );
    assert_eq!(
        db.count("SELECT min(queued_at_ms) FROM qlsched.runs WHERE status = 'succeeded'")
            .await,
        10_100
    );
}

/// The retention view (status line, console, gauge) counts old queued runs cheaply behind a
/// long finished history, and a huge backlog only up to [`retention::OLD_QUEUED_CAP`]
/// ("10000 or more"), so a console page or `qlsched status` stays bounded.
#[tokio::test]
async fn the_old_queued_count_reads_the_queued_runs_only_and_is_capped() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    bare_runs(&su, 100000, 5000, "queued", "succeeded").await;
    su.batch_execute("SET plan_cache_mode = force_generic_plan; BEGIN")
        .await
        .unwrap();
    let plan = crate::helpers::plan(
        &su,
        &format!(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {}",
            retention::OLD_QUEUED_SQL.replace("$1", "3600000")
        ),
        &[],
    )
    .await;
    su.batch_execute("ROLLBACK").await.unwrap();
    let buffers = crate::helpers::plan_buffers(&plan, "");
    assert!(
        buffers < 200,
        "counting 20 old queued runs among 100,000 touched {buffers} buffers:\n{plan}"
    );
    let v = retention::view(&su, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(v.old_queued, 20);
    // Past the cap the count stops, and the status line says so.
    su.batch_execute(&format!(
        "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                   task_revision, execution_revision_id, idempotency_key,
                                   scheduled_for_ms, queued_at_ms, admitted_by)
         SELECT gen_random_uuid(), 'proj', 't', 1, 'task', 1, gen_random_uuid(),
                'ql3:cron:v1:t:1:' || (200000 + g), 200000 + g, g, 'test'
           FROM generate_series(1, {}) g",
        retention::OLD_QUEUED_CAP
    ))
    .await
    .unwrap();
    let v = retention::view(&su, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(v.old_queued, retention::OLD_QUEUED_CAP);
    let line = qlsched::store::status::RetentionStatus {
        view: v,
        queued_alert_after_ms: 3_600_000,
    }
    .render();
    assert!(
        line.ends_with(&format!("{} or more", retention::OLD_QUEUED_CAP)),
        "{line}"
    );
}

/// Writes a succeeded cron run of `trigger` (revision 1) for the instant `sf`, admitted
/// `queued_age_ms` and finished `finished_age_ms` ago by the database clock, with its
/// attempt and its five events, as the superuser, with the row triggers off for the
/// transaction (V16's event trigger admits an event only in step with the run's status, and
/// this writes a finished run's whole history at once); returns its id.
async fn finished_cron_run(
    db: &TestDb,
    trigger: &str,
    sf: i64,
    queued_age_ms: i64,
    finished_age_ms: i64,
) -> Uuid {
    let mut su = db.superuser().await;
    let tx = su.transaction().await.unwrap();
    tx.batch_execute("SET LOCAL session_replication_role = replica")
        .await
        .unwrap();
    let id = tx
        .query_one(
            "WITH t AS (SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint AS now),
                  run AS (
                INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                          task_revision, execution_revision_id, idempotency_key,
                                          status, scheduled_for_ms, queued_at_ms, admitted_by)
                SELECT gen_random_uuid(), 'proj', $1, 1, 'task', 1, gen_random_uuid(),
                       'ql3:cron:v1:' || $1 || ':1:' || $2::bigint, 'succeeded', $2, t.now - $3,
                       'backfill:test' FROM t
                RETURNING run_id, queued_at_ms),
                  att AS (
                INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state,
                                              created_at_ms, started_at_ms, finished_at_ms)
                SELECT gen_random_uuid(), run_id, 1, 'remote_worker', 'succeeded', queued_at_ms,
                       t.now - $4, t.now - $4 FROM run, t),
                  ev AS (
                INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
                SELECT run_id, s, (ARRAY['run.created', 'run.queued', 'run.dispatching',
                                         'run.started', 'run.finished'])[s],
                       CASE WHEN s <= 2 THEN queued_at_ms ELSE t.now - $4 END
                  FROM run, t, generate_series(1, 5) s)
             SELECT run_id FROM run",
            &[&trigger, &sf, &queued_age_ms, &finished_age_ms],
        )
        .await
        .unwrap()
        .get(0);
    tx.commit().await.unwrap();
    id
}

/// A backfill ran ahead of a lagging cursor (the project was suspended, say); its runs
/// finished and retention removed them. When the cursor reaches those instants the cron
/// admission moves past each without a run: a pruned occurrence never comes back.
#[tokio::test]
async fn a_retention_pruned_occurrence_ahead_of_the_cursor_is_not_admitted_again() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    // The cursor lags by three days; a backfill admitted its next instants two and a half
    // days ago and they finished two days ago.
    db.make_due(-3 * DAY_MS).await;
    let cursor = db
        .count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules")
        .await;
    let ahead: Vec<i64> = (0..3).map(|i| cursor + i * 1000).collect();
    for &at in &ahead {
        finished_cron_run(&db, "trg-00000", at, 5 * DAY_MS / 2, 2 * DAY_MS).await;
    }
    let runtime = db.client("qlsched_runtime").await;
    let report = pruner("p", cfg(Duration::from_secs(86_400), 100))
        .pass(&runtime)
        .await
        .unwrap();
    assert_eq!(report.pruned, 3, "{report:?}");
    let claimed = Claimed::new(&db, "a", 30_000).await;
    let mut outcomes = Vec::new();
    let mut row = claimed.row().clone();
    for &at in &ahead {
        assert_eq!(row.next_fire_at_ms, Some(at));
        outcomes.push(
            claimed
                .admit(&crate::helpers::claimed::admission(&row))
                .await,
        );
        if at != *ahead.last().unwrap() {
            row = claimed.another("a", 30_000).await;
        }
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs").await,
        0,
        "pruned occurrences admitted again by the cron: {outcomes:?}"
    );
}

/// A `trigger backfill` chunk holds the prune lock shared from its horizon check to its
/// commit; a prune batch (here with a shorter retention than the one the backfill checked)
/// waits for it instead of removing, in between, a run the chunk has just found existing.
#[tokio::test]
async fn a_prune_batch_waits_for_a_backfill_chunk_in_progress() {
    let db = TestDb::new().await;
    let old = run_aged(&db, "trg-a", "succeeded", 3 * DAY_MS).await;
    let chunk = db.admin().await;
    chunk
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock_shared({});
             SELECT pruned_through_ms FROM qlsched.maintenance WHERE task = 'prune'",
            qlsched::store::queued_prune::PRUNE_QUEUED_LOCK
        ))
        .await
        .unwrap();
    let prune_db = db.clone();
    let batch = tokio::spawn(async move {
        let runtime = prune_db.client("qlsched_runtime").await;
        pruner("short", cfg(Duration::from_secs(86_400), 10))
            .pass(&runtime)
            .await
            .unwrap()
    });
    crate::helpers::wait_until(
        "the prune batch finishes or waits for the chunk's lock",
        Duration::from_secs(15),
        || async {
            batch.is_finished()
                || db
                    .count(
                        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                            AND database = (SELECT oid FROM pg_database
                                             WHERE datname = current_database())",
                    )
                    .await
                    > 0
        },
    )
    .await;
    let removed_meanwhile = rows_of(&db, old).await == (0, 0, 0);
    chunk.batch_execute("COMMIT").await.unwrap();
    let report = batch.await.unwrap();
    assert!(
        !removed_meanwhile,
        "the prune removed a run while a backfill chunk held the prune lock"
    );
    assert_eq!(report.pruned, 1, "{report:?}");
}

/// The retention horizon is the database's: the runtime role can claim the lease and ask
/// for a retention, but cannot move the recorded horizon nor the floor, and a request below
/// the floor (set by the admin) prunes only what the floor allows.
#[tokio::test]
async fn the_runtime_role_cannot_move_the_retention_horizon() {
    let db = TestDb::new().await;
    // A horizon some prune recorded.
    db.superuser()
        .await
        .execute(
            "UPDATE qlsched.maintenance SET pruned_through_ms = 1000 WHERE task = 'prune'",
            &[],
        )
        .await
        .unwrap();
    let runtime = db.client("qlsched_runtime").await;
    for sql in [
        "UPDATE qlsched.maintenance SET pruned_through_ms = NULL WHERE task = 'prune'",
        "UPDATE qlsched.maintenance SET pruned_through_ms = 9223372036854775807 WHERE task = 'prune'",
        "UPDATE qlsched.maintenance SET finished_after_floor_ms = 0 WHERE task = 'prune'",
    ] {
        let err = runtime.execute(sql, &[]).await.err();
        assert_eq!(
            err.as_ref().and_then(|e| e.code()),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {err:?}"
        );
    }
}

/// A finished run is kept `finished_after` from when it finished (its last event), not from
/// its admission; and a request shorter than the floor (the admin's, in the database) keeps
/// runs for the floor.
#[tokio::test]
async fn the_horizon_counts_from_the_finish_and_is_bounded_by_the_floor() {
    let db = TestDb::new().await;
    // Admitted 3 days ago, finished a minute ago: kept under a 1-day retention.
    let late = finished_cron_run(&db, "trg-a", 1_000, 3 * DAY_MS, 60_000).await;
    // Admitted and finished 3 days ago: pruned.
    let old = finished_cron_run(&db, "trg-a", 2_000, 3 * DAY_MS, 3 * DAY_MS).await;
    let runtime = db.client("qlsched_runtime").await;
    pruner("a", cfg(Duration::from_secs(86_400), 100))
        .pass(&runtime)
        .await
        .unwrap();
    assert_eq!(rows_of(&db, old).await, (0, 0, 0));
    assert_eq!(
        rows_of(&db, late).await,
        (1, 1, 5),
        "a run that finished a minute ago was pruned under a 1-day retention"
    );
    // A request of "keep nothing" (horizon = now) is bounded below by the floor: the run
    // that finished a minute ago stays while the admin's floor is a day.
    db.admin()
        .await
        .execute(
            "UPDATE qlsched.maintenance SET finished_after_floor_ms = $1 WHERE task = 'prune'",
            &[&DAY_MS],
        )
        .await
        .unwrap();
    let lease = retention::claim_lease(&runtime, "a", Duration::from_secs(60), Duration::ZERO)
        .await
        .unwrap()
        .unwrap();
    let pruned = retention::prune_batch(&runtime, Duration::ZERO, 100, "a", lease.token)
        .await
        .unwrap();
    assert_eq!(pruned.total(), 0, "{pruned:?}");
    assert_eq!(rows_of(&db, late).await, (1, 1, 5));
    let horizon: i64 = db
        .count("SELECT pruned_through_ms FROM qlsched.maintenance")
        .await;
    assert!(
        horizon <= db.now_ms().await - DAY_MS,
        "the recorded horizon {horizon} is inside the floor"
    );
}

#[tokio::test]
async fn queued_runs_are_counted_per_pool_of_their_pinned_spec() {
    let db = TestDb::new().await;
    let _admin = db.admin_with_project().await;
    let su = db.superuser().await;
    let (default_rev, reports_rev) = (Uuid::new_v4(), Uuid::new_v4());
    for (id, spec) in [
        (default_rev, r#"{"executor": "shell", "command": ["true"]}"#),
        (
            reports_rev,
            r#"{"executor": "shell", "command": ["true"], "pool": "reports"}"#,
        ),
    ] {
        su.execute(
            "INSERT INTO qlsched.execution_revisions
                    (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
             VALUES ($1, 'proj', 'remote_worker', $2::text,
                     encode(sha256(convert_to($2::text, 'UTF8')), 'hex'), 0)",
            &[&id, &spec],
        )
        .await
        .unwrap();
    }
    // 300,000 runs, every third queued (100,000); one in twenty pins the "reports" spec
    // (5,000 of the queued ones), the others the spec without a pool ("default").
    su.execute(
        "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                   task_revision, execution_revision_id, idempotency_key, status,
                                   scheduled_for_ms, queued_at_ms, admitted_by)
         SELECT gen_random_uuid(), 'proj', 't', 1, 'task', 1,
                CASE WHEN g % 20 = 0 THEN $1::uuid ELSE $2::uuid END,
                'ql3:cron:v1:t:1:' || g,
                CASE WHEN g % 3 = 0 THEN 'queued' ELSE 'succeeded' END, g, g, 'test'
           FROM generate_series(1, 300000) g",
        &[&reports_rev, &default_rev],
    )
    .await
    .unwrap();
    su.batch_execute("ANALYZE qlsched.runs").await.unwrap();

    let runtime = db.client("qlsched_runtime").await;
    let started = std::time::Instant::now();
    let by_pool = retention::queued_by_pool(&runtime).await.unwrap();
    let took = started.elapsed();
    assert_eq!(
        by_pool,
        vec![
            ("default".to_owned(), 95_000),
            ("reports".to_owned(), 5_000)
        ]
    );
    let plan = crate::helpers::plan(
        &runtime,
        &format!(
            "EXPLAIN (ANALYZE, BUFFERS) {}",
            retention::QUEUED_BY_REVISION_SQL
        ),
        &[],
    )
    .await;
    eprintln!("queued runs per pool over 100,000 queued of 300,000 runs: {took:?}\n{plan}");
}
