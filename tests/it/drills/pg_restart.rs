//! Drill 3, PostgreSQL restart: the drill's own server is stopped (`fast`, then
//! `immediate`: crash recovery at the next start, alternating) and started again a few
//! seconds later while two replicas run. They reconnect by themselves (same processes);
//! every occurrence that fell due while the database was down is admitted once, late but
//! within its grace: 0 duplicates, 0 lost.

use std::time::Duration;

use super::check::Expect;
use super::{
    db_now, exclusive, wait_all_admitting, Fleet, OwnPg, Params, Report, Rng, EVERY_SECOND,
};
use crate::helpers::poll_until;

const TRIGGERS: usize = 50;
const IDS: [&str; 2] = ["a", "b"];

#[tokio::test]
async fn replicas_reconnect_by_themselves_after_fast_and_immediate_postgres_restarts() {
    let _one = exclusive().await;
    let p = Params::from_env((2, 0), (10, 0));
    let mut rng = Rng::from_env();
    let mut report = Report::new(
        "pg_restart",
        &p,
        format!(
            "{} restarts (fast, immediate, …), 2 replicas, {TRIGGERS} every-second triggers, seed {}",
            p.cycles, rng.0
        ),
    );
    let mut pg = OwnPg::start("restart", "fsync = off").await;
    pg.db.seed(TRIGGERS, EVERY_SECOND).await;
    let mut fleet = Fleet::new(&pg.db.dsn("qlsched_runtime"), "", &[]);
    fleet.start(&IDS).await;
    let pids: Vec<u32> = IDS.iter().map(|id| fleet.get(id).pid()).collect();
    {
        let sql = pg.db.superuser().await;
        wait_all_admitting(&sql, TRIGGERS as i64, Duration::from_secs(30)).await;
    }

    let mut recoveries = Vec::new();
    let mut downs = Vec::new();
    for cycle in 0..p.cycles {
        tokio::time::sleep(rng.millis(1000, 3000)).await;
        let mode = if cycle % 2 == 0 { "fast" } else { "immediate" };
        pg.server.stop(mode);
        let down = rng.millis(1000, 4000);
        tokio::time::sleep(down).await;
        pg.server.start();
        downs.push(format!("{mode} {:.1} s", down.as_secs_f64()));
        let sql = pg.db.superuser().await;
        let up = db_now(&sql).await;
        for id in IDS {
            let first: i64 = poll_until(
                &format!("replica {id} admitting after the {mode} restart"),
                Duration::from_secs(30),
                || {
                    let sql = &sql;
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
        assert_eq!(fleet.get(id).pid(), *pid, "replica {id} was restarted");
    }
    let unknown = fleet.metric_sum("qlsched_unknown_outcomes_total");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let sql = pg.db.superuser().await;
    fleet.stop_all().await;

    report.note(format!(
        "restarts: {} · first admission by each replica after the server accepted again (ms): {recoveries:?} · unknown outcomes resolved {unknown}",
        downs.join(", ")
    ));
    report.finish(&sql, &Expect::every_second(), &fleet).await;
}
