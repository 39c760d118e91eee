//! Drill 3, PostgreSQL restart: the drill's own server is stopped (`fast`, then
//! `immediate`: crash recovery at the next start, alternating) and started again a few
//! seconds later while two replicas run. They reconnect by themselves (same processes);
//! every occurrence that fell due while the database was down is admitted once, late but
//! within its grace: 0 duplicates, 0 lost.

use std::time::Duration;

use super::check::Expect;
use super::{db_now, Drill, OwnPg, Stage};
use crate::helpers::poll_until;

const TRIGGERS: usize = 50;
const IDS: [&str; 2] = ["a", "b"];

#[tokio::test]
async fn replicas_reconnect_by_themselves_after_fast_and_immediate_postgres_restarts() {
    let mut drill = Drill::begin("pg_restart", (2, 0), (10, 0), |p, seed| {
        format!(
            "{} restarts (fast, immediate, …), 2 replicas, {TRIGGERS} every-second triggers, seed {seed}",
            p.cycles
        )
    })
    .await;
    let mut pg = OwnPg::start("restart", "fsync = off").await;
    let mut stage = Stage::on(pg.db.clone(), TRIGGERS, "").await;
    stage.start(&IDS).await;
    let pids: Vec<u32> = IDS.iter().map(|id| stage.fleet.get(id).pid()).collect();

    let mut recoveries = Vec::new();
    let mut downs = Vec::new();
    for cycle in 0..drill.p.cycles {
        tokio::time::sleep(drill.rng.millis(1000, 3000)).await;
        let mode = if cycle % 2 == 0 { "fast" } else { "immediate" };
        pg.server.stop(mode);
        let down = drill.rng.millis(1000, 4000);
        tokio::time::sleep(down).await;
        pg.server.start();
        downs.push(format!("{mode} {:.1} s", down.as_secs_f64()));
        // The superuser connection died with the server: a new one.
        stage.sql = pg.db.superuser().await;
        let up = db_now(&stage.sql).await;
        for id in IDS {
            let first: i64 = poll_until(
                &format!("replica {id} admitting after the {mode} restart"),
                Duration::from_secs(30),
                || {
                    let sql = &stage.sql;
                    async move {
                        sql.query_one(
                            "SELECT min(queued_at_ms) FROM qlsched.runs
                              WHERE admitted_by = $1 AND queued_at_ms > $2",
                            &[&id, &up],
                        )
                        .await
                        .unwrap()
                        .get::<_, Option<i64>>(0)
                    }
                },
            )
            .await;
            recoveries.push(first - up);
        }
    }
    for (id, pid) in IDS.iter().zip(&pids) {
        assert_eq!(
            stage.fleet.get(id).pid(),
            *pid,
            "replica {id} was restarted"
        );
    }
    let unknown = stage.fleet.metric_sum("qlsched_unknown_outcomes_total");
    tokio::time::sleep(Duration::from_secs(1)).await;
    stage.fleet.stop_all().await;

    drill.report.note(format!(
        "restarts: {} · first admission by each replica after the server accepted again (ms): {recoveries:?} · unknown outcomes resolved {unknown}",
        downs.join(", ")
    ));
    drill
        .report
        .finish(&stage.sql, &Expect::every_second(), &stage.fleet)
        .await;
}
