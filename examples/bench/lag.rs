//! Rows 3 and 3b: lag (queued_at − scheduled_for) of steady load with 3 replicas at the
//! default configuration: triggers spread over a minute (`S * * * * *`), and every-second
//! triggers with where their lag goes: batches per instant, each replica's share and last
//! batch, and what the runtime role's backends wait on (sampled every 5 ms).

use crate::env::{clk_tck, now_ms, nproc, say, sleep_s, Bench};
use crate::load::{Layout, Load};
use crate::replicas::{Group, Setup};
use crate::report::Row;

/// count, p50, p99, max of queued_at − scheduled_for over the runs scheduled in [w0, w1].
pub async fn lag_stats(b: &Bench, w0: i64, w1: i64) -> (f64, f64, f64, f64) {
    let r = b
        .su
        .query_one(
            "select count(*)::float8,
                    coalesce(percentile_cont(0.5) within group (order by queued_at_ms - scheduled_for_ms), 0),
                    coalesce(percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms), 0),
                    coalesce(max(queued_at_ms - scheduled_for_ms), 0)::float8
               from qlsched.runs where scheduled_for_ms between $1 and $2",
            &[&w0, &w1],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2), r.get(3))
}

struct Cpu {
    server: u64,
    replicas: u64,
    machine: u64,
    ms: i64,
}

/// One lag row: `n` triggers in `layout`, 3 replicas for `secs`; the window runs from
/// `warm_s` after the start to 3 s before the stop. `second`: every trigger is due every
/// second (else one per minute at its second).
async fn lag_row(
    b: &mut Bench,
    key: &str,
    label: &str,
    n: u64,
    layout: Layout,
    secs: f64,
    breakdown: bool,
) {
    let s = b.sizes.clone();
    say(&format!(
        "3. {label}, 3 replicas (default config), {secs} s"
    ));
    b.reset().await;
    let mut l = Load::new(layout);
    l.lead_ms = s.lag_lead_ms;
    b.load(n, &l).await;
    b.warm_wal(label).await;
    b.checkpoint().await;
    b.pgss_reset().await;
    let ts = now_ms();
    // The default configuration, or another claim budget to see what the rounds cost.
    let setup = match std::env::var("QLSCHED_BENCH_LAG_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok())
    {
        Some(budget) => {
            b.note(format!(
                "{label}: the replicas' claim_budget is {budget} (QLSCHED_BENCH_LAG_BUDGET)"
            ));
            Setup::with_budget(&b.runtime_dsn, budget, "30s")
        }
        None => Setup::default_config(&b.runtime_dsn),
    };
    let g = Group::start(3, &setup);
    sleep_s(s.warm_s).await;
    let (r0, s0, m0, c0) = (
        g.cpu_ticks(),
        b.server_ticks(),
        crate::env::machine_busy_ticks(),
        now_ms(),
    );
    let waits = if breakdown {
        b.sample_waits("qlsched_runtime", secs - s.warm_s - s.tail_s)
            .await
    } else {
        sleep_s(secs - s.warm_s - s.tail_s).await;
        String::new()
    };
    let cpu = Cpu {
        replicas: g.cpu_ticks() - r0,
        server: b.server_ticks().saturating_sub(s0),
        machine: crate::env::machine_busy_ticks() - m0,
        ms: now_ms() - c0,
    };
    sleep_s(s.tail_s).await;
    let te = now_ms();
    let (w0, w1) = (
        ts + (s.warm_s * 1000.0) as i64,
        te - (s.tail_s * 1000.0) as i64,
    );
    let (count, p50, p99, max) = lag_stats(b, w0, w1).await;
    let expected = if layout == Layout::Second {
        b.num(&format!(
            "select count(*) * (floor({w1} / 1000.0) - ceil({w0} / 1000.0) + 1)::bigint from qlsched.triggers"
        ))
        .await
    } else {
        b.num(&format!(
            "with per_s as (select split_part(cron_expr, ' ', 1)::int s, count(*) n from qlsched.triggers group by 1)
             select coalesce(sum(n), 0) from per_s, generate_series(ceil({w0} / 1000.0)::bigint, floor({w1} / 1000.0)::bigint) sec
              where per_s.s = sec % 60"
        ))
        .await
    };
    g.stop().await;
    let dups = b.invariants(label).await;
    b.check(
        &format!("{label}: admitted {count} of {expected} due, duplicates {dups}"),
        count >= expected && dups == 0,
    );
    b.row(
        Row::new("3", key, format!("{label}, 3 replicas, {} s window", (w1 - w0) / 1000), p99, "ms p99")
            .lower_better()
            .detail(format!("p50 {p50:.0} ms, p99 {p99:.0} ms, max {max:.0} ms; admitted {count} / {expected} due in the window, duplicates {dups}"))
            .target("p99 ≤ 50 ms", p99 <= 50.0 && count >= expected && dups == 0),
    );
    if breakdown {
        b.note(format!("{label}: the runtime role's active backends, sampled every 5 ms in the window: {waits}"));
        where_it_goes(b, label, w0, w1, cpu).await;
    }
}

/// Row 3b. An admission statement stamps all its runs with one queued_at, so the runs of one
/// replica with one queued_at are one batch: the first batch of an instant measures wake +
/// claim + decision; a replica's later batches of the same instant waited for its earlier ones.
async fn where_it_goes(b: &mut Bench, label: &str, w0: i64, w1: i64, cpu: Cpu) {
    let r = b
        .su
        .query_one(
            "with r as (select scheduled_for_ms sf, queued_at_ms q, admitted_by a from qlsched.runs
                         where scheduled_for_ms between $1 and $2),
                  b as (select sf, a, q, count(*) n, row_number() over (partition by sf, a order by q) ord
                          from r group by sf, a, q),
                  i as (select sf, min(q - sf) first_ms, count(*) batches from b group by sf),
                  rb as (select r.q - r.sf lag, b.ord, b.n from r join b using (sf, a, q))
             select coalesce((select avg(batches) from i), 0)::float8,
                    coalesce((select percentile_cont(0.5) within group (order by first_ms) from i), 0),
                    coalesce((select percentile_cont(0.99) within group (order by first_ms) from i), 0),
                    (100.0 * count(*) filter (where ord > 1) / greatest(count(*), 1))::float8,
                    coalesce(percentile_cont(0.99) within group (order by lag) filter (where ord = 1), 0),
                    coalesce(percentile_cont(0.5) within group (order by lag) filter (where ord > 1), 0),
                    coalesce(avg(n), 0)::float8
               from rb",
            &[&w0, &w1],
        )
        .await
        .unwrap();
    let (batches, f50, f99, later, p99first, p50later, avgn): (f64, f64, f64, f64, f64, f64, f64) = (
        r.get(0),
        r.get(1),
        r.get(2),
        r.get(3),
        r.get(4),
        r.get(5),
        r.get(6),
    );
    let per_s = |t: u64| 1000.0 * t as f64 / clk_tck() / (cpu.ms as f64 / 1000.0);
    let per = b
        .su
        .query(
            "with r as (select scheduled_for_ms sf, queued_at_ms - scheduled_for_ms lag, admitted_by a from qlsched.runs
                         where scheduled_for_ms between $1 and $2),
                  p as (select sf, a, count(*) n, count(distinct lag) batches, min(lag) first, max(lag) last,
                               row_number() over (partition by sf order by max(lag) desc) rk from r group by sf, a)
             select rk, avg(n)::float8, avg(batches)::float8, avg(first)::float8, avg(last)::float8,
                    (select string_agg(a || ' ' || k, ', ') from (select a, count(*) k from p p2 where p2.rk = p.rk group by a) x)
               from p group by rk order by rk",
            &[&w0, &w1],
        )
        .await
        .unwrap();
    b.note(format!(
        "{label}: per replica and instant, ranked by its last batch (runs, batches, first and last batch ms): {}",
        per.iter()
            .map(|r| format!(
                "#{}: {:.0} runs, {:.1} batches, {:.0}..{:.0} ms ({})",
                r.get::<_, i64>(0),
                r.get::<_, f64>(1),
                r.get::<_, f64>(2),
                r.get::<_, f64>(3),
                r.get::<_, f64>(4),
                r.get::<_, String>(5)
            ))
            .collect::<Vec<_>>()
            .join("; ")
    ));
    let top = b.pgss_top("total_plan_time + total_exec_time", 6).await;
    b.note(format!("{label}: top statements of the runtime role (pg_stat_statements, by plan + execution time):\n\n{top}"));
    b.row(
        Row::new("3b", "lag_second_first_batch_p99", format!("{label}: where the lag goes (admission batches per instant = distinct queued_at per replica)"), f99, "ms")
            .lower_better()
            .detail(format!(
                "{batches:.2} batches per instant (runs' mean batch {avgn:.1}); first batch of an instant at p50 {f50:.0} / p99 {f99:.0} ms \
                 after it (wake + claim + decision); {later:.2} % of runs waited for a later batch of their replica (their p50 {p50later:.0} ms); \
                 first-batch runs' p99 {p99first:.0} ms; CPU per instant (= per second): server {:.0} ms, replicas {:.0} ms, whole machine {:.0} ms of {} ms ({} CPUs)",
                per_s(cpu.server), per_s(cpu.replicas), per_s(cpu.machine), nproc() * 1000, nproc()
            )),
    );
}

/// The every-second row alone (with its breakdown).
pub async fn second_row(b: &mut Bench) {
    let s = b.sizes.clone();
    lag_row(
        b,
        "lag_second_p99",
        &format!("every-second lag: {} every-second triggers", s.second_n),
        s.second_n,
        Layout::Second,
        s.second_s,
        true,
    )
    .await;
}

/// The steady row and the every-second row (with its breakdown).
pub async fn rows(b: &mut Bench) {
    let s = b.sizes.clone();
    if std::env::var("QLSCHED_BENCH_LAG_ROWS").as_deref() != Ok("second") {
        lag_row(
            b,
            "lag_steady_p99",
            &format!("steady lag: {} triggers over a minute", s.steady_n),
            s.steady_n,
            Layout::Stagger,
            s.steady_s,
            false,
        )
        .await;
    }
    lag_row(
        b,
        "lag_second_p99",
        &format!("every-second lag: {} every-second triggers", s.second_n),
        s.second_n,
        Layout::Second,
        s.second_s,
        true,
    )
    .await;
}
