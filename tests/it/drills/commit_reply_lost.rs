//! Drill 5, COMMIT reply lost on the wire: a replica talks to PostgreSQL through the fault
//! proxy (helpers/proxy.rs).
//! - Variant `reply lost`: the admission is committed by the server and both directions are
//!   cut before the client reads the reply: the client sees a reset, its outcome is
//!   unknown, and it must resolve it by idempotency key and fence (never guess).
//! - Variant `commit lost`: the admission executes but what would commit it never reaches
//!   the server; the connection is cut: the server rolls back, the client must not assume
//!   either way.
//!
//! Each occurrence ends with exactly one run; `qlsched_unknown_outcomes_total` > 0.

use std::time::Duration;

use super::check::Expect;
use super::{db_now, scalar, Drill, Stage};
use crate::helpers::proxy::Fault;
use crate::helpers::wait_until;

const TRIGGERS: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_occurrence_ends_with_one_run_when_the_commit_or_its_reply_is_lost() {
    let mut drill = Drill::begin("commit_reply_lost", (3, 0), (25, 0), |p, _| {
        format!(
            "{} faults per variant (every 2nd admission), replica a through the fault proxy, {TRIGGERS} every-second triggers",
            p.cycles
        )
    })
    .await;
    let mut stage = Stage::through_proxy(TRIGGERS, "").await;
    stage.start(&["a"]).await;
    let proxy = stage.proxy.as_ref().unwrap();

    for fault in [Fault::LoseCommitReply, Fault::LoseCommit] {
        proxy.arm(fault, 2, drill.p.cycles);
        wait_until(
            &format!("{} {fault:?} faults injected", drill.p.cycles),
            Duration::from_secs(30 + 5 * drill.p.cycles as u64),
            || async {
                let n = proxy
                    .stats()
                    .faults
                    .iter()
                    .filter(|f| f.fault == fault)
                    .count();
                n >= drill.p.cycles as usize
            },
        )
        .await;
    }
    // The replica admits through the proxy again after the last fault.
    let last = db_now(&stage.sql).await;
    wait_until(
        "an admission after the last fault",
        Duration::from_secs(30),
        || async {
            scalar(
                &stage.sql,
                &format!("SELECT count(*) FROM qlsched.runs WHERE queued_at_ms > {last}"),
            )
            .await
                > 0
        },
    )
    .await;
    let unknown = stage
        .fleet
        .get("a")
        .metric("qlsched_unknown_outcomes_total")
        .unwrap_or(0.0);
    stage.fleet.stop_all().await;
    // Each outcome is counted exactly once: the replica's admissions counter at its clean
    // stop equals the runs it committed, lost replies included.
    let counted = admitted_at_stop(&stage.fleet.stopped("a").log());
    let committed = scalar(
        &stage.sql,
        "SELECT count(*) FROM qlsched.runs WHERE admitted_by = 'a'",
    )
    .await;
    assert_eq!(
        counted, committed,
        "qlsched_admits_total at stop vs runs committed by the replica"
    );

    let s = proxy.stats();
    let lost_replies: Vec<_> = s
        .faults
        .iter()
        .filter(|f| f.fault == Fault::LoseCommitReply)
        .collect();
    let behind_back: Vec<(String, i64)> = lost_replies
        .iter()
        .filter(|f| f.committed)
        .flat_map(|f| f.rows.clone())
        .collect();
    // Each run the server committed behind the client's back is its occurrence's only run.
    for (trigger, queued_at) in &behind_back {
        let n: i64 = stage
            .sql
            .query_one(
                "SELECT count(*) FROM qlsched.runs r
                  WHERE r.trigger_id = $1
                    AND r.scheduled_for_ms = (SELECT scheduled_for_ms FROM qlsched.runs
                                               WHERE trigger_id = $1 AND queued_at_ms = $2)",
                &[trigger, queued_at],
            )
            .await
            .unwrap()
            .get(0);
        assert_eq!(n, 1, "occurrence of {trigger} committed at {queued_at}");
    }
    let commit_lost: Vec<String> = s
        .faults
        .iter()
        .filter(|f| f.fault == Fault::LoseCommit)
        .map(|f| f.replies.join("+"))
        .collect();
    drill.report.note(format!(
        "reply lost: {} faults, {} of them committed by the server ({} runs written behind the client's back, each its occurrence's only run) · \
         commit lost: {} faults, server replies the client never saw {commit_lost:?} · qlsched_unknown_outcomes_total {unknown}",
        lost_replies.len(),
        lost_replies.iter().filter(|f| f.committed).count(),
        behind_back.len(),
        commit_lost.len(),
    ));
    drill
        .report
        .finish(&stage.sql, &Expect::every_second(), &stage.fleet)
        .await;
    assert!(unknown > 0.0, "qlsched_unknown_outcomes_total is {unknown}");
    assert!(
        !behind_back.is_empty(),
        "no lost reply hid a committed admission: the drill did not exercise \"commit succeeded, client saw a reset\""
    );
}

/// The `admitted` count of the replica's final "stopped" log line.
fn admitted_at_stop(log: &str) -> i64 {
    log.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["msg"] == "stopped")
        .and_then(|v| v["admitted"].as_i64())
        .unwrap_or_else(|| panic!("no \"stopped\" line with an admitted count in the log:\n{log}"))
}
