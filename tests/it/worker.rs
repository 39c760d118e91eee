//! `qlsched worker` (docs/worker.md), driven as the real binary against a real database:
//! the shell and http executors, the child's environment, secrets and their redaction, the
//! spec check of `task publish`, which runs a worker takes (executor, pools), cancel,
//! SIGTERM's drain, and `check-config` of a worker file.

use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use uuid::Uuid;

use crate::helpers::cli::{ok, ql, refused};
use crate::helpers::replica::binary;
use crate::helpers::worker::{
    await_gone, await_pid, queue_runs, request_cancel, run_outcome, RunOutcome, WorkerOptions,
    WorkerProc,
};
use crate::helpers::{wait_until, TestDb};

const WITHIN: Duration = Duration::from_secs(30);

fn start(db: &TestDb, worker: &str) -> WorkerProc {
    start_with(db, "w1", worker, &[])
}

fn start_with(db: &TestDb, id: &str, worker: &str, env: &[(&str, &str)]) -> WorkerProc {
    WorkerProc::start(
        &db.dsn("qlsched_dispatcher"),
        id,
        WorkerOptions {
            worker,
            env,
            ..Default::default()
        },
    )
}

fn shell(command: &[&str], extra: &str) -> String {
    format!(
        r#"{{"executor": "shell", "command": {}{extra}}}"#,
        serde_json::to_string(command).unwrap()
    )
}

/// `n` queued runs of task `task`, a shell command.
async fn queue_shell(db: &TestDb, task: &str, command: &[&str], n: usize) -> Vec<Uuid> {
    queue_runs(db, task, &shell(command, ""), n).await
}

async fn idempotency_key(db: &TestDb, run: Uuid) -> String {
    db.superuser()
        .await
        .query_one(
            "SELECT idempotency_key FROM qlsched.runs WHERE run_id = $1",
            &[&run],
        )
        .await
        .unwrap()
        .get(0)
}

/// A metric's value in the worker's `/metrics` text (0 when absent).
pub(crate) fn metric(w: &WorkerProc, name: &str) -> f64 {
    let (status, body) = w.get("/metrics").expect("/metrics answers");
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix(' ')))
        .map(|v| v.trim().parse().unwrap())
        .unwrap_or(0.0)
}

/// The run failed, its error starting with `prefix`.
fn assert_failed_with(o: &RunOutcome, prefix: &str) {
    assert_eq!(o.status, "failed", "{o:?}");
    let error = o.error.as_deref().unwrap();
    assert!(error.starts_with(prefix), "{error}");
}

async fn stop(w: &mut WorkerProc) {
    w.signal(libc::SIGTERM);
    let st = w.wait_exit(WITHIN).await;
    assert!(st.success(), "worker exit {st:?}; log:\n{}", w.log());
}

#[tokio::test]
async fn a_shell_run_succeeds_and_its_output_tail_is_recorded() {
    let db = TestDb::new().await;
    let runs = queue_shell(
        &db,
        "hello",
        &["sh", "-c", "echo hello from $QLSCHED_RUN_ID"],
        1,
    )
    .await;
    let mut w = start(&db, "");
    w.wait_ready(WITHIN).await;
    let o = w.await_finished(&db, runs[0], WITHIN).await;
    assert_eq!(o.status, "succeeded", "{o:?}");
    assert_eq!(o.exit_status, Some(0));
    assert_eq!(o.worker_id.as_deref(), Some("w1"));
    assert_eq!(
        o.output_tail.as_deref(),
        Some(format!("hello from {}\n", runs[0]).as_str())
    );
    assert_eq!(metric(&w, "qlsched_worker_succeeded_total"), 1.0);
    assert_eq!(metric(&w, "qlsched_worker_taken_total"), 1.0);
    assert!(w
        .get("/metrics")
        .unwrap()
        .1
        .contains("qlsched_worker_execution_seconds_count 1"));
    assert_eq!(w.get("/healthz").map(|r| r.0), Some(200));
    stop(&mut w).await;
    db.assert_invariants().await;
}

/// Lapsed attempts are expired before a take at most once per `poll`, not before every take
/// (at 2,000 runs a second, benchmark row W1 made 44,256 expiry calls in 300 s, 1.45 ms of
/// server time each): a worker taking one run at a time through 40 quick runs calls
/// `dispatch_expire` at most once per second of its life, plus one.
#[tokio::test]
async fn lapsed_attempts_are_expired_at_most_once_per_poll_however_often_the_worker_takes() {
    let db = TestDb::new().await;
    let runs = queue_shell(&db, "quick", &["true"], 40).await;
    let t0 = std::time::Instant::now();
    let mut w = start(&db, "concurrency = 1\ntake_batch = 1\npoll = \"1s\"");
    w.wait_ready(WITHIN).await;
    for r in &runs {
        let o = w.await_finished(&db, *r, WITHIN).await;
        assert_eq!(o.status, "succeeded", "{o:?}");
    }
    stop(&mut w).await;
    let secs = t0.elapsed().as_secs_f64();
    let statements = db.statement_texts_of("qlsched_dispatcher").await;
    let calls = |f: &str| -> i64 {
        statements
            .iter()
            .filter(|(q, _)| q.contains(f))
            .map(|(_, n)| n)
            .sum()
    };
    let (takes, expiries) = (
        calls("FROM qlsched.dispatch_take_start("),
        calls("FROM qlsched.dispatch_expire("),
    );
    assert!(takes >= 40, "{takes} takes for 40 runs taken one at a time");
    assert!(
        expiries >= 1 && expiries as f64 <= secs.ceil() + 1.0,
        "{expiries} expiry calls in {secs:.1} s of the worker's life ({takes} takes)"
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_failing_command_records_failure_and_its_stderr_tail() {
    let db = TestDb::new().await;
    let cmd = ["sh", "-c", "echo some output; echo it broke >&2; exit 3"];
    let runs = queue_shell(&db, "broken", &cmd, 1).await;
    let mut w = start(&db, "");
    let o = w.await_finished(&db, runs[0], WITHIN).await;
    assert_eq!(o.status, "failed", "{o:?}");
    assert_eq!(o.state, "failed");
    assert_eq!(o.exit_status, Some(3));
    assert_eq!(o.error.as_deref(), Some("exited with status 3"));
    assert_eq!(
        o.output_tail.as_deref(),
        Some("some output\n--- stderr ---\nit broke\n")
    );
    assert_eq!(metric(&w, "qlsched_worker_failed_total"), 1.0);
    stop(&mut w).await;
}

#[tokio::test]
async fn a_timeout_kills_the_process_group_grandchild_included() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild");
    let script = format!("sleep 300 & echo $! > {}; wait", pidfile.display());
    let runs = queue_runs(
        &db,
        "slow",
        &shell(&["sh", "-c", &script], r#", "timeout": "1s""#),
        1,
    )
    .await;
    let mut w = start(&db, "");
    let o = w.await_finished(&db, runs[0], WITHIN).await;
    assert_failed_with(&o, "timed out after 1s: process group stopped");
    let pid = await_pid(&pidfile, WITHIN).await;
    await_gone(pid, "the grandchild is gone", WITHIN).await;
    stop(&mut w).await;
}

#[tokio::test]
async fn the_child_environment_holds_the_run_variables_and_no_credentials() {
    let db = TestDb::new().await;
    let runs = queue_runs(
        &db,
        "env",
        &shell(&["env"], r#", "env": {"FOO": "bar"}"#),
        1,
    )
    .await;
    let key = idempotency_key(&db, runs[0]).await;
    let mut w = start_with(
        &db,
        "w1",
        "",
        &[
            ("PGPASSWORD", "pg-password-1"),
            ("QLSCHED__DATABASE__PASSWORD", "config-password-2"),
            ("QLSCHED_DSN", "host=elsewhere password=dsn-password-3"),
            ("AWS_SECRET_ACCESS_KEY", "ambient-secret-4"),
        ],
    );
    let o = w.await_finished(&db, runs[0], WITHIN).await;
    assert_eq!(o.status, "succeeded", "{o:?}");
    let env = o.output_tail.unwrap();
    let vars: Vec<&str> = env.lines().collect();
    for want in [
        format!("QLSCHED_RUN_ID={}", runs[0]),
        "QLSCHED_ATTEMPT=1".to_string(),
        format!("QLSCHED_IDEMPOTENCY_KEY={key}"),
        "QLSCHED_TRIGGER_ID=env".to_string(),
        "FOO=bar".to_string(),
        "LANG=C.UTF-8".to_string(),
    ] {
        assert!(vars.contains(&want.as_str()), "{want} missing from:\n{env}");
    }
    assert!(
        vars.iter()
            .any(|v| v.starts_with("QLSCHED_SCHEDULED_FOR=20") && v.ends_with('Z')),
        "{env}"
    );
    for v in &vars {
        assert!(!v.starts_with("PG"), "{v}");
        assert!(
            !v.starts_with("QLSCHED__") && !v.starts_with("QLSCHED_DSN"),
            "{v}"
        );
        assert!(
            !v.starts_with("AWS_") && !v.starts_with("CREDENTIALS_DIRECTORY"),
            "{v}"
        );
        assert!(!v.contains("password") && !v.contains("dbname="), "{v}");
    }
    stop(&mut w).await;
}

fn secret_file(dir: &Path, name: &str, value: &str, mode: u32) {
    let path = dir.join(name);
    std::fs::write(&path, value).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn credentials_dir() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

#[tokio::test]
async fn a_secret_is_resolved_on_the_worker_and_redacted_in_the_tail() {
    let db = TestDb::new().await;
    let creds = credentials_dir();
    secret_file(creds.path(), "backup-token", "s3cr3t-value-42\n", 0o600);
    secret_file(creds.path(), "loose", "loose-value\n", 0o640);
    let check = r#"test "$TOKEN" = s3cr3t-value-42 && echo token=$TOKEN && echo token=$TOKEN >&2"#;
    let good = queue_runs(
        &db,
        "with-secret",
        &shell(
            &["sh", "-c", check],
            r#", "env": {"TOKEN": {"secret": "backup-token"}}"#,
        ),
        1,
    )
    .await;
    let loose = queue_runs(
        &db,
        "loose-secret",
        &shell(&["true"], r#", "env": {"TOKEN": {"secret": "loose"}}"#),
        1,
    )
    .await;
    let conf = format!("credentials_directory = \"{}\"", creds.path().display());
    let mut w = start(&db, &conf);
    let o = w.await_finished(&db, good[0], WITHIN).await;
    assert_eq!(
        o.status, "succeeded",
        "the secret reached the command: {o:?}"
    );
    assert_eq!(
        o.output_tail.as_deref(),
        Some("token=[redacted]\n--- stderr ---\ntoken=[redacted]\n")
    );
    let o = w.await_finished(&db, loose[0], WITHIN).await;
    assert_failed_with(&o, "secret `loose`:");
    let error = o.error.unwrap();
    assert!(error.contains("mode 0640"), "{error}");
    let everything = db
        .count("SELECT count(*) FROM qlsched.attempts WHERE concat(output_tail, error, result::text) SIMILAR TO '%(s3cr3t-value-42|loose-value)%'")
        .await;
    assert_eq!(everything, 0, "no secret value reached the database");
    stop(&mut w).await;
}

/// `qlsched task publish` of task `id` with `spec` in project `p`.
fn publish(db: &TestDb, id: &str, spec: &str) -> std::process::Output {
    ql(
        db,
        &[
            "task",
            "publish",
            "--project",
            "p",
            "--id",
            id,
            "--spec",
            spec,
        ],
    )
}

#[tokio::test]
async fn task_publish_refuses_a_bad_spec_naming_the_field() {
    let db = TestDb::new().await;
    ok(ql(&db, &["project", "set", "--id", "p"]));
    for (spec, field) in [
        (
            r#"{"executor": "shell", "command": "ls"}"#,
            "spec field `command`",
        ),
        (
            r#"{"executor": "shell", "command": ["ls"], "timeout": "soon"}"#,
            "spec field `timeout`",
        ),
        (
            r#"{"executor": "http", "url": "ftp://x/"}"#,
            "spec field `url`",
        ),
        (r#"{"executor": "cron"}"#, "spec field `executor`"),
        (
            r#"{"image": "x", "max_attempts": 0}"#,
            "spec field `max_attempts`",
        ),
        ("not json", "spec field `(document)`"),
    ] {
        let out = publish(&db, "t", spec);
        refused(out, 2, &[field]);
    }
    assert_eq!(db.count("SELECT count(*) FROM qlsched.tasks").await, 0);
    // Without an executor the spec is an external dispatcher's: accepted.
    ok(publish(&db, "t", r#"{"image": "x"}"#));
    ok(publish(&db, "u", &shell(&["true"], "")));
    assert_eq!(db.count("SELECT count(*) FROM qlsched.tasks").await, 2);
}

#[tokio::test]
async fn a_spec_without_executor_is_never_taken_by_the_worker() {
    let db = TestDb::new().await;
    // Admitted first: every take walks past them in admission order to reach the shell run.
    let external = queue_runs(&db, "external", r#"{"image": "demo"}"#, 2).await;
    let ours = queue_shell(&db, "ours", &["true"], 1).await;
    let mut w = start(&db, "concurrency = 8");
    let o = w.await_finished(&db, ours[0], WITHIN).await;
    assert_eq!(o.status, "succeeded", "{o:?}");
    for run in external {
        let o = run_outcome(&db, run).await;
        assert_eq!(
            (o.status.as_str(), o.state.as_str(), o.worker_id),
            ("queued", "claimed", None)
        );
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.run_events e JOIN qlsched.runs r USING (run_id) WHERE r.trigger_id = 'external' AND e.kind = 'run.dispatching'")
            .await,
        0
    );
    stop(&mut w).await;
}

#[tokio::test]
async fn a_worker_takes_only_runs_of_its_pools() {
    let db = TestDb::new().await;
    let in_a = queue_runs(&db, "in-a", &shell(&["true"], r#", "pool": "a""#), 1).await;
    let in_b = queue_runs(&db, "in-b", &shell(&["true"], r#", "pool": "b""#), 1).await;
    let mut wb = start_with(&db, "wb", "pools = [\"b\"]", &[]);
    let o = wb.await_finished(&db, in_b[0], WITHIN).await;
    assert_eq!(
        (o.status.as_str(), o.worker_id.as_deref()),
        ("succeeded", Some("wb"))
    );
    let o = run_outcome(&db, in_a[0]).await;
    assert_eq!(
        (o.status.as_str(), o.worker_id),
        ("queued", None),
        "pool a is not wb's"
    );
    let mut wa = start_with(&db, "wa", "pools = [\"a\", \"c\"]", &[]);
    let o = wa.await_finished(&db, in_a[0], WITHIN).await;
    assert_eq!(
        (o.status.as_str(), o.worker_id.as_deref()),
        ("succeeded", Some("wa"))
    );
    stop(&mut wa).await;
    stop(&mut wb).await;
}

/// A loopback HTTP server answering each request by its path (`/ok`: 201, else 503);
/// hands every request it read (head and body) to the channel.
fn http_server() -> (u16, std::sync::mpsc::Receiver<String>) {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut s) = conn else { return };
            s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut buf = Vec::new();
            let mut chunk = [0u8; 4096];
            // The head, then Content-Length bytes of body.
            let request = loop {
                let n = match s.read(&mut chunk) {
                    Ok(0) | Err(_) => break None,
                    Ok(n) => n,
                };
                buf.extend_from_slice(&chunk[..n]);
                let text = String::from_utf8_lossy(&buf).to_string();
                if let Some((head, body)) = text.split_once("\r\n\r\n") {
                    let len = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap())
                        })
                        .unwrap_or(0);
                    if body.len() >= len {
                        break Some(text);
                    }
                }
            };
            let Some(request) = request else { continue };
            let answer = if request.starts_with("POST /ok") {
                "HTTP/1.1 201 Created\r\nContent-Length: 5\r\nConnection: close\r\n\r\nmade!"
            } else {
                "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 4\r\nConnection: close\r\n\r\nbusy"
            };
            let _ = s.write_all(answer.as_bytes());
            let _ = tx.send(request);
        }
    });
    (port, rx)
}

#[tokio::test]
async fn the_http_executor_sends_the_idempotency_key_and_records_the_status() {
    let db = TestDb::new().await;
    let (port, requests) = http_server();
    let creds = credentials_dir();
    secret_file(creds.path(), "hook-token", "hook-secret-7\n", 0o400);
    let spec = |path: &str| {
        format!(
            r#"{{"executor": "http", "method": "POST", "url": "http://127.0.0.1:{port}{path}",
                "headers": {{"X-Token": {{"secret": "hook-token"}}, "Content-Type": "application/json"}},
                "body": "{{\"a\": 1}}", "timeout": "10s"}}"#
        )
    };
    let good = queue_runs(&db, "hook-ok", &spec("/ok?x=1"), 1).await;
    let bad = queue_runs(&db, "hook-busy", &spec("/busy"), 1).await;
    let key = idempotency_key(&db, good[0]).await;
    let conf = format!("credentials_directory = \"{}\"", creds.path().display());
    let mut w = start(&db, &conf);
    let o = w.await_finished(&db, good[0], WITHIN).await;
    assert_eq!(o.status, "succeeded", "{o:?}");
    assert_eq!(o.exit_status, Some(201));
    assert_eq!(o.result, Some(serde_json::json!({"http_status": 201})));
    assert_eq!(o.output_tail.as_deref(), Some("made!"));
    let o = w.await_finished(&db, bad[0], WITHIN).await;
    assert_eq!(o.status, "failed", "{o:?}");
    assert_eq!(o.exit_status, Some(503));
    assert_eq!(o.error.as_deref(), Some("answered HTTP 503"));
    let mut seen = Vec::new();
    for _ in 0..2 {
        seen.push(
            requests
                .recv_timeout(WITHIN)
                .expect("a request reached the server"),
        );
    }
    let ok_request = seen
        .iter()
        .find(|r| r.starts_with("POST /ok?x=1 HTTP/1.1\r\n"))
        .expect("POST /ok?x=1");
    let lower = ok_request.to_ascii_lowercase();
    assert!(
        lower.contains(&format!(
            "\r\nidempotency-key: {}\r\n",
            key.to_ascii_lowercase()
        )),
        "{ok_request}"
    );
    assert!(
        lower.contains("\r\nx-token: hook-secret-7\r\n"),
        "{ok_request}"
    );
    assert!(ok_request.ends_with("\r\n\r\n{\"a\": 1}"), "{ok_request}");
    stop(&mut w).await;
}

/// A loopback HTTPS server with a self-signed certificate; counts the TLS handshakes that
/// completed.
fn untrusted_https_server() -> (u16, std::sync::Arc<std::sync::atomic::AtomicUsize>) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let cert = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(cert.key_pair.serialize_der().into());
    let cfg = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_no_client_auth()
    .with_single_cert(vec![cert.cert.der().clone()], key)
    .unwrap();
    let cfg = Arc::new(cfg);
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let handshakes = Arc::new(AtomicUsize::new(0));
    let done = handshakes.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut tcp) = conn else { return };
            tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
            let mut tls = rustls::ServerConnection::new(cfg.clone()).unwrap();
            if tls.complete_io(&mut tcp).is_ok() && !tls.is_handshaking() {
                done.fetch_add(1, Ordering::SeqCst);
            }
        }
    });
    (port, handshakes)
}

#[tokio::test]
async fn the_http_executor_refuses_a_certificate_no_trusted_root_signed() {
    let db = TestDb::new().await;
    let (port, handshakes) = untrusted_https_server();
    let spec = format!(
        r#"{{"executor": "http", "url": "https://127.0.0.1:{port}/hook", "timeout": "10s"}}"#
    );
    let runs = queue_runs(&db, "hook-tls", &spec, 1).await;
    let mut w = start(&db, "");
    let o = w.await_finished(&db, runs[0], WITHIN).await;
    assert_failed_with(
        &o,
        &format!("TLS with 127.0.0.1:{port}: invalid peer certificate"),
    );
    assert_eq!(handshakes.load(std::sync::atomic::Ordering::SeqCst), 0);
    stop(&mut w).await;
}

#[tokio::test]
async fn an_operator_cancel_stops_the_command_and_fails_the_run() {
    let db = TestDb::new().await;
    let runs = queue_shell(&db, "long", &["sleep", "300"], 1).await;
    let mut w = start(&db, "");
    w.await_run(&db, runs[0], &["running"], WITHIN).await;
    assert_eq!(request_cancel(&db, &runs).await, 1);
    let o = w.await_finished(&db, runs[0], WITHIN).await;
    assert_failed_with(
        &o,
        "cancelled at an operator's request: process group stopped",
    );
    stop(&mut w).await;
}

#[tokio::test]
async fn a_refused_heartbeat_stops_the_command_and_records_nothing() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "echo $$ > {}/pid.$QLSCHED_ATTEMPT; exec sleep 300",
        dir.path().display()
    );
    let spec = shell(&["sh", "-c", &script], r#", "max_attempts": 2"#);
    let runs = queue_runs(&db, "lapsed", &spec, 1).await;
    let mut w = start(&db, "drain_timeout = \"0s\"");
    w.await_run(&db, runs[0], &["running"], WITHIN).await;
    let first = dir.path().join("pid.1");
    let pid = await_pid(&first, WITHIN).await;
    // The lease ends under the worker (as after a pause past it); an expiry (the worker's
    // own, before its next take, or another dispatcher's) marks the attempt lost and queues
    // the run again under attempt 2.
    db.superuser()
        .await
        .batch_execute(
            "SET session_replication_role = replica;
             UPDATE qlsched.attempts SET lease_expires_at_ms = 0 WHERE state = 'running';
             RESET session_replication_role",
        )
        .await
        .unwrap();
    // The next heartbeat is refused: the command is stopped, nothing is recorded by it.
    await_gone(pid, "the first attempt's command is gone", WITHIN).await;
    wait_until("the lost lease is counted", WITHIN, || {
        let lost = metric(&w, "qlsched_worker_lost_total");
        async move { lost == 1.0 }
    })
    .await;
    let first_attempt: (String, Option<String>) = {
        let r = db
            .superuser()
            .await
            .query_one(
                "SELECT state, error FROM qlsched.attempts WHERE run_id = $1 AND attempt_no = 1",
                &[&runs[0]],
            )
            .await
            .unwrap();
        (r.get(0), r.get(1))
    };
    assert_eq!(first_attempt.0, "failed");
    assert!(
        first_attempt
            .1
            .as_deref()
            .is_some_and(|e| e.starts_with("lost: lease expired")),
        "{first_attempt:?}"
    );
    stop(&mut w).await;
}

/// The live processes (zombies excluded) whose environment holds `QLSCHED_RUN_ID=run`: the
/// command of that run and everything it started, wherever it moved in the process tree.
fn processes_of(run: Uuid) -> Vec<(i32, String)> {
    let needle = format!("QLSCHED_RUN_ID={run}");
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
        let ours = environ.split(|b| *b == 0).any(|v| v == needle.as_bytes());
        if ours && !crate::helpers::worker::gone(pid) {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
            found.push((pid, cmdline));
        }
    }
    found
}

/// A SIGKILLed worker leaves nothing of its commands running: not the command, not its
/// children, not a child that left the process group (`setsid`) nor one whose parent ended
/// (a double fork). Before: only the command's first process died with the worker (its
/// parent-death signal); everything it had started ran on, orphaned.
#[tokio::test]
async fn a_sigkilled_worker_leaves_no_process_of_its_command_running() {
    let db = TestDb::new().await;
    let script = "sleep 300 & setsid sh -c 'sleep 301 & wait' & (sleep 302 &); wait";
    let run = queue_runs(&db, "tree", &shell(&["sh", "-c", script], ""), 1).await[0];
    let mut w = start(&db, "");
    w.await_run(&db, run, &["running"], WITHIN).await;
    wait_until("the command's three sleeps running", WITHIN, || async {
        processes_of(run)
            .iter()
            .filter(|(_, c)| c.starts_with("sleep 30"))
            .count()
            == 3
    })
    .await;
    w.kill();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_of(run);
        if left.is_empty() {
            break;
        }
        if std::time::Instant::now() > deadline {
            for (pid, _) in &left {
                // SAFETY: kill(2) of the test's own leftovers.
                unsafe { libc::kill(*pid, libc::SIGKILL) };
            }
            panic!("10 s after the worker's SIGKILL its command's processes still run: {left:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The local deadline does not wait for the database: a heartbeat whose bytes stop moving
/// (every connection of the worker blackholed from that heartbeat's Bind on, new ones too, so
/// pool checkouts hang as well) leaves the deadline to fire on time, and the command, which
/// ignores SIGTERM, is killed before the lease can end on the database clock.
#[tokio::test]
async fn a_hung_heartbeat_leaves_the_local_deadline_on_time() {
    use crate::helpers::proxy::{Fault, Proxy};
    let db = TestDb::new().await;
    let sql = db.superuser().await;
    let proxy = Proxy::start_with_marker(db.port, "dispatch_heartbeat(").await;
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "trap '' TERM; echo $$ > {}/pid.$QLSCHED_ATTEMPT; exec sleep 60",
        dir.path().display()
    );
    let run = queue_runs(&db, "hung", &shell(&["sh", "-c", &script], ""), 1).await[0];
    let mut w = WorkerProc::start(
        &proxy.dsn("qlsched_dispatcher", &db.name),
        "w1",
        WorkerOptions::default(),
    );
    w.await_run(&db, run, &["running"], WITHIN).await;
    let pid = await_pid(&dir.path().join("pid.1"), WITHIN).await;
    // A heartbeat answered first (the lease as the database extends it from then on).
    let first: i64 = lease_expiry(&sql, run).await;
    wait_until("a heartbeat extended the lease", WITHIN, || async {
        lease_expiry(&sql, run).await > first
    })
    .await;
    proxy.arm(Fault::Partition, 1, 1);
    wait_until("the next heartbeat blackholed", WITHIN, || {
        let p = proxy.partitioned();
        async move { p }
    })
    .await;
    let deadline = std::time::Instant::now() + WITHIN;
    while !crate::helpers::worker::gone(pid) {
        assert!(
            std::time::Instant::now() < deadline,
            "the command outlived the cut by {WITHIN:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The wall clock of this host, which is the database's.
    let gone_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as i64;
    // Nothing of the worker reached the database since the cut: this is the lease's end.
    let end = lease_expiry(&sql, run).await;
    proxy.heal();
    assert!(
        gone_at <= end,
        "the command outlived its lease by {} ms; worker log:\n{}",
        gone_at - end,
        w.log()
    );
    assert!(
        w.log().contains("by this worker's clock"),
        "not stopped by the local deadline:\n{}",
        w.log()
    );
    stop(&mut w).await;
}

/// The first attempt's lease expiry (database clock, Unix ms).
async fn lease_expiry(sql: &tokio_postgres::Client, run: Uuid) -> i64 {
    sql.query_one(
        "SELECT lease_expires_at_ms FROM qlsched.attempts WHERE run_id = $1 AND attempt_no = 1",
        &[&run],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn sigterm_lets_a_running_attempt_finish_within_the_drain_timeout() {
    let db = TestDb::new().await;
    // Runs longer than the 5 s lease: only heartbeats keep it.
    let runs = queue_shell(&db, "drained", &["sh", "-c", "sleep 7; echo done"], 1).await;
    let mut w = start(&db, "drain_timeout = \"20s\"");
    w.await_run(&db, runs[0], &["running"], WITHIN).await;
    w.signal(libc::SIGTERM);
    wait_until("/readyz turns 503 at the stop", WITHIN, || {
        let r = w.get("/readyz");
        async move { !matches!(r, Some((200, _))) }
    })
    .await;
    let st = w.wait_exit(WITHIN).await;
    assert!(st.success(), "{st:?}");
    let o = run_outcome(&db, runs[0]).await;
    assert_eq!(o.status, "succeeded", "{o:?}");
    assert_eq!(o.output_tail.as_deref(), Some("done\n"));
    db.assert_invariants().await;
}

#[tokio::test]
async fn past_the_drain_timeout_a_running_attempt_is_stopped_and_failed() {
    let db = TestDb::new().await;
    let runs = queue_shell(&db, "stuck", &["sleep", "300"], 2).await;
    let mut w = start(&db, "drain_timeout = \"1s\"\nconcurrency = 1");
    // Admitted together (one queued_at_ms): either is taken first.
    let (taken, left) = crate::helpers::poll_until("one run running", WITHIN, || async {
        let a = run_outcome(&db, runs[0]).await.status;
        let b = run_outcome(&db, runs[1]).await.status;
        match (a.as_str(), b.as_str()) {
            ("running", _) => Some((runs[0], runs[1])),
            (_, "running") => Some((runs[1], runs[0])),
            _ => None,
        }
    })
    .await;
    w.signal(libc::SIGTERM);
    let st = w.wait_exit(WITHIN).await;
    assert!(st.success(), "{st:?}; log:\n{}", w.log());
    let o = run_outcome(&db, taken).await;
    assert_failed_with(
        &o,
        "interrupted: the worker stopped and its drain timeout passed",
    );
    // Nothing held: the run it never took is still queued, untouched.
    let o = run_outcome(&db, left).await;
    assert_eq!(
        (o.status.as_str(), o.attempts, o.worker_id),
        ("queued", 1, None)
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.attempts WHERE state IN ('dispatching', 'running')")
            .await,
        0
    );
}

/// `qlsched check-config` of the file at `path`, outside systemd (no credentials directory).
fn check_config(path: &Path) -> std::process::Output {
    std::process::Command::new(binary())
        .args(["check-config", "--config"])
        .arg(path)
        .env_remove("CREDENTIALS_DIRECTORY")
        .output()
        .unwrap()
}

#[tokio::test]
async fn check_config_rejects_an_out_of_bounds_worker_key_naming_file_key_and_bound() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("worker.toml");
    std::fs::write(&path, "[worker]\nid = \"w1\"\nconcurrency = 0\n").unwrap();
    let out = check_config(&path);
    let file = path.display().to_string();
    refused(
        out,
        2,
        &[&file, "worker.concurrency = 0", "must be within 1..=256"],
    );
    let open = dir.path().join("creds");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::write(
        &path,
        format!(
            "[worker]\nid = \"w1\"\ncredentials_directory = \"{}\"\n",
            open.display()
        ),
    )
    .unwrap();
    let out = check_config(&path);
    refused(
        out,
        2,
        &[&file, "worker.credentials_directory", "mode 0755"],
    );
    std::fs::write(&path, "[worker]\nid = \"w1\"\n").unwrap();
    let out = check_config(&path);
    assert!(ok(out).contains(": ok"));
}

#[test]
fn the_shipped_example_worker_file_loads() {
    let path = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/config/worker.toml"));
    // Its password file is systemd's credential, absent here.
    let env = [(
        "QLSCHED__DATABASE__PASSWORD_FILE".to_string(),
        String::new(),
    )];
    let cfg = qlsched::config::worker::WorkerFileConfig::load_with_env(path, env)
        .unwrap_or_else(|e| panic!("{} should load:\n{e}", path.display()));
    assert_eq!(cfg.worker.id.as_str(), "worker-a");
    assert_eq!(cfg.worker.pools, ["default", "backups"]);
    assert_eq!(cfg.database.pg.get_user(), Some("qlsched_dispatcher"));
    assert_eq!(cfg.worker.credentials_directory, None);
    assert!(qlsched::config::worker::is_worker_file(path));
}

/// Reads notify datagrams until one equals `want` (bounded); returns those read before.
fn until_notified(sock: &std::os::unix::net::UnixDatagram, want: &str) -> Vec<String> {
    let deadline = std::time::Instant::now() + WITHIN;
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        assert!(
            std::time::Instant::now() < deadline,
            "no {want} within {WITHIN:?}: {seen:?}"
        );
        if let Ok(n) = sock.recv(&mut buf) {
            let text = String::from_utf8_lossy(&buf[..n]).to_string();
            if text.lines().any(|l| l == want) {
                return seen;
            }
            seen.push(text);
        }
    }
}

#[tokio::test]
async fn under_a_notify_socket_the_worker_reports_ready_then_stopping() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("notify.sock");
    let sock = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let socket = path.display().to_string();
    let mut w = start_with(&db, "w1", "", &[("NOTIFY_SOCKET", &socket)]);
    let before = until_notified(&sock, "READY=1");
    assert_eq!(
        w.get("/readyz").map(|r| r.0),
        Some(200),
        "READY=1 before /readyz 200"
    );
    assert!(
        !before.iter().any(|m| m.contains("STOPPING=1")),
        "{before:?}"
    );
    w.signal(libc::SIGTERM);
    until_notified(&sock, "STOPPING=1");
    let st = w.wait_exit(WITHIN).await;
    assert!(st.success(), "{st:?}; log:\n{}", w.log());
}

#[tokio::test]
async fn a_worker_refuses_a_schema_without_its_take_and_a_role_that_is_not_the_dispatchers() {
    let db = TestDb::new().await;
    let mut as_runtime =
        WorkerProc::start(&db.dsn("qlsched_runtime"), "w1", WorkerOptions::default());
    let st = as_runtime.wait_exit(WITHIN).await;
    assert_eq!(st.code(), Some(1), "log:\n{}", as_runtime.log());
    assert!(
        as_runtime
            .log()
            .contains("role qlsched_runtime may not EXECUTE qlsched.dispatch_take_start"),
        "{}",
        as_runtime.log()
    );
    db.superuser()
        .await
        .batch_execute(
            "DROP FUNCTION qlsched.dispatch_finish_batch(uuid[], uuid[], text[], integer[], text[], text[], jsonb[])",
        )
        .await
        .unwrap();
    let mut old = start(&db, "");
    let st = old.wait_exit(WITHIN).await;
    assert_eq!(st.code(), Some(1), "log:\n{}", old.log());
    assert!(
        old.log()
            .contains("dispatch_finish_batch(uuid[],uuid[],text[],integer[],text[],text[],jsonb[]) is missing"),
        "{}",
        old.log()
    );
}

/// The take starts what it takes (no run is ever `dispatching`: no start call per run), and
/// attempts that end together are finished in one call: four commands released at the same
/// moment are recorded at one instant of the database clock, within `take_linger`.
#[tokio::test]
async fn a_worker_starts_runs_in_its_take_and_finishes_those_ending_together_in_one_call() {
    let db = TestDb::new().await;
    let dir = tempfile::tempdir().unwrap();
    let go = dir.path().join("go");
    let wait = format!("while [ ! -e {} ]; do sleep 0.01; done", go.display());
    let runs = queue_shell(&db, "together", &["sh", "-c", &wait], 4).await;
    let mut w = start(&db, "concurrency = 4\ntake_linger = \"1s\"");
    w.wait_ready(WITHIN).await;
    let sql = db.superuser().await;
    wait_until("the four runs running", WITHIN, || {
        let (sql, runs) = (&sql, &runs);
        async move {
            let n: i64 = sql
                .query_one(
                    "SELECT count(*) FROM qlsched.runs WHERE run_id = ANY ($1) AND status = 'running'",
                    &[runs],
                )
                .await
                .unwrap()
                .get(0);
            n == 4
        }
    })
    .await;
    std::fs::write(&go, "").unwrap();
    for r in &runs {
        let o = w.await_finished(&db, *r, WITHIN).await;
        assert_eq!(o.status, "succeeded", "{o:?}");
    }
    let kinds: Vec<String> = sql
        .query(
            "SELECT string_agg(kind, ',' ORDER BY seq) FROM qlsched.run_events
              WHERE run_id = ANY ($1) GROUP BY run_id",
            &[&runs],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(
        kinds,
        vec!["run.created,run.queued,run.started,run.finished"; 4],
        "started in the take"
    );
    let instants: i64 = sql
        .query_one(
            "SELECT count(DISTINCT finished_at_ms) FROM qlsched.attempts WHERE run_id = ANY ($1)",
            &[&runs],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(instants, 1, "the four finished in one call");
    stop(&mut w).await;
    db.assert_invariants().await;
}
