//! The shell executor (docs/worker.md, "shell"): runs the spec's argv directly (a shell
//! only if argv names one) as the worker's service user, in a process group of its own,
//! with a cleared environment: a minimal PATH, HOME and LANG, the run's QLSCHED_* variables
//! and the spec's `env` (secrets resolved). Never the worker's DSN, password or
//! credentials directory. On timeout, cancel, lost lease or drain the group gets SIGTERM,
//! then SIGKILL after the grace; when the command exits, whatever it left in its group is
//! killed; if the worker itself dies, the command's first process is killed with it. Exit 0
//! succeeds.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::AsyncReadExt;
use tokio::sync::watch;

use super::secrets::Redactor;
use super::spec::ShellSpec;
use super::tail::Tail;
use super::{Limits, Outcome, RunVars, Stop};

/// The PATH a command gets unless the spec's env sets one.
const PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// How long the output pipes may stay open after the group was killed (a process that
/// left the group may hold them).
const PIPE_PATIENCE: Duration = Duration::from_secs(1);

/// Runs `spec` to its end, a timeout or a stop.
pub async fn run(
    spec: &ShellSpec,
    env: Vec<(String, String)>,
    vars: &RunVars,
    timeout: Option<Duration>,
    limits: &Limits,
    redactor: &Redactor,
    stop: &mut watch::Receiver<Option<Stop>>,
) -> Outcome {
    let mut child = match command(spec, env, vars).spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome::failed(
                None,
                String::new(),
                format!("could not start {}: {e}", spec.command[0]),
            )
        }
    };
    let pgid = child.id().map(|p| p as i32);
    let keep = limits.output_bound + redactor.longest();
    let out = Arc::new(Mutex::new(Tail::new(keep)));
    let err = Arc::new(Mutex::new(Tail::new(keep)));
    let readers = [
        drain(child.stdout.take(), out.clone()),
        drain(child.stderr.take(), err.clone()),
    ];
    let (status, stopped) = wait(&mut child, pgid, timeout, limits.kill_grace, stop).await;
    // Nothing of the command outlives it: its group's remaining processes are killed.
    signal_group(pgid, libc::SIGKILL);
    for r in readers {
        let abort = r.abort_handle();
        if tokio::time::timeout(PIPE_PATIENCE, r).await.is_err() {
            // A process outside the group holds the pipe: the tail is what was read.
            abort.abort();
        }
    }
    let output = compose(
        &out.lock().unwrap(),
        &err.lock().unwrap(),
        limits.output_bound,
        redactor,
    );
    outcome(status, stopped, output, limits.kill_grace)
}

/// The command of `spec`: argv, a cleared environment (PATH, HOME, LANG, the run's
/// variables, the spec's `env`), its working directory, a process group of its own, no
/// stdin, stdout and stderr piped.
fn command(
    spec: &ShellSpec,
    env: Vec<(String, String)>,
    vars: &RunVars,
) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(&spec.command[0]);
    cmd.args(&spec.command[1..])
        .env_clear()
        .env("PATH", PATH)
        .env(
            "HOME",
            std::env::var_os("HOME").unwrap_or_else(|| "/".into()),
        )
        .env("LANG", "C.UTF-8");
    for (k, v) in vars.pairs() {
        cmd.env(k, v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    if let Some(cwd) = &spec.cwd {
        cmd.current_dir(cwd);
    }
    cmd.process_group(0)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    die_with_the_worker(&mut cmd);
    cmd
}

/// Waits for the command to exit, or stops its group (SIGTERM, SIGKILL after `kill_grace`)
/// at the timeout or a stop; returns its exit status and why it was stopped, if it was.
async fn wait(
    child: &mut tokio::process::Child,
    pgid: Option<i32>,
    timeout: Option<Duration>,
    kill_grace: Duration,
    stop: &mut watch::Receiver<Option<Stop>>,
) -> (std::io::Result<std::process::ExitStatus>, Option<String>) {
    let deadline = async {
        match timeout {
            Some(t) => tokio::time::sleep(t).await,
            None => std::future::pending().await,
        }
    };
    let stopped: Option<String> = tokio::select! {
        _ = child.wait() => None,
        _ = deadline => Some(format!(
            "timed out after {}", crate::config::format_duration(timeout.unwrap_or_default())
        )),
        s = stopped(stop) => Some(s.describe().to_string()),
    };
    let status = match &stopped {
        None => child.wait().await,
        Some(_) => {
            signal_group(pgid, libc::SIGTERM);
            match tokio::time::timeout(kill_grace, child.wait()).await {
                Ok(st) => st,
                Err(_) => {
                    signal_group(pgid, libc::SIGKILL);
                    child.wait().await
                }
            }
        }
    };
    (status, stopped)
}

/// The attempt's outcome: succeeded on exit 0; failed otherwise, saying why.
fn outcome(
    status: std::io::Result<std::process::ExitStatus>,
    stopped: Option<String>,
    output: String,
    kill_grace: Duration,
) -> Outcome {
    match (status, stopped) {
        (_, Some(why)) => Outcome::failed(
            None,
            output,
            format!(
                "{why}: process group stopped (SIGTERM, SIGKILL after {})",
                crate::config::format_duration(kill_grace)
            ),
        ),
        (Ok(st), None) if st.success() => Outcome::succeeded(Some(0), output, None),
        (Ok(st), None) => {
            use std::os::unix::process::ExitStatusExt;
            let why = match (st.code(), st.signal()) {
                (Some(c), _) => format!("exited with status {c}"),
                (None, Some(s)) => format!("killed by signal {s}"),
                _ => st.to_string(),
            };
            Outcome::failed(st.code(), output, why)
        }
        (Err(e), None) => Outcome::failed(None, output, format!("waiting for the command: {e}")),
    }
}

/// Resolves once a stop is asked for.
pub(super) async fn stopped(stop: &mut watch::Receiver<Option<Stop>>) -> Stop {
    loop {
        if let Some(s) = *stop.borrow_and_update() {
            return s;
        }
        if stop.changed().await.is_err() {
            // The sender is gone: nobody can ask any more.
            return std::future::pending().await;
        }
    }
}

/// The command's first process gets SIGKILL when the worker dies (a SIGKILL, a crash): its
/// lease lapses and the run may be retried elsewhere, so the command must not run on beside
/// the retry. The parent-death signal follows the thread that forked, which is the worker's
/// one executor thread (`daemon.rs` runs every attempt on the actix system's thread). Processes
/// the command forks itself are not covered (systemd's unit stop kills what is left).
fn die_with_the_worker(cmd: &mut tokio::process::Command) {
    let worker = std::process::id() as libc::pid_t;
    // SAFETY: between fork and exec the closure calls only async-signal-safe functions
    // (prctl, getppid) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The worker died before the signal was armed: do not start the command.
            if libc::getppid() != worker {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

fn signal_group(pgid: Option<i32>, sig: i32) {
    if let Some(pgid) = pgid.filter(|p| *p > 1) {
        // SAFETY: kill(2) with a negative pid signals the process group; no memory involved.
        unsafe {
            libc::kill(-pgid, sig);
        }
    }
}

fn drain<R>(pipe: Option<R>, tail: Arc<Mutex<Tail>>) -> tokio::task::JoinHandle<()>
where
    R: tokio::io::AsyncRead + Unpin + Send + 'static,
{
    tokio::spawn(async move {
        let Some(mut pipe) = pipe else { return };
        let mut buf = [0u8; 8192];
        loop {
            match pipe.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => tail.lock().unwrap().push(&buf[..n]),
            }
        }
    })
}

/// stdout's tail, then stderr's under a `--- stderr ---` line; within `bound` bytes, stderr
/// keeping at least half when both are long.
fn compose(out: &Tail, err: &Tail, bound: usize, redactor: &Redactor) -> String {
    const SEP: &str = "--- stderr ---\n";
    let e = err.text(bound, redactor);
    if e.is_empty() {
        return out.text(bound, redactor);
    }
    let o = out.text(bound, redactor);
    let room = bound.saturating_sub(SEP.len());
    let e_len = e.len().min(room.saturating_sub(o.len().min(room / 2)));
    let e = super::tail::last_bytes(&e, e_len);
    let o = super::tail::last_bytes(&o, room - e.len());
    let mut s = String::with_capacity(bound);
    s.push_str(o);
    if !o.is_empty() && !o.ends_with('\n') {
        s.push('\n');
    }
    s.push_str(SEP);
    s.push_str(e);
    super::tail::last_bytes(&s, bound).to_string()
}
