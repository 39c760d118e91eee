//! Rows W: `qlsched worker` executing what 3 replicas admit, on a stock durable server, 3
//! worker processes beside the replicas. Each phase starts from the same state (runs and
//! triggers reset, N every-second triggers bulk-loaded, the task's spec published), waits a
//! warm-up, then measures a window of whole seconds; the window's runs get a bounded while
//! to finish, then the exactly-once invariants are checked.
//!
//! - W1: the HTTP executor against a local no-op server (`sink`), N every-second triggers.
//!   Its admission lag without workers is a phase of its own before it (same triggers, no
//!   worker started; the runs it queues are discarded by the next phase's reset), so the
//!   queued backlog never reaches the measured phase.
//! - W2: the shell executor running `/bin/true`, N every-second triggers.
//! - W3: the workers' peak resident set (VmHWM) over W1 and W2.
//!
//! Scheduled → finished is the succeeded attempt's `finished_at_ms − scheduled_for_ms`; a
//! run not finished when it is measured counts with the time of measurement.

use std::time::Duration;

use qlsched::store::manage;
use qlsched_testkit::worker::{WorkerOptions, WorkerProc};

use crate::env::{clk_tck, cpu_ticks, cpu_ticks_with_children, now_ms, say, sleep_s, vmhwm_kib};
use crate::env::{machine_busy_ticks, Bench};
use crate::load::{Layout, Load};
use crate::replicas::{Group, Setup};
use crate::report::Row;
use crate::sink::Sink;

/// The `[worker]` keys of every worker process: 64 attempts at once (W1 needs ~670 runs/s
/// per worker; an attempt holds its slot for a few ms), the shortest poll, and the shipped
/// lease and heartbeat (attempts last milliseconds: no heartbeat is ever due).
const WORKER_KEYS: &str =
    "concurrency = 64\npoll = \"100ms\"\nlease = \"60s\"\nheartbeat = \"10s\"\ndrain_timeout = \"10s\"";
/// Heartbeats are per attempt (none is due here), takes and finishes per batch: 16 connections
/// per worker (default 4) leave room for both.
const WORKER_ENV: &[(&str, &str)] = &[
    ("QLSCHED__DATABASE__POOL_SIZE", "16"),
    ("QLSCHED__LOG__LEVEL", "info"),
];

/// How long and how large each phase is.
#[derive(Clone, Copy, Debug)]
pub struct Lengths {
    pub http_n: u64,
    pub shell_n: u64,
    pub warm_s: f64,
    /// Windows, whole seconds: W1 without workers, W1, W2.
    pub bare_s: i64,
    pub http_s: i64,
    pub shell_s: i64,
    /// The bound on waiting for the window's runs after it ends.
    pub settle_s: i64,
}

impl Lengths {
    pub fn real(http_s: i64, bare_s: i64, shell_s: i64) -> Lengths {
        Lengths {
            http_n: 2000,
            shell_n: 200,
            warm_s: 15.0,
            bare_s,
            http_s,
            shell_s,
            settle_s: 120,
        }
    }

    pub fn smoke() -> Lengths {
        Lengths {
            http_n: 20,
            shell_n: 10,
            warm_s: 1.0,
            bare_s: 1,
            http_s: 2,
            shell_s: 1,
            settle_s: 20,
        }
    }
}

/// What one phase measured over its window.
#[derive(Default)]
struct Outcome {
    due: f64,
    admitted: f64,
    finished: f64,
    failed: f64,
    adm_p99: f64,
    fin_p50: f64,
    fin_p99: f64,
    fin_max: f64,
    hwm_kib: u64,
    /// CPU over the window, % of one core: (server, replicas, workers, bench, machine).
    cpu: [f64; 5],
    /// The first line of the profile: the top statement by total time.
    top: String,
}

impl Outcome {
    fn all_finished(&self) -> bool {
        self.finished >= self.due
    }

    fn cpu_split(&self) -> String {
        let [s, r, w, b, m] = self.cpu;
        format!(
            "CPU % of a core: server {s:.0}, replicas {r:.0}, workers {w:.0}, bench and sink {b:.0}, machine {m:.0} of {}",
            100 * crate::env::nproc()
        )
    }
}

/// Sets the benchmark task's spec (runs admitted afterwards pin it).
pub async fn set_spec(b: &Bench, spec: &str) {
    let mut admin = b.srv.connect("qlsched_admin", "qlsched").await;
    manage::publish_task(&mut admin, "bench", "bench-task", spec)
        .await
        .expect("publish the task's spec");
}

/// One phase: `n` every-second triggers running `spec`, 3 replicas and `workers` workers.
async fn phase(
    b: &mut Bench,
    key: &str,
    n: u64,
    spec: &str,
    workers: usize,
    l: &Lengths,
) -> Outcome {
    let win_s = match key {
        "bare" => l.bare_s,
        "http" => l.http_s,
        _ => l.shell_s,
    };
    say(&format!(
        "W1–3. {key}: {n} every-second triggers, 3 replicas, {workers} workers, {win_s} s window"
    ));
    b.reset().await;
    let mut load = Load::new(Layout::Second);
    load.prefix = "w";
    b.load(n, &load).await;
    let first = b
        .num("select min(next_fire_at_ms) from qlsched.trigger_schedules")
        .await as i64;
    set_spec(b, spec).await;
    b.warm_wal(key).await;
    b.checkpoint().await;
    b.pgss_reset().await;
    let dsn = b.srv.dsn("qlsched_dispatcher", "qlsched");
    let mut procs: Vec<WorkerProc> = (1..=workers)
        .map(|i| {
            let opts = WorkerOptions {
                worker: WORKER_KEYS,
                env: WORKER_ENV,
                ..Default::default()
            };
            WorkerProc::start(&dsn, &format!("bench-w{i}"), opts)
        })
        .collect();
    for w in &mut procs {
        w.wait_ready(Duration::from_secs(60)).await;
    }
    let mut g = Group::start(3, &Setup::default_config(&b.runtime_dsn));
    g.wait_ready().await;
    let worker_ticks =
        |ps: &[WorkerProc]| -> u64 { ps.iter().map(|w| cpu_ticks_with_children(w.pid())).sum() };
    // The window's first second: a warm-up after the replicas are ready, and never before the
    // triggers' first occurrence.
    let w0 = (((now_ms() as f64 + l.warm_s * 1000.0) / 1000.0).ceil() as i64 * 1000).max(first);
    sleep_s((w0 - now_ms()) as f64 / 1000.0).await;
    let me = std::process::id();
    let t0 = [
        b.server_ticks(),
        g.cpu_ticks(),
        worker_ticks(&procs),
        cpu_ticks(me),
        machine_busy_ticks(),
    ];
    let w1 = w0 + (win_s - 1) * 1000;
    if std::env::var("QLSCHED_BENCH_SAMPLE_WAITS").as_deref() == Ok("1") {
        // What the admissions wait on beside the workers (costs the server a little CPU).
        let waits = b
            .sample_waits("qlsched_runtime", (w1 + 1000 - now_ms()) as f64 / 1000.0)
            .await;
        b.note(format!(
            "W {key}: the runtime role's active backends over the window: {waits}"
        ));
    }
    sleep_s(((w1 + 1000 - now_ms()) as f64 / 1000.0).max(0.0)).await;
    let t1 = [
        b.server_ticks(),
        g.cpu_ticks(),
        worker_ticks(&procs),
        cpu_ticks(me),
        machine_busy_ticks(),
    ];
    let hwm_kib = procs.iter().map(|w| vmhwm_kib(w.pid())).max().unwrap_or(0);
    let due = (n as i64 * win_s) as f64;
    let deadline = w1 + 1000 + l.settle_s * 1000;
    // Wait (bounded) for the window's runs: a cheap count per poll, the statistics once.
    let settled = if workers > 0 {
        "status = 'succeeded'"
    } else {
        "true"
    };
    loop {
        let done = b
            .num(&format!(
                "select count(*) filter (where {settled}) from qlsched.runs
                  where scheduled_for_ms between {w0} and {w1}"
            ))
            .await;
        if done >= due || now_ms() > deadline {
            if done < due {
                let seen = b
                    .text(&format!(
                        "select concat_ws(' ', count(*), min(scheduled_for_ms) - {w0}, max(scheduled_for_ms) - {w0},
                                          min(queued_at_ms) - {w0}, max(queued_at_ms) - {w0}) from qlsched.runs"
                    ))
                    .await;
                eprintln!("   {key}: window not done; all runs (count, scheduled and queued from − to, ms after the window's start): {seen}");
            }
            break;
        }
        sleep_s(if b.sizes.smoke { 0.25 } else { 1.0 }).await;
    }
    let mut o = window_stats(b, w0, w1).await;
    o.due = due;
    o.hwm_kib = hwm_kib;
    let secs = win_s as f64 * clk_tck() / 100.0;
    for (i, c) in o.cpu.iter_mut().enumerate() {
        *c = t1[i].saturating_sub(t0[i]) as f64 / secs;
    }
    let role = if workers > 0 {
        "qlsched_dispatcher"
    } else {
        "qlsched_runtime"
    };
    let profile = b
        .pgss_top_of(role, "total_plan_time + total_exec_time", 6)
        .await;
    // "query (total ms over calls)" from the profile's first row.
    let cells: Vec<&str> = profile
        .lines()
        .nth(2)
        .unwrap_or("")
        .split(" | ")
        .map(|c| c.trim_matches(|ch| ch == '|' || ch == ' '))
        .collect();
    if cells.len() >= 9 {
        o.top = format!("{} ({} ms over {} calls)", cells[8], cells[5], cells[0]);
    }
    b.note(format!(
        "W {key}: {role}'s top statements over the phase ({n} triggers, {workers} workers; {})\n\n{profile}",
        o.cpu_split()
    ));
    g.stop().await;
    for w in &procs {
        w.signal(libc::SIGTERM);
    }
    for w in &mut procs {
        w.wait_exit(Duration::from_secs(30)).await;
    }
    let dups = b.invariants(&format!("worker {key}")).await;
    b.check(&format!("worker {key}: duplicates {dups}"), dups == 0);
    b.check(
        &format!("worker {key}: {} failed attempts", o.failed),
        o.failed == 0.0,
    );
    if b.sizes.smoke && workers > 0 {
        b.check(
            &format!("worker {key}: {} of {} finished", o.finished, o.due),
            o.all_finished(),
        );
    }
    o
}

/// The window's runs: admitted, finished (a succeeded attempt), failed attempts, admission
/// lag p99 and scheduled → finished p50 / p99 / max.
async fn window_stats(b: &Bench, w0: i64, w1: i64) -> Outcome {
    let now = b.db_now_ms().await;
    let r =
        b.su.query_one(
            "with w as (
               select r.scheduled_for_ms as s, r.queued_at_ms as q,
                      (select min(a.finished_at_ms) from qlsched.attempts a
                        where a.run_id = r.run_id and a.state = 'succeeded') as f,
                      (select count(*) from qlsched.attempts a
                        where a.run_id = r.run_id and a.state = 'failed') as nf
                 from qlsched.runs r where r.scheduled_for_ms between $1 and $2)
             select count(*)::float8, count(f)::float8, coalesce(sum(nf), 0)::float8,
                    coalesce(percentile_cont(0.99) within group (order by q - s), 0),
                    coalesce(percentile_cont(0.5) within group (order by coalesce(f, $3) - s), 0),
                    coalesce(percentile_cont(0.99) within group (order by coalesce(f, $3) - s), 0),
                    coalesce(max(coalesce(f, $3) - s), 0)::float8
               from w",
            &[&w0, &w1, &now],
        )
        .await
        .unwrap();
    Outcome {
        admitted: r.get(0),
        finished: r.get(1),
        failed: r.get(2),
        adm_p99: r.get(3),
        fin_p50: r.get(4),
        fin_p99: r.get(5),
        fin_max: r.get(6),
        ..Default::default()
    }
}

/// The row's detail: the figures, and on a miss what the phase was bound by.
fn detail(o: &Outcome, ok: bool) -> String {
    let mut d = format!(
        "finished {} / {} due (admitted {}), scheduled → finished p50 {:.0} ms, max {:.0} ms; {}",
        o.finished,
        o.due,
        o.admitted,
        o.fin_p50,
        o.fin_max,
        o.cpu_split()
    );
    if !ok {
        d.push_str(&format!(
            " — missed; the dispatcher role's top statement by total time: {}",
            o.top
        ));
    }
    d
}

pub async fn rows(b: &mut Bench, l: Lengths) {
    let sink = Sink::start().await;
    let http = format!(
        r#"{{"executor":"http","method":"POST","url":"http://{}/","timeout":"10s"}}"#,
        sink.addr
    );
    let shell = r#"{"executor":"shell","command":["/bin/true"],"timeout":"10s"}"#;
    let bare = phase(b, "bare", l.http_n, &http, 0, &l).await;
    let w1 = phase(b, "http", l.http_n, &http, 3, &l).await;
    let ok1 = w1.all_finished() && w1.fin_p99 <= 1000.0;
    b.row(
        Row::new(
            "W1",
            "worker_http",
            format!(
                "HTTP executor (no-op server on loopback): {} every-second triggers, 3 replicas, 3 workers, {} s",
                l.http_n, l.http_s
            ),
            w1.fin_p99,
            "ms p99 scheduled → finished",
        )
        .lower_better()
        .detail(format!(
            "{}; sink answered {} requests",
            detail(&w1, ok1),
            sink.answered()
        ))
        .target("all finished, p99 ≤ 1 s", ok1),
    );
    let adm_ok = w1.adm_p99 <= 100.0;
    b.row(
        Row::new(
            "W1",
            "worker_http_admission",
            format!(
                "admission lag with the W1 workers running (without: a {} s phase before)",
                l.bare_s
            ),
            w1.adm_p99,
            "ms p99",
        )
        .lower_better()
        .detail(format!(
            "without workers: p99 {:.0} ms ({} / {} admitted; {}){}",
            bare.adm_p99,
            bare.admitted,
            bare.due,
            bare.cpu_split(),
            if adm_ok {
                String::new()
            } else {
                format!(
                    "; with workers: {} — missed; top statement of the dispatcher role: {}",
                    w1.cpu_split(),
                    w1.top
                )
            }
        ))
        .target("p99 ≤ 100 ms", adm_ok),
    );
    let w2 = phase(b, "shell", l.shell_n, shell, 3, &l).await;
    let ok2 = w2.all_finished() && w2.fin_p99 <= 1000.0;
    b.row(
        Row::new(
            "W2",
            "worker_shell",
            format!(
                "shell executor (/bin/true): {} every-second triggers, 3 replicas, 3 workers, {} s",
                l.shell_n, l.shell_s
            ),
            w2.fin_p99,
            "ms p99 scheduled → finished",
        )
        .lower_better()
        .detail(detail(&w2, ok2))
        .target("all finished, p99 ≤ 1 s", ok2),
    );
    let hwm = w1.hwm_kib.max(w2.hwm_kib) as f64 / 1024.0;
    b.row(
        Row::new(
            "W3",
            "worker_rss",
            "worker peak resident set (VmHWM) under W1 and W2",
            hwm,
            "MiB",
        )
        .lower_better()
        .detail(format!(
            "largest of 3 workers: W1 {:.1} MiB, W2 {:.1} MiB (concurrency 64, pool 16)",
            w1.hwm_kib as f64 / 1024.0,
            w2.hwm_kib as f64 / 1024.0
        ))
        .target("≤ 32 MiB", hwm <= 32.0),
    );
}
