//! The configuration as written: every key optional, nothing interpreted yet.
//!
//! Each layer is checked against these structs key by key (so an unknown or mistyped key is
//! blamed on the layer that wrote it), then the merged table is deserialized into them once
//! and handed to `validate`, which turns strings into durations, addresses and the DSN.

use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    #[serde(default)]
    pub replica: RawReplica,
    #[serde(default)]
    pub database: RawDatabase,
    #[serde(default)]
    pub scheduler: RawScheduler,
    #[serde(default)]
    pub http: RawHttp,
    #[serde(default)]
    pub metrics: RawMetrics,
    #[serde(default)]
    pub log: RawLog,
    #[serde(default)]
    pub retention: RawRetention,
    /// `qlsched worker` only (src/config/worker.rs).
    #[serde(default)]
    pub worker: super::worker::RawWorker,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawReplica {
    pub id: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDatabase {
    pub dsn: Option<String>,
    /// Only the environment may set this; `layers` rejects it in files.
    pub password: Option<String>,
    pub password_file: Option<String>,
    pub pool_size: Option<i64>,
    pub connect_timeout: Option<String>,
    pub application_name: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawScheduler {
    pub claim_budget: Option<i64>,
    pub lease: Option<String>,
    pub cadence: Option<String>,
    pub drain: Option<String>,
    pub admit_timeout: Option<String>,
    pub max_serialization_retries: Option<i64>,
    pub reject_backoff: Option<String>,
    pub listen: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawHttp {
    pub bind: Option<String>,
    pub console: Option<String>,
    pub console_auth_file: Option<String>,
    pub console_pool_size: Option<i64>,
    pub console_statement_timeout: Option<String>,
    pub console_require_auth: Option<bool>,
    pub console_login_failures_per_minute: Option<i64>,
    pub tls_cert_file: Option<String>,
    pub tls_key_file: Option<String>,
    pub allow_plain_http: Option<bool>,
    pub public_names: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawMetrics {
    pub backlog_interval: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRetention {
    pub finished_after: Option<String>,
    pub batch: Option<i64>,
    pub interval: Option<String>,
    pub queued_alert_after: Option<String>,
    pub audit_after: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLog {
    pub format: Option<String>,
    pub level: Option<String>,
}

/// Deserializes `{section: {key: value}}` alone, so serde's verdict concerns that key only.
/// `key == None` probes whether the section itself is known.
pub(super) fn probe(section: &str, key: Option<(&str, &toml::Value)>) -> Result<(), String> {
    let mut inner = toml::Table::new();
    if let Some((k, v)) = key {
        inner.insert(k.to_owned(), v.clone());
    }
    let mut outer = toml::Table::new();
    outer.insert(section.to_owned(), toml::Value::Table(inner));
    toml::Value::Table(outer)
        .try_into::<RawConfig>()
        .map(|_| ())
        .map_err(|e| e.message().trim().to_owned())
}
