//! Drill 2, backend termination: again and again every PostgreSQL backend of the replicas
//! (`application_name` qlsched… or user qlsched_runtime, in the drill's databases) is ended
//! with `pg_terminate_backend`. Each replica admits again within two cadences, without a
//! process restart; 0 duplicates, 0 lost.
//!
//! Each replica has a database of its own (same cluster): it then finds due rows at every
//! round, so its first admission after a termination marks its first working round (two
//! replicas sharing rows would also measure who won the race for them).

use std::time::Duration;

use super::check::Expect;
use super::{db_now, Drill, Stage};
use crate::helpers::poll_until;

const TRIGGERS: usize = 30;
const IDS: [&str; 2] = ["a", "b"];
const CADENCE_MS: i64 = 1000;

#[tokio::test]
async fn replicas_recover_from_terminated_backends_within_two_cadences_without_restarting() {
    let mut drill = Drill::begin("backend_termination", (5, 0), (30, 0), |p, seed| {
        format!(
            "{} rounds of pg_terminate_backend, replicas a and b each on its own database with {TRIGGERS} every-second triggers, cadence 1 s, seed {seed}",
            p.cycles
        )
    })
    .await;
    let mut stages = [
        Stage::new(TRIGGERS, "").await,
        Stage::new(TRIGGERS, "").await,
    ];
    for (stage, id) in stages.iter_mut().zip(IDS) {
        stage.fleet.start(&[id]).await;
    }
    let pids: Vec<u32> = IDS
        .iter()
        .zip(&stages)
        .map(|(id, s)| s.fleet.get(id).pid())
        .collect();
    for stage in &stages {
        stage.wait_all_admitting().await;
    }
    let names: Vec<&str> = stages.iter().map(|s| s.db.name.as_str()).collect();

    let mut recoveries = Vec::new();
    let mut terminated_total = 0;
    for _ in 0..drill.p.cycles {
        tokio::time::sleep(drill.rng.millis(1000, 3000)).await;
        let at = db_now(&stages[0].sql).await;
        let n: i64 = stages[0]
            .sql
            .query_one(
                "SELECT count(*) FILTER (WHERE pg_terminate_backend(pid))
                   FROM pg_stat_activity
                  WHERE datname = ANY($1) AND pid <> pg_backend_pid()
                    AND (application_name LIKE 'qlsched%' OR usename = 'qlsched_runtime')",
                &[&names],
            )
            .await
            .unwrap()
            .get(0);
        assert!(n >= IDS.len() as i64, "only {n} backends to terminate");
        terminated_total += n;
        // Recovery: the first admission by each replica after the termination.
        for (id, sql) in IDS.iter().zip(stages.iter().map(|s| &s.sql)) {
            let first: i64 = poll_until(
                &format!("replica {id} admitting again"),
                Duration::from_secs(20),
                || async move {
                    sql.query_one(
                        "SELECT min(queued_at_ms) FROM qlsched.runs WHERE queued_at_ms > $1",
                        &[&at],
                    )
                    .await
                    .unwrap()
                    .get::<_, Option<i64>>(0)
                },
            )
            .await;
            recoveries.push(first - at);
        }
    }
    let mut errors = 0.0;
    for ((id, pid), stage) in IDS.iter().zip(&pids).zip(&stages) {
        let r = stage.fleet.get(id);
        assert_eq!(r.pid(), *pid, "replica {id} was restarted");
        assert_eq!(
            r.get("/readyz").map(|s| s.0),
            Some(200),
            "replica {id} not ready"
        );
        errors += stage.fleet.metric_sum("qlsched_errors_total");
    }
    for stage in &mut stages {
        stage.fleet.stop_all().await;
    }

    recoveries.sort();
    let worst_ms = *recoveries.last().unwrap();
    drill.report.note(format!(
        "backends terminated {terminated_total} · recovery = termination → first admission by each replica, \
         bound 2 cadences = {} ms · worst {worst_ms} ms · all (ms) {recoveries:?} · errors logged {errors}",
        2 * CADENCE_MS
    ));
    let expect = Expect::every_second();
    drill
        .report
        .finish_all(
            &[(&stages[0].sql, &expect), (&stages[1].sql, &expect)],
            &[&stages[0].fleet, &stages[1].fleet],
        )
        .await;
    assert!(
        worst_ms <= 2 * CADENCE_MS,
        "a replica took {worst_ms} ms to admit again after its backends were terminated (bound: two \
         cadences, {} ms); see drills::findings::pooled_connections_whose_backend_was_terminated_are_not_handed_out",
        2 * CADENCE_MS
    );
}
