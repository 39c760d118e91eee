//! Row 4: the claim statement's own latency at scale: `claim_variant(16)` prepared once
//! and executed inside BEGIN … ROLLBACK (the state never changes) by one client, median of
//! 3 runs of a fixed number of executions, each after a VACUUM (every rolled-back claim leaves
//! 16 dead row versions; fixed counts keep that bloat alike at every scale); and at the
//! 100k-row case the same text parsed and planned on every call.

use std::time::Instant;

use qlsched::store::claim;
use uuid::Uuid;

use crate::env::{say, Bench};
use crate::load::{Layout, Load};
use crate::report::Row;
use crate::stats::median;

const NIL: Uuid = Uuid::nil();

/// Mean latency (ms) of the claim over `tx` executions; `prepared`: one prepared statement,
/// else the text sent (parsed and planned) on every call.
async fn latency(b: &Bench, tx: u64, prepared: bool) -> f64 {
    let c = b.srv.connect("qlsched_runtime", "qlsched").await;
    let sql = claim::claim_variant(16).0;
    let stmt = c.prepare(sql).await.unwrap();
    let mut runs = Vec::new();
    for _ in 0..3 {
        b.exec("VACUUM qlsched.trigger_schedules").await;
        let mut total = 0.0;
        for _ in 0..tx {
            c.batch_execute("BEGIN").await.unwrap();
            let round = Uuid::new_v4();
            let owner = "bench-probe";
            let lease = 30_000i64;
            let ttl = 0i64;
            let t0 = Instant::now();
            if prepared {
                c.query(&stmt, &[&owner, &lease, &round, &NIL, &ttl])
                    .await
                    .unwrap();
            } else {
                c.query(sql, &[&owner, &lease, &round, &NIL, &ttl])
                    .await
                    .unwrap();
            }
            total += t0.elapsed().as_secs_f64() * 1000.0;
            c.batch_execute("ROLLBACK").await.unwrap();
        }
        runs.push(total / tx as f64);
    }
    median(&runs).unwrap()
}

/// The plan's line for the claim index (or the scan of the schedule table).
async fn plan(b: &Bench) -> (String, String) {
    let c = b.srv.connect("qlsched_runtime", "qlsched").await;
    c.batch_execute("BEGIN").await.unwrap();
    let sql = format!(
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {}",
        claim::claim_variant(16).0
    );
    let rows = c
        .query(
            &sql,
            &[&"bench-probe", &30_000i64, &Uuid::new_v4(), &NIL, &0i64],
        )
        .await
        .unwrap();
    c.batch_execute("ROLLBACK").await.unwrap();
    let text: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let line = text
        .iter()
        .find(|l| l.contains("trigger_schedules_claimable_idx"))
        .or_else(|| {
            text.iter()
                .find(|l| l.contains("Scan") && l.contains("on trigger_schedules"))
        })
        .map(|l| {
            l.trim_start_matches([' ', '-', '>'])
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        })
        .unwrap_or("?".into());
    (line, text.join("\n    "))
}

pub async fn rows(b: &mut Bench) {
    let s = b.sizes.clone();
    let simple_at = *s.claim_ns.get(1).unwrap_or(&s.claim_ns[0]);
    let mut cases: Vec<(String, f64)> = Vec::new();
    let mut simple_row = None;
    for &n in &s.claim_ns {
        for live in [0, s.claim_live] {
            say(&format!(
                "4. claim cost: {n} free due rows + {live} live claims"
            ));
            if live == 0 {
                b.reset().await;
                b.load(n, &Load::new(Layout::Due)).await;
            } else {
                let mut l = Load::new(Layout::Claimed);
                l.first = n + 1;
                b.load(live, &l).await;
            }
            b.exec("VACUUM ANALYZE qlsched.trigger_schedules").await;
            b.checkpoint().await;
            let lat = latency(b, s.claim_tx, true).await;
            let (line, plan) = plan(b).await;
            let base = cases.first().map(|c| c.1).unwrap_or(lat);
            b.row(
                Row::new(
                    "4",
                    &format!("claim_{n}_{live}"),
                    format!("claim LIMIT 16 (executed, plan cached): {n} rows, {live} live claims"),
                    lat,
                    "ms",
                )
                .lower_better()
                .detail(format!("{:.2}× the first case; `{line}`", lat / base)),
            );
            b.note(format!(
                "claim plan, {n} rows + {live} live claims:\n    {plan}"
            ));
            cases.push((format!("{n}/{live}"), lat));
            if live == 0 && n == simple_at {
                let slat = latency(b, s.claim_tx, false).await;
                simple_row = Some((n, slat, lat));
            }
        }
    }
    let min = cases
        .iter()
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap()
        .clone();
    let max = cases
        .iter()
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap()
        .clone();
    let spread = max.1 / min.1;
    b.row(
        Row::new(
            "4",
            "claim_spread",
            format!(
                "claim latency spread over the {} cases above (max / min)",
                cases.len()
            ),
            spread,
            "×",
        )
        .lower_better()
        .detail(format!(
            "slowest: {} rows/live claims, fastest: {}",
            max.0, min.0
        ))
        .target(
            &format!(
                "within 2× from {} to {} rows and with {} live claims",
                s.claim_ns[0],
                s.claim_ns.last().unwrap(),
                s.claim_live
            ),
            spread <= 2.0,
        ),
    );
    if let Some((n, slat, lat)) = simple_row {
        b.row(
            Row::new("4", "claim_replanned", "claim planning overhead avoided (the daemon prepares the claim once per connection)", slat, "ms")
                .lower_better()
                .detail(format!("{n} rows: {slat:.3} ms with parse + plan on every call vs {lat:.3} ms executed from a cached plan")),
        );
    }
}
