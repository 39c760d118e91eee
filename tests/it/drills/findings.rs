//! Product bugs the drills found, each pinned by a small deterministic test (a regression
//! test once fixed; see docs/drills.md, "Findings").
//!
//! 1. (fixed in 9532409) The admission statement did not run inside its SERIALIZABLE
//!    transaction: `Client::query(ADMIT_SQL /* &str */, ..)` prepares first (one round
//!    trip), so the pipelined `COMMIT` reached the server before the statement's
//!    Bind/Execute, which then ran in its own implicit READ COMMITTED transaction. Found
//!    with the fault proxy.
//! 2. (fixed in df03a2c) The pool handed out connections whose backend was terminated, one
//!    per claim round: recovery after `pg_terminate_backend` took up to `pool_size`
//!    cadences instead of at most two. Found by the backend-termination drill.
//! 3. (fixed in df03a2c) A graceful stop that arrived while a claim round was in flight
//!    left that round's leases behind: `Drain` did not wait for the round, so
//!    `release_all_owned` ran before its claim committed. Found by the drills' "no claims
//!    left" check (clock-skew drill).
//! 4. (fixed in acdc9cd) A trigger that fell behind its schedule never caught up while its
//!    period was the cadence: each round admitted one occurrence per row and a round that
//!    did not fill the budget waited a whole cadence, so an every-second trigger 20 s
//!    behind stayed 20 s behind; delays added up (the standby drill: 17 → 32 → 47 s over
//!    three promotions) until the grace was crossed and `skip` dropped occurrences. Found
//!    by the standby-promotion drill's long form.
//! 5. (fixed in 20fc698) A SIGKILLed worker's commands ran on, orphaned in their own process
//!    group, beside the retry of their run. Pinned by the drill `worker_kill`.
//! 6. (fixed in 0655477) A worker cut off from the database stopped its commands after their
//!    lease had ended (patience counted from the heartbeat's answer, checked only after a
//!    failed heartbeat). Pinned by the drill `worker_netns`.

use std::time::Duration;

use qlsched::db;

use super::{scalar, wait_runtime_backends_gone, Stage};
use crate::helpers::{wait_until, TestDb};

/// Every admission must execute inside an explicit transaction block: the server's
/// ReadyForQuery before the admission's sync point must say `T`, not `I`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admission_statement_executes_inside_its_serializable_transaction() {
    let mut stage = Stage::through_proxy(3, "").await;
    stage.fleet.start(&["a"]).await;
    let proxy = stage.proxy.as_ref().unwrap();
    wait_until(
        "10 admissions through the proxy",
        Duration::from_secs(30),
        || async { proxy.stats().admissions >= 10 },
    )
    .await;
    stage.fleet.stop_all().await;
    let s = proxy.stats();
    assert_eq!(
        s.outside_transaction_block, 0,
        "of {} admissions, {} executed outside any transaction block (ReadyForQuery before \
         them said idle), {} inside: the admission is not the SERIALIZABLE transaction of docs/design.md \
         requires. `query(ADMIT_SQL /* &str */, ..)` prepares first (a round trip), so the \
         pipelined COMMIT reaches the server before the Bind/Execute.",
        s.admissions, s.outside_transaction_block, s.in_transaction_block
    );
}

/// The mechanism behind a slow recovery: the pool hands out idle connections whose backend
/// is gone (bb8 `test_on_check_out(false)`, and nothing checks `Client::is_closed`), so each
/// claim round after a termination can burn one cadence on one dead connection: with
/// `pool_size` 4, up to four cadences. Checking `is_closed()` at checkout costs no round
/// trip.
#[tokio::test]
async fn pooled_connections_whose_backend_was_terminated_are_not_handed_out() {
    let db = TestDb::new().await;
    let sql = db.superuser().await;
    let pool = db.runtime_pool(4);
    {
        let mut warm = Vec::new();
        for _ in 0..4 {
            warm.push(db::conn(&pool).await.unwrap());
        }
        for c in &warm {
            c.simple_query("SELECT 1").await.unwrap();
        }
    }
    assert_eq!(pool.state().idle_connections, 4);
    crate::helpers::terminate_backends(&sql, "usename = 'qlsched_runtime'").await;
    wait_runtime_backends_gone(
        &sql,
        "the terminated backends gone",
        Duration::from_secs(10),
    )
    .await;
    // Let the connection tasks read the FATAL message and the EOF the server sent.
    tokio::time::sleep(Duration::from_millis(200)).await;

    let mut failures = Vec::new();
    for i in 0..4 {
        let c = db::conn(&pool).await.unwrap();
        if let Err(e) = c.simple_query("SELECT 1").await {
            failures.push(format!("checkout {i}: {e}"));
        }
    }
    assert!(
        failures.is_empty(),
        "db::conn handed out connections whose backend was terminated (each costs a claim \
         round a cadence): {failures:?}"
    );
}

/// A graceful stop (SIGTERM) while a claim round is in flight must not leave that round's
/// leases behind. Made deterministic by a test-only trigger on `trigger_schedules` that
/// holds every claim statement for 600 ms per row.
#[tokio::test]
async fn a_graceful_stop_during_a_claim_round_leaves_no_lease_behind() {
    let mut stage = Stage::new(3, "").await;
    stage
        .sql
        .batch_execute(
            "CREATE FUNCTION qlsched.test_slow_claim() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.claim_owner IS NOT NULL AND OLD.claim_owner IS DISTINCT FROM NEW.claim_owner THEN
             PERFORM pg_sleep(0.6);
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER test_slow_claim BEFORE UPDATE ON qlsched.trigger_schedules
           FOR EACH ROW EXECUTE FUNCTION qlsched.test_slow_claim();
         -- A trigger function needs no EXECUTE grant to fire; `db check` refuses any.
         REVOKE EXECUTE ON FUNCTION qlsched.test_slow_claim() FROM PUBLIC;",
        )
        .await
        .unwrap();
    stage.fleet.start(&["a"]).await;
    wait_until(
        "a claim statement of replica a in flight",
        Duration::from_secs(30),
        || async {
            scalar(
                &stage.sql,
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND usename = 'qlsched_runtime'
                    AND wait_event = 'PgSleep'",
            )
            .await
                > 0
        },
    )
    .await;
    stage.fleet.stop_all().await;
    // The claim statement the replica left running finishes (or is rolled back) by itself.
    wait_runtime_backends_gone(
        &stage.sql,
        "replica a's backends gone",
        Duration::from_secs(30),
    )
    .await;
    let left = scalar(
        &stage.sql,
        "SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL",
    )
    .await;
    assert_eq!(
        left,
        0,
        "replica a exited cleanly (\"leases handed over\") but {left} leases are still its own; log:\n{}",
        stage.fleet.logs()
    );
}

/// docs/design.md (Actors): "a backlog drains at admission speed". An every-second trigger found 20 s behind
/// (all within its 60 s grace, so each occurrence fires) must be back on schedule within a
/// few seconds, not stay 20 s behind.
#[tokio::test]
async fn a_trigger_behind_its_schedule_catches_up_at_admission_speed() {
    let mut stage = Stage::new(1, "").await;
    crate::helpers::make_due_seconds_ago(&stage.sql, 20).await;
    stage.fleet.start(&["a"]).await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    let behind_ms = scalar(
        &stage.sql,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint - next_fire_at_ms
           FROM qlsched.trigger_schedules",
    )
    .await;
    let runs = scalar(&stage.sql, "SELECT count(*) FROM qlsched.runs").await;
    stage.fleet.stop_all().await;
    assert!(
        behind_ms < 3000,
        "after 6 s the trigger is still {behind_ms} ms behind its schedule ({runs} occurrences \
         admitted, one per cadence): a backlog of one trigger drains at the cadence, not at \
         admission speed"
    );
}
