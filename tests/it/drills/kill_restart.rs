//! Drill 1, kill/restart: three replicas share 200 every-second triggers; again and again a
//! random replica is SIGKILLed while it holds leases and restarted a few seconds later
//! (sometimes after its leases expired, sometimes before: a restart of the same id on the
//! same host releases its predecessor's leases at once). 0 duplicates, 0 lost, and no lease
//! taken over before its database expiry or its release.

use std::time::Duration;

use super::check::Expect;
use super::{db_now, kill_holding_leases, Drill, Stage};
use crate::helpers::wait_until;

const TRIGGERS: usize = 200;
const IDS: [&str; 3] = ["a", "b", "c"];

#[tokio::test]
async fn replicas_sigkilled_and_restarted_admit_every_occurrence_exactly_once() {
    let mut drill = Drill::begin("kill_restart", (4, 0), (20, 0), |p, seed| {
        format!(
            "{} cycles, 3 replicas, {TRIGGERS} every-second triggers, lease 5 s, seed {seed}",
            p.cycles
        )
    })
    .await;
    let mut stage = Stage::new(TRIGGERS, "").await;
    stage.start(&IDS).await;

    let mut expect = Expect::every_second();
    let (mut quick, mut slow) = (0, 0);
    for cycle in 0..drill.p.cycles {
        tokio::time::sleep(drill.rng.millis(1000, 3000)).await;
        let victim = IDS[drill.rng.below(3) as usize];
        let mut held =
            kill_holding_leases(&mut stage.fleet, &stage.sql, victim, Duration::from_secs(3)).await;
        // Every other cycle the victim stays down until its leases have expired on the
        // database clock, so the others may take them over; otherwise it comes back at once
        // and releases them itself (same id, same host, dead pid).
        if cycle % 2 == 1 && !held.is_empty() {
            slow += 1;
            let expiry = held.iter().map(|h| h.expires_at_ms).max().unwrap();
            wait_until(
                "the killed replica's leases expired",
                Duration::from_secs(10),
                || {
                    let sql = &stage.sql;
                    async move { db_now(sql).await > expiry }
                },
            )
            .await;
            tokio::time::sleep(drill.rng.millis(0, 1500)).await;
        } else {
            quick += 1;
            tokio::time::sleep(drill.rng.millis(300, 2500)).await;
        }
        let respawn_at = db_now(&stage.sql).await;
        for h in &mut held {
            h.freed_at_ms = respawn_at;
        }
        expect.held.extend(held);
        stage.fleet.spawn(victim, &[]);
        stage.fleet.wait_ready(victim).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    stage.fleet.stop_all().await;

    drill.report.note(format!(
        "kills {} ({quick} restarted at once, {slow} after their leases expired) · leases held by the killed replicas {}",
        drill.p.cycles,
        expect.held.len()
    ));
    drill.report.finish(&stage.sql, &expect, &stage.fleet).await;
}
