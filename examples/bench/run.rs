//! One run of a mode: start the server, run the mode's rows, write the result file.

use std::path::Path;
use std::process::ExitCode;
use std::time::Instant;

use qlsched_testkit::bench_server::{BenchServer, TUNED};

use crate::env::{load_average, nproc, say, Bench};
use crate::herd::Herd;
use crate::report::{self, Machine, Postgres, ResultFile, SCHEMA};
use crate::sizes::Sizes;
use crate::Mode;

pub fn compare(old: &Path, new: &Path, band: f64) -> ExitCode {
    let (a, b) = match (ResultFile::read(old), ResultFile::read(new)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("bench compare: {e}");
            return ExitCode::from(2);
        }
    };
    let (rows, unmatched) = report::compare(&a, &b, band);
    let (text, worse) = report::render_comparison(&rows, &unmatched, band);
    println!(
        "{} ({}) → {} ({})\n\n{text}",
        a.commit, a.mode, b.commit, b.mode
    );
    if worse > 0 {
        println!("{worse} row(s) worse than the ±{:.0} % band", band * 100.0);
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// The retention choice's server: it measures every VACUUM itself, so autovacuum is off.
const CHOICE_CONF: &str = "shared_buffers = 512MB\nmax_wal_size = 8GB\nmin_wal_size = 1GB\n\
                           checkpoint_timeout = 30min\nautovacuum = off\n";

fn mode_name(m: Mode) -> &'static str {
    match m {
        Mode::Quick => "quick",
        Mode::Full => "full",
        Mode::Smoke => "smoke",
        Mode::Ceiling => "ceiling",
        Mode::Lag => "lag",
        Mode::Wal => "wal",
        Mode::WalTake => "wal-take",
        Mode::Tls => "tls",
        Mode::Herd100k => "herd100k",
        Mode::HerdJitter => "herd-jitter",
        Mode::Capacity => "capacity",
        Mode::StockVsTuned => "stock-vs-tuned",
        Mode::Retention => "retention",
        Mode::RetentionQuick => "retention-quick",
        Mode::RetentionChoice { .. } => "retention-choice",
        Mode::Console => "console",
        Mode::Overlap { .. } => "overlap",
        Mode::Outcome => "outcome",
        Mode::Apply => "apply",
        Mode::Worker { .. } => "worker",
    }
}

pub fn run(mode: Mode) -> ExitCode {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(run_mode(mode))
}

async fn run_mode(mode: Mode) -> ExitCode {
    let started = Instant::now();
    let started_at = chrono::Utc::now();
    let load_before = load_average();
    let sizes = match mode {
        Mode::Full => Sizes::full(),
        Mode::Smoke | Mode::Worker { toy: true, .. } => Sizes::smoke(),
        _ => Sizes::quick(),
    };
    let tls = matches!(mode, Mode::Tls | Mode::Smoke);
    // The smoke mode runs a second lane on a stock server beside the first (toy sizes leave
    // the machine mostly idle): S, C, R, K, O, E and A there, everything else on the tuned server.
    // A third lane runs the retention choice on a server of its own (autovacuum off), a
    // fourth the worker rows W1–W3 on a stock server of their own.
    let stock_srv = (mode == Mode::Smoke).then(|| BenchServer::start_in_background("", false));
    let choice_srv =
        (mode == Mode::Smoke).then(|| BenchServer::start_in_background(CHOICE_CONF, false));
    let worker_srv = (mode == Mode::Smoke).then(|| BenchServer::start_in_background("", false));
    say(&format!(
        "starting a private durable PostgreSQL ({} settings{})",
        if matches!(
            mode,
            Mode::Worker { .. } | Mode::Overlap { .. } | Mode::HerdJitter
        ) {
            "stock"
        } else {
            "tuned"
        },
        if tls { ", ssl = on" } else { "" }
    ));
    // The retention choice measures every VACUUM itself: autovacuum off on its server.
    // The worker rows and the herd-jitter rows run on a stock server (initdb's settings,
    // durable).
    let conf = match mode {
        Mode::RetentionChoice { .. } => CHOICE_CONF,
        Mode::Worker { .. } | Mode::Overlap { .. } => "",
        // Issue 35's policy rows are measured on a stock durable server.
        Mode::HerdJitter => "",
        _ => TUNED,
    };
    let srv = BenchServer::start(conf, tls);
    let mut b = Bench::new(srv, sizes.clone()).await;
    match mode {
        Mode::Smoke => {
            let rx = stock_srv.expect("started above");
            let lane_b = async {
                let srv = tokio::task::spawn_blocking(move || rx.recv().expect("the stock server"))
                    .await
                    .unwrap();
                let mut st = Bench::new(srv, sizes.clone()).await;
                crate::stock::smoke_rows(&mut st).await;
                crate::capacity::rows(&mut st).await;
                crate::retention::rows(&mut st, true).await;
                crate::console::rows(&mut st).await;
                crate::outcome::rows(&mut st).await;
                crate::apply::rows(&mut st).await;
                st
            };
            let rx = choice_srv.expect("started above");
            let lane_c = async {
                let srv = tokio::task::spawn_blocking(move || rx.recv().expect("the third server"))
                    .await
                    .unwrap();
                let mut ch = Bench::new(srv, sizes.clone()).await;
                crate::retention_choice::rows(&mut ch, 4_000).await;
                ch
            };
            let rx = worker_srv.expect("started above");
            let lane_d = async {
                let srv =
                    tokio::task::spawn_blocking(move || rx.recv().expect("the fourth server"))
                        .await
                        .unwrap();
                let mut wk = Bench::new(srv, sizes.clone()).await;
                crate::worker::rows(&mut wk, crate::worker::Lengths::smoke()).await;
                wk
            };
            let (_, mut st, mut ch, mut wk) =
                tokio::join!(core_rows(&mut b, true), lane_b, lane_c, lane_d);
            for other in [&mut st, &mut ch, &mut wk] {
                b.rows.append(&mut other.rows);
                b.notes.append(&mut other.notes);
                b.violations.append(&mut other.violations);
            }
        }
        Mode::Quick | Mode::Full => core_rows(&mut b, false).await,
        Mode::Retention => crate::retention::rows(&mut b, false).await,
        Mode::RetentionQuick => crate::retention::rows(&mut b, true).await,
        Mode::RetentionChoice { quick } => {
            crate::retention_choice::rows(&mut b, if quick { 40_000 } else { 200_000 }).await
        }
        Mode::Console => crate::console::rows(&mut b).await,
        Mode::Overlap { boundaries } => crate::overlap::rows(&mut b, boundaries).await,
        Mode::Outcome => crate::outcome::rows(&mut b).await,
        Mode::Apply => crate::apply::rows(&mut b).await,
        Mode::Worker {
            secs,
            bare_secs,
            shell_secs,
            toy,
        } => {
            let l = if toy {
                crate::worker::Lengths::smoke()
            } else {
                crate::worker::Lengths::real(secs, bare_secs, shell_secs)
            };
            crate::worker::rows(&mut b, l).await
        }
        Mode::Ceiling => crate::ceiling::rows(&mut b).await,
        Mode::Lag => crate::lag::rows(&mut b).await,
        Mode::Wal => crate::pairs::wal_rows(&mut b).await,
        Mode::WalTake => crate::pairs::wal_take_rows(&mut b).await,
        Mode::Tls => crate::pairs::tls_rows(&mut b).await,
        Mode::Herd100k => {
            let n = std::env::var("QLSCHED_BENCH_HERD_N")
                .ok()
                .and_then(|n| n.parse().ok())
                .unwrap_or(100_000);
            crate::herd::row(
                &mut b,
                Herd {
                    key: "herd_100000",
                    n,
                    boundaries: 3,
                    second_n: 200,
                    jitter_ms: 0,
                },
            )
            .await
        }
        Mode::HerdJitter => {
            // Row 7 and row J in one run: the plain herd, then the same herd jittered.
            let s = b.sizes.clone();
            crate::herd::row(
                &mut b,
                Herd {
                    key: "herd_10000",
                    n: s.herd_n,
                    boundaries: s.herd_b,
                    second_n: 0,
                    jitter_ms: 0,
                },
            )
            .await;
            jitter_herd(&mut b, "herd_jitter_10000", 10_000).await;
        }
        Mode::Capacity => crate::capacity::rows(&mut b).await,
        Mode::StockVsTuned => crate::stock::rows(&mut b).await,
    }
    let settings = b.settings().await;
    let version = b.text("current_setting('server_version')").await;
    let (commit, dirty) = git_commit();
    let file = ResultFile {
        schema: SCHEMA,
        mode: mode_name(mode).into(),
        started_at: started_at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        duration_s: started.elapsed().as_secs_f64(),
        commit: commit.clone(),
        dirty,
        machine: machine(load_before),
        postgres: Postgres { version, settings },
        rows: std::mem::take(&mut b.rows),
        notes: std::mem::take(&mut b.notes),
    };
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench");
    let dir = if sizes.smoke {
        root.join("tmp")
    } else {
        root.join("results")
    };
    let mut stem = format!(
        "{}-{commit}{}-{}",
        started_at.format("%Y-%m-%dT%H%MZ"),
        if dirty { "-dirty" } else { "" },
        mode_name(mode)
    );
    // Two runs started in one minute keep both files.
    let base = stem.clone();
    let mut k = 1;
    while dir.join(format!("{stem}.json")).exists() {
        k += 1;
        stem = format!("{base}-{k}");
    }
    let path = file.write(&dir, &stem).expect("write the result file");
    println!(
        "{}",
        file.markdown().split("\n## Evidence").next().unwrap_or("")
    );
    println!(
        "results kept in {} (and .md), {:.0} s",
        path.display(),
        file.duration_s
    );
    if b.violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        eprintln!(
            "bench: {} invariant(s) broken: {}",
            b.violations.len(),
            b.violations.join("; ")
        );
        ExitCode::from(1)
    }
}

/// Rows 1–8 (and, in the smoke mode, T and W on the same server).
async fn core_rows(b: &mut Bench, smoke: bool) {
    crate::ceiling::rows(b).await;
    crate::drain::isolation_probe(b).await;
    crate::drain::rows(b).await;
    crate::claim::rows(b).await;
    crate::idle::rows(b).await;
    crate::lag::rows(b).await;
    let s = b.sizes.clone();
    // The smoke herd carries every-second triggers too: the 100k herd's rows at toy size.
    let (key, second_n) = if smoke {
        ("herd_smoke", s.second_n)
    } else {
        ("herd_10000", 0)
    };
    crate::herd::row(
        b,
        Herd {
            key,
            n: s.herd_n,
            boundaries: s.herd_b,
            second_n,
            jitter_ms: 0,
        },
    )
    .await;
    if smoke {
        // Row J at toy size: the smoke herd fires every 5 s, so a 2 s jitter.
        jitter_herd(b, "herd_jitter_smoke", 2_000).await;
    }
    if smoke {
        crate::pairs::tls_rows(b).await;
        crate::pairs::wal_rows(b).await;
        // Last in its lane: it publishes a spec naming an executor for the bench task.
        crate::pairs::wal_take_rows(b).await;
    }
}

/// Row J: the herd of row 7 with `--jitter` on every trigger.
async fn jitter_herd(b: &mut Bench, key: &'static str, jitter_ms: i64) {
    let s = b.sizes.clone();
    crate::herd::row(
        b,
        Herd {
            key,
            n: s.herd_n,
            boundaries: s.herd_b,
            second_n: 0,
            jitter_ms,
        },
    )
    .await;
}

fn git_commit() -> (String, bool) {
    let dir = env!("CARGO_MANIFEST_DIR");
    let out = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let commit = out(&["rev-parse", "--short", "HEAD"]).unwrap_or_else(|| "unknown".into());
    let dirty =
        out(&["status", "--porcelain", "--untracked-files=no"]).is_some_and(|s| !s.is_empty());
    (commit, dirty)
}

fn machine(load_before: f64) -> Machine {
    let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let memory_kib = meminfo
        .lines()
        .find(|l| l.starts_with("MemTotal:"))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or(0);
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(": ").nth(1))
        .unwrap_or("unknown CPU")
        .to_string();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap_or_default()
        .trim()
        .to_string();
    Machine {
        nproc: nproc(),
        memory_kib,
        kernel: format!("Linux {kernel}"),
        cpu,
        load_before,
        load_after: load_average(),
    }
}
