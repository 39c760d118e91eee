//! Rows 1 and 1b, the ceiling: the product's own statements with nothing around them.
//! `clients` tokio tasks, each on its own connection as the runtime role, loop over
//! `store::claim::claim_round` (the claim statement, `claim_variant(limit)`) and
//! `store::admission::admit_batch_prepared` (`ADMIT_SQL`: BEGIN, the statement and COMMIT
//! pipelined) for what they claimed, each occurrence decided without cron (the cursor moves a
//! fixed hour). No actors, no supervisor, no wake-ups: what the daemon's statements can do on
//! this server. Serialization failures are retried (10 tries), as the replicas do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qlsched::store::admission::{self, Admission, AdmitOutcome, Occurrence};
use qlsched::store::claim::{self, Extras};
use uuid::Uuid;

use crate::env::{say, Bench};
use crate::load::{Layout, Load};
use crate::report::Row;

#[derive(Default)]
struct Counts {
    admitted: AtomicU64,
    batches: AtomicU64,
    serialization: AtomicU64,
    refused: AtomicU64,
    dry: std::sync::atomic::AtomicBool,
}

/// What one ceiling run found.
struct CeilingRun {
    rate: f64,
    batches: u64,
    serialization: u64,
    refused: u64,
    /// Seconds after which the due rows ran out (the rate is over that time).
    dry_after: Option<f64>,
}

/// Runs the ceiling for `secs`, or until the due rows run out; the rate is admitted
/// occurrences per second of the time it ran.
async fn run(b: &Bench, clients: usize, limit: u32, secs: f64) -> CeilingRun {
    let counts = Arc::new(Counts::default());
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let t0 = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (config, counts) = (b.srv.config("qlsched_runtime", "qlsched"), counts.clone());
        tasks.push(tokio::spawn(async move {
            let (c, conn) = config
                .connect(tokio_postgres::NoTls)
                .await
                .expect("connect");
            tokio::spawn(conn);
            let owner = format!("ceiling-{i}");
            let claim_stmt = c.prepare(claim::claim_variant(limit).0).await.unwrap();
            let admit_stmt = c.prepare(admission::ADMIT_SQL).await.unwrap();
            while Instant::now() < deadline {
                let round = claim::claim_round(
                    &c,
                    &claim_stmt,
                    &owner,
                    30_000,
                    Uuid::new_v4(),
                    Extras::default(),
                )
                .await
                .expect("claim");
                if round.rows.is_empty() {
                    // Every due row is claimed: the table ran dry before the time was up.
                    counts.dry.store(true, Ordering::Relaxed);
                    break;
                }
                let batch: Vec<Admission> = round
                    .rows
                    .iter()
                    .map(|row| {
                        let sf = row.next_fire_at_ms.expect("a due row has a cursor");
                        Admission::new(
                            row,
                            Occurrence {
                                scheduled_for_ms: sf,
                                next_fire_at_ms: sf + 3_600_000,
                                run_id: admission::mint_run_id(&owner),
                                attempt_id: Uuid::new_v4(),
                            },
                        )
                    })
                    .collect();
                for attempt in 1..=10 {
                    match admission::admit_batch_prepared(&c, &admit_stmt, &batch).await {
                        Ok(outcomes) => {
                            for o in outcomes {
                                match o {
                                    AdmitOutcome::Admitted { .. } => &counts.admitted,
                                    _ => &counts.refused,
                                }
                                .fetch_add(1, Ordering::Relaxed);
                            }
                            counts.batches.fetch_add(1, Ordering::Relaxed);
                            break;
                        }
                        Err(e) if e.is_serialization() && attempt < 10 => {
                            counts.serialization.fetch_add(1, Ordering::Relaxed);
                        }
                        Err(e) => panic!("ceiling admission: {e}"),
                    }
                }
            }
        }));
    }
    for t in tasks {
        t.await.expect("a ceiling client");
    }
    let secs = t0.elapsed().as_secs_f64();
    CeilingRun {
        rate: counts.admitted.load(Ordering::Relaxed) as f64 / secs,
        batches: counts.batches.load(Ordering::Relaxed),
        serialization: counts.serialization.load(Ordering::Relaxed),
        refused: counts.refused.load(Ordering::Relaxed),
        dry_after: counts.dry.load(Ordering::Relaxed).then_some(secs),
    }
}

/// Rows 1 (claim(1) + admission of 1 per occurrence) and 1b (claim(budget) + one admission
/// of the whole batch), for 1 and 3 clients; medians of `reps` runs.
pub async fn rows(b: &mut Bench) {
    let s = b.sizes.clone();
    for (id, limit) in [("1", 1u32), ("1b", s.budget)] {
        for c in [1usize, 3] {
            let mut rates = Vec::new();
            let mut details = Vec::new();
            for rep in 1..=s.reps {
                say(&format!(
                    "{id}. ceiling: the product's claim({limit}) + admission, {c} client(s), {} s (run {rep}/{})",
                    s.ceil_s, s.reps
                ));
                b.reset().await;
                let mut l = Load::new(Layout::Due);
                l.grace_ms = s.drain_grace_ms;
                b.load(s.ceil_rows, &l).await;
                b.checkpoint().await;
                b.pgss_reset().await;
                let run = run(b, c, limit, s.ceil_s).await;
                let top = b.pgss_top("total_plan_time + total_exec_time", 6).await;
                b.note(format!(
                    "ceiling {id} c={c} run {rep}: top statements (pg_stat_statements):\n\n{top}"
                ));
                let dups = b.invariants(&format!("ceiling {id} c={c}")).await;
                b.check(&format!("ceiling {id} c={c}: duplicates {dups}"), dups == 0);
                rates.push(run.rate);
                details.push(format!(
                    "{} admission transactions, {} serialization failures retried, {} refused, duplicates {dups}{}",
                    run.batches,
                    run.serialization,
                    run.refused,
                    run.dry_after
                        .map(|t| format!("; the {} due rows ran out after {t:.1} s", s.ceil_rows))
                        .unwrap_or_default()
                ));
            }
            let m = crate::stats::median_index(&rates).unwrap();
            let what = if limit == 1 {
                "claim(1) + admission of that one occurrence (2 round trips)".to_string()
            } else {
                format!("claim({limit}) + one admission transaction for the batch")
            };
            let reps = if s.reps > 1 {
                format!(
                    " — median of {}: {}",
                    s.reps,
                    rates
                        .iter()
                        .map(|r| format!("{r:.0}"))
                        .collect::<Vec<_>>()
                        .join("/")
                )
            } else {
                String::new()
            };
            if limit == 1 {
                b.ceiling.insert(c, rates[m]);
            } else {
                b.ceiling_batched.insert(c, rates[m]);
            }
            b.row(
                Row::new(
                    id,
                    &format!("ceiling{}_c{c}", if limit == 1 { "" } else { "_batched" }),
                    format!(
                        "ceiling, {c} client{}: the product's {what}, no actors",
                        if c > 1 { "s" } else { "" }
                    ),
                    rates[m],
                    "occ/s",
                )
                .higher_better()
                .detail(format!("{}{reps}", details[m])),
            );
        }
    }
}
