//! Enabling a trigger or resuming its project wakes a sleeping replica through the change
//! notification, as publishing does: the trigger fires at its next occurrence, not after
//! the replica's idle cadence.

use std::time::Duration;

use actix::prelude::*;
use qlsched::actors::supervisor::{Drain, Supervisor};
use qlsched::actors::Settings;
use qlsched::health::Health;
use qlsched::metrics::Metrics;
use qlsched::store::manage::{self, TriggerSpec};
use qlsched::store::triggers;

use crate::helpers::{discard_log, wait_until, TestDb};

/// Runs of `fresh` scheduled after `after_ms`.
async fn runs_after(db: &TestDb, after_ms: i64) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'fresh' AND scheduled_for_ms > {after_ms}"
    ))
    .await
}

#[actix_rt::test]
async fn enable_and_project_resume_wake_a_sleeping_replica() {
    let _one = crate::drills::exclusive().await;
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let spec = TriggerSpec::new("fresh", "proj", "task", "* * * * * *", "UTC");
    manage::publish_trigger(&mut admin, &spec).await.unwrap();
    triggers::disable(&mut admin, "fresh", None, "test")
        .await
        .unwrap();
    let metrics = Metrics::default();
    let settings = Settings {
        lease: Duration::from_secs(60),
        cadence: Duration::from_secs(20),
        listen: true,
        ..db.actor_settings("a")
    };
    let sup = Supervisor::new(
        settings,
        metrics.clone(),
        &discard_log(),
        None,
        Health::default(),
    )
    .start();
    wait_until(
        "the first (empty) round and the listener",
        Duration::from_secs(10),
        || async { metrics.ticks.get() >= 1 && db.listeners().await >= 1 },
    )
    .await;

    // Enable: the first run comes within a few seconds, far inside the 20 s cadence.
    let enabled = db.now_ms().await;
    triggers::enable(&mut admin, "fresh", "test").await.unwrap();
    wait_until("a run after enable", Duration::from_secs(5), || async {
        runs_after(&db, enabled).await >= 1
    })
    .await;

    // Suspend, let the replica go idle, resume: runs continue at once.
    manage::set_project(&mut admin, "proj", "suspended")
        .await
        .unwrap();
    let ticks = metrics.ticks.get();
    wait_until(
        "an idle round while suspended",
        Duration::from_secs(10),
        || async { metrics.ticks.get() > ticks },
    )
    .await;
    let notified = metrics.notifications.get();
    let resumed = db.now_ms().await;
    manage::set_project(&mut admin, "proj", "active")
        .await
        .unwrap();
    wait_until("a run after resume", Duration::from_secs(5), || async {
        runs_after(&db, resumed).await >= 1
    })
    .await;
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    assert!(
        metrics.notifications.get() > notified,
        "no notification arrived for the resume"
    );
    db.assert_invariants().await;
}
