//! Rows R: retention while admitting. Every-second triggers, 3 replicas with `[retention]`
//! finished_after = "2m", interval = "5s", and a dispatcher finishing every run (in this
//! process, through the dispatcher protocol's own statements, `store::dispatch::protocol`,
//! as the dispatcher role). A main phase samples the size of runs, attempts and run_events;
//! then phases with retention off, on, off, on (replicas restarted between them): lag p99 of
//! the "on" phases against the "off" ones, and how fast each "on" phase prunes the backlog
//! the "off" phase before it left. Every run admitted is seen: those still in qlsched.runs,
//! and the pruned ones, which a statement-level AFTER DELETE trigger (added here, bench only)
//! copies into an unlogged side table: lost = occurrences due without a run in either,
//! duplicates = pairs with two runs, unfinished pruned = side-table rows not finished.
//! (The smoke mode runs it for seconds: nothing reaches the 60 s minimum horizon.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use qlsched::store::dispatch::protocol;

use crate::env::{now_ms, say, sleep_s, Bench};
use crate::load::{Layout, Load};
use crate::replicas::{Group, Setup};
use crate::report::Row;

const AUDIT: &str = "SET client_min_messages = warning;
 CREATE SCHEMA IF NOT EXISTS bench_audit;
 CREATE UNLOGGED TABLE IF NOT EXISTS bench_audit.pruned (run_id uuid, trigger_id text, scheduled_for_ms bigint,
                                                         queued_at_ms bigint, status text);
 CREATE OR REPLACE FUNCTION bench_audit.log_pruned() RETURNS trigger LANGUAGE plpgsql AS $$
 BEGIN
   INSERT INTO bench_audit.pruned SELECT run_id, trigger_id, scheduled_for_ms, queued_at_ms, status FROM gone;
   RETURN NULL;
 END $$;
 DROP TRIGGER IF EXISTS zz_bench_audit_pruned ON qlsched.runs;
 CREATE TRIGGER zz_bench_audit_pruned AFTER DELETE ON qlsched.runs REFERENCING OLD TABLE AS gone
   FOR EACH STATEMENT EXECUTE FUNCTION bench_audit.log_pruned();
 GRANT USAGE ON SCHEMA bench_audit TO qlsched_owner;
 GRANT INSERT ON bench_audit.pruned TO qlsched_owner;
 CREATE OR REPLACE VIEW bench_audit.all_runs AS
   SELECT run_id, trigger_id, scheduled_for_ms, queued_at_ms, status, false AS pruned FROM qlsched.runs
   UNION ALL SELECT run_id, trigger_id, scheduled_for_ms, queued_at_ms, status, true FROM bench_audit.pruned";

const UNDO_AUDIT: &str = "DROP TRIGGER IF EXISTS zz_bench_audit_pruned ON qlsched.runs;
 DROP SCHEMA bench_audit CASCADE";

/// Dispatcher tasks taking, starting and finishing every queued run until `stop`.
fn dispatch(
    b: &Bench,
    tasks: usize,
    stop: Arc<AtomicBool>,
    finished: Arc<AtomicU64>,
) -> Vec<tokio::task::JoinHandle<()>> {
    (0..tasks)
        .map(|i| {
            let (config, stop, finished) = (
                b.srv.config("qlsched_dispatcher", "qlsched"),
                stop.clone(),
                finished.clone(),
            );
            tokio::spawn(async move {
                let (c, conn) = config
                    .connect(tokio_postgres::NoTls)
                    .await
                    .expect("connect as the dispatcher");
                tokio::spawn(conn);
                let worker = format!("bench-dispatcher-{i}");
                let lease = 30_000i64;
                while !stop.load(Ordering::Relaxed) {
                    let taken = c
                        .query(
                            protocol::TAKE,
                            &[&worker, &None::<Vec<String>>, &500i32, &lease],
                        )
                        .await
                        .expect("dispatch_take");
                    if taken.is_empty() {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                    for t in &taken {
                        let (attempt, token): (uuid::Uuid, uuid::Uuid) = (t.get(1), t.get(3));
                        let started: bool = c
                            .query_one(protocol::START, &[&attempt, &token, &lease])
                            .await
                            .expect("dispatch_start")
                            .get(0);
                        if started {
                            c.query_one(
                                protocol::FINISH,
                                &[
                                    &attempt,
                                    &token,
                                    &"succeeded",
                                    &Some(0i32),
                                    &None::<String>,
                                    &None::<String>,
                                    &None::<serde_json::Value>,
                                ],
                            )
                            .await
                            .expect("dispatch_finish");
                            finished.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                }
            })
        })
        .collect()
}

fn setup(b: &Bench, on: bool) -> Setup {
    let mut s = Setup::default_config(&b.runtime_dsn);
    s.extra = format!(
        "[retention]\nfinished_after = \"{}\"\ninterval = \"5s\"\nbatch = {}\n",
        if on { "2m" } else { "0" },
        std::env::var("QLSCHED_BENCH_PRUNE_BATCH").unwrap_or("1000".into())
    );
    s
}

async fn sizes_mib(b: &Bench) -> f64 {
    b.num("select (pg_total_relation_size('qlsched.runs') + pg_total_relation_size('qlsched.attempts')
                   + pg_total_relation_size('qlsched.run_events')) / 1048576.0")
        .await
}

async fn lag_p99(b: &Bench, windows: &[(i64, i64)]) -> f64 {
    if windows.is_empty() {
        return 0.0;
    }
    let w: Vec<String> = windows
        .iter()
        .map(|(a, z)| format!("scheduled_for_ms between {a} and {z}"))
        .collect();
    b.num(&format!(
        "select percentile_cont(0.99) within group (order by queued_at_ms - scheduled_for_ms)
           from bench_audit.all_runs where {}",
        w.join(" or ")
    ))
    .await
}

pub async fn rows(b: &mut Bench, quick: bool) {
    let smoke = b.sizes.smoke;
    let (n, main_s, alt_s, sample_s) = if smoke {
        (50u64, 4.0f64, 2.0f64, 2.0f64)
    } else if quick {
        (1000, 240.0, 40.0, 30.0)
    } else {
        (1000, 600.0, 60.0, 30.0)
    };
    say(&format!("R. retention: {n} every-second triggers, 3 replicas, dispatcher, finished_after 2m; main {main_s} s, then off/on/off/on {alt_s} s each"));
    b.reset().await;
    let mut l = Load::new(Layout::Second);
    l.prefix = "r";
    l.lead_ms = if smoke { 1000 } else { 5000 };
    b.load(n, &l).await;
    b.exec(AUDIT).await;
    b.checkpoint().await;
    let (stop, finished) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
    );
    let dispatchers = dispatch(b, 2, stop.clone(), finished.clone());
    let run_t0 = now_ms();
    let mut g = Group::start(3, &setup(b, true));
    g.wait_ready().await;
    let mut samples = Vec::new();
    let mut pruned = 0.0;
    let mut t = 0.0;
    while t < main_s {
        sleep_s(sample_s.min(main_s - t)).await;
        t += sample_s;
        g.assert_alive();
        samples.push((t, sizes_mib(b).await));
    }
    let main_t1 = now_ms();
    pruned += g.metric_sum("qlsched_runs_pruned_total");
    g.stop().await;
    b.pgss_reset().await;
    let (mut on_w, mut off_w, mut rates) = (Vec::new(), Vec::new(), Vec::new());
    let mut last = main_t1;
    for (i, on) in [false, true, false, true].into_iter().enumerate() {
        say(&format!(
            "R. phase {} retention {}, {alt_s} s",
            i + 1,
            if on { "on" } else { "off" }
        ));
        let p0 = now_ms();
        let mut g = Group::start(3, &setup(b, on));
        g.wait_ready().await;
        sleep_s(alt_s - (now_ms() - p0) as f64 / 1000.0).await;
        let p1 = now_ms();
        let pr = g.metric_sum("qlsched_runs_pruned_total");
        let secs = g.metric_sum("qlsched_prune_duration_seconds_sum");
        if on {
            rates.push(if secs > 0.0 {
                (pr / secs).max(0.0)
            } else {
                0.0
            });
        }
        pruned += pr;
        g.stop().await;
        let w = (
            p0 + if smoke { 1000 } else { 5000 },
            p1 - if smoke { 500 } else { 3000 },
        );
        if on {
            on_w.push(w)
        } else {
            off_w.push(w)
        }
        last = p1;
    }
    stop.store(true, Ordering::Relaxed);
    for d in dispatchers {
        d.await.expect("a dispatcher task");
    }
    let (w0, w1) = (
        run_t0 + if smoke { 2000 } else { 5000 },
        last - if smoke { 1000 } else { 3000 },
    );
    let due = b.num(&format!("select (select count(*) from qlsched.triggers) * (floor({w1} / 1000.0) - ceil({w0} / 1000.0) + 1)::bigint")).await;
    let got = b.num(&format!("select count(*) from (select distinct trigger_id, scheduled_for_ms from bench_audit.all_runs where scheduled_for_ms between {w0} and {w1}) x")).await;
    let dups = b.num("select count(*) from (select 1 from bench_audit.all_runs group by trigger_id, scheduled_for_ms having count(*) > 1) d").await;
    let unfinished = b.num("select count(*) from bench_audit.pruned where status not in ('succeeded', 'failed', 'cancelled')").await;
    let audit_n = b.num("select count(*) from bench_audit.pruned").await;
    // Replicas restart between phases: the seconds around a restart are admitted late, not lost,
    // unless past the misfire grace (skipped, counted by the replicas).
    let lost = (due - got).max(0.0);
    let (p_on, p_off) = (lag_p99(b, &on_w).await, lag_p99(b, &off_w).await);
    let prune = b
        .pgss_sum("wal_bytes", "and query ilike '%prune_finished%'")
        .await;
    b.exec(UNDO_AUDIT).await;
    b.invariants("retention").await;
    b.check(
        &format!("retention: duplicates {dups}, unfinished pruned {unfinished}"),
        dups == 0.0 && unfinished == 0.0,
    );
    let half = samples
        .get(samples.len().saturating_sub(1) / 2)
        .map(|s| s.1)
        .unwrap_or(0.0);
    let end = samples.last().map(|s| s.1).unwrap_or(0.0);
    let sizes_txt: Vec<String> = samples
        .iter()
        .map(|(t, m)| format!("{t:.0} s: {m:.1} MiB"))
        .collect();
    b.row(
        Row::new("R", "retention_size_end_vs_middle", format!("retention 2m, {n} every-second triggers: size of runs + attempts + events, end vs middle of the {main_s:.0} s main phase"), end / half.max(0.001), "×")
            .lower_better()
            .detail(format!("{}; {} runs dispatched and finished", sizes_txt.join(", "), finished.load(Ordering::Relaxed)))
            .target("≤ 1.1 × (bounded)", end <= 1.1 * half || smoke),
    );
    b.row(
        Row::new("R", "retention_exactly_once", "retention: occurrences lost, duplicated, or pruned unfinished", lost + dups + unfinished, "")
            .lower_better()
            .detail(format!("due {due:.0}, seen {got:.0} (pruned {audit_n:.0}, metric {pruned:.0}); lost {lost:.0}, duplicates {dups:.0}, unfinished pruned {unfinished:.0}"))
            .target("0", lost + dups + unfinished == 0.0),
    );
    b.row(
        Row::new("R", "retention_lag_on_p99", "retention: lag p99 with pruning on (vs off), alternating phases", p_on, "ms")
            .lower_better()
            .detail(format!("off {p_off:.0} ms; prune throughput while admitting {} runs/s of prune batch time; WAL of the prune statements {:.0} kB", rates.iter().map(|r| format!("{r:.0}")).collect::<Vec<_>>().join(" / "), prune / 1024.0))
            .target("on ≤ off + 50 ms", p_on <= p_off + 50.0),
    );
}
