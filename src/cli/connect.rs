//! Where a command connects and with which password, the ways PostgreSQL users expect:
//!
//! - target: `--config FILE` (a replica config: its DSN and password), else `--dsn DSN`,
//!   else the `QLSCHED_DSN` environment variable;
//! - password, when the DSN has none: `--password-file FILE` (first line), else
//!   `PGPASSWORD`, else the passfile `PGPASSFILE` or `~/.pgpass`
//!   (`host:port:database:user:password`, `*` wildcards, `\:` and `\\` escapes; ignored, as
//!   libpq does, when group or others can read it). `--password-file` follows the same rule
//!   and is refused, naming the file and its mode; both are judged on the open file.
//!
//! A password inside the DSN still works but warns (it shows in `ps` and shell history).
//! A password is never printed: tokio-postgres hides it in `Debug`, and errors name only
//! host and port.

use std::path::{Path, PathBuf};

use clap::Args;
use tokio_postgres::config::Host;

use super::error::CliError;
use crate::config::Config;
use crate::db::credfile::{self, Rule};
use crate::db::{self, passfile};

/// Where to connect: a replica config (its DSN and password) or a DSN.
#[derive(Args, Debug, Clone, Default)]
pub struct Target {
    /// A replica config file: connect with its DSN and password.
    #[arg(long, conflicts_with = "dsn")]
    pub config: Option<PathBuf>,
    /// libpq DSN or URL (default: $QLSCHED_DSN). Keep the password out of it.
    #[arg(long)]
    pub dsn: Option<String>,
    /// A file whose first line is the password (default: $PGPASSWORD, then the passfile).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
}

/// Resolves the target into a connection config with its password applied.
pub fn resolve(t: &Target) -> Result<db::Target, CliError> {
    if let Some(path) = &t.config {
        return Ok(Config::load(path)?.database.pg);
    }
    let dsn = match (&t.dsn, std::env::var("QLSCHED_DSN")) {
        (Some(d), _) => d.clone(),
        (None, Ok(d)) => d,
        // libpq's environment alone is a target too (`PGHOST=/var/run/postgresql ...`).
        (None, Err(_))
            if LIBPQ_TARGET_VARS
                .iter()
                .any(|v| std::env::var_os(v).is_some()) =>
        {
            String::new()
        }
        (None, Err(_)) => return Err(CliError::NoTarget),
    };
    with_password(&dsn, t.password_file.as_deref())
}

/// Variables that name a target on their own when no DSN is given.
const LIBPQ_TARGET_VARS: [&str; 3] = ["PGHOST", "PGHOSTADDR", "PGDATABASE"];

/// Parses a DSN (with its TLS keywords `sslmode`, `sslrootcert`, `sslcert`, `sslkey`, the
/// way a replica's `database.dsn` is) and fills in the password from the file, the
/// environment or the passfile.
pub fn with_password(dsn: &str, password_file: Option<&Path>) -> Result<db::Target, CliError> {
    let mut pg = db::dsn::parse_with_env(dsn, |k| std::env::var(k).ok())
        .map_err(|source| CliError::Dsn { source })?;
    if pg.get_password().is_some() {
        eprintln!(
            "qlsched: warning: the DSN carries a password, visible in the process list and shell \
             history; use --password-file, PGPASSWORD or a passfile (~/.pgpass) instead"
        );
        return Ok(pg);
    }
    if let Some(path) = password_file {
        // Opened, then judged on the open file by libpq's passfile rule.
        let text =
            credfile::read_text(path, Rule::Password).map_err(|source| CliError::PasswordFile {
                path: path.to_path_buf(),
                source,
            })?;
        let line = text.lines().next().unwrap_or("");
        if line.is_empty() {
            return Err(CliError::EmptyPasswordFile {
                path: path.to_path_buf(),
            });
        }
        pg.password(line);
        return Ok(pg);
    }
    if let Ok(pw) = std::env::var("PGPASSWORD") {
        if !pw.is_empty() {
            pg.password(pw);
            return Ok(pg);
        }
    }
    match passfile::password(&pg) {
        passfile::Lookup::Found(pw) => {
            pg.password(pw);
        }
        passfile::Lookup::Ignored { path, mode } => eprintln!(
            "qlsched: warning: password file {} has group or world access ({mode:04o}); \
             permissions should be u=rw (0600) or less; ignoring it",
            path.display()
        ),
        passfile::Lookup::Missing => {}
    }
    Ok(pg)
}

/// `host:port` of a connection config, for messages (never the password).
pub fn host_of(pg: &tokio_postgres::Config) -> String {
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => "localhost".to_string(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}")
}

/// Connects; a connection that cannot be made is `Unreachable` with the host named.
pub async fn connect(pg: &db::Target) -> Result<tokio_postgres::Client, CliError> {
    db::connect(pg)
        .await
        .map_err(|source| CliError::Unreachable {
            host: host_of(pg),
            source,
        })
}

/// Resolves the target and connects.
pub async fn connect_target(t: &Target) -> Result<tokio_postgres::Client, CliError> {
    connect(&resolve(t)?).await
}
