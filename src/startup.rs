//! The composition root of `qlsched run` (docs/design.md, "Lifecycle"), in three steps:
//!
//! - [`Replica::build`]: open the pool → wait for the database and the schema → take the
//!   replica-id guard → release a previous incarnation's leases → start-up recovery;
//! - [`Replica::run`]: start the actors and HTTP → READY → heartbeat the guard and watch the
//!   supervisor until a stop signal, a lost guard or a dead supervisor;
//! - [`Replica::shutdown`]: withdraw readiness → drain the actors → hand leases over (only
//!   while the guard is still ours) → retire the guard → close the pool.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use slog::{crit, error, info, warn, Logger};
use uuid::Uuid;

use crate::actors::derived;
use crate::actors::supervisor::{Drain, Heartbeat, Supervisor};
use crate::actors::Settings;
use crate::config::{Config, LogFormat};
use crate::db;
use crate::db::session::Connector;
use crate::db::Pool;
use crate::health::Health;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::schema;
use crate::store::{recovery, release, replicas};

/// How long a replica id held by a process of this host name is asked for again before the
/// start is refused (its holder may have just died).
const ACQUIRE_PATIENCE: Duration = Duration::from_secs(5);

/// Most recovery candidates listed one by one in the log (the count is always the true one).
const RECOVERY_LIST_LIMIT: i64 = 100;

/// Why `qlsched run` stopped with an error (every one exits 1; the message is the log's and
/// the terminal's).
#[derive(Debug, thiserror::Error)]
pub enum StartupError {
    /// The schema or the role is not what this version needs (`qlsched db check`).
    #[error("database is not ready: {}", problems.join("; "))]
    NotReady { problems: Vec<String> },
    /// Another live process holds this replica id.
    #[error(transparent)]
    GuardInUse(replicas::GuardError),
    /// Another process took this replica id over after this one's heartbeat lapsed.
    #[error(
        "replica id `{id}` was taken over by another process after this one's heartbeat lapsed"
    )]
    GuardLost { id: String },
    #[error("the scheduler supervisor stopped unexpectedly")]
    SupervisorDied,
    #[error(
        "systemd watchdog interval (WatchdogSec) is {interval:?}; it must be at least twice \
         scheduler.cadence ({cadence:?}), because the watchdog is pinged once per scheduler tick"
    )]
    Watchdog {
        interval: Duration,
        cadence: Duration,
    },
    #[error("binding HTTP on {addr}: {source}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("installing the signal handlers: {0}")]
    Signals(std::io::Error),
    #[error(transparent)]
    Store(#[from] db::StoreError),
}

impl From<replicas::GuardError> for StartupError {
    fn from(e: replicas::GuardError) -> Self {
        match e {
            replicas::GuardError::Store(e) => StartupError::Store(e),
            in_use => StartupError::GuardInUse(in_use),
        }
    }
}

pub fn run(cfg: Config, format: LogFormat) -> Result<(), StartupError> {
    let (log, guard) =
        crate::telemetry::init(format, &cfg.log.level, Some(cfg.replica_id.as_str()));
    let res = actix::System::new().block_on(async {
        let mut signals = Signals::new().map_err(StartupError::Signals)?;
        let Some(replica) = Replica::build(cfg, log.clone(), &mut signals).await? else {
            return Ok(());
        };
        let mut replica = replica;
        let end = replica.run(&mut signals).await;
        replica.shutdown(end).await
    });
    if let Err(e) = &res {
        crit!(log, "qlsched stopped with an error"; "error" => %e);
    }
    drop(log);
    drop(guard);
    res
}

fn notify(state: &[sd_notify::NotifyState]) {
    // No NOTIFY_SOCKET (not under systemd): a no-op.
    let _ = sd_notify::notify(state);
}

/// The systemd watchdog ping, when systemd asks for one (`WatchdogSec=`). The supervisor pings
/// once per tick, so an interval under two ticks would get a healthy replica killed after one
/// late tick: refused before the database is touched.
fn watchdog_heartbeat(cadence: Duration) -> Result<Option<Heartbeat>, StartupError> {
    let Some(interval) = sd_notify::watchdog_enabled() else {
        return Ok(None);
    };
    if interval < cadence * 2 {
        return Err(StartupError::Watchdog { interval, cadence });
    }
    Ok(Some(Arc::new(|| {
        notify(&[sd_notify::NotifyState::Watchdog])
    })))
}

/// The replica-id guard of this process: at most one live process per replica id, judged by
/// the database clock. Owns acquire, the heartbeat's terms (the claim rounds extend it in
/// their own statement, so an idle replica issues one statement per round) and retire; once
/// lost it is never used again (another process owns the id, and with it every lease under
/// that owner name).
pub struct ReplicaGuard {
    owner: String,
    incarnation: Uuid,
    ttl: Duration,
    lost: bool,
    /// Held from the acquire to the end of the shutdown (crate::identity).
    identity: Option<Identity>,
}

impl ReplicaGuard {
    pub async fn acquire(pool: &Pool, owner: &str, lease: Duration) -> Result<Self, StartupError> {
        let guard = ReplicaGuard {
            owner: owner.to_string(),
            incarnation: Uuid::new_v4(),
            ttl: derived::guard_ttl(lease),
            lost: false,
            identity: None,
        };
        let conn = db::conn(pool).await?;
        let host = hostname();
        // A predecessor on this host killed a moment ago may still have its session in the
        // database (a backend ends its statement before it notices the closed socket): a
        // holder of this host name is asked again for a few seconds before the refusal.
        let mut patience = ACQUIRE_PATIENCE;
        loop {
            let res = replicas::acquire(
                &conn,
                owner,
                guard.incarnation,
                &host,
                std::process::id() as i32,
                guard.ttl.as_millis() as i64,
            )
            .await;
            match res {
                Err(replicas::GuardError::InUse { ref holder, .. })
                    if holder.hostname == host && !patience.is_zero() =>
                {
                    let step = Duration::from_millis(250).min(patience);
                    tokio::time::sleep(step).await;
                    patience -= step;
                }
                res => {
                    res?;
                    return Ok(guard);
                }
            }
        }
    }

    /// What the claim rounds need to extend the guard: this incarnation and the TTL.
    pub fn terms(&self) -> (Uuid, Duration) {
        (self.incarnation, self.ttl)
    }

    /// A round found the guard taken over.
    fn lost(&mut self) {
        self.lost = true;
    }

    /// Releases every lease under the id and retires the guard, only while it is still
    /// ours (checked in the database, in the same transaction): `None` = lost.
    async fn hand_over(
        &self,
        conn: &tokio_postgres::Client,
    ) -> Result<Option<u64>, db::StoreError> {
        if self.lost {
            return Ok(None);
        }
        replicas::hand_over(conn, &self.owner, self.incarnation).await
    }
}

/// Why the run loop ended.
#[derive(Debug)]
pub enum End {
    Signal,
    GuardLost,
    SupervisorDied,
    /// HTTP could not be bound: the replica stops as after a signal (drain, hand-over,
    /// retire), then exits with this error.
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A replica between build and shutdown.
pub struct Replica {
    cfg: Config,
    log: Logger,
    settings: Settings,
    pool: Pool,
    guard: ReplicaGuard,
    metrics: Metrics,
    health: Health,
    watchdog: Option<Heartbeat>,
    running: Option<Running>,
    /// Where the console's pool connects (the pool's target, keepalives included).
    console_target: db::Target,
}

struct Running {
    supervisor: Addr<Supervisor>,
    http: Option<actix_web::dev::ServerHandle>,
    /// The pruner task (docs/design.md, "Retention"), aborted at stop.
    pruner: Option<actix_rt::task::JoinHandle<()>>,
}

impl Replica {
    /// Everything before the lifecycle; `None` when a stop signal came first.
    pub async fn build(
        cfg: Config,
        log: Logger,
        signals: &mut Signals,
    ) -> Result<Option<Self>, StartupError> {
        info!(log, "starting"; "database" => &cfg.database.dsn_redacted, "version" => env!("CARGO_PKG_VERSION"));
        let unverified = unverified_tcp_hosts(&cfg.database.pg);
        if !unverified.is_empty() {
            let mode = cfg.database.pg.tls().settings().mode.as_str();
            warn!(log, "database connections to a non-loopback host are not protected against an attacker on the path: use sslmode=verify-full with sslrootcert (docs/operations.md, \"TLS to PostgreSQL\")";
                  "sslmode" => mode, "hosts" => unverified.join(","));
        }
        let lease = cfg.scheduler.lease;
        let watchdog = watchdog_heartbeat(cfg.scheduler.cadence)?;
        // A peer that vanishes must break the connection well within a lease.
        let pg = cfg
            .database
            .pg
            .clone()
            .with_keepalives(derived::tcp_user_timeout(lease));
        let connector = Connector {
            pg: pg.clone(),
            connect_timeout: cfg.database.connect_timeout,
        };
        let settings = Settings::from_config(&cfg, connector);
        let pool = db::build_pool(
            pg.clone(),
            cfg.database.pool_size,
            cfg.database.connect_timeout,
            &log,
        );
        tokio::select! {
            r = wait_ready(&pool, &pg, &log) => r?,
            _ = signals.next() => { info!(log, "stopped before the database was ready"); return Ok(None); }
        }
        let mut guard = ReplicaGuard::acquire(&pool, &settings.owner, lease).await?;
        // The id is this process's: its identity lock from now on, before READY.
        guard.identity = Some(
            Identity::hold(
                pg.clone(),
                &settings.owner,
                pg.attempt_bound() + cfg.database.connect_timeout,
                derived::guard_refresh(guard.ttl),
                &log,
            )
            .await,
        );
        let mut settings = settings;
        settings.guard = Some(guard.terms());
        {
            let conn = db::conn(&pool).await?;
            let released = release::release_all_owned(&conn, &settings.owner).await?;
            if released > 0 {
                info!(log, "released leases left by a previous incarnation"; "count" => released);
            }
            let report = recovery::recover_on_startup(&conn, RECOVERY_LIST_LIMIT).await?;
            info!(log, "startup recovery"; "pristine_admissions" => report.pristine,
                  "candidates" => report.candidate_count, "listed" => report.candidates.len());
            for c in &report.candidates {
                warn!(log, "recovery candidate (fail closed: reported, not dispatched)";
                      "run_id" => %c.run_id, "key" => &c.idempotency_key, "reason" => &c.reason);
            }
        }
        let metrics = Metrics::default();
        metrics
            .database_tls_unverified
            .set(i64::from(!unverified.is_empty()));
        Ok(Some(Replica {
            cfg,
            log,
            settings,
            pool,
            guard,
            metrics,
            health: Health::default(),
            watchdog,
            running: None,
            console_target: pg,
        }))
    }

    /// Starts the lifecycle and runs until a stop signal, a lost guard or a dead supervisor.
    pub async fn run(&mut self, signals: &mut Signals) -> End {
        let supervisor = Supervisor::new(
            self.settings.clone(),
            self.metrics.clone(),
            &self.log,
            self.watchdog.clone(),
            self.health.clone(),
        )
        .start();
        let http = match self.serve_http() {
            Ok(h) => h,
            Err((addr, source)) => {
                self.running = Some(Running {
                    supervisor,
                    http: None,
                    pruner: None,
                });
                return End::Http { addr, source };
            }
        };
        // Retention runs beside the claim path, on its own pooled connection per pass.
        let pruner = crate::retention::Pruner {
            owner: self.settings.owner.clone(),
            cfg: self.cfg.retention.clone(),
            metrics: self.metrics.clone(),
            log: self.log.clone(),
        };
        let pruner = actix_rt::spawn(pruner.run(self.pool.clone()));
        self.running = Some(Running {
            supervisor: supervisor.clone(),
            http,
            pruner: Some(pruner),
        });
        self.health.set_running(true);
        self.metrics.ready.set(1);
        notify(&[sd_notify::NotifyState::Ready]);
        info!(self.log, "ready"; "http" => self.cfg.http.bind.map(|a| a.to_string()).unwrap_or_else(|| "off".into()));

        self.watch(&supervisor, signals).await
    }

    /// Until a stop signal, a dead supervisor or a lost guard.
    async fn watch(&mut self, supervisor: &Addr<Supervisor>, signals: &mut Signals) -> End {
        // The supervisor is watched every cadence: a panicked actor is gone at once (systemd
        // restarts the process); a round that found the guard taken over ends the run.
        let mut watch = tokio::time::interval(self.settings.cadence.min(Duration::from_secs(1)));
        loop {
            tokio::select! {
                _ = signals.next() => break End::Signal,
                _ = watch.tick() => {
                    if !supervisor.connected() {
                        break End::SupervisorDied;
                    }
                    if self.health.is_guard_lost() {
                        self.guard.lost();
                        break End::GuardLost;
                    }
                }
            }
        }
    }

    /// The HTTP endpoints (and the console, with its own small pool built with the same
    /// target as the replica's pool), when `[http] bind` is set.
    fn serve_http(
        &self,
    ) -> Result<Option<actix_web::dev::ServerHandle>, (std::net::SocketAddr, std::io::Error)> {
        let Some(addr) = self.cfg.http.bind else {
            return Ok(None);
        };
        let console = self.cfg.http.console.clone().map(|c| {
            crate::console::Console::new(
                self.console_target.clone(),
                self.cfg.database.connect_timeout,
                c,
                self.metrics.clone(),
                self.settings.owner.to_string(),
                &self.log,
            )
        });
        let state = crate::http::State {
            health: self.health.clone(),
            metrics: self.metrics.clone(),
            console,
            public_names: self.cfg.http.public_names.clone(),
        };
        let served = match &self.cfg.http.tls {
            None => Ok(None),
            Some(files) => crate::http::tls::server_config(files, &self.log)
                .map(Some)
                .map_err(|e| std::io::Error::other(e.to_string())),
        };
        served
            .and_then(|tls| crate::http::serve(addr, state, tls))
            .map(Some)
            .map_err(|source| (addr, source))
    }

    /// Withdraws readiness, drains, hands leases over (only while the guard is ours), retires
    /// the guard and closes the pool. A lost guard or a dead supervisor is an error exit.
    pub async fn shutdown(self, end: End) -> Result<(), StartupError> {
        let Replica {
            log,
            settings,
            pool,
            guard,
            metrics,
            health,
            running,
            ..
        } = self;
        health.set_running(false);
        metrics.ready.set(0);
        notify(&[sd_notify::NotifyState::Stopping]);
        let mut left = 0;
        let mut http = None;
        if let Some(r) = running {
            http = r.http;
            if let Some(p) = r.pruner {
                p.abort();
            }
            if matches!(end, End::SupervisorDied) {
                error!(log, "the scheduler supervisor stopped unexpectedly; exiting so that the service manager restarts the replica");
            } else {
                info!(log, "stopping: draining claim actors"; "drain_ms" => settings.drain.as_millis() as u64);
                left = r.supervisor.send(Drain(settings.drain)).await.unwrap_or(0);
            }
        }
        // A round that found the guard taken over may not have been noticed by the run loop
        // yet (a stop signal came first): the lost guard still decides.
        let mut end = end;
        if health.is_guard_lost() {
            end = End::GuardLost;
        }
        match db::conn(&pool).await {
            // With the guard lost, another process owns this replica id and every lease under
            // it: releasing "our" leases would release theirs. The hand-over itself is
            // conditioned on the guard row, so a loss no round has seen yet counts too.
            Ok(conn) => match guard.hand_over(&conn).await {
                Ok(Some(n)) => {
                    info!(log, "leases handed over"; "released" => n, "abandoned_actors" => left)
                }
                Ok(None) => {
                    end = End::GuardLost;
                    warn!(log, "replica id taken over by another process; leaving every lease to it";
                          "abandoned_actors" => left)
                }
                Err(e) => {
                    warn!(log, "could not release leases; they will expire"; "error" => %e)
                }
            },
            Err(e) => warn!(log, "database unreachable at stop; leases will expire"; "error" => %e),
        }
        if let Some(h) = http {
            h.stop(true).await;
        }
        drop(pool);
        System::current().stop();
        match end {
            End::GuardLost => Err(StartupError::GuardLost { id: settings.owner }),
            End::SupervisorDied => Err(StartupError::SupervisorDied),
            End::Http { addr, source } => Err(StartupError::Http { addr, source }),
            End::Signal => {
                info!(log, "stopped"; "admitted" => metrics.admits.get());
                Ok(())
            }
        }
    }
}

/// Waits for the database and runs the readiness gate; retries connection failures (the
/// database may come up after us) but fails at once on a schema that is not ready.
async fn wait_ready(pool: &Pool, target: &db::Target, log: &Logger) -> Result<(), StartupError> {
    let conn = db::reachable(pool, target, log).await?;
    let role = schema::current_role(&conn).await?;
    let problems = schema::check(&conn, &[(&role, "runtime")]).await?;
    if problems.is_empty() {
        return Ok(());
    }
    Err(StartupError::NotReady { problems })
}

/// This machine's host name (`unknown` if it cannot be read).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}

/// SIGTERM and SIGINT as one stream.
pub struct Signals {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl Signals {
    pub fn new() -> std::io::Result<Signals> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Signals {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }
    pub async fn next(&mut self) {
        tokio::select! {
            _ = self.term.recv() => {}
            _ = self.int.recv() => {}
        }
    }
}

/// The TCP hosts of `target` that are not loopback when its `sslmode` does not protect
/// against an attacker on the path: `disable`, `prefer` (a forged "no TLS" answer is
/// accepted), or `require` without a root certificate (any certificate is accepted).
/// Empty when the mode verifies the server or every host is loopback or a socket.
pub fn unverified_tcp_hosts(target: &db::Target) -> Vec<String> {
    use crate::db::tls::SslMode;
    use tokio_postgres::config::Host;
    let tls = target.tls().settings();
    let weak = match tls.mode {
        SslMode::Disable | SslMode::Prefer => true,
        SslMode::Require => {
            tls.root_cert.is_none()
                && !crate::db::tls::default_root_cert().is_some_and(|p| p.exists())
        }
        SslMode::VerifyCa | SslMode::VerifyFull => false,
    };
    if !weak {
        return Vec::new();
    }
    let loopback = |h: &str| {
        h.eq_ignore_ascii_case("localhost")
            || h.trim_start_matches('[')
                .trim_end_matches(']')
                .parse::<std::net::IpAddr>()
                .is_ok_and(|ip| ip.is_loopback())
    };
    // With hostaddr, that address is where the connection goes (host only names it).
    if !target.get_hostaddrs().is_empty() {
        return target
            .get_hostaddrs()
            .iter()
            .filter(|a| !a.is_loopback())
            .map(|a| a.to_string())
            .collect();
    }
    target
        .get_hosts()
        .iter()
        .filter_map(|h| match h {
            Host::Tcp(name) if !loopback(name) => Some(name.clone()),
            _ => None,
        })
        .collect()
}
