//! Connecting the way deployments do (docs/design.md, "Connecting"): a Unix socket
//! directory under every `sslmode`, peer authentication, several hosts of which the first is
//! dead, and libpq's environment.

use std::process::Command;
use std::time::{Duration, Instant};

use crate::helpers::cli::{ok, stderr};
use crate::helpers::deadhost::{SynDrop, Tarpit};
use crate::helpers::pg::{run_as, Server};
use crate::helpers::replica::{binary, ReplicaProc};
use crate::helpers::{cluster, wait_until, TestDb};

/// The key=value DSN of `user` on `db` through the test cluster's socket directory.
fn socket_dsn(db: &TestDb, user: &str, extra: &str) -> String {
    format!(
        "host={} port={} user={user} dbname={} {extra}",
        cluster().root.display(),
        db.port,
        db.name
    )
}

/// `qlsched <args>` with nothing from the environment but what `env` sets.
fn ql_with(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .env_remove("QLSCHED_DSN")
        .env_remove("PGPASSWORD")
        .env("PGPASSFILE", "/nonexistent/pgpass")
        .env("USER", "tester");
    for v in ["PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGSSLMODE"] {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("run qlsched")
}

#[tokio::test]
async fn every_command_connects_over_a_unix_socket_under_every_sslmode() {
    let db = TestDb::new().await;
    // The owner's commands.
    for mode in ["disable", "prefer", "require", "verify-ca", "verify-full"] {
        let owner = socket_dsn(&db, "qlsched_owner", &format!("sslmode={mode}"));
        ok(ql_with(&["db", "migrate", "--dsn", &owner], &[]));
        ok(ql_with(&["db", "check", "--dsn", &owner], &[]));
    }
    // An operator's day, one sslmode per command, key=value and URL forms (`%2F`).
    let admin = |mode: &str| socket_dsn(&db, "qlsched_admin", &format!("sslmode={mode}"));
    let url = format!(
        "postgresql://qlsched_admin@{}:{}/{}?sslmode=verify-full",
        cluster().root.display().to_string().replace('/', "%2F"),
        db.port,
        db.name
    );
    let now = chrono::Utc::now();
    let from = (now - chrono::Duration::minutes(10)).to_rfc3339();
    let to = (now - chrono::Duration::minutes(1)).to_rfc3339();
    let steps: Vec<(Vec<&str>, String)> = vec![
        (vec!["project", "set", "--id", "p"], admin("require")),
        (
            vec![
                "task",
                "publish",
                "--project",
                "p",
                "--id",
                "t",
                "--spec",
                "{}",
            ],
            admin("verify-full"),
        ),
        (
            vec![
                "trigger",
                "publish",
                "--id",
                "s1",
                "--project",
                "p",
                "--task",
                "t",
                "--cron",
                "* * * * *",
            ],
            admin("verify-ca"),
        ),
        (vec!["trigger", "list"], url.clone()),
        (vec!["trigger", "show", "s1"], admin("prefer")),
        (
            vec!["trigger", "fire", "s1", "--request-id", "r1"],
            url.clone(),
        ),
        (vec!["trigger", "disable", "s1"], admin("disable")),
        (vec!["trigger", "enable", "s1"], admin("require")),
        (
            vec!["trigger", "backfill", "s1", "--from", &from, "--to", &to],
            admin("verify-full"),
        ),
        (vec!["status"], url.clone()),
        (vec!["runs", "list"], admin("require")),
    ];
    for (args, dsn) in steps {
        let mut all = args.clone();
        all.extend(["--dsn", &dsn]);
        ok(ql_with(&all, &[]));
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 's1'")
            .await,
        1 + 9,
        "one fire and nine backfilled minutes"
    );
}

#[tokio::test]
async fn libpq_environment_alone_reaches_the_database_and_its_sslmode_is_kept() {
    let db = TestDb::new().await;
    let root = cluster().root.display().to_string();
    let port = db.port.to_string();
    let env = [
        ("PGHOST", root.as_str()),
        ("PGPORT", port.as_str()),
        ("PGUSER", "qlsched_admin"),
        ("PGDATABASE", db.name.as_str()),
        ("PGSSLMODE", "require"),
    ];
    // No DSN at all: the environment is the target (over the socket, TLS is not spoken).
    ok(ql_with(&["trigger", "list"], &env));
    // Over TCP the same PGSSLMODE=require is enforced, not weakened to prefer: the test
    // cluster has no TLS, so the command must refuse.
    let tcp = [
        ("PGHOST", "127.0.0.1"),
        ("PGPORT", port.as_str()),
        ("PGUSER", "qlsched_admin"),
        ("PGDATABASE", db.name.as_str()),
        ("PGSSLMODE", "require"),
    ];
    let out = ql_with(&["trigger", "list"], &tcp);
    assert_eq!(out.status.code(), Some(1), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("did not offer TLS"),
        "{}",
        stderr(&out)
    );
    // The DSN wins over the environment, keyword by keyword.
    let dsn = format!("host=127.0.0.1 sslmode=disable dbname={}", db.name);
    ok(ql_with(&["trigger", "list", "--dsn", &dsn], &tcp));
}

#[tokio::test]
async fn a_replica_runs_over_a_unix_socket_with_sslmode_require() {
    let db = TestDb::new().await;
    db.seed(3, "* * * * * *").await;
    let dsn = socket_dsn(&db, "qlsched_runtime", "sslmode=require");
    let mut r = ReplicaProc::spawn(&dsn, "sock", "", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    wait_until(
        "runs admitted over the socket",
        Duration::from_secs(20),
        || async {
            db.count("SELECT count(DISTINCT trigger_id) FROM qlsched.runs")
                .await
                == 3
        },
    )
    .await;
    let over_socket = db
        .count(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND usename = 'qlsched_runtime'
                AND client_port = -1",
        )
        .await;
    assert!(
        over_socket >= 2,
        "{over_socket} runtime sessions over the socket"
    );
    let status = r.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}; log:\n{}", r.log());
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_first_host_that_drops_packets_costs_one_connect_timeout() {
    let db = TestDb::new().await;
    let dead = SynDrop::start();
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=qlsched_admin dbname={} connect_timeout=2",
        dead.port, db.port, db.name
    );
    let started = Instant::now();
    let out =
        tokio::task::spawn_blocking(move || ql_with(&["trigger", "list", "--dsn", &dsn], &[]))
            .await
            .unwrap();
    let took = started.elapsed();
    ok(out);
    // The dead host was tried first and given up after its 2 s; a stalled connect would
    // wait for the kernel's SYN retries (over two minutes).
    assert!(
        took >= Duration::from_secs(2) && took < Duration::from_secs(20),
        "took {took:?}"
    );
}

#[tokio::test]
async fn after_the_first_connection_a_replica_goes_to_the_good_host_first() {
    let db = TestDb::new().await;
    db.seed(2, "* * * * * *").await;
    let hung = Tarpit::start().await;
    let dsn = format!(
        "host=127.0.0.1,127.0.0.1 port={},{} user=qlsched_runtime dbname={} connect_timeout=2",
        hung.port, db.port, db.name
    );
    let mut r = ReplicaProc::spawn(&dsn, "failover", "", &[]);
    r.wait_ready(Duration::from_secs(60)).await;
    wait_until("runs admitted", Duration::from_secs(20), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 2
    })
    .await;
    let tried_before = hung.accepted();
    assert!(tried_before >= 1, "the hung first host was never tried");
    // Every backend of the replica goes away; it reconnects, to the good host directly.
    let backends = "SELECT count(*) FROM pg_stat_activity
                     WHERE datname = current_database() AND usename = 'qlsched_runtime'";
    let killed =
        crate::helpers::terminate_backends(&db.superuser().await, "usename = 'qlsched_runtime'")
            .await;
    assert!(killed >= 2, "{killed} backends terminated");
    let runs = db.count("SELECT count(*) FROM qlsched.runs").await;
    wait_until(
        "admissions after the reconnect",
        Duration::from_secs(30),
        || async {
            db.count("SELECT count(*) FROM qlsched.runs").await >= runs + 4
                && db.count(backends).await >= 2
        },
    )
    .await;
    assert_eq!(
        hung.accepted(),
        tried_before,
        "a reconnect went to the hung host again"
    );
    let status = r.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}; log:\n{}", r.log());
    db.assert_invariants().await;
}

/// Debian's documented bootstrap: the `postgres` OS user over the socket with peer
/// authentication (`runuser -u postgres -- qlsched db bootstrap …`).
#[tokio::test]
async fn db_bootstrap_works_over_the_socket_with_peer_authentication() {
    let root = crate::drills::own_root("peer");
    let mut server = Server::init(&root, "");
    // Peer only on the socket; the OS user is mapped to the `postgres` role.
    let os_user = match run_as() {
        Some(_) => "postgres".to_string(),
        None => std::env::var("USER").expect("USER"),
    };
    std::fs::write(
        server.data.join("pg_hba.conf"),
        "local all all peer map=qlsched\nhost all all 127.0.0.1/32 trust\n",
    )
    .unwrap();
    std::fs::write(
        server.data.join("pg_ident.conf"),
        format!("qlsched {os_user} postgres\n"),
    )
    .unwrap();
    server.start();
    // The binary where the postgres user can run it (a checkout may sit in a private dir).
    let dir = tempfile::Builder::new()
        .prefix("qlsched-bin")
        .tempdir()
        .unwrap();
    let bin = dir.path().join("qlsched");
    std::fs::copy(binary(), &bin).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let dsn = format!(
        "host={} port={} user=postgres dbname=postgres",
        root.display(),
        server.port
    );
    let mut cmd = match run_as() {
        Some(_) => {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&bin);
            c
        }
        None => Command::new(&bin),
    };
    let out = cmd
        .args(["db", "bootstrap", "--superuser-dsn", &dsn])
        .current_dir("/")
        .env_remove("PGPASSWORD")
        .output()
        .unwrap();
    ok(out);
    let c = qlsched::db::connect(&crate::helpers::pg_config(
        server.port,
        "postgres",
        "postgres",
    ))
    .await
    .unwrap();
    let roles: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_roles WHERE rolname IN
               ('qlsched_owner', 'qlsched_admin', 'qlsched_runtime', 'qlsched_worker_ingress')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(roles, 4);
    let dbs: i64 = c
        .query_one(
            "SELECT count(*) FROM pg_database WHERE datname = 'qlsched'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(dbs, 1);
    drop(c);
    server.stop("fast");
    let _ = std::fs::remove_dir_all(&root);
}
