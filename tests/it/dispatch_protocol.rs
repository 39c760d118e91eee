//! The dispatcher protocol enforced by the database (docs/dispatcher.md): history no role
//! can forge, and the protocol functions (V16) fencing every write by the attempt's token
//! and lease, judged by the database clock.

use qlsched::store::dispatch::TAKE_SQL;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::dispatcher::queued_runs;
use crate::helpers::drive::{finish_direct, start_direct, take};
use crate::helpers::worker::request_cancel;
use crate::helpers::TestDb;

/// Runs `sql` as `role` and returns the SQLSTATE it was refused with (None: accepted).
async fn refused_as(db: &TestDb, role: &str, sql: &str) -> Option<SqlState> {
    match db.client(role).await.batch_execute(sql).await {
        Ok(()) => None,
        Err(e) => Some(e.code().cloned().unwrap_or(SqlState::INTERNAL_ERROR)),
    }
}

fn assert_refused(got: Option<SqlState>, why: &str) {
    assert!(
        matches!(&got, Some(c) if *c == SqlState::CHECK_VIOLATION || *c == SqlState::INSUFFICIENT_PRIVILEGE),
        "{why}: accepted or refused for another reason ({got:?})"
    );
}

#[tokio::test]
async fn no_role_can_insert_an_event_out_of_step_with_its_run() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 2).await;
    for role in ["qlsched_dispatcher", "qlsched_admin", "qlsched_runtime"] {
        for (seq, kind) in [
            (3, "run.cancelled"),
            (3, "run.dispatching"),
            (9, "run.finished"),
        ] {
            let sql = format!(
                "INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms) VALUES ('{}', {seq}, '{kind}', 0)",
                runs[0]
            );
            assert_refused(refused_as(&db, role, &sql).await, &format!("{role}: {sql}"));
        }
    }
    // The take (and `runs cancel`) still work on that run.
    let d = db.client("qlsched_dispatcher").await;
    let taken = d.query(TAKE_SQL, &[&2i64]).await.unwrap();
    assert_eq!(taken.len(), 2, "the take still takes both runs");
    db.assert_invariants().await;
}

#[tokio::test]
async fn cancelled_and_status_cancelled_move_together() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 1).await;
    let sql = format!(
        "UPDATE qlsched.runs SET status = 'cancelled' WHERE run_id = '{}'",
        runs[0]
    );
    assert_refused(
        refused_as(&db, "qlsched_dispatcher", &sql).await,
        "dispatcher: queued -> cancelled without the flag",
    );
    assert_refused(
        refused_as(&db, "qlsched_admin", &sql).await,
        "admin: queued -> cancelled without the flag",
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'queued' AND NOT cancelled")
            .await,
        1
    );
}

#[tokio::test]
async fn an_untouched_attempt_cannot_be_written() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 2).await;
    // Untouched: an error on a queued run's attempt would make it untakeable for good.
    let sql = format!(
        "UPDATE qlsched.attempts SET error = 'x' WHERE run_id = '{}'",
        runs[1]
    );
    assert_refused(
        refused_as(&db, "qlsched_dispatcher", &sql).await,
        "error written on a queued run's attempt",
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_finished_attempt_is_frozen() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 1).await;
    // Finished through the direct statements: result, error and times are frozen.
    let d = db.client("qlsched_dispatcher").await;
    take(&d, 1).await;
    start_direct(&d, &[runs[0]]).await;
    assert_eq!(finish_direct(&d, runs[0], "succeeded").await, 1);
    for set in [
        "result = '{\"forged\":true}'",
        "error = 'forged'",
        "finished_at_ms = 0",
        "started_at_ms = 0, state = state",
    ] {
        let sql = format!(
            "UPDATE qlsched.attempts SET {set} WHERE run_id = '{}'",
            runs[0]
        );
        assert_refused(
            refused_as(&db, "qlsched_dispatcher", &sql).await,
            &format!("finished attempt rewritten: {sql}"),
        );
    }
    assert_eq!(
        db.count(
            "SELECT count(*) FROM qlsched.attempts WHERE result IS NOT NULL OR error IS NOT NULL"
        )
        .await,
        0
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_result_is_bounded() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 1).await;
    let d = db.client("qlsched_dispatcher").await;
    take(&d, 1).await;
    start_direct(&d, &[runs[0]]).await;
    let sql = format!(
        "UPDATE qlsched.attempts SET state = 'succeeded', result = jsonb_build_object('x', repeat('y', 1048576)) WHERE run_id = '{}'",
        runs[0]
    );
    assert_refused(
        refused_as(&db, "qlsched_dispatcher", &sql).await,
        "a 1 MiB result",
    );
}

#[tokio::test]
async fn execution_revisions_are_immutable_for_every_role() {
    let db = TestDb::new().await;
    queued_runs(&db, 1).await;
    for role in ["qlsched_admin", "qlsched_owner"] {
        assert_refused(
            refused_as(
                &db,
                role,
                "UPDATE qlsched.execution_revisions SET spec = spec || ' '",
            )
            .await,
            &format!("{role} rewrites an execution revision"),
        );
    }
    let e = db
        .superuser()
        .await
        .batch_execute("UPDATE qlsched.execution_revisions SET spec = spec || ' '")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "superuser: {e}");
}

#[tokio::test]
async fn no_role_can_add_a_second_attempt_to_a_run() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 1).await;
    for role in ["qlsched_admin", "qlsched_runtime"] {
        let sql = format!(
            "INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
             VALUES ('{}', '{}', 2, 'remote_worker', 'claimed', 0)",
            Uuid::new_v4(),
            runs[0]
        );
        assert_refused(
            refused_as(&db, role, &sql).await,
            &format!("{role}: a second live attempt"),
        );
    }
    db.assert_invariants().await;
}

/// One attempt taken through `qlsched.dispatch_take`.
#[derive(Clone, Debug)]
pub struct Lease {
    pub run_id: Uuid,
    pub attempt_id: Uuid,
    pub attempt_no: i32,
    pub token: Uuid,
}

pub async fn take_leases(
    c: &tokio_postgres::Client,
    worker: &str,
    max_runs: i32,
    lease_ms: i64,
) -> Vec<Lease> {
    c.query(
        "SELECT run_id, attempt_id, attempt_no, lease_token
           FROM qlsched.dispatch_take($1, NULL, $2, $3)",
        &[&worker, &max_runs, &lease_ms],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| Lease {
        run_id: r.get(0),
        attempt_id: r.get(1),
        attempt_no: r.get(2),
        token: r.get(3),
    })
    .collect()
}

async fn start(c: &tokio_postgres::Client, l: &Lease, lease_ms: i64) -> bool {
    c.query_one(
        "SELECT qlsched.dispatch_start($1, $2, $3)",
        &[&l.attempt_id, &l.token, &lease_ms],
    )
    .await
    .unwrap()
    .get(0)
}

async fn heartbeat(c: &tokio_postgres::Client, l: &Lease, lease_ms: i64) -> Option<i64> {
    heartbeat_and_cancel(c, l, lease_ms).await.0
}

/// The new lease expiry (None: not held) and whether a cancel was requested.
async fn heartbeat_and_cancel(
    c: &tokio_postgres::Client,
    l: &Lease,
    lease_ms: i64,
) -> (Option<i64>, bool) {
    let r = c
        .query_one(
            qlsched::store::dispatch::protocol::HEARTBEAT,
            &[&l.attempt_id, &l.token, &lease_ms],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

async fn finish(c: &tokio_postgres::Client, l: &Lease, outcome: &str) -> bool {
    c.query_one(
        "SELECT qlsched.dispatch_finish($1, $2, $3, 0, 'tail', NULL, '{\"ok\":1}')",
        &[&l.attempt_id, &l.token, &outcome],
    )
    .await
    .unwrap()
    .get(0)
}

async fn expire(c: &tokio_postgres::Client) -> (i64, i64) {
    let r = c
        .query_one(
            "SELECT lost, retried FROM qlsched.dispatch_expire(1000)",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// Ends every live lease now, as if the clock had passed it (the only clock the fence reads
/// is the database's; the test moves the lease, not the clock).
async fn end_leases(db: &TestDb) {
    let su = db.superuser().await;
    su.batch_execute(
        "ALTER TABLE qlsched.attempts DISABLE TRIGGER attempts_follow_the_protocol;
         UPDATE qlsched.attempts SET lease_expires_at_ms = lease_expires_at_ms - 86400000
          WHERE lease_id IS NOT NULL AND state IN ('dispatching', 'running');
         ALTER TABLE qlsched.attempts ENABLE TRIGGER attempts_follow_the_protocol;",
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn the_protocol_takes_starts_heartbeats_and_finishes_under_its_lease() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 3).await;
    let d = db.client("qlsched_dispatcher").await;
    let taken = take_leases(&d, "w1", 2, 30_000).await;
    assert_eq!(taken.len(), 2);
    let forged = Lease {
        token: Uuid::new_v4(),
        ..taken[0].clone()
    };
    assert!(
        !start(&d, &forged, 30_000).await,
        "a forged token started work"
    );
    assert!(start(&d, &taken[0], 30_000).await);
    assert!(heartbeat(&d, &forged, 60_000).await.is_none());
    assert!(heartbeat(&d, &taken[0], 60_000).await.is_some());
    assert!(finish(&d, &taken[0], "succeeded").await);
    // Not started: only a failure can be recorded, or a release gives it back.
    assert!(!finish(&d, &taken[1], "succeeded").await);
    let released: bool = d
        .query_one(
            "SELECT qlsched.dispatch_release($1, $2)",
            &[&taken[1].attempt_id, &taken[1].token],
        )
        .await
        .unwrap()
        .get(0);
    assert!(released);
    // A finished or released lease is not held any more.
    assert!(heartbeat(&d, &taken[0], 30_000).await.is_none());
    assert!(!start(&d, &taken[1], 30_000).await);
    let statuses: Vec<String> = db
        .superuser()
        .await
        .query(
            "SELECT status FROM qlsched.runs WHERE run_id = ANY ($1) ORDER BY status DESC",
            &[&runs],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(statuses, ["succeeded", "queued", "queued"]);
    let kinds: Vec<String> = db
        .superuser()
        .await
        .query(
            "SELECT kind || ':' || seq FROM qlsched.run_events WHERE run_id = $1 ORDER BY seq",
            &[&taken[1].run_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        kinds,
        [
            "run.created:1",
            "run.queued:2",
            "run.dispatching:3",
            "run.queued:4"
        ]
    );
    // The released run is taken again, under a new token.
    let again = take_leases(&d, "w2", 2, 30_000).await;
    let back = again.iter().find(|l| l.run_id == taken[1].run_id).unwrap();
    assert_ne!(back.token, taken[1].token);
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_paused_dispatchers_late_heartbeat_start_and_finish_are_refused() {
    let db = TestDb::new().await;
    queued_runs(&db, 2).await;
    let d = db.client("qlsched_dispatcher").await;
    let taken = take_leases(&d, "w1", 2, 30_000).await;
    assert!(start(&d, &taken[0], 30_000).await);
    // The worker pauses past its leases.
    end_leases(&db).await;
    assert!(
        heartbeat(&d, &taken[0], 30_000).await.is_none(),
        "late heartbeat extended a lease"
    );
    assert!(
        !finish(&d, &taken[0], "succeeded").await,
        "late finish recorded"
    );
    assert!(!start(&d, &taken[1], 30_000).await, "late start recorded");
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.attempts WHERE finished_at_ms IS NOT NULL")
            .await,
        0,
        "nothing recorded after the lease ended"
    );
    assert_eq!(
        expire(&d).await,
        (2, 0),
        "both lost, max_attempts 1: no retry"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'failed'")
            .await,
        2
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.attempts WHERE error LIKE 'lost: lease expired%'")
            .await,
        2
    );
}

/// Pins every run to a new execution revision of `spec` (as the superuser): its settings
/// (`max_attempts`, …) are what the protocol reads at take and expiry.
async fn pin_spec(su: &tokio_postgres::Client, spec: &str) {
    su.execute(
        "WITH e AS (
           INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
           VALUES (gen_random_uuid(), 'proj', 'remote_worker', $1, encode(sha256(convert_to($1, 'UTF8')), 'hex'), 0)
           RETURNING execution_revision_id)
         UPDATE qlsched.runs SET execution_revision_id = (SELECT execution_revision_id FROM e)",
        &[&spec],
    )
    .await
    .unwrap();
}

#[tokio::test]
async fn an_expired_attempt_is_retried_exactly_once_with_max_attempts_2() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    let runs = queued_runs(&db, 1).await;
    // The run pins a revision whose spec allows two attempts.
    pin_spec(&su, "{\"image\":\"demo\",\"max_attempts\":2}").await;
    let d = db.client("qlsched_dispatcher").await;
    let first = take_leases(&d, "w1", 1, 30_000).await;
    assert_eq!(first.len(), 1);
    assert!(start(&d, &first[0], 30_000).await);
    end_leases(&db).await;
    assert_eq!(expire(&d).await, (1, 1));
    assert_eq!(expire(&d).await, (0, 0), "expiry is idempotent");
    let second = take_leases(&d, "w2", 1, 30_000).await;
    assert_eq!(second.len(), 1);
    assert_eq!(second[0].run_id, runs[0]);
    assert_eq!(second[0].attempt_no, 2);
    // The old holder wakes up: refused.
    assert!(!finish(&d, &first[0], "succeeded").await);
    assert!(start(&d, &second[0], 30_000).await);
    end_leases(&db).await;
    assert_eq!(
        expire(&d).await,
        (1, 0),
        "attempts exhausted: failed, not retried"
    );
    let r = su
        .query_one(
            "SELECT r.status, count(a.*), count(*) FILTER (WHERE a.error LIKE 'lost:%'),
                    max(r.idempotency_key)
               FROM qlsched.runs r JOIN qlsched.attempts a ON a.run_id = r.run_id
              GROUP BY r.status",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, String>(0), "failed");
    assert_eq!(r.get::<_, i64>(1), 2);
    assert_eq!(r.get::<_, i64>(2), 2);
}

/// `n` queued runs of trg-00000 as three replicas admit them: run ids begin with each
/// replica's hash (so id order is replica order) while queued_at_ms interleaves them.
async fn queued_by_three_replicas(db: &TestDb, n: i32) {
    db.seed(1, "* * * * * *").await;
    crate::helpers::insert_runs(
        &db.superuser().await,
        &format!(
            "SELECT (lpad(to_hex(g % 3), 8, '0') || '-0000-4000-8000-' || lpad(to_hex(g), 12, '0'))::uuid
                        AS run_id,
                    'trg-00000' AS trigger_id,
                    (SELECT execution_revision_id FROM qlsched.tasks WHERE task_id = 'task')
                        AS execution_revision_id,
                    'queued' AS status, g::bigint AS scheduled_for_ms,
                    1000000 + g::bigint AS queued_at_ms, 'replica-' || g % 3 AS admitted_by
               FROM generate_series(1, {n}) g"
        ),
    )
    .await;
}

/// Takes batches until none is left; the queued_at_ms of each run taken, in take order.
async fn take_all_in_order(db: TestDb, worker: &'static str) -> Vec<(Uuid, i64)> {
    let c = db.client("qlsched_dispatcher").await;
    let mut got = Vec::new();
    loop {
        let rows = c
            .query(
                "SELECT t.run_id, r.queued_at_ms
                   FROM qlsched.dispatch_take($1, NULL, 100, 30000) t
                   JOIN qlsched.runs r USING (run_id)",
                &[&worker],
            )
            .await
            .unwrap();
        if rows.is_empty() {
            return got;
        }
        got.extend(rows.iter().map(|r| (r.get(0), r.get(1))));
    }
}

#[tokio::test]
async fn two_dispatchers_racing_over_10000_runs_take_each_once_in_queued_at_order() {
    let db = TestDb::new().await;
    queued_by_three_replicas(&db, 10_000).await;
    let (a, b) = tokio::join!(
        tokio::spawn(take_all_in_order(db.clone(), "a")),
        tokio::spawn(take_all_in_order(db.clone(), "b"))
    );
    let (a, b) = (a.unwrap(), b.unwrap());
    for (who, got) in [("a", &a), ("b", &b)] {
        let at: Vec<i64> = got.iter().map(|(_, q)| *q).collect();
        let mut sorted = at.clone();
        sorted.sort();
        assert!(
            at == sorted,
            "dispatcher {who} took runs out of queued_at order"
        );
    }
    let mut all: Vec<Uuid> = a.iter().chain(&b).map(|(r, _)| *r).collect();
    all.sort();
    let n = all.len();
    all.dedup();
    assert_eq!(
        (n, all.len()),
        (10_000, 10_000),
        "each run taken exactly once"
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_concurrent_cancel_and_take_exclude_each_other() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 20).await;
    // A cancel holds its chunk open: the take skips every run it locked.
    let mut admin = db.admin().await;
    let tx = admin.transaction().await.unwrap();
    tx.batch_execute(&format!(
        "SELECT 1 FROM qlsched.runs WHERE run_id IN ({}) FOR UPDATE",
        runs[..10]
            .iter()
            .map(|r| format!("'{r}'"))
            .collect::<Vec<_>>()
            .join(", ")
    ))
    .await
    .unwrap();
    let d = db.client("qlsched_dispatcher").await;
    let taken = take_leases(&d, "w", 100, 30_000).await;
    assert_eq!(taken.len(), 10);
    assert!(taken.iter().all(|l| !runs[..10].contains(&l.run_id)));
    tx.rollback().await.unwrap();
    // Now `runs cancel` over all 20: the 10 taken are left alone, the rest cancelled; the
    // take then finds nothing.
    let cancelled = qlsched::store::runs::cancel_chunk(&mut admin, &runs)
        .await
        .unwrap();
    assert_eq!(cancelled, 10);
    assert!(take_leases(&d, "w", 100, 30_000).await.is_empty());
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_corrupt_pinned_spec_is_failed_at_take_never_handed_out() {
    let db = TestDb::new().await;
    queued_runs(&db, 1).await;
    db.superuser()
        .await
        .batch_execute(
            "ALTER TABLE qlsched.execution_revisions DISABLE TRIGGER execution_revisions_are_immutable;
             UPDATE qlsched.execution_revisions SET spec = spec || ' ';
             ALTER TABLE qlsched.execution_revisions ENABLE TRIGGER execution_revisions_are_immutable",
        )
        .await
        .unwrap();
    let d = db.client("qlsched_dispatcher").await;
    assert!(take_leases(&d, "w", 10, 30_000).await.is_empty());
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.attempts WHERE state = 'failed' AND error LIKE '%fails its digest%'")
            .await,
        1
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn replicas_and_admins_cannot_call_the_protocol() {
    let db = TestDb::new().await;
    queued_runs(&db, 1).await;
    for role in ["qlsched_runtime", "qlsched_admin", "qlsched_worker_ingress"] {
        let e = db
            .client(role)
            .await
            .batch_execute("SELECT * FROM qlsched.dispatch_take('w', NULL, 1, 30000)")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{role}");
        let e = db
            .client(role)
            .await
            .batch_execute("SELECT * FROM qlsched.dispatch_expire(10)")
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{role}");
    }
}

#[tokio::test]
async fn recovery_leaves_runs_under_the_protocol_alone_and_reports_the_old_takes() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    queued_runs(&db, 5).await;
    pin_spec(&su, "{\"max_attempts\":3}").await;
    let d = db.client("qlsched_dispatcher").await;
    // One run lost and queued again (attempt 2), one taken, one running: all the protocol's.
    let lost = take_leases(&d, "w", 1, 30_000).await;
    end_leases(&db).await;
    assert_eq!(expire(&d).await, (1, 1));
    let taken = take_leases(&d, "w", 2, 30_000).await;
    assert_eq!(taken.len(), 2);
    assert!(taken.iter().all(|l| l.run_id != lost[0].run_id));
    assert!(start(&d, &taken[0], 30_000).await);
    // One more taken by a dispatcher of the V10 contract, outside the protocol.
    let old: Vec<Uuid> = d
        .query(TAKE_SQL, &[&1i64])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(old.len(), 1, "{old:?}");
    let runtime = db.client("qlsched_runtime").await;
    let report = qlsched::store::recovery::recover_on_startup(&runtime, 100)
        .await
        .unwrap();
    assert_eq!(
        report
            .candidates
            .iter()
            .map(|c| (c.run_id, c.reason.as_str()))
            .collect::<Vec<_>>(),
        [(old[0], "run is dispatching")],
        "only the run outside the protocol is reported"
    );
    assert_eq!(report.candidate_count, 1);
}

#[tokio::test]
async fn runs_show_lists_every_attempt_and_runs_list_filters_by_status() {
    use crate::helpers::cli::{ok, ql};
    let db = TestDb::new().await;
    let su = db.superuser().await;
    let runs = queued_runs(&db, 3).await;
    pin_spec(&su, "{\"max_attempts\":2}").await;
    let d = db.client("qlsched_dispatcher").await;
    let first = take_leases(&d, "w1", 1, 30_000).await;
    end_leases(&db).await;
    assert_eq!(expire(&d).await, (1, 1));
    let all = take_leases(&d, "w2", 10, 30_000).await;
    assert_eq!(all.len(), 3);
    let second = all.iter().find(|l| l.run_id == first[0].run_id).unwrap();
    assert_eq!(second.attempt_no, 2);
    assert!(start(&d, second, 30_000).await);
    assert!(finish(&d, second, "succeeded").await);
    let run = first[0].run_id.to_string();
    let shown: serde_json::Value =
        serde_json::from_str(&ok(ql(&db, &["runs", "show", &run, "--json"]))).unwrap();
    assert_eq!(shown["status"], "succeeded");
    let attempts = shown["attempts"].as_array().unwrap();
    assert_eq!(attempts.len(), 2);
    assert_eq!(attempts[0]["state"], "failed");
    assert!(attempts[0]["error"]
        .as_str()
        .unwrap()
        .starts_with("lost: lease expired"));
    assert_eq!(attempts[1]["state"], "succeeded");
    assert_eq!(attempts[1]["worker_id"], "w2");
    assert_eq!(shown["events"].as_array().unwrap().len(), 7);
    let text = ok(ql(&db, &["runs", "show", &run]));
    assert!(text.contains("attempt 2  succeeded"), "{text}");
    let listed = ok(ql(&db, &["runs", "list", "--status", "dispatching"]));
    assert_eq!(listed.lines().count(), 2, "{listed}");
    assert!(
        listed.lines().all(|l| l.contains("  dispatching  ")),
        "{listed}"
    );
    assert!(runs.contains(&first[0].run_id));
}

#[tokio::test]
async fn attempts_past_their_lease_are_a_gauge() {
    let db = TestDb::new().await;
    queued_runs(&db, 3).await;
    let d = db.client("qlsched_dispatcher").await;
    assert_eq!(take_leases(&d, "w", 2, 30_000).await.len(), 2);
    end_leases(&db).await;
    let p = crate::retention::pruner(
        "a",
        crate::retention::cfg(std::time::Duration::from_secs(3600), 10),
    );
    p.pass(&db.client("qlsched_runtime").await).await.unwrap();
    let text = p.metrics.render();
    assert!(text.contains("qlsched_lapsed_attempts 2\n"), "{text}");
    // Once expired, nothing is past its lease.
    assert_eq!(expire(&d).await, (2, 0));
    p.pass(&db.client("qlsched_runtime").await).await.unwrap();
    assert!(p.metrics.render().contains("qlsched_lapsed_attempts 0\n"));
}

#[tokio::test]
async fn a_call_that_waited_for_the_run_lock_rechecks_the_lease_after_it() {
    let db = TestDb::new().await;
    queued_runs(&db, 1).await;
    let a = db.client("qlsched_dispatcher").await;
    let b = db.client("qlsched_dispatcher").await;
    let l = take_leases(&a, "w", 1, 30_000).await.remove(0);
    // A releases the attempt in a transaction it keeps open; B's failing finish of the same
    // lease waits for the run lock, then must find the lease gone.
    a.batch_execute("BEGIN").await.unwrap();
    let released: bool = a
        .query_one(
            "SELECT qlsched.dispatch_release($1, $2)",
            &[&l.attempt_id, &l.token],
        )
        .await
        .unwrap()
        .get(0);
    assert!(released);
    let (attempt, token) = (l.attempt_id, l.token);
    let late = tokio::spawn(async move {
        b.query_one(
            "SELECT qlsched.dispatch_finish($1, $2, 'failed', 1, NULL, 'late', NULL)",
            &[&attempt, &token],
        )
        .await
        .map(|r| r.get::<_, bool>(0))
    });
    crate::helpers::wait_until(
        "the finish waits for the run lock",
        std::time::Duration::from_secs(10),
        || async {
            db.count(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE usename = 'qlsched_dispatcher' AND wait_event_type = 'Lock'",
            )
            .await
                == 1
        },
    )
    .await;
    a.batch_execute("COMMIT").await.unwrap();
    let got = late.await.unwrap();
    assert!(
        matches!(got, Ok(false)),
        "a finish after the release: {got:?}"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'queued'")
            .await,
        1
    );
    db.assert_invariants().await;
}

/// One dispatcher pass over `ids` until the connection fails: take, start, finish each run
/// (autocommit calls). Returns the runs whose finish answered `true` (acknowledged).
async fn dispatch_until_error(db: &TestDb, acked: &std::sync::Mutex<Vec<Uuid>>) {
    let Ok(c) = qlsched::db::connect(&db.config("qlsched_dispatcher")).await else {
        return;
    };
    loop {
        let Ok(rows) = c
            .query(
                "SELECT run_id, attempt_id, lease_token FROM qlsched.dispatch_take('w', NULL, 5, 1000)",
                &[],
            )
            .await
        else {
            return;
        };
        if rows.is_empty() {
            return;
        }
        for r in &rows {
            let (run, attempt, token): (Uuid, Uuid, Uuid) = (r.get(0), r.get(1), r.get(2));
            if c.query_one(
                "SELECT qlsched.dispatch_start($1, $2, 1000)",
                &[&attempt, &token],
            )
            .await
            .is_err()
            {
                return;
            }
            match c
                .query_one(
                    "SELECT qlsched.dispatch_finish($1, $2, 'succeeded', 0, NULL, NULL, NULL)",
                    &[&attempt, &token],
                )
                .await
            {
                Ok(row) if row.get::<_, bool>(0) => acked.lock().unwrap().push(run),
                Ok(_) => {}
                Err(_) => return,
            }
        }
    }
}

#[tokio::test]
async fn a_postgresql_restart_mid_protocol_leaves_every_run_with_one_recorded_outcome() {
    let mut own = crate::drills::OwnPg::start("dispatch-restart", "").await;
    let db = TestDb {
        name: own.db.name.clone(),
        port: own.db.port,
    };
    let runs = queued_runs(&db, 1000).await;
    let acked = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let (db2, acked2) = (db.clone(), acked.clone());
    let worker = tokio::spawn(async move { dispatch_until_error(&db2, &acked2).await });
    crate::helpers::wait_until(
        "the dispatcher is mid-way",
        std::time::Duration::from_secs(30),
        || async { acked.lock().unwrap().len() >= 50 },
    )
    .await;
    own.server.stop("immediate");
    worker.await.unwrap();
    let at_crash = acked.lock().unwrap().len();
    assert!(at_crash < runs.len(), "the crash came after the last run");
    own.server.start();
    // After the restart: leases of the attempts the crash interrupted end (1 s), any
    // dispatcher expires them (max_attempts 1: their runs fail), and the rest is dispatched.
    let d = db.client("qlsched_dispatcher").await;
    crate::helpers::wait_until(
        "no attempt left under a lease",
        std::time::Duration::from_secs(30),
        || async {
            d.query_one("SELECT lost FROM qlsched.dispatch_expire(1000)", &[])
                .await
                .unwrap();
            db.count(
                "SELECT count(*) FROM qlsched.attempts WHERE state IN ('dispatching', 'running')",
            )
            .await
                == 0
        },
    )
    .await;
    let after = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    dispatch_until_error(&db, &after).await;
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() >= 50);
    let su = db.superuser().await;
    let lost_acks: i64 = su
        .query_one(
            "SELECT count(*) FROM qlsched.runs WHERE run_id = ANY ($1) AND status <> 'succeeded'",
            &[&acked],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        lost_acks, 0,
        "an acknowledged outcome was lost in the restart"
    );
    let bad: i64 = su
        .query_one(
            "SELECT count(*) FROM qlsched.runs r
              WHERE r.run_id = ANY ($1)
                AND (r.status NOT IN ('succeeded', 'failed')
                     OR (SELECT count(*) FROM qlsched.run_events e
                          WHERE e.run_id = r.run_id AND e.kind = 'run.finished') <> 1)",
            &[&runs],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(bad, 0, "runs without exactly one recorded outcome");
    db.assert_invariants().await;
}

#[tokio::test]
async fn db_status_names_the_deprecated_direct_dispatcher_grants() {
    use crate::helpers::cli::{ok, ql};
    let db = TestDb::new().await;
    let out = ok(ql(&db, &["db", "status", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let deprecations = v["deprecations"].as_array().cloned().unwrap_or_default();
    assert_eq!(deprecations.len(), 1, "{out}");
    assert!(
        deprecations[0]
            .as_str()
            .unwrap()
            .contains("qlsched.dispatch_*"),
        "{out}"
    );
    let text = ok(ql(&db, &["db", "status"]));
    assert!(text.contains("deprecated (V16):"), "{text}");
}

/// A Python 3 that has psycopg 3, or a panic saying what to install (the Python dispatcher's
/// test must fail, never skip).
fn python_with_psycopg() -> &'static str {
    for py in ["/usr/bin/python3", "python3"] {
        let ok = std::process::Command::new(py)
            .args(["-c", "import psycopg"])
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if ok {
            return py;
        }
    }
    panic!("no python3 with psycopg 3: install it (`apt-get install -y python3-psycopg`)");
}

#[tokio::test]
async fn the_python_dispatcher_finishes_runs_a_replica_admits_and_stops_on_sigterm() {
    let db = TestDb::new().await;
    let mut stage = crate::helpers::dispatchers::Stage::new(&db).await;
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/dispatcher.py");
    let mut child = tokio::process::Command::new(python_with_psycopg())
        .arg(&script)
        .args(["--dsn", &db.dsn("qlsched_dispatcher"), "--idle-ms", "50"])
        .args(["--command", &stage.command])
        .stdout(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    stage.finish(&db, &mut child).await;
    assert_eq!(
        db.count(
            "SELECT count(*) FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id)
              WHERE r.status <> a.state OR a.lease_id IS NULL OR a.exit_status IS NULL
                 OR (r.trigger_id = 'trg-00000') <> (r.status = 'succeeded')
                 OR (r.status = 'failed') <> (a.exit_status = 3)"
        )
        .await,
        0,
        "every run finished through the functions with its command's exit status"
    );
    let su = db.superuser().await;
    crate::helpers::assert_each_run_wrote_its_key(&su, stage.out.path()).await;
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_requested_cancel_reaches_the_holders_heartbeat_and_stops_retries() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    let runs = queued_runs(&db, 2).await;
    pin_spec(&su, "{\"max_attempts\":3}").await;
    let d = db.client("qlsched_dispatcher").await;
    let taken = take_leases(&d, "w", 2, 30_000).await;
    assert!(start(&d, &taken[0], 30_000).await);
    assert!(!heartbeat_and_cancel(&d, &taken[0], 30_000).await.1);
    // The dispatcher role may not ask; the admin may, for taken runs only.
    let e = d
        .query_one("SELECT qlsched.request_cancel($1)", &[&runs])
        .await
        .unwrap_err();
    assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
    assert_eq!(
        request_cancel(&db, &[taken[0].run_id, taken[1].run_id]).await,
        2
    );
    let (held, cancel) = heartbeat_and_cancel(&d, &taken[0], 30_000).await;
    assert!(held.is_some() && cancel, "the holder hears the cancel");
    // The holder stops the work and records it; the other's lease ends: not retried.
    assert!(finish(&d, &taken[0], "failed").await);
    end_leases(&db).await;
    assert_eq!(
        expire(&d).await,
        (1, 0),
        "a cancel-requested run is not retried"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'failed'")
            .await,
        2
    );
    db.assert_invariants().await;
}

/// The take behind 50,000 finished runs and 50,000 queued ones reads about the runs it takes:
/// `runs_queued_order_idx` holds queued runs only, in `queued_at_ms` order (the function's
/// inner statements count in the buffers of its call: about 1,100, most of them the writes
/// of 16 runs; without the index the take sorts every queued run, about 2,400 here and
/// growing with the backlog).
#[tokio::test]
async fn a_protocol_take_behind_a_large_history_reads_only_the_runs_it_takes() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    crate::helpers::insert_runs(
        &su,
        "SELECT gen_random_uuid() AS run_id, 'trg-00000' AS trigger_id,
                (SELECT execution_revision_id FROM qlsched.tasks WHERE task_id = 'task')
                    AS execution_revision_id,
                CASE WHEN g <= 50000 THEN 'succeeded' ELSE 'queued' END AS status,
                g::bigint AS scheduled_for_ms, g::bigint AS queued_at_ms, 'test' AS admitted_by
           FROM generate_series(1, 100000) g",
    )
    .await;
    for q in [
        "VACUUM ANALYZE qlsched.runs",
        "VACUUM ANALYZE qlsched.attempts",
    ] {
        su.batch_execute(q).await.unwrap();
    }
    // A long-running dispatcher's session: its statements are planned already.
    su.batch_execute("BEGIN; SELECT * FROM qlsched.dispatch_take('w', NULL, 16, 30000)")
        .await
        .unwrap();
    let plan = crate::helpers::plan(
        &su,
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF)
             SELECT * FROM qlsched.dispatch_take('w', NULL, 16, 30000)",
        &[],
    )
    .await;
    su.batch_execute("ROLLBACK").await.unwrap();
    // PostgreSQL 18 prints actual rows with two decimals.
    assert!(
        plan.contains(" rows=16 loops=1)") || plan.contains(" rows=16.00 loops=1)"),
        "{plan}"
    );
    let buffers = crate::helpers::plan_buffers(&plan, "");
    assert!(
        buffers < 1_500,
        "taking 16 runs behind 50,000 finished ones touched {buffers} buffers:\n{plan}"
    );
}

#[tokio::test]
async fn the_reference_dispatcher_stops_a_run_an_operator_cancels() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 1).await;
    let mut child = crate::dispatcher::spawn_example(
        &db,
        &[
            "--idle-ms",
            "50",
            "--lease-ms",
            "1500",
            "--command",
            "sleep 60",
        ],
    );
    crate::helpers::wait_until(
        "the run is running",
        std::time::Duration::from_secs(20),
        || async {
            db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'running'")
                .await
                == 1
        },
    )
    .await;
    assert_eq!(request_cancel(&db, &runs).await, 1);
    // The next heartbeat (every 0.5 s) hears it: the command is killed, the run failed.
    crate::helpers::wait_until(
        "the run is stopped",
        std::time::Duration::from_secs(10),
        || async {
            db.count(
                "SELECT count(*) FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id)
              WHERE r.status = 'failed' AND a.error = 'cancelled at an operator''s request'",
            )
            .await
                == 1
        },
    )
    .await;
    unsafe { libc::kill(child.id().unwrap() as i32, libc::SIGTERM) };
    let st = tokio::time::timeout(std::time::Duration::from_secs(10), child.wait())
        .await
        .expect("the dispatcher stops on SIGTERM")
        .unwrap();
    assert!(st.success(), "{st}");
    db.assert_invariants().await;
}
