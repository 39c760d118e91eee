//! Worker drills: the real `qlsched worker` binary (a real config file per worker, readiness
//! over HTTP), runs of tasks whose spec says `"max_attempts": 2`, and a failure injected into
//! a worker or under it, again and again. Every command writes its pid to
//! `<dir>/<run id>.<attempt>` first, so the drill can watch the child the worker started.
//!
//! - `worker_kill`: a worker SIGKILLed mid-run; its commands die with it (parent-death
//!   signal), its attempts are lost once their lease ends (another worker's expiry) and
//!   retried once on another worker;
//! - `worker_stop`: a worker SIGSTOPped past its lease, then resumed; it records nothing
//!   (its heartbeat and finish are fenced out) and kills the child it left running;
//! - `worker_pg_restart`: PostgreSQL stopped (`fast`, `immediate`) and started while 50
//!   runs execute;
//! - `worker_netns` (root): a worker in a network namespace cut off from the database; it
//!   stops its children by its own clock before the lease can end, and another worker
//!   retries the runs.
//!
//! While each runs, a sampler counts runs with two live attempts (must stay 0); each ends with
//! [`check::executed`]: every run settled with exactly one recorded outcome.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use uuid::Uuid;

use super::check;
use super::{tail, Drill, OwnPg};
use crate::helpers::netns::{require_root, NetNs};
use crate::helpers::worker::{await_gone, await_pid, gone, queue_runs, WorkerOptions, WorkerProc};
use crate::helpers::{wait_until, TestDb};
use crate::worker::metric;

/// Every drill task's spec allows one retry of a lost attempt.
const MAX_ATTEMPTS: i64 = 2;
const WITHIN: Duration = Duration::from_secs(30);
/// Runs with more than one live attempt (docs/dispatcher.md: `claimed`, `dispatching`,
/// `running` are live).
const LIVE_TWICE: &str = "SELECT count(*) FROM (SELECT run_id FROM qlsched.attempts
    WHERE state IN ('claimed', 'dispatching', 'running') GROUP BY run_id HAVING count(*) > 1) d";

/// A shell spec whose command records its pid, then runs `attempt1` on the first attempt
/// and `later` on the others (both `exec`ed: the pid is the command's own).
fn spec(dir: &Path, prologue: &str, attempt1: &str, later: &str) -> String {
    let script = format!(
        "{prologue}echo $$ > {}/$QLSCHED_RUN_ID.$QLSCHED_ATTEMPT; \
         if [ \"$QLSCHED_ATTEMPT\" = 1 ]; then exec {attempt1}; else exec {later}; fi",
        dir.display()
    );
    serde_json::json!({"executor": "shell", "command": ["/bin/sh", "-c", script],
                       "max_attempts": MAX_ATTEMPTS})
    .to_string()
}

/// The pid attempt `n` of `run` wrote, once written.
async fn pid_of(dir: &Path, run: Uuid, n: i32) -> i32 {
    await_pid(&dir.join(format!("{run}.{n}")), WITHIN).await
}

/// One attempt of a run, as the database holds it.
#[derive(Debug)]
struct Attempt {
    no: i32,
    state: String,
    worker: Option<String>,
    error: Option<String>,
    lease_expires_at_ms: Option<i64>,
    started_at_ms: Option<i64>,
}

async fn attempts(sql: &tokio_postgres::Client, run: Uuid) -> Vec<Attempt> {
    sql.query(
        "SELECT attempt_no, state, worker_id, error, lease_expires_at_ms, started_at_ms
           FROM qlsched.attempts WHERE run_id = $1 ORDER BY attempt_no",
        &[&run],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| Attempt {
        no: r.get(0),
        state: r.get(1),
        worker: r.get(2),
        error: r.get(3),
        lease_expires_at_ms: r.get(4),
        started_at_ms: r.get(5),
    })
    .collect()
}

fn wall_ms() -> i64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64
}

/// Watches every pid of `pids` at once until each is gone (or a zombie): when each was first
/// seen gone, as (wall clock ms, monotonic instant).
async fn gone_at(pids: &[i32], what: &str, within: Duration) -> Vec<(i64, Instant)> {
    let deadline = Instant::now() + within;
    let mut seen: Vec<Option<(i64, Instant)>> = vec![None; pids.len()];
    while seen.iter().any(Option::is_none) {
        for (pid, at) in pids.iter().zip(seen.iter_mut()) {
            if at.is_none() && gone(*pid) {
                *at = Some((wall_ms(), Instant::now()));
            }
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {within:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    seen.into_iter().flatten().collect()
}

/// Counts `runs` whose status is one of `statuses`.
async fn count_in(sql: &tokio_postgres::Client, runs: &[Uuid], statuses: &[&str]) -> i64 {
    let statuses: Vec<String> = statuses.iter().map(|s| s.to_string()).collect();
    sql.query_one(
        "SELECT count(*) FROM qlsched.runs WHERE run_id = ANY($1) AND status = ANY($2)",
        &[&runs, &statuses],
    )
    .await
    .unwrap()
    .get(0)
}

async fn await_statuses(
    sql: &tokio_postgres::Client,
    runs: &[Uuid],
    statuses: &[&str],
    within: Duration,
    crew: &Crew,
) {
    let deadline = Instant::now() + within;
    while count_in(sql, runs, statuses).await < runs.len() as i64 {
        assert!(
            Instant::now() < deadline,
            "runs not all {statuses:?} within {within:?}\n{}",
            crew.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Asserts that `run` was lost once on `victim` (marked lost by an expiry) and then
/// succeeded on another worker; returns how long after `from_ms` (database clock) the
/// retry started.
async fn assert_lost_then_retried(
    sql: &tokio_postgres::Client,
    run: Uuid,
    victim: &str,
    from_ms: i64,
) -> i64 {
    let a = attempts(sql, run).await;
    assert_eq!(a.len(), 2, "run {run}: {a:?}");
    assert_eq!(
        (a[0].no, a[0].state.as_str(), a[0].worker.as_deref()),
        (1, "failed", Some(victim)),
        "run {run}: {a:?}"
    );
    assert!(
        a[0].error
            .as_deref()
            .is_some_and(|e| e.starts_with("lost: lease expired")),
        "run {run}: the first attempt is not marked lost: {a:?}"
    );
    assert_eq!(a[1].state, "succeeded", "run {run}: {a:?}");
    assert!(
        a[1].worker.as_deref().is_some_and(|w| w != victim),
        "run {run}: retried on the same worker: {a:?}"
    );
    a[1].started_at_ms.unwrap() - from_ms
}

/// Samples [`LIVE_TWICE`] every 20 ms on a connection of its own (reconnecting while the
/// server is down) until stopped.
struct Sampler {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(i64, u64)>,
}

impl Sampler {
    fn start(db: &TestDb) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = db.config("postgres");
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut worst, mut samples) = (0i64, 0u64);
            let mut client = None;
            while !flag.load(Ordering::SeqCst) {
                if client.is_none() {
                    if let Ok((c, conn)) = cfg.connect(tokio_postgres::NoTls).await {
                        tokio::spawn(conn);
                        client = Some(c);
                    }
                }
                if let Some(c) = &client {
                    match c.query_one(LIVE_TWICE, &[]).await {
                        Ok(r) => {
                            worst = worst.max(r.get(0));
                            samples += 1;
                        }
                        Err(_) => client = None,
                    }
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            (worst, samples)
        });
        Sampler { stop, task }
    }

    /// (most runs with two live attempts in one sample, samples taken)
    async fn finish(self) -> (i64, u64) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// The workers of one drill; killed ones are kept (with their logs) until the end.
struct Crew {
    dsn: String,
    worker: String,
    live: BTreeMap<String, WorkerProc>,
    dead: Vec<WorkerProc>,
}

impl Crew {
    fn new(dsn: &str, worker: &str) -> Crew {
        Crew {
            dsn: dsn.to_string(),
            worker: worker.to_string(),
            live: BTreeMap::new(),
            dead: Vec::new(),
        }
    }

    /// Starts worker `id` (through `prefix`, HTTP on `http_ip`, against `dsn` if given) and
    /// waits until it is ready.
    async fn start_via(
        &mut self,
        id: &str,
        prefix: &[String],
        http_ip: Option<&str>,
        dsn: Option<&str>,
    ) {
        let opts = WorkerOptions {
            worker: &self.worker,
            prefix,
            http_ip,
            env: &[("QLSCHED__LOG__LEVEL", "info")],
            ..Default::default()
        };
        let mut w = WorkerProc::start(dsn.unwrap_or(&self.dsn), id, opts);
        w.wait_ready(WITHIN).await;
        if let Some(old) = self.live.insert(id.to_string(), w) {
            self.dead.push(old);
        }
    }

    async fn start(&mut self, id: &str) {
        self.start_via(id, &[], None, None).await;
    }

    fn get(&self, id: &str) -> &WorkerProc {
        &self.live[id]
    }

    /// SIGKILL and reap.
    fn kill(&mut self, id: &str) {
        let mut w = self.live.remove(id).expect("live worker");
        w.kill();
        self.dead.push(w);
    }

    /// SIGTERM worker `id` and require exit 0.
    async fn stop(&mut self, id: &str) {
        let mut w = self.live.remove(id).expect("live worker");
        w.signal(libc::SIGTERM);
        let st = w.wait_exit(WITHIN).await;
        assert!(
            st.success(),
            "worker {id} exited with {st}; log:\n{}",
            tail(&w.log(), 40)
        );
        self.dead.push(w);
    }

    async fn stop_all(&mut self) {
        let ids: Vec<String> = self.live.keys().cloned().collect();
        for id in ids {
            self.stop(&id).await;
        }
    }

    fn logs(&self) -> String {
        let mut s = String::new();
        for w in self.dead.iter().chain(self.live.values()) {
            s.push_str(&format!("--- worker {} ---\n{}", w.id, tail(&w.log(), 15)));
        }
        s
    }
}

/// Stops the sampler and the workers, checks every run, prints the table and asserts it clean.
async fn finish(drill: &mut Drill, db: &TestDb, sampler: Sampler, crew: &mut Crew) {
    let (live_twice, samples) = sampler.finish().await;
    crew.stop_all().await;
    let sql = db.superuser().await;
    let f = check::executed(&sql, MAX_ATTEMPTS).await;
    let table = drill.report.print_table(&f.table(live_twice, samples));
    assert_eq!(live_twice, 0, "a run had two live attempts\n{table}");
    assert!(samples > 0, "the sampler never reached the database");
    f.assert_clean(&format!("{table}{}", crew.logs()));
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_worker_sigkilled_mid_run_loses_its_attempts_to_one_retry_on_another_worker() {
    let mut drill = Drill::begin("worker_kill", (2, 0), (10, 0), |p, seed| {
        format!(
            "{} kills, 3 workers (concurrency 2, lease 5 s, heartbeat 1 s), 4 runs of `sleep 3` per kill, max_attempts 2, seed {seed}",
            p.cycles
        )
    })
    .await;
    let db = TestDb::new().await;
    let sql = db.superuser().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), "", "sleep 3", "sleep 3");
    let mut crew = Crew::new(&db.dsn("qlsched_dispatcher"), "concurrency = 2");
    for id in ["w0", "w1", "w2"] {
        crew.start(id).await;
    }
    let sampler = Sampler::start(&db);
    let (mut lost, mut children) = (0, 0);
    let (mut retry_after, mut died_with) = (Vec::new(), Vec::new());
    for cycle in 0..drill.p.cycles {
        let runs = queue_runs(&db, &format!("kill{cycle}"), &spec, 4).await;
        await_statuses(&sql, &runs, &["running"], WITHIN, &crew).await;
        tokio::time::sleep(drill.rng.millis(0, 1500)).await;
        let held: Vec<(Uuid, String)> = sql
            .query(
                "SELECT run_id, worker_id FROM qlsched.attempts
                  WHERE run_id = ANY($1) AND state = 'running' ORDER BY run_id",
                &[&runs],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect();
        assert_eq!(
            held.len(),
            4,
            "every run still running at the kill: {held:?}"
        );
        let victim = held[drill.rng.below(held.len() as u64) as usize].1.clone();
        let victims: Vec<Uuid> = held.iter().filter(|h| h.1 == victim).map(|h| h.0).collect();
        let mut pids = Vec::new();
        for run in &victims {
            pids.push(pid_of(dir.path(), *run, 1).await);
        }
        let killed_at = super::db_now(&sql).await;
        let killed = Instant::now();
        crew.kill(&victim);
        // The commands run in process groups of their own, but each one's first process
        // has the worker's death as its parent-death signal: it dies with the worker rather
        // than run on beside the retry.
        children += pids.len();
        for pid in &pids {
            await_gone(*pid, "the killed worker's command gone", WITHIN).await;
        }
        let took = killed.elapsed();
        assert!(
            took < Duration::from_secs(1),
            "the killed worker's commands outlived it by {took:?} (orphaned, they ran on)"
        );
        died_with.push(took.as_millis());
        await_statuses(&sql, &runs, &["succeeded", "failed"], WITHIN, &crew).await;
        for run in &runs {
            if victims.contains(run) {
                retry_after.push(assert_lost_then_retried(&sql, *run, &victim, killed_at).await);
                lost += 1;
            } else {
                let a = attempts(&sql, *run).await;
                assert!(
                    a.len() == 1 && a[0].state == "succeeded",
                    "run {run}: {a:?}"
                );
            }
        }
        crew.start(&format!("w{}", 3 + cycle)).await;
    }
    drill.report.note(format!(
        "attempts lost with the killed workers {lost}, each retried once elsewhere · kill → retry started (ms, database clock) {retry_after:?} · \
         the killed workers' {children} commands gone (parent-death signal) within (ms) {died_with:?} of the kill"
    ));
    finish(&mut drill, &db, sampler, &mut crew).await;
}

/// `qlsched_worker_lost_total`, if `/metrics` answers 200.
fn lost_total(w: &WorkerProc) -> Option<f64> {
    let (status, body) = w.get("/metrics")?;
    (status == 200).then_some(())?;
    let line = body
        .lines()
        .find_map(|l| l.strip_prefix("qlsched_worker_lost_total "));
    Some(line.map_or(0.0, |v| v.trim().parse().unwrap()))
}

/// How a resumed worker's log says it gave an attempt up.
const GAVE_UP: [(&str, &str); 3] = [
    ("the heartbeat was refused", "heartbeat refused"),
    ("by this worker's clock", "its own deadline"),
    ("lease lost before the finish", "finish refused"),
];

#[tokio::test]
async fn a_worker_sigstopped_past_its_lease_records_nothing_and_kills_its_child_on_resume() {
    let mut drill = Drill::begin("worker_stop", (2, 0), (10, 0), |p, seed| {
        format!(
            "{} stops, 2 workers (lease 5 s, heartbeat 1 s, kill_grace 1 s), 1 run per stop, max_attempts 2; \
             the first attempt's command outlives the stop (even stops) or ends during it (odd), seed {seed}",
            p.cycles
        )
    })
    .await;
    let db = TestDb::new().await;
    let sql = db.superuser().await;
    let dir = tempfile::tempdir().unwrap();
    let mut crew = Crew::new(&db.dsn("qlsched_dispatcher"), "concurrency = 1");
    for id in ["w1", "w2"] {
        crew.start(id).await;
    }
    let sampler = Sampler::start(&db);
    let (mut stopped_for, mut killed_after, mut gave_up) = (Vec::new(), Vec::new(), Vec::new());
    for cycle in 0..drill.p.cycles {
        let outlives = cycle % 2 == 0;
        let first = if outlives { "sleep 60" } else { "sleep 2" };
        let spec = spec(dir.path(), "", first, "sleep 1");
        let run = queue_runs(&db, &format!("stop{cycle}"), &spec, 1).await[0];
        await_statuses(&sql, &[run], &["running"], WITHIN, &crew).await;
        let pid = pid_of(dir.path(), run, 1).await;
        let holder = attempts(&sql, run).await[0].worker.clone().unwrap();
        let lost_before = metric(crew.get(&holder), "qlsched_worker_lost_total");
        let t0 = Instant::now();
        crew.get(&holder).signal(libc::SIGSTOP);
        // Past its lease the other worker's expiry marks the attempt lost and takes the retry.
        wait_until("the retry taken by the other worker", WITHIN, || {
            let sql = &sql;
            async move {
                let a = attempts(sql, run).await;
                a.len() == 2 && a[1].state != "claimed"
            }
        })
        .await;
        if outlives {
            assert!(
                !gone(pid),
                "the stopped worker's command ended before the resume"
            );
        }
        crew.get(&holder).signal(libc::SIGCONT);
        stopped_for.push(t0.elapsed().as_millis());
        if outlives {
            killed_after.push(
                await_gone(
                    pid,
                    "the stale command killed after the resume",
                    Duration::from_secs(10),
                )
                .await
                .as_millis(),
            );
        }
        // The resumed worker counts the attempt lost (heartbeat refused, finish refused or
        // the local deadline passed) and records nothing.
        // Its HTTP server answered the first request after a resume 408 once (long form):
        // only a 200 answer is read.
        wait_until(
            "the resumed worker counts its lost lease",
            Duration::from_secs(10),
            || {
                let v = lost_total(crew.get(&holder));
                async move { v == Some(lost_before + 1.0) }
            },
        )
        .await;
        let log = crew.get(&holder).log();
        let log = log.lines().filter(|l| l.contains(&run.to_string()));
        let how = log
            .filter_map(|l| GAVE_UP.iter().find(|(needle, _)| l.contains(needle)))
            .map(|(_, what)| *what)
            .next_back()
            .unwrap_or("?");
        gave_up.push(how);
        await_statuses(&sql, &[run], &["succeeded", "failed"], WITHIN, &crew).await;
        let from = attempts(&sql, run).await[0].lease_expires_at_ms.unwrap();
        assert_lost_then_retried(&sql, run, &holder, from).await;
    }
    drill.report.note(format!(
        "workers stopped for (ms) {stopped_for:?} · resume → the stale command gone (ms) {killed_after:?} · \
         how each resumed worker gave its attempt up: {gave_up:?}"
    ));
    finish(&mut drill, &db, sampler, &mut crew).await;
}

#[tokio::test]
async fn postgres_restarted_under_fifty_running_runs_leaves_each_one_outcome() {
    let mut drill = Drill::begin("worker_pg_restart", (2, 0), (6, 0), |p, seed| {
        format!(
            "{} restarts (fast, immediate, …), 3 workers (concurrency 20, lease 5 s), 50 runs of `sleep 3` per restart, max_attempts 2, seed {seed}",
            p.cycles
        )
    })
    .await;
    let mut pg = OwnPg::start("wrestart", "fsync = off").await;
    let db = pg.db.clone();
    let mut sql = db.superuser().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), "", "sleep 3", "sleep 3");
    let mut crew = Crew::new(&db.dsn("qlsched_dispatcher"), "concurrency = 20");
    for id in ["w1", "w2", "w3"] {
        crew.start(id).await;
    }
    let sampler = Sampler::start(&db);
    let (mut downs, mut settled) = (Vec::new(), Vec::new());
    for cycle in 0..drill.p.cycles {
        let runs = queue_runs(&db, &format!("pg{cycle}"), &spec, 50).await;
        await_statuses(&sql, &runs, &["running"], WITHIN, &crew).await;
        tokio::time::sleep(drill.rng.millis(200, 1200)).await;
        let mode = if cycle % 2 == 0 { "fast" } else { "immediate" };
        pg.server.stop(mode);
        let down = drill.rng.millis(1000, 3000);
        tokio::time::sleep(down).await;
        pg.server.start();
        let up = Instant::now();
        sql = db.superuser().await;
        await_statuses(
            &sql,
            &runs,
            &["succeeded", "failed"],
            Duration::from_secs(60),
            &crew,
        )
        .await;
        settled.push(up.elapsed().as_millis());
        downs.push(format!("{mode} {:.1} s", down.as_secs_f64()));
        for run in &runs {
            let a = attempts(&sql, *run).await;
            let last = a.last().unwrap();
            assert!(
                last.state == "succeeded"
                    || last
                        .error
                        .as_deref()
                        .is_some_and(|e| e.starts_with("lost:")),
                "run {run} ended neither succeeded nor lost: {a:?}"
            );
        }
    }
    drill.report.note(format!(
        "restarts: {} · server up → every run settled (ms) {settled:?}",
        downs.join(", ")
    ));
    finish(&mut drill, &db, sampler, &mut crew).await;
}

#[tokio::test]
async fn a_worker_cut_off_stops_its_children_before_its_lease_can_end() {
    require_root("worker_netns");
    let mut drill = Drill::begin("worker_netns", (1, 0), (5, 0), |p, seed| {
        format!(
            "{} cuts, worker a in a network namespace (concurrency 2, lease 5 s, heartbeat 1 s, kill_grace 1 s), \
             b direct; 2 runs per cut whose first attempt ignores SIGTERM, max_attempts 2, seed {seed}",
            p.cycles
        )
    })
    .await;
    let ns = NetNs::create("wk");
    let own = super::netns::pg_for(&ns).await;
    let db = own.db.clone();
    let sql = db.superuser().await;
    let dir = tempfile::tempdir().unwrap();
    let spec = spec(dir.path(), "trap '' TERM; ", "sleep 60", "sleep 1");
    let inside = format!(
        "host={} port={} user=qlsched_dispatcher dbname=qlsched",
        ns.host_ip, db.port
    );
    let mut crew = Crew::new(&db.dsn("qlsched_dispatcher"), "concurrency = 2");
    let ns_ip = ns.ns_ip.to_string();
    crew.start_via("a", &ns.exec_prefix(), Some(&ns_ip), Some(&inside))
        .await;
    let sampler = Sampler::start(&db);
    let (mut slack, mut gone_after) = (Vec::new(), Vec::new());
    for cycle in 0..drill.p.cycles {
        let runs = queue_runs(&db, &format!("cut{cycle}"), &spec, 2).await;
        await_statuses(&sql, &runs, &["running"], WITHIN, &crew).await;
        let mut pids = Vec::new();
        for run in &runs {
            pids.push(pid_of(dir.path(), *run, 1).await);
        }
        let lost_before = metric(crew.get("a"), "qlsched_worker_lost_total");
        // b serves the same pool, started only now so that a holds both runs.
        crew.start("b").await;
        let cut_at = Instant::now();
        ns.cut();
        // Each command's end is seen on its own: measured one after the other, the second
        // would be stamped when the first ended (its own lease may have ended between).
        let ends = gone_at(&pids, "the cut-off worker's commands gone", WITHIN).await;
        for (run, (at, after)) in runs.iter().zip(ends) {
            gone_after.push(after.saturating_duration_since(cut_at).as_millis());
            // The lease as the database last extended it (nothing reaches it from a since
            // the cut): the command must be gone before it ends.
            let expiry = attempts(&sql, *run).await[0].lease_expires_at_ms.unwrap();
            slack.push(expiry - at);
            assert!(
                at <= expiry,
                "run {run}: the cut-off worker's command outlived its lease by {} ms\n{}",
                at - expiry,
                crew.logs()
            );
        }
        await_statuses(&sql, &runs, &["succeeded", "failed"], WITHIN, &crew).await;
        for run in &runs {
            assert_lost_then_retried(&sql, *run, "a", 0).await;
        }
        ns.heal();
        wait_until("a reachable again after the heal", WITHIN, || {
            let up = crew.get("a").get("/readyz").map(|r| r.0) == Some(200);
            async move { up }
        })
        .await;
        assert_eq!(
            metric(crew.get("a"), "qlsched_worker_lost_total"),
            lost_before + 2.0,
            "a counts both attempts lost"
        );
        crew.stop("b").await;
    }
    drill.report.note(format!(
        "cut → each command gone (ms) {gone_after:?} · its lease's database expiry − gone (ms, must be ≥ 0) {slack:?}"
    ));
    finish(&mut drill, &db, sampler, &mut crew).await;
    drop(own);
}
