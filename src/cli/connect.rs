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
use crate::config::credfile::{self, CredFileError, Rule};
use crate::config::Config;
use crate::store;

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
pub fn resolve(t: &Target) -> Result<store::Target, CliError> {
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
pub fn with_password(dsn: &str, password_file: Option<&Path>) -> Result<store::Target, CliError> {
    let mut pg = crate::config::parse_dsn_with_env(dsn, |k| std::env::var(k).ok())
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
    if let Some(pw) = passfile_password(&pg) {
        pg.password(pw);
    }
    Ok(pg)
}

fn passfile_path() -> Option<PathBuf> {
    match std::env::var_os("PGPASSFILE") {
        Some(p) => Some(PathBuf::from(p)),
        None => std::env::var_os("HOME").map(|h| Path::new(&h).join(".pgpass")),
    }
}

fn passfile_password(pg: &tokio_postgres::Config) -> Option<String> {
    let path = passfile_path()?;
    // As libpq: a passfile others can read is ignored with a warning (judged on the open
    // file); a missing one silently.
    let text = match credfile::read_text(&path, Rule::Password) {
        Ok(text) => text,
        Err(CredFileError::PasswordMode { mode }) => {
            eprintln!(
                "qlsched: warning: password file {} has group or world access ({mode:04o}); \
                 permissions should be u=rw (0600) or less; ignoring it",
                path.display()
            );
            return None;
        }
        Err(_) => return None,
    };
    let host = match pg.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        // libpq matches a socket directory as `localhost`
        Some(Host::Unix(_)) | None => "localhost".to_string(),
    };
    let port = pg.get_ports().first().copied().unwrap_or(5432).to_string();
    let user = pg.get_user().unwrap_or("").to_string();
    let db = pg.get_dbname().unwrap_or(&user).to_string();
    passfile_lookup(&text, &[&host, &port, &db, &user])
}

/// The password of the first passfile line matching `host, port, database, user`.
pub fn passfile_lookup(text: &str, want: &[&str; 4]) -> Option<String> {
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        let fields = split_passfile_line(line);
        if fields.len() != 5 {
            continue;
        }
        if fields[..4]
            .iter()
            .zip(want.iter())
            .all(|(f, w)| f == "*" || f == w)
        {
            return Some(fields[4].clone());
        }
    }
    None
}

fn split_passfile_line(line: &str) -> Vec<String> {
    let mut out = vec![String::new()];
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                if let Some(n) = chars.next() {
                    out.last_mut().expect("non-empty").push(n);
                }
            }
            ':' if out.len() < 5 => out.push(String::new()),
            c => out.last_mut().expect("non-empty").push(c),
        }
    }
    out
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
pub async fn connect(pg: &store::Target) -> Result<tokio_postgres::Client, CliError> {
    store::connect(pg)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passfile_lines_match_with_wildcards_and_escapes() {
        let text = "# comment\n\
                    otherhost:5432:*:u:nope\n\
                    127.0.0.1:*:qlsched:qlsched_admin:pa\\:ss\\\\word\n\
                    *:*:*:*:fallback\n";
        assert_eq!(
            passfile_lookup(text, &["127.0.0.1", "5432", "qlsched", "qlsched_admin"]),
            Some("pa:ss\\word".into())
        );
        assert_eq!(
            passfile_lookup(text, &["db", "5432", "x", "y"]),
            Some("fallback".into())
        );
        assert_eq!(passfile_lookup("a:b:c:d\n", &["a", "b", "c", "d"]), None);
    }
}
