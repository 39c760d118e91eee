//! The qlsched benchmark: the daemon against the ceiling of its own statements, on a
//! private, durable PostgreSQL started by the test kit, with replicas that are processes of
//! the real binary.
//!
//! The ceiling (rows 1 and 1b) drives the product's own claim and admission statements
//! (`store::claim::claim_variant` and `store::admit::ADMIT_SQL` through `claim_round` and
//! `admit_batch_prepared`) from N concurrent tokio tasks with nothing around them, so every
//! "× ceiling" ratio compares the daemon with its statements, never with a hand copy.
//!
//! Every run writes `bench/results/<UTC time>-<commit>[-dirty]-<mode>.json` (schema 1:
//! commit, machine, PostgreSQL version and settings, rows with their ratio to the ceiling)
//! and the markdown table beside it; the smoke mode writes under `bench/tmp/`. Nothing else
//! in the repository is edited. `compare A.json B.json [--band 0.10]` prints each row's
//! ratio and flags the rows outside the band.
//!
//! Modes (`scripts/bench.sh MODE`, which builds the release binaries first):
//! - `quick` (default): ceilings 1/1b, isolation probe 2a, drains 2/6/8 (10k), claim cost 4,
//!   idle 5, lag 3/3b, herd 7 (10k, 3 boundaries); about 6 min
//! - `full`: the same with 10k and 100k drains, medians of 3, 1M-row claims, longer lag,
//!   6 herd boundaries; about 17 min
//! - `smoke`: every row of every mode at toy size, no minute-boundary wait; in CI
//! - `lag`, `wal`, `tls`: only those rows; `wal-take`: rows WT, what V18's take indexes cost
//!   the admission; `herd100k`, `capacity`: the scale rows H and C;
//!   `herd-jitter`: rows 7 and J (the 10k herd, then the same herd with `--jitter 10s`);
//!   `stock-vs-tuned`: rows S on a stock and a tuned server side by side (with
//!   graphile-worker's cron herd); `retention` (16 min) and `retention-quick` (8 min): rows R;
//!   `retention-choice [--quick]`: rows RC, batched deletes vs time partitions (about 5 min);
//!   `console`: rows K, the web console at 100k triggers and 10 M runs;
//!   `overlap [--boundaries 3]`: rows O, the 10,000-trigger herd under `forbid` against
//!   `allow` and their WAL per occurrence, on a stock server (about 6 min);
//!   `outcome`: row E1, the overdue evaluation at 100k triggers with a success window;
//!   `apply`: rows A, `qlsched apply` of 10,000 unchanged and changed triggers, the lag of
//!   200 every-second triggers while it runs, the WAL of an audit row (about 2 min);
//!   `worker [--secs 300] [--bare-secs 60] [--shell-secs 120]`: rows W, `qlsched worker`
//!   executing 2,000 HTTP and 200 shell runs a second on a stock server (about 10 min)
//!
//! Environment: `QLSCHED_BIN` (the replica binary, else the one beside this program),
//! `QLSCHED_PG_BINDIR` (the server), `QLSCHED_BENCH_BUDGET` (drain claim budget, 64),
//! `QLSCHED_BENCH_LAG_ROWS=second` (only the every-second lag row),
//! `QLSCHED_BENCH_SECOND_N` (its every-second triggers, 200), `QLSCHED_BENCH_LAG_BUDGET`
//! (the lag rows' replicas' `claim_budget`, else the default configuration's),
//! `QLSCHED_BENCH_WAL_WARM_MB` (lag, worker and herd rows: write and drop that much table and
//! checkpoint first, so the server reuses WAL segments as a long-running one does),
//! `QLSCHED_BENCH_SAMPLE_WAITS=1` (worker rows: sample what the admissions wait on).

mod apply;
mod capacity;
mod ceiling;
mod claim;
mod console;
mod drain;
mod env;
mod herd;
mod idle;
mod lag;
mod load;
mod outcome;
mod overlap;
mod pairs;
mod replicas;
mod report;
mod retention;
mod retention_choice;
mod run;
mod sink;
mod sizes;
mod stats;
mod stock;
mod worker;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(about = "The qlsched benchmark (see the doc comment of examples/bench/main.rs)")]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
}

#[derive(Subcommand, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Quick,
    Full,
    Smoke,
    /// Only the ceiling rows (1, 1b).
    Ceiling,
    Lag,
    Wal,
    /// Row WT: the admission's cost of V18's copied pool and executor (WAL and rate).
    WalTake,
    Tls,
    Herd100k,
    /// Rows 7 and J: the 10,000-trigger herd, then the same herd with `--jitter 10s`.
    HerdJitter,
    Capacity,
    StockVsTuned,
    Retention,
    RetentionQuick,
    /// Batched deletes vs time partitions (`--quick`: 40,000 occurrences instead of 200,000).
    RetentionChoice {
        #[arg(long)]
        quick: bool,
    },
    Console,
    /// Rows O: the overlap policy's cost, 10,000-trigger herds under allow and forbid.
    Overlap {
        #[arg(long, default_value_t = 3)]
        boundaries: usize,
    },
    /// Row E1: the expected-success (overdue) evaluation at 100,000 triggers.
    Outcome,
    /// Rows A: `qlsched apply` of 10,000 triggers (unchanged, changed), the lag of 200
    /// every-second triggers meanwhile, and the WAL of an audit row.
    Apply,
    /// Rows W: 3 workers executing what 3 replicas admit (window lengths in seconds).
    Worker {
        /// W1's window (HTTP executor, 2,000 every-second triggers).
        #[arg(long, default_value_t = 300)]
        secs: i64,
        /// The window of W1's phase without workers (its admission lag alone).
        #[arg(long, default_value_t = 60)]
        bare_secs: i64,
        /// W2's window (shell executor, 200 every-second triggers).
        #[arg(long, default_value_t = 120)]
        shell_secs: i64,
        /// The smoke mode's toy sizes instead (the windows above are then ignored).
        #[arg(long)]
        toy: bool,
    },
}

#[derive(Subcommand)]
enum Cmd {
    #[command(flatten)]
    Run(Mode),
    /// Compares two result files row by row against a noise band.
    Compare {
        old: PathBuf,
        new: PathBuf,
        #[arg(long, default_value_t = 0.10)]
        band: f64,
    },
}

fn main() -> std::process::ExitCode {
    match Cli::parse().cmd.unwrap_or(Cmd::Run(Mode::Quick)) {
        Cmd::Compare { old, new, band } => run::compare(&old, &new, band),
        Cmd::Run(mode) => run::run(mode),
    }
}
