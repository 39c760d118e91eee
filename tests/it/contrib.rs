//! The shipped Prometheus alert rules (and their unit tests) and the Grafana dashboard name
//! only metrics that a live replica or a live worker exports on `/metrics`.

use std::collections::BTreeSet;
use std::time::Duration;

use crate::helpers::replica::ReplicaProc;
use crate::helpers::worker::{queue_runs, WorkerOptions, WorkerProc};
use crate::helpers::TestDb;

const FILES: [(&str, &str); 3] = [
    (
        "contrib/prometheus/qlsched-alerts.yml",
        include_str!("../../contrib/prometheus/qlsched-alerts.yml"),
    ),
    (
        "contrib/prometheus/qlsched-alerts.test.yml",
        include_str!("../../contrib/prometheus/qlsched-alerts.test.yml"),
    ),
    (
        "contrib/grafana/qlsched.json",
        include_str!("../../contrib/grafana/qlsched.json"),
    ),
];

/// Every `qlsched_…` metric name a rules or dashboard file mentions.
fn names_used(text: &str) -> BTreeSet<String> {
    let name = regex::Regex::new(r"\bqlsched_[a-z0-9_]+\b").unwrap();
    name.find_iter(text)
        .map(|m| m.as_str().to_string())
        .collect()
}

/// The sample names of a Prometheus/OpenMetrics text exposition (`qlsched_admits_total`,
/// `qlsched_lag_seconds_bucket`, …).
fn names_exported(body: &str) -> BTreeSet<String> {
    body.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

#[test]
fn the_dashboard_is_grafana_json_with_a_query_in_every_panel() {
    let (file, text) = FILES[2];
    let dashboard: serde_json::Value =
        serde_json::from_str(text).unwrap_or_else(|e| panic!("{file}: {e}"));
    let panels = dashboard["panels"].as_array().expect("panels");
    assert!(panels.len() >= 6, "{file}: {} panels", panels.len());
    for panel in panels {
        let exprs: Vec<&str> = panel["targets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|t| t["expr"].as_str())
            .collect();
        assert!(
            !exprs.is_empty() && exprs.iter().all(|e| e.contains("qlsched_")),
            "{file}: panel {} has queries {exprs:?}",
            panel["title"]
        );
    }
}

#[tokio::test]
async fn alert_rules_and_dashboard_use_only_metrics_a_live_replica_or_worker_exports() {
    let db = TestDb::new().await;
    // A finished run past the horizon, so the replica's first prune pass exports
    // `qlsched_runs_pruned_total` (a labelled counter has no sample before its first count),
    // and queued runs of pool "reports", which no worker below takes, so it exports
    // `qlsched_queued_runs{pool="reports"}`.
    crate::retention::run_aged(&db, "trg-a", "succeeded", 400 * 86_400_000).await;
    queue_runs(
        &db,
        "unserved",
        r#"{"image": "demo", "pool": "reports"}"#,
        3,
    )
    .await;
    // An overdue and a system-paused trigger (outcome rows as V19's triggers would leave
    // them), so the replica exports `qlsched_triggers_overdue{project}` and
    // `qlsched_triggers_system_paused{project}`.
    db.superuser()
        .await
        .batch_execute(
            "INSERT INTO qlsched.trigger_outcomes (trigger_id, project_id, success_due_at_ms,
                                                   system_paused_at_ms, updated_at_ms)
             VALUES ('late', 'proj', 1, NULL, 0), ('paused', 'proj', NULL, 1, 0)",
        )
        .await
        .unwrap();
    let mut w = WorkerProc::start(
        &db.dsn("qlsched_dispatcher"),
        "metrics-w",
        WorkerOptions::default(),
    );
    w.wait_ready(Duration::from_secs(30)).await;
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "metrics",
        "",
        &[("QLSCHED__RETENTION__INTERVAL", "1s")],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    let (mut status, mut body) = (0, String::new());
    crate::helpers::wait_until(
        "a prune pass shows in /metrics",
        Duration::from_secs(30),
        || {
            (status, body) = r.get("/metrics").expect("/metrics answers");
            let done = body.contains("qlsched_runs_pruned_total{")
                && body.contains("qlsched_queued_runs{pool=\"reports\"}")
                && body.contains("qlsched_triggers_overdue{project=\"proj\"} 1")
                && body.contains("qlsched_triggers_system_paused{project=\"proj\"} 1");
            async move { done }
        },
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let (status, worker_body) = w.get("/metrics").expect("the worker's /metrics answers");
    assert_eq!(status, 200, "{worker_body}");
    assert!(
        worker_body.contains("qlsched_worker_pools{pool=\"default\"} 1"),
        "{worker_body}"
    );
    let mut exported = names_exported(&body);
    exported.extend(names_exported(&worker_body));
    assert!(
        exported.contains("qlsched_admits_total")
            && exported.contains("qlsched_lag_seconds_bucket"),
        "the exposition parsed into {exported:?}:\n{body}"
    );

    // The dashboard has a panel for each retention metric (docs/design.md, "Retention").
    let dashboard = names_used(FILES[2].1);
    for m in [
        "qlsched_runs_pruned_total",
        "qlsched_prune_duration_seconds_bucket",
        "qlsched_oldest_finished_run_age_seconds",
        "qlsched_old_queued_runs",
    ] {
        assert!(dashboard.contains(m), "{}: no panel uses {m}", FILES[2].0);
    }
    for (file, text) in FILES {
        let used = names_used(text);
        assert!(used.len() >= 5, "{file}: found only {used:?}");
        let missing: Vec<&String> = used.difference(&exported).collect();
        assert!(
            missing.is_empty(),
            "{file} uses {missing:?}, which a live replica does not export; it exports {exported:?}"
        );
    }
    // The worker row of the dashboard.
    for m in [
        "qlsched_worker_taken_total",
        "qlsched_worker_succeeded_total",
        "qlsched_worker_failed_total",
        "qlsched_worker_lost_total",
        "qlsched_worker_running",
        "qlsched_worker_execution_seconds_bucket",
        "qlsched_worker_queue_wait_seconds_bucket",
    ] {
        assert!(dashboard.contains(m), "{}: no panel uses {m}", FILES[2].0);
    }
    w.signal(libc::SIGTERM);
    assert!(w.wait_exit(Duration::from_secs(30)).await.success());
    assert!(r.terminate(Duration::from_secs(30)).await.success());
}
