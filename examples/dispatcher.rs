//! The reference dispatcher (docs/dispatcher.md): logs in as `<prefix>_dispatcher`, takes
//! batches of queued runs (`FOR UPDATE SKIP LOCKED`, so any number of copies can run side
//! by side), marks them running, optionally runs a shell command per run, and finishes each
//! as succeeded or failed, with the matching events. Stops cleanly on SIGTERM/SIGINT: no new
//! batch is taken, the current one is finished.
//!
//! ```text
//! cargo run --example dispatcher -- --dsn 'host=… user=qlsched_dispatcher dbname=qlsched' \
//!     [--batch 100] [--idle-ms 200] [--command 'echo "$QLSCHED_RUN_ID"']
//! ```
//!
//! The command runs under `sh -c` with QLSCHED_RUN_ID, QLSCHED_TRIGGER_ID,
//! QLSCHED_SCHEDULED_FOR_MS, QLSCHED_IDEMPOTENCY_KEY and QLSCHED_SPEC in its environment;
//! exit 0 is `succeeded`, anything else `failed` (the exit status is the attempt's error).
//! Without `--command` every run succeeds at once (benchmarks, tests).
//!
//! Exactly once: a run is taken by one dispatcher only (the row lock and the status re-check
//! of the take). A dispatcher that dies after the take and before `running` leaves the run
//! `dispatching`; one that dies after `running` leaves it `running`. Neither is taken again
//! (nobody can know whether its command ran): start-up recovery lists it, an operator decides.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use qlsched::store::dispatch::{FINISH_SQL, START_SQL, TAKE_SQL};
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::Notify;
use uuid::Uuid;

#[derive(Parser, Debug)]
struct Args {
    /// DSN of the dispatcher role (libpq key=value or URL).
    #[arg(long, env = "QLSCHED_DISPATCHER_DSN")]
    dsn: String,
    /// Runs taken per transaction.
    #[arg(long, default_value_t = 100)]
    batch: i64,
    /// Pause when no run was queued.
    #[arg(long, default_value_t = 200)]
    idle_ms: u64,
    /// Shell command per run (`sh -c`); none: every run succeeds.
    #[arg(long)]
    command: Option<String>,
}

/// One taken run.
struct Taken {
    run_id: Uuid,
    trigger_id: String,
    scheduled_for_ms: i64,
    idempotency_key: String,
    spec: Option<String>,
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args = Args::parse();
    let pg: tokio_postgres::Config = args.dsn.parse()?;
    let client = qlsched::store::connect(&pg).await?;
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
    eprintln!("dispatcher: started");
    // A signal stops before the next take; a batch taken is always finished.
    while !stop.load(Ordering::SeqCst) {
        let taken = take(&client, args.batch).await?;
        if taken.is_empty() {
            tokio::select! {
                _ = wake.notified() => break,
                _ = tokio::time::sleep(Duration::from_millis(args.idle_ms)) => continue,
            }
        }
        let ids: Vec<Uuid> = taken.iter().map(|t| t.run_id).collect();
        client.query(START_SQL, &[&ids]).await?;
        let outcomes = run_all(&taken, args.command.as_deref()).await;
        let (outcome, error): (Vec<&str>, Vec<Option<String>>) = outcomes.into_iter().unzip();
        let finished = client.query(FINISH_SQL, &[&ids, &outcome, &error]).await?;
        eprintln!("dispatcher: finished {} run(s)", finished.len());
    }
    eprintln!("dispatcher: stopped");
    Ok(())
}

/// Takes a batch and marks it dispatching (one statement, autocommit).
async fn take(
    client: &tokio_postgres::Client,
    batch: i64,
) -> Result<Vec<Taken>, tokio_postgres::Error> {
    Ok(client
        .query(TAKE_SQL, &[&batch])
        .await?
        .iter()
        .map(|r| Taken {
            run_id: r.get(0),
            trigger_id: r.get(2),
            scheduled_for_ms: r.get(3),
            idempotency_key: r.get(4),
            spec: r.get(5),
        })
        .collect())
}

/// Runs the command for every run of the batch concurrently; (outcome, error) per run.
async fn run_all(taken: &[Taken], command: Option<&str>) -> Vec<(&'static str, Option<String>)> {
    let Some(command) = command else {
        return taken.iter().map(|_| ("succeeded", None)).collect();
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
    for child in children {
        out.push(match child {
            Err(e) => ("failed", Some(format!("could not start: {e}"))),
            Ok(mut c) => match c.wait().await {
                Ok(s) if s.success() => ("succeeded", None),
                Ok(s) => ("failed", Some(s.to_string())),
                Err(e) => ("failed", Some(format!("wait: {e}"))),
            },
        });
    }
    out
}
