//! Reaching PostgreSQL the way libpq does: the conninfo/URL parser and libpq's environment
//! ([`dsn`]), the password file ([`passfile`]) and credential files ([`credfile`]), hosts and
//! failover ([`hosts`]), TLS ([`tls`]), sessions and their bounds ([`session`]), pooler
//! detection ([`pooler`]), advisory locks and who holds them ([`locks`]), and the bb8 pool
//! every replica component shares.

pub mod credfile;
pub mod dsn;
mod error;
pub mod hosts;
pub mod locks;
pub mod passfile;
pub mod pooler;
pub mod session;
pub mod tls;

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use bb8_postgres::PostgresConnectionManager;

pub use error::{connection_lost, describe, StoreError};
pub use hosts::SessionAttrs;
pub use tls::Tls;

/// The connection pool every replica component shares.
pub type Pool = bb8::Pool<Manager>;
/// A pooled connection.
pub type Conn<'a> = bb8::PooledConnection<'a, Manager>;

/// Where and how to connect: the driver's settings, the TLS connector that goes with them
/// (built from the DSN's `sslmode`, `sslrootcert`, `sslcert`, `sslkey`), the session
/// attributes asked for (`target_session_attrs`) and which of its hosts answered last.
/// Derefs to the driver's settings so callers can adjust time-outs and keepalives.
#[derive(Clone, Debug)]
pub struct Target {
    pg: tokio_postgres::Config,
    tls: Tls,
    attrs: SessionAttrs,
    last_good: hosts::LastGood,
}

impl Target {
    pub fn new(mut pg: tokio_postgres::Config, tls: Tls) -> Target {
        tls.apply(&mut pg);
        Target {
            pg,
            tls,
            attrs: SessionAttrs::default(),
            last_good: hosts::LastGood::default(),
        }
    }

    /// The same target, asking for sessions with `attrs` (`target_session_attrs`).
    pub fn with_session_attrs(mut self, attrs: SessionAttrs) -> Target {
        self.attrs = attrs;
        self
    }

    pub fn session_attrs(&self) -> SessionAttrs {
        self.attrs
    }

    pub fn tls(&self) -> &Tls {
        &self.tls
    }

    /// The same target, its connections broken within about `tcp_user_timeout` when the
    /// peer vanishes (partition, dead VM): keepalives for idle connections, a TCP user
    /// timeout for unacknowledged data.
    pub fn with_keepalives(mut self, tcp_user_timeout: Duration) -> Target {
        self.pg
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .keepalives_interval(Duration::from_secs(2))
            .keepalives_retries(3)
            .tcp_user_timeout(tcp_user_timeout);
        self
    }

    /// How long one connection attempt may take at most: each host's `connect_timeout` for
    /// every host, once per pass of the session attributes (5 s per host when unset).
    pub fn attempt_bound(&self) -> Duration {
        let per_host = self
            .pg
            .get_connect_timeout()
            .copied()
            .unwrap_or(Duration::from_secs(5));
        let tries = hosts::host_count(&self.pg).max(1) * self.attrs.pass_count();
        per_host * tries as u32
    }

    /// Opens one connection: the hosts in turn, the last good one first (see [`hosts`]).
    /// The caller drives the returned connection (spawns it, or polls its messages).
    pub async fn connect_raw(
        &self,
    ) -> Result<
        (
            tokio_postgres::Client,
            tokio_postgres::Connection<tokio_postgres::Socket, hosts::Stream>,
        ),
        tokio_postgres::Error,
    > {
        hosts::connect(&self.pg, &self.tls, self.attrs, &self.last_good).await
    }
}

/// The pool's connection manager: bb8-postgres's, for one host at a time in the order
/// [`hosts`] gives, so the pool follows the DSN's hosts like every other connection of the
/// replica (bb8-postgres alone would hand the whole host list to the driver, which neither
/// starts at the last good host nor knows libpq's socket and `target_session_attrs` rules).
#[derive(Clone, Debug)]
pub struct Manager(Target);

impl bb8::ManageConnection for Manager {
    type Connection = tokio_postgres::Client;
    type Error = tokio_postgres::Error;

    async fn connect(&self) -> Result<Self::Connection, Self::Error> {
        let t = &self.0;
        hosts::first_that_connects(&t.pg, t.attrs, &t.last_good, |one| {
            let manager = PostgresConnectionManager::new(one, t.tls.clone());
            async move { bb8::ManageConnection::connect(&manager).await }
        })
        .await
    }

    async fn is_valid(&self, conn: &mut Self::Connection) -> Result<(), Self::Error> {
        conn.simple_query("").await.map(|_| ())
    }

    fn has_broken(&self, conn: &mut Self::Connection) -> bool {
        conn.is_closed()
    }
}

impl Deref for Target {
    type Target = tokio_postgres::Config;
    fn deref(&self) -> &tokio_postgres::Config {
        &self.pg
    }
}

impl DerefMut for Target {
    fn deref_mut(&mut self) -> &mut tokio_postgres::Config {
        &mut self.pg
    }
}

/// A driver config alone: its own `sslmode` (disable, prefer, require), no certificate files.
impl From<tokio_postgres::Config> for Target {
    fn from(pg: tokio_postgres::Config) -> Target {
        let tls = Tls::from_driver(&pg);
        Target::new(pg, tls)
    }
}

impl From<&tokio_postgres::Config> for Target {
    fn from(pg: &tokio_postgres::Config) -> Target {
        Target::from(pg.clone())
    }
}

impl From<&Target> for Target {
    fn from(t: &Target) -> Target {
        t.clone()
    }
}

/// Schema that holds every qlsched object.
pub const SCHEMA: &str = "qlsched";

/// The one SQL fragment that reads the database clock in Unix milliseconds. A macro, so
/// statements built with `concat!` stay `&'static str` constants:
/// `concat!("SELECT ", db_now_ms!())`. Every statement that judges time uses it.
#[macro_export]
macro_rules! db_now_ms {
    () => {
        "(extract(epoch FROM clock_timestamp()) * 1000)::bigint"
    };
}

/// Logs the pool's connection errors (refused, auth failed, reset) through slog: without it
/// a `get()` only ever says "timed out".
#[derive(Debug, Clone)]
struct SlogErrorSink(slog::Logger);

impl bb8::ErrorSink<tokio_postgres::Error> for SlogErrorSink {
    fn sink(&self, e: tokio_postgres::Error) {
        slog::warn!(self.0, "database connection error"; "error" => describe(&e));
    }
    fn boxed_clone(&self) -> Box<dyn bb8::ErrorSink<tokio_postgres::Error>> {
        Box::new(self.clone())
    }
}

/// Builds the pool without connecting (connections are made on demand, so a replica started
/// before its database comes up retries instead of failing).
pub fn build_pool(
    target: impl Into<Target>,
    max_size: u32,
    connect_timeout: Duration,
    log: &slog::Logger,
) -> Pool {
    let manager = Manager(target.into());
    bb8::Pool::builder()
        .max_size(max_size)
        .min_idle(Some(0))
        .connection_timeout(connect_timeout)
        // A broken connection fails its first statement and is dropped on return
        // (bb8-postgres reports `is_closed`); checking every checkout would add a round
        // trip to every claim and admission.
        .test_on_check_out(false)
        .idle_timeout(Some(Duration::from_secs(300)))
        .error_sink(Box::new(SlogErrorSink(log.clone())))
        .build_unchecked(manager)
}

/// Gets a connection, mapping bb8's time-out to a typed error that carries the bound.
///
/// An idle connection whose backend has gone (terminated, server restarted) is closed on
/// the client side as soon as its connection task reads the EOF; such a connection is never
/// handed out: it goes back to the pool, which discards it (`has_broken` is `is_closed`),
/// and the next one is tried. Checking costs no round trip.
pub async fn conn(pool: &Pool) -> Result<Conn<'_>, StoreError> {
    let tries = pool.state().connections as usize + 1;
    for _ in 0..tries {
        let c = pool.get().await.map_err(|e| match e {
            bb8::RunError::User(e) => StoreError::Db(e),
            bb8::RunError::TimedOut => StoreError::PoolTimeout(pool.config().connection_timeout),
        })?;
        if !c.is_closed() {
            return Ok(c);
        }
    }
    Err(StoreError::AllConnectionsClosed)
}

/// Waits for the database to answer (it may come up after us), retrying connection
/// failures with back-off up to 5 s, then runs the pooler probe; returns a connection for the
/// caller's readiness gate. The probe fails at once: a transaction pooler is no reason to
/// wait.
pub async fn reachable<'p>(
    pool: &'p Pool,
    target: &Target,
    log: &slog::Logger,
) -> Result<Conn<'p>, StoreError> {
    let mut delay = Duration::from_millis(200);
    loop {
        match conn(pool).await {
            Ok(first) => {
                // The pooler probe first: it speaks only the simple-query protocol, and
                // nothing prepared may go through a transaction pooler before it refused.
                drop(first);
                pooler::require_session_pooling(pool, target).await?;
                return conn(pool).await;
            }
            Err(e) => {
                slog::warn!(log, "database not reachable yet"; "error" => %e,
                            "retry_in_ms" => delay.as_millis() as u64);
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Connects a single client outside any pool (management commands, migrations). The
/// connection's task logs how it ended when that was an error (through the global slog
/// logger; the driver's errors never carry the password).
pub async fn connect(target: impl Into<Target>) -> Result<tokio_postgres::Client, StoreError> {
    let (client, connection) = target.into().connect_raw().await?;
    tokio::spawn(async move {
        if let Err(e) = connection.await {
            slog::warn!(slog_scope::logger(), "database connection ended with an error";
                "error" => describe(&e));
        }
    });
    Ok(client)
}
