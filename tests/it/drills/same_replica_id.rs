//! Drill 9, same replica id twice: a copy-pasted config starts a second process with the id
//! of a live replica that is admitting under load. The second refuses to start (non-zero
//! exit, naming the holder); the first goes on undisturbed: 0 duplicates, 0 lost.
//!
//! The guard itself (refusal message, the id free again after a clean stop) is covered by
//! `daemon::a_second_live_process_with_the_same_replica_id_refuses_to_start`; this drill is
//! the thin wrapper that puts it in the drill table, with the invariant checker.

use std::time::Duration;

use super::check::Expect;
use super::{exclusive, wait_all_admitting, Fleet, Params, Report, EVERY_SECOND};
use crate::helpers::replica::ReplicaProc;
use crate::helpers::TestDb;

const TRIGGERS: usize = 20;

#[tokio::test]
async fn a_second_process_with_a_live_replica_id_refuses_and_the_first_is_undisturbed() {
    let _one = exclusive().await;
    let p = Params::from_env((3, 0), (20, 0));
    let mut report = Report::new(
        "same_replica_id",
        &p,
        format!(
            "{} attempts to start a second `a`, {TRIGGERS} every-second triggers",
            p.cycles
        ),
    );
    let db = TestDb::new().await;
    db.seed(TRIGGERS, EVERY_SECOND).await;
    let sql = db.superuser().await;
    let dsn = db.dsn("qlsched_runtime");
    let mut fleet = Fleet::new(&dsn, "", &[]);
    fleet.start(&["a"]).await;
    let pid = fleet.get("a").pid();
    wait_all_admitting(&sql, TRIGGERS as i64, Duration::from_secs(30)).await;

    for _ in 0..p.cycles {
        let mut twin = ReplicaProc::spawn(&dsn, "a", "", &[("QLSCHED__LOG__LEVEL", "info")]);
        let status = twin.wait_exit(Duration::from_secs(30)).await;
        let log = twin.log();
        assert!(!status.success(), "the twin started: {log}");
        assert!(
            log.contains("replica id `a` is held by a live process")
                && log.contains(&format!("pid {pid}")),
            "{log}"
        );
        assert_eq!(fleet.get("a").get("/readyz").map(|r| r.0), Some(200));
        assert_eq!(fleet.get("a").pid(), pid);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    fleet.stop_all().await;

    report.note(format!(
        "twins refused {} of {} · the first replica kept its pid and readiness",
        p.cycles, p.cycles
    ));
    report.finish(&sql, &Expect::every_second(), &fleet).await;
}
