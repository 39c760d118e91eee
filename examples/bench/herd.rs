//! Row 7 (and H, the 100k herd): every-minute triggers published as `trigger publish`
//! writes them (4 at a time), all due at one boundary, 3 replicas at the default config;
//! the time from each boundary until its last run is committed, at consecutive boundaries.
//! The smoke mode's herd fires every 5 s (`*/5 * * * * *`) instead of every minute.

use crate::env::{now_ms, say, sleep_s, vmhwm_kib, Bench};
use crate::lag::lag_stats;
use crate::replicas::{Group, Setup};
use crate::report::Row;

pub struct Herd {
    pub key: &'static str,
    pub n: u64,
    pub boundaries: usize,
    /// Every-second triggers running beside the herd (their lag during each herd).
    pub second_n: u64,
    /// `--jitter` on every herd trigger (0: none). Row J: the lag is measured from each run's
    /// jittered instant (`runs.due_at_ms`), with the peak per-second admission rate.
    pub jitter_ms: i64,
}

/// Row J's figures of one boundary: lag from the jittered instant (p50, p99, max, ms), the
/// peak number of runs committed in one second, and the span of the jittered instants.
async fn jittered_stats(b: &Bench, boundary: i64) -> (f64, f64, f64, f64, f64) {
    let r = b
        .su
        .query_one(
            "select coalesce(percentile_cont(0.5) within group (order by queued_at_ms - due_at_ms), 0),
                    coalesce(percentile_cont(0.99) within group (order by queued_at_ms - due_at_ms), 0),
                    coalesce(max(queued_at_ms - due_at_ms), 0)::float8,
                    coalesce((select max(c) from (select count(*) c from qlsched.runs
                                                    where scheduled_for_ms = $1
                                                    group by queued_at_ms / 1000) s), 0)::float8,
                    coalesce(max(due_at_ms) - min(due_at_ms), 0)::float8
               from qlsched.runs where scheduled_for_ms = $1",
            &[&boundary],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4))
}

/// Waits until `n` runs of `boundary` are committed or `give_up_ms` after it; returns the count.
async fn count_at(b: &Bench, boundary: i64, n: u64, give_up_ms: i64) -> i64 {
    loop {
        let c = b
            .num(&format!(
                "select count(*) from qlsched.runs where scheduled_for_ms = {boundary}"
            ))
            .await as i64;
        if c >= n as i64 || now_ms() > boundary + give_up_ms {
            return c;
        }
        sleep_s(if n >= 100_000 { 1.0 } else { 0.2 }).await;
    }
}

pub async fn row(b: &mut Bench, h: Herd) {
    let s = b.sizes.clone();
    let (cron, period) = if s.smoke {
        ("*/5 * * * * *", 5_000)
    } else {
        ("0 * * * * *", 60_000)
    };
    say(&format!(
        "7. boundary herd: {} triggers `{cron}`, 3 replicas (default config), {} boundaries",
        h.n, h.boundaries
    ));
    b.reset().await;
    let pub_s = b.publish_jittered("h", 1, h.n, cron, 4, h.jitter_ms).await;
    if h.second_n > 0 {
        b.publish("s", 1, h.second_n, "* * * * * *", 4).await;
    }
    b.warm_wal(h.key).await;
    b.checkpoint().await;
    let mut g = Group::start(3, &Setup::default_config(&b.runtime_dsn));
    g.wait_ready().await;
    // The first boundary at least `herd_lead_s` after readiness (earlier ones, due while
    // publishing, are caught up at start).
    let first = (now_ms() + s.herd_lead_s * 1000) / period * period + period;
    let mut times = Vec::new();
    let mut detail = String::new();
    let mut p99s: Vec<f64> = Vec::new();
    for i in 0..h.boundaries {
        let boundary = first + i as i64 * period;
        let c = count_at(b, boundary, h.n, period.min(60_000)).await;
        let t = b
            .num(&format!("select coalesce(max(queued_at_ms), 0) - {boundary} from qlsched.runs where scheduled_for_ms = {boundary}"))
            .await;
        let tab = b
            .text(
                "select n_dead_tup || ' dead tuples, ' || autovacuum_count || ' autovacuums, claim index '
                        || pg_size_pretty(pg_relation_size('qlsched.trigger_schedules_claimable_idx'))
                   from pg_stat_user_tables where relid = 'qlsched.trigger_schedules'::regclass",
            )
            .await;
        b.check(
            &format!("herd boundary {}: {c}/{} runs", i + 1, h.n),
            c >= h.n as i64,
        );
        let mut lag = String::new();
        if h.jitter_ms > 0 {
            let (p50, p99, max, peak, spread) = jittered_stats(b, boundary).await;
            lag = format!(", lag from the jittered instant p50 {p50:.0} / p99 {p99:.0} / max {max:.0} ms, jittered instants spread over {spread:.0} ms, peak {peak:.0} admissions in one second");
            p99s.push(p99);
        }
        if h.second_n > 0 {
            let (cnt, p50, p99, max) = lag_stats(b, boundary, boundary + t as i64).await;
            lag = format!(", every-second lag during it: {cnt} runs, p50 {p50:.0} / p99 {p99:.0} / max {max:.0} ms");
        }
        eprintln!(
            "   boundary {}: {c}/{} runs, last committed {t:.0} ms after it; {tab}{lag}",
            i + 1,
            h.n
        );
        detail.push_str(&format!(
            "boundary {}: {c} runs, all committed {t:.0} ms after it ({tab}){lag}; ",
            i + 1
        ));
        times.push(t);
    }
    let rss: Vec<String> = g
        .pids()
        .into_iter()
        .map(|p| format!("{:.1}", vmhwm_kib(p) as f64 / 1024.0))
        .collect();
    g.stop().await;
    let dups = b.invariants("herd").await;
    b.check(&format!("herd: duplicates {dups}"), dups == 0);
    let max = times.iter().cloned().fold(0.0, f64::max);
    let (t_first, t_last) = (times[0], *times.last().unwrap());
    let bc = b.ceiling_batched.get(&3).map(|c| {
        format!(
            "; slowest boundary = {:.2}× batched ceiling c=3",
            h.n as f64 / (max.max(1.0) / 1000.0) / c
        )
    });
    let rate = h.n as f64 / (max.max(1.0) / 1000.0);
    if h.jitter_ms > 0 {
        let worst = p99s.iter().cloned().fold(0.0, f64::max);
        b.row(
            Row::new(
                "J",
                h.key,
                format!(
                    "jittered herd: {} triggers `{cron}` with `--jitter {} ms`, published as `trigger publish` writes them (4 at a time, {pub_s:.0} s), 3 replicas, default config, {} consecutive boundaries",
                    h.n, h.jitter_ms, h.boundaries
                ),
                worst,
                "ms (lag p99 from the jittered instant, worst boundary)",
            )
            .lower_better()
            .detail(format!("{detail}duplicates {dups}; peak RSS per replica {} MiB", rss.join(" / ")))
            .target("p99 ≤ 50 ms from the jittered instant at every boundary", worst <= 50.0 && dups == 0),
        );
        return;
    }
    b.row(
        Row::new(
            if h.n >= 100_000 { "H" } else { "7" },
            h.key,
            format!(
                "boundary herd: {} triggers published as `trigger publish` writes them (4 at a time, {pub_s:.0} s), due at one boundary, 3 replicas, default config, {} consecutive boundaries",
                h.n, h.boundaries
            ),
            max,
            "ms (slowest boundary)",
        )
        .lower_better()
        .ceiling(b.ceiling_batched.get(&3).and_then(|c| crate::stats::ratio(rate, *c)))
        .detail(format!("{detail}duplicates {dups}; peak RSS per replica {} MiB{}", rss.join(" / "), bc.unwrap_or_default()))
        .target(
            if h.n >= 100_000 {
                "≤ 10000 ms at every boundary; the last ≤ 1.2 × the first"
            } else {
                "≤ 2000 ms at every boundary; the last ≤ 1.2 × the first"
            },
            max <= if h.n >= 100_000 { 10_000.0 } else { 2000.0 } && t_last <= 1.2 * t_first && dups == 0,
        ),
    );
}
