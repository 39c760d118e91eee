//! Rows 1 and 1b, the ceiling: the product's own statements with nothing around them.
//! `clients` tokio tasks, each on its own connection as the runtime role, loop over
//! `store::claim::claim_round` (the claim statement, `claim_variant(limit)`) and
//! `store::admit::admit_batch_prepared` (`ADMIT_SQL`: BEGIN, the statement and COMMIT
//! pipelined) for what they claimed, each occurrence decided without cron (the cursor moves a
//! fixed hour). No actors, no supervisor, no wake-ups: what the daemon's statements can do on
//! this server. Serialization failures are retried (10 tries), as the replicas do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use qlsched::store::admit::{self, Admission, AdmitOutcome, Occurrence};
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
}

/// Runs the ceiling for `secs`; returns (admitted occurrences per second, counts text).
async fn run(b: &Bench, clients: usize, limit: u32, secs: f64) -> (f64, u64, u64, u64) {
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
            let admit_stmt = c.prepare(admit::ADMIT_SQL).await.unwrap();
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
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    continue;
                }
                let batch: Vec<Admission> = round
                    .rows
                    .into_iter()
                    .map(|row| {
                        let sf = row.next_fire_at_ms.expect("a due row has a cursor");
                        Admission::new(
                            row,
                            Occurrence {
                                scheduled_for_ms: sf,
                                next_fire_at_ms: sf + 3_600_000,
                                run_id: admit::mint_run_id(&owner),
                                attempt_id: Uuid::new_v4(),
                            },
                        )
                    })
                    .collect();
                for attempt in 1..=10 {
                    match admit::admit_batch_prepared(&c, &admit_stmt, &batch).await {
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
    (
        counts.admitted.load(Ordering::Relaxed) as f64 / secs,
        counts.batches.load(Ordering::Relaxed),
        counts.serialization.load(Ordering::Relaxed),
        counts.refused.load(Ordering::Relaxed),
    )
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
                let (rate, batches, ser, refused) = run(b, c, limit, s.ceil_s).await;
                let dups = b.invariants(&format!("ceiling {id} c={c}")).await;
                b.check(&format!("ceiling {id} c={c}: duplicates {dups}"), dups == 0);
                rates.push(rate);
                details.push(format!(
                    "{batches} admission transactions, {ser} serialization failures retried, {refused} refused, duplicates {dups}"
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
