//! Drill 12, rolling upgrade: two real binaries with different migration sets side by side.
//! The "old" binary is this tree's `qlsched`; the "new" one is built by the drill from a copy
//! of the source tree with one more migration, an expand (`V9000__drill_expand.sql`: a
//! nullable column on `runs`). Three replicas on the old binary admit 200 every-second
//! triggers; a long reader holds ACCESS SHARE on `runs` while the new binary's `db migrate`
//! runs (it must wait and retry, not queue an exclusive lock in front of every admission);
//! then the replicas restart one at a time onto the new binary, each waiting for the
//! previous one's `/readyz`; finally one replica goes back to the old binary on the expanded
//! schema (rollback) and must become ready and admit. Pass: 0 duplicates, 0 lost, at least
//! one replica ready at every poll (every 100 ms), no gap between consecutive admissions as
//! long as a lease.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio_postgres::Client;

use super::check::Expect;
use super::{db_now, scalar, Drill, Stage};
use crate::helpers::replica::{binary, http_get};
use crate::helpers::{wait_until, PREFIX};

const TRIGGERS: usize = 200;
const IDS: [&str; 3] = ["a", "b", "c"];
const LEASE_MS: i64 = 5_000;

/// The new binary's one migration beyond this tree's.
const FIXTURE_NAME: &str = "V9000__drill_expand.sql";
const FIXTURE_SQL: &str = "-- qlsched: expand
-- Fixture of the rolling-upgrade drill (tests/it/drills/rolling_upgrade.rs): the migration
-- the drill's \"new\" binary has and this tree's binary does not.
ALTER TABLE qlsched.runs ADD COLUMN drill_note text;
";

/// Its index, built `CONCURRENTLY` by `db migrate` once the migration is applied.
const FIXTURE_INDEX: &str = "ConcurrentIndex { version: 9000, name: \"runs_drill_note_idx\", \
     unique: false, on: \"qlsched.runs (drill_note)\" },";

#[tokio::test]
async fn a_rolling_upgrade_onto_a_binary_with_an_expand_migration_never_stops_admitting() {
    // Built before the drill's turn: the build shares the cores with other tests, not with
    // a drill measuring gaps.
    let t = Instant::now();
    let new_bin = build_new_binary();
    let build_s = t.elapsed().as_secs_f64();

    // cycles: rolling passes (onto the new binary, back to the old, …); duration: seconds
    // the reader holds `runs` while the migration waits.
    let mut drill = Drill::begin("rolling_upgrade", (1, 3), (3, 20), |p, _| {
        format!(
            "3 replicas, {TRIGGERS} every-second triggers, lease 5 s; reader on runs for {} s \
             during `db migrate` of the new binary; {} rolling pass(es), then replica a back \
             to the old binary",
            p.duration.as_secs(),
            p.cycles
        )
    })
    .await;
    drill.report.note(format!(
        "new binary (this tree + {FIXTURE_NAME}) built in {build_s:.1} s"
    ));
    let mut stage = Stage::new(TRIGGERS, "").await;
    stage.start(&IDS).await;
    let poller = ReadyPoller::start(&stage);
    let upgrade_from = db_now(&stage.sql).await;

    // The long reader: ACCESS SHARE on runs, held across the migration's first attempts.
    let reader = stage.db.superuser().await;
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM qlsched.runs")
        .await
        .unwrap();
    let mut migrate = Command::new(&new_bin)
        .args([
            "db",
            "migrate",
            "--lock-timeout",
            "500ms",
            "--max-wait",
            "120s",
            "--dsn",
        ])
        .arg(stage.db.dsn(&format!("{PREFIX}_owner")))
        .env("QLSCHED__LOG__LEVEL", "info")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn the new binary's db migrate");
    let migrate_from = db_now(&stage.sql).await;
    // While the reader holds, the migration waits for its lock and admissions go on (counted
    // afterwards: a read of `runs` now would queue behind a migration that blocks).
    tokio::time::sleep(drill.p.duration).await;
    let reader_released = db_now(&stage.sql).await;
    assert!(
        migrate.try_wait().unwrap().is_none(),
        "db migrate finished while a reader held runs: it cannot have altered runs"
    );
    reader.batch_execute("COMMIT").await.unwrap();
    let out = wait_output(&mut migrate, Duration::from_secs(60)).await;
    let migrate_to = db_now(&stage.sql).await;
    let migrate_log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "db migrate of the new binary failed ({}):\n{migrate_log}",
        out.status
    );
    assert_eq!(
        scalar(
            &stage.sql,
            "SELECT count(*) FROM information_schema.columns
              WHERE table_schema = 'qlsched' AND table_name = 'runs' AND column_name = 'drill_note'"
        )
        .await,
        1,
        "the fixture migration did not apply:\n{migrate_log}"
    );
    let waits = migrate_log
        .matches(&format!("qlsched: waiting: migration {FIXTURE_NAME}"))
        .count();
    assert!(
        waits > 0,
        "db migrate never reported a wait although a reader held runs:\n{migrate_log}"
    );
    assert_eq!(
        scalar(
            &stage.sql,
            "SELECT count(*) FROM pg_index WHERE indisvalid
                AND indexrelid = to_regclass('qlsched.runs_drill_note_idx')"
        )
        .await,
        1,
        "the fixture's concurrent index is missing or invalid:\n{migrate_log}"
    );
    let admitted_while_held = count_between(&stage.sql, migrate_from, reader_released).await;
    let migrate_gap = longest_gap(&stage.sql, migrate_from, migrate_to).await;
    drill.report.note(format!(
        "db migrate behind the reader: {:.1} s, {waits} wait(s) reported, admissions while the reader held \
         {admitted_while_held}, longest admission gap during the migration {migrate_gap} ms; its output: {}",
        (migrate_to - migrate_from) as f64 / 1000.0,
        migrate_log.trim().replace('\n', " | ")
    ));

    // Rolling passes: one replica at a time, the next only once this one is ready.
    let mut on_new = false;
    for pass in 0..drill.p.cycles {
        on_new = pass % 2 == 0;
        for id in IDS {
            restart_onto(&mut stage, &poller, id, on_new.then_some(new_bin.as_path())).await;
        }
    }
    // Rollback: replica a back to the old binary on the expanded schema.
    if on_new {
        restart_onto(&mut stage, &poller, "a", None).await;
    }
    let back_at = db_now(&stage.sql).await;
    wait_until(
        "replica a, back on the old binary, admits",
        Duration::from_secs(20),
        || {
            let sql = &stage.sql;
            async move {
                sql.query_one(
                    "SELECT count(*) FROM qlsched.runs WHERE admitted_by = 'a' AND queued_at_ms > $1",
                    &[&back_at],
                )
                .await
                .unwrap()
                .get::<_, i64>(0)
                    > 0
            }
        },
    )
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let upgrade_to = db_now(&stage.sql).await;
    let ready = poller.stop();
    let gap = longest_gap(&stage.sql, upgrade_from, upgrade_to).await;
    let p99: f64 = stage
        .sql
        .query_one(
            "SELECT coalesce(percentile_cont(0.99) WITHIN GROUP (ORDER BY queued_at_ms - scheduled_for_ms), 0)
               FROM qlsched.runs WHERE queued_at_ms BETWEEN $1 AND $2",
            &[&upgrade_from, &upgrade_to],
        )
        .await
        .unwrap()
        .get(0);
    stage.fleet.stop_all().await;

    drill.report.note(format!(
        "during the upgrade ({:.1} s): longest admission gap {gap} ms (lease {LEASE_MS} ms) · lag p99 {p99:.0} ms \
         · /readyz polls {} , with no replica ready {} (longest {} ms) · restarts {} · replica a back on the old \
         binary admitted",
        (upgrade_to - upgrade_from) as f64 / 1000.0,
        ready.polls,
        ready.none_ready,
        ready.longest_none_ms,
        drill.p.cycles as usize * IDS.len() + usize::from(on_new),
    ));
    let figures = drill
        .report
        .finish(&stage.sql, &Expect::every_second(), &stage.fleet)
        .await;
    assert!(figures.admitted > 0);
    assert_eq!(
        ready.none_ready, 0,
        "an instant with no replica ready (of {} polls; longest {} ms)",
        ready.polls, ready.longest_none_ms
    );
    assert!(
        admitted_while_held > 0 && migrate_gap < LEASE_MS,
        "the migration blocked admissions: {admitted_while_held} admitted while the reader held, \
         longest gap {migrate_gap} ms"
    );
    assert!(
        gap < LEASE_MS,
        "admissions stopped for {gap} ms during the upgrade (lease {LEASE_MS} ms)"
    );
}

/// SIGTERM replica `id` (a clean exit: leases handed over), start it again on `bin` (None:
/// this tree's binary) and wait until it is ready.
async fn restart_onto(stage: &mut Stage, poller: &ReadyPoller, id: &str, bin: Option<&Path>) {
    let mut old = stage.fleet.live.remove(id).expect("live replica");
    let status = old.terminate(Duration::from_secs(30)).await;
    assert!(
        status.success(),
        "replica {id} exited with {status}; log:\n{}",
        super::tail(&old.log(), 30)
    );
    match bin {
        // The harness starts this tree's binary through a command prefix: a shell that
        // drops that path and `exec`s the new binary with the same arguments (same pid).
        Some(bin) => {
            let prefix = [
                "sh".to_string(),
                "-c".to_string(),
                "shift; exec \"$0\" \"$@\"".to_string(),
                bin.display().to_string(),
            ];
            stage.fleet.spawn_via(&prefix, "127.0.0.1", id);
        }
        None => stage.fleet.spawn(id, &[]),
    }
    poller.set(id, stage.fleet.get(id).http);
    stage.fleet.wait_ready(id).await;
}

/// Runs admitted (by `queued_at`, database clock) in `[from, to]`.
async fn count_between(sql: &Client, from: i64, to: i64) -> i64 {
    sql.query_one(
        "SELECT count(*) FROM qlsched.runs WHERE queued_at_ms BETWEEN $1 AND $2",
        &[&from, &to],
    )
    .await
    .unwrap()
    .get(0)
}

/// The longest time in `[from, to]` without an admission (ms, database clock): between
/// consecutive distinct `queued_at`s, counting the window's two ends.
async fn longest_gap(sql: &Client, from: i64, to: i64) -> i64 {
    sql.query_one(
        "SELECT coalesce(max(t - prev), 0)::bigint FROM (
             SELECT t, lag(t) OVER (ORDER BY t) AS prev FROM (
                 SELECT DISTINCT queued_at_ms AS t FROM qlsched.runs WHERE queued_at_ms BETWEEN $1 AND $2
                 UNION SELECT $1 UNION SELECT $2) e) g",
        &[&from, &to],
    )
    .await
    .unwrap()
    .get(0)
}

async fn wait_output(child: &mut std::process::Child, within: Duration) -> std::process::Output {
    let deadline = Instant::now() + within;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = std::mem::replace(child, Command::new("true").spawn().unwrap())
                .wait_with_output()
                .unwrap();
            panic!(
                "db migrate still running after {within:?} without the reader:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let done = std::mem::replace(child, Command::new("true").spawn().unwrap());
    done.wait_with_output().unwrap()
}

/// Polls `/readyz` of every replica every 100 ms on a thread of its own; replicas restarted
/// onto another port are re-pointed with [`ReadyPoller::set`].
struct ReadyPoller {
    addrs: Arc<Mutex<Vec<(String, SocketAddr)>>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<Readiness>>,
}

#[derive(Debug, Default)]
struct Readiness {
    polls: u64,
    none_ready: u64,
    longest_none_ms: u128,
}

impl ReadyPoller {
    fn start(stage: &Stage) -> ReadyPoller {
        let addrs: Vec<(String, SocketAddr)> = stage
            .fleet
            .live
            .iter()
            .map(|(id, r)| (id.clone(), r.http))
            .collect();
        let addrs = Arc::new(Mutex::new(addrs));
        let stop = Arc::new(AtomicBool::new(false));
        let (a, s) = (addrs.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut r = Readiness::default();
            let mut none_since: Option<Instant> = None;
            while !s.load(Ordering::SeqCst) {
                let now: Vec<SocketAddr> = a.lock().unwrap().iter().map(|(_, h)| *h).collect();
                let any = now
                    .iter()
                    .any(|h| matches!(http_get(*h, "/readyz"), Some((200, _))));
                r.polls += 1;
                if any {
                    if let Some(t) = none_since.take() {
                        r.longest_none_ms = r.longest_none_ms.max(t.elapsed().as_millis());
                    }
                } else {
                    r.none_ready += 1;
                    none_since.get_or_insert_with(Instant::now);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            if let Some(t) = none_since {
                r.longest_none_ms = r.longest_none_ms.max(t.elapsed().as_millis());
            }
            r
        });
        ReadyPoller {
            addrs,
            stop,
            thread: Some(thread),
        }
    }

    fn set(&self, id: &str, http: SocketAddr) {
        let mut a = self.addrs.lock().unwrap();
        match a.iter_mut().find(|(i, _)| i == id) {
            Some(e) => e.1 = http,
            None => a.push((id.to_string(), http)),
        }
    }

    fn stop(mut self) -> Readiness {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

/// Builds the "new" binary: a copy of this tree's sources (under the target directory, at a
/// fixed path so that a second run rebuilds nothing) plus [`FIXTURE_NAME`], compiled into
/// the same target directory as the binary under test (its dependencies are already there;
/// cargo does not hold the build lock while tests run) under another package and binary
/// name (`qlsched-drill-next`), so that it never replaces the binary under test. Same
/// profile and features as the test build.
fn build_new_binary() -> PathBuf {
    let exe = binary();
    let profile_dir = exe.parent().expect("target/<profile>");
    let target = profile_dir.parent().expect("target");
    let src = Path::new(env!("CARGO_MANIFEST_DIR"));
    let tree = target.join("drill-upgrade").join("tree");
    for dir in ["src", "migrations", "config"] {
        sync_dir(&src.join(dir), &tree.join(dir));
    }
    for file in ["Cargo.lock", "build.rs"] {
        sync_file(&tree.join(file), &std::fs::read(src.join(file)).unwrap());
    }
    let manifest = std::fs::read_to_string(src.join("Cargo.toml"))
        .unwrap()
        .replacen(
            "name = \"qlsched\"\nversion = \"",
            "name = \"qlsched-drill-next\"\nversion = \"",
            1,
        )
        .replacen(
            "[lib]\npath = \"src/lib.rs\"",
            "[lib]\nname = \"qlsched\"\npath = \"src/lib.rs\"",
            1,
        )
        .replacen(
            "[[bin]]\nname = \"qlsched\"",
            "[[bin]]\nname = \"qlsched-drill-next\"",
            1,
        )
        // The test build unifies the dev-dependencies' features into the shared
        // dependencies (rustls, ring …); as plain dependencies here they do the same, so
        // the copy reuses those builds instead of rebuilding them with other features (and
        // overwriting them: the file names do not depend on the features). A crate that is
        // both keeps one entry, the dev entry whose features include the plain one's.
        .replacen("[dev-dependencies]\n", "", 1)
        .replacen(
            "hyper-util = { version = \"0.1\", features = [\"tokio\"] }\n",
            "",
            1,
        )
        // The copy is the scheduler alone: not the test kit (a workspace member and a
        // dev-dependency of this tree, which depends on the package the copy renames).
        .replacen("members = [\".\", \"testkit\"]", "members = [\".\"]", 1)
        .replacen("qlsched-testkit = { path = \"testkit\" }\n", "", 1);
    assert!(
        manifest.contains("qlsched-drill-next\"\nversion")
            && manifest.contains("name = \"qlsched\"\npath")
            && !manifest.contains("[dev-dependencies]")
            && !manifest.contains("testkit\""),
        "Cargo.toml changed shape: the drill cannot rename the copied package"
    );
    sync_file(&tree.join("Cargo.toml"), manifest.as_bytes());
    sync_file(
        &tree.join("migrations").join(FIXTURE_NAME),
        FIXTURE_SQL.as_bytes(),
    );
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.arg("build")
        .arg("--offline")
        .arg("--bin")
        .arg("qlsched-drill-next")
        .arg("--manifest-path")
        .arg(tree.join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", target)
        .env("QLSCHED_GIT_COMMIT", "drill-next");
    if cfg!(feature = "fault-injection") {
        cmd.args(["--features", "fault-injection"]);
    }
    match profile_dir.file_name().and_then(|n| n.to_str()) {
        Some("debug") => {}
        Some("release") => {
            cmd.arg("--release");
        }
        Some(other) => {
            cmd.args(["--profile", other]);
        }
        None => {}
    }
    let out = cmd.output().expect("run cargo build");
    assert!(
        out.status.success(),
        "building the new binary failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bin = profile_dir.join("qlsched-drill-next");
    assert!(bin.exists(), "no {}", bin.display());
    bin
}

/// Writes `bytes` unless the file already holds them (keeps mtimes, so cargo rebuilds
/// nothing on a second run).
fn sync_file(path: &Path, bytes: &[u8]) {
    if std::fs::read(path).ok().as_deref() == Some(bytes) {
        return;
    }
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, bytes).unwrap();
}

/// The copy's version of a source file: the fixture's index declared the way migrations
/// declare a concurrent index build; every other file as it is.
fn fixture_edit(path: &Path, bytes: Vec<u8>) -> Vec<u8> {
    if !path.ends_with("src/schema/apply.rs") {
        return bytes;
    }
    let code = String::from_utf8(bytes).unwrap();
    let decl = "pub const CONCURRENT_INDEXES: &[ConcurrentIndex] = &[";
    assert!(
        code.contains(decl),
        "src/schema/apply.rs changed shape: no `{decl}`"
    );
    code.replacen(decl, &format!("{decl}{FIXTURE_INDEX}"), 1)
        .into_bytes()
}

/// Mirrors directory `from` into `to` through [`fixture_edit`] (files written only when they
/// differ; files `to` has and `from` does not are removed, except the fixture migration).
fn sync_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(to).unwrap() {
        let e = e.unwrap();
        let name = e.file_name();
        if name == FIXTURE_NAME || from.join(&name).exists() {
            continue;
        }
        let p = e.path();
        if p.is_dir() {
            std::fs::remove_dir_all(p).unwrap();
        } else {
            std::fs::remove_file(p).unwrap();
        }
    }
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let p = e.path();
        if p.is_dir() {
            sync_dir(&p, &to.join(e.file_name()));
        } else {
            sync_file(
                &to.join(e.file_name()),
                &fixture_edit(&p, std::fs::read(&p).unwrap()),
            );
        }
    }
}
