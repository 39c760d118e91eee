//! Configuration is validated before PostgreSQL is opened, and every problem names the file
//! (or environment variable), the key and the bound.

use std::path::{Path, PathBuf};

use qlsched::config::{Config, ConfigError, LogFormat};

/// A temporary directory holding one config file; removed on drop.
struct TempConfig {
    _dir: tempfile::TempDir,
    path: PathBuf,
}

impl TempConfig {
    fn new(toml: &str) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("replica.toml");
        std::fs::write(&path, toml).expect("write config");
        TempConfig { _dir: dir, path }
    }

    fn label(&self) -> String {
        self.path.display().to_string()
    }

    fn load(&self, env: &[(&str, &str)]) -> Result<Config, ConfigError> {
        Config::load_with_env(&self.path, env_vars(env))
    }
}

fn env_vars(env: &[(&str, &str)]) -> Vec<(String, String)> {
    env.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config")
        .join(name)
}

/// A valid replica file plus `extra` (which must not repeat `[replica]`).
fn replica_with(extra: &str) -> String {
    format!("[replica]\nid = \"a\"\n{extra}")
}

struct Bad {
    name: &'static str,
    toml: String,
    env: &'static [(&'static str, &'static str)],
    /// `{file}` is replaced by the temp file's path.
    expect: &'static str,
}

fn bad(name: &'static str, toml: String, expect: &'static str) -> Bad {
    Bad {
        name,
        toml,
        env: &[],
        expect,
    }
}

fn bad_cases() -> Vec<Bad> {
    let id = |v: &str| format!("[replica]\nid = \"{v}\"\n");
    let sched = |kv: &str| replica_with(&format!("[scheduler]\n{kv}\n"));
    let db = |kv: &str| replica_with(&format!("[database]\n{kv}\n"));
    let ret = |kv: &str| replica_with(&format!("[retention]\n{kv}\n"));
    vec![
        bad("uppercase replica id", id("Replica-A"), "{file}: replica.id = Replica-A: must match ^[a-z0-9][a-z0-9-]{0,62}$"),
        bad("leading dash replica id", id("-a"), "{file}: replica.id = -a: must match ^[a-z0-9][a-z0-9-]{0,62}$"),
        bad("64 char replica id", id(&"a".repeat(64)), "replica.id = aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa: must match"),
        bad("empty replica id", id(""), "{file}: replica.id = : must match ^[a-z0-9][a-z0-9-]{0,62}$"),
        bad("missing replica id", "[scheduler]\nclaim_budget = 8\n".into(), "{file}: replica.id = (missing): is required in the replica file"),
        bad("claim_budget 0", sched("claim_budget = 0"), "{file}: scheduler.claim_budget = 0: must be within 1..=256"),
        bad("claim_budget 257", sched("claim_budget = 257"), "{file}: scheduler.claim_budget = 257: must be within 1..=256"),
        bad("negative claim_budget", sched("claim_budget = -1"), "{file}: scheduler.claim_budget = -1: must be within 1..=256"),
        bad("negative duration", sched("drain = \"-1s\""), "{file}: scheduler.drain = -1s: must not be negative"),
        bad("lease 4s", sched("lease = \"4s\""), "{file}: scheduler.lease = 4s: must be within 5s..=300s"),
        bad("lease 301s", sched("lease = \"301s\""), "{file}: scheduler.lease = 301s: must be within 5s..=300s"),
        bad("cadence 99ms", sched("cadence = \"99ms\""), "{file}: scheduler.cadence = 99ms: must be within 100ms..=60s"),
        bad("cadence 61s", sched("cadence = \"61s\""), "{file}: scheduler.cadence = 61s: must be within 100ms..=60s"),
        bad("lease under 3 x cadence", sched("lease = \"20s\"\ncadence = \"10s\""), "{file}: scheduler.lease = 20s: must be at least 3 x scheduler.cadence (30s)"),
        bad("drain 61s", sched("drain = \"61s\""), "{file}: scheduler.drain = 61s: must be within 0s..=60s"),
        bad("admit_timeout equal to lease", sched("admit_timeout = \"30s\""), "{file}: scheduler.admit_timeout = 30s: must be less than scheduler.lease (30s)"),
        bad("admit_timeout 50ms", sched("admit_timeout = \"50ms\""), "{file}: scheduler.admit_timeout = 50ms: must be within 100ms..=60s"),
        bad("max_serialization_retries 21", sched("max_serialization_retries = 21"), "{file}: scheduler.max_serialization_retries = 21: must be within 0..=20"),
        bad("reject_backoff 3601s", sched("reject_backoff = \"3601s\""), "{file}: scheduler.reject_backoff = 3601s: must be within 1s..=3600s"),
        bad("duration unit parsecs", sched("drain = \"10 parsecs\""), "{file}: scheduler.drain = 10 parsecs: unknown unit"),
        bad("duration without unit", sched("lease = \"30\""), "{file}: scheduler.lease = 30: missing unit"),
        bad("duration given as a number", sched("lease = 30"), "{file}: scheduler.lease = 30: invalid type: integer `30`"),
        bad("unknown key in scheduler", sched("claim_budgett = 16"), "{file}: scheduler.claim_budgett = 16: unknown field `claim_budgett`"),
        bad("unknown section", replica_with("[schedular]\nlease = \"30s\"\n"), "{file}: schedular = {…}: unknown field `schedular`"),
        bad("password key inside a file", db("password = \"hunter2\""), "{file}: database.password = ***: a password is not accepted in a config file; use database.password_file or the environment variable QLSCHED__DATABASE__PASSWORD"),
        bad("password inside the dsn", db("dsn = \"host=db user=u password=hunter2\""), "{file}: database.dsn = host=db user=u password=***: must not contain a password; use database.password_file"),
        bad("password inside a dsn url", db("dsn = \"postgres://u:hunter2@db/q\""), "{file}: database.dsn = postgres://u:***@db/q: must not contain a password"),
        bad("unparsable dsn", db("dsn = \"host=db port=notaport\""), "{file}: database.dsn = host=db port=notaport: not a valid libpq key=value string or postgres:// URL"),
        bad("missing password_file", db("password_file = \"/nonexistent/qlsched/pw\""), "{file}: database.password_file = /nonexistent/qlsched/pw: password file must exist and be readable"),
        bad("pool_size 1", db("pool_size = 1"), "{file}: database.pool_size = 1: must be within 2..=64"),
        bad("pool_size 65", db("pool_size = 65"), "{file}: database.pool_size = 65: must be within 2..=64"),
        bad("connect_timeout 0s", db("connect_timeout = \"0s\""), "{file}: database.connect_timeout = 0s: must be within 1s..=60s"),
        bad("http bind with a host name and bad port", replica_with("[http]\nbind = \"localhost:99999\"\n"), "{file}: http.bind = localhost:99999: must be an IP socket address"),
        bad("backlog_interval 301s", replica_with("[metrics]\nbacklog_interval = \"301s\"\n"), "{file}: metrics.backlog_interval = 301s: must be within 1s..=300s"),
        bad("log format xml", replica_with("[log]\nformat = \"xml\"\n"), "{file}: log.format = xml: must be one of json, text"),
        bad("log level verbose", replica_with("[log]\nlevel = \"verbose\"\n"), "{file}: log.level = verbose: must be one of trace, debug, info, warning, error, critical"),
        bad("finished_after 59s", ret("finished_after = \"59s\""), "{file}: retention.finished_after = 59s: must be within 60s..=315360000s"),
        bad("finished_after 3651d", ret("finished_after = \"3651d\""), "{file}: retention.finished_after = 3651d: must be within 60s..=315360000s"),
        bad("finished_after in weeks", ret("finished_after = \"4w\""), "{file}: retention.finished_after = 4w: unknown unit"),
        bad("retention batch 0", ret("batch = 0"), "{file}: retention.batch = 0: must be within 1..=10000"),
        bad("retention batch 10001", ret("batch = 10001"), "{file}: retention.batch = 10001: must be within 1..=10000"),
        bad("retention interval 0s", ret("interval = \"0s\""), "{file}: retention.interval = 0s: must be within 1s..=86400s"),
        bad("retention interval 2d", ret("interval = \"2d\""), "{file}: retention.interval = 2d: must be within 1s..=86400s"),
        bad("queued_alert_after 30s", ret("queued_alert_after = \"30s\""), "{file}: retention.queued_alert_after = 30s: must be within 60s..=2592000s"),
        bad("queued_alert_after 31d", ret("queued_alert_after = \"31d\""), "{file}: retention.queued_alert_after = 31d: must be within 60s..=2592000s"),
        bad("unknown key in retention", ret("keep = \"1d\""), "{file}: retention.keep = 1d: unknown field `keep`"),
        Bad { env: &[("QLSCHED__RETENTION__BATCH", "0")], ..bad("env retention override out of bounds", replica_with(""), "env QLSCHED__RETENTION__BATCH: retention.batch = 0: must be within 1..=10000") },
        bad("toml syntax error", replica_with("[scheduler]\nlease = \"30s\n"), "{file}: scheduler.lease = <invalid TOML at line 4"),
        Bad { env: &[("QLSCHED__SCHEDULER__LEASE", "2s")], ..bad("env override out of bounds", replica_with(""), "env QLSCHED__SCHEDULER__LEASE: scheduler.lease = 2s: must be within 5s..=300s") },
        Bad { env: &[("QLSCHED__SCHEDULER__CLAIM_BUDGET", "0")], ..bad("env integer override out of bounds", replica_with(""), "env QLSCHED__SCHEDULER__CLAIM_BUDGET: scheduler.claim_budget = 0: must be within 1..=256") },
        Bad { env: &[("QLSCHED__SCHEDULER__BOGUS", "1")], ..bad("env override with unknown key", replica_with(""), "env QLSCHED__SCHEDULER__BOGUS: scheduler.bogus = 1: unknown field `bogus`") },
        Bad { env: &[("QLSCHED__SCHEDULER", "1")], ..bad("env override without a key", replica_with(""), "env QLSCHED__SCHEDULER: scheduler = 1: expected a variable named QLSCHED__SECTION__KEY") },
        Bad { env: &[("QLSCHED__DATABASE__PASSWORD", "hunter2")], ..bad("password from env and from a file", db("password_file = \"/etc/qlsched/pw\""), "{file}: database.password_file = /etc/qlsched/pw: give the password either in database.password_file or in QLSCHED__DATABASE__PASSWORD, not both") },
    ]
}

#[test]
fn shipped_replica_files_load() {
    for (id, port) in [("a", 9191), ("b", 9192), ("c", 9193)] {
        let path = shipped(&format!("replica-{id}.toml"));
        let config = Config::load_with_env(&path, Vec::new())
            .unwrap_or_else(|e| panic!("{} should load:\n{e}", path.display()));
        assert_eq!(config.replica_id.as_str(), id);
        assert_eq!(config.replica_id.to_string(), id);
        assert_eq!(config.source, path);
        assert_eq!(config.database.pg.get_ports(), &[55439]);
        assert_eq!(config.database.pg.get_user(), Some("qlsched_runtime"));
        assert_eq!(config.database.pg.get_dbname(), Some("qlsched"));
        assert!(config.database.password().is_none());
        assert_eq!(config.http.bind, Some(([127, 0, 0, 1], port).into()));
        assert_eq!(config.log.format, LogFormat::Json);
        assert_eq!(config.scheduler.claim_budget, 64);
        assert_eq!(config.scheduler.lease.as_secs(), 30);
        // Retention defaults (config/default.toml).
        assert_eq!(
            config.retention.finished_after,
            Some(std::time::Duration::from_secs(30 * 86_400))
        );
        assert_eq!(config.retention.batch, 1000);
        assert_eq!(config.retention.interval.as_secs(), 300);
        assert_eq!(config.retention.queued_alert_after.as_secs(), 3600);
    }
}

#[test]
fn retention_zero_keeps_forever_and_day_units_parse() {
    for zero in ["0", "0s", "0d"] {
        let file = TempConfig::new(&replica_with(&format!(
            "[retention]\nfinished_after = \"{zero}\"\n"
        )));
        let c = file.load(&[]).unwrap_or_else(|e| panic!("{zero}: {e}"));
        assert_eq!(c.retention.finished_after, None, "{zero}");
    }
    let file = TempConfig::new(&replica_with(
        "[retention]\nfinished_after = \"7d\"\ninterval = \"1h\"\n",
    ));
    let c = file.load(&[]).unwrap();
    assert_eq!(
        c.retention.finished_after,
        Some(std::time::Duration::from_secs(7 * 86_400))
    );
    assert_eq!(c.retention.interval.as_secs(), 3600);
}

#[test]
fn each_bad_input_is_reported_with_file_key_and_bound() {
    let cases = bad_cases();
    assert!(cases.len() >= 24);
    let mut failures = Vec::new();
    for case in &cases {
        let file = TempConfig::new(&case.toml);
        let expect = case.expect.replace("{file}", &file.label());
        match file.load(case.env) {
            Ok(_) => failures.push(format!("{}: loaded, expected `{expect}`", case.name)),
            Err(e) => {
                let shown = e.to_string();
                if !shown.contains(&expect) {
                    failures.push(format!("{}: expected `{expect}` in:\n{shown}", case.name));
                }
                if shown.contains("hunter2") {
                    failures.push(format!("{}: leaked the password:\n{shown}", case.name));
                }
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn two_problems_are_reported_as_two_lines() {
    let file = TempConfig::new(&replica_with(
        "[scheduler]\nclaim_budget = 0\n[log]\nformat = \"xml\"\n",
    ));
    let err = file.load(&[]).unwrap_err();
    assert_eq!(err.problems().len(), 2, "{err}");
    let shown = err.to_string();
    let lines: Vec<&str> = shown.lines().collect();
    let label = file.label();
    assert_eq!(
        lines,
        [
            format!("{label}: scheduler.claim_budget = 0: must be within 1..=256"),
            format!("{label}: log.format = xml: must be one of json, text"),
        ]
    );
}

#[test]
fn a_syntax_error_is_a_single_problem() {
    let file = TempConfig::new("[replica]\nid = \"a\nlease = \n");
    let err = file.load(&[]).unwrap_err();
    assert_eq!(err.problems().len(), 1, "{err}");
    assert!(err.to_string().contains("TOML syntax error"), "{err}");
}

#[test]
fn a_missing_file_names_the_path() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("no-such-replica.toml");
    let err = Config::load_with_env(&path, Vec::new()).unwrap_err();
    assert!(matches!(err, ConfigError::Io { .. }), "{err:?}");
    assert!(
        err.to_string().contains(&path.display().to_string()),
        "{err}"
    );
}

#[test]
fn problems_in_defaults_are_blamed_on_the_built_in_file() {
    let file = TempConfig::new(&replica_with("[scheduler]\nlease = \"5s\"\n"));
    let err = file.load(&[]).unwrap_err();
    assert!(
        err.to_string().contains(
            "default.toml (built in): scheduler.admit_timeout = 5s: must be less than scheduler.lease (5s)"
        ),
        "{err}"
    );
}

#[test]
fn environment_overrides_win_and_are_parsed_as_toml_or_strings() {
    let file = TempConfig::new(&replica_with("[scheduler]\nclaim_budget = 8\n"));
    let config = file
        .load(&[
            ("QLSCHED__SCHEDULER__CLAIM_BUDGET", "32"),
            ("QLSCHED__SCHEDULER__CADENCE", "250ms"),
            ("QLSCHED__REPLICA__ID", "7"),
            ("QLSCHED__HTTP__BIND", ""),
            ("QLSCHED__LOG__FORMAT", "\"text\""),
            ("UNRELATED", "ignored"),
        ])
        .unwrap();
    assert_eq!(config.scheduler.claim_budget, 32);
    assert_eq!(config.scheduler.cadence.as_millis(), 250);
    assert_eq!(config.replica_id.as_str(), "7");
    assert_eq!(config.http.bind, None);
    assert_eq!(config.log.format, LogFormat::Text);
}

#[test]
fn debug_and_redacted_dsn_never_show_the_password() {
    let file = TempConfig::new(&replica_with(
        "[database]\ndsn = \"postgres://qlsched_runtime@db.internal:5433/qlsched\"\n",
    ));
    let config = file
        .load(&[("QLSCHED__DATABASE__PASSWORD", "s3cr3t-Pa55")])
        .unwrap();
    assert_eq!(config.database.pg.get_password(), Some(&b"s3cr3t-Pa55"[..]));
    assert_eq!(config.database.password().unwrap().expose(), "s3cr3t-Pa55");
    let debug = format!("{config:?} {:?} {:#?}", config.database, config.database.pg);
    assert!(!debug.contains("s3cr3t"), "{debug}");
    assert!(!config.database.dsn_redacted.contains("s3cr3t"));
    assert!(config
        .database
        .dsn_redacted
        .contains("host=db.internal port=5433"));
    assert_eq!(
        format!("{:?}", config.database.password().unwrap()),
        "Secret(***)"
    );
}

#[test]
fn password_file_is_read_and_its_trailing_newline_trimmed() {
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "from-file\n").unwrap();
    std::fs::set_permissions(&pw, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let file = TempConfig::new(&replica_with(&format!(
        "[database]\npassword_file = {:?}\n",
        pw.display().to_string()
    )));
    let config = file.load(&[]).unwrap();
    assert_eq!(config.database.pg.get_password(), Some(&b"from-file"[..]));
    assert!(!format!("{config:?}").contains("from-file"));
}

/// Credential files are checked as libpq checks them, on the descriptor that is read: a
/// password file with any group or other bit, and a key with more than 0600 (0640 when owned
/// by root, for a user other than root), are refused naming the file and its mode.
#[test]
fn a_password_file_others_can_read_is_refused_by_check_config() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pw = dir.path().join("pw");
    std::fs::write(&pw, "from-file\n").unwrap();
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o644)).unwrap();
    let config = dir.path().join("r.toml");
    std::fs::write(
        &config,
        format!(
            "[replica]\nid = \"a\"\n[database]\npassword_file = {:?}\n",
            pw.display().to_string()
        ),
    )
    .unwrap();
    let o = std::process::Command::new(crate::helpers::replica::binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "check-config accepted a 0644 password file: {out}"
    );
    assert!(
        out.contains("database.password_file")
            && out.contains(&pw.display().to_string())
            && out.contains("0644"),
        "{out}"
    );
    assert!(!out.contains("from-file"), "{out}");

    // The CLI's --password-file: refused before any connection is tried.
    let o = std::process::Command::new(crate::helpers::replica::binary())
        .args([
            "db",
            "check",
            "--dsn",
            "host=127.0.0.1 port=1 user=u dbname=d",
        ])
        .arg("--password-file")
        .arg(&pw)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(
        !o.status.success() && out.contains(&pw.display().to_string()) && out.contains("0644"),
        "{out}"
    );

    // 0600 is accepted.
    std::fs::set_permissions(&pw, std::fs::Permissions::from_mode(0o600)).unwrap();
    let o = std::process::Command::new(crate::helpers::replica::binary())
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}
