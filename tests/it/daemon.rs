//! The real binary: readiness, admission, clean stop, the replica-id guard.

use std::time::Duration;

use crate::helpers::replica::ReplicaProc;
use crate::helpers::{wait_until, TestDb};

#[tokio::test]
async fn a_replica_becomes_ready_admits_every_second_triggers_and_stops_cleanly() {
    let db = TestDb::new().await;
    db.seed(5, "* * * * * *").await;
    let mut a = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "a", "", &[]);
    a.wait_ready(Duration::from_secs(30)).await;
    wait_until("10 runs admitted", Duration::from_secs(30), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 10
    })
    .await;
    let (status, metrics) = a.get("/metrics").expect("metrics answer");
    assert_eq!(status, 200);
    let admits: f64 = metrics
        .lines()
        .find(|l| l.starts_with("qlsched_admits_total "))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .expect("qlsched_admits_total in /metrics");
    assert!(admits >= 1.0, "{metrics}");
    assert!(metrics.contains("qlsched_lag_seconds_bucket"), "{metrics}");
    let status = a.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}; log:\n{}", a.log());
    assert!(a.log().contains("leases handed over"), "{}", a.log());
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL")
            .await,
        0
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_second_live_process_with_the_same_replica_id_refuses_to_start() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let mut first = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "same", "", &[]);
    first.wait_ready(Duration::from_secs(30)).await;
    let mut second = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "same", "", &[]);
    let status = second.wait_exit(Duration::from_secs(30)).await;
    assert!(!status.success());
    let log = second.log();
    assert!(
        log.contains("replica id `same` is held by a live process"),
        "{log}"
    );
    assert!(log.contains("copy-pasted config"), "{log}");
    // The first one is unaffected, and after it stops cleanly the id is free at once.
    assert_eq!(first.get("/readyz").map(|r| r.0), Some(200));
    assert!(first.terminate(Duration::from_secs(20)).await.success());
    let mut third = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "same", "", &[]);
    third.wait_ready(Duration::from_secs(30)).await;
}

/// The guard row names the holder's claim connection, and a claim round that timed out drops
/// that connection (its statement's outcome is unknown); until the next round records the new
/// one, the row names a session that is gone. A second process of the same host name must
/// still be refused then: the holder holds its identity on a session of its own (drill
/// same_replica_id, under load: the twin took the id of a live first replica).
#[tokio::test]
async fn a_twin_is_refused_while_the_live_holder_replaces_its_claim_connection() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let sql = db.superuser().await;
    let dsn = db.dsn("qlsched_runtime");
    // A long lease: the guard does not expire while the holder is paused.
    let mut first = ReplicaProc::spawn(&dsn, "same", "lease = \"30s\"", &[]);
    first.wait_ready(Duration::from_secs(30)).await;
    // A run admitted: a claim round recorded the claim connection in the guard row.
    wait_until("a run admitted", Duration::from_secs(30), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 1
    })
    .await;
    // The holder between a round that dropped its claim connection and the next round (paused
    // so that the next round cannot come first): the recorded session is gone.
    first.signal(libc::SIGSTOP);
    let recorded: i32 = sql
        .query_one(
            "SELECT session_pid FROM qlsched.replicas WHERE replica_id = 'same'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    sql.execute("SELECT pg_terminate_backend($1)", &[&recorded])
        .await
        .unwrap();
    wait_until(
        "the recorded session gone",
        Duration::from_secs(10),
        || async {
            db.count(&format!(
                "SELECT count(*) FROM pg_stat_activity WHERE pid = {recorded}"
            ))
            .await
                == 0
        },
    )
    .await;

    let mut twin = ReplicaProc::spawn(&dsn, "same", "lease = \"30s\"", &[]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some((200, _)) = twin.get("/readyz") {
            first.signal(libc::SIGCONT);
            panic!(
                "the twin took the replica id of a live holder; twin log:\n{}",
                twin.log()
            );
        }
        if let Some(s) = twin.try_exit() {
            break s;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the twin neither refused nor started"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    first.signal(libc::SIGCONT);
    let log = twin.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("replica id `same` is held by a live process")
            && log.contains(&format!("pid {}", first.pid())),
        "{log}"
    );
    // The holder keeps its id and goes on.
    wait_until("the holder ready again", Duration::from_secs(10), || {
        let ready = first.get("/readyz").map(|r| r.0) == Some(200);
        async move { ready }
    })
    .await;
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM qlsched.replicas WHERE replica_id = 'same' AND pid = {}",
            first.pid()
        ))
        .await,
        1,
        "the guard row changed hands"
    );
    assert!(first.terminate(Duration::from_secs(20)).await.success());
}

#[tokio::test]
async fn a_replica_refuses_a_database_whose_migrations_drifted() {
    let db = TestDb::new().await;
    db.superuser()
        .await
        .batch_execute("UPDATE qlsched.schema_migrations SET checksum = '1' WHERE version = 1")
        .await
        .unwrap();
    let mut a = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "a", "", &[]);
    let status = a.wait_exit(Duration::from_secs(30)).await;
    assert!(!status.success());
    assert!(
        a.log()
            .contains("migration V1__definitions.sql was changed after it was applied"),
        "{}",
        a.log()
    );
}

#[test]
fn check_config_passes_the_shipped_files_and_names_file_key_and_bound_for_a_bad_one() {
    let root = env!("CARGO_MANIFEST_DIR");
    for r in ["a", "b", "c"] {
        let out = std::process::Command::new(crate::helpers::replica::binary())
            .args([
                "check-config",
                "--config",
                &format!("{root}/config/replica-{r}.toml"),
            ])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "replica-{r}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(
        &bad,
        "[replica]\nid = \"x\"\n[scheduler]\nclaim_budget = 0\ncadence = \"50ms\"\n",
    )
    .unwrap();
    let out = std::process::Command::new(crate::helpers::replica::binary())
        .args(["check-config", "--config"])
        .arg(&bad)
        .env(
            "QLSCHED__DATABASE__DSN",
            "host=127.0.0.1 port=1 user=nobody dbname=nothing",
        )
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = err.lines().collect();
    assert_eq!(lines.len(), 2, "{err}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("bad.toml: scheduler.claim_budget = 0: must be within 1..=256")),
        "{err}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("bad.toml: scheduler.cadence = 50ms")),
        "{err}"
    );
}

#[tokio::test]
async fn the_password_never_reaches_the_logs() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let secret = "hunter2-do-not-log";
    let mut a = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "pw",
        "",
        &[("QLSCHED__DATABASE__PASSWORD", secret)],
    );
    a.wait_ready(Duration::from_secs(30)).await;
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    let log = a.log();
    assert!(
        log.contains("\"database\""),
        "the start line names the database target: {log}"
    );
    assert!(!log.contains(secret), "{log}");
}

#[tokio::test]
async fn status_and_runs_list_report_replicas_claims_backlog_and_lag() {
    let db = TestDb::new().await;
    db.seed(3, "* * * * * *").await;
    let mut a = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "st", "", &[]);
    a.wait_ready(Duration::from_secs(30)).await;
    wait_until("6 runs admitted", Duration::from_secs(30), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 6
    })
    .await;
    let out = std::process::Command::new(crate::helpers::replica::binary())
        .args(["status", "--json", "--dsn", &db.dsn("qlsched_runtime")])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(s["replicas"][0]["replica_id"], "st");
    assert_eq!(s["replicas"][0]["live"], true);
    assert!(
        s["by_kind"]["cron"]["admitted_last_minute"]
            .as_i64()
            .unwrap()
            >= 6,
        "{s}"
    );
    assert!(s["by_kind"]["cron"]["lag_p99_ms"].as_f64().is_some(), "{s}");
    // Every-second rows come due all the time; nothing may be stuck behind.
    let backlog = s["due_backlog"].as_i64().unwrap();
    assert!(backlog <= 3, "{s}");
    assert!(
        backlog == 0 || s["oldest_due_age_ms"].as_i64().unwrap() < 1500,
        "{s}"
    );
    let list = std::process::Command::new(crate::helpers::replica::binary())
        .args([
            "runs",
            "list",
            "--dsn",
            &db.dsn("qlsched_runtime"),
            "--trigger",
            "trg-00001",
            "--limit",
            "2",
        ])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&list.stdout);
    assert_eq!(text.lines().count(), 2, "{text}");
    assert!(
        text.lines()
            .all(|l| l.starts_with("ql3:cron:v1:trg-00001:1:") && l.contains("by st")),
        "{text}"
    );
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    let out = std::process::Command::new(crate::helpers::replica::binary())
        .args(["status", "--json", "--dsn", &db.dsn("qlsched_runtime")])
        .output()
        .unwrap();
    let s: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        s["replicas"][0]["live"], false,
        "a clean stop retires the replica: {s}"
    );
}
