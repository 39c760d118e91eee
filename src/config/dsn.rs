//! The PostgreSQL connection string and its password: parsed once, never logged.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use regex::Regex;

/// A secret string. `Debug` prints `Secret(***)`; there is no `Display`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret itself, for handing to the database driver. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Parses a libpq `key=value` string or a `postgres://` URL. Fails if it holds a password.
pub(super) fn parse(dsn: &str) -> Result<tokio_postgres::Config, String> {
    let pg = tokio_postgres::Config::from_str(dsn).map_err(|e| {
        // The driver's messages name options, never their values.
        let detail = std::error::Error::source(&e).map_or(e.to_string(), |s| format!("{e}: {s}"));
        format!("not a valid libpq key=value string or postgres:// URL ({detail})")
    })?;
    if pg.get_password().is_some() {
        return Err(
            "must not contain a password; use database.password_file or the \
                    environment variable QLSCHED__DATABASE__PASSWORD"
                .to_owned(),
        );
    }
    Ok(pg)
}

/// A `key=value` rendering of the parsed settings that identify the target, for logs.
/// Built from the parsed config, so nothing secret can survive into it.
pub(super) fn redacted(pg: &tokio_postgres::Config) -> String {
    use tokio_postgres::config::Host;
    let mut parts = Vec::new();
    let hosts: Vec<String> = pg
        .get_hosts()
        .iter()
        .map(|h| match h {
            Host::Tcp(name) => name.clone(),
            #[cfg(unix)]
            Host::Unix(path) => path.display().to_string(),
        })
        .collect();
    if !hosts.is_empty() {
        parts.push(format!("host={}", hosts.join(",")));
    }
    if !pg.get_ports().is_empty() {
        let ports: Vec<String> = pg.get_ports().iter().map(u16::to_string).collect();
        parts.push(format!("port={}", ports.join(",")));
    }
    if let Some(user) = pg.get_user() {
        parts.push(format!("user={user}"));
    }
    if let Some(db) = pg.get_dbname() {
        parts.push(format!("dbname={db}"));
    }
    if let Some(app) = pg.get_application_name() {
        parts.push(format!("application_name={app}"));
    }
    parts.push(format!("sslmode={:?}", pg.get_ssl_mode()).to_ascii_lowercase());
    if pg.get_password().is_some() {
        parts.push("password=***".to_owned());
    }
    parts.join(" ")
}

/// The DSN text with anything that looks like a password masked, for error messages about
/// a DSN that may not even parse. The `key=value` pattern also covers a URL's
/// `?password=` query parameter.
pub(super) fn mask_text(dsn: &str) -> String {
    static KV: OnceLock<Regex> = OnceLock::new();
    static URL: OnceLock<Regex> = OnceLock::new();
    let kv = KV.get_or_init(|| {
        Regex::new(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)").expect("valid regex")
    });
    let url = URL.get_or_init(|| Regex::new(r"(://[^:/@\s]*:)[^@\s]*@").expect("valid regex"));
    let masked = kv.replace_all(dsn, "${1}***");
    url.replace_all(&masked, "${1}***@").into_owned()
}

/// Reads a password file: it must exist, be readable and hold a non-empty first line.
/// One trailing newline (`\n` or `\r\n`) is trimmed.
pub(super) fn read_password_file(path: &str) -> Result<Secret, String> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| format!("password file must exist and be readable ({e})"))?;
    let text = text
        .strip_suffix('\n')
        .map(|t| t.strip_suffix('\r').unwrap_or(t))
        .unwrap_or(&text);
    if text.is_empty() {
        return Err("password file is empty".to_owned());
    }
    Ok(Secret::new(text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_passwords_in_both_dsn_shapes() {
        let kv = mask_text("host=db password=hunter2 user=u");
        assert_eq!(kv, "host=db password=*** user=u");
        let quoted = mask_text("host=db password='hun ter2' user=u");
        assert_eq!(quoted, "host=db password=*** user=u");
        let url = mask_text("postgres://u:hunter2@db:5432/q");
        assert_eq!(url, "postgres://u:***@db:5432/q");
        let query = mask_text("postgres://u@db/q?password=hunter2&x=1");
        assert!(!query.contains("hunter2"), "{query}");
    }

    #[test]
    fn redacted_form_never_holds_the_password() {
        let mut pg = parse("host=db port=5433 user=u dbname=q").unwrap();
        pg.password("hunter2");
        let shown = redacted(&pg);
        assert!(!shown.contains("hunter2"));
        assert!(
            shown.contains("host=db port=5433 user=u dbname=q"),
            "{shown}"
        );
    }

    #[test]
    fn rejects_passwords_in_urls() {
        assert!(parse("postgres://u:hunter2@db/q")
            .unwrap_err()
            .contains("password"));
    }
}
