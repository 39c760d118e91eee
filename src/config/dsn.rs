//! The PostgreSQL connection string and its password: parsed once, never logged.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use regex::Regex;

use crate::store::tls::{SslMode, Tls, TlsError, TlsSettings};
use crate::store::Target;

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

/// The DSN keywords that configure TLS (libpq's names). tokio-postgres knows only
/// `sslmode` (and not its verify modes), so these are taken out before it parses the rest.
const TLS_KEYWORDS: [&str; 4] = ["sslmode", "sslrootcert", "sslcert", "sslkey"];

/// Why a DSN was refused.
#[derive(Debug, thiserror::Error)]
pub enum DsnError {
    /// tokio-postgres refused the rest (its messages name options, never their values).
    #[error("not a valid libpq key=value string or postgres:// URL ({})", driver_detail(.0))]
    Driver(tokio_postgres::Error),
    #[error("sslmode {0:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    SslMode(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
}

fn driver_detail(e: &tokio_postgres::Error) -> String {
    std::error::Error::source(e).map_or(e.to_string(), |s| format!("{e}: {s}"))
}

/// Parses a libpq `key=value` string or a `postgres://` URL, with its TLS keywords, and
/// reads the certificate files they name. Fails if it holds a password, or if a file is
/// unreadable (the message names the keyword and the file).
pub(super) fn parse(dsn: &str) -> Result<Target, String> {
    let target = parse_with_password(dsn).map_err(|e| e.to_string())?;
    if target.get_password().is_some() {
        return Err(
            "must not contain a password; use database.password_file or the \
                    environment variable QLSCHED__DATABASE__PASSWORD"
                .to_owned(),
        );
    }
    Ok(target)
}

/// Like [`parse`], but a password in the DSN is accepted (command-line DSNs).
pub fn parse_with_password(dsn: &str) -> Result<Target, DsnError> {
    let (rest, tls) = split_tls(dsn)?;
    let pg = tokio_postgres::Config::from_str(&rest).map_err(DsnError::Driver)?;
    Ok(Target::new(pg, Tls::new(tls)?))
}

/// Takes the TLS keywords out of a DSN: the rest of the text, and the settings.
fn split_tls(dsn: &str) -> Result<(String, TlsSettings), DsnError> {
    let mut tls = TlsSettings::default();
    let mut set = |key: &str, value: String| -> Result<(), DsnError> {
        match key {
            "sslmode" => tls.mode = SslMode::parse(&value).ok_or(DsnError::SslMode(value))?,
            "sslrootcert" => tls.root_cert = Some(value.into()),
            "sslcert" => tls.cert = Some(value.into()),
            _ => tls.key = Some(value.into()),
        }
        Ok(())
    };
    let trimmed = dsn.trim_start();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let Some((base, query)) = trimmed.split_once('?') else {
            return Ok((dsn.to_owned(), tls));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if TLS_KEYWORDS.contains(&k) {
                set(k, percent_decode(v))?;
            } else {
                kept.push(pair);
            }
        }
        let rest = if kept.is_empty() {
            base.to_owned()
        } else {
            format!("{base}?{}", kept.join("&"))
        };
        return Ok((rest, tls));
    }
    let mut kept = Vec::new();
    for (key, value, text) in kv_pairs(dsn) {
        if TLS_KEYWORDS.contains(&key.as_str()) {
            set(&key, value)?;
        } else {
            kept.push(text);
        }
    }
    Ok((kept.join(" "), tls))
}

/// The `key = value` pairs of a libpq string: (key, unquoted value, original text). Text
/// that is not a pair is kept as it is, for the driver to refuse with its own message.
fn kv_pairs(dsn: &str) -> Vec<(String, String, &str)> {
    let b = dsn.as_bytes();
    let mut out = Vec::new();
    let mut i = 0;
    let skip_ws = |mut i: usize| {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        i
    };
    loop {
        i = skip_ws(i);
        if i >= b.len() {
            return out;
        }
        let start = i;
        while i < b.len() && b[i] != b'=' && !b[i].is_ascii_whitespace() {
            i += 1;
        }
        let key = dsn[start..i].to_owned();
        i = skip_ws(i);
        if i >= b.len() || b[i] != b'=' {
            out.push((String::new(), String::new(), &dsn[start..i]));
            continue;
        }
        i = skip_ws(i + 1);
        let mut value = String::new();
        if i < b.len() && b[i] == b'\'' {
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                if b[i] == b'\\' && i + 1 < b.len() {
                    i += 1;
                }
                let ch = dsn[i..].chars().next().expect("in bounds");
                value.push(ch);
                i += ch.len_utf8();
            }
            i = (i + 1).min(b.len());
        } else {
            let vstart = i;
            while i < b.len() && !b[i].is_ascii_whitespace() {
                i += 1;
            }
            value.push_str(&dsn[vstart..i]);
        }
        out.push((key, value, &dsn[start..i]));
    }
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match (b[i], s.get(i + 1..i + 3)) {
            (b'%', Some(hex)) if u8::from_str_radix(hex, 16).is_ok() => {
                out.push(u8::from_str_radix(hex, 16).expect("checked"));
                i += 3;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A `key=value` rendering of the parsed settings that identify the target, for logs.
/// Built from the parsed config, so nothing secret can survive into it.
pub(super) fn redacted(target: &Target) -> String {
    let pg: &tokio_postgres::Config = target;
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
    let tls = target.tls().settings();
    parts.push(format!("sslmode={}", tls.mode.as_str()));
    if let Some(root) = &tls.root_cert {
        parts.push(format!("sslrootcert={}", root.display()));
    }
    if let Some(cert) = &tls.cert {
        parts.push(format!("sslcert={}", cert.display()));
    }
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
    fn tls_keywords_come_out_of_both_dsn_shapes() {
        let (rest, tls) = split_tls(
            "host=db sslmode=verify-full sslrootcert='/etc/my ca.crt' user=u sslcert=/c sslkey=/k",
        )
        .unwrap();
        assert_eq!(rest, "host=db user=u");
        assert_eq!(tls.mode, SslMode::VerifyFull);
        assert_eq!(tls.root_cert.unwrap().to_str(), Some("/etc/my ca.crt"));
        assert_eq!(tls.cert.unwrap().to_str(), Some("/c"));
        assert_eq!(tls.key.unwrap().to_str(), Some("/k"));
        let (rest, tls) =
            split_tls("postgres://u@db/q?sslmode=verify-ca&application_name=a&sslrootcert=%2Fca")
                .unwrap();
        assert_eq!(rest, "postgres://u@db/q?application_name=a");
        assert_eq!(tls.mode, SslMode::VerifyCa);
        assert_eq!(tls.root_cert.unwrap().to_str(), Some("/ca"));
        assert!(split_tls("host=db sslmode=allow")
            .unwrap_err()
            .to_string()
            .contains("verify-full"));
        assert_eq!(split_tls("host=db").unwrap().1.mode, SslMode::Prefer);
    }

    #[test]
    fn rejects_passwords_in_urls() {
        assert!(parse("postgres://u:hunter2@db/q")
            .unwrap_err()
            .contains("password"));
    }
}
