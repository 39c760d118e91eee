//! The configuration of `qlsched worker` (docs/worker.md): the same layers, `[database]`,
//! `[http]` (bind and TLS only) and `[log]` keys as a replica's, plus `[worker]`.
//!
//! Layers, later wins: `config/default.toml`; [`WORKER_DEFAULTS`] (`[worker]`, and what
//! differs for a worker: the dispatcher role, another port); the worker's file, which must set
//! `worker.id`; environment overrides `QLSCHED__SECTION__KEY`. Every problem names file, key,
//! value and bound, as a replica's do. A file with a `[worker]` table is a worker's file
//! ([`is_worker_file`]): `qlsched check-config` validates it as one.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::check::Checker;
use super::error::{ConfigError, ConfigProblem};
use super::{layers, validate, DatabaseConfig, LogConfig, ReplicaId, TlsFiles};

/// The worker's built-in defaults (`config/worker-default.toml`): `[worker]`, and what
/// differs from a replica's (the dispatcher role, another port, no console).
pub const WORKER_DEFAULTS: &str = include_str!("../../config/worker-default.toml");

const WORKER_DEFAULTS_LABEL: &str = "worker-default.toml (built in)";

/// Sections a worker does not read: a key of them in a worker's file is a mistake.
const NOT_WORKER_SECTIONS: [&str; 4] = ["replica", "scheduler", "metrics", "retention"];
/// `[http]` keys a worker reads (it serves no console).
const WORKER_HTTP_KEYS: [&str; 3] = ["bind", "tls_cert_file", "tls_key_file"];

const POOL_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$";

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawWorker {
    pub id: Option<String>,
    pub pools: Option<Vec<String>>,
    pub concurrency: Option<i64>,
    pub lease: Option<String>,
    pub heartbeat: Option<String>,
    pub poll: Option<String>,
    pub take_batch: Option<i64>,
    pub take_linger: Option<String>,
    pub drain_timeout: Option<String>,
    pub kill_grace: Option<String>,
    pub output_bound: Option<i64>,
    pub credentials_directory: Option<String>,
}

/// A worker's validated configuration.
#[derive(Debug, Clone)]
pub struct WorkerFileConfig {
    /// The worker file it was loaded from, as given.
    pub source: PathBuf,
    pub worker: WorkerConfig,
    pub database: DatabaseConfig,
    /// `/healthz`, `/readyz`, `/metrics`; `None`: off.
    pub http_bind: Option<std::net::SocketAddr>,
    pub http_tls: Option<TlsFiles>,
    pub log: LogConfig,
}

/// `[worker]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// Recorded on every attempt taken (the replica id pattern).
    pub id: ReplicaId,
    /// Pools taken from, 1..=32.
    pub pools: Vec<String>,
    /// Most attempts at once, 1..=256.
    pub concurrency: u32,
    /// Lease per attempt, 5s..=1h.
    pub lease: Duration,
    /// Lease extension interval, 1s..=20m, at most lease / 3.
    pub heartbeat: Duration,
    /// Pause when nothing was queued, 100ms..=60s.
    pub poll: Duration,
    /// Slots freed since the last take at which the next take is made at once, 1..=256
    /// (at most `concurrency` is used).
    pub take_batch: u32,
    /// Longest wait from the first slot freed since the last take to the next take, and from
    /// an attempt's end to the call that records it with others, 0s..=1s.
    pub take_linger: Duration,
    /// How long a stop waits for running attempts, 0s..=1h.
    pub drain_timeout: Duration,
    /// SIGTERM to SIGKILL of a stopped command's process group, 100ms..=5m.
    pub kill_grace: Duration,
    /// Bytes of output kept per attempt, 256..=8192.
    pub output_bound: usize,
    /// Where secrets are read from; `None`: a spec naming a secret fails.
    pub credentials_directory: Option<PathBuf>,
}

/// Whether the file at `path` is a worker's (it has a `[worker]` table). A file that cannot
/// be read or parsed is not (the replica's loader then reports why).
pub fn is_worker_file(path: &Path) -> bool {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|t| t.parse::<toml::Table>().ok())
        .is_some_and(|t| t.get("worker").is_some_and(toml::Value::is_table))
}

impl WorkerFileConfig {
    /// Loads `path` over the built-in defaults, with overrides from the process environment
    /// (and `$CREDENTIALS_DIRECTORY`).
    pub fn load(path: &Path) -> Result<WorkerFileConfig, ConfigError> {
        Self::load_with_env(path, layers::process_env())
    }

    /// Like [`load`](Self::load) with the environment given. Opens no network connection.
    pub fn load_with_env(
        path: &Path,
        env: impl IntoIterator<Item = (String, String)>,
    ) -> Result<WorkerFileConfig, ConfigError> {
        let env: Vec<(String, String)> = env.into_iter().collect();
        let credentials_env = env
            .iter()
            .find(|(k, _)| k == "CREDENTIALS_DIRECTORY")
            .map(|(_, v)| v.clone())
            .filter(|v| !v.is_empty());
        let layers::Loaded {
            label,
            merged,
            raw,
            mut problems,
        } = layers::load(
            path,
            &[
                (layers::DEFAULTS_LABEL, super::DEFAULT_TOML),
                (WORKER_DEFAULTS_LABEL, WORKER_DEFAULTS),
            ],
            not_worker_keys,
            env,
        )?;
        let mut c = Checker::new(&merged, &label);
        let worker = worker(&mut c, raw.worker, credentials_env);
        let database = validate::database(&mut c, raw.database);
        let bind = validate::http_bind(&mut c, raw.http.bind);
        let tls = validate::http_tls(&mut c, raw.http.tls_cert_file, raw.http.tls_key_file);
        let log = validate::log(&mut c, raw.log);
        problems.extend(std::mem::take(&mut c.problems));
        match (worker, database, bind, tls, log) {
            (Some(worker), Some(database), Some(http_bind), Some(http_tls), Some(log))
                if problems.is_empty() =>
            {
                Ok(WorkerFileConfig {
                    source: path.to_path_buf(),
                    worker,
                    database,
                    http_bind,
                    http_tls,
                    log,
                })
            }
            _ => Err(ConfigError::Problems(problems)),
        }
    }
}

/// Keys of the worker's file that a worker does not read.
fn not_worker_keys(file: &toml::Table, label: &str, problems: &mut Vec<ConfigProblem>) {
    for (section, value) in file {
        let Some(table) = value.as_table() else {
            continue;
        };
        for key in table.keys() {
            let not_read = NOT_WORKER_SECTIONS.contains(&section.as_str())
                || (section == "http" && !WORKER_HTTP_KEYS.contains(&key.as_str()));
            if not_read {
                problems.push(ConfigProblem::new(
                    label,
                    format!("{section}.{key}"),
                    layers::shown(&format!("{section}.{key}"), &table[key]),
                    "is not a worker setting: a worker reads [worker], [database], [http] bind, \
                     tls_cert_file and tls_key_file, and [log]",
                ));
            }
        }
    }
}

fn worker(
    c: &mut Checker<'_>,
    raw: RawWorker,
    credentials_env: Option<String>,
) -> Option<WorkerConfig> {
    let id = worker_id(c, raw.id);
    let pools = pools(c, raw.pools);
    let concurrency = c.int("worker.concurrency", raw.concurrency, (1, 256), "");
    let take_batch = c.int("worker.take_batch", raw.take_batch, (1, 256), "");
    let (lease, heartbeat) = lease_and_heartbeat(c, raw.lease, raw.heartbeat);
    let secs = Duration::from_secs;
    let millis = Duration::from_millis;
    let [poll, take_linger, drain_timeout, kill_grace] = [
        ("worker.poll", raw.poll, millis(100), secs(60)),
        ("worker.take_linger", raw.take_linger, millis(0), secs(1)),
        (
            "worker.drain_timeout",
            raw.drain_timeout,
            secs(0),
            secs(3600),
        ),
        ("worker.kill_grace", raw.kill_grace, millis(100), secs(300)),
    ]
    .map(|(key, value, lo, hi)| c.duration(key, value, lo, hi));
    let output_bound = c.int(
        "worker.output_bound",
        raw.output_bound,
        (256, 8192),
        " bytes",
    );
    let credentials_directory =
        credentials_directory(c, raw.credentials_directory, credentials_env);
    Some(WorkerConfig {
        id: id?,
        pools: pools?,
        concurrency: concurrency?,
        lease: lease?,
        heartbeat: heartbeat?,
        poll: poll?.0,
        take_batch: take_batch?,
        take_linger: take_linger?.0,
        drain_timeout: drain_timeout?.0,
        kill_grace: kill_grace?.0,
        output_bound: output_bound? as usize,
        credentials_directory: credentials_directory?,
    })
}

/// `worker.id`: required in the worker's file, the replica id pattern.
fn worker_id(c: &mut Checker<'_>, id: Option<String>) -> Option<ReplicaId> {
    match id {
        None => {
            c.problem(
                "worker.id",
                "(missing)",
                "is required in the worker file ([worker] id = \"w1\")",
            );
            None
        }
        Some(id) => ReplicaId::parse(&id).or_else(|| {
            let bound = format!(
                "must match {} (lowercase letters, digits and '-', 1..=63 characters, not \
                 starting with '-')",
                validate::REPLICA_ID_PATTERN
            );
            c.problem("worker.id", id, bound);
            None
        }),
    }
}

/// `worker.lease` (5s..=1h) and `worker.heartbeat` (1s..=20m, at most a third of the lease).
fn lease_and_heartbeat(
    c: &mut Checker<'_>,
    lease: Option<String>,
    heartbeat: Option<String>,
) -> (Option<Duration>, Option<Duration>) {
    let lease = c.duration(
        "worker.lease",
        lease,
        Duration::from_secs(5),
        Duration::from_secs(3600),
    );
    let heartbeat = c.duration(
        "worker.heartbeat",
        heartbeat,
        Duration::from_secs(1),
        Duration::from_secs(1200),
    );
    if let (Some((l, lt)), Some((h, ht))) = (&lease, &heartbeat) {
        if *h * 3 > *l {
            c.problem(
                "worker.heartbeat",
                ht.clone(),
                format!("must be at most a third of worker.lease ({lt})"),
            );
        }
    }
    (lease.map(|l| l.0), heartbeat.map(|h| h.0))
}

fn pools(c: &mut Checker<'_>, pools: Option<Vec<String>>) -> Option<Vec<String>> {
    let pools = c.required("worker.pools", pools)?;
    let re = regex::Regex::new(POOL_PATTERN).expect("valid regex");
    if pools.is_empty() || pools.len() > 32 {
        c.problem(
            "worker.pools",
            format!("{pools:?}"),
            "must name 1..=32 pools",
        );
        return None;
    }
    for p in &pools {
        if !re.is_match(p) {
            c.problem(
                "worker.pools",
                p.clone(),
                format!("each pool must match {POOL_PATTERN}"),
            );
            return None;
        }
    }
    Some(pools)
}

/// `Some(None)`: none; `None`: a problem was recorded. The directory must exist and give
/// group and others no access (files are checked again when read).
fn credentials_directory(
    c: &mut Checker<'_>,
    configured: Option<String>,
    from_env: Option<String>,
) -> Option<Option<PathBuf>> {
    let Some(dir) = configured.filter(|d| !d.is_empty()).or(from_env) else {
        return Some(None);
    };
    let key = "worker.credentials_directory";
    match std::fs::metadata(&dir) {
        Err(e) => {
            c.problem(key, dir, format!("must be an existing directory ({e})"));
            None
        }
        Ok(m) if !m.is_dir() => {
            c.problem(key, dir, "must be a directory");
            None
        }
        Ok(m) if m.mode() & 0o077 != 0 => {
            c.problem(
                key,
                dir,
                format!(
                    "has mode {:04o}; it must give group and others no access: chmod 700",
                    m.mode() & 0o7777
                ),
            );
            None
        }
        Ok(_) => Some(Some(PathBuf::from(dir))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(text: &str) -> Result<WorkerFileConfig, ConfigError> {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(&path, text).unwrap();
        WorkerFileConfig::load_with_env(&path, [])
    }

    #[test]
    fn a_worker_file_with_an_id_loads_with_the_dispatcher_role_and_its_own_port() {
        let cfg = load("[worker]\nid = \"w1\"\n").unwrap();
        assert_eq!(cfg.worker.id.as_str(), "w1");
        assert_eq!(cfg.worker.pools, vec!["default".to_string()]);
        assert_eq!(cfg.database.pg.get_user(), Some("qlsched_dispatcher"));
        assert_eq!(cfg.http_bind.unwrap().port(), 9188);
    }

    #[test]
    fn environment_overrides_reach_worker_keys_and_are_blamed_for_their_problems() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.toml");
        std::fs::write(&path, "[worker]\nid = \"w1\"\n").unwrap();
        let env = |v: &str| [("QLSCHED__WORKER__CONCURRENCY".to_string(), v.to_string())];
        let cfg = WorkerFileConfig::load_with_env(&path, env("8")).unwrap();
        assert_eq!(cfg.worker.concurrency, 8);
        let err = WorkerFileConfig::load_with_env(&path, env("999")).unwrap_err();
        let p = &err.problems()[0];
        assert_eq!(
            (p.file.as_str(), p.key.as_str(), p.bound.as_str()),
            (
                "env QLSCHED__WORKER__CONCURRENCY",
                "worker.concurrency",
                "must be within 1..=256"
            )
        );
    }

    #[test]
    fn out_of_bounds_and_foreign_keys_are_each_named() {
        let err = load(
            "[worker]\nid = \"w1\"\nconcurrency = 0\nheartbeat = \"30s\"\n[scheduler]\nlease = \"5s\"\n",
        )
        .unwrap_err();
        let keys: Vec<&str> = err.problems().iter().map(|p| p.key.as_str()).collect();
        assert!(keys.contains(&"worker.concurrency"), "{err}");
        assert!(keys.contains(&"worker.heartbeat"), "{err}");
        assert!(keys.contains(&"scheduler.lease"), "{err}");
    }

    #[test]
    fn the_take_batch_and_linger_have_defaults_and_bounds() {
        let cfg = load("[worker]\nid = \"w1\"\n").unwrap();
        assert_eq!(
            (cfg.worker.take_batch, cfg.worker.take_linger),
            (16, Duration::from_millis(20))
        );
        let cfg = load("[worker]\nid = \"w1\"\ntake_batch = 1\ntake_linger = \"0s\"\n").unwrap();
        assert_eq!(
            (cfg.worker.take_batch, cfg.worker.take_linger),
            (1, Duration::ZERO)
        );
        let err =
            load("[worker]\nid = \"w1\"\ntake_batch = 0\ntake_linger = \"2s\"\n").unwrap_err();
        let named: Vec<(&str, &str)> = err
            .problems()
            .iter()
            .map(|p| (p.key.as_str(), p.bound.as_str()))
            .collect();
        assert!(
            named.contains(&("worker.take_batch", "must be within 1..=256")),
            "{err}"
        );
        assert!(
            named.iter().any(|(k, _)| *k == "worker.take_linger"),
            "{err}"
        );
    }
}
