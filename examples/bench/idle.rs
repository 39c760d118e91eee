//! Row 5: idle cost: triggers none of which is due, 3 replicas at the default config.

use crate::env::{clk_tck, now_ms, say, sleep_s, Bench};
use crate::load::{Layout, Load};
use crate::replicas::{Group, Setup};
use crate::report::Row;

pub async fn rows(b: &mut Bench) {
    let s = b.sizes.clone();
    say(&format!(
        "5. idle: {} triggers, none due, 3 replicas (default config), {} s",
        s.idle_n, s.idle_s
    ));
    b.reset().await;
    b.load(s.idle_n, &Load::new(Layout::Idle)).await;
    b.checkpoint().await;
    let mut g = Group::start(3, &Setup::default_config(&b.runtime_dsn));
    g.wait_ready().await;
    sleep_s(if s.smoke { 1.0 } else { 5.0 }).await;
    b.pgss_reset().await;
    let pids = g.pids();
    let c0: Vec<u64> = pids.iter().map(|&p| crate::env::cpu_ticks(p)).collect();
    let t0 = now_ms();
    sleep_s(s.idle_s).await;
    let calls = b.pgss_sum("calls", "").await;
    let secs = (now_ms() - t0) as f64 / 1000.0;
    let server_ms = b.pgss_sum("total_plan_time + total_exec_time", "").await / secs / 3.0;
    let mix = b.pgss_mix(secs, 3.0).await;
    let cpu_max = pids
        .iter()
        .zip(&c0)
        .map(|(&p, &c)| 100.0 * (crate::env::cpu_ticks(p) - c) as f64 / clk_tck() / secs)
        .fold(0.0, f64::max);
    let top = b.pgss_top("calls", 10).await;
    g.stop().await;
    let per = calls / secs / 3.0;
    b.row(
        Row::new("5", "idle_statements", format!("idle: {} triggers, none due, 3 replicas, default cadence", s.idle_n), per, "statements/s per replica")
            .lower_better()
            .detail(format!("({mix}), server time {server_ms:.1} ms/s per replica, replica CPU {cpu_max:.2} % (busiest)"))
            .target("≤ 0.2 statements/s per replica (one per 5 s cadence)", per <= 0.2),
    );
    b.note(format!(
        "idle: {calls} statements by the runtime role in {secs:.1} s, by calls:\n\n{top}"
    ));
}
