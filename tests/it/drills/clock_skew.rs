//! Drill 8, clock skew: three replicas share the triggers; `b` runs with its node clock an
//! hour ahead and `c` ten minutes behind (libfaketime, LD_PRELOAD; the monotonic clock is
//! left alone). `a` and `c` are SIGKILLed in turn while holding leases, so `b` (an hour
//! ahead) judges their leases. Claim budget 2 and a 100 ms cadence keep all three in the
//! race for every second's rows, so each takes a share whatever its timer's phase. Leases,
//! due-ness and lag are judged by the database clock only, so the skewed replicas behave
//! exactly like `a`: no lease is taken over before its database expiry, each replica admits
//! its share, 0 duplicates, 0 lost.
//!
//! Needs `faketime` (Debian/Ubuntu: `apt-get install -y faketime`); without it the drill
//! fails and says so. It installs nothing itself.

use std::time::Duration;

use super::check::Expect;
use super::{db_now, kill_holding_leases, Drill, Stage};
use crate::helpers::pg::libfaketime;
use crate::helpers::wait_until;

const TRIGGERS: usize = 100;
const SKEWS: [(&str, &str, i64); 3] = [("a", "", 0), ("b", "+1h", 3600), ("c", "-10m", -600)];

#[tokio::test]
async fn replicas_with_skewed_node_clocks_behave_like_the_others() {
    let lib = libfaketime();
    let mut drill = Drill::begin("clock_skew", (2, 0), (16, 0), |p, seed| {
        format!(
            "replica a on time, b +1 h, c -10 min (libfaketime); {} SIGKILLs of a or c while b judges their leases; \
             claim budget 2, cadence 100 ms, {TRIGGERS} every-second triggers, seed {seed}",
            p.cycles
        )
    })
    .await;
    let mut stage = Stage::new(TRIGGERS, "claim_budget = 2\ncadence = \"100ms\"").await;
    let lib = lib.to_string_lossy().into_owned();
    let env = |skew: &'static str| -> Vec<(&str, &str)> {
        match skew {
            "" => vec![],
            s => vec![
                ("LD_PRELOAD", lib.as_str()),
                ("FAKETIME", s),
                ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
            ],
        }
    };
    for (id, skew, _) in SKEWS {
        stage.fleet.spawn(id, &env(skew));
    }
    for (id, _, _) in SKEWS {
        stage.fleet.wait_ready(id).await;
    }
    // The skew is real: each replica's log stamps say its own time.
    let mut seen = Vec::new();
    for (id, skew, secs) in SKEWS {
        let stamp = log_skew_secs(&stage.fleet.get(id).log());
        assert!(
            (stamp - secs).abs() < 60,
            "replica {id} (FAKETIME {skew:?}) logs {stamp} s from real time, expected {secs}"
        );
        seen.push(format!("{id} {stamp:+} s"));
    }
    stage.wait_all_admitting().await;

    // Kill the on-time replica and the one behind while the one ahead (b) judges their
    // leases: were node clocks used, b would take them over an hour early.
    let mut expect = Expect::every_second();
    for cycle in 0..drill.p.cycles {
        tokio::time::sleep(drill.rng.millis(2000, 4000)).await;
        let (victim, skew, _) = SKEWS[if cycle % 2 == 0 { 0 } else { 2 }];
        let mut held =
            kill_holding_leases(&mut stage.fleet, &stage.sql, victim, Duration::from_secs(3)).await;
        let expiry = held.iter().map(|h| h.expires_at_ms).max().unwrap_or(0);
        wait_until(
            "the killed replica's leases expired",
            Duration::from_secs(10),
            || {
                let sql = &stage.sql;
                async move { db_now(sql).await > expiry + 1000 }
            },
        )
        .await;
        let respawn_at = db_now(&stage.sql).await;
        for h in &mut held {
            h.freed_at_ms = respawn_at;
        }
        expect.held.extend(held);
        stage.fleet.spawn(victim, &env(skew));
        stage.fleet.wait_ready(victim).await;
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    stage.fleet.stop_all().await;

    // Per replica: admissions and their lag, by the database clock.
    let mut per = Vec::new();
    for (id, _, _) in SKEWS {
        let r = stage
            .sql
            .query_one(
                "SELECT count(*), coalesce(max(queued_at_ms - scheduled_for_ms), 0)
                   FROM qlsched.runs WHERE admitted_by = $1",
                &[&id],
            )
            .await
            .unwrap();
        let (n, lag): (i64, i64) = (r.get(0), r.get(1));
        per.push((id, n, lag));
    }
    drill.report.note(format!(
        "node clocks (from log stamps) {} · per replica admitted / max lag: {} · leases held by killed replicas {}",
        seen.join(", "),
        per.iter()
            .map(|(id, n, lag)| format!("{id} {n} / {lag} ms"))
            .collect::<Vec<_>>()
            .join(", "),
        expect.held.len()
    ));
    let f = drill.report.finish(&stage.sql, &expect, &stage.fleet).await;
    for (id, n, _) in per {
        assert!(n > 0, "replica {id} admitted nothing");
    }
    assert!(
        expect.held.is_empty() || f.takeovers > 0,
        "no lease of a killed replica was taken over"
    );
}

/// Seconds between the replica's first log stamp and the real clock now (the log is young).
fn log_skew_secs(log: &str) -> i64 {
    let line = log.lines().next().expect("a log line");
    let v: serde_json::Value = serde_json::from_str(line).expect("a JSON log line");
    let ts = v["ts"].as_str().expect("a ts field");
    let at = chrono::DateTime::parse_from_rfc3339(ts).expect("an RFC 3339 stamp");
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    at.timestamp() - now
}
