//! The error of database work: reaching the server, running a statement, changing the
//! schema. Classified by SQLSTATE and by variant, never by text.

use std::time::Duration;

use tokio_postgres::error::SqlState;

use super::{locks, tls};

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
    /// The database's applied migrations differ from the binary's (`schema::Drift`).
    #[error("refusing to migrate: {0}")]
    MigrationDrift(Box<dyn std::error::Error + Send + Sync>),
    /// `db migrate` waited for its locks for all of `--max-wait` (docs/design.md, "Schema
    /// changes and rolling upgrades").
    /// (`schema::GaveUp`)
    #[error("{0}")]
    MigrationGaveUp(Box<dyn std::error::Error + Send + Sync>),
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
