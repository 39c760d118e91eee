//! The daemon behind PgBouncer: session pooling works end to end (two replicas, exactly
//! once; the wake-up LISTEN carries notifications through it); transaction pooling is refused at start with the setting
//! to change (the driver prepares named statements, which PgBouncer 1.18 — Debian 12's —
//! cannot carry across transactions).

use std::time::Duration;

use crate::helpers::pgbouncer::PgBouncer;
use crate::helpers::replica::ReplicaProc;

use crate::helpers::{cluster, wait_until, TestDb};

#[tokio::test]
async fn two_replicas_behind_session_pooling_admit_every_occurrence_exactly_once() {
    let db = TestDb::new().await;
    db.seed(20, "* * * * * *").await;
    let bouncer = PgBouncer::start(cluster().port, "session");
    let dsn = bouncer.dsn("qlsched_runtime", &db.name);
    let mut a = ReplicaProc::spawn(&dsn, "a", "", &[]);
    let mut b = ReplicaProc::spawn(&dsn, "b", "", &[]);
    a.wait_ready(Duration::from_secs(30)).await;
    b.wait_ready(Duration::from_secs(30)).await;
    wait_until(
        "both replicas admitted through PgBouncer",
        Duration::from_secs(30),
        || async {
            db.count(
                "SELECT count(DISTINCT admitted_by) FROM qlsched.runs WHERE admitted_by IN ('a', 'b')",
            )
            .await
                == 2
                && db.count("SELECT count(*) FROM qlsched.runs").await >= 100
        },
    )
    .await;
    // The runtime sessions are PgBouncer's: the replicas know no other address.
    let sessions = db
        .count(
            "SELECT count(*) FROM pg_stat_activity
              WHERE usename = 'qlsched_runtime' AND backend_type = 'client backend'",
        )
        .await;
    assert!(sessions >= 2, "runtime sessions through PgBouncer");
    for r in [&mut a, &mut b] {
        let status = r.terminate(Duration::from_secs(20)).await;
        assert!(status.success(), "exit {status}; log:\n{}", r.log());
        assert!(!r.log().contains("prepared statement"), "{}", r.log());
    }
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_replica_behind_transaction_pooling_refuses_to_start_naming_pool_mode() {
    let db = TestDb::new().await;
    db.seed(5, "* * * * * *").await;
    let bouncer = PgBouncer::start(cluster().port, "transaction");
    let mut a = ReplicaProc::spawn(&bouncer.dsn("qlsched_runtime", &db.name), "a", "", &[]);
    let status = a.wait_exit(Duration::from_secs(30)).await;
    let log = a.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains("served by two PostgreSQL sessions"),
        "refused by the start-up probe: {log}"
    );
    assert!(log.contains("pool_mode = session"), "{log}");
    // Its admin console lets the role read the pooler's version, which the refusal names.
    assert!(
        log.contains("(PgBouncer 1.") && log.contains("with pool_mode = transaction)"),
        "{log}"
    );
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 0);
    // The probe ran before anything else: none of the readiness gate's statements (role,
    // schema, capability, grants; prepared) went through the transaction pooler.
    let seen = db.runtime_statement_texts().await;
    assert!(
        seen.iter().any(|(q, _)| q.contains("pg_backend_pid()")),
        "the probe ran: {seen:?}"
    );
    assert!(
        seen.iter()
            .all(|(q, _)| !q.contains("qlsched.") && !q.contains("current_user")),
        "statements before the refusal: {seen:?}"
    );
}

/// Behind session pooling the wake-up LISTEN holds a server session like any other
/// connection, so notifications arrive: a trigger published while the replica sleeps
/// (cadence 10 s, nothing due) is admitted within 100 ms of its first occurrence.
#[tokio::test]
async fn behind_session_pooling_a_published_trigger_wakes_a_sleeping_replica() {
    let _one = crate::drills::exclusive().await;
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let bouncer = PgBouncer::start(cluster().port, "session");
    let dsn = bouncer.dsn("qlsched_runtime", &db.name);
    let mut r = ReplicaProc::spawn(&dsn, "a", "cadence = \"10s\"\nlease = \"30s\"", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    wait_until("the listener", Duration::from_secs(20), || async {
        db.listeners().await >= 1
    })
    .await;
    // Well inside the 10 s cadence: only the notification can have woken the replica.
    db.publish_and_await_first_run(&mut admin, "fresh", Duration::from_secs(5))
        .await
        .assert_first_admitted_within(100, "not on time");
    let status = r.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}; log:\n{}", r.log());
    db.assert_invariants().await;
}
