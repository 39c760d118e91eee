//! Rows K: the web console at scale. Triggers (none due) and runs spread over the last 7
//! days are generated in SQL, then one replica at the default config (console on loopback)
//! that also admits every-second triggers. Every console page and its /api/v1 twin is
//! fetched REPS times (time to the last byte over loopback): median, p95 and max per page,
//! bound 200 ms; then the lag of the every-second triggers over a window without console
//! traffic and an equal window with the overview, the triggers page, one trigger and the
//! runs page each reloaded every second.

use std::time::Instant;

use qlsched_testkit::replica::http_get;

use crate::env::{now_ms, say, sleep_s, Bench};
use crate::lag::lag_stats;
use crate::load::{Layout, Load};
use crate::replicas::{Group, Setup};
use crate::report::Row;
use crate::stats::percentile;

pub async fn rows(b: &mut Bench) {
    let smoke = b.sizes.smoke;
    let env = |k: &str, d: u64| {
        std::env::var(k)
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(d)
    };
    let (triggers, runs, reps, lag_s) = if smoke {
        (1_000, 20_000, 3, 2)
    } else {
        (
            env("QLSCHED_BENCH_CONSOLE_TRIGGERS", 100_000),
            env("QLSCHED_BENCH_CONSOLE_RUNS", 10_000_000),
            env("QLSCHED_BENCH_CONSOLE_REPS", 20) as usize,
            env("QLSCHED_BENCH_CONSOLE_LAG_S", 60),
        )
    };
    say(&format!(
        "K. console: {triggers} triggers, {runs} runs over 7 days, then one replica"
    ));
    b.reset().await;
    b.load(triggers, &Load::new(Layout::Idle)).await;
    let t0 = Instant::now();
    // Secondary indexes dropped for the bulk insert and rebuilt after it.
    b.exec(&format!(
        "SET session_replication_role = replica;
         CREATE TEMP TABLE idx AS
           SELECT indexrelid::regclass::text AS name, pg_get_indexdef(indexrelid) AS def
             FROM pg_index i WHERE indrelid = 'qlsched.runs'::regclass
              AND NOT EXISTS (SELECT 1 FROM pg_constraint c WHERE c.conindid = i.indexrelid);
         DO $$ DECLARE r record; BEGIN
           FOR r IN SELECT name FROM idx LOOP EXECUTE 'DROP INDEX ' || r.name; END LOOP;
         END $$;
         INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                                   execution_revision_id, idempotency_key, status, scheduled_for_ms,
                                   queued_at_ms, admitted_by, request_id)
         SELECT gen_random_uuid(), 'bench', t, 1, 'bench-task', 1, '00000000-0000-4000-8000-00000000be4c',
                CASE WHEN g % 1000 = 0 THEN 'ql3:manual:v2:' || t || ':m' || g ELSE 'ql3:cron:v1:' || t || ':1:' || s END,
                CASE WHEN g > {runs} - 5000 THEN 'queued' ELSE 'succeeded' END,
                s, s + 5 + (g * 7919) % 195,
                CASE WHEN g % 500 = 0 AND g % 1000 <> 0 THEN 'backfill:bench' ELSE 'bench-seed' END,
                CASE WHEN g % 1000 = 0 THEN 'm' || g END
           FROM (SELECT g, 'b' || lpad((g % {triggers} + 1)::text, 7, '0') AS t,
                        (extract(epoch FROM clock_timestamp()) * 1000)::bigint
                          - 7 * 86400000::bigint * ({runs} - g) / {runs} - 1000 AS s
                   FROM generate_series(1::bigint, {runs}) g) x;
         DO $$ DECLARE r record; BEGIN
           FOR r IN SELECT def FROM idx LOOP EXECUTE r.def; END LOOP;
         END $$;
         DROP TABLE idx;
         RESET session_replication_role"
    ))
    .await;
    for t in ["runs", "triggers", "trigger_schedules"] {
        b.exec(&format!("VACUUM ANALYZE qlsched.{t}")).await;
    }
    let load_s = t0.elapsed().as_secs_f64();
    let mut l = Load::new(Layout::Second);
    l.prefix = "s";
    l.lead_ms = if smoke { 1000 } else { 3000 };
    let second_n = if smoke { 20 } else { 200 };
    b.load(second_n, &l).await;
    let mut g = Group::start(1, &Setup::default_config(&b.runtime_dsn));
    g.wait_ready().await;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], g.replicas[0].port));
    let mid = format!("b{:07}", triggers / 2);
    let cursor = http_get(addr, "/api/v1/runs?limit=100")
        .and_then(|(_, body)| serde_json::from_str::<serde_json::Value>(&body).ok())
        .and_then(|v| {
            v.get("next_before")
                .and_then(|c| c.as_str())
                .map(String::from)
        })
        .unwrap_or_default();
    let pages = [
        "/".to_string(),
        "/api/v1/overview".into(),
        "/triggers".into(),
        format!("/triggers?limit=100&after={mid}"),
        "/triggers?q=b00999".into(),
        "/triggers?project=bench&state=disabled".into(),
        "/api/v1/triggers?limit=100".into(),
        format!("/triggers/{mid}"),
        format!("/api/v1/triggers/{mid}"),
        "/runs".into(),
        format!("/runs?limit=100&before={cursor}"),
        format!("/runs?trigger={mid}"),
        "/runs?kind=manual".into(),
        "/runs?kind=backfill&status=succeeded".into(),
        "/runs?status=queued".into(),
        "/api/v1/runs?limit=100".into(),
    ];
    let mut worst = (0.0, String::new());
    let mut table =
        String::from("| page | HTTP | median ms | p95 ms | max ms |\n|---|---|---|---|---|\n");
    let mut failed = 0;
    for p in &pages {
        let code = http_get(addr, p).map(|(c, _)| c).unwrap_or(0);
        if code != 200 {
            failed += 1;
        }
        let times: Vec<f64> = (0..reps)
            .map(|_| {
                let t = Instant::now();
                let _ = http_get(addr, p);
                t.elapsed().as_secs_f64() * 1000.0
            })
            .collect();
        let (med, p95, max) = (
            percentile(&times, 0.5).unwrap(),
            percentile(&times, 0.95).unwrap(),
            percentile(&times, 1.0).unwrap(),
        );
        if p95 > worst.0 {
            worst = (p95, p.clone());
        }
        table.push_str(&format!(
            "| `{p}` | {code} | {med:.1} | {p95:.1} | {max:.1} |\n"
        ));
    }
    b.check(
        &format!("console: {failed} page(s) did not answer 200"),
        failed == 0,
    );
    say(&format!(
        "K. lag of the every-second triggers: {lag_s} s quiet, then {lag_s} s with reloads"
    ));
    let q0 = now_ms();
    sleep_s(lag_s as f64).await;
    let q1 = now_ms();
    let mut reloads = 0;
    let r0 = now_ms();
    while now_ms() < r0 + lag_s as i64 * 1000 {
        let tick = now_ms();
        for p in [
            "/".to_string(),
            "/triggers".into(),
            format!("/triggers/{mid}"),
            "/runs".into(),
        ] {
            let _ = http_get(addr, &p);
            reloads += 1;
        }
        sleep_s((1000 - (now_ms() - tick)) as f64 / 1000.0).await;
    }
    let r1 = now_ms();
    sleep_s(if smoke { 1.0 } else { 3.0 }).await;
    g.stop().await;
    let quiet = lag_stats(b, q0, q1).await;
    let busy = lag_stats(b, r0, r1).await;
    b.note(format!(
        "console pages ({triggers} triggers, {runs} runs generated in {load_s:.0} s):\n\n{table}"
    ));
    b.row(
        Row::new("K", "console_worst_page_p95", format!("web console at {triggers} triggers and {runs} runs: worst page p95 ({reps} requests each)"), worst.0, "ms")
            .lower_better()
            .detail(format!("worst: `{}`", worst.1))
            .target("≤ 200 ms", worst.0 <= 200.0),
    );
    b.row(
        Row::new("K", "console_lag_p99", format!("scheduler lag p99 of {second_n} every-second triggers while 4 pages reload every second"), busy.2, "ms")
            .lower_better()
            .detail(format!("{:.0} runs, p50 {:.0} ms; without console traffic: {:.0} runs, p50 {:.0} / p99 {:.0} ms; {reloads} page loads", busy.0, busy.1, quiet.0, quiet.1, quiet.2))
            .target("p99 ≤ 50 ms", busy.2 <= 50.0),
    );
}
