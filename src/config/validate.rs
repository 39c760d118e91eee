//! Turns the merged raw settings into typed settings, checking every bound and collecting
//! every problem (not just the first).

use std::net::SocketAddr;
use std::path::Path;
use std::sync::OnceLock;
use std::time::Duration;

use regex::Regex;

use super::check::Checker;
use super::dsn::{self, Secret};
use super::error::ConfigProblem;
use super::layers::Merged;
use super::raw::{RawConfig, RawDatabase, RawRetention, RawScheduler};
use super::{
    Config, DatabaseConfig, HttpConfig, LogConfig, LogFormat, MetricsConfig, ReplicaId,
    RetentionConfig, SchedulerConfig,
};

const REPLICA_ID_PATTERN: &str = "^[a-z0-9][a-z0-9-]{0,62}$";
const LOG_LEVELS: [&str; 6] = ["trace", "debug", "info", "warning", "error", "critical"];

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
    let bind = http_bind(&mut c, raw.http.bind);
    let backlog_interval = c.duration(
        "metrics.backlog_interval",
        raw.metrics.backlog_interval,
        Duration::from_secs(1),
        Duration::from_secs(300),
    );
    let format = c.one_of("log.format", raw.log.format, &["json", "text"]);
    let level = c.one_of("log.level", raw.log.level, &LOG_LEVELS);
    let retention = retention(&mut c, raw.retention);

    match (
        replica_id,
        database,
        scheduler,
        bind,
        backlog_interval,
        format,
        level,
        retention,
    ) {
        (
            Some(replica_id),
            Some(database),
            Some(scheduler),
            Some(bind),
            Some(bi),
            Some(f),
            Some(level),
            Some(retention),
        ) if c.problems.is_empty() => Ok(Config {
            source: source.to_path_buf(),
            replica_id,
            database,
            scheduler,
            http: HttpConfig { bind },
            metrics: MetricsConfig {
                backlog_interval: bi.0,
            },
            log: LogConfig {
                format: if f == "json" {
                    LogFormat::Json
                } else {
                    LogFormat::Text
                },
                level,
            },
            retention,
        }),
        _ => Err(c.problems),
    }
}

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

fn database(c: &mut Checker<'_>, raw: RawDatabase) -> Option<DatabaseConfig> {
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
        (None, Some(path)) => match dsn::read_password_file(&path) {
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
    let finished_after = match raw.finished_after {
        Some(text) if text.trim_start_matches('0').is_empty() && !text.is_empty() => Some(None),
        Some(text) if super::duration::parse(&text) == Ok(Duration::ZERO) => Some(None),
        other => c
            .duration("retention.finished_after", other, s(60), s(3650 * DAY))
            .map(|(d, _)| Some(d)),
    };
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
    })
}

/// `Some(None)`: HTTP off; `None`: a problem was recorded.
fn http_bind(c: &mut Checker<'_>, bind: Option<String>) -> Option<Option<SocketAddr>> {
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
