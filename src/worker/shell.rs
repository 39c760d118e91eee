//! The shell executor (docs/worker.md, "shell"): runs the spec's argv directly (a shell
//! only if argv names one) as the worker's service user, under a supervisor of its own
//! ([`super::supervise`]), in a process group of its own, with a cleared environment: a
//! minimal PATH, HOME and LANG, the run's QLSCHED_* variables and the spec's `env` (secrets
//! resolved). Never the worker's DSN, password or credentials directory. On timeout, cancel,
//! lost lease or drain the command's group gets SIGTERM, then its whole process tree SIGKILL
//! after the grace; when the command exits, whatever it left running is killed; if the
//! worker itself dies, the supervisor kills the whole tree. Exit 0 succeeds.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
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
    let mut child = match supervised(spec, env, vars).spawn() {
        Ok(c) => c,
        Err(e) => {
            return Outcome::failed(
                None,
                String::new(),
                format!("could not start {}: {e}", spec.command[0]),
            )
        }
    };
    // The supervisor's orders; the end of this pipe (the worker gone, the attempt dropped)
    // kills the command's whole tree.
    let mut control = child.stdin.take();
    let keep = limits.output_bound + redactor.longest();
    let out = Arc::new(Mutex::new(Tail::new(keep)));
    let err = Arc::new(Mutex::new(Tail::new(keep)));
    let readers = [
        drain(child.stdout.take(), out.clone()),
        drain(child.stderr.take(), err.clone()),
    ];
    // Nothing of the command outlives it: the supervisor kills what it left running before
    // it ends.
    let (status, stopped) = wait(&mut child, &mut control, timeout, limits.kill_grace, stop).await;
    drop(control);
    for r in readers {
        let abort = r.abort_handle();
        if tokio::time::timeout(PIPE_PATIENCE, r).await.is_err() {
            // A process outside the command's tree holds the pipe (it was handed the
            // descriptor): the tail is what was read.
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

/// The supervisor of `spec`'s command ([`super::supervise`]: this binary, its argv after
/// `--`), with a cleared environment (PATH, HOME, LANG, the run's variables, the spec's `env`)
/// and the working directory, both of which the command inherits; a process group of its
/// own; standard input the control pipe; stdout and stderr piped.
fn supervised(
    spec: &ShellSpec,
    env: Vec<(String, String)>,
    vars: &RunVars,
) -> tokio::process::Command {
    // The running binary itself, even after a package upgrade replaced the file.
    let mut cmd = tokio::process::Command::new("/proc/self/exe");
    cmd.arg0("qlsched")
        .arg(super::supervise::ARG)
        .arg("--")
        .args(&spec.command)
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
    // Not killed when the attempt is dropped: the closed control pipe makes the supervisor
    // kill the whole tree, which a SIGKILL of the supervisor alone would leave running.
    cmd.process_group(0)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(false);
    cmd
}

/// Asks the supervisor for `order` ([`super::supervise::TERM`] or `KILL`).
async fn tell(control: &mut Option<tokio::process::ChildStdin>, order: u8) {
    if let Some(c) = control {
        // A supervisor that ended cannot be told anything; its status is read next.
        let _ = c.write_all(&[order]).await;
        let _ = c.flush().await;
    }
}

/// Waits for the command to exit, or stops its group (SIGTERM, SIGKILL after `kill_grace`)
/// at the timeout or a stop; returns its exit status and why it was stopped, if it was.
async fn wait(
    child: &mut tokio::process::Child,
    control: &mut Option<tokio::process::ChildStdin>,
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
            tell(control, super::supervise::TERM).await;
            match tokio::time::timeout(kill_grace, child.wait()).await {
                Ok(st) => st,
                Err(_) => {
                    tell(control, super::supervise::KILL).await;
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
