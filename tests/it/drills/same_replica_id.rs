//! Drill 9, same replica id twice: a copy-pasted config starts a second process with the id
//! of a live replica that is admitting under load. The second refuses to start (non-zero
//! exit, naming the holder); the first goes on undisturbed: 0 duplicates, 0 lost.
//!
//! The guard itself (refusal message, the id free again after a clean stop) is covered by
//! `daemon::a_second_live_process_with_the_same_replica_id_refuses_to_start`; this drill is
//! the thin wrapper that puts it in the drill table, with the invariant checker.

use std::time::Duration;

use super::check::Expect;
use super::{Drill, Stage};
use crate::helpers::replica::ReplicaProc;

const TRIGGERS: usize = 20;

#[tokio::test]
async fn a_second_process_with_a_live_replica_id_refuses_and_the_first_is_undisturbed() {
    let mut drill = Drill::begin("same_replica_id", (3, 0), (20, 0), |p, _| {
        format!(
            "{} attempts to start a second `a`, {TRIGGERS} every-second triggers",
            p.cycles
        )
    })
    .await;
    let mut stage = Stage::new(TRIGGERS, "").await;
    stage.start(&["a"]).await;
    let pid = stage.fleet.get("a").pid();
    let dsn = stage.db.dsn("qlsched_runtime");

    for _ in 0..drill.p.cycles {
        let mut twin = ReplicaProc::spawn(&dsn, "a", "", &[("QLSCHED__LOG__LEVEL", "info")]);
        let status = twin.wait_exit(Duration::from_secs(30)).await;
        let log = twin.log();
        assert!(!status.success(), "the twin started: {log}");
        assert!(
            log.contains("replica id `a` is held by a live process")
                && log.contains(&format!("pid {pid}")),
            "{log}"
        );
        assert_eq!(stage.fleet.get("a").get("/readyz").map(|r| r.0), Some(200));
        assert_eq!(stage.fleet.get("a").pid(), pid);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    stage.fleet.stop_all().await;

    drill.report.note(format!(
        "twins refused {} of {} · the first replica kept its pid and readiness",
        drill.p.cycles, drill.p.cycles
    ));
    drill
        .report
        .finish(&stage.sql, &Expect::every_second(), &stage.fleet)
        .await;
}
