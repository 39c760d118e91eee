//! Drives the real `qlsched` binary as a worker process (`qlsched worker`): a real config
//! file, readiness over HTTP, SIGTERM / SIGKILL; and queues runs of a task with a given spec.

use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use qlsched::store::manage::{self, TriggerSpec};
use qlsched::store::triggers::backfill_chunk;
use uuid::Uuid;

use crate::replica::{binary, Proc};
use crate::{wait_until, TestDb};

/// A running `qlsched worker`.
pub struct WorkerProc(Proc);

impl std::ops::Deref for WorkerProc {
    type Target = Proc;
    fn deref(&self) -> &Proc {
        &self.0
    }
}

impl std::ops::DerefMut for WorkerProc {
    fn deref_mut(&mut self) -> &mut Proc {
        &mut self.0
    }
}

/// How a worker process is started, beyond its database and id.
#[derive(Clone, Copy, Default)]
pub struct WorkerOptions<'a> {
    /// Lines of its `[worker]` section (e.g. `"pools = [\"a\"]"`); unset keys get test
    /// defaults: poll 100ms, lease 5s, heartbeat 1s, kill_grace 1s, drain_timeout 5s.
    pub worker: &'a str,
    /// TOML appended after every section (further sections).
    pub extra_toml: &'a str,
    /// Extra environment variables.
    pub env: &'a [(&'a str, &'a str)],
    /// A command prefix the worker runs under (`ip netns exec NAME`); empty: none.
    pub prefix: &'a [String],
    /// The address its HTTP binds (default `127.0.0.1`).
    pub http_ip: Option<&'a str>,
}

impl WorkerProc {
    /// Starts `qlsched worker` as worker `id` against `dsn` (the dispatcher role).
    pub fn start(dsn: &str, id: &str, opts: WorkerOptions) -> WorkerProc {
        let dir = tempfile::tempdir().unwrap();
        let http_ip = opts.http_ip.unwrap_or("127.0.0.1");
        let http: SocketAddr = format!("{http_ip}:{}", crate::pg::free_port())
            .parse()
            .unwrap();
        let mut worker = opts.worker.to_string();
        for (key, value) in [
            ("poll", "\"100ms\""),
            ("lease", "\"5s\""),
            ("heartbeat", "\"1s\""),
            ("kill_grace", "\"1s\""),
            ("drain_timeout", "\"5s\""),
        ] {
            if !worker.lines().any(|l| l.trim_start().starts_with(key)) {
                worker.push_str(&format!("\n{key} = {value}"));
            }
        }
        let config_path = dir.path().join(format!("{id}.toml"));
        std::fs::write(
            &config_path,
            format!(
                "[worker]\nid = \"{id}\"\n{worker}\n\n[database]\ndsn = \"{dsn}\"\n\n\
                 [http]\nbind = \"{http}\"\n\n[log]\nformat = \"json\"\nlevel = \"debug\"\n{}\n",
                opts.extra_toml
            ),
        )
        .unwrap();
        let mut cmd = match opts.prefix.split_first() {
            Some((program, args)) => {
                let mut c = Command::new(program);
                c.args(args).arg(binary());
                c
            }
            None => Command::new(binary()),
        };
        cmd.env_remove("NOTIFY_SOCKET")
            .env_remove("WATCHDOG_USEC")
            .env_remove("WATCHDOG_PID")
            .env_remove("CREDENTIALS_DIRECTORY")
            .arg("worker");
        WorkerProc(Proc::spawn(
            &mut cmd,
            "worker",
            id,
            http,
            config_path,
            opts.env,
            dir,
        ))
    }

    /// Waits (bounded) until the run's status is one of `statuses`; returns its outcome.
    /// Panics with this worker's log on time-out.
    pub async fn await_run(
        &self,
        db: &TestDb,
        run: Uuid,
        statuses: &[&str],
        within: Duration,
    ) -> RunOutcome {
        let deadline = Instant::now() + within;
        loop {
            let o = run_outcome(db, run).await;
            if statuses.contains(&o.status.as_str()) {
                return o;
            }
            assert!(
                Instant::now() < deadline,
                "run {run} not {statuses:?} within {within:?}: {o:?}; worker log:\n{}",
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits (bounded by `within`) until the run has succeeded or failed; returns its outcome.
    pub async fn await_finished(&self, db: &TestDb, run: Uuid, within: Duration) -> RunOutcome {
        self.await_run(db, run, &["succeeded", "failed"], within)
            .await
    }
}

/// Publishes task `task` with `spec` and trigger `task` (every second) in project `proj`,
/// and admits `n` runs of it as a backfill of instants a minute apart, starting a day ago;
/// returns their ids in admission order.
pub async fn queue_runs(db: &TestDb, task: &str, spec: &str, n: usize) -> Vec<Uuid> {
    let mut admin = db.admin().await;
    manage::set_project(&mut admin, "proj", "active")
        .await
        .unwrap();
    manage::publish_task(&mut admin, "proj", task, spec)
        .await
        .unwrap();
    manage::publish_trigger(
        &mut admin,
        &TriggerSpec::new(task, "proj", task, "* * * * * *", "UTC"),
    )
    .await
    .unwrap();
    let start = (db.now_ms().await / 60_000 - 24 * 60) * 60_000;
    let instants: Vec<i64> = (0..n as i64).map(|i| start + i * 60_000).collect();
    let c = backfill_chunk(&mut admin, task, 1, &instants, &format!("backfill:{task}"))
        .await
        .unwrap();
    assert_eq!(c.admitted, n as u64);
    db.superuser()
        .await
        .query(
            "SELECT run_id FROM qlsched.runs WHERE trigger_id = $1 ORDER BY queued_at_ms, run_id",
            &[&task],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// A run's status and its last attempt's state, exit status, output tail and error.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    pub status: String,
    pub attempts: i64,
    pub state: String,
    pub worker_id: Option<String>,
    pub exit_status: Option<i32>,
    pub output_tail: Option<String>,
    pub error: Option<String>,
    pub result: Option<serde_json::Value>,
}

pub async fn run_outcome(db: &TestDb, run: Uuid) -> RunOutcome {
    let r = db
        .superuser()
        .await
        .query_one(
            "SELECT r.status, (SELECT count(*) FROM qlsched.attempts x WHERE x.run_id = r.run_id),
                    a.state, a.worker_id, a.exit_status, a.output_tail, a.error, a.result
               FROM qlsched.runs r
               JOIN LATERAL (SELECT * FROM qlsched.attempts a WHERE a.run_id = r.run_id
                              ORDER BY a.attempt_no DESC LIMIT 1) a ON true
              WHERE r.run_id = $1",
            &[&run],
        )
        .await
        .unwrap();
    RunOutcome {
        status: r.get(0),
        attempts: r.get(1),
        state: r.get(2),
        worker_id: r.get(3),
        exit_status: r.get(4),
        output_tail: r.get(5),
        error: r.get(6),
        result: r.get(7),
    }
}

/// Asks, as the admin role, that `runs` be cancelled; returns how many were asked.
pub async fn request_cancel(db: &TestDb, runs: &[Uuid]) -> i64 {
    db.admin()
        .await
        .query_one("SELECT qlsched.request_cancel($1)", &[&runs])
        .await
        .unwrap()
        .get(0)
}

/// No such process, or a zombie (dead, waiting for init to reap it).
pub fn gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('Z')),
    }
}

/// Waits until `pid` is gone (or a zombie); how long that took.
pub async fn await_gone(pid: i32, what: &str, within: Duration) -> Duration {
    let t0 = Instant::now();
    wait_until(what, within, || async move { gone(pid) }).await;
    t0.elapsed()
}

/// The pid a command wrote (a line) to `path`, once written.
pub async fn await_pid(path: &Path, within: Duration) -> i32 {
    wait_until("the command wrote its pid", within, || {
        let path = path.to_path_buf();
        async move { std::fs::read_to_string(path).is_ok_and(|p| p.ends_with('\n')) }
    })
    .await;
    std::fs::read_to_string(path)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}
