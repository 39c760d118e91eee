//! The dispatcher contract (docs/dispatcher.md): the role's grants, exactly-once taking under
//! concurrency, the reference dispatcher finishing a replica's runs, and start-up recovery
//! leaving the dispatcher's work alone.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use qlsched::schema;
use qlsched::store::dispatch::TAKE_SQL;
use qlsched::store::recovery::recover_on_startup;
use qlsched::store::triggers::backfill_chunk;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use crate::helpers::dispatchers::Stage;
use crate::helpers::drive::{finish_direct, start_direct, take};
use crate::helpers::TestDb;

/// `n` queued runs of trg-00000 (every second), admitted by the admin role as a backfill
/// of instants one minute apart, starting a day ago.
pub async fn queued_runs(db: &TestDb, n: usize) -> Vec<Uuid> {
    db.seed(1, "* * * * * *").await;
    let mut admin = db.admin().await;
    let start = (db.now_ms().await / 60_000 - 24 * 60) * 60_000;
    let instants: Vec<i64> = (0..n as i64).map(|i| start + i * 60_000).collect();
    let c = backfill_chunk(&mut admin, "trg-00000", 1, &instants, "backfill:test")
        .await
        .unwrap();
    assert_eq!(c.admitted, n as u64);
    let su = db.superuser().await;
    su.query("SELECT run_id FROM qlsched.runs ORDER BY run_id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

#[tokio::test]
async fn the_dispatcher_role_cannot_insert_runs_touch_schedules_or_delete() {
    let db = TestDb::new().await;
    queued_runs(&db, 1).await;
    let su = db.superuser().await;
    assert_eq!(
        schema::check(&su, &[("qlsched_dispatcher", "dispatcher")])
            .await
            .unwrap(),
        Vec::<String>::new()
    );
    let d = db.client("qlsched_dispatcher").await;
    for sql in [
        "INSERT INTO qlsched.runs SELECT * FROM qlsched.runs",
        "INSERT INTO qlsched.attempts SELECT * FROM qlsched.attempts",
        "UPDATE qlsched.trigger_schedules SET claimable_at_ms = 0",
        "SELECT * FROM qlsched.trigger_schedules",
        "DELETE FROM qlsched.runs",
        "DELETE FROM qlsched.attempts",
        "DELETE FROM qlsched.run_events",
        "UPDATE qlsched.runs SET cancelled = true",
        "UPDATE qlsched.runs SET scheduled_for_ms = 0",
        "UPDATE qlsched.attempts SET worker_id = 'w'",
    ] {
        let e = d.batch_execute(sql).await.unwrap_err();
        assert_eq!(e.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE), "{sql}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'queued'")
            .await,
        1
    );
}

#[tokio::test]
async fn a_run_held_by_one_dispatcher_is_skipped_by_another_and_taken_once() {
    let db = TestDb::new().await;
    let all = queued_runs(&db, 40).await;
    let a = db.client("qlsched_dispatcher").await;
    let b = db.client("qlsched_dispatcher").await;
    // A holds its take uncommitted: B skips every run A locked.
    a.batch_execute("BEGIN").await.unwrap();
    let by_a = take(&a, 10).await;
    assert_eq!(by_a.len(), 10);
    let by_b = take(&b, 100).await;
    assert_eq!(by_b.len(), 30, "B takes the 30 runs A does not hold");
    assert!(by_b.iter().all(|r| !by_a.contains(r)));
    a.batch_execute("COMMIT").await.unwrap();
    assert!(take(&b, 100).await.is_empty(), "nothing is taken twice");
    // Racing: both loop over 40 more runs in small batches; every run is taken exactly once.
    let db2 = TestDb::new().await;
    let all2 = queued_runs(&db2, 40).await;
    let race = |db: TestDb| async move {
        let c = db.client("qlsched_dispatcher").await;
        let mut got = Vec::new();
        loop {
            let t = take(&c, 3).await;
            if t.is_empty() {
                return got;
            }
            got.extend(t);
        }
    };
    let (x, y) = tokio::join!(
        tokio::spawn(race(db2.clone())),
        tokio::spawn(race(db2.clone()))
    );
    let mut taken: Vec<Uuid> = x.unwrap().into_iter().chain(y.unwrap()).collect();
    taken.sort();
    assert_eq!(taken, all2, "each run taken exactly once");
    assert_eq!(all.len(), 40);
    for d in [&db, &db2] {
        assert_eq!(
            d.count("SELECT count(*) FROM qlsched.run_events WHERE kind = 'run.dispatching'")
                .await,
            40
        );
        d.assert_invariants().await;
    }
}

#[tokio::test]
async fn statuses_only_move_forward_whoever_writes() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 2).await;
    let d = db.client("qlsched_dispatcher").await;
    assert_eq!(take(&d, 1).await, vec![runs[0]]);
    assert_eq!(start_direct(&d, &[runs[0]]).await, 1);
    assert_eq!(finish_direct(&d, runs[0], "succeeded").await, 1);
    for (who, sql) in [
        (
            "qlsched_dispatcher",
            "UPDATE qlsched.runs SET status = 'queued' WHERE status = 'succeeded'",
        ),
        (
            "qlsched_dispatcher",
            "UPDATE qlsched.runs SET status = 'running' WHERE status = 'queued'",
        ),
        (
            "qlsched_dispatcher",
            "UPDATE qlsched.attempts SET state = 'claimed' WHERE state = 'succeeded'",
        ),
        (
            "qlsched_admin",
            "UPDATE qlsched.runs SET status = 'cancelled', cancelled = true WHERE status = 'succeeded'",
        ),
        (
            "qlsched_owner",
            "UPDATE qlsched.runs SET status = 'queued' WHERE status = 'succeeded'",
        ),
    ] {
        let e = db
            .client(who)
            .await
            .batch_execute(sql)
            .await
            .unwrap_err();
        assert_eq!(e.code(), Some(&SqlState::CHECK_VIOLATION), "{who}: {sql}");
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'succeeded'")
            .await,
        1
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn recovery_leaves_pristine_queued_runs_alone_and_lists_the_dispatchers_unfinished_ones() {
    let db = TestDb::new().await;
    let runs = queued_runs(&db, 5).await;
    let d = db.client("qlsched_dispatcher").await;
    let taken = take(&d, 2).await;
    assert_eq!(taken, runs[..2]);
    let before = db
        .count("SELECT sum(hashtext(r::text)) FROM qlsched.runs r")
        .await;
    let runtime = db.client("qlsched_runtime").await;
    let report = recover_on_startup(&runtime, 100).await.unwrap();
    assert_eq!(report.pristine, 3, "the queued runs are the dispatcher's");
    assert_eq!(report.candidate_count, 2);
    assert!(report
        .candidates
        .iter()
        .all(|c| c.reason == "run is dispatching" && taken.contains(&c.run_id)));
    assert_eq!(
        db.count("SELECT sum(hashtext(r::text)) FROM qlsched.runs r")
            .await,
        before,
        "recovery wrote nothing"
    );
    // The queued ones are still there to take, untouched.
    assert_eq!(take(&d, 10).await, runs[2..]);
    db.assert_invariants().await;
}

/// The reference dispatcher, built once per test binary (`cargo build --example`).
pub fn example_binary() -> &'static PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        cmd.args(["build", "--example", "dispatcher", "--manifest-path"])
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/Cargo.toml"));
        if cfg!(feature = "fault-injection") {
            cmd.args(["--features", "fault-injection"]);
        }
        let st = cmd.status().expect("cargo build --example dispatcher");
        assert!(st.success(), "building the example failed");
        let exe = std::env::current_exe().unwrap();
        // target/debug/deps/it-… → target/debug/examples/dispatcher
        exe.parent()
            .unwrap()
            .parent()
            .unwrap()
            .join("examples/dispatcher")
    })
}

/// The reference dispatcher on `db` as the dispatcher role with `args`, its stderr silenced;
/// killed when dropped.
pub fn spawn_example(db: &TestDb, args: &[&str]) -> tokio::process::Child {
    tokio::process::Command::new(example_binary())
        .args(["--dsn", &db.dsn("qlsched_dispatcher")])
        .args(args)
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap()
}

#[tokio::test]
async fn the_reference_dispatcher_finishes_runs_a_replica_admits_and_stops_on_sigterm() {
    let db = TestDb::new().await;
    let mut stage = Stage::new(&db).await;
    let mut child = spawn_example(
        &db,
        &[
            "--batch",
            "5",
            "--idle-ms",
            "50",
            "--command",
            &stage.command,
        ],
    );
    stage.finish(&db, &mut child).await;
    let su = db.superuser().await;
    let wrong = su
        .query_one(
            "SELECT count(*) FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id)
              WHERE r.status <> a.state OR a.started_at_ms IS NULL OR a.finished_at_ms IS NULL
                 OR (r.status = 'failed') <> (a.error IS NOT NULL)
                 OR (r.trigger_id = 'trg-00000') <> (r.status = 'succeeded')",
            &[],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(
        wrong, 0,
        "attempt state, times and error follow each run's outcome"
    );
    // Every run went through the protocol functions (V16): taken under a lease, with the
    // command's exit status recorded.
    assert_eq!(
        db.count(
            "SELECT count(*) FROM qlsched.attempts
              WHERE lease_id IS NULL OR worker_id IS NULL OR exit_status IS NULL"
        )
        .await,
        0
    );
    // Each run's command ran once, with its own key.
    crate::helpers::assert_each_run_wrote_its_key(&su, stage.out.path()).await;
    db.assert_invariants().await;
}

#[tokio::test]
async fn an_install_from_before_the_dispatcher_gets_its_role_from_a_second_bootstrap() {
    use qlsched::schema::Roles;
    let port = crate::helpers::cluster().port;
    let su = crate::helpers::pg_config(port, "postgres", "postgres");
    let roles = Roles::with_prefix("up21").unwrap();
    schema::bootstrap(&su, &roles, "up21db").await.unwrap();
    // As an install bootstrapped before V10: no dispatcher role.
    let c = qlsched::db::connect(&su).await.unwrap();
    c.batch_execute(
        "REVOKE CONNECT ON DATABASE up21db FROM up21_dispatcher; DROP ROLE up21_dispatcher",
    )
    .await
    .unwrap();
    let owner = crate::helpers::pg_config(port, "up21_owner", "up21db");
    let e = schema::migrate(&owner, &roles).await.unwrap_err();
    assert!(
        e.to_string()
            .contains("role up21_dispatcher does not exist; run `qlsched db bootstrap`"),
        "{e}"
    );
    // Refused before anything was applied.
    let c = qlsched::db::connect(&owner).await.unwrap();
    assert_eq!(
        schema::stream_drift(&c).await.unwrap().len(),
        schema::embedded_count()
    );
    schema::bootstrap(&su, &roles, "up21db").await.unwrap();
    schema::migrate(&owner, &roles).await.unwrap();
    let check = qlsched::db::connect(&owner).await.unwrap();
    assert_eq!(
        schema::check(&check, &roles.checked()).await.unwrap(),
        Vec::<String>::new()
    );
}

/// The take reads queued runs through `runs_unfinished_idx` in run-id order and stops at
/// its limit: with 50,000 pristine queued runs (a dispatcher that fell behind), taking 16
/// touches a few hundred buffers, not every queued run's attempt (a scan and sort of the
/// whole backlog made each take slower the further behind the dispatcher was).
#[tokio::test]
async fn a_take_behind_a_large_backlog_reads_only_the_runs_it_takes() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    crate::helpers::insert_runs(
        &su,
        "SELECT gen_random_uuid() AS run_id, 't' AS trigger_id,
                gen_random_uuid() AS execution_revision_id, 'queued' AS status,
                g::bigint AS scheduled_for_ms, g::bigint AS queued_at_ms, 'test' AS admitted_by
           FROM generate_series(1, 50000) g",
    )
    .await;
    su.batch_execute("ANALYZE qlsched.runs; ANALYZE qlsched.attempts")
        .await
        .unwrap();
    let d = db.client("qlsched_dispatcher").await;
    // Warm the plan cache as a long-running dispatcher does (a generic plan after five).
    for _ in 0..6 {
        d.batch_execute("BEGIN").await.unwrap();
        assert_eq!(take(&d, 16).await.len(), 16);
        d.batch_execute("ROLLBACK").await.unwrap();
    }
    su.batch_execute(&format!(
        "PREPARE take(bigint) AS {TAKE_SQL}; SET plan_cache_mode = force_generic_plan; BEGIN"
    ))
    .await
    .unwrap();
    let plan = crate::helpers::plan(
        &su,
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) EXECUTE take(16)",
        &[],
    )
    .await;
    su.batch_execute("ROLLBACK").await.unwrap();
    for table in ["runs", "attempts"] {
        assert!(!plan.contains(&format!("Seq Scan on {table}")), "{plan}");
    }
    // The plan's top node: the statement's total.
    let buffers = crate::helpers::plan_buffers(&plan, "");
    assert!(
        buffers < 2_000,
        "taking 16 of 50,000 queued runs touched {buffers} buffers:\n{plan}"
    );
}
