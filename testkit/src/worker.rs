//! Drives the real `qlsched` binary as a worker process (`qlsched worker`): a real config
//! file, readiness over HTTP, SIGTERM / SIGKILL; and queues runs of a task with a given spec.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use qlsched::store::manage::{self, TriggerSpec};
use qlsched::store::triggers::backfill_chunk;
use uuid::Uuid;

use crate::replica::{binary, http_get};
use crate::TestDb;

pub struct WorkerProc {
    pub id: String,
    pub http: SocketAddr,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
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
        let log_path = dir.path().join(format!("{id}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
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
            .arg("worker")
            .arg("--config")
            .arg(&config_path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null());
        for (k, v) in opts.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn qlsched worker");
        WorkerProc {
            id: id.to_string(),
            http,
            config_path,
            log_path,
            child: Some(child),
            _dir: dir,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// GET `path` on the worker's HTTP port; (status, body) or None if it does not answer.
    pub fn get(&self, path: &str) -> Option<(u16, String)> {
        http_get(self.http, path)
    }

    /// Waits until `/readyz` answers 200; panics with the log on time-out or early exit.
    pub async fn wait_ready(&mut self, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            if let Some((200, _)) = self.get("/readyz") {
                return;
            }
            if let Some(status) = self
                .child
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten())
            {
                panic!(
                    "worker {} exited with {status} before it was ready; log:\n{}",
                    self.id,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "worker {} not ready within {within:?}; log:\n{}",
                self.id,
                self.log()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    /// Waits for the process to exit by itself; returns its status.
    pub async fn wait_exit(&mut self, within: Duration) -> ExitStatus {
        let deadline = Instant::now() + within;
        let child = self.child.as_mut().expect("running");
        loop {
            if let Some(s) = child.try_wait().unwrap() {
                self.child = None;
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "worker {} did not exit within {within:?}; log:\n{}",
                self.id,
                std::fs::read_to_string(&self.log_path).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    pub fn signal(&self, sig: i32) {
        if let Some(c) = &self.child {
            unsafe { libc::kill(c.id() as i32, sig) };
        }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
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
}

impl Drop for WorkerProc {
    fn drop(&mut self) {
        self.kill();
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
