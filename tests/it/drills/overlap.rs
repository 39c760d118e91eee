//! The overlap drill (issue 35 item 7): 3 replicas and 2 `qlsched worker`s executing the
//! runs of every-second triggers under `--overlap forbid`, a third of which run a command
//! longer than their period. Checked after every process stopped:
//!
//! - no two unfinished runs of one trigger at any time: a run is admitted only after the
//!   run before it finished (its queue time at or after the other's finish, from the runs'
//!   and attempts' timestamps);
//! - every occurrence between a trigger's first run and its cursor has a run or is a
//!   recorded skip: per trigger, the instants without a run are exactly `skipped_overlap`
//!   in number, and the recorded last instants are among them;
//! - 0 duplicates, 0 lost (tests/it/drills/check.rs counts a recorded skip as accounted
//!   for), every other invariant.

use std::time::Duration;

use qlsched::store::manage::{self, OverlapPolicy, TriggerSpec};

use super::check::{self, Expect};
use super::{tail, Drill, Fleet, EVERY_SECOND};
use crate::helpers::worker::{WorkerOptions, WorkerProc};
use crate::helpers::{wait_until, TestDb};

const TRIGGERS: usize = 30;

fn shell(command: &str) -> String {
    serde_json::json!({"executor": "shell", "command": ["/bin/sh", "-c", command]}).to_string()
}

#[tokio::test]
async fn forbid_under_three_replicas_and_workers_never_overlaps_and_records_every_skip() {
    let drill = Drill::begin("overlap_forbid", (0, 15), (0, 120), |p, seed| {
        format!(
            "{TRIGGERS} every-second triggers under forbid (a third run `sleep 2.5`, the rest `true`), \
             3 replicas, 2 workers (concurrency 16), {} s, seed {seed}",
            p.duration.as_secs()
        )
    })
    .await;
    let db = TestDb::new().await;
    let mut admin = db.admin().await;
    manage::set_project(&mut admin, "proj", "active")
        .await
        .unwrap();
    manage::publish_task(&mut admin, "proj", "slow", &shell("sleep 2.5"))
        .await
        .unwrap();
    manage::publish_task(&mut admin, "proj", "fast", &shell("true"))
        .await
        .unwrap();
    for i in 0..TRIGGERS {
        let task = if i % 3 == 0 { "slow" } else { "fast" };
        let spec = TriggerSpec {
            overlap_policy: OverlapPolicy::Forbid,
            ..TriggerSpec::new(&format!("trg-{i:05}"), "proj", task, EVERY_SECOND, "UTC")
        };
        manage::publish_trigger(&mut admin, &spec).await.unwrap();
    }
    let sql = db.superuser().await;
    let mut fleet = Fleet::new(&db.dsn("qlsched_runtime"), "", &[]);
    let workers: Vec<WorkerProc> = ["w0", "w1"]
        .iter()
        .map(|id| {
            WorkerProc::start(
                &db.dsn("qlsched_dispatcher"),
                id,
                WorkerOptions {
                    worker: "concurrency = 16",
                    env: &[("QLSCHED__LOG__LEVEL", "info")],
                    ..Default::default()
                },
            )
        })
        .collect();
    let mut workers = workers;
    for w in &mut workers {
        w.wait_ready(Duration::from_secs(30)).await;
    }
    fleet.start(&["a", "b", "c"]).await;
    super::wait_all_admitting(&sql, TRIGGERS as i64, Duration::from_secs(30)).await;
    tokio::time::sleep(drill.p.duration).await;
    fleet.stop_all().await;
    // Every run admitted ends: the workers finish what is queued and running.
    wait_until("every run finished", Duration::from_secs(30), || async {
        super::scalar(
            &sql,
            "SELECT count(*) FROM qlsched.runs WHERE status IN ('queued', 'dispatching', 'running')",
        )
        .await
            == 0
    })
    .await;
    for w in &mut workers {
        w.signal(libc::SIGTERM);
        let st = w.wait_exit(Duration::from_secs(30)).await;
        assert!(
            st.success(),
            "worker exited with {st}: {}",
            tail(&w.log(), 30)
        );
    }

    // No two runs of a trigger unfinished at once: each run's end from its last attempt.
    let overlapping = super::scalar(
        &sql,
        "WITH e AS (
             SELECT r.run_id, r.trigger_id, r.queued_at_ms,
                    (SELECT max(a.finished_at_ms) FROM qlsched.attempts a WHERE a.run_id = r.run_id) AS end_ms
               FROM qlsched.runs r)
         SELECT count(*) FROM e x JOIN e y ON y.trigger_id = x.trigger_id AND y.run_id <> x.run_id
          WHERE y.queued_at_ms >= x.queued_at_ms AND y.queued_at_ms < x.end_ms",
    )
    .await;
    let unended = super::scalar(
        &sql,
        "SELECT count(*) FROM qlsched.runs r WHERE NOT EXISTS (
             SELECT 1 FROM qlsched.attempts a WHERE a.run_id = r.run_id AND a.finished_at_ms IS NOT NULL)",
    )
    .await;
    // Per trigger: instants without a run between its first run and its cursor, against the
    // recorded skips; recorded instants that have a run.
    let row = sql
        .query_one(
            "WITH per AS (
                 SELECT s.trigger_id, s.next_fire_at_ms AS cursor_ms,
                        min(r.scheduled_for_ms) AS first_ms, count(r.*) AS runs,
                        coalesce(o.skipped_overlap, 0) AS skipped, o.last_skipped_ms
                   FROM qlsched.trigger_schedules s
                   LEFT JOIN qlsched.runs r ON r.trigger_id = s.trigger_id
                   LEFT JOIN qlsched.trigger_overlap o ON o.trigger_id = s.trigger_id
                  GROUP BY s.trigger_id, s.next_fire_at_ms, o.skipped_overlap, o.last_skipped_ms)
             SELECT count(*) FILTER (WHERE (cursor_ms - first_ms) / 1000 - runs <> skipped),
                    coalesce(sum(skipped), 0)::bigint,
                    coalesce(sum(skipped) FILTER (WHERE trigger_id IN
                        (SELECT trigger_id FROM qlsched.triggers WHERE task_id = 'slow')), 0)::bigint,
                    coalesce(sum(runs), 0)::bigint,
                    (SELECT count(*) FROM per p, unnest(p.last_skipped_ms) x
                      WHERE EXISTS (SELECT 1 FROM qlsched.runs r
                                     WHERE r.trigger_id = p.trigger_id AND r.scheduled_for_ms = x)
                         OR x % 1000 <> 0 OR x < p.first_ms OR x >= p.cursor_ms)
               FROM per",
            &[],
        )
        .await
        .unwrap();
    let (unaccounted, skipped, slow_skipped, runs, bad_instants): (i64, i64, i64, i64, i64) =
        (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4));
    let f = check::check(&sql, &Expect::every_second()).await;
    let table = drill.report.print_table(&format!(
        "| runs | skips recorded | of slow triggers | overlapping runs | triggers with an unrecorded gap | duplicates | lost |\n\
         |---|---|---|---|---|---|---|\n\
         | {runs} | {skipped} | {slow_skipped} | {overlapping} | {unaccounted} | {} | {} |\n",
        f.duplicates, f.lost
    ));
    let logs = format!("{table}{}", fleet.logs());
    assert_eq!(overlapping, 0, "runs of one trigger overlapped\n{logs}");
    assert_eq!(unended, 0, "runs without a finished attempt\n{logs}");
    assert_eq!(unaccounted, 0, "a gap that is not a recorded skip\n{logs}");
    assert_eq!(
        bad_instants, 0,
        "a recorded skip instant with a run or off the grid\n{logs}"
    );
    assert!(
        slow_skipped > 0,
        "the slow triggers never overlapped\n{logs}"
    );
    assert_eq!(
        (f.duplicates, f.lost, f.misfired, f.unexpected),
        (0, 0, 0, 0),
        "{logs}"
    );
    assert!(f.violated.is_empty(), "{:?}\n{logs}", f.violated);
    db.assert_invariants().await;
}
