//! Rows S: a stock server (initdb's defaults) and the tuned one side by side, alternating
//! row by row: a drain of due triggers with 3 replicas, the every-second lag with 3
//! replicas, and the CLI-published herd.

use qlsched_testkit::bench_server::BenchServer;

use crate::env::{say, Bench};
use crate::herd::Herd;
use crate::report::Row;

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
                },
            )
            .await;
            relabel(bench, start, name);
        }
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
