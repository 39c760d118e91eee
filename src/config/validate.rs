//! Turns the merged raw settings into typed settings, checking every bound and collecting
//! every problem (not just the first).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use regex::Regex;

use super::check::Checker;
use super::error::ConfigProblem;
use super::layers::Merged;
use super::raw::{RawConfig, RawDatabase, RawHttp, RawLog, RawRetention, RawScheduler};
use super::{
    Config, ConsoleAuth, ConsoleConfig, ConsoleCredential, ConsoleRole, CredentialSecret,
    DatabaseConfig, HttpConfig, LogConfig, LogFormat, MetricsConfig, ReplicaId, RetentionConfig,
    SchedulerConfig, TlsFiles,
};
use crate::db::credfile::Rule;
use crate::db::dsn::{self, Secret};

pub(super) const REPLICA_ID_PATTERN: &str = "^[a-z0-9][a-z0-9-]{0,62}$";
pub(super) const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warning", "error", "critical"];

/// Checks everything; returns the typed config only if there was no problem at all.
pub(super) fn validate(
    raw: RawConfig,
    merged: &Merged,
    replica_label: &str,
    source: &Path,
) -> Result<Config, Vec<ConfigProblem>> {
    let mut c = Checker::new(merged, replica_label);
    let replica_id = replica_id(&mut c, raw.replica.id);
    let database = database(&mut c, raw.database);
    let scheduler = scheduler(&mut c, raw.scheduler);
    let http = http(&mut c, raw.http);
    let backlog_interval = c.duration(
        "metrics.backlog_interval",
        raw.metrics.backlog_interval,
        Duration::from_secs(1),
        Duration::from_secs(300),
    );
    let log = log(&mut c, raw.log);
    let retention = retention(&mut c, raw.retention);

    match (
        replica_id,
        database,
        scheduler,
        http,
        backlog_interval,
        log,
        retention,
    ) {
        (
            Some(replica_id),
            Some(database),
            Some(scheduler),
            (Some((bind, console)), Some(tls), Some(public_names)),
            Some(bi),
            Some(log),
            Some(retention),
        ) if c.problems.is_empty() => Ok(Config {
            source: source.to_path_buf(),
            replica_id,
            database,
            scheduler,
            http: HttpConfig {
                bind,
                console,
                tls,
                public_names,
            },
            metrics: MetricsConfig {
                backlog_interval: bi.0,
            },
            log,
            retention,
        }),
        _ => Err(c.problems),
    }
}

/// The `[log]` table: `format` (`json` or `text`) and `level` (an slog level name).
pub(super) fn log(c: &mut Checker<'_>, raw: RawLog) -> Option<LogConfig> {
    let format = c.one_of("log.format", raw.format, &["json", "text"]);
    let level = c.one_of("log.level", raw.level, &LOG_LEVELS);
    Some(LogConfig {
        format: if format? == "json" {
            LogFormat::Json
        } else {
            LogFormat::Text
        },
        level: level?,
    })
}

/// The `[http]` table: bind, console, TLS files, public names, and the refusal of a console
/// served in plain text on a non-loopback address.
fn http(c: &mut Checker<'_>, mut raw_http: RawHttp) -> CheckedHttp {
    let bind = http_bind(c, raw_http.bind.clone());
    let tls = http_tls(
        c,
        raw_http.tls_cert_file.take(),
        raw_http.tls_key_file.take(),
    );
    let public_names = public_names(c, raw_http.public_names.take());
    let allow_plain = raw_http.allow_plain_http.unwrap_or(false);
    let console = console(c, bind.flatten(), raw_http);
    if let (Some(Some(addr)), Some(Some(_)), Some(None)) = (bind, &console, &tls) {
        if !addr.ip().is_loopback() && !allow_plain {
            c.problem_blaming(
                "http.bind",
                "http.allow_plain_http",
                "false",
                format!(
                    "the console on http.bind {addr} (not a loopback address) would send its \
                     credentials and pages in plain text: set http.tls_cert_file and \
                     http.tls_key_file (HTTPS on the port), or allow_plain_http = true where a \
                     TLS proxy on the same host terminates it, or console = \"off\""
                ),
            );
        }
    }
    (bind.zip(console), tls, public_names)
}

/// What [`http`] checked: `(bind, console)`, the TLS files and the public names, each `None`
/// when it had a problem.
type CheckedHttp = (
    Option<(Option<SocketAddr>, Option<ConsoleConfig>)>,
    Option<Option<TlsFiles>>,
    Option<Vec<String>>,
);

fn replica_id(c: &mut Checker<'_>, id: Option<String>) -> Option<ReplicaId> {
    let Some(id) = id else {
        c.problem(
            "replica.id",
            "(missing)",
            "is required in the replica file ([replica] id = \"a\")",
        );
        return None;
    };
    match ReplicaId::parse(&id) {
        Some(id) => Some(id),
        None => {
            let bound = format!(
                "must match {REPLICA_ID_PATTERN} (lowercase letters, digits and '-', \
                 1..=63 characters, not starting with '-')"
            );
            c.problem("replica.id", id, bound);
            None
        }
    }
}

/// Whether `id` is an acceptable replica id.
pub(super) fn is_replica_id(id: &str) -> bool {
    static RE: OnceLock<Regex> = OnceLock::new();
    RE.get_or_init(|| Regex::new(REPLICA_ID_PATTERN).expect("valid regex"))
        .is_match(id)
}

pub(super) fn database(c: &mut Checker<'_>, raw: RawDatabase) -> Option<DatabaseConfig> {
    let pg = c.required("database.dsn", raw.dsn).and_then(|text| {
        dsn::parse(&text)
            .map_err(|msg| c.problem("database.dsn", dsn::mask_text(&text), msg))
            .ok()
    });
    let password = password(c, raw.password, raw.password_file);
    let pool_size = c.int(
        "database.pool_size",
        raw.pool_size,
        (2, 64),
        " (the pool must hold the claim connection and the admit connection)",
    );
    let connect_timeout = c.duration(
        "database.connect_timeout",
        raw.connect_timeout,
        Duration::from_secs(1),
        Duration::from_secs(60),
    );
    let (mut pg, password, pool_size, (connect_timeout, _)) =
        (pg?, password?, pool_size?, connect_timeout?);
    // The DSN's own connect_timeout, when it has one, bounds each host; the key does
    // otherwise. One connection attempt tries every host (docs/design.md, "Connecting").
    if pg.get_connect_timeout().is_none() {
        pg.connect_timeout(connect_timeout);
    }
    let connect_timeout = pg.attempt_bound();
    if let Some(app) = raw.application_name.filter(|a| !a.is_empty()) {
        pg.application_name(app);
    }
    if let Some(secret) = &password {
        pg.password(secret.expose());
    }
    Some(DatabaseConfig {
        dsn_redacted: dsn::redacted(&pg),
        pg,
        pool_size,
        connect_timeout,
        password,
    })
}

/// `Some(None)`: no password; `None`: a problem was recorded.
fn password(
    c: &mut Checker<'_>,
    from_env: Option<String>,
    file: Option<String>,
) -> Option<Option<Secret>> {
    let file = file.filter(|f| !f.is_empty());
    match (from_env, file) {
        (Some(_), Some(path)) => {
            c.problem(
                "database.password_file",
                path,
                "give the password either in database.password_file or in \
                 QLSCHED__DATABASE__PASSWORD, not both",
            );
            None
        }
        (Some(p), None) if p.is_empty() => {
            c.problem("database.password", "***", "must not be empty");
            None
        }
        (Some(p), None) => Some(Some(Secret::new(p))),
        (None, Some(path)) => match dsn::read_password_file(&path, Rule::Password) {
            Ok(secret) => Some(Some(secret)),
            Err(msg) => {
                c.problem("database.password_file", path, msg);
                None
            }
        },
        (None, None) => Some(None),
    }
}

fn scheduler(c: &mut Checker<'_>, raw: RawScheduler) -> Option<SchedulerConfig> {
    let ms = Duration::from_millis;
    let s = Duration::from_secs;
    let claim_budget = c.int("scheduler.claim_budget", raw.claim_budget, (1, 256), "");
    let lease = c.duration("scheduler.lease", raw.lease, s(5), s(300));
    let cadence = c.duration("scheduler.cadence", raw.cadence, ms(100), s(60));
    let drain = c.duration("scheduler.drain", raw.drain, s(0), s(60));
    let admit_timeout = c.duration("scheduler.admit_timeout", raw.admit_timeout, ms(100), s(60));
    let retries = c.int(
        "scheduler.max_serialization_retries",
        raw.max_serialization_retries,
        (0, 20),
        "",
    );
    let reject_backoff = c.duration(
        "scheduler.reject_backoff",
        raw.reject_backoff,
        s(1),
        s(3600),
    );

    if let (Some((lease, text)), Some((cadence, _))) = (&lease, &cadence) {
        let min = *cadence * 3;
        if *lease < min {
            let bound = format!(
                "must be at least 3 x scheduler.cadence ({})",
                super::duration::format(min)
            );
            c.problem("scheduler.lease", text.clone(), bound);
        }
    }
    if let (Some((admit, text)), Some((lease, _))) = (&admit_timeout, &lease) {
        if admit >= lease {
            let bound = format!(
                "must be less than scheduler.lease ({})",
                super::duration::format(*lease)
            );
            c.problem("scheduler.admit_timeout", text.clone(), bound);
        }
    }
    Some(SchedulerConfig {
        claim_budget: claim_budget?,
        lease: lease?.0,
        cadence: cadence?.0,
        drain: drain?.0,
        admit_timeout: admit_timeout?.0,
        max_serialization_retries: retries?,
        reject_backoff: reject_backoff?.0,
        listen: raw.listen.unwrap_or(true),
    })
}

fn retention(c: &mut Checker<'_>, raw: RawRetention) -> Option<RetentionConfig> {
    let s = Duration::from_secs;
    const DAY: u64 = 86_400;
    // "0" (any unit, or none) keeps finished runs forever.
    let finished_after = forever_or(c, "retention.finished_after", raw.finished_after, s(60));
    let audit_after = forever_or(c, "retention.audit_after", raw.audit_after, s(7 * DAY));
    let batch = c.int(
        "retention.batch",
        raw.batch,
        (1, 10_000),
        " (runs deleted in one prune transaction)",
    );
    let interval = c.duration("retention.interval", raw.interval, s(1), s(DAY));
    let queued_alert_after = c.duration(
        "retention.queued_alert_after",
        raw.queued_alert_after,
        s(60),
        s(30 * DAY),
    );
    Some(RetentionConfig {
        finished_after: finished_after?,
        batch: batch?,
        interval: interval?.0,
        queued_alert_after: queued_alert_after?.0,
        audit_after: audit_after?,
    })
}

/// A retention duration: "0" (any unit, or none) keeps forever (`Some(None)`); otherwise
/// `min..=3650d`. `None`: a problem was recorded.
fn forever_or(
    c: &mut Checker<'_>,
    key: &'static str,
    raw: Option<String>,
    min: Duration,
) -> Option<Option<Duration>> {
    match raw {
        Some(text) if text.trim_start_matches('0').is_empty() && !text.is_empty() => Some(None),
        Some(text) if super::duration::parse(&text) == Ok(Duration::ZERO) => Some(None),
        other => c
            .duration(key, other, min, Duration::from_secs(3650 * 86_400))
            .map(|(d, _)| Some(d)),
    }
}

/// `Some(None)`: HTTP off; `None`: a problem was recorded.
pub(super) fn http_bind(c: &mut Checker<'_>, bind: Option<String>) -> Option<Option<SocketAddr>> {
    match bind.filter(|b| !b.is_empty()) {
        None => Some(None),
        Some(text) => match text.parse::<SocketAddr>() {
            Ok(addr) => Some(Some(addr)),
            Err(_) => {
                c.problem(
                    "http.bind",
                    text,
                    "must be an IP socket address such as 127.0.0.1:9187 (port 0..=65535), \
                     or \"\" to turn HTTP off",
                );
                None
            }
        },
    }
}

/// The console: `Some(None)` off, `Some(Some(_))` on, `None` a problem was recorded. `auto`
/// turns it on where HTTP is bound to loopback, or elsewhere when `console_auth_file` is
/// set; `on` elsewhere without that file is refused (nothing would guard it).
fn console(
    c: &mut Checker<'_>,
    bind: Option<SocketAddr>,
    raw: RawHttp,
) -> Option<Option<ConsoleConfig>> {
    let mode = c.one_of("http.console", raw.console, &["auto", "on", "off"]);
    let pool_size = c.int(
        "http.console_pool_size",
        raw.console_pool_size,
        (1, 8),
        " (the console's own connections, apart from the scheduler's pool)",
    );
    let timeout = c.duration(
        "http.console_statement_timeout",
        raw.console_statement_timeout,
        Duration::from_millis(100),
        Duration::from_secs(30),
    );
    let login_failures = c.int(
        "http.console_login_failures_per_minute",
        raw.console_login_failures_per_minute,
        (1, 1000),
        " (failed logins per client address per minute before it gets 429)",
    );
    let require_auth = raw.console_require_auth.unwrap_or(false);
    let file = raw.console_auth_file.filter(|f| !f.is_empty());
    let auth = match &file {
        None => Some(None),
        Some(path) => match read_console_auth(path) {
            Ok(a) => Some(Some(a)),
            Err(msg) => {
                c.problem("http.console_auth_file", path.clone(), msg);
                None
            }
        },
    };
    let (mode, pool_size, (statement_timeout, _), auth, login_failures_per_minute) =
        (mode?, pool_size?, timeout?, auth?, login_failures?);
    let loopback = bind.is_some_and(|b| b.ip().is_loopback());
    let on = match mode.as_str() {
        "off" => false,
        _ if bind.is_none() => false,
        "on" if !loopback && auth.is_none() => {
            c.problem(
                "http.console",
                "on",
                format!(
                    "needs http.console_auth_file (a bearer token or USER:PASSWORD) when \
                     http.bind ({}) is not a loopback address; or bind to 127.0.0.1 and \
                     reach it through an SSH tunnel",
                    bind.map(|b| b.to_string()).unwrap_or_default()
                ),
            );
            return None;
        }
        "on" => true,
        // auto
        _ => loopback || auth.is_some(),
    };
    if on && require_auth && auth.is_none() {
        c.problem(
            "http.console_require_auth",
            "true",
            "needs http.console_auth_file (a bearer token or USER:PASSWORD), on loopback too; \
             or console = \"off\"",
        );
        return None;
    }
    Some(on.then_some(ConsoleConfig {
        auth,
        pool_size,
        statement_timeout,
        login_failures_per_minute,
    }))
}

/// Reads `[http] console_auth_file`, checked on the open file as libpq checks a key (0600
/// owned by us; 0640 owned by root). Either one line, a credential of the `operator` role
/// (the file of releases before roles), or one credential per line, each `ROLE CREDENTIAL`
/// with ROLE `viewer` or `operator` (blank lines and `#` comments skipped). A credential is
/// `USER:PASSWORD` (basic; password 8+ characters) or a bearer token of 16+ characters.
fn read_console_auth(path: &str) -> Result<ConsoleAuth, String> {
    let secret = dsn::read_password_file(path, Rule::Key)
        .map_err(|m| m.replacen("password file ", "", 1))?;
    parse_console_auth(secret.expose())
}

/// A line `ROLE CREDENTIAL`: its role and credential.
fn with_role(l: &str) -> Option<(ConsoleRole, &str)> {
    let (role, rest) = l.split_once(' ')?;
    let role = match role {
        "viewer" => ConsoleRole::Viewer,
        "operator" => ConsoleRole::Operator,
        _ => return None,
    };
    Some((role, rest.trim()))
}

/// The credentials of an auth file's text (see [`read_console_auth`]).
pub(crate) fn parse_console_auth(text: &str) -> Result<ConsoleAuth, String> {
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let mut credentials = Vec::new();
    for &(n, line) in &lines {
        let (role, cred) = match with_role(line) {
            Some(rc) => rc,
            None if lines.len() == 1 => (ConsoleRole::Operator, line),
            None => {
                return Err(format!(
                    "line {n}: a file of several credentials holds `viewer CREDENTIAL` or \
                     `operator CREDENTIAL` on each line"
                ))
            }
        };
        let (secret, user) = match cred.split_once(':') {
            Some((user, password)) if !user.is_empty() && password.len() >= 8 => (
                CredentialSecret::Basic {
                    user: user.to_owned(),
                    password: Secret::new(password),
                },
                user.to_owned(),
            ),
            Some(_) => {
                return Err(format!(
                    "line {n}: USER:PASSWORD needs a user and a password of at least 8 characters"
                ))
            }
            None if cred.len() >= 16 && !cred.contains(char::is_whitespace) => (
                CredentialSecret::Bearer(Secret::new(cred)),
                format!("token@{n}"),
            ),
            None => {
                return Err(format!(
                    "line {n}: a bearer token must be at least 16 characters"
                ))
            }
        };
        if credentials
            .iter()
            .any(|c: &ConsoleCredential| c.user == user)
        {
            return Err(format!("line {n}: user `{user}` is given twice"));
        }
        credentials.push(ConsoleCredential { role, secret, user });
    }
    if credentials.is_empty() {
        return Err("holds no credential: a bearer token, or USER:PASSWORD".into());
    }
    Ok(ConsoleAuth { credentials })
}

/// `[http] tls_cert_file` and `tls_key_file`: both or neither; both are read now (the key
/// checked as libpq checks a key), so a bad file is a configuration error, not a failed
/// handshake. `Some(None)`: plain HTTP; `None`: a problem was recorded.
pub(super) fn http_tls(
    c: &mut Checker<'_>,
    cert: Option<String>,
    key: Option<String>,
) -> Option<Option<TlsFiles>> {
    let cert = cert.filter(|f| !f.is_empty());
    let key = key.filter(|f| !f.is_empty());
    match (cert, key) {
        (None, None) => Some(None),
        (Some(cert), None) => {
            c.problem(
                "http.tls_key_file",
                "\"\"",
                format!(
                    "is required with http.tls_cert_file ({cert}): the certificate's private key"
                ),
            );
            None
        }
        (None, Some(key)) => {
            c.problem(
                "http.tls_cert_file",
                "\"\"",
                format!("is required with http.tls_key_file ({key}): the certificate chain (PEM)"),
            );
            None
        }
        (Some(cert), Some(key)) => {
            let files = TlsFiles {
                cert: cert.clone().into(),
                key: key.clone().into(),
            };
            match super::tls::load(&files) {
                Ok(_) => Some(Some(files)),
                Err(super::tls::LoadError::Cert(msg)) => {
                    c.problem("http.tls_cert_file", cert, msg);
                    None
                }
                Err(super::tls::LoadError::Key(msg)) => {
                    c.problem("http.tls_key_file", key, msg);
                    None
                }
            }
        }
    }
}

/// At most this many `[http] public_names`.
const PUBLIC_NAMES_MAX: usize = 32;

/// `[http] public_names`: DNS names or IP addresses (without port), lower-cased.
fn public_names(c: &mut Checker<'_>, names: Option<Vec<String>>) -> Option<Vec<String>> {
    static RE: OnceLock<Regex> = OnceLock::new();
    let re = RE.get_or_init(|| {
        Regex::new(
            r"^(?i)[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?(\.[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?)*$",
        )
        .expect("valid regex")
    });
    let names = names.unwrap_or_default();
    if names.len() > PUBLIC_NAMES_MAX {
        c.problem(
            "http.public_names",
            format!("({} names)", names.len()),
            format!("at most {PUBLIC_NAMES_MAX} names"),
        );
        return None;
    }
    let mut out = Vec::new();
    let mut bad = false;
    for n in names {
        let bare = n.trim_start_matches('[').trim_end_matches(']');
        if bare.parse::<std::net::IpAddr>().is_ok() || (re.is_match(&n) && n.len() <= 253) {
            out.push(bare.to_ascii_lowercase());
        } else {
            c.problem(
                "http.public_names",
                n,
                "each must be a DNS name or an IP address, without port or scheme \
                 (e.g. \"sched.example.org\", \"192.0.2.10\")",
            );
            bad = true;
        }
    }
    (!bad).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_one_line_auth_file_is_a_single_operator_and_each_line_may_name_its_role() {
        let one = parse_console_auth("ops:correct-horse\n").unwrap();
        assert_eq!(one.credentials.len(), 1);
        assert_eq!(one.credentials[0].role, ConsoleRole::Operator);
        assert_eq!(one.credentials[0].user, "ops");
        let token = parse_console_auth("s3cret-token-0123456789").unwrap();
        assert_eq!(token.credentials[0].role, ConsoleRole::Operator);
        assert_eq!(token.credentials[0].user, "token@1");
        let roles = parse_console_auth(
            "# console users\noperator alice:alice-password-1\n\nviewer bob:bob-password-12\nviewer s3cret-token-0123456789\n",
        )
        .unwrap();
        let got: Vec<(ConsoleRole, &str)> = roles
            .credentials
            .iter()
            .map(|c| (c.role, c.user.as_str()))
            .collect();
        assert_eq!(
            got,
            [
                (ConsoleRole::Operator, "alice"),
                (ConsoleRole::Viewer, "bob"),
                (ConsoleRole::Viewer, "token@5"),
            ]
        );
        assert!(matches!(
            roles.credentials[2].secret,
            CredentialSecret::Bearer(_)
        ));
    }

    #[test]
    fn an_auth_file_line_without_a_known_role_or_a_weak_secret_is_refused_naming_its_line() {
        let e = parse_console_auth("operator alice:alice-password-1\nadmin bob:bob-password-12\n")
            .unwrap_err();
        assert!(e.starts_with("line 2:"), "{e}");
        let e = parse_console_auth("viewer bob:short\n").unwrap_err();
        assert!(e.contains("at least 8"), "{e}");
        let e = parse_console_auth("operator a:alice-password-1\nviewer a:other-password-1\n")
            .unwrap_err();
        assert!(e.contains("twice"), "{e}");
        assert!(parse_console_auth("# nothing\n\n").is_err());
    }
}
