//! The actor system in-process on a real database: budget, catch-up, non-overlapping
//! rounds, bounded drain, admit-actor restart, and two independent pools racing.

use std::time::{Duration, Instant};

use actix::prelude::*;
use qlsched::actors::admit::Stop;
use qlsched::actors::supervisor::{Drain, Probe, Supervisor};
use qlsched::actors::Settings;
use qlsched::db;
use qlsched::health::Health;
use qlsched::metrics::Metrics;
use qlsched::store::{self, release};

use crate::helpers::claimed::Claimed;
use crate::helpers::{discard_log, wait_until, TestDb};

/// A yearly expression: each seeded row fires exactly once during a test.
const ONCE: &str = "0 0 0 1 1 *";

/// `n` due rows and a replica (cadence 100 ms) started while a superuser transaction holds
/// `qlsched.{table}` locked ACCESS EXCLUSIVE; a ROLLBACK on the returned session releases it.
async fn stuck_on(
    n: usize,
    table: &str,
) -> (TestDb, tokio_postgres::Client, Addr<Supervisor>, Metrics) {
    let db = TestDb::new().await;
    db.seed_bulk(n, ONCE, -1000).await;
    let blocker = db.superuser().await;
    blocker
        .batch_execute(&format!(
            "BEGIN; LOCK TABLE qlsched.{table} IN ACCESS EXCLUSIVE MODE"
        ))
        .await
        .unwrap();
    let (sup, metrics) = start(&db, db.settings("a", 100, 30_000));
    (db, blocker, sup, metrics)
}

/// One due every-second row whose cursor never moves: a trigger on the schedule table
/// swallows every update of `next_fire_at_ms`, so each admission of the row is refused for a
/// reason the re-read does not find (`Unexplained`).
async fn cursor_never_moves() -> TestDb {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    db.make_due(-100).await;
    db.superuser()
        .await
        .batch_execute(
            "CREATE FUNCTION qlsched.swallow() RETURNS trigger LANGUAGE plpgsql AS
               $$ BEGIN RETURN NULL; END $$;
             CREATE TRIGGER swallow BEFORE UPDATE ON qlsched.trigger_schedules
               FOR EACH ROW WHEN (OLD.next_fire_at_ms IS DISTINCT FROM NEW.next_fire_at_ms)
               EXECUTE FUNCTION qlsched.swallow();",
        )
        .await
        .unwrap();
    db
}

fn start(_db: &TestDb, s: Settings) -> (Addr<Supervisor>, Metrics) {
    let metrics = Metrics::default();
    let sup = Supervisor::new(s, metrics.clone(), &discard_log(), None, Health::default()).start();
    (sup, metrics)
}

async fn runs(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM qlsched.runs").await
}

/// With budget 16, 1,000 due rows are never more than 16 leased at once, and they are all
/// admitted within the first cadence (60 s): the budget bounds each round, not the rate. Each
/// round's decisions are admitted together, in one statement.
#[actix_rt::test]
async fn the_budget_bounds_each_round_and_a_backlog_drains_without_waiting_for_the_cadence() {
    let db = TestDb::new().await;
    db.seed_bulk(1000, ONCE, -1000).await;
    let started = Instant::now();
    let (sup, metrics) = start(&db, db.settings("a", 60_000, 30_000));
    let (mut max_claimed, mut max_live) = (0, 0);
    let deadline = Instant::now() + Duration::from_secs(60);
    while runs(&db).await < 1000 {
        let claimed = db
            .count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner = 'a'")
            .await;
        let live = sup.send(Probe).await.unwrap().live;
        max_claimed = max_claimed.max(claimed);
        max_live = max_live.max(live);
        assert!(
            Instant::now() < deadline,
            "not all admitted within 60 s: {}",
            runs(&db).await
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(
        max_claimed <= 16 && max_live <= 16,
        "budget exceeded: {max_claimed} leased, {max_live} claim actors"
    );
    assert!(max_claimed > 0, "sampling saw no lease at all");
    let elapsed = started.elapsed();
    assert_eq!(runs(&db).await, 1000);
    assert!(
        metrics.ticks.get() >= 63,
        "1,000 rows at 16 per round need ≥ 63 rounds, saw {}",
        metrics.ticks.get()
    );
    assert!(
        elapsed < Duration::from_secs(60),
        "catch-up did not wait for the 60 s cadence: {elapsed:?}"
    );
    // The decisions of one round go to the admit actor together and are admitted by one
    // statement (its runs share one queued_at): 1,000 rows at 16 per round are at most 63
    // admission statements (fewer distinct instants when two fall on one millisecond).
    let batches = db
        .count("SELECT count(DISTINCT queued_at_ms) FROM qlsched.runs")
        .await;
    assert!(
        (1..=63).contains(&batches),
        "a round's decisions were split over several admissions: {batches} batches"
    );
    db.assert_invariants().await;
}

/// A round that takes long (the claim blocks on a table lock) is never overlapped by the
/// next timer tick, however many ticks pass meanwhile. Measured by the database: the claim
/// statements of this replica waiting or running at once (the claim's text is the only one
/// with a `held` CTE), sampled while the first is stuck.
#[actix_rt::test]
async fn rounds_never_overlap_when_a_round_is_slow() {
    let (db, blocker, sup, metrics) = stuck_on(50, "trigger_schedules").await;
    let sampler = db.superuser().await;
    let in_flight = || async {
        sampler
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND usename = 'qlsched_runtime'
                    AND state = 'active' AND position('), held AS (' IN query) > 0",
                &[],
            )
            .await
            .unwrap()
            .get::<_, i64>(0)
    };
    // 1.5 s = 15 cadences while the first round is stuck.
    let (mut most, until) = (0, Instant::now() + Duration::from_millis(1500));
    while Instant::now() < until {
        most = most.max(in_flight().await);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(most, 1, "claim statements in flight at once");
    assert_eq!(metrics.ticks.get(), 1, "only the stuck round was started");
    blocker.batch_execute("ROLLBACK").await.unwrap();
    wait_until("all 50 admitted", Duration::from_secs(30), || async {
        runs(&db).await == 50
    })
    .await;
    assert!(sup.send(Probe).await.unwrap().orphans == 0);
    db.assert_invariants().await;
}

/// Stop drains within its bound even while admissions are stuck; the leases left are then
/// released (fence-safe) and nothing is admitted twice once the database unblocks.
#[actix_rt::test]
async fn drain_finishes_within_its_bound_and_unfinished_leases_are_released() {
    let (db, blocker, sup, _metrics) = stuck_on(20, "runs").await;
    wait_until("16 leases held", Duration::from_secs(10), || async {
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner = 'a'")
            .await
            == 16
    })
    .await;
    let t = Instant::now();
    let left = sup.send(Drain(Duration::from_millis(800))).await.unwrap();
    let took = t.elapsed();
    assert!(
        left > 0,
        "claim actors were stuck, so some must be abandoned"
    );
    assert!(
        took < Duration::from_secs(3),
        "drain took {took:?} with an 800 ms bound"
    );
    let pool = db.runtime_pool(2);
    let release = tokio::spawn(async move {
        let conn = db::conn(&pool).await.unwrap();
        release::release_all_owned(&conn, "a").await.unwrap()
    });
    blocker.batch_execute("ROLLBACK").await.unwrap();
    release.await.unwrap();
    wait_until("no lease of a left", Duration::from_secs(10), || async {
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner = 'a'")
            .await
            == 0
    })
    .await;
    // Whatever the stuck admissions did after the unblock, every occurrence is at most once.
    db.assert_invariants().await;
    assert!(runs(&db).await <= 20);
}

/// The admit actor stopped mid-run is restarted by the supervisor; every row is still
/// admitted exactly once.
#[actix_rt::test]
async fn a_stopped_admit_actor_is_restarted_and_nothing_is_admitted_twice() {
    let db = TestDb::new().await;
    // Three stops while 900 rows are being admitted, each once the supervisor has restarted
    // the one before (not at given counts of admitted rows: on a busy machine every row could
    // commit between two polls, and the test saw 2 stops, not 3).
    db.seed_bulk(900, ONCE, -1000).await;
    let (sup, metrics) = start(&db, db.settings("a", 100, 5_000));
    let mut stops = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while stops < 3 {
        if let Some(admit) = sup.send(Probe).await.unwrap().admit {
            let _ = admit.send(Stop).await;
            stops += 1;
            wait_until(
                "the supervisor restarted the stopped admit actor",
                Duration::from_secs(10),
                || async { metrics.actor_restarts.get() >= stops },
            )
            .await;
        }
        assert!(Instant::now() < deadline, "only {stops} stops in 60 s");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    wait_until(
        "every row admitted after the three restarts",
        Duration::from_secs(60),
        || async { runs(&db).await == 900 },
    )
    .await;
    db.assert_invariants().await;
}

/// Two independent pools (different owners, different backend pids) race on the same 100
/// every-second rows: every occurrence is admitted exactly once and none is missing.
#[actix_rt::test]
async fn two_independent_replicas_racing_admit_every_occurrence_exactly_once() {
    let db = TestDb::new().await;
    db.seed_bulk(100, "* * * * * *", -500).await;
    let (a, ma) = start(&db, db.settings("a", 100, 5_000));
    let (b, mb) = start(&db, db.settings("b", 100, 5_000));
    tokio::time::sleep(Duration::from_secs(4)).await;
    a.send(Drain(Duration::from_secs(5))).await.unwrap();
    b.send(Drain(Duration::from_secs(5))).await.unwrap();
    let pids = db
        .count("SELECT count(DISTINCT pid) FROM pg_stat_activity WHERE usename = 'qlsched_runtime'")
        .await;
    assert!(pids >= 2, "two pools, two or more backends: {pids}");
    assert!(
        ma.admits.get() > 0 && mb.admits.get() > 0,
        "both replicas admitted: {} / {}",
        ma.admits.get(),
        mb.admits.get()
    );
    db.assert_invariants().await;
    // Per trigger, every whole second from its first to its last admitted occurrence is
    // present (the seeded first cursor is off the second boundary and left out).
    let gaps = db
        .count(
            "SELECT coalesce(sum((max(scheduled_for_ms) - min(scheduled_for_ms)) / 1000 + 1 - count(*)) OVER (), 0)::bigint
               FROM qlsched.runs WHERE scheduled_for_ms % 1000 = 0 GROUP BY trigger_id LIMIT 1",
        )
        .await;
    assert_eq!(gaps, 0, "missing occurrences");
    assert!(
        runs(&db).await >= 100 * 3,
        "about 4 s of 100 every-second triggers"
    );
}

/// A holder whose backend is killed while it holds claims: the other replica takes those
/// rows over only after the database expiry of the claims.
#[actix_rt::test]
async fn a_killed_holders_claims_are_taken_over_only_after_the_database_expiry() {
    let db = TestDb::new().await;
    db.seed_bulk(10, ONCE, -1000).await;
    let pool = db.runtime_pool(2);
    let conn = db::conn(&pool).await.unwrap();
    let held = crate::helpers::drive::claim_due(&conn, "dead", 1500, 10, uuid::Uuid::new_v4())
        .await
        .unwrap();
    assert_eq!(held.len(), 10);
    let expiry = held.iter().map(|c| c.fence.expires_at_ms).max().unwrap();
    let pid = crate::helpers::backend_pid(&conn).await;
    db.superuser()
        .await
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    let (_b, _) = start(&db, db.settings("b", 100, 5_000));
    wait_until("b admitted all 10", Duration::from_secs(20), || async {
        runs(&db).await == 10
    })
    .await;
    let earliest = db.count("SELECT min(queued_at_ms) FROM qlsched.runs").await;
    assert!(
        earliest >= expiry,
        "taken over at {earliest}, before the expiry {expiry}"
    );
    db.assert_invariants().await;
}

/// Ids are minted only for decisions that admit: initialising, skipping and rejecting carry
/// none, and two admissions of the same claim get different run ids.
#[test]
fn ids_are_minted_only_for_admissions() {
    use qlsched::actors::claim::{plan, Kind};
    use qlsched::engine::Action;
    use qlsched::store::claim::{ClaimedRow, Fence, TriggerDef};
    let row = |cursor: Option<i64>, expr: &str, policy: &str| ClaimedRow {
        trigger_id: "t".into(),
        tid: "(0,1)".into(),
        overlap_tid: None,
        overlap_idle: false,
        next_fire_at_ms: cursor,
        state_version: 2,
        fence: Fence {
            owner: "a".into(),
            token: uuid::Uuid::nil(),
            version: 1,
            expires_at_ms: 31_000,
        },
        observed_at_ms: 1_000_000,
        def: TriggerDef {
            project_id: "p".into(),
            trigger_revision: 1,
            trigger_digest: "d".into(),
            cron_expr: expr.into(),
            timezone: "UTC".into(),
            misfire_policy: policy.parse(),
            misfire_grace_ms: 60_000,
            task_id: "k".into(),
            task_revision: 1,
            task_digest: "d".into(),
            execution_revision_id: uuid::Uuid::nil(),
            jitter_ms: 0,
            start_at_ms: None,
            end_at_ms: None,
        },
    };
    let backoff = Duration::from_secs(60);
    // A new row is initialised; a row 999 s behind skips to the next occurrence.
    for cursor in [None, Some(0)] {
        let action = plan(&row(cursor, "* * * * * *", "skip"), backoff).0;
        assert!(
            matches!(
                action,
                Action::Advance {
                    next_fire_at_ms: 1_001_000
                }
            ),
            "cursor {cursor:?}: {action:?}"
        );
    }
    let reject = plan(&row(Some(0), "not cron", "skip"), backoff).0;
    assert!(
        matches!(reject, Action::Release { backoff: b } if b == backoff),
        "{reject:?}"
    );
    let fire_row = row(Some(999_000), "* * * * * *", "skip");
    let (Action::Admit(x), Action::Admit(y)) =
        (plan(&fire_row, backoff).0, plan(&fire_row, backoff).0)
    else {
        panic!("an on-time occurrence is admitted");
    };
    assert_eq!(
        (x.scheduled_for_ms, x.next_fire_at_ms),
        (999_000, 1_000_000)
    );
    assert_ne!(x.run_id, y.run_id);
    assert_ne!(x.attempt_id, y.attempt_id);
    let once = plan(&row(Some(0), "* * * * * *", "fire_once"), backoff).0;
    assert!(
        matches!(once, Action::Admit(ref a) if a.scheduled_for_ms == 0 && a.next_fire_at_ms == 1_001_000),
        "{once:?}"
    );
    let kind = plan(&row(Some(0), "not cron", "skip"), backoff).1;
    assert!(
        matches!(&kind, Kind::Reject(why) if why.to_string().contains("`not cron`")),
        "{kind:?}"
    );
}

/// A definition found corrupt at admit time fails closed: nothing is admitted, the claim is
/// released with the reject back-off, and the reject is counted.
#[actix_rt::test]
async fn a_corrupt_definition_at_admit_time_is_released_with_back_off() {
    let db = TestDb::new().await;
    db.seed_bulk(1, ONCE, -1000).await;
    db.superuser()
        .await
        .batch_execute("ALTER TABLE qlsched.execution_revisions DISABLE TRIGGER execution_revisions_are_immutable; UPDATE qlsched.execution_revisions SET spec = spec || 'tampered'; ALTER TABLE qlsched.execution_revisions ENABLE TRIGGER execution_revisions_are_immutable")
        .await
        .unwrap();
    let (_sup, metrics) = start(&db, db.settings("a", 100, 30_000));
    wait_until("the reject", Duration::from_secs(10), || async {
        metrics.rejects.get() == 1
    })
    .await;
    wait_until("the release", Duration::from_secs(10), || async {
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NULL")
            .await
            == 1
    })
    .await;
    let wait = db
        .count("SELECT claimable_at_ms - (extract(epoch FROM clock_timestamp())*1000)::bigint FROM qlsched.trigger_schedules")
        .await;
    assert!(
        (50_000..=60_000).contains(&wait),
        "released with a 60 s back-off, claimable in {wait} ms"
    );
    assert_eq!(runs(&db).await, 0);
}

/// Suspending a project fences out its live claims and keeps its rows unclaimed.
#[tokio::test]
async fn suspending_a_project_fences_out_its_live_claims() {
    let db = TestDb::new().await;
    db.seed_bulk(3, ONCE, -1000).await;
    let held = Claimed::up_to(&db, "a", 30_000, 3).await;
    assert_eq!(held.rows.len(), 3);
    let mut admin = db.admin().await;
    store::manage::set_project(&mut admin, "proj", "suspended")
        .await
        .unwrap();
    assert_eq!(db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL OR claimable_at_ms IS NOT NULL").await, 0);
    let batch: Vec<_> = held
        .rows
        .iter()
        .map(|c| (c.clone(), c.observed_at_ms + 1))
        .collect();
    let conn = held.conn().await;
    assert_eq!(
        store::admission::advance_batch(&conn, &batch)
            .await
            .unwrap(),
        vec![false; 3]
    );
    store::manage::set_project(&mut admin, "proj", "active")
        .await
        .unwrap();
    assert_eq!(held.claim_more("b", 30_000, 10).await.len(), 3);
}

/// An admission refused for no reason the re-read finds (`Unexplained`: here a trigger on
/// the schedule table swallows every cursor move) is an error of the row: its back-off doubles from one cadence
/// at each refusal in a row, as for any other row error, instead of restarting at one
/// cadence every time.
#[actix_rt::test]
async fn the_back_off_of_an_unexplained_refusal_grows_with_each_refusal_in_a_row() {
    let db = cursor_never_moves().await;
    let (_sup, metrics) = start(&db, db.settings("a", 200, 30_000));
    // Each release leaves the row free with claimable_at = now + its back-off.
    let mut backoffs: Vec<(i64, i64)> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while backoffs.len() < 4 {
        let row = db
            .superuser()
            .await
            .query_opt(
                "SELECT state_version, claimable_at_ms - updated_at_ms FROM qlsched.trigger_schedules
                  WHERE claim_owner IS NULL AND claimable_at_ms > updated_at_ms",
                &[],
            )
            .await
            .unwrap();
        if let Some(r) = row {
            let seen: (i64, i64) = (r.get(0), r.get(1));
            if backoffs.last().map(|b| b.0) != Some(seen.0) {
                backoffs.push(seen);
            }
        }
        assert!(Instant::now() < deadline, "releases seen: {backoffs:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(runs(&db).await, 0, "every admission is swallowed");
    assert!(
        metrics.error_backoffs.get() >= 4,
        "{backoffs:?} redecides {} errors {} rejects {}",
        metrics.redecides.get(),
        metrics.errors.get(),
        metrics.rejects.get()
    );
    let ms: Vec<i64> = backoffs.iter().map(|b| b.1).collect();
    assert_eq!(
        ms,
        vec![200, 400, 800, 1600],
        "back-offs of successive refusals"
    );
}

/// The strikes of a row that stops coming back here (disabled, deleted, or another
/// replica's now) are forgotten once the strike memory has passed: the supervisor's
/// per-trigger entries are bounded by the triggers it has recently worked on.
#[actix_rt::test]
async fn the_strikes_of_a_row_no_longer_claimed_here_are_forgotten() {
    let db = cursor_never_moves().await;
    let su = db.superuser().await;
    let s = Settings {
        reject_backoff: Duration::from_secs(1),
        admit_timeout: Duration::from_secs(1),
        ..db.settings("a", 200, 2_000)
    };
    let memory = s.strike_memory();
    let (sup, _) = start(&db, s);
    wait_until(
        "a strike is remembered",
        Duration::from_secs(10),
        || async { sup.send(Probe).await.unwrap().strikes == 1 },
    )
    .await;
    // The row leaves this replica for good (as a disabled trigger's row does).
    su.batch_execute("UPDATE qlsched.trigger_schedules SET claimable_at_ms = NULL")
        .await
        .unwrap();
    let gone = Instant::now();
    wait_until("the strike is forgotten", memory * 3, || async {
        sup.send(Probe).await.unwrap().strikes == 0
    })
    .await;
    assert!(
        gone.elapsed() + Duration::from_secs(2) >= memory,
        "forgotten after {:?}, before its memory {memory:?} (minus the last back-off)",
        gone.elapsed()
    );
}
