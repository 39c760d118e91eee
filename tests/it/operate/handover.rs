//! Graceful hand-over (SIGTERM) against crash takeover (SIGKILL), timed by the database clock.
//!
//! Arrangement: replica `a` (budget 16) holds 16 leases it cannot admit, because a superuser
//! transaction holds `qlsched.runs` locked (claims go on, admissions wait); replica `b`
//! (budget 64), started after that, holds the other 34 rows and has room for more. Then `a`
//! is stopped. A trigger on the schedule table records every lease change with the database
//! time of its statement, so the moment `b` claimed each of `a`'s rows is exact however fast
//! the admission that follows it.

use std::time::Duration;

use super::{count, RunsLock, BACKENDS_OF, LEASES_OF, RUNS_ADMITTED_BY};
use crate::helpers::db_now_ms;
use crate::helpers::replica::ReplicaProc;
use crate::helpers::{poll_until, wait_until, TestDb};

const LEASE_MS: i64 = 10_000;
const DRAIN_MS: i64 = 2_000;
const TRIGGERS: usize = 50;
const A_BUDGET: usize = 16;
const B_BUDGET: usize = 64;

const LEASE_HISTORY: &str = "
CREATE TABLE public.lease_history (
    seq bigserial PRIMARY KEY, trigger_id text NOT NULL,
    old_owner text, new_owner text, at_ms bigint NOT NULL);
CREATE FUNCTION public.record_lease_change() RETURNS trigger
    LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog AS $$
BEGIN
    IF NEW.claim_token IS DISTINCT FROM OLD.claim_token THEN
        INSERT INTO public.lease_history (trigger_id, old_owner, new_owner, at_ms)
        VALUES (NEW.trigger_id, OLD.claim_owner, NEW.claim_owner, NEW.updated_at_ms);
    END IF;
    RETURN NULL;
END $$;
CREATE TRIGGER record_lease_change AFTER UPDATE ON qlsched.trigger_schedules
    FOR EACH ROW EXECUTE FUNCTION public.record_lease_change();";

struct Arranged {
    db: TestDb,
    su: tokio_postgres::Client,
    a: ReplicaProc,
    b: ReplicaProc,
    lock: RunsLock,
    /// `a`'s leases: (trigger id, expiry in database ms), by trigger id.
    held: Vec<(String, i64)>,
}

fn replica(dsn: &str, id: &str, budget: usize) -> ReplicaProc {
    let toml = format!(
        "lease = \"{LEASE_MS}ms\"\nadmit_timeout = \"8s\"\ndrain = \"{DRAIN_MS}ms\"\n\
         claim_budget = {budget}"
    );
    let app = format!("handover-{id}");
    ReplicaProc::spawn(
        dsn,
        id,
        &toml,
        &[("QLSCHED__DATABASE__APPLICATION_NAME", &app)],
    )
}

async fn arrange() -> Arranged {
    let db = TestDb::new().await;
    db.seed(TRIGGERS, "* * * * * *").await;
    let su = db.superuser().await;
    su.batch_execute(LEASE_HISTORY).await.unwrap();
    let dsn = db.dsn("qlsched_runtime");
    let mut a = replica(&dsn, "a", A_BUDGET);
    a.wait_ready(Duration::from_secs(30)).await;
    wait_until(
        "a admits every trigger",
        Duration::from_secs(30),
        || async { count(&su, RUNS_ADMITTED_BY, "a").await >= TRIGGERS as i64 },
    )
    .await;

    let lock = RunsLock::take(&db).await;
    wait_until(
        "a holds its whole budget",
        Duration::from_secs(15),
        || async { count(&su, LEASES_OF, "a").await == A_BUDGET as i64 },
    )
    .await;
    let mut b = replica(&dsn, "b", B_BUDGET);
    b.wait_ready(Duration::from_secs(30)).await;
    wait_until(
        "b holds every other row",
        Duration::from_secs(15),
        || async { count(&su, LEASES_OF, "b").await == (TRIGGERS - A_BUDGET) as i64 },
    )
    .await;
    let held: Vec<(String, i64)> = crate::helpers::pairs(
        &su,
        "SELECT trigger_id, claim_expires_at_ms FROM qlsched.trigger_schedules
              WHERE claim_owner = 'a' ORDER BY trigger_id",
    )
    .await;
    assert_eq!(held.len(), A_BUDGET);
    Arranged {
        db,
        su,
        a,
        b,
        lock,
        held,
    }
}

/// When `b` first claimed each of `held` at or after `t0`, by trigger id; waits until it has
/// claimed them all.
async fn claimed_by_b(
    su: &tokio_postgres::Client,
    t0: i64,
    held: &[(String, i64)],
    within: Duration,
) -> Vec<i64> {
    let ids: Vec<&str> = held.iter().map(|(id, _)| id.as_str()).collect();
    poll_until("b claims every row a held", within, || async {
        let rows = su
            .query(
                "SELECT trigger_id, min(at_ms) FROM public.lease_history
                  WHERE new_owner = 'b' AND at_ms >= $1 AND trigger_id = ANY($2)
                  GROUP BY trigger_id ORDER BY trigger_id",
                &[&t0, &ids],
            )
            .await
            .unwrap();
        (rows.len() == ids.len()).then(|| rows.iter().map(|r| r.get(1)).collect())
    })
    .await
}

/// The last time at or after `t0` that `a` itself gave one of `held` back (None: it never did).
async fn released_by_a(
    su: &tokio_postgres::Client,
    t0: i64,
    held: &[(String, i64)],
) -> Option<i64> {
    let ids: Vec<&str> = held.iter().map(|(id, _)| id.as_str()).collect();
    su.query_one(
        "SELECT max(at_ms) FROM public.lease_history
          WHERE old_owner = 'a' AND new_owner IS NULL AND at_ms >= $1 AND trigger_id = ANY($2)",
        &[&t0, &ids],
    )
    .await
    .unwrap()
    .get(0)
}

/// `b` goes on admitting once it is unblocked; it stops cleanly; the invariants hold.
async fn finish(mut x: Arranged) {
    let before = count(&x.su, RUNS_ADMITTED_BY, "b").await;
    wait_until("b admits again", Duration::from_secs(30), || async {
        count(&x.su, RUNS_ADMITTED_BY, "b").await >= before + TRIGGERS as i64
    })
    .await;
    let status = x.b.terminate(Duration::from_secs(30)).await;
    assert!(status.success(), "exit {status}; log:\n{}", x.b.log());
    x.db.assert_invariants().await;
}

/// (first, last) of `ms` relative to `t0`.
fn span(ms: impl Iterator<Item = i64> + Clone, t0: i64) -> (i64, i64) {
    (ms.clone().min().unwrap() - t0, ms.max().unwrap() - t0)
}

#[tokio::test]
async fn after_sigterm_another_replica_takes_the_leases_over_well_before_they_expire() {
    let mut x = arrange().await;

    let t0 = db_now_ms(&x.su).await;
    x.a.signal(libc::SIGTERM);
    // The stop is bounded by the drain even while an admission is stuck.
    let status = x.a.wait_exit(Duration::from_secs(20)).await;
    assert!(status.success(), "exit {status}; log:\n{}", x.a.log());
    assert!(x.a.log().contains("leases handed over"), "{}", x.a.log());
    // b's admissions are still blocked: only the hand-over can have freed a's rows.
    let claimed = claimed_by_b(&x.su, t0, &x.held, Duration::from_secs(20)).await;
    let released = released_by_a(&x.su, t0, &x.held).await;

    let taken = span(claimed.iter().copied(), t0);
    let expiry = span(x.held.iter().map(|h| h.1), t0);
    println!(
        "SIGTERM hand-over: a held {A_BUDGET} leases, released them {:?} ms after the signal; \
         b claimed them {}..{} ms after the signal (they would have expired {}..{} ms after; \
         lease {LEASE_MS} ms, drain {DRAIN_MS} ms, cadence 1000 ms)",
        released.map(|r| r - t0),
        taken.0,
        taken.1,
        expiry.0,
        expiry.1
    );
    assert!(released.is_some(), "a released none of its leases");
    assert!(
        taken.1 < LEASE_MS / 2,
        "hand-over took {} ms, not under lease/2",
        taken.1
    );
    for (at, (id, expires)) in claimed.iter().zip(&x.held) {
        assert!(at < expires, "{id} was taken over only at expiry");
    }
    x.lock.release().await;
    finish(x).await;
}

#[tokio::test]
async fn after_sigkill_another_replica_takes_the_leases_over_only_once_they_expire() {
    let mut x = arrange().await;

    let t0 = db_now_ms(&x.su).await;
    x.a.kill();
    // The dead process's backend, blocked on the lock, would still run its pipelined COMMIT
    // once the lock goes (fenced, so harmless, but it would end one lease early). Cut it, as
    // TCP keepalive eventually does for a dead host.
    crate::helpers::terminate_backends(&x.su, "application_name = 'handover-a'").await;
    wait_until(
        "the killed replica's backends are gone",
        Duration::from_secs(10),
        || async { count(&x.su, BACKENDS_OF, "handover-a").await == 0 },
    )
    .await;
    // b admits again; a's rows stay leased to the dead replica until they expire.
    x.lock.release().await;
    let last_expiry = x.held.iter().map(|h| h.1).max().unwrap();
    let within = Duration::from_millis((last_expiry - t0).max(0) as u64 + 20_000);
    let claimed = claimed_by_b(&x.su, t0, &x.held, within).await;
    let released = released_by_a(&x.su, t0, &x.held).await;

    let taken = span(claimed.iter().copied(), t0);
    let expiry = span(x.held.iter().map(|h| h.1), t0);
    println!(
        "SIGKILL takeover: a held {A_BUDGET} leases; b claimed them {}..{} ms after the kill \
         (they expired {}..{} ms after; lease {LEASE_MS} ms, cadence 1000 ms)",
        taken.0, taken.1, expiry.0, expiry.1
    );
    assert_eq!(released, None, "a killed replica gave leases back");
    for (at, (id, expires)) in claimed.iter().zip(&x.held) {
        assert!(
            at >= expires,
            "{id} was taken over before its lease expired"
        );
    }
    finish(x).await;
}
