//! The composition root of `qlsched run` (SPEC §7):
//! validate config → open pool → schema readiness → replica guard → startup recovery →
//! scheduler lifecycle → HTTP → systemd READY. Stop (SIGTERM/SIGINT): withdraw readiness →
//! stop the timer and drain the actors → release remaining leases → retire the guard →
//! close the pool.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use anyhow::Context as _;
use slog::{crit, info, warn, Logger};
use uuid::Uuid;

use crate::actors::supervisor::{Drain, Supervisor};
use crate::actors::Settings;
use crate::config::{Config, LogFormat};
use crate::metrics::Metrics;
use crate::store::{self, migrate, recovery, release, replicas, Pool};

pub fn run(cfg: Config, format: LogFormat) -> anyhow::Result<()> {
    let (log, guard) =
        crate::telemetry::init(format, &cfg.log.level, Some(cfg.replica_id.as_str()));
    let res = actix::System::new().block_on(run_until_stopped(cfg, log.clone()));
    if let Err(e) = &res {
        crit!(log, "qlsched stopped with an error"; "error" => format!("{e:#}"));
    }
    drop(log);
    drop(guard);
    res
}

fn notify(state: &[sd_notify::NotifyState]) {
    // No NOTIFY_SOCKET (not under systemd): a no-op.
    let _ = sd_notify::notify(false, state);
}

/// The systemd watchdog ping, when systemd asks for one (`WatchdogSec=`). The supervisor pings
/// once per tick, so an interval under two ticks would get a healthy replica killed after one
/// late tick: refused before the database is touched.
fn watchdog_heartbeat(
    cadence: Duration,
) -> anyhow::Result<Option<crate::actors::supervisor::Heartbeat>> {
    let mut usec = 0;
    if !sd_notify::watchdog_enabled(false, &mut usec) {
        return Ok(None);
    }
    let interval = Duration::from_micros(usec);
    anyhow::ensure!(
        interval >= cadence * 2,
        "systemd watchdog interval (WatchdogSec) is {interval:?}; it must be at least twice \
         scheduler.cadence ({cadence:?}), because the watchdog is pinged once per scheduler tick"
    );
    Ok(Some(Arc::new(|| {
        notify(&[sd_notify::NotifyState::Watchdog])
    })))
}

/// Waits for the database and runs the readiness gate; retries connection failures (the
/// database may come up after us) but fails at once on a schema that is not ready.
async fn wait_ready(pool: &Pool, log: &Logger) -> anyhow::Result<()> {
    let mut delay = Duration::from_millis(200);
    loop {
        match store::conn(pool).await {
            Ok(conn) => {
                let role: String = conn
                    .query_one("SELECT current_user::text", &[])
                    .await?
                    .get(0);
                let problems = migrate::check(&conn, &[(&role, "runtime")]).await?;
                if problems.is_empty() {
                    return Ok(());
                }
                anyhow::bail!("database is not ready: {}", problems.join("; "));
            }
            Err(e) => {
                warn!(log, "database not reachable yet"; "error" => %e, "retry_in_ms" => delay.as_millis() as u64);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

async fn run_until_stopped(cfg: Config, log: Logger) -> anyhow::Result<()> {
    let settings = Settings::from_config(&cfg);
    info!(log, "starting"; "database" => &cfg.database.dsn_redacted, "version" => env!("CARGO_PKG_VERSION"));
    let watchdog = watchdog_heartbeat(settings.cadence)?;
    // A peer that vanishes (partition, dead VM) must break the connection well within a
    // lease: keepalives for idle connections, a TCP user timeout for unacknowledged data.
    let mut pg = cfg.database.pg.clone();
    pg.keepalives(true)
        .keepalives_idle(Duration::from_secs(5))
        .keepalives_interval(Duration::from_secs(2))
        .keepalives_retries(3)
        .tcp_user_timeout(settings.lease / 2);
    let pool = store::build_pool(
        pg,
        cfg.database.pool_size,
        cfg.database.connect_timeout,
        &log,
    );
    let mut signals = Signals::new()?;
    tokio::select! {
        r = wait_ready(&pool, &log) => r?,
        _ = signals.next() => { info!(log, "stopped before the database was ready"); return Ok(()); }
    }

    let incarnation = Uuid::new_v4();
    let hostname = hostname();
    let ttl_ms = settings.lease.as_millis() as i64;
    {
        let conn = store::conn(&pool).await?;
        replicas::acquire(
            &conn,
            &settings.owner,
            incarnation,
            &hostname,
            std::process::id() as i32,
            ttl_ms,
        )
        .await?;
        let released = release::release_all_owned(&conn, &settings.owner).await?;
        if released > 0 {
            info!(log, "released leases left by a previous incarnation"; "count" => released);
        }
        let report = recovery::recover_on_startup(&conn, 100).await?;
        info!(log, "startup recovery"; "pristine_admissions" => report.pristine, "candidates" => report.candidates.len());
        for c in &report.candidates {
            warn!(log, "recovery candidate (fail closed: reported, not dispatched)";
                  "run_id" => %c.run_id, "key" => &c.idempotency_key, "reason" => &c.reason);
        }
    }

    let metrics = Metrics::default();
    let ready = Arc::new(AtomicBool::new(false));
    let supervisor = Supervisor::new(
        settings.clone(),
        pool.clone(),
        metrics.clone(),
        &log,
        watchdog,
    )
    .start();

    let http = match cfg.http.bind {
        Some(addr) => Some(
            crate::http::serve(
                addr,
                crate::http::State {
                    ready: ready.clone(),
                    metrics: metrics.clone(),
                },
            )
            .with_context(|| format!("binding HTTP on {addr}"))?,
        ),
        None => None,
    };
    let gauges = spawn_gauges(pool.clone(), metrics.clone(), cfg.metrics.backlog_interval);
    ready.store(true, Ordering::SeqCst);
    metrics.ready.set(1);
    notify(&[sd_notify::NotifyState::Ready]);
    info!(log, "ready"; "http" => cfg.http.bind.map(|a| a.to_string()).unwrap_or_else(|| "off".into()));

    // Heartbeat the replica guard until a stop signal (or until the guard is lost).
    let mut beat = tokio::time::interval((settings.lease / 3).max(Duration::from_secs(1)));
    beat.tick().await;
    let lost_guard = loop {
        tokio::select! {
            _ = signals.next() => break false,
            _ = beat.tick() => {
                match store::conn(&pool).await {
                    Ok(conn) => match replicas::heartbeat(&conn, &settings.owner, incarnation, ttl_ms).await {
                        Ok(true) => {}
                        Ok(false) => break true,
                        Err(e) => warn!(log, "replica heartbeat failed"; "error" => %e),
                    },
                    Err(e) => warn!(log, "replica heartbeat failed"; "error" => %e),
                }
            }
        }
    };

    // Stop order.
    ready.store(false, Ordering::SeqCst);
    metrics.ready.set(0);
    notify(&[sd_notify::NotifyState::Stopping]);
    info!(log, "stopping: draining claim actors"; "drain_ms" => settings.drain.as_millis() as u64);
    let left = supervisor.send(Drain(settings.drain)).await.unwrap_or(0);
    gauges.abort();
    match store::conn(&pool).await {
        Ok(conn) => {
            match release::release_all_owned(&conn, &settings.owner).await {
                Ok(n) => {
                    info!(log, "leases handed over"; "released" => n, "abandoned_actors" => left)
                }
                Err(e) => warn!(log, "could not release leases; they will expire"; "error" => %e),
            }
            if !lost_guard {
                let _ = replicas::retire(&conn, &settings.owner, incarnation).await;
            }
        }
        Err(e) => warn!(log, "database unreachable at stop; leases will expire"; "error" => %e),
    }
    if let Some(h) = http {
        h.stop(true).await;
    }
    drop(pool);
    System::current().stop();
    if lost_guard {
        anyhow::bail!(
            "replica id `{}` was taken over by another process after this one's heartbeat lapsed",
            settings.owner
        );
    }
    info!(log, "stopped");
    Ok(())
}

/// Recomputes the due-backlog gauges at most once per interval.
fn spawn_gauges(pool: Pool, metrics: Metrics, every: Duration) -> tokio::task::JoinHandle<()> {
    actix::spawn(async move {
        let mut tick = tokio::time::interval(every);
        loop {
            tick.tick().await;
            if let Ok(conn) = store::conn(&pool).await {
                if let Ok((n, oldest)) = store::status::due_backlog(&conn).await {
                    metrics.due_backlog.set(n);
                    metrics
                        .oldest_due_age_seconds
                        .set(oldest.unwrap_or(0) as f64 / 1000.0);
                }
            }
        }
    })
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// SIGTERM and SIGINT as one stream.
struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }
    async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}
