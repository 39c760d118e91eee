//! The reference dispatcher (docs/dispatcher.md): logs in as `<prefix>_dispatcher` and
//! speaks the dispatcher protocol only (the `qlsched.dispatch_*` functions): takes batches of
//! queued runs in admission order under leases (any number of copies can run side by side),
//! starts them, optionally runs a shell command per run while heartbeats extend the leases,
//! and finishes each as succeeded or failed. Stops cleanly on SIGTERM/SIGINT: no new batch is
//! taken, the current one is finished (runs not yet started are released).
//!
//! ```text
//! cargo run --example dispatcher -- --dsn 'host=… user=qlsched_dispatcher dbname=qlsched' \
//!     [--batch 100] [--idle-ms 200] [--command 'echo "$QLSCHED_RUN_ID"'] \
//!     [--worker-id ID] [--pools a,b] [--lease-ms 30000]
//! ```
//!
//! The command runs under `sh -c` with QLSCHED_RUN_ID, QLSCHED_TRIGGER_ID,
//! QLSCHED_SCHEDULED_FOR_MS, QLSCHED_IDEMPOTENCY_KEY and QLSCHED_SPEC in its environment;
//! exit 0 is `succeeded`, anything else `failed` (the exit status is the attempt's error).
//! Without `--command` every run succeeds at once (benchmarks, tests).
//!
//! Exactly once: every call is a `qlsched.dispatch_*` function (V16). A run is taken by
//! one dispatcher under a lease (token + expiry on the database clock) that a heartbeat
//! extends while the command runs; a finish without the lease is refused. A dispatcher that
//! dies leaves its attempts to `qlsched.dispatch_expire`, which this loop calls before each
//! take (any dispatcher may): a lost attempt is retried while the pinned spec's
//! `max_attempts` allows, so the command may run again (at least once; the idempotency key is
//! the command's tool), and its outcome is recorded once.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use qlsched::store::dispatch::protocol;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;
use uuid::Uuid;

#[derive(Parser, Debug)]
struct Args {
    /// DSN of the dispatcher role (libpq key=value or URL).
    #[arg(long, env = "QLSCHED_DISPATCHER_DSN")]
    dsn: String,
    /// Runs taken per call.
    #[arg(long, default_value_t = 100)]
    batch: i32,
    /// Pause when no run was queued.
    #[arg(long, default_value_t = 200)]
    idle_ms: u64,
    /// Shell command per run (`sh -c`); none: every run succeeds.
    #[arg(long)]
    command: Option<String>,
    /// This worker's id (recorded on each attempt); default `dispatcher-<pid>`.
    #[arg(long)]
    worker_id: Option<String>,
    /// Pools to take from (comma-separated, the spec's "pool", default 'default'); all when
    /// not given.
    #[arg(long, value_delimiter = ',')]
    pools: Option<Vec<String>>,
    /// Lease per attempt; heartbeats extend it every third of it.
    #[arg(long, default_value_t = 30_000)]
    lease_ms: i64,
}

/// One taken run.
struct Taken {
    run_id: Uuid,
    attempt_id: Uuid,
    token: Uuid,
    trigger_id: String,
    scheduled_for_ms: i64,
    idempotency_key: String,
    spec: Option<String>,
}

/// How one run ended: outcome, exit status, error.
type Outcome = (&'static str, Option<i32>, Option<String>);

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let pg: tokio_postgres::Config = args.dsn.parse()?;
    let client = Arc::new(qlsched::db::connect(&pg).await?);
    let worker = args
        .worker_id
        .clone()
        .unwrap_or_else(|| format!("dispatcher-{}", std::process::id()));
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let stop = Arc::new(AtomicBool::new(false));
    let wake = Arc::new(Notify::new());
    let (stop2, wake2) = (stop.clone(), wake.clone());
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        stop2.store(true, Ordering::SeqCst);
        wake2.notify_one();
    });
    eprintln!("dispatcher: started as {worker}");
    // A signal stops before the next take; a batch taken is always finished (or released).
    while !stop.load(Ordering::SeqCst) {
        let expired = client.query_one(protocol::EXPIRE, &[&1000i32]).await?;
        let (lost, retried): (i64, i64) = (expired.get(0), expired.get(1));
        if lost > 0 {
            eprintln!("dispatcher: {lost} lost attempt(s), {retried} queued again");
        }
        let taken = take(&client, &worker, &args).await?;
        if taken.is_empty() {
            tokio::select! {
                _ = wake.notified() => break,
                _ = tokio::time::sleep(Duration::from_millis(args.idle_ms)) => continue,
            }
        }
        // The calls of a batch are pipelined on the one connection (one round trip's wait
        // for the batch, not one per run); each is still its own transaction.
        if stop.load(Ordering::SeqCst) {
            let releases = taken.iter().map(|t| async {
                client
                    .query_one(protocol::RELEASE, &[&t.attempt_id, &t.token])
                    .await
            });
            futures::future::try_join_all(releases).await?;
            break;
        }
        let starts = taken.iter().map(|t| async {
            client
                .query_one(protocol::START, &[&t.attempt_id, &t.token, &args.lease_ms])
                .await
        });
        let held = futures::future::try_join_all(starts).await?;
        let started: Vec<Taken> = taken
            .into_iter()
            .zip(held)
            .filter(|(_, r)| r.get::<_, bool>(0))
            .map(|(t, _)| t)
            .collect();
        let cancelled = Cancelled::default();
        let beat = heartbeats(client.clone(), &started, args.lease_ms, cancelled.clone());
        let outcomes = run_all(&started, args.command.as_deref(), &cancelled).await;
        beat.abort();
        let finishes = started
            .iter()
            .zip(&outcomes)
            .map(|(t, (outcome, exit, error))| async {
                client
                    .query_one(
                        protocol::FINISH,
                        &[
                            &t.attempt_id,
                            &t.token,
                            outcome,
                            exit,
                            &None::<String>,
                            error,
                            &None::<serde_json::Value>,
                        ],
                    )
                    .await
            });
        let mut recorded = 0;
        for (t, r) in started
            .iter()
            .zip(futures::future::try_join_all(finishes).await?)
        {
            if r.get::<_, bool>(0) {
                recorded += 1;
            } else {
                eprintln!(
                    "dispatcher: run {} lost its lease: outcome not recorded",
                    t.run_id
                );
            }
        }
        eprintln!("dispatcher: finished {recorded} run(s)");
    }
    eprintln!("dispatcher: stopped");
    Ok(())
}

/// Takes a batch under leases (one call, autocommit).
async fn take(
    client: &tokio_postgres::Client,
    worker: &str,
    args: &Args,
) -> Result<Vec<Taken>, tokio_postgres::Error> {
    Ok(client
        .query(
            protocol::TAKE,
            &[&worker, &args.pools, &args.batch, &args.lease_ms],
        )
        .await?
        .iter()
        .map(|r| Taken {
            run_id: r.get(0),
            attempt_id: r.get(1),
            token: r.get(3),
            trigger_id: r.get(5),
            scheduled_for_ms: r.get(6),
            idempotency_key: r.get(7),
            spec: r.get(8),
        })
        .collect())
}

/// Attempts whose heartbeat answered `cancel_requested` (an operator's
/// `qlsched.request_cancel`): their commands are killed and the runs finished `failed`.
type Cancelled = Arc<std::sync::Mutex<std::collections::HashSet<Uuid>>>;

/// Extends every lease of the batch each third of the lease until aborted; records the
/// attempts whose run an operator asked to stop.
fn heartbeats(
    client: Arc<tokio_postgres::Client>,
    started: &[Taken],
    lease_ms: i64,
    cancelled: Cancelled,
) -> tokio::task::JoinHandle<()> {
    let leases: Vec<(Uuid, Uuid)> = started.iter().map(|t| (t.attempt_id, t.token)).collect();
    tokio::spawn(async move {
        let every = Duration::from_millis((lease_ms / 3).max(1) as u64);
        loop {
            tokio::time::sleep(every).await;
            for (attempt, token) in &leases {
                let held: Result<(Option<i64>, bool), _> = client
                    .query_one(protocol::HEARTBEAT, &[attempt, token, &lease_ms])
                    .await
                    .map(|r| (r.get(0), r.get(1)));
                match held {
                    Ok((Some(_), false)) => {}
                    Ok((Some(_), true)) => {
                        if cancelled.lock().unwrap().insert(*attempt) {
                            eprintln!("dispatcher: attempt {attempt}: a cancel was requested");
                        }
                    }
                    _ => eprintln!("dispatcher: attempt {attempt} lost its lease"),
                }
            }
        }
    })
}

/// Runs the command for every run of the batch concurrently; the outcome of each.
async fn run_all(taken: &[Taken], command: Option<&str>, cancelled: &Cancelled) -> Vec<Outcome> {
    let Some(command) = command else {
        return taken.iter().map(|_| ("succeeded", Some(0), None)).collect();
    };
    let mut children = Vec::with_capacity(taken.len());
    for t in taken {
        let child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(command)
            .env("QLSCHED_RUN_ID", t.run_id.to_string())
            .env("QLSCHED_TRIGGER_ID", &t.trigger_id)
            .env("QLSCHED_SCHEDULED_FOR_MS", t.scheduled_for_ms.to_string())
            .env("QLSCHED_IDEMPOTENCY_KEY", &t.idempotency_key)
            .env("QLSCHED_SPEC", t.spec.as_deref().unwrap_or(""))
            .kill_on_drop(true)
            .spawn();
        children.push(child);
    }
    let mut out = Vec::with_capacity(taken.len());
    for (t, child) in taken.iter().zip(children) {
        out.push(match child {
            Err(e) => ("failed", None, Some(format!("could not start: {e}"))),
            Ok(mut c) => loop {
                if cancelled.lock().unwrap().contains(&t.attempt_id) {
                    let _ = c.kill().await;
                    break (
                        "failed",
                        None,
                        Some("cancelled at an operator's request".into()),
                    );
                }
                tokio::select! {
                    st = c.wait() => break match st {
                        Ok(s) if s.success() => ("succeeded", Some(0), None),
                        Ok(s) => ("failed", s.code(), Some(s.to_string())),
                        Err(e) => ("failed", None, Some(format!("wait: {e}"))),
                    },
                    _ = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            },
        });
    }
    out
}
