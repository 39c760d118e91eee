//! Kernel-level network faults: replica `a` runs in a network namespace of the drill's own
//! and reaches PostgreSQL over a veth pair; replica `b` is direct. Taking the host end of
//! the pair down drops `a`'s packets in the kernel — nothing is reset, nothing answers, TCP
//! retransmits until the user timeout the daemon sets (half the lease) — which is what a VM
//! cut off from its database sees.
//!
//! - `netns_partition`: every admission is held at the server (a lock on `runs`) so that
//!   `a` sits with claimed leases and a delivered, unexecuted admission; the link goes down
//!   and stays down past the leases' database expiry; then the lock goes, `a`'s admission
//!   runs late and is fenced out (it writes nothing), and `b` takes the rows over. Measured:
//!   cut → `a`'s first logged error and first lost connection (against its TCP user timeout),
//!   heal → `a` reaching the server again (a new connection, or an admission) and its first
//!   admission.
//! - `netns_flapping`: the link goes down and up every few seconds; measured: the last heal
//!   → `a` reaching the server again and its first admission (the bar: two cadences).
//!
//! Both end with the invariant checker: 0 duplicates, 0 lost. They need root.

use std::time::{Duration, SystemTime};

use super::check::{self, Expect};
use super::partition::wait_taken_over_by;
use super::{db_now, exclusive, scalar, wait_all_admitting, Fleet, OwnPg, Params, Report};
use super::{tail, Rng, EVERY_SECOND};
use crate::helpers::netns::{require_root, NetNs};
use crate::helpers::wait_until;

const TRIGGERS: usize = 20;
/// The replicas' lease (ReplicaProc's default) and cadence (the built-in default).
const LEASE: Duration = Duration::from_secs(5);
const CADENCE_MS: i64 = 1000;

/// A PostgreSQL of the drill's own that listens on loopback and on the veth's host end,
/// trusts the namespace's address, and closes the backends of vanished clients within a few
/// seconds, as a production server should: keepalives for idle sockets, and a TCP user
/// timeout for replies the client never acknowledges (the defaults wait hours or about 15
/// minutes; the check at the end waits for the cut-off replica's backends to be gone).
pub(super) async fn pg_for(ns: &NetNs) -> OwnPg {
    let own = OwnPg::start(
        "netns",
        &format!(
            "listen_addresses = '127.0.0.1,{}'\ntcp_keepalives_idle = 2\n\
             tcp_keepalives_interval = 1\ntcp_keepalives_count = 2\ntcp_user_timeout = 3000\n",
            ns.host_ip
        ),
    )
    .await;
    let hba = own.server.data.join("pg_hba.conf");
    let mut text = std::fs::read_to_string(&hba).unwrap();
    text.push_str(&format!("host all all {}/32 trust\n", ns.ns_ip));
    std::fs::write(&hba, text).unwrap();
    own.db
        .superuser()
        .await
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .unwrap();
    own
}

/// Replica `a` inside the namespace, `b` direct, both admitting.
/// [`TRIGGERS`] every-second triggers on `own`, replicas started as [`start`] does, every
/// trigger admitting; a superuser session and the two fleets.
async fn admitting(ns: &NetNs, own: &OwnPg) -> (tokio_postgres::Client, Fleet, Fleet) {
    own.db.seed(TRIGGERS, EVERY_SECOND).await;
    let sql = own.db.superuser().await;
    let (inside, direct) = start(ns, own).await;
    wait_all_admitting(&sql, TRIGGERS as i64, Duration::from_secs(30)).await;
    (sql, inside, direct)
}

async fn start(ns: &NetNs, own: &OwnPg) -> (Fleet, Fleet) {
    let dsn = format!(
        "host={} port={} user=qlsched_runtime dbname=qlsched",
        ns.host_ip, own.db.port
    );
    let mut inside = Fleet::new(&dsn, "", &[]);
    inside.spawn_via(&ns.exec_prefix(), &ns.ns_ip.to_string(), "a");
    inside.wait_ready("a").await;
    let mut direct = Fleet::new(&own.db.dsn("qlsched_runtime"), "", &[]);
    direct.start(&["b"]).await;
    (inside, direct)
}

/// Database time at which `a` reached the server again after `after_ms`: its first new
/// backend (a connection made after the heal) or its first admission (over a connection
/// that survived a short cut), whichever comes first; fails with `a`'s log after 60 s.
async fn wait_reconnected_after(
    sql: &tokio_postgres::Client,
    ns: &NetNs,
    after_ms: i64,
    inside: &Fleet,
) -> i64 {
    let q = format!(
        "SELECT least(
           (SELECT min((extract(epoch FROM backend_start) * 1000)::bigint) FROM pg_stat_activity
             WHERE client_addr = '{}' AND backend_start >= to_timestamp({after_ms} / 1000.0)),
           (SELECT min(queued_at_ms) FROM qlsched.runs
             WHERE admitted_by = 'a' AND queued_at_ms > {after_ms}))",
        ns.ns_ip
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    loop {
        let at: Option<i64> = sql.query_one(q.as_str(), &[]).await.unwrap().get(0);
        if let Some(at) = at {
            return at;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a did not reach the server 60 s after the heal; log:\n{}",
            tail(&inside.get("a").log(), 30)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Database time of `a`'s first admission after `after_ms`, waiting at most `within` (the
/// other replica may win every claim for a while: it is not a connectivity matter).
async fn first_admission_after(
    sql: &tokio_postgres::Client,
    after_ms: i64,
    within: Duration,
) -> Option<i64> {
    let q = format!(
        "SELECT coalesce(min(queued_at_ms), 0) FROM qlsched.runs
          WHERE admitted_by = 'a' AND queued_at_ms > {after_ms}"
    );
    let deadline = std::time::Instant::now() + within;
    loop {
        let at = scalar(sql, &q).await;
        if at > 0 {
            return Some(at);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ms_after(at: Option<i64>, from: i64) -> String {
    at.map_or("none within 10 s".to_owned(), |t| format!("{}", t - from))
}

/// How a connection-level failure reads in the log: the socket gave up (TCP user timeout on
/// unacknowledged data, or keepalives), as opposed to the daemon's own statement bounds
/// (`admit_timeout`, the claim statement's bound), which usually fire first.
const CONNECTION_LOST: &[&str] = &[
    "connection closed",
    "connection lost",
    "Connection timed out",
];

/// Milliseconds from `since` to the first warning or worse in `log` stamped after it and
/// containing one of `needles` (any warning when empty).
fn first_error_after(log: &str, since: SystemTime, needles: &[&str]) -> Option<i64> {
    let since: chrono::DateTime<chrono::Utc> = since.into();
    log.lines()
        .filter(|l| needles.is_empty() || needles.iter().any(|n| l.contains(n)))
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| matches!(v["level"].as_str(), Some("WARN" | "ERRO" | "CRIT")))
        .filter_map(|v| {
            chrono::DateTime::parse_from_rfc3339(v["ts"].as_str()?)
                .ok()
                .map(|t| t.with_timezone(&chrono::Utc))
        })
        .find(|t| *t > since)
        .map(|t| (t - since).num_milliseconds())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_cut_off_at_the_kernel_notices_within_its_user_timeout_and_is_taken_over() {
    require_root("netns_partition");
    let _one = exclusive().await;
    let p = Params::from_env((1, 0), (5, 0));
    let mut report = Report::new(
        "netns_partition",
        &p,
        format!(
            "{} kernel partitions (veth down) of replica a while it holds leases, b direct, lease 5 s \
             (TCP user timeout 2.5 s), {TRIGGERS} every-second triggers",
            p.cycles
        ),
    );
    let ns = NetNs::create("p");
    let own = pg_for(&ns).await;
    let (sql, mut inside, mut direct) = admitting(&ns, &own).await;

    let mut expect = Expect::every_second();
    let (mut detect_ms, mut resume_ms, mut down_ms) = (Vec::new(), Vec::new(), Vec::new());
    let mut first_error_ms = Vec::new();
    let mut admit_ms = Vec::new();
    for cycle in 0..p.cycles {
        // Hold every admission at the server (a lock on runs), so that `a` sits with leases
        // claimed and its admission delivered but not executed when the link goes down.
        let mut locker = own.db.superuser().await;
        let lock = locker.transaction().await.unwrap();
        lock.batch_execute("LOCK TABLE qlsched.runs IN SHARE ROW EXCLUSIVE MODE")
            .await
            .unwrap();
        let waiting = format!(
            "SELECT count(*) FROM pg_stat_activity WHERE client_addr = '{}' AND wait_event_type = 'Lock'",
            ns.ns_ip
        );
        wait_until(
            "a's admission waiting at the server",
            Duration::from_secs(10),
            || async { scalar(&sql, &waiting).await > 0 },
        )
        .await;
        let cut_wall = SystemTime::now();
        ns.cut();
        let cut_at = db_now(&sql).await;
        let held = check::held_by(&sql, "a").await;
        assert!(!held.is_empty(), "a held no lease when it was cut off");
        // Past the leases' database expiry, a's admission runs — late — and must write
        // nothing; then b may take the rows over.
        let expiry = held.iter().map(|h| h.expires_at_ms).max().unwrap();
        wait_until("a's leases expired", Duration::from_secs(30), || async {
            db_now(&sql).await > expiry
        })
        .await;
        lock.rollback().await.unwrap();
        wait_taken_over_by(&sql, &held, "b", Duration::from_secs(30)).await;
        let log_a = || inside.get("a").log();
        wait_until(
            "a logged an error after the cut",
            Duration::from_secs(30),
            || async { first_error_after(&log_a(), cut_wall, &[]).is_some() },
        )
        .await;
        first_error_ms.push(first_error_after(&log_a(), cut_wall, &[]).unwrap());
        let healed_at = db_now(&sql).await;
        ns.heal();
        down_ms.push(healed_at - cut_at);
        resume_ms.push(wait_reconnected_after(&sql, &ns, healed_at, &inside).await - healed_at);
        admit_ms.push(ms_after(
            first_admission_after(&sql, healed_at, Duration::from_secs(10)).await,
            healed_at,
        ));
        // A connection the kernel gave up on shows only if a statement was waiting on it (the
        // daemon's own statement bounds usually fire first): `None` when none did.
        detect_ms.push(first_error_after(&log_a(), cut_wall, CONNECTION_LOST));
        expect.held.extend(held);
        if cycle + 1 < p.cycles {
            tokio::time::sleep(Duration::from_secs(2)).await;
        }
    }
    let fenced = inside
        .get("a")
        .metric("qlsched_fence_losses_total")
        .unwrap_or(0.0);
    let unknown = inside
        .get("a")
        .metric("qlsched_unknown_outcomes_total")
        .unwrap_or(0.0);
    inside.stop_all().await;
    direct.stop_all().await;
    report.note(format!(
        "cut → a's first warning (ms) {first_error_ms:?} · cut → a's first lost connection \
         (ms) {detect_ms:?} (TCP user timeout {} ms) · link down (ms) {down_ms:?} · heal → a reached the server again (ms) {resume_ms:?} · heal → a's first admission (ms) \
         {admit_ms:?} · a's fence losses {fenced} · \
         a's unknown outcomes {unknown}",
        LEASE.as_millis() / 2
    ));
    let f = report
        .finish_all(&[(&sql, &expect)], &[&inside, &direct])
        .await;
    assert_eq!(
        f.takeovers,
        expect.held.len() as i64,
        "every lease a held was taken over by b"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_link_loses_and_duplicates_nothing_and_the_replica_resumes() {
    require_root("netns_flapping");
    let _one = exclusive().await;
    // (flaps, unused): short form 3 flaps (~15 s), long form 12 (~1 min).
    let p = Params::from_env((3, 0), (12, 0));
    let mut rng = Rng::from_env();
    let mut report = Report::new(
        "netns_flapping",
        &p,
        format!(
            "{} flaps of a's veth link (down 2–4 s, up 1–3 s), b direct, lease 5 s, cadence 1 s, \
             {TRIGGERS} every-second triggers, seed {}",
            p.cycles, rng.0
        ),
    );
    let ns = NetNs::create("f");
    let own = pg_for(&ns).await;
    let (sql, mut inside, mut direct) = admitting(&ns, &own).await;

    let mut expect = Expect::every_second();
    let mut downs = Vec::new();
    let mut last_heal = 0;
    for _ in 0..p.cycles {
        ns.cut();
        let held = check::held_by(&sql, "a").await;
        let down = rng.millis(2000, 4000);
        tokio::time::sleep(down).await;
        ns.heal();
        last_heal = db_now(&sql).await;
        downs.push(down.as_millis() as u64);
        // Leases a held at a cut may be taken over (if the link stayed down past expiry) or
        // admitted by a itself afterwards; both are counted by the checker.
        expect.held.extend(held);
        tokio::time::sleep(rng.millis(1000, 3000)).await;
    }
    let resume = wait_reconnected_after(&sql, &ns, last_heal, &inside).await - last_heal;
    let admitted = ms_after(
        first_admission_after(&sql, last_heal, Duration::from_secs(10)).await,
        last_heal,
    );
    // Give a a few rounds of steady admitting before the final check.
    tokio::time::sleep(Duration::from_secs(3)).await;
    inside.stop_all().await;
    direct.stop_all().await;
    report.note(format!(
        "link down (ms) {downs:?} · last heal → a reached the server again {resume} ms, \
         → a's first admission {admitted} ms (two cadences = {} ms)",
        2 * CADENCE_MS
    ));
    report
        .finish_all(&[(&sql, &expect)], &[&inside, &direct])
        .await;
}
