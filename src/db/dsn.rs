//! The PostgreSQL connection string and its password: parsed once, never logged.

use std::fmt;
use std::str::FromStr;
use std::sync::OnceLock;

use regex::Regex;

use super::tls::{SslMode, Tls, TlsError, TlsSettings};
use super::{SessionAttrs, Target};

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

/// The DSN keywords qlsched implements itself (libpq's names), taken out before the driver
/// parses the rest: TLS (the driver knows only `sslmode`, and not its verify modes) and
/// `target_session_attrs` (the driver knows three of libpq's six values).
const OWN_KEYWORDS: [&str; 6] = [
    "sslmode",
    "sslrootcert",
    "sslcert",
    "sslkey",
    "sslpassword",
    "target_session_attrs",
];

/// What the own keywords of a DSN said; `None`: not given.
#[derive(Debug, Default)]
struct Own {
    mode: Option<SslMode>,
    tls: TlsSettings,
    attrs: Option<SessionAttrs>,
}

/// Why a DSN was refused.
#[derive(Debug, thiserror::Error)]
pub enum DsnError {
    /// tokio-postgres refused the rest (its messages name options, never their values).
    #[error("not a valid libpq key=value string or postgres:// URL ({})", driver_detail(.0))]
    Driver(tokio_postgres::Error),
    #[error("sslmode {0:?} is not one of disable, prefer, require, verify-ca, verify-full")]
    SslMode(String),
    #[error("target_session_attrs {0:?} is not one of any, read-write, read-only, primary, standby, prefer-standby")]
    SessionAttrs(String),
    #[error("{var}={value:?} is not a valid {what}")]
    Environment {
        var: &'static str,
        value: String,
        what: &'static str,
    },
    #[error(transparent)]
    Tls(#[from] TlsError),
}

fn driver_detail(e: &tokio_postgres::Error) -> String {
    std::error::Error::source(e).map_or(e.to_string(), |s| format!("{e}: {s}"))
}

/// Parses a libpq `key=value` string or a `postgres://` URL, with its TLS keywords, and
/// reads the certificate files they name. Fails if it holds a password, or if a file is
/// unreadable (the message names the keyword and the file).
pub fn parse(dsn: &str) -> Result<Target, String> {
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
    parse_with_env(dsn, |_| None)
}

/// Where libpq looks when neither the DSN nor the environment names a host: the socket
/// directory of Debian's and Ubuntu's PostgreSQL packages when it exists, else `localhost`.
pub const DEFAULT_SOCKET_DIR: &str = "/var/run/postgresql";

/// Parses a DSN as [`parse_with_password`] does, then fills in each keyword the DSN leaves
/// out from libpq's environment variable for it, as libpq does: the DSN wins, the
/// environment fills in. `env` returns a variable's value; the variables are `PGHOST`,
/// `PGHOSTADDR` (both only when the DSN names no host at all), `PGPORT`, `PGUSER`,
/// `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`,
/// `PGCONNECT_TIMEOUT`, `PGAPPNAME` and `PGTARGETSESSIONATTRS`. With no host anywhere, the
/// default socket directory (or `localhost`) is used.
pub fn parse_with_env(dsn: &str, env: impl Fn(&str) -> Option<String>) -> Result<Target, DsnError> {
    let (rest, mut own) = split_own(dsn)?;
    let mut pg = tokio_postgres::Config::from_str(&rest).map_err(DsnError::Driver)?;
    let var = |name: &'static str| env(name).filter(|v| !v.is_empty()).map(|v| (name, v));
    driver_from_env(&mut pg, &var)?;
    own_from_env(&mut own, &var)?;
    default_host(&mut pg);
    let tls = tls_settings(&pg, own.mode, own.tls)?;
    Ok(Target::new(pg, Tls::new(tls)?).with_session_attrs(own.attrs.unwrap_or_default()))
}

/// A libpq environment variable by name, with its value when set and not empty.
type EnvVar<'a> = dyn Fn(&'static str) -> Option<(&'static str, String)> + 'a;

/// An environment variable whose value is not a `what`.
fn bad(var: &'static str, value: &str, what: &'static str) -> DsnError {
    DsnError::Environment {
        var,
        value: value.to_owned(),
        what,
    }
}

/// The driver's keywords the DSN leaves out, from `PGHOST`, `PGHOSTADDR`, `PGPORT`, `PGUSER`,
/// `PGDATABASE`, `PGCONNECT_TIMEOUT` and `PGAPPNAME`.
fn driver_from_env(pg: &mut tokio_postgres::Config, var: &EnvVar<'_>) -> Result<(), DsnError> {
    let no_host = pg.get_hosts().is_empty() && pg.get_hostaddrs().is_empty();
    if no_host {
        if let Some((_, v)) = var("PGHOST") {
            for h in v.split(',') {
                pg.host(h.trim());
            }
        }
        if let Some((n, v)) = var("PGHOSTADDR") {
            for a in v.split(',') {
                pg.hostaddr(
                    a.trim()
                        .parse()
                        .map_err(|_| bad(n, &v, "IP address list"))?,
                );
            }
        }
    }
    if pg.get_ports().is_empty() {
        if let Some((n, v)) = var("PGPORT") {
            for p in v.split(',') {
                pg.port(p.trim().parse().map_err(|_| bad(n, &v, "port list"))?);
            }
        }
    }
    if pg.get_user().is_none() {
        if let Some((_, v)) = var("PGUSER") {
            pg.user(v);
        }
    }
    if pg.get_dbname().is_none() {
        if let Some((_, v)) = var("PGDATABASE") {
            pg.dbname(v);
        }
    }
    if pg.get_connect_timeout().is_none() {
        if let Some((n, v)) = var("PGCONNECT_TIMEOUT") {
            let secs: u64 = v
                .trim()
                .parse()
                .map_err(|_| bad(n, &v, "number of seconds"))?;
            // libpq: zero means wait forever; a time-out below 2 s counts as 2 s.
            if secs > 0 {
                pg.connect_timeout(std::time::Duration::from_secs(secs.max(2)));
            }
        }
    }
    if pg.get_application_name().is_none() {
        if let Some((_, v)) = var("PGAPPNAME") {
            pg.application_name(v);
        }
    }
    Ok(())
}

/// qlsched's own keywords the DSN leaves out, from `PGSSLMODE`, `PGSSLROOTCERT`,
/// `PGSSLCERT`, `PGSSLKEY` and `PGTARGETSESSIONATTRS`.
fn own_from_env(own: &mut Own, var: &EnvVar<'_>) -> Result<(), DsnError> {
    if own.mode.is_none() {
        if let Some((n, v)) = var("PGSSLMODE") {
            own.mode = Some(SslMode::parse(&v).ok_or_else(|| bad(n, &v, "sslmode"))?);
        }
    }
    for (name, slot) in [
        ("PGSSLROOTCERT", &mut own.tls.root_cert),
        ("PGSSLCERT", &mut own.tls.cert),
        ("PGSSLKEY", &mut own.tls.key),
    ] {
        if slot.is_none() {
            *slot = var(name).map(|(_, v)| v.into());
        }
    }
    if own.attrs.is_none() {
        if let Some((n, v)) = var("PGTARGETSESSIONATTRS") {
            own.attrs =
                Some(SessionAttrs::parse(&v).ok_or_else(|| bad(n, &v, "target_session_attrs"))?);
        }
    }
    Ok(())
}

/// With no host anywhere: the default socket directory, or `localhost`.
fn default_host(pg: &mut tokio_postgres::Config) {
    if pg.get_hosts().is_empty() && pg.get_hostaddrs().is_empty() {
        if std::path::Path::new(DEFAULT_SOCKET_DIR).is_dir() {
            pg.host_path(DEFAULT_SOCKET_DIR);
        } else {
            pg.host("localhost");
        }
    }
}

/// The TLS settings of the target: `sslmode` as given (verify-full with the system trust
/// store), and no TLS at all for a target of sockets only.
fn tls_settings(
    pg: &tokio_postgres::Config,
    mode: Option<SslMode>,
    mut tls: TlsSettings,
) -> Result<TlsSettings, DsnError> {
    // libpq 16: the system trust store is for verify-full only, and implies it.
    let system_roots = tls
        .root_cert
        .as_ref()
        .is_some_and(|p| p.as_os_str() == "system");
    tls.mode = match (mode, system_roots) {
        (None, true) => SslMode::VerifyFull,
        (Some(m), true) if m != SslMode::VerifyFull => {
            return Err(TlsError::WeakModeWithSystemRoots(m.as_str()).into())
        }
        (m, _) => m.unwrap_or_default(),
    };
    // A socket never speaks TLS (hosts::one_host), so a target of sockets only reads no
    // certificate file, as libpq does not: sslmode=verify-full works over a socket without
    // a root file.
    #[cfg(unix)]
    let sockets_only = pg
        .get_hosts()
        .iter()
        .all(|h| matches!(h, tokio_postgres::config::Host::Unix(_)))
        && pg.get_hostaddrs().is_empty();
    #[cfg(not(unix))]
    let sockets_only = false;
    Ok(if sockets_only {
        TlsSettings {
            mode: SslMode::Disable,
            ..TlsSettings::default()
        }
    } else {
        tls
    })
}

/// Takes the keywords qlsched implements itself out of a DSN: the rest of the text, and
/// what they said.
fn split_own(dsn: &str) -> Result<(String, Own), DsnError> {
    let mut own = Own::default();
    let mut set = |key: &str, value: String| -> Result<(), DsnError> {
        match key {
            "sslmode" => own.mode = Some(SslMode::parse(&value).ok_or(DsnError::SslMode(value))?),
            "sslrootcert" => own.tls.root_cert = Some(value.into()),
            "sslcert" => own.tls.cert = Some(value.into()),
            "sslkey" => own.tls.key = Some(value.into()),
            "sslpassword" => own.tls.key_password = Some(value),
            _ => {
                own.attrs = Some(SessionAttrs::parse(&value).ok_or(DsnError::SessionAttrs(value))?)
            }
        }
        Ok(())
    };
    let trimmed = dsn.trim_start();
    if trimmed.starts_with("postgres://") || trimmed.starts_with("postgresql://") {
        let Some((base, query)) = trimmed.split_once('?') else {
            return Ok((dsn.to_owned(), own));
        };
        let mut kept = Vec::new();
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            if OWN_KEYWORDS.contains(&k) {
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
        return Ok((rest, own));
    }
    let mut kept = Vec::new();
    for (key, value, text) in kv_pairs(dsn) {
        if OWN_KEYWORDS.contains(&key.as_str()) {
            set(&key, value)?;
        } else {
            kept.push(text);
        }
    }
    Ok((kept.join(" "), own))
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
pub fn redacted(target: &Target) -> String {
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
    if target.session_attrs() != SessionAttrs::Any {
        parts.push(format!(
            "target_session_attrs={}",
            target.session_attrs().as_str()
        ));
    }
    if pg.get_password().is_some() {
        parts.push("password=***".to_owned());
    }
    parts.join(" ")
}

/// The DSN text with anything that looks like a password masked, for error messages about
/// a DSN that may not even parse. The `key=value` pattern also covers a URL's
/// `?password=` query parameter.
pub fn mask_text(dsn: &str) -> String {
    static KV: OnceLock<Regex> = OnceLock::new();
    static URL: OnceLock<Regex> = OnceLock::new();
    let kv = KV.get_or_init(|| {
        Regex::new(r"(?i)(password\s*=\s*)('(?:[^'\\]|\\.)*'?|\S*)").expect("valid regex")
    });
    let url = URL.get_or_init(|| Regex::new(r"(://[^:/@\s]*:)[^@\s]*@").expect("valid regex"));
    let masked = kv.replace_all(dsn, "${1}***");
    url.replace_all(&masked, "${1}***@").into_owned()
}

/// Reads a password file: it must exist, be readable, pass `rule` (libpq's passfile rule
/// for `database.password_file`; its key rule for the console's credentials) on the open
/// file, and hold a non-empty first line. One trailing newline (`\n` or `\r\n`) is trimmed.
pub fn read_password_file(path: &str, rule: super::credfile::Rule) -> Result<Secret, String> {
    let text = super::credfile::read_text(std::path::Path::new(path), rule)
        .map_err(|e| format!("password file {e}"))?;
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
        let split_tls = |dsn: &str| {
            split_own(dsn).map(|(rest, own)| {
                let mut tls = own.tls;
                tls.mode = own.mode.unwrap_or_default();
                (rest, tls)
            })
        };
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

    fn env<'a>(vars: &'a [(&'a str, &'a str)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| v.to_string())
        }
    }

    #[test]
    fn libpq_environment_fills_in_what_the_dsn_leaves_out_and_the_dsn_wins() {
        use tokio_postgres::config::Host;
        let dir = tempfile::tempdir().unwrap();
        let ca_file = dir.path().join("ca.crt");
        let key = rcgen::KeyPair::generate().unwrap();
        let mut p = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        std::fs::write(&ca_file, p.self_signed(&key).unwrap().pem()).unwrap();
        let ca = ca_file.display().to_string();
        let vars = [
            ("PGSSLROOTCERT", ca.as_str()),
            ("PGHOST", "/run/a,db2"),
            ("PGPORT", "5433,5434"),
            ("PGUSER", "envuser"),
            ("PGDATABASE", "envdb"),
            ("PGSSLMODE", "verify-full"),
            ("PGCONNECT_TIMEOUT", "1"),
            ("PGAPPNAME", "envapp"),
            ("PGTARGETSESSIONATTRS", "prefer-standby"),
        ];
        let t = parse_with_env("", env(&vars)).unwrap();
        assert_eq!(
            t.get_hosts(),
            &[Host::Unix("/run/a".into()), Host::Tcp("db2".into())]
        );
        assert_eq!(t.get_ports(), &[5433, 5434]);
        assert_eq!(t.get_user(), Some("envuser"));
        assert_eq!(t.get_dbname(), Some("envdb"));
        assert_eq!(t.tls().settings().mode, SslMode::VerifyFull);
        assert_eq!(
            t.tls().settings().root_cert.as_deref(),
            Some(ca_file.as_path())
        );
        assert_eq!(
            t.get_connect_timeout(),
            Some(&std::time::Duration::from_secs(2)),
            "libpq's minimum of 2 s"
        );
        assert_eq!(t.get_application_name(), Some("envapp"));
        assert_eq!(t.session_attrs(), SessionAttrs::PreferStandby);
        // Whatever the DSN says wins, keyword by keyword.
        let t = parse_with_env(
            "host=db port=6000 user=u dbname=d sslmode=disable connect_timeout=7 \
             application_name=a target_session_attrs=read-write",
            env(&vars),
        )
        .unwrap();
        assert_eq!(t.get_hosts(), &[Host::Tcp("db".into())]);
        assert_eq!(t.get_ports(), &[6000]);
        assert_eq!(t.get_user(), Some("u"));
        assert_eq!(t.get_dbname(), Some("d"));
        assert_eq!(t.tls().settings().mode, SslMode::Disable);
        assert_eq!(t.session_attrs(), SessionAttrs::ReadWrite);
        // A URL is filled in the same way.
        let t = parse_with_env("postgresql:///q?sslmode=require", env(&vars)).unwrap();
        assert_eq!(t.get_dbname(), Some("q"));
        assert_eq!(t.get_user(), Some("envuser"));
        assert_eq!(t.tls().settings().mode, SslMode::Require);
        // Without a variable, sslmode is libpq's default, never something weaker than asked.
        assert_eq!(
            parse_with_env("host=db", env(&[]))
                .unwrap()
                .tls()
                .settings()
                .mode,
            SslMode::Prefer
        );
    }

    #[test]
    fn a_bad_environment_value_is_named_and_no_host_means_the_default_socket_or_localhost() {
        for (var, value) in [
            ("PGSSLMODE", "verify"),
            ("PGPORT", "x"),
            ("PGCONNECT_TIMEOUT", "soon"),
            ("PGTARGETSESSIONATTRS", "master"),
            ("PGHOSTADDR", "db1"),
        ] {
            let e = parse_with_env("", env(&[(var, value)]))
                .unwrap_err()
                .to_string();
            assert!(e.contains(var) && e.contains(value), "{e}");
        }
        let t = parse_with_env("user=u", env(&[])).unwrap();
        let expected = if std::path::Path::new(DEFAULT_SOCKET_DIR).is_dir() {
            tokio_postgres::config::Host::Unix(DEFAULT_SOCKET_DIR.into())
        } else {
            tokio_postgres::config::Host::Tcp("localhost".into())
        };
        assert_eq!(t.get_hosts(), &[expected]);
        let e = parse_with_env("host=db target_session_attrs=master", env(&[]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("prefer-standby"), "{e}");
    }

    #[test]
    fn sslrootcert_system_means_verify_full_and_refuses_weaker_modes() {
        let t = parse_with_env("host=db sslrootcert=system", env(&[])).unwrap();
        assert_eq!(t.tls().settings().mode, SslMode::VerifyFull);
        for weak in ["disable", "prefer", "require", "verify-ca"] {
            let e = parse_with_env(
                &format!("host=db sslrootcert=system sslmode={weak}"),
                env(&[]),
            )
            .unwrap_err()
            .to_string();
            assert!(
                e.contains(&format!("weak sslmode \"{weak}\"")) && e.contains("verify-full"),
                "{e}"
            );
        }
        // The key passphrase is a keyword of ours, and masked in any message.
        assert!(!mask_text("host=db sslpassword=hunter2").contains("hunter2"));
    }

    #[test]
    fn rejects_passwords_in_urls() {
        assert!(parse("postgres://u:hunter2@db/q")
            .unwrap_err()
            .contains("password"));
    }
}
