//! Configuration: validated in full before PostgreSQL is opened.
//!
//! Layers, later wins:
//! 1. `config/default.toml`, embedded in the binary;
//! 2. the replica's file (`--config FILE`), which must set `replica.id`;
//! 3. environment overrides `QLSCHED__SECTION__KEY=value` (the value is read as TOML if it
//!    parses as a TOML value the key accepts, else as a string). `QLSCHED__DATABASE__PASSWORD`
//!    is the only way to give the password directly; files may name a `password_file`.
//!
//! The layers are merged as TOML tables, key by key, remembering which layer wrote each key;
//! then every bound is checked and all problems are reported together, each naming the file
//! (or environment variable), the key, the value and the bound. Passwords never reach a
//! problem message, a log line or `Debug`.

mod check;

mod duration;
mod error;
mod layers;
mod raw;
pub mod reference;
pub mod tls;
mod validate;
pub mod worker;

use std::fmt;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::db::dsn::Secret;
pub use error::{ConfigError, ConfigProblem};
pub use layers::ENV_PREFIX;

/// Parses a duration as the config files write it ("250ms", "30s", "2m", "1h", "30d").
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    duration::parse(text)
}

/// Formats a duration as the config files write it.
pub fn format_duration(d: Duration) -> String {
    duration::format(d)
}

/// The built-in defaults (`config/default.toml`), the first layer.
pub const DEFAULT_TOML: &str = include_str!("../../config/default.toml");

/// A replica's validated configuration.
#[derive(Debug, Clone)]
pub struct Config {
    /// The replica file it was loaded from, as given.
    pub source: PathBuf,
    pub replica_id: ReplicaId,
    pub database: DatabaseConfig,
    pub scheduler: SchedulerConfig,
    pub http: HttpConfig,
    pub metrics: MetricsConfig,
    pub log: LogConfig,
    pub retention: RetentionConfig,
}

/// Retention of finished runs (docs/design.md, "Retention").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetentionConfig {
    /// How long finished runs are kept (by admission time); `None`: forever (`"0"`).
    /// Otherwise 1m..=3650d.
    pub finished_after: Option<Duration>,
    /// Runs per prune transaction, 1..=10000.
    pub batch: u32,
    /// How often this replica tries to take the prune turn, 1s..=1d.
    pub interval: Duration,
    /// Age of a queued run that counts as old (gauge, status, alert), 1m..=30d.
    pub queued_alert_after: Duration,
    /// How long audit rows are kept (docs/audit.md); `None`: forever (`"0"`). Otherwise
    /// 7d..=3650d (`qlsched.prune_audit` refuses less).
    pub audit_after: Option<Duration>,
}

/// This replica's name: `^[a-z0-9][a-z0-9-]{0,62}$`. Used as the lease owner.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReplicaId(String);

impl ReplicaId {
    /// `None` unless `id` matches `^[a-z0-9][a-z0-9-]{0,62}$`.
    pub fn parse(id: &str) -> Option<ReplicaId> {
        validate::is_replica_id(id).then(|| ReplicaId(id.to_owned()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ReplicaId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How to reach PostgreSQL. `Debug` never shows the password.
#[derive(Clone)]
pub struct DatabaseConfig {
    /// Parsed DSN with `connect_timeout`, `application_name` and the password (if any)
    /// applied.
    /// TLS settings come from the DSN's `sslmode`, `sslrootcert`, `sslcert`, `sslkey`.
    pub pg: crate::db::Target,
    /// 2..=64 connections: at least the claim connection and the admit connection.
    pub pool_size: u32,
    /// The bound on one connection attempt over all the DSN's hosts: each host's
    /// `connect_timeout` (the DSN's, else `database.connect_timeout`) times the hosts tried.
    pub connect_timeout: Duration,
    /// The connection target without secrets, for logs.
    pub dsn_redacted: String,
    password: Option<Secret>,
}

impl DatabaseConfig {
    /// The password from `password_file` or `QLSCHED__DATABASE__PASSWORD`, if one was given
    /// (already applied to `pg`).
    pub fn password(&self) -> Option<&Secret> {
        self.password.as_ref()
    }
}

impl fmt::Debug for DatabaseConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DatabaseConfig")
            .field("dsn_redacted", &self.dsn_redacted)
            .field("pool_size", &self.pool_size)
            .field("connect_timeout", &self.connect_timeout)
            .field("password", &self.password.as_ref().map(|_| "***"))
            .finish_non_exhaustive()
    }
}

/// Claiming and admitting (docs/design.md, "What each setting bounds").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most rows leased per round, 1..=256.
    pub claim_budget: u32,
    /// Lease length, 5s..=300s, at least 3 x `cadence`.
    pub lease: Duration,
    /// Idle interval between rounds, 100ms..=60s.
    pub cadence: Duration,
    /// How long stop waits for claim actors before abandoning them, 0s..=60s.
    pub drain: Duration,
    /// Bound on one admission transaction, 100ms..=60s, less than `lease`.
    pub admit_timeout: Duration,
    /// Retries of an admission after 40001/40P01, 0..=20.
    pub max_serialization_retries: u32,
    /// How long a row whose decision was rejected is left alone, 1s..=3600s.
    pub reject_backoff: Duration,
    /// Listen for change notifications (publish, enable) on a dedicated connection.
    pub listen: bool,
}

/// Health, readiness and metrics endpoint, and the web console.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpConfig {
    /// `None`: HTTP is off.
    pub bind: Option<SocketAddr>,
    /// The read-only web console (docs/console.md); `None`: off.
    pub console: Option<ConsoleConfig>,
    /// HTTPS on the port (`[http] tls_cert_file` and `tls_key_file`); `None`: plain HTTP.
    pub tls: Option<TlsFiles>,
    /// Host names (lower case, without port or brackets) the console and `/api/` answer
    /// to besides the loopback names; any other `Host` gets 421.
    pub public_names: Vec<String>,
}

/// The HTTP port's certificate chain and private key (PEM), re-read when they change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The web console's settings (`[http] console*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleConfig {
    /// Required of every request when set; always set unless HTTP is bound to loopback.
    pub auth: Option<ConsoleAuth>,
    /// Connections of the console's own pool, 1..=8 (never the scheduler's).
    pub pool_size: u32,
    /// `statement_timeout` of the console's read-only transactions, 100ms..=30s.
    pub statement_timeout: Duration,
    /// Failed logins per client address per minute before it gets 429, 1..=1000.
    pub login_failures_per_minute: u32,
}

/// Credentials from `[http] console_auth_file`, one per line, each with its role.
/// `Debug` never shows them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleAuth {
    pub credentials: Vec<ConsoleCredential>,
}

/// One credential of the console and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsoleCredential {
    pub role: ConsoleRole,
    pub secret: CredentialSecret,
    /// Who the audit log names for this credential's actions: the basic user, or
    /// `token@LINE` for a bearer token (its line in the file).
    pub user: String,
}

/// What a console credential may do (docs/console.md, "Roles").
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ConsoleRole {
    /// Reads every page; sees no action and may take none.
    Viewer,
    /// Reads every page and takes the operator actions.
    Operator,
}

/// How a credential is sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CredentialSecret {
    /// A token without `:`: `Authorization: Bearer TOKEN`.
    Bearer(Secret),
    /// `USER:PASSWORD`: `Authorization: Basic …` (a browser asks for them).
    Basic { user: String, password: Secret },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricsConfig {
    /// How often the due-backlog gauge is recomputed, 1s..=300s.
    pub backlog_interval: Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    Json,
    Text,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogConfig {
    pub format: LogFormat,
    /// One of `trace`, `debug`, `info`, `warning`, `error`, `critical` (slog level names).
    pub level: String,
}

impl Config {
    /// Loads `path` over the built-in defaults, with overrides from the process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        Self::load_with_env(path, layers::process_env())
    }

    /// Loads `path` over the built-in defaults, with overrides taken from `env` (only
    /// `QLSCHED__…` variables are looked at). Opens no network connection.
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<Config, ConfigError> {
        let layers::Loaded {
            label,
            merged,
            raw,
            mut problems,
        } = layers::load(
            path,
            &[(layers::DEFAULTS_LABEL, DEFAULT_TOML)],
            |_, _, _| {},
            env,
        )?;
        match validate::validate(raw, &merged, &label, path) {
            Ok(config) if problems.is_empty() => Ok(config),
            Ok(_) => Err(ConfigError::Problems(problems)),
            Err(more) => {
                problems.extend(more);
                Err(ConfigError::Problems(problems))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn built_in_defaults_parse_and_leave_only_replica_id_missing() {
        let dir = std::env::temp_dir().join(format!("qlsched-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("empty.toml");
        std::fs::write(&path, "").unwrap();
        let err = Config::load_with_env(&path, []).unwrap_err();
        let problems = err.problems();
        assert_eq!(problems.len(), 1, "{err}");
        assert_eq!(problems[0].key, "replica.id");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn replica_id_parse_applies_the_pattern() {
        assert_eq!(ReplicaId::parse("a-1").unwrap().as_str(), "a-1");
        assert!(ReplicaId::parse("-a").is_none());
        assert!(ReplicaId::parse("A").is_none());
        assert!(ReplicaId::parse(&"a".repeat(64)).is_none());
        assert!(ReplicaId::parse(&"a".repeat(63)).is_some());
    }
}
