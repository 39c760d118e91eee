//! Rows C: sustained every-second capacity of 3 replicas at the default configuration,
//! found by stepping the load. For each step N until the first that falls behind: the
//! every-second triggers are published up to N (replicas stopped), the runs are reset and
//! every cursor moved to the same whole second T0 ahead; then a window of whole seconds
//! after a warm-up: kept up when every occurrence due in the window is committed 2 s after
//! it ended, with lag p99 ≤ 1 s and no duplicates. The highest step that kept up is then
//! held longer and measured the same way: that is the capacity row.

use crate::env::{clk_tck, now_ms, say, sleep_s, Bench};
use crate::lag::lag_stats;
use crate::replicas::{Group, Setup};
use crate::report::Row;

struct Step {
    n: u64,
    due: f64,
    admitted: f64,
    p99: f64,
    server_cpu_pct: f64,
    wal_per_s: f64,
}

async fn measure(b: &mut Bench, n: u64, warm_s: f64, win_s: i64) -> Step {
    b.exec(
        "SET session_replication_role = replica;
         TRUNCATE qlsched.run_events, qlsched.attempts, qlsched.runs, qlsched.replicas;
         RESET session_replication_role",
    )
    .await;
    let t0 = (b.db_now_ms().await / 1000 + 3) * 1000;
    b.exec(&format!(
        "UPDATE qlsched.trigger_schedules
            SET next_fire_at_ms = {t0}, claimable_at_ms = {t0}, last_scheduled_at_ms = NULL,
                claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                claim_version = claim_version + 1, state_version = state_version + 1,
                updated_at_ms = (extract(epoch from clock_timestamp()) * 1000)::bigint;
         CHECKPOINT"
    ))
    .await;
    let mut g = Group::start(3, &Setup::default_config(&b.runtime_dsn));
    g.wait_ready().await;
    let w0 = ((now_ms().max(t0) as f64 + warm_s * 1000.0) / 1000.0).ceil() as i64 * 1000;
    sleep_s((w0 - now_ms()) as f64 / 1000.0).await;
    let (s0, lsn0) = (b.server_ticks(), b.lsn().await);
    let w1 = w0 + (win_s - 1) * 1000;
    sleep_s((w1 + 1000 - now_ms()) as f64 / 1000.0).await;
    let server = b.server_ticks().saturating_sub(s0);
    let wal = b.wal_since(&lsn0).await;
    sleep_s((w1 + 2000 - now_ms()) as f64 / 1000.0).await;
    let (admitted, _, p99, _) = lag_stats(b, w0, w1).await;
    g.stop().await;
    let dups = b.invariants(&format!("capacity step {n}")).await;
    b.check(&format!("capacity step {n}: duplicates {dups}"), dups == 0);
    Step {
        n,
        due: (n as i64 * win_s) as f64,
        admitted,
        p99,
        server_cpu_pct: 100.0 * server as f64 / clk_tck() / win_s as f64,
        wal_per_s: wal / win_s as f64,
    }
}

fn kept_up(s: &Step) -> bool {
    s.admitted >= s.due && s.p99 <= 1000.0
}

pub async fn rows(b: &mut Bench) {
    let smoke = b.sizes.smoke;
    let steps: Vec<u64> = std::env::var("QLSCHED_BENCH_CAP_STEPS")
        .ok()
        .map(|s| {
            s.split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect()
        })
        .unwrap_or_else(|| {
            if smoke {
                vec![50]
            } else {
                vec![
                    2000, 3000, 4000, 5000, 6000, 7000, 8000, 9000, 10000, 12000, 14000, 16000,
                ]
            }
        });
    let (warm, win, hold) = if smoke { (1.0, 2, 2) } else { (15.0, 60, 300) };
    say(&format!(
        "C. capacity: every-second triggers, steps {steps:?}, {win} s windows, then {hold} s held"
    ));
    b.reset().await;
    let mut published = 0;
    let mut best: Option<u64> = None;
    for &n in &steps {
        let t = b
            .publish("c", published + 1, n - published, "* * * * * *", 4)
            .await;
        eprintln!(
            "   published {} every-second triggers in {t:.1} s",
            n - published
        );
        published = n;
        let s = measure(b, n, warm, win).await;
        let ok = kept_up(&s);
        b.row(
            Row::new(
                "C",
                &format!("capacity_step_{n}"),
                format!("capacity step: {n} every-second triggers, 3 replicas, {win} s window"),
                s.p99,
                "ms p99",
            )
            .lower_better()
            .detail(format!(
                "admitted {} / {} due, server CPU {:.0} % of a core, WAL {:.0} kB/s{}",
                s.admitted,
                s.due,
                s.server_cpu_pct,
                s.wal_per_s / 1024.0,
                if ok { "" } else { " — fell behind" }
            )),
        );
        if !ok {
            break;
        }
        best = Some(n);
    }
    let Some(n) = best else {
        b.check("capacity: no step kept up", smoke);
        return;
    };
    if n < published {
        b.exec(&format!(
            "SET session_replication_role = replica;
             DELETE FROM qlsched.trigger_schedules WHERE trigger_id > 'c{n:07}';
             DELETE FROM qlsched.triggers WHERE trigger_id > 'c{n:07}';
             RESET session_replication_role"
        ))
        .await;
    }
    say(&format!(
        "C. capacity: {n} every-second triggers held {hold} s"
    ));
    let s = measure(b, n, warm, hold).await;
    b.check(
        &format!(
            "capacity hold {n}: admitted {} of {} due",
            s.admitted, s.due
        ),
        kept_up(&s) || smoke,
    );
    b.row(
        Row::new(
            "C",
            "capacity",
            format!(
                "sustained capacity: every-second occurrences 3 replicas keep up with for {hold} s"
            ),
            (s.n) as f64,
            "occ/s",
        )
        .higher_better()
        .detail(format!(
            "admitted {} / {} due, lag p99 {:.0} ms, server CPU {:.0} % of a core, WAL {:.0} kB/s",
            s.admitted,
            s.due,
            s.p99,
            s.server_cpu_pct,
            s.wal_per_s / 1024.0
        ))
        .target("all admitted, p99 ≤ 1 s", kept_up(&s)),
    );
}
