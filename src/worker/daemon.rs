//! The composition root of `qlsched worker` (docs/worker.md, "Lifecycle"):
//!
//! - build: open the pool (the replica's connection path) → wait for the database, the
//!   pooler probe and the worker's readiness gate (its protocol calls exist and are its);
//! - run: serve HTTP → READY → loop: expire lapsed attempts (at most once per `poll`), take
//!   (and start) up to the free concurrency, run each taken attempt on its own task; the
//!   next take when `take_batch` attempts ended, `take_linger` after the first did, or
//!   `poll` after the take; ended attempts are finished together, within `take_linger` of
//!   the first ([`super::finisher`]);
//! - stop (SIGTERM/SIGINT): not ready, take no more; running attempts get `drain_timeout`,
//!   then are stopped (SIGTERM, grace, SIGKILL) and finished `failed`; exit 0.

use std::sync::Arc;
use std::time::{Duration, Instant};

use actix_web::dev::ServerHandle;
use slog::{crit, debug, info, warn, Logger};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::attempt::{self, Shared};
use super::cadence::Cadence;
use super::finisher::Finisher;
use super::metrics::WorkerMetrics;
use super::secrets::Credentials;
use super::serve::{self, Ready};
use super::spec::EXECUTORS;
use super::Stop;
use crate::config::worker::{WorkerConfig, WorkerFileConfig};
use crate::config::LogFormat;
use crate::db::{self, Pool};
use crate::startup::Signals;

/// Lapsed attempts marked lost per expiry call.
const EXPIRE_BATCH: i32 = 100;

/// When the worker asks the database to expire lapsed attempts (anyone's): before a take, at
/// most once per `poll`, and at the next take again when the last call filled its batch
/// (more may be waiting). A lease is judged by the database clock and lasts `lease` (seconds
/// to hours); noticing its end up to one `poll` later changes nothing, while a call before
/// every take made a busy worker scan the running attempts dozens of times a second.
#[derive(Debug)]
struct Expiry {
    every: Duration,
    last: Option<Instant>,
    more: bool,
}

impl Expiry {
    fn new(every: Duration) -> Expiry {
        Expiry {
            every,
            last: None,
            more: false,
        }
    }

    /// Whether a take at `now` calls the expiry first.
    fn due(&self, now: Instant) -> bool {
        self.more
            || self
                .last
                .map_or(true, |t| now.duration_since(t) >= self.every)
    }

    /// An expiry call at `now` marked `lost` attempts.
    fn called(&mut self, now: Instant, lost: i64) {
        self.last = Some(now);
        self.more = lost >= EXPIRE_BATCH as i64;
    }
}

/// Why `qlsched worker` stopped with an error (exit 1).
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("database is not ready: {}", problems.join("; "))]
    NotReady { problems: Vec<String> },
    #[error(
        "systemd watchdog interval (WatchdogSec) is {interval:?}; it must be at least twice \
         worker.poll ({poll:?}), because the watchdog is pinged once per take"
    )]
    Watchdog { interval: Duration, poll: Duration },
    #[error("binding HTTP on {addr}: {source}")]
    Http {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("installing the signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Store(#[from] db::StoreError),
}

pub fn run(cfg: WorkerFileConfig, format: LogFormat) -> Result<(), WorkerError> {
    let (root, guard) = crate::telemetry::init(format, &cfg.log.level, None);
    let log = root.new(slog::o!("worker" => cfg.worker.id.to_string()));
    let res = actix::System::new().block_on(async {
        let mut signals = Signals::new().map_err(WorkerError::Signals)?;
        run_until_stopped(cfg, log.clone(), &mut signals).await
    });
    if let Err(e) = &res {
        crit!(log, "qlsched worker stopped with an error"; "error" => %e);
    }
    drop(log);
    drop(root);
    drop(guard);
    res
}

fn notify(state: &[sd_notify::NotifyState]) {
    let _ = sd_notify::notify(state);
}

async fn run_until_stopped(
    cfg: WorkerFileConfig,
    log: Logger,
    signals: &mut Signals,
) -> Result<(), WorkerError> {
    let w = cfg.worker.clone();
    info!(log, "starting"; "database" => &cfg.database.dsn_redacted, "pools" => w.pools.join(","),
          "concurrency" => w.concurrency, "version" => env!("CARGO_PKG_VERSION"));
    let watchdog = watchdog(&w)?;
    let pg = cfg.database.pg.clone().with_keepalives(w.heartbeat);
    let pool = db::build_pool(
        pg.clone(),
        cfg.database.pool_size,
        cfg.database.connect_timeout,
        &log,
    );
    tokio::select! {
        r = wait_ready(&pool, &pg, &log) => r?,
        _ = signals.next() => { info!(log, "stopped before the database was ready"); return Ok(()); }
    }
    let metrics = WorkerMetrics::default();
    metrics.serve_pools(&w.pools);
    let ready = Ready::default();
    let http = serve_http(&cfg, &ready, &metrics, &log)?;
    let (drain_tx, drain) = watch::channel(None::<Stop>);
    let finisher = Finisher::spawn(
        pool.clone(),
        w.take_linger,
        w.concurrency as usize,
        log.clone(),
    );
    let shared = Arc::new(Shared {
        pool: pool.clone(),
        cfg: w.clone(),
        metrics: metrics.clone(),
        log: log.clone(),
        credentials: Credentials::new(w.credentials_directory.clone()),
        finisher,
        drain,
    });
    let mut running: JoinSet<()> = JoinSet::new();
    ready.set(true);
    metrics.ready.set(1);
    notify(&[sd_notify::NotifyState::Ready]);
    info!(log, "ready"; "http" => cfg.http_bind.map(|a| a.to_string()).unwrap_or_else(|| "off".into()));

    take_until_stopped(&shared, &ready, &mut running, signals, watchdog).await;

    // Stop: no more takes; every taken attempt was started by its take and drains.
    ready.set(false);
    metrics.ready.set(0);
    notify(&[sd_notify::NotifyState::Stopping]);
    drain_running(&mut running, &drain_tx, &w, &log).await;
    if let Some(h) = http {
        h.stop(true).await;
    }
    drop(shared);
    drop(pool);
    info!(log, "stopped"; "succeeded" => metrics.succeeded.get(), "failed" => metrics.failed.get());
    actix::System::current().stop();
    Ok(())
}

/// Whether the systemd watchdog is on; refused when its interval is under two polls.
fn watchdog(w: &WorkerConfig) -> Result<bool, WorkerError> {
    match sd_notify::watchdog_enabled() {
        Some(interval) if interval < w.poll * 2 => Err(WorkerError::Watchdog {
            interval,
            poll: w.poll,
        }),
        other => Ok(other.is_some()),
    }
}

/// Serves `/healthz`, `/readyz` and `/metrics` when `[http] bind` is set.
fn serve_http(
    cfg: &WorkerFileConfig,
    ready: &Ready,
    metrics: &WorkerMetrics,
    log: &Logger,
) -> Result<Option<ServerHandle>, WorkerError> {
    let Some(addr) = cfg.http_bind else {
        return Ok(None);
    };
    let tls = match &cfg.http_tls {
        None => Ok(None),
        Some(files) => crate::http::tls::server_config(files, log)
            .map(Some)
            .map_err(|e| std::io::Error::other(e.to_string())),
    };
    tls.and_then(|tls| serve::serve(addr, ready.clone(), metrics.clone(), tls))
        .map(Some)
        .map_err(|source| WorkerError::Http { addr, source })
}

/// The loop: takes up to the free concurrency when the [`Cadence`] says so (a batch of ended
/// attempts, a linger after the first, or the poll) and runs each taken attempt on its own
/// task, until a signal.
async fn take_until_stopped(
    shared: &Arc<Shared>,
    ready: &Ready,
    running: &mut JoinSet<()>,
    signals: &mut Signals,
    watchdog: bool,
) {
    let (w, log) = (&shared.cfg, &shared.log);
    let mut cadence = Cadence::new(w.poll, w.take_linger, w.take_batch, w.concurrency);
    let mut expiry = Expiry::new(w.poll);
    loop {
        if watchdog {
            notify(&[sd_notify::NotifyState::Watchdog]);
        }
        let free = w.concurrency as usize - running.len();
        if cadence.due(Instant::now(), free) {
            cadence.took(Instant::now());
            match take(shared, &mut expiry, free as i32).await {
                Ok((sent, taken)) => {
                    ready.set(true);
                    if !taken.is_empty() {
                        debug!(log, "taken"; "runs" => taken.len(), "free" => free);
                    }
                    for t in taken {
                        running.spawn_local(attempt::run(shared.clone(), t, sent));
                    }
                }
                Err(e) => {
                    ready.set(false);
                    warn!(log, "take failed"; "error" => %e);
                }
            }
        }
        // Wake when an attempt ends (counted towards the batch) or when the cadence may take
        // (the watchdog is pinged at least every `poll`, even with every slot busy).
        let free = w.concurrency as usize - running.len();
        let pause = tokio::time::sleep_until(cadence.wake_at(Instant::now(), free).into());
        tokio::select! {
            _ = signals.next() => break,
            Some(_) = running.join_next(), if !running.is_empty() => cadence.ended(Instant::now()),
            _ = pause => {}
        }
    }
}

/// Gives the running attempts `drain_timeout`, then tells them to stop their commands and
/// waits for their outcomes a bounded while; aborts what is left (their leases expire).
async fn drain_running(
    running: &mut JoinSet<()>,
    drain_tx: &watch::Sender<Option<Stop>>,
    w: &WorkerConfig,
    log: &Logger,
) {
    info!(log, "stopping: waiting for running attempts"; "running" => running.len(),
          "drain_timeout_ms" => w.drain_timeout.as_millis() as u64);
    let drained = tokio::time::timeout(w.drain_timeout, async {
        while running.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(log, "drain timeout passed: stopping the attempts still running"; "running" => running.len());
        let _ = drain_tx.send(Some(Stop::Drain));
        // Each stops its command (SIGTERM, kill_grace, SIGKILL) and records the outcome.
        let bound = w.kill_grace + Duration::from_secs(10) + w.heartbeat;
        if tokio::time::timeout(bound, async {
            while running.join_next().await.is_some() {}
        })
        .await
        .is_err()
        {
            warn!(log, "attempts did not end after the drain; their leases will expire"; "left" => running.len());
            running.abort_all();
        }
    }
}

/// Expires lapsed attempts (anyone's) when [`Expiry`] says so, then takes up to `n` runs,
/// started: (when the take was sent, the runs).
async fn take(
    shared: &Shared,
    expiry: &mut Expiry,
    n: i32,
) -> Result<(Instant, Vec<crate::store::worker::Taken>), db::StoreError> {
    let c = db::conn(&shared.pool).await?;
    let now = Instant::now();
    if expiry.due(now) {
        let (lost, retried) = crate::store::worker::expire(&c, EXPIRE_BATCH).await?;
        expiry.called(now, lost);
        if lost > 0 {
            shared.metrics.expired.inc_by(lost as u64);
            shared.metrics.retried.inc_by(retried as u64);
            info!(shared.log, "lapsed attempts marked lost"; "lost" => lost, "queued_again" => retried);
        }
    }
    let sent = Instant::now();
    let taken = crate::store::worker::take_started(
        &c,
        shared.cfg.id.as_str(),
        &shared.cfg.pools,
        &EXECUTORS,
        n.min(1000),
        shared.cfg.lease.as_millis() as i64,
    )
    .await?;
    Ok((sent, taken))
}

/// Waits for the database and runs the readiness gate for the dispatcher role; retries
/// connection failures, fails at once on a schema that is not ready.
async fn wait_ready(pool: &Pool, target: &db::Target, log: &Logger) -> Result<(), WorkerError> {
    let conn = db::reachable(pool, target, log).await?;
    let problems = crate::store::worker::readiness(&conn).await?;
    if problems.is_empty() {
        return Ok(());
    }
    Err(WorkerError::NotReady { problems })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_runs_before_the_first_take_then_once_per_poll_and_again_after_a_full_batch() {
        let poll = Duration::from_secs(1);
        let t0 = Instant::now();
        let mut e = Expiry::new(poll);
        assert!(e.due(t0), "the first take expires first");
        e.called(t0, 0);
        for ms in [0, 1, 20, 500, 999] {
            assert!(
                !e.due(t0 + Duration::from_millis(ms)),
                "{ms} ms after the call"
            );
        }
        assert!(e.due(t0 + poll), "one poll after the call");
        e.called(t0 + poll, EXPIRE_BATCH as i64);
        assert!(
            e.due(t0 + poll + Duration::from_millis(1)),
            "a full batch: more may be waiting"
        );
        e.called(
            t0 + poll + Duration::from_millis(1),
            EXPIRE_BATCH as i64 - 1,
        );
        assert!(
            !e.due(t0 + poll + Duration::from_millis(2)),
            "a batch not full"
        );
    }
}
