//! What any role that can connect can do to qlsched without a single grant: take an advisory
//! lock (the `db migrate` lock, the prune lock) and notify the wake channel. Every wait for
//! such a lock is bounded and a refusal names the session holding it (pid, role,
//! application); a wake-up from a role that cannot change schedules, or whose payload is not
//! an instant, is ignored.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

use qlsched::store::migrate::{self};
use qlsched::store::runs::PRUNE_QUEUED_LOCK;
use qlsched::store::triggers::backfill_chunk;

use crate::helpers::cli::{command, stderr, stdout};
use crate::helpers::iso;
use crate::helpers::{start_supervisor, wait_until, TestDb};

/// `db migrate`'s session lock ("qlsmigr" in ASCII, src/store/migrate/apply.rs).
const MIGRATE_LOCK: i64 = 0x0071_6c73_6d69_6772;

/// 2026-01-01T00:00:00Z in Unix ms.
const FROM_MS: i64 = 1_767_225_600_000;

/// A session of `role` named `application` that has run `sql` (taking a lock and keeping
/// it while the client lives), with its backend pid.
async fn session_of(
    db: &TestDb,
    role: &str,
    application: &str,
    sql: &str,
) -> (tokio_postgres::Client, i32) {
    let mut cfg = db.config(role);
    cfg.application_name(application);
    let c = qlsched::store::connect(&cfg).await.unwrap();
    c.batch_execute(sql).await.unwrap();
    let pid: i32 = c
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    (c, pid)
}

/// Runs `cmd` for at most `within`; a command still running then is killed and reported.
async fn run_within(mut cmd: Command, within: Duration, what: &str) -> Output {
    let mut child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what} still waited after {within:?} (killed); stderr: {}",
                stderr(&out)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    child.wait_with_output().unwrap()
}

/// Asserts that `text` names the session: its pid, role and application.
fn names_the_holder(text: &str, pid: i32, role: &str, application: &str) {
    eprintln!("refused: {text}");
    for needle in [
        format!("pid {pid}"),
        role.to_string(),
        application.to_string(),
    ] {
        assert!(
            text.contains(&needle),
            "the refusal does not name the holder's `{needle}`: {text}"
        );
    }
}

/// A zero-privilege role holds the prune lock: a backfill chunk (which takes it shared)
/// gives up within its bound, names the holder, and writes nothing.
#[tokio::test]
async fn a_backfill_behind_a_foreign_holder_of_the_prune_lock_gives_up_naming_it() {
    let db = TestDb::new().await;
    db.seed(1, "0 * * * * *").await;
    let (_squatter, pid) = session_of(
        &db,
        "qlsched_worker_ingress",
        "squatter-backfill",
        &format!("SELECT pg_advisory_lock({PRUNE_QUEUED_LOCK})"),
    )
    .await;
    let (from, to) = (iso(FROM_MS), iso(FROM_MS + 180_000));
    let started = Instant::now();
    let out = run_within(
        command(
            &db,
            &[
                "trigger",
                "backfill",
                "trg-00000",
                "--from",
                &from,
                "--to",
                &to,
            ],
        ),
        Duration::from_secs(40),
        "`trigger backfill` behind a foreign holder of the prune lock",
    )
    .await;
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {err}\nstdout: {}",
        stdout(&out)
    );
    names_the_holder(&err, pid, "qlsched_worker_ingress", "squatter-backfill");
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 0);
}

/// A zero-privilege role holds the prune lock shared (as a backfill chunk would): `runs
/// prune` gives up within the session's own `lock_timeout` (here 1 s, from the DSN), names
/// the holder, and removes nothing.
#[tokio::test]
async fn runs_prune_behind_a_foreign_holder_of_the_prune_lock_gives_up_naming_it() {
    let db = TestDb::new().await;
    db.seed(1, "0 * * * * *").await;
    let at: Vec<i64> = (0..3).map(|m| FROM_MS + m * 60_000).collect();
    backfill_chunk(&mut db.admin().await, "trg-00000", 1, &at, "backfill:test")
        .await
        .unwrap();
    let (_squatter, pid) = session_of(
        &db,
        "qlsched_worker_ingress",
        "squatter-prune",
        &format!("SELECT pg_advisory_lock_shared({PRUNE_QUEUED_LOCK})"),
    )
    .await;
    // A bound after the admissions (their queued_at) and not in the future.
    let latest = db.count("SELECT max(queued_at_ms) FROM qlsched.runs").await;
    wait_until(
        "the database clock past the admissions",
        Duration::from_secs(5),
        || async { db.now_ms().await > latest },
    )
    .await;
    let before = iso(db.now_ms().await);
    let mut cmd = command(&db, &["runs", "prune", "--queued-before", &before]);
    cmd.env(
        "QLSCHED_DSN",
        format!("{} options='-c lock_timeout=1000'", db.dsn("qlsched_admin")),
    );
    let started = Instant::now();
    let out = run_within(
        cmd,
        Duration::from_secs(40),
        "`runs prune` behind a foreign holder of the prune lock",
    )
    .await;
    let err = stderr(&out);
    assert_eq!(
        out.status.code(),
        Some(1),
        "stderr: {err}\nstdout: {}",
        stdout(&out)
    );
    names_the_holder(&err, pid, "qlsched_worker_ingress", "squatter-prune");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 3);
}

/// A zero-privilege role holds the `db migrate` lock: the migrate refuses at once and names
/// the holder, so the operator can end that session.
#[tokio::test]
async fn db_migrate_behind_a_foreign_holder_of_its_lock_names_it() {
    let db = TestDb::new().await;
    let (_squatter, pid) = session_of(
        &db,
        "qlsched_worker_ingress",
        "squatter-migrate",
        &format!("SELECT pg_advisory_lock({MIGRATE_LOCK})"),
    )
    .await;
    let roles = crate::helpers::roles();
    let err = tokio::time::timeout(
        Duration::from_secs(30),
        migrate::migrate(&db.config("qlsched_owner"), &roles),
    )
    .await
    .expect("db migrate waited for a foreign holder of its lock")
    .expect_err("db migrate ran while another session held its lock")
    .to_string();
    names_the_holder(&err, pid, "qlsched_worker_ingress", "squatter-migrate");
}

/// Wake-ups a replica must ignore: from roles that cannot change schedules (the
/// zero-privilege worker_ingress, the dispatcher), and a payload that is not an instant (from
/// the admin role). A due row left without a notification is admitted only at the instant of
/// the admin's genuine wake-up that follows them, not at once.
#[actix_rt::test]
async fn wake_ups_from_roles_that_cannot_change_schedules_or_not_naming_an_instant_are_ignored() {
    let _one = crate::drills::exclusive().await;
    let db = TestDb::new().await;
    db.seed(1, "0 0 0 1 1 *").await;
    let settings = qlsched::actors::Settings {
        lease: Duration::from_secs(60),
        cadence: Duration::from_secs(20),
        listen: true,
        ..db.actor_settings("a")
    };
    let (_sup, metrics, _health) = start_supervisor(settings);
    wait_until(
        "the first (empty) round and the listener",
        Duration::from_secs(10),
        || async { metrics.ticks.get() >= 1 && db.listeners().await >= 1 },
    )
    .await;
    // Due now, and no notification says so: the next tick is 20 s away.
    db.make_due(-100).await;
    let (ingress, _) = session_of(&db, "qlsched_worker_ingress", "forger", "SELECT 1").await;
    let (dispatcher, _) = session_of(&db, "qlsched_dispatcher", "forger", "SELECT 1").await;
    let admin = db.admin().await;
    ingress
        .batch_execute("SELECT pg_notify('qlsched_wake', '')")
        .await
        .unwrap();
    dispatcher
        .batch_execute("NOTIFY qlsched_wake")
        .await
        .unwrap();
    admin
        .batch_execute("SELECT pg_notify('qlsched_wake', 'soon')")
        .await
        .unwrap();
    // The genuine wake-up: 2 s ahead on the database clock.
    let at: i64 = admin
        .query_one(
            concat!(
                "SELECT ",
                qlsched::db_now_ms!(),
                " + 2000 AS at, pg_notify('qlsched_wake', (",
                qlsched::db_now_ms!(),
                " + 2000)::text)"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    wait_until("the due row admitted", Duration::from_secs(15), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 1
    })
    .await;
    let queued = db.count("SELECT min(queued_at_ms) FROM qlsched.runs").await;
    // A wake-up may come early by the last round's latency (docs/design.md, "Waking"),
    // never by a second.
    assert!(
        queued >= at - 1000,
        "the due row was admitted {} ms before the genuine wake-up's instant: a forged \
         notification started a round",
        at - queued
    );
    db.assert_invariants().await;
}
