//! The replica's lifecycle against the real binary: readiness follows the database and the
//! supervisor, a lost replica-id guard leaves the new incarnation's leases alone, the shipped
//! defaults name the real routes, and every JSON log line has unique keys.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::helpers::replica::ReplicaProc;
use crate::helpers::twin;
use crate::helpers::{poll_until, wait_until, TestDb};

/// A yearly expression: nothing fires during a test.
const YEARLY: &str = "0 0 0 1 1 *";

/// `/readyz` turns 503 once claim rounds have failed for longer than one lease (the database
/// refuses the replica's connections), and 200 again at the first successful round.
#[tokio::test]
async fn readyz_follows_the_database() {
    let db = TestDb::new().await;
    db.seed(2, "* * * * * *").await;
    let su = db.superuser().await;
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "ready-db",
        "lease = \"5s\"\ncadence = \"200ms\"\nadmit_timeout = \"1s\"",
        &[],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    let name = &db.name;
    su.batch_execute(&format!(
        "REVOKE CONNECT ON DATABASE \"{name}\" FROM PUBLIC;
         SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = '{name}' AND usename = 'qlsched_runtime';"
    ))
    .await
    .unwrap();
    // A connection still authenticating during that sweep (no user shown yet) survives the
    // REVOKE: sweep again until readiness follows.
    let sweep = format!(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity
          WHERE datname = '{name}' AND usename = 'qlsched_runtime'"
    );
    poll_until("/readyz turns 503", Duration::from_secs(20), || {
        let res = r.get("/readyz").filter(|(s, _)| *s == 503);
        let (su, sweep) = (&su, &sweep);
        async move {
            if res.is_none() {
                su.batch_execute(sweep).await.unwrap();
            }
            res
        }
    })
    .await;
    assert_eq!(r.get("/healthz").map(|x| x.0), Some(200));
    su.batch_execute(&format!("GRANT CONNECT ON DATABASE \"{name}\" TO PUBLIC"))
        .await
        .unwrap();
    poll_until("/readyz is 200 again", Duration::from_secs(20), || {
        let res = r.get("/readyz").filter(|(s, _)| *s == 200);
        async move { res }
    })
    .await;
    let status = r.terminate(Duration::from_secs(20)).await;
    assert!(status.success(), "{status:?}");
    assert_keys_unique(&r.log());
}

/// A supervisor that panics is not left dead behind a 200 `/readyz`: the process withdraws
/// readiness and exits non-zero, so systemd restarts it.
#[tokio::test]
async fn a_panicking_supervisor_makes_the_replica_exit_non_zero() {
    let db = TestDb::new().await;
    db.seed(1, YEARLY).await;
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "panics",
        "cadence = \"200ms\"",
        &[("QLSCHED_FAULTS", "supervisor_panic_at=10")],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    let status = r.wait_exit(Duration::from_secs(20)).await;
    assert!(!status.success(), "exited with {status:?}");
    let log = r.log();
    assert!(
        log.contains("the scheduler supervisor stopped unexpectedly"),
        "{log}"
    );
}

/// After another process took this replica id over (this one's heartbeat lapsed), stopping
/// releases nothing: the leases under the id belong to the new incarnation.
#[tokio::test]
async fn a_replica_that_lost_its_guard_leaves_the_new_incarnations_leases_alone() {
    let db = TestDb::new().await;
    db.seed(1, YEARLY).await;
    let mut r = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "twin", "lease = \"6s\"", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    twin::await_idle_schedule(&db, 1, Duration::from_secs(10)).await;
    // The new incarnation takes the id and holds a lease under it.
    twin::take_the_id(&db, "twin").await;
    let status = r.wait_exit(Duration::from_secs(20)).await;
    assert!(
        !status.success(),
        "a lost guard is an error exit: {status:?}"
    );
    let held = twin::leases_held(&db, "twin").await;
    assert_eq!(held, 1, "the new incarnation's lease was released");
    assert!(r.log().contains("leaving every lease to it"), "{}", r.log());
}

/// Every route the shipped defaults name is served.
#[tokio::test]
async fn the_routes_named_in_the_default_config_are_served() {
    let defaults = include_str!("../../config/default.toml");
    let named: Vec<&str> = defaults
        .split(|c: char| c.is_whitespace() || c == ',' || c == '(' || c == ')')
        .map(|w| w.trim_end_matches(['.', ':', ';']))
        .filter(|w| {
            w.starts_with('/') && w.len() > 1 && w[1..].chars().all(|c| c.is_ascii_lowercase())
        })
        .collect();
    assert!(
        named.len() >= 3,
        "the [http] comment names the routes: {named:?}"
    );
    let db = TestDb::new().await;
    let mut r = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "routes", "", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    for route in named {
        let (status, _) = r.get(route).expect("an HTTP answer");
        assert_eq!(status, 200, "{route}");
    }
    r.terminate(Duration::from_secs(20)).await;
}

/// Parses every line of a JSON log and fails on a line that is not JSON or repeats a key.
pub fn assert_keys_unique(log: &str) {
    let mut lines = 0;
    for line in log.lines().filter(|l| l.starts_with('{')) {
        let mut de = serde_json::Deserializer::from_str(line);
        let keys = match <UniqueKeys as serde::Deserialize>::deserialize(&mut de) {
            Ok(UniqueKeys(keys)) => keys,
            Err(e) => panic!("log line with a repeated key or not JSON ({e}): {line}"),
        };
        assert!(keys.contains_key("msg"), "{line}");
        lines += 1;
    }
    assert!(lines > 5, "only {lines} JSON log lines");
}

/// A JSON object whose keys must be unique.
struct UniqueKeys(BTreeMap<String, serde_json::Value>);

impl<'de> serde::Deserialize<'de> for UniqueKeys {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = UniqueKeys;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object with unique keys")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut m: A,
            ) -> Result<UniqueKeys, A::Error> {
                let mut out = BTreeMap::new();
                while let Some((k, v)) = m.next_entry::<String, serde_json::Value>()? {
                    if out.contains_key(&k) {
                        return Err(serde::de::Error::custom(format!("key `{k}` twice")));
                    }
                    out.insert(k, v);
                }
                Ok(UniqueKeys(out))
            }
        }
        d.deserialize_map(V)
    }
}

/// A replica admitting at debug level writes JSON lines whose keys never repeat (a child
/// logger never re-adds a key its parent set).
#[tokio::test]
async fn every_json_log_line_of_an_admitting_replica_has_unique_keys() {
    let db = TestDb::new().await;
    db.seed(3, "* * * * * *").await;
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "keys",
        "cadence = \"200ms\"",
        &[],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    wait_until("admissions", Duration::from_secs(20), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 6
    })
    .await;
    r.terminate(Duration::from_secs(20)).await;
    let log = r.log();
    assert_keys_unique(&log);
    assert!(
        log.contains("\"actor\":\"admit\""),
        "no admit-actor line: {log}"
    );
    assert!(
        log.contains("\"actor\":\"claim\""),
        "no claim-actor line: {log}"
    );
}

/// HTTP that cannot be bound (the port is taken) stops the replica the way a signal does:
/// drained, leases handed over and the guard retired (the id free at once), then exit 1
/// naming the address.
#[tokio::test]
async fn an_http_bind_error_still_hands_leases_over_and_retires_the_guard() {
    let db = TestDb::new().await;
    db.seed(3, "* * * * * *").await;
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "unbound",
        "cadence = \"200ms\"",
        &[("QLSCHED__HTTP__BIND", &addr)],
    );
    let status = r.wait_exit(Duration::from_secs(30)).await;
    let log = r.log();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains(&format!("binding HTTP on {addr}")), "{log}");
    let retired = db
        .count("SELECT count(*) FROM qlsched.replicas WHERE replica_id = 'unbound' AND stopped_at_ms IS NOT NULL")
        .await;
    assert_eq!(retired, 1, "the guard was not retired; log:\n{log}");
    let held = db
        .count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner = 'unbound'")
        .await;
    assert_eq!(held, 0, "leases left behind; log:\n{log}");
    drop(taken);
}
