//! A task's spec as `qlsched worker` reads it (docs/worker.md, "Spec"): pure, no I/O.
//! `task publish` refuses a spec this module refuses, naming the field; the worker parses
//! the spec pinned by each run it takes.
//!
//! A spec is a JSON object. Without `"executor"` it is for an external dispatcher: only the
//! keys the protocol reads (`pool`, `max_attempts`, `retry_backoff_ms`) are checked, and no
//! `qlsched worker` takes its runs. With one, every key is checked and unknown keys are
//! refused (a misspelt `timeout` must not silently mean "none").

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};

/// The executors `qlsched worker` runs (the take asks for these only).
pub const EXECUTORS: [&str; 2] = ["shell", "http"];

const POOL_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$";
const SECRET_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$";
const ENV_NAME_PATTERN: &str = "^[A-Za-z_][A-Za-z0-9_]{0,127}$";
const HTTP_METHODS: [&str; 6] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD"];
/// Headers the worker sets itself.
const RESERVED_HEADERS: [&str; 4] = [
    "idempotency-key",
    "host",
    "content-length",
    "transfer-encoding",
];
const TIMEOUT_MIN: Duration = Duration::from_secs(1);
const TIMEOUT_MAX: Duration = Duration::from_secs(7 * 86_400);
/// Longest accepted body of an http spec (the whole spec is stored in the database).
const BODY_MAX: usize = 64 * 1024;

/// A field of the spec and what is wrong with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("spec field `{field}`: {problem}")]
pub struct SpecError {
    pub field: String,
    pub problem: String,
}

fn err(field: impl Into<String>, problem: impl Into<String>) -> SpecError {
    SpecError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// A spec a worker executes.
#[derive(Debug, Clone, PartialEq)]
pub struct Spec {
    pub pool: String,
    pub timeout: Option<Duration>,
    pub executor: Executor,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Executor {
    Shell(ShellSpec),
    Http(HttpSpec),
}

/// A value written in the spec or read from a secret on the worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Text {
    Plain(String),
    Secret(String),
}

#[derive(Debug, Clone, PartialEq)]
pub struct ShellSpec {
    /// argv; `command[0]` is run directly (no shell unless it is one).
    pub command: Vec<String>,
    pub env: Vec<(String, Text)>,
    pub cwd: Option<PathBuf>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct HttpSpec {
    pub method: String,
    pub url: http::Uri,
    pub headers: Vec<(String, Text)>,
    pub body: Option<String>,
}

impl Spec {
    /// The secrets the spec refers to, in order, without repeats.
    pub fn secrets(&self) -> Vec<&str> {
        let values: Vec<&Text> = match &self.executor {
            Executor::Shell(s) => s.env.iter().map(|(_, v)| v).collect(),
            Executor::Http(h) => h.headers.iter().map(|(_, v)| v).collect(),
        };
        let mut out: Vec<&str> = Vec::new();
        for v in values {
            if let Text::Secret(name) = v {
                if !out.contains(&name.as_str()) {
                    out.push(name);
                }
            }
        }
        out
    }
}

/// Checks `text`; `Ok(None)`: a valid spec without an executor (an external dispatcher's).
pub fn parse(text: &str) -> Result<Option<Spec>, SpecError> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| err("(document)", format!("must be a JSON object ({e})")))?;
    let Value::Object(obj) = value else {
        return Err(err("(document)", "must be a JSON object"));
    };
    let pool = match obj.get("pool") {
        None => "default".to_string(),
        Some(v) => matching(v, "pool", POOL_PATTERN)?,
    };
    integer(&obj, "max_attempts", 1, 100)?;
    integer(&obj, "retry_backoff_ms", 0, 86_400_000)?;
    let Some(executor) = obj.get("executor") else {
        return Ok(None);
    };
    let timeout = match obj.get("timeout") {
        None => None,
        Some(v) => Some(duration(v, "timeout")?),
    };
    let common = [
        "executor",
        "pool",
        "max_attempts",
        "retry_backoff_ms",
        "timeout",
    ];
    let (executor, own): (Executor, &[&str]) = match executor.as_str() {
        Some("shell") => (Executor::Shell(shell(&obj)?), &["command", "env", "cwd"]),
        Some("http") => (
            Executor::Http(http_spec(&obj)?),
            &["method", "url", "headers", "body"],
        ),
        _ => {
            return Err(err(
                "executor",
                format!("must be one of {}", EXECUTORS.join(", ")),
            ))
        }
    };
    if let Some(k) = obj
        .keys()
        .find(|k| !common.contains(&k.as_str()) && !own.contains(&k.as_str()))
    {
        return Err(err(
            k.clone(),
            format!(
                "is not a key of a {} spec (keys: {}, {})",
                executor_name(&executor),
                common.join(", "),
                own.join(", ")
            ),
        ));
    }
    Ok(Some(Spec {
        pool,
        timeout,
        executor,
    }))
}

fn executor_name(e: &Executor) -> &'static str {
    match e {
        Executor::Shell(_) => "shell",
        Executor::Http(_) => "http",
    }
}

fn shell(obj: &Map<String, Value>) -> Result<ShellSpec, SpecError> {
    let command = match obj.get("command") {
        Some(Value::Array(items)) if !items.is_empty() && items.len() <= 1024 => items
            .iter()
            .map(|v| match v.as_str() {
                Some(s) if !s.contains('\0') => Ok(s.to_string()),
                _ => Err(err("command", "every element must be a string without NUL")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        None => {
            return Err(err(
                "command",
                "is required: an argv array such as [\"/usr/local/bin/backup\", \"--full\"]",
            ))
        }
        _ => {
            return Err(err(
                "command",
                "must be a non-empty array of strings (argv, at most 1024)",
            ))
        }
    };
    if command[0].is_empty() {
        return Err(err(
            "command",
            "its first element (the program) must not be empty",
        ));
    }
    let env = match obj.get("env") {
        None => Vec::new(),
        Some(Value::Object(m)) => {
            let re = regex::Regex::new(ENV_NAME_PATTERN).expect("valid regex");
            let mut out = Vec::with_capacity(m.len());
            for (k, v) in m {
                let field = format!("env.{k}");
                if !re.is_match(k) {
                    return Err(err(
                        field,
                        format!("the name must match {ENV_NAME_PATTERN}"),
                    ));
                }
                if k.starts_with("QLSCHED_") {
                    return Err(err(field, "QLSCHED_* variables are set by the worker"));
                }
                out.push((k.clone(), text(v, &field)?));
            }
            out
        }
        Some(_) => {
            return Err(err(
                "env",
                "must be an object of NAME: \"value\" or {\"secret\": \"NAME\"}",
            ))
        }
    };
    let cwd = match obj.get("cwd") {
        None => None,
        Some(Value::String(s)) if s.starts_with('/') && !s.contains('\0') => Some(PathBuf::from(s)),
        Some(_) => return Err(err("cwd", "must be an absolute path")),
    };
    Ok(ShellSpec { command, env, cwd })
}

fn http_spec(obj: &Map<String, Value>) -> Result<HttpSpec, SpecError> {
    let method = match obj.get("method") {
        None => "POST".to_string(),
        Some(Value::String(m)) if HTTP_METHODS.contains(&m.to_ascii_uppercase().as_str()) => {
            m.to_ascii_uppercase()
        }
        Some(_) => {
            return Err(err(
                "method",
                format!("must be one of {}", HTTP_METHODS.join(", ")),
            ))
        }
    };
    let url = match obj.get("url") {
        Some(Value::String(u)) => u
            .parse::<http::Uri>()
            .ok()
            .filter(|u| {
                matches!(u.scheme_str(), Some("http" | "https"))
                    && u.host().is_some_and(|h| !h.is_empty())
            })
            .ok_or_else(|| {
                err(
                    "url",
                    "must be an absolute http:// or https:// URL with a host",
                )
            })?,
        None => return Err(err("url", "is required")),
        Some(_) => return Err(err("url", "must be a string")),
    };
    let headers = match obj.get("headers") {
        None => Vec::new(),
        Some(Value::Object(m)) => {
            let mut out = Vec::with_capacity(m.len());
            for (k, v) in m {
                let field = format!("headers.{k}");
                if http::header::HeaderName::from_bytes(k.as_bytes()).is_err() {
                    return Err(err(field, "is not a valid header name"));
                }
                if RESERVED_HEADERS.contains(&k.to_ascii_lowercase().as_str()) {
                    return Err(err(field, "is set by the worker"));
                }
                let t = text(v, &field)?;
                if let Text::Plain(s) = &t {
                    if http::HeaderValue::from_str(s).is_err() {
                        return Err(err(field, "is not a valid header value"));
                    }
                }
                out.push((k.clone(), t));
            }
            out
        }
        Some(_) => {
            return Err(err(
                "headers",
                "must be an object of name: \"value\" or {\"secret\": \"NAME\"}",
            ))
        }
    };
    let body = match obj.get("body") {
        None => None,
        Some(Value::String(s)) if s.len() <= BODY_MAX => Some(s.clone()),
        Some(Value::String(_)) => {
            return Err(err("body", format!("must be at most {BODY_MAX} bytes")))
        }
        Some(_) => return Err(err("body", "must be a string")),
    };
    Ok(HttpSpec {
        method,
        url,
        headers,
        body,
    })
}

/// `"value"` or `{"secret": "NAME"}`.
fn text(v: &Value, field: &str) -> Result<Text, SpecError> {
    match v {
        Value::String(s) if !s.contains('\0') => Ok(Text::Plain(s.clone())),
        Value::Object(m) if m.len() == 1 && m.contains_key("secret") => Ok(Text::Secret(matching(
            &m["secret"],
            &format!("{field}.secret"),
            SECRET_PATTERN,
        )?)),
        _ => Err(err(field, "must be a string or {\"secret\": \"NAME\"}")),
    }
}

fn matching(v: &Value, field: &str, pattern: &str) -> Result<String, SpecError> {
    let re = regex::Regex::new(pattern).expect("valid regex");
    match v.as_str() {
        Some(s) if re.is_match(s) => Ok(s.to_string()),
        _ => Err(err(field, format!("must be a string matching {pattern}"))),
    }
}

fn integer(obj: &Map<String, Value>, key: &str, lo: i64, hi: i64) -> Result<(), SpecError> {
    match obj.get(key) {
        None => Ok(()),
        Some(v) if v.as_i64().is_some_and(|n| (lo..=hi).contains(&n)) => Ok(()),
        Some(_) => Err(err(key, format!("must be an integer within {lo}..={hi}"))),
    }
}

fn duration(v: &Value, field: &str) -> Result<Duration, SpecError> {
    let bound = format!(
        "must be a duration within {}..={} such as \"90s\", \"10m\", \"2h\"",
        crate::config::format_duration(TIMEOUT_MIN),
        crate::config::format_duration(TIMEOUT_MAX)
    );
    let s = v.as_str().ok_or_else(|| err(field, bound.clone()))?;
    match crate::config::parse_duration(s) {
        Ok(d) if (TIMEOUT_MIN..=TIMEOUT_MAX).contains(&d) => Ok(d),
        _ => Err(err(field, bound)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(text: &str) -> String {
        parse(text).unwrap_err().field
    }

    #[test]
    fn the_example_shell_spec_parses() {
        let s = parse(r#"{"executor": "shell", "command": ["/usr/local/bin/backup", "--full"], "timeout": "10m", "max_attempts": 2, "pool": "backups"}"#)
            .unwrap()
            .unwrap();
        assert_eq!(s.pool, "backups");
        assert_eq!(s.timeout, Some(Duration::from_secs(600)));
        let Executor::Shell(sh) = s.executor else {
            panic!("shell")
        };
        assert_eq!(sh.command, vec!["/usr/local/bin/backup", "--full"]);
    }

    #[test]
    fn a_spec_without_executor_is_valid_and_not_the_workers() {
        assert_eq!(parse(r#"{"image": "demo", "pool": "p"}"#), Ok(None));
        assert_eq!(
            field(r#"{"image": "demo", "max_attempts": 0}"#),
            "max_attempts"
        );
    }

    #[test]
    fn bad_fields_are_named() {
        assert_eq!(field("[1]"), "(document)");
        assert_eq!(field(r#"{"executor": "ftp"}"#), "executor");
        assert_eq!(
            field(r#"{"executor": "shell", "command": "ls"}"#),
            "command"
        );
        assert_eq!(
            field(r#"{"executor": "shell", "command": ["ls"], "timout": "1m"}"#),
            "timout"
        );
        assert_eq!(
            field(r#"{"executor": "shell", "command": ["ls"], "timeout": "0s"}"#),
            "timeout"
        );
        assert_eq!(
            field(r#"{"executor": "shell", "command": ["ls"], "env": {"QLSCHED_X": "1"}}"#),
            "env.QLSCHED_X"
        );
        assert_eq!(
            field(r#"{"executor": "shell", "command": ["ls"], "env": {"T": {"secret": "../x"}}}"#),
            "env.T.secret"
        );
        assert_eq!(field(r#"{"executor": "http", "url": "ftp://x/"}"#), "url");
        assert_eq!(
            field(
                r#"{"executor": "http", "url": "https://x/", "headers": {"Idempotency-Key": "k"}}"#
            ),
            "headers.Idempotency-Key"
        );
        assert_eq!(
            field(r#"{"executor": "http", "url": "https://x/", "command": ["ls"]}"#),
            "command"
        );
    }

    #[test]
    fn secrets_are_listed_once() {
        let s = parse(r#"{"executor": "http", "url": "https://x/", "headers": {"A": {"secret": "t"}, "B": {"secret": "t"}, "C": "c"}}"#)
            .unwrap()
            .unwrap();
        assert_eq!(s.secrets(), vec!["t"]);
    }
}
