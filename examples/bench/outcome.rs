//! Row E1: the expected-success evaluation (docs/policies-outcome.md) at 100,000 triggers.
//! Every trigger gets `--expect-success-within 1d` the way a publish sets it (an UPDATE of the
//! trigger rows, so V19's trigger writes each outcome row and its deadline), then the
//! replicas' gauge statement (`store::triggers::outcome::OUTCOME_GAUGES_SQL`) runs as the
//! runtime role, REPS times for each of three states: none overdue, 1 % overdue, all overdue
//! (deadlines moved into the past by the superuser; the statement reads at most 10,000 of
//! them). Its database time comes from
//! pg_stat_statements (execution time of that statement only), and the row reports it per
//! minute as if each of 3 replicas evaluated it once a minute (by default a replica does
//! every `retention.interval`, 5 min: a fifth of that). Target: ≤ 50 ms of database time
//! per minute. A note keeps the plan of each state and a `trigger list --state overdue`
//! page's time.

use std::time::Instant;

use qlsched::store::triggers::outcome::OUTCOME_GAUGES_SQL;

use crate::env::{say, Bench};
use crate::load::{Layout, Load};
use crate::report::Row;

/// Evaluations per minute the row assumes: 3 replicas, once a minute each.
const EVALS_PER_MINUTE: f64 = 3.0;

pub async fn rows(b: &mut Bench) {
    let n: u64 = if b.sizes.smoke {
        1_000
    } else {
        std::env::var("QLSCHED_BENCH_OUTCOME_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000)
    };
    let reps = if b.sizes.smoke { 5 } else { 100 };
    say(&format!(
        "O. expected success: {n} triggers with a 1-day window, the gauge statement {reps}× per state"
    ));
    b.reset().await;
    b.load(n, &Load::new(Layout::Idle)).await;
    let t0 = Instant::now();
    b.exec("UPDATE qlsched.triggers SET expect_success_within_ms = 86400000")
        .await;
    let setup_s = t0.elapsed().as_secs_f64();
    let rows_made = b
        .num("select count(*) from qlsched.trigger_outcomes where success_due_at_ms is not null")
        .await as u64;
    b.check(
        &format!("O: {rows_made} of {n} triggers got a success deadline"),
        rows_made == n,
    );
    b.exec("VACUUM ANALYZE qlsched.triggers, qlsched.trigger_outcomes")
        .await;
    let runtime = b.srv.connect("qlsched_runtime", "qlsched").await;
    let mut plans = String::new();
    let states: [(&str, &str, u64); 3] = [
        ("outcome_overdue_eval_none", "none overdue", 0),
        ("outcome_overdue_eval_1pct", "1 % overdue", n / 100),
        ("outcome_overdue_eval_all", "all overdue", n),
    ];
    for (key, what, overdue) in states {
        b.exec(&format!(
            "UPDATE qlsched.trigger_outcomes SET success_due_at_ms = enabled_since_ms + 86400000;
             UPDATE qlsched.trigger_outcomes SET success_due_at_ms = enabled_since_ms - 1
              WHERE trigger_id IN (SELECT trigger_id FROM qlsched.trigger_outcomes ORDER BY trigger_id LIMIT {overdue})"
        ))
        .await;
        b.exec("VACUUM ANALYZE qlsched.trigger_outcomes").await;
        // Warm once (plans, buffers), then measure.
        let counted: i64 = runtime
            .query(OUTCOME_GAUGES_SQL, &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i64>("overdue"))
            .sum();
        b.check(
            &format!("O: {what}: the gauge counted {counted}, {overdue} set"),
            counted == (overdue as i64).min(10_000),
        );
        b.pgss_reset().await;
        let w0 = Instant::now();
        for _ in 0..reps {
            runtime.query(OUTCOME_GAUGES_SQL, &[]).await.unwrap();
        }
        let wall_ms = w0.elapsed().as_secs_f64() * 1000.0 / reps as f64;
        let db_ms = b
            .pgss_sum("total_exec_time", "and query like '%trigger_outcomes%'")
            .await
            / reps as f64;
        let per_min = db_ms * EVALS_PER_MINUTE;
        let explain: Vec<String> =
            b.su.query(
                &format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) {OUTCOME_GAUGES_SQL}"),
                &[],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, String>(0))
            .collect();
        plans.push_str(&format!("{what}:\n\n```\n{}\n```\n\n", explain.join("\n")));
        b.row(
            Row::new(
                "E1",
                key,
                format!("overdue evaluation at {n} triggers with a window, {what}: database time per minute ({EVALS_PER_MINUTE} evaluations)"),
                per_min,
                "ms",
            )
            .lower_better()
            .detail(format!(
                "{db_ms:.3} ms of execution per evaluation (pg_stat_statements, {reps} runs), {wall_ms:.2} ms round trip"
            ))
            .target("≤ 50 ms per minute", per_min <= 50.0),
        );
    }
    let admin = b.srv.connect("qlsched_admin", "qlsched").await;
    let q = qlsched::store::triggers::ListQuery {
        project: None,
        state: qlsched::store::triggers::StateFilter::Overdue,
        after: None,
        limit: 100,
    };
    let l0 = Instant::now();
    let page = qlsched::store::triggers::list(&admin, &q).await.unwrap();
    let list_ms = l0.elapsed().as_secs_f64() * 1000.0;
    b.note(format!(
        "O: {n} triggers given a 1-day window in {setup_s:.1} s (one UPDATE of the trigger rows; \
         V19's trigger wrote each outcome row). `trigger list --state overdue` with all overdue: \
         first page of {} in {list_ms:.1} ms. Plans of the gauge statement:\n\n{plans}",
        page.len()
    ));
}
