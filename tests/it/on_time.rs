//! Firing on time: a replica wakes at the instant a row becomes claimable instead of at its
//! next cadence tick, and a change notification wakes it for a newly published trigger.
//! Without notifications the change is picked up within one cadence.

use std::time::Duration;

use actix::prelude::*;
use qlsched::actors::supervisor::{Drain, Supervisor};
use qlsched::actors::Settings;
use qlsched::metrics::Metrics;

use crate::helpers::{wait_until, FirstRun, TestDb};

fn settings(db: &TestDb, cadence_s: u64, listen: bool) -> Settings {
    Settings {
        listen,
        ..db.settings("a", cadence_s * 1000, cadence_s * 3000)
    }
}

fn start(s: Settings) -> (Addr<Supervisor>, Metrics) {
    let (sup, metrics, _) = crate::helpers::start_supervisor(s);
    (sup, metrics)
}

/// What happened to an every-second trigger published while a replica (cadence
/// `cadence_s`, listening or not) was idle.
struct Published {
    run: FirstRun,
    notifications: u64,
}

async fn publish_while_idle(cadence_s: u64, listen: bool) -> Published {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let (sup, metrics) = start(settings(&db, cadence_s, listen));
    wait_until(
        "the first (empty) round",
        Duration::from_secs(10),
        || async { metrics.ticks.get() >= 1 },
    )
    .await;
    if listen {
        wait_until("the listener", Duration::from_secs(10), || async {
            db.listeners().await >= 1
        })
        .await;
    }
    let run = db
        .publish_and_await_first_run(&mut admin, "fresh", Duration::from_secs(cadence_s + 5))
        .await;
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    Published {
        run,
        notifications: metrics.notifications.get(),
    }
}

/// A trigger published while the replica sleeps (cadence 10 s) wakes it through the
/// notification, which carries the first occurrence: admitted within 100 ms of its time.
#[actix_rt::test]
async fn a_trigger_published_while_replicas_sleep_is_admitted_on_time_through_notify() {
    let _one = crate::drills::exclusive().await;
    let p = publish_while_idle(10, true).await;
    p.run.assert_first_admitted_within(100, "not on time");
    assert!(p.notifications >= 1, "no notification arrived");
}

/// Without notifications (a lost one, or a pooler that does not carry LISTEN) the change is
/// picked up at the next cadence round: its first occurrence is admitted then, late but
/// inside the grace, not skipped.
#[actix_rt::test]
async fn without_notifications_a_new_trigger_is_picked_up_within_one_cadence() {
    let _one = crate::drills::exclusive().await;
    let p = publish_while_idle(3, false).await;
    p.run
        .assert_first_admitted_within(3_000 + 1_000, "more than one cadence (3 s) + one period");
    assert_eq!(p.notifications, 0);
}

/// Every-second triggers under a 5 s cadence are admitted at their instants, not at the
/// ticks: the replica wakes when the next row becomes claimable.
#[actix_rt::test]
async fn a_replica_wakes_at_the_next_due_instant_not_at_its_cadence() {
    let _one = crate::drills::exclusive().await;
    let db = TestDb::new().await;
    db.seed_bulk(20, "* * * * * *", 0).await;
    let (sup, metrics) = start(settings(&db, 5, false));
    wait_until("six seconds of runs", Duration::from_secs(15), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 20 * 7
    })
    .await;
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    // The first run of each trigger is its seeded (unaligned) cursor; the rest are on time.
    let late = db
        .count(
            "SELECT count(*) FROM qlsched.runs WHERE scheduled_for_ms % 1000 = 0
                AND queued_at_ms - scheduled_for_ms > 100",
        )
        .await;
    let on_time = db
        .count(
            "SELECT count(*) FROM qlsched.runs WHERE scheduled_for_ms % 1000 = 0
                AND queued_at_ms - scheduled_for_ms <= 100",
        )
        .await;
    assert!(on_time >= 20 * 4, "only {on_time} runs were on time");
    assert_eq!(late, 0, "runs more than 100 ms late under a 5 s cadence");
    assert!(
        metrics.wakeups.get() >= 5,
        "wake-ups: {}",
        metrics.wakeups.get()
    );
}

/// An idle replica at the default cadence (5 s) with 1,000 triggers, none due, issues one
/// statement per round: the guard heartbeat rides in the claim statement and the backlog is
/// known to be empty without one. Counted by the server (`pg_stat_statements`, the runtime
/// role's calls in this database).
#[tokio::test]
async fn an_idle_replica_issues_one_statement_per_cadence() {
    use crate::helpers::replica::ReplicaProc;
    let db = TestDb::new().await;
    db.seed_bulk(1_000, "0 0 0 1 1 *", 3_600_000).await;
    let mut r = ReplicaProc::spawn(
        &db.dsn("qlsched_runtime"),
        "idle",
        "lease = \"30s\"\ncadence = \"5s\"\nadmit_timeout = \"5s\"",
        &[],
    );
    r.wait_ready(Duration::from_secs(30)).await;
    let ticks = |r: &ReplicaProc| {
        let body = r.get("/metrics").map(|x| x.1).unwrap_or_default();
        body.lines()
            .find(|l| l.starts_with("qlsched_ticks_total "))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
            .unwrap_or(-1.0)
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    // The window: from the first count to the second. Rounds start at least one cadence
    // apart, so a window of `w` holds at most floor(w / cadence) + 1 of them (one at each edge
    // only if `w` is a whole number of cadences); 24 s is just under five cadences, so at most
    // 5 statements: 0.2 per second and no more. At least floor(w / cadence) - 1 = 3 (rounds
    // are at most a cadence plus a statement apart).
    let cadence_ms: u128 = 5_000;
    // Timed from before the first count to after the second: `w` covers the real window.
    let from = std::time::Instant::now();
    let (t0, k0) = (db.runtime_statements().await, ticks(&r));
    tokio::time::sleep(Duration::from_secs(24)).await;
    let (t1, k1) = (db.runtime_statements().await, ticks(&r));
    let w = from.elapsed().as_millis();
    r.terminate(Duration::from_secs(20)).await;
    let statements = t1 - t0;
    let most = (w / cadence_ms + 1) as i64;
    assert_eq!(
        most, 5,
        "the window ({w} ms) ran long: the bound is for 24 s"
    );
    assert!(
        statements <= most,
        "an idle replica ran {statements} statements in {w} ms ({} rounds); one per 5 s round allows {most}",
        k1 - k0
    );
    assert!(
        statements >= (w / cadence_ms) as i64 - 1,
        "only {statements} statements in {w} ms: is the replica running?"
    );
}

/// The listener's connection is cut (its backend terminated): a trigger published in the gap
/// is still picked up within one cadence, the listener comes back by itself, and the next
/// publish wakes the replica through a notification again.
#[actix_rt::test]
async fn a_lost_listener_falls_back_to_the_cadence_and_comes_back() {
    let _one = crate::drills::exclusive().await;
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let cadence_s = 4;
    let (sup, metrics) = start(settings(&db, cadence_s, true));
    wait_until("the listener", Duration::from_secs(10), || async {
        db.listeners().await >= 1
    })
    .await;
    let cut = db
        .count(
            "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity
              WHERE datname = current_database() AND query = 'LISTEN qlsched_wake') t",
        )
        .await;
    assert_eq!(cut, 1, "one listener backend terminated");
    let run = db
        .publish_and_await_first_run(&mut admin, "in-gap", Duration::from_secs(cadence_s + 5))
        .await;
    run.assert_first_admitted_within(4_000 + 1_000, "more than one cadence (4 s) + one period");
    wait_until("the listener back", Duration::from_secs(20), || async {
        db.listeners().await >= 1
    })
    .await;
    let before = metrics.notifications.get();
    let run = db
        .publish_and_await_first_run(&mut admin, "after-gap", Duration::from_secs(cadence_s + 5))
        .await;
    assert!(
        metrics.notifications.get() > before,
        "no notification after the listener came back"
    );
    run.assert_first_admitted_within(100, "not on time");
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    db.assert_invariants().await;
}
