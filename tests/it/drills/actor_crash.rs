//! Drill 7, actor crash: replicas built with the `fault-injection` feature and run with
//! `QLSCHED_FAULTS=admit_stop_every=7,claim_stop_every=5`: every 7th committed admission
//! the admit actor stops before replying (the claim actor must resolve the outcome by key
//! and fence), and every 5th claim actor stops after deciding, before sending (the
//! supervisor respawns it from its claim). The supervisor restarts both; 0 duplicates,
//! 0 lost. In the long form a fault-free replica runs beside it.

use super::check::Expect;
use super::{Drill, Stage};

const TRIGGERS: usize = 30;
const FAULTS: &str = "admit_stop_every=7,claim_stop_every=5";

#[tokio::test]
async fn supervisor_restarts_crashing_admit_and_claim_actors_without_dup_or_loss() {
    let mut drill = Drill::begin("actor_crash", (0, 12), (0, 120), |p, _| {
        format!(
            "{} s, replica a with QLSCHED_FAULTS={FAULTS}{}, {TRIGGERS} every-second triggers",
            p.duration.as_secs(),
            if p.long {
                " + fault-free replica b"
            } else {
                ""
            }
        )
    })
    .await;
    let mut stage = Stage::new(TRIGGERS, "").await;
    stage.fleet.spawn("a", &[("QLSCHED_FAULTS", FAULTS)]);
    stage.fleet.wait_ready("a").await;
    if drill.p.long {
        stage.fleet.start(&["b"]).await;
    }
    stage.wait_all_admitting().await;
    tokio::time::sleep(drill.p.duration).await;
    let a = stage.fleet.get("a");
    let restarts = a.metric("qlsched_actor_restarts_total").unwrap_or(0.0);
    let admits = a.metric("qlsched_admits_total").unwrap_or(0.0);
    let log = a.log();
    let admit_restarts = log.matches("admit actor stopped; restarting it").count();
    let claim_restarts = log
        .matches("claim actor stopped before reporting; restarting it")
        .count();
    stage.fleet.stop_all().await;

    drill.report.note(format!(
        "replica a: admits {admits} · actor restarts {restarts} (admit actor {admit_restarts}, claim actors {claim_restarts})"
    ));
    drill
        .report
        .finish(&stage.sql, &Expect::every_second(), &stage.fleet)
        .await;
    assert!(restarts > 0.0, "qlsched_actor_restarts_total is {restarts}");
    assert!(
        admit_restarts > 0 && claim_restarts > 0,
        "both fault hooks should have fired: admit actor restarts {admit_restarts}, claim actor restarts {claim_restarts} \
         (is the binary built with --features fault-injection?)"
    );
}
