//! Rows S: a stock server (initdb's defaults) and the tuned one side by side, alternating
//! row by row: a drain of due triggers with 3 replicas, the every-second lag with 3
//! replicas, the CLI-published herd, and graphile-worker's cron herd on each (not in the
//! smoke mode: it needs npm and minute boundaries).

use qlsched_testkit::bench_server::BenchServer;

use crate::env::{now_ms, say, sleep_s, Bench};
use crate::herd::Herd;
use crate::report::Row;

/// The smoke mode's S rows: the stock server's drain and lag (the tuned server's are rows 2
/// and 3 of the same run).
pub async fn smoke_rows(stock: &mut Bench) {
    let s = stock.sizes.clone();
    let d = crate::drain::drain_once(stock, s.pair_n, 3).await;
    stock.row(
        Row::new(
            "S",
            "stock_drain",
            format!("stock server: drain {} due, 3 replicas", s.pair_n),
            d.rate,
            "occ/s",
        )
        .higher_better(),
    );
    let start = stock.rows.len();
    crate::lag::second_row(stock).await;
    relabel(stock, start, "stock");
}

pub async fn rows(b: &mut Bench) {
    say("S. starting a second private durable PostgreSQL with initdb's default settings");
    let mut stock = Bench::new(BenchServer::start("", false), b.sizes.clone()).await;
    let s = b.sizes.clone();
    for (name, bench) in [("stock", &mut stock), ("tuned", &mut *b)] {
        let d = crate::drain::drain_once(bench, s.pair_n, 3).await;
        bench.row(
            Row::new(
                "S",
                &format!("{name}_drain"),
                format!("{name} server: drain {} due, 3 replicas", s.pair_n),
                d.rate,
                "occ/s",
            )
            .higher_better(),
        );
    }
    // (The smoke mode runs the tuned server's lag as row 3 already.)
    let lag_on: &[&str] = if s.smoke {
        &["stock"]
    } else {
        &["stock", "tuned"]
    };
    for (name, bench) in [("stock", &mut stock), ("tuned", &mut *b)] {
        if !lag_on.contains(&name) {
            continue;
        }
        let start = bench.rows.len();
        crate::lag::second_row(bench).await;
        relabel(bench, start, name);
    }
    if !s.smoke {
        for (name, bench) in [("stock", &mut stock), ("tuned", &mut *b)] {
            let start = bench.rows.len();
            crate::herd::row(
                bench,
                Herd {
                    key: "herd_10000",
                    n: s.herd_n,
                    boundaries: s.herd_b,
                    second_n: 0,
                    jitter_ms: 0,
                },
            )
            .await;
            relabel(bench, start, name);
        }
    }
    if !s.smoke && std::env::var("QLSCHED_SVT_GRAPHILE").as_deref() != Ok("0") {
        graphile(&mut stock, "stock", s.herd_n, s.herd_b).await;
        graphile(b, "tuned", s.herd_n, s.herd_b).await;
    }
    b.rows.extend(stock.rows.drain(..).filter(|r| r.id == "S"));
    b.violations.append(&mut stock.violations);
}

/// Rows added since `start` become S rows of the named server.
fn relabel(b: &mut Bench, start: usize, name: &str) {
    for r in &mut b.rows[start..] {
        r.id = "S".into();
        r.key = format!("{name}_{}", r.key);
        r.measurement = format!("{name} server: {}", r.measurement);
    }
}

/// graphile-worker 0.18 (npm, cached in `QLSCHED_GRAPHILE_DIR`, default
/// /var/tmp/qlsched-graphile) in database `graphile` on the same server: a crontab of N
/// every-minute entries, 3 worker processes (bench/graphile/driver.cjs, default options, a
/// no-op task); per boundary, the time until all N jobs are inserted (its known-crontab rows
/// carry the boundary). Returns the slowest boundary in ms.
pub async fn graphile(b: &mut Bench, name: &str, n: u64, boundaries: usize) -> Option<f64> {
    use std::process::{Command, Stdio};
    let dir = std::env::var("QLSCHED_GRAPHILE_DIR").unwrap_or("/var/tmp/qlsched-graphile".into());
    let pkg = std::path::Path::new(&dir).join("node_modules/graphile-worker/package.json");
    if !pkg.exists() {
        say(&format!(
            "installing graphile-worker@0.18 with npm into {dir}"
        ));
        std::fs::create_dir_all(&dir).ok()?;
        let manifest = std::path::Path::new(&dir).join("package.json");
        if !manifest.exists() {
            std::fs::write(
                &manifest,
                r#"{"name":"qlsched-graphile-bench","private":true}"#,
            )
            .ok()?;
        }
        let ok = Command::new("npm")
            .args([
                "install",
                "--no-audit",
                "--no-fund",
                "--loglevel=error",
                "graphile-worker@0.18",
            ])
            .current_dir(&dir)
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            b.check("graphile-worker could not be installed with npm", false);
            return None;
        }
    }
    say(&format!("S. graphile-worker: {n} every-minute crontab entries, 3 workers, {boundaries} boundaries, {name} server"));
    b.su_pg
        .batch_execute("SET client_min_messages = warning; DROP DATABASE IF EXISTS graphile")
        .await
        .unwrap();
    b.su_pg
        .batch_execute("CREATE DATABASE graphile")
        .await
        .unwrap();
    let conn = format!("postgres://postgres@127.0.0.1:{}/graphile", b.srv.port());
    let driver = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/graphile/driver.cjs");
    let node = |args: &[&str]| {
        let mut c = Command::new("node");
        c.arg(&driver).args(args).env("QLSCHED_GRAPHILE_DIR", &dir);
        c
    };
    let ok = node(&["migrate", &conn])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    b.check("graphile-worker migrations", ok);
    let logs = tempfile::tempdir().unwrap();
    let mut workers: Vec<std::process::Child> = (1..=3)
        .map(|i| {
            let log = std::fs::File::create(logs.path().join(format!("g{i}.log"))).unwrap();
            node(&["run", &conn, &n.to_string(), &format!("g{i}")])
                .stdout(log)
                .stderr(Stdio::null())
                .spawn()
                .expect("node")
        })
        .collect();
    let ready = |i: usize| {
        std::fs::read_to_string(logs.path().join(format!("g{i}.log")))
            .unwrap_or_default()
            .contains("\"ev\":\"ready\"")
    };
    let deadline = now_ms() + 120_000;
    while !(1..=3).all(ready) && now_ms() < deadline {
        sleep_s(0.2).await;
    }
    let g = b.srv.connect("postgres", "graphile").await;
    let first = (now_ms() + 10_000) / 60_000 * 60_000 + 60_000;
    let mut times = Vec::new();
    for k in 0..boundaries {
        let boundary = first + k as i64 * 60_000;
        loop {
            let c = crate::env::num_on(&g, &format!(
                "select count(*) from graphile_worker._private_known_crontabs where last_execution = to_timestamp({boundary} / 1000.0)"
            ))
            .await;
            if c >= n as f64 || now_ms() > boundary + 60_000 {
                times.push((now_ms() - boundary) as f64);
                break;
            }
            sleep_s(0.2).await;
        }
    }
    for w in &mut workers {
        unsafe { libc::kill(w.id() as i32, libc::SIGTERM) };
        let _ = w.wait();
    }
    let max = times.iter().cloned().fold(0.0, f64::max);
    b.row(
        Row::new("S", &format!("{name}_graphile_herd"), format!("{name} server: graphile-worker 0.18, {n} every-minute crontab entries, 3 workers, {boundaries} boundaries (poll-observed)"), max, "ms (slowest boundary)")
            .lower_better()
            .detail(times.iter().map(|t| format!("{t:.0} ms")).collect::<Vec<_>>().join(", ")),
    );
    Some(max)
}
