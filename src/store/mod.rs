//! Every SQL statement of qlsched, in one place. Each function is named for the question it
//! answers and carries, in one comment, the reason its locking is right.
//!
//! Time is always the database clock (`clock_timestamp()` in Unix ms), observed inside the
//! same statement that acts on it.

pub mod admit;
pub mod claim;
pub mod dispatch;
pub mod hosts;
pub mod locks;
pub mod manage;
pub mod migrate;
pub mod pooler;
pub mod recovery;
pub mod release;
pub mod replicas;
pub mod retention;
pub mod runs;
pub mod session;
pub mod status;
pub mod tls;
pub mod triggers;
pub mod views;
pub mod wake;
pub mod worker;

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use bb8_postgres::PostgresConnectionManager;
use tokio_postgres::error::SqlState;

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

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {}", describe(.0))]
    Db(#[from] tokio_postgres::Error),
    #[error("no database connection within {0:?} (the pool's last connect error is in the log)")]
    PoolTimeout(Duration),
    #[error("migration: {0}")]
    Migration(#[from] refinery::Error),
    #[error("role prefix `{0}` must match [a-z][a-z0-9_]{{0,39}}")]
    BadRolePrefix(String),
    #[error("refusing to migrate: {0}")]
    MigrationDrift(Box<migrate::Drift>),
    /// `db migrate` waited for its locks for all of `--max-wait` (docs/design.md, "Schema
    /// changes and rolling upgrades").
    #[error("{0}")]
    MigrationGaveUp(Box<migrate::GaveUp>),
    /// Another session holds the migration lock of this database: another `db migrate`,
    /// or any session that took the advisory lock (any role may).
    #[error("refusing to migrate: the `qlsched db migrate` lock of this database is {0}; if that is another `qlsched db migrate`, let it finish")]
    MigrateRunning(Box<locks::Holders>),
    /// A lock wait (an advisory lock any role may hold, or a lock later in the same
    /// transaction) outlasted its bound (docs/design.md, "Advisory locks").
    #[error("{what}: waited {bound} (lock_timeout) for its locks and gave up, nothing was written; the {lock} is {holders}")]
    LockWait {
        what: &'static str,
        lock: &'static str,
        bound: String,
        holders: String,
    },
    /// A declared concurrent index build failed (it is left INVALID; the next `db migrate`
    /// drops and rebuilds it).
    #[error("building index {index} CONCURRENTLY (migration {file}) failed: {}; it is left INVALID and unused, and the next `qlsched db migrate` drops and rebuilds it", describe(source))]
    IndexBuild {
        index: String,
        file: String,
        source: tokio_postgres::Error,
    },
    /// A role `db migrate` grants to does not exist (an install bootstrapped before the
    /// role was added).
    #[error("refusing to migrate: role {0} does not exist; run `qlsched db bootstrap` (idempotent) first")]
    MissingRole(String),
    /// One client connection was served by two PostgreSQL sessions.
    #[error(
        "one connection was served by two PostgreSQL sessions (backend pid {first}, then {now}): \
         a pooler in transaction or statement mode ({}) sits in front of PostgreSQL, and \
         qlsched's prepared statements, session settings and LISTEN do not survive it \
         (PgBouncer 1.21+'s max_prepared_statements carries prepared statements only); set \
         pool_mode = session for qlsched's database in pgbouncer.ini (per database: \
         `qlsched = host=… pool_mode=session`), or connect to PostgreSQL directly",
        pooler_named(.pooler)
    )]
    TransactionPooling {
        first: i32,
        now: i32,
        /// The pooler's version, when its admin console told it.
        pooler: Option<String>,
    },
    /// `SELECT pg_backend_pid()` answered without a row.
    #[error("SELECT pg_backend_pid() returned no row")]
    NoBackendPid,
    /// The connection broke while a COMMIT may have been in flight.
    #[error("connection lost around COMMIT: outcome unknown")]
    OutcomeUnknown,
    /// A statement did not answer within its client-side bound. Its connection is discarded:
    /// the statement may still be running (or committing) on the server.
    #[error("{what} did not answer within {after:?}")]
    Timeout { what: &'static str, after: Duration },
    /// Every pooled connection handed out had a backend that was gone.
    #[error("every pooled connection was closed (backends gone); retrying next round")]
    AllConnectionsClosed,
    /// Getting a dedicated connection ready failed before any statement of the caller was
    /// sent: the connect was refused or timed out, or the session's setup or a prepare
    /// failed. Nothing of the caller's can have been written ([`StoreError::reached_server`]).
    #[error("{0} (before any statement was sent)")]
    NotSent(Box<StoreError>),
}

fn pooler_named(version: &Option<String>) -> String {
    match version {
        Some(v) => format!("{v} with pool_mode = transaction"),
        None => "PgBouncer pool_mode = transaction; its version was not readable: SHOW VERSION \
                 on its admin console needs the role in stats_users"
            .to_owned(),
    }
}

/// The connection broke (closed, I/O error, server shutting down).
pub fn connection_lost(e: &tokio_postgres::Error) -> bool {
    if e.is_closed() {
        return true;
    }
    if let Some(c) = e.code() {
        return *c == SqlState::ADMIN_SHUTDOWN
            || *c == SqlState::CRASH_SHUTDOWN
            || *c == SqlState::CANNOT_CONNECT_NOW
            || c.code().starts_with("08");
    }
    // No SQLSTATE: an I/O or protocol error on the socket.
    true
}

/// tokio-postgres prints only "db error" for server errors; say what the server said.
pub fn describe(e: &tokio_postgres::Error) -> String {
    if let Some(db) = e.as_db_error() {
        let mut s = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        if let Some(d) = db.detail() {
            s.push_str(": ");
            s.push_str(d);
        }
        // A named statement missing or duplicated: the connection is shared per transaction.
        if *db.code() == SqlState::INVALID_SQL_STATEMENT_NAME
            || *db.code() == SqlState::DUPLICATE_PSTATEMENT
        {
            s.push_str(" — is a pooler with pool_mode = transaction in front of PostgreSQL? set pool_mode = session");
        }
        return s;
    }
    let mut s = e.to_string();
    if let Some(src) = std::error::Error::source(e) {
        let src = src.to_string();
        if !s.contains(&src) {
            s = format!("{s}: {src}");
        }
        // tokio-postgres's own words when the server answers the TLS request with "no".
        if src == "server does not support TLS" {
            s = format!("{s} — {}", tls::NO_TLS_OFFERED_HINT);
        }
    }
    s
}

impl StoreError {
    /// SQLSTATE of the underlying database error, if any.
    pub fn code(&self) -> Option<&SqlState> {
        match self {
            StoreError::Db(e) => e.code(),
            StoreError::NotSent(e) => e.code(),
            _ => None,
        }
    }

    /// Whether a statement of the caller may have reached the server (and so may have
    /// written, or may still write). `false` only when provably nothing was sent: no
    /// connection could be had (refused, timed out while connecting, pool time-out, every
    /// pooled connection closed) or the connection's setup failed. A time-out or a broken
    /// connection once a statement was on its way counts as reached: its outcome is unknown.
    pub fn reached_server(&self) -> bool {
        !matches!(
            self,
            StoreError::NotSent(_) | StoreError::PoolTimeout(_) | StoreError::AllConnectionsClosed
        )
    }

    /// 40001 serialization_failure or 40P01 deadlock_detected: safe to retry the transaction.
    pub fn is_serialization(&self) -> bool {
        matches!(
            self.code(),
            Some(c) if *c == SqlState::T_R_SERIALIZATION_FAILURE || *c == SqlState::T_R_DEADLOCK_DETECTED
        )
    }

    /// The connection broke (closed, I/O error, server shutting down): the statement's
    /// outcome is unknown if it was a COMMIT.
    pub fn is_connection_lost(&self) -> bool {
        match self {
            StoreError::Db(e) => connection_lost(e),
            StoreError::PoolTimeout(_)
            | StoreError::OutcomeUnknown
            | StoreError::Timeout { .. }
            | StoreError::AllConnectionsClosed => true,
            StoreError::NotSent(e) => e.is_connection_lost(),
            _ => false,
        }
    }

    pub fn is_unique_violation(&self) -> bool {
        matches!(self.code(), Some(c) if *c == SqlState::UNIQUE_VIOLATION)
    }
}

impl From<bb8::RunError<tokio_postgres::Error>> for StoreError {
    fn from(e: bb8::RunError<tokio_postgres::Error>) -> Self {
        match e {
            bb8::RunError::User(e) => StoreError::Db(e),
            bb8::RunError::TimedOut => StoreError::PoolTimeout(Duration::ZERO),
        }
    }
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

/// Connects a single client outside any pool (management commands, migrations).
pub async fn connect(target: impl Into<Target>) -> Result<tokio_postgres::Client, StoreError> {
    let (client, connection) = target.into().connect_raw().await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(client)
}
