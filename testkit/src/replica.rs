//! Drives the real `qlsched` binary as a replica process: a real config file, environment
//! overrides, optionally started the way systemd starts it (notify socket, watchdog),
//! readiness over HTTP, SIGKILL / SIGTERM.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// The binary under test: `QLSCHED_BIN` when set, else the `qlsched` that cargo built beside
/// the running test or example (`target/<profile>/deps/…` or `target/<profile>/examples/…`),
/// with the same features.
pub fn binary() -> PathBuf {
    if let Some(bin) = std::env::var_os("QLSCHED_BIN") {
        return PathBuf::from(bin);
    }
    let exe = std::env::current_exe().expect("the path of the running executable");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("the running executable lies under target/<profile>/");
    let bin = profile_dir.join("qlsched");
    assert!(
        bin.is_file(),
        "{} is missing: build it with `cargo build` (or set QLSCHED_BIN)",
        bin.display()
    );
    bin
}

/// A `qlsched` process a test started (a replica or a worker): its config file, log and HTTP
/// address in a directory of its own; killed when dropped.
pub struct Proc {
    /// What it is (`replica`, `worker`), for messages.
    kind: &'static str,
    pub id: String,
    pub http: SocketAddr,
    pub config_path: PathBuf,
    pub log_path: PathBuf,
    child: Option<Child>,
    _dir: tempfile::TempDir,
}

/// A running `qlsched run`.
pub struct ReplicaProc(Proc);

impl std::ops::Deref for ReplicaProc {
    type Target = Proc;
    fn deref(&self) -> &Proc {
        &self.0
    }
}

impl std::ops::DerefMut for ReplicaProc {
    fn deref_mut(&mut self) -> &mut Proc {
        &mut self.0
    }
}

/// How a replica process is started, beyond its database and id.
#[derive(Clone, Copy, Default)]
pub struct Options<'a> {
    /// TOML appended to the config file; lines before any `[section]` header belong to
    /// `[scheduler]` (e.g. `"lease = \"5s\""`).
    pub extra_toml: &'a str,
    /// Extra environment variables.
    pub env: &'a [(&'a str, &'a str)],
    /// Started the way systemd starts a `Type=notify` service with a watchdog.
    pub systemd: Option<Systemd<'a>>,
}

/// What systemd hands a `Type=notify` service: the notify socket, the watchdog interval,
/// and `WATCHDOG_PID`, which must be the daemon's own pid (the sd-notify crate, unlike
/// libsystemd, requires it), so a shell sets it and `exec`s the daemon (same pid).
#[derive(Clone, Copy)]
pub struct Systemd<'a> {
    pub notify_socket: &'a Path,
    pub watchdog_usec: u64,
}

impl ReplicaProc {
    /// Starts `qlsched run` as replica `id` against `dsn` (runtime role), with the given extra
    /// TOML lines appended to the config file (e.g. `"[scheduler]\nlease = \"5s\""`) and
    /// extra environment variables.
    pub fn spawn(dsn: &str, id: &str, extra_toml: &str, env: &[(&str, &str)]) -> ReplicaProc {
        ReplicaProc::start(
            dsn,
            id,
            Options {
                extra_toml,
                env,
                systemd: None,
            },
        )
    }

    /// Like `spawn`, with the command run through `prefix` (e.g. `ip netns exec NAME`) and
    /// HTTP bound to `http_ip` (an address the test can reach from where it runs).
    pub fn spawn_via(
        prefix: &[String],
        http_ip: &str,
        dsn: &str,
        id: &str,
        extra_toml: &str,
        env: &[(&str, &str)],
    ) -> ReplicaProc {
        let opts = Options {
            extra_toml,
            env,
            systemd: None,
        };
        ReplicaProc::start_via(prefix, http_ip, dsn, id, opts)
    }

    /// Starts `qlsched run` as replica `id` against `dsn` (runtime role). Without
    /// `opts.systemd` the process is not under systemd: no notify socket, no watchdog, even
    /// if the test runner has them.
    pub fn start(dsn: &str, id: &str, opts: Options) -> ReplicaProc {
        ReplicaProc::start_via(&[], "127.0.0.1", dsn, id, opts)
    }

    fn start_via(
        prefix: &[String],
        http_ip: &str,
        dsn: &str,
        id: &str,
        opts: Options,
    ) -> ReplicaProc {
        let dir = tempfile::tempdir().unwrap();
        let port = super::pg::free_port();
        let http: SocketAddr = format!("{http_ip}:{port}").parse().unwrap();
        let config_path = dir.path().join(format!("{id}.toml"));
        let (mut scheduler, rest) = split_scheduler(opts.extra_toml);
        if !scheduler.contains("lease") {
            scheduler.push_str("\nlease = \"5s\"");
        }
        if !scheduler.contains("claim_budget") {
            scheduler.push_str("\nclaim_budget = 16");
        }
        if !scheduler.contains("cadence") {
            scheduler.push_str("\ncadence = \"1s\"");
        }
        if !scheduler.contains("admit_timeout") {
            scheduler.push_str("\nadmit_timeout = \"2s\"");
        }
        std::fs::write(
            &config_path,
            format!(
                "[replica]\nid = \"{id}\"\n\n[database]\ndsn = \"{dsn}\"\n\n[scheduler]\n{scheduler}\n\n\
                 [http]\nbind = \"{http}\"\n\n[log]\nformat = \"json\"\nlevel = \"debug\"\n{rest}\n"
            ),
        )
        .unwrap();
        let mut cmd = match opts.systemd {
            None => match prefix.split_first() {
                Some((program, args)) => {
                    let mut c = Command::new(program);
                    c.args(args).arg(binary());
                    c
                }
                None => Command::new(binary()),
            },
            Some(sd) => {
                let mut sh = Command::new("sh");
                sh.arg("-c")
                    .arg("WATCHDOG_PID=$$; export WATCHDOG_PID; exec \"$0\" \"$@\"")
                    .arg(binary())
                    .env("NOTIFY_SOCKET", sd.notify_socket)
                    .env("WATCHDOG_USEC", sd.watchdog_usec.to_string());
                sh
            }
        };
        if opts.systemd.is_none() {
            cmd.env_remove("NOTIFY_SOCKET")
                .env_remove("WATCHDOG_USEC")
                .env_remove("WATCHDOG_PID");
        }
        ReplicaProc(Proc::spawn(
            cmd.arg("run"),
            "replica",
            id,
            http,
            config_path,
            opts.env,
            dir,
        ))
    }

    /// A counter or gauge from the replica's `/metrics` (None if the replica does not answer
    /// or does not export it).
    pub fn metric(&self, name: &str) -> Option<f64> {
        metric(&self.get("/metrics")?.1, name)
    }
}

impl Proc {
    /// Spawns `cmd` (the binary and its subcommand) with `--config config_path`, its output
    /// to `<id>.log` in `dir`, and the extra environment `env`.
    pub fn spawn(
        cmd: &mut Command,
        kind: &'static str,
        id: &str,
        http: SocketAddr,
        config_path: PathBuf,
        env: &[(&str, &str)],
        dir: tempfile::TempDir,
    ) -> Proc {
        let log_path = dir.path().join(format!("{id}.log"));
        let log = std::fs::File::create(&log_path).unwrap();
        cmd.arg("--config")
            .arg(&config_path)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .stdin(Stdio::null());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("spawn qlsched {kind}: {e}"));
        Proc {
            kind,
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

    /// GET `path` on the process's HTTP port; (status, body) or None if it does not answer.
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
                    "{} {} exited with {status} before it was ready; log:\n{}",
                    self.kind,
                    self.id,
                    self.log()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} {} not ready within {within:?}; log:\n{}",
                self.kind,
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
                "{} {} did not exit within {within:?}; log:\n{}",
                self.kind,
                self.id,
                std::fs::read_to_string(&self.log_path).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// The exit status if the process has exited (then reaped), without waiting.
    pub fn try_exit(&mut self) -> Option<ExitStatus> {
        let status = self.child.as_mut()?.try_wait().unwrap()?;
        self.child = None;
        Some(status)
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

    /// SIGTERM, then wait (bounded) for a clean exit.
    pub async fn terminate(&mut self, within: Duration) -> ExitStatus {
        self.signal(libc::SIGTERM);
        self.wait_exit(within).await
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log_path).unwrap_or_default()
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn split_scheduler(extra: &str) -> (String, String) {
    // Lines before any [section] header belong to [scheduler].
    match extra.find('[') {
        Some(i) => (extra[..i].to_string(), extra[i..].to_string()),
        None => (extra.to_string(), String::new()),
    }
}

pub fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_millis(500)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).ok()?;
    let status = buf.split_whitespace().nth(1)?.parse().ok()?;
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Some((status, body))
}

/// The value of the sample `name` (without labels) in a Prometheus text body.
pub fn metric(body: &str, name: &str) -> Option<f64> {
    body.lines()
        .find(|l| l.split_whitespace().next() == Some(name))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
}
