//! The replica-id guard decides in the database: a claim round leases only while this
//! incarnation holds the guard row, and a stop hands leases over only while it does.

use std::time::Duration;

use qlsched::store::{self, claim, replicas};
use uuid::Uuid;

use crate::helpers::replica::ReplicaProc;
use crate::helpers::twin;
use crate::helpers::{wait_until, TestDb};

/// A yearly expression: nothing fires during a test.
const YEARLY: &str = "0 0 0 1 1 *";

/// Runs one claim round as the daemon does (prepared variant, guard terms) for `incarnation`.
async fn round(conn: &tokio_postgres::Client, incarnation: Uuid, ttl_ms: i64) -> claim::ClaimRound {
    let (variant, _) = claim::claim_variant(16);
    let stmt = conn.prepare(variant).await.unwrap();
    claim::claim_round(
        conn,
        &stmt,
        "twin",
        30_000,
        Uuid::new_v4(),
        claim::Extras {
            guard: Some((incarnation, ttl_ms)),
        },
    )
    .await
    .unwrap()
}

/// After another process took the id over, the old incarnation's rounds lease nothing under
/// the shared owner name (whether or not the round would also extend the guard), and say so;
/// the new holder's round leases the due rows.
#[tokio::test]
async fn a_claim_round_leases_nothing_once_its_guard_was_taken_over() {
    let db = TestDb::with_due(3).await;
    let pool = db.runtime_pool(2);
    let conn = store::conn(&pool).await.unwrap();
    let (old, new) = (Uuid::new_v4(), Uuid::new_v4());
    replicas::acquire(&conn, "twin", old, "host", 4242, 600_000)
        .await
        .unwrap();
    // The takeover (the old heartbeat lapsed): another incarnation holds the row.
    db.superuser()
        .await
        .execute(
            "UPDATE qlsched.replicas SET incarnation = $1 WHERE replica_id = 'twin'",
            &[&new],
        )
        .await
        .unwrap();
    for ttl in [0, 600_000] {
        let r = round(&conn, old, ttl).await;
        assert!(
            r.rows.is_empty(),
            "the old incarnation leased {} row(s) after losing the guard (ttl {ttl})",
            r.rows.len()
        );
        assert_eq!(r.guard_held, Some(false), "ttl {ttl}");
    }
    let r = round(&conn, new, 0).await;
    assert_eq!(r.rows.len(), 3, "the holder leases the due rows");
    assert_eq!(r.guard_held, Some(true));
}

/// A SIGTERM right after the guard was taken over, before any round of the old process has
/// seen it: the stop must not release the new incarnation's leases under the shared id, and
/// it is an error exit.
#[tokio::test]
async fn a_stop_right_after_the_guard_was_taken_over_releases_nothing() {
    let db = TestDb::new().await;
    db.seed(1, YEARLY).await;
    // A long lease: the guard is extended (and the loss noticed by a round) only every 10 s.
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "twin",
        "lease = \"30s\"\ncadence = \"5s\"",
        &[],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    twin::await_idle_schedule(&db, 1, Duration::from_secs(20)).await;
    twin::take_the_id(&db, "twin").await;
    let status = r.terminate(Duration::from_secs(20)).await;
    let held = twin::leases_held(&db, "twin").await;
    assert_eq!(
        held,
        1,
        "the stop released the new incarnation's lease; log:\n{}",
        r.log()
    );
    assert!(
        !status.success(),
        "a lost guard is an error exit: {status:?}"
    );
    assert!(r.log().contains("leaving every lease to it"), "{}", r.log());
}

/// `unshare --pid --fork --kill-child`: the replica runs as PID 1 of a new PID namespace, as
/// in a container, and dies with the `unshare` process.
fn in_new_pid_namespace() -> Vec<String> {
    ["unshare", "--pid", "--fork", "--kill-child"]
        .map(String::from)
        .to_vec()
}

/// Two containers with one host name and one replica id: the second process, in another
/// PID namespace, cannot see the first in its process table, but the first is alive (it has
/// sessions in the database), so the second is refused and the first keeps its id.
#[tokio::test]
async fn a_live_holder_in_another_pid_namespace_keeps_its_id() {
    let db = TestDb::new().await;
    db.seed(1, YEARLY).await;
    let dsn = db.dsn("qlsched_runtime");
    let mut first = ReplicaProc::spawn(&dsn, "shared", "", &[]);
    first.wait_ready(Duration::from_secs(30)).await;
    let holder = db
        .count("SELECT pid::bigint FROM qlsched.replicas WHERE replica_id = 'shared'")
        .await;
    let mut second = ReplicaProc::spawn_via(
        &in_new_pid_namespace(),
        "127.0.0.1",
        &dsn,
        "shared",
        "",
        &[],
    );
    let status = second.wait_exit(Duration::from_secs(30)).await;
    let log = second.log();
    assert!(!status.success(), "{status:?}: {log}");
    assert!(
        log.contains("replica id `shared` is held by a live process"),
        "{log}"
    );
    assert_eq!(
        db.count("SELECT pid::bigint FROM qlsched.replicas WHERE replica_id = 'shared'")
            .await,
        holder,
        "the guard row changed hands"
    );
    assert_eq!(first.get("/readyz").map(|r| r.0), Some(200));
    assert!(first.terminate(Duration::from_secs(20)).await.success());
}

/// A container killed and restarted: the new process is PID 1 again, like its dead
/// predecessor, on the same host name. The predecessor has no session left in the
/// database, so the id is taken over at once, not after the guard's TTL (30 s here).
#[tokio::test]
async fn a_restarted_container_takes_its_id_over_without_waiting_for_the_ttl() {
    let db = TestDb::new().await;
    db.seed(1, YEARLY).await;
    let dsn = db.dsn("qlsched_runtime");
    let toml = "lease = \"30s\"";
    let mut first =
        ReplicaProc::spawn_via(&in_new_pid_namespace(), "127.0.0.1", &dsn, "box", toml, &[]);
    first.wait_ready(Duration::from_secs(30)).await;
    assert_eq!(
        db.count("SELECT pid::bigint FROM qlsched.replicas WHERE replica_id = 'box'")
            .await,
        1,
        "the replica runs as PID 1 of its namespace"
    );
    first.kill();
    wait_until(
        "the killed replica's sessions are gone",
        Duration::from_secs(10),
        || async {
            db.count("SELECT count(*) FROM pg_stat_activity WHERE usename = 'qlsched_runtime' AND datname = current_database()")
                .await
                == 0
        },
    )
    .await;
    let t = std::time::Instant::now();
    let mut second =
        ReplicaProc::spawn_via(&in_new_pid_namespace(), "127.0.0.1", &dsn, "box", toml, &[]);
    second.wait_ready(Duration::from_secs(20)).await;
    assert!(
        db.count("SELECT expires_at_ms - heartbeat_at_ms FROM qlsched.replicas WHERE replica_id = 'box' AND stopped_at_ms IS NULL")
            .await
            > 0
    );
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    // (`unshare` ignores SIGTERM while it waits for its child: no graceful stop here.)
    second.kill();
}

/// The holder's database session is re-recorded whenever its backend pid *or start*
/// differs from the recorded one, and a recorded start that is NULL (unknown) never counts
/// as this session's. After a PostgreSQL restart a reconnected claim connection can get its
/// old pid again with a new start; were the stale start kept, a second process of the same
/// host name would judge the live holder's session gone and take its id.
#[tokio::test]
async fn a_claim_round_re_records_its_session_when_only_the_backend_start_differs() {
    let db = TestDb::new().await;
    db.seed(1, YEARLY).await;
    let holder = db.client("qlsched_runtime").await;
    let second = db.client("qlsched_runtime").await;
    let su = db.superuser().await;
    let live = Uuid::new_v4();
    replicas::acquire(&holder, "twin", live, "host", 4242, 600_000)
        .await
        .unwrap();
    for (case, stale) in [
        (
            "a start from before a restart",
            "session_started_at - interval '1 day'",
        ),
        ("an unknown (NULL) start", "NULL"),
    ] {
        // The recorded session as a restart leaves it: the holder's pid, another start.
        su.batch_execute(&format!(
            "UPDATE qlsched.replicas SET session_started_at = {stale} WHERE replica_id = 'twin'"
        ))
        .await
        .unwrap();
        // The holder's next round (no heartbeat due) on the same connection.
        assert_eq!(
            round(&holder, live, 0).await.guard_held,
            Some(true),
            "{case}"
        );
        let taken = replicas::acquire(&second, "twin", Uuid::new_v4(), "host", 4343, 600_000).await;
        assert!(
            matches!(taken, Err(replicas::GuardError::InUse { .. })),
            "{case}: a second process took the id of a live holder: {taken:?}"
        );
        assert_eq!(
            db.count(&format!(
                "SELECT count(*) FROM qlsched.replicas WHERE replica_id = 'twin' AND incarnation = '{live}'"
            ))
            .await,
            1,
            "{case}: the guard row changed hands"
        );
    }
}

/// A dead holder whose recorded backend pid now belongs to a session of a role that could
/// never hold the guard (here the zero-privilege worker_ingress, whose backend start the
/// runtime role cannot see): that session is not the holder's, so the id is taken over at
/// once instead of after the TTL.
#[tokio::test]
async fn a_dead_holder_whose_pid_another_role_reuses_is_taken_over_at_once() {
    let db = TestDb::new().await;
    db.seed(1, YEARLY).await;
    let successor = db.client("qlsched_runtime").await;
    let other = db.client("qlsched_worker_ingress").await;
    let reused: i32 = other
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    db.superuser()
        .await
        .execute(
            &format!(
                "INSERT INTO qlsched.replicas (replica_id, incarnation, hostname, pid, started_at_ms,
                                               heartbeat_at_ms, expires_at_ms, session_pid, session_started_at)
                 VALUES ('gone', gen_random_uuid(), 'host', 4242, {now}, {now}, {now} + 600000, $1,
                         now() - interval '1 hour')",
                now = qlsched::db_now_ms!()
            ),
            &[&reused],
        )
        .await
        .unwrap();
    let taken = replicas::acquire(&successor, "gone", Uuid::new_v4(), "host", 4343, 600_000).await;
    assert!(
        taken.is_ok(),
        "a dead holder whose pid another role's session reuses kept its id: {taken:?}"
    );
}
