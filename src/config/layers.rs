//! Reading the layers (built-in defaults, the replica file, environment overrides) and
//! merging them key by key, remembering which layer wrote each key so a problem can name it.

use std::collections::HashMap;
use std::path::Path;

use super::error::{ConfigError, ConfigProblem};
use super::raw::{probe, RawConfig};

/// How problems in the embedded `config/default.toml` are attributed.
pub(super) const DEFAULTS_LABEL: &str = "default.toml (built in)";
/// Environment overrides look like `QLSCHED__SECTION__KEY=value`.
pub const ENV_PREFIX: &str = "QLSCHED__";
const PASSWORD_HINT: &str =
    "use database.password_file or the environment variable QLSCHED__DATABASE__PASSWORD";

/// One source of settings: a parsed TOML table and the name problems use for it.
pub(super) struct Layer {
    pub label: String,
    pub table: toml::Table,
    /// Only the environment may carry `database.password`.
    pub may_hold_password: bool,
}

/// The merged settings, and for each dotted key the label of the layer that last wrote it.
#[derive(Default)]
pub(super) struct Merged {
    pub table: toml::Table,
    origin: HashMap<String, String>,
}

impl Merged {
    /// The layer that wrote `key`; keys nobody wrote are blamed on `fallback`.
    pub fn origin_of(&self, key: &str, fallback: &str) -> String {
        self.origin
            .get(key)
            .cloned()
            .unwrap_or_else(|| fallback.to_owned())
    }
}

/// The settings of a file read and merged, not yet validated.
pub(super) struct Loaded {
    /// The file's label (its path as given).
    pub label: String,
    pub merged: Merged,
    pub raw: RawConfig,
    /// Problems found so far that did not stop the merge.
    pub problems: Vec<ConfigProblem>,
}

/// Reads the file at `path` and merges its layers, later wins: `defaults` (built in, each a
/// label and a text), the file, then the `QLSCHED__…` variables of `env`. `check_file` looks
/// at the file's own table before the merge. Stops with every problem so far where a layer
/// does not parse or the merged settings do not fit. Opens no network connection.
pub(super) fn load(
    path: &Path,
    defaults: &[(&str, &str)],
    check_file: impl FnOnce(&toml::Table, &str, &mut Vec<ConfigProblem>),
    env: impl IntoIterator<Item = (String, String)>,
) -> Result<Loaded, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let label = path.display().to_string();
    let mut problems = Vec::new();
    let mut all: Vec<Layer> = defaults
        .iter()
        .map(|(l, t)| parse_file(l, t, &mut problems))
        .collect();
    let file = parse_file(&label, &text, &mut problems);
    if !problems.is_empty() {
        // A file that does not parse would only add noise (every key "missing").
        return Err(ConfigError::Problems(problems));
    }
    check_file(&file.table, &label, &mut problems);
    all.push(file);
    all.extend(env_layers(env, &mut problems));
    let merged = merge(all, &mut problems);
    let raw = match toml::Value::Table(merged.table.clone()).try_into::<RawConfig>() {
        Ok(raw) => raw,
        Err(e) => {
            // Unreachable in practice: every key was checked alone while merging.
            let msg = e.message().trim().to_owned();
            problems.push(ConfigProblem::new(label, "(merged)", "(merged)", msg));
            return Err(ConfigError::Problems(problems));
        }
    };
    Ok(Loaded {
        label,
        merged,
        raw,
        problems,
    })
}

/// Parses a TOML file's text into a layer, or records one problem locating the syntax error.
pub(super) fn parse_file(label: &str, text: &str, problems: &mut Vec<ConfigProblem>) -> Layer {
    let table = match toml::from_str::<toml::Table>(text) {
        Ok(table) => table,
        Err(e) => {
            problems.push(syntax_problem(label, text, &e));
            toml::Table::new()
        }
    };
    Layer {
        label: label.to_owned(),
        table,
        may_hold_password: false,
    }
}

/// The process environment's variables whose name and value are UTF-8.
pub(super) fn process_env() -> impl Iterator<Item = (String, String)> {
    std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?)))
}

/// One layer per `QLSCHED__SECTION__KEY` variable, sorted by name so later-wins is stable.
pub(super) fn env_layers(
    env: impl IntoIterator<Item = (String, String)>,
    problems: &mut Vec<ConfigProblem>,
) -> Vec<Layer> {
    let mut vars: Vec<(String, String)> = env
        .into_iter()
        .filter(|(name, _)| name.starts_with(ENV_PREFIX))
        .collect();
    vars.sort();
    let mut layers = Vec::new();
    for (name, raw) in vars {
        let label = format!("env {name}");
        let rest = &name[ENV_PREFIX.len()..];
        let parts: Vec<String> = rest.split("__").map(str::to_ascii_lowercase).collect();
        let [section, key] = parts.as_slice() else {
            problems.push(ConfigProblem::new(
                label,
                parts.join("."),
                shown(&name.to_ascii_lowercase(), &toml::Value::String(raw)),
                "expected a variable named QLSCHED__SECTION__KEY (e.g. QLSCHED__SCHEDULER__CLAIM_BUDGET)",
            ));
            continue;
        };
        let value = env_value(section, key, raw);
        let mut inner = toml::Table::new();
        inner.insert(key.clone(), value);
        let mut table = toml::Table::new();
        table.insert(section.clone(), toml::Value::Table(inner));
        layers.push(Layer {
            label,
            table,
            may_hold_password: true,
        });
    }
    layers
}

/// The value as TOML if it parses as one and the key accepts it, else the raw string.
/// A password is always the raw string.
fn env_value(section: &str, key: &str, raw: String) -> toml::Value {
    if section == "database" && key == "password" {
        return toml::Value::String(raw);
    }
    let parsed = toml::from_str::<toml::Table>(&format!("v = {raw}"))
        .ok()
        .filter(|t| t.len() == 1)
        .and_then(|mut t| t.remove("v"));
    match parsed {
        Some(v @ toml::Value::String(_)) => v,
        Some(v) if probe(section, Some((key, &v))).is_ok() => v,
        Some(v) => {
            let as_string = toml::Value::String(raw);
            if probe(section, Some((key, &as_string))).is_ok() {
                as_string
            } else {
                v
            }
        }
        None => toml::Value::String(raw),
    }
}

/// Merges the layers in order (later wins), key by key. Every key is first checked alone
/// against the serde structs so unknown or mistyped keys are blamed on their own layer.
pub(super) fn merge(layers: Vec<Layer>, problems: &mut Vec<ConfigProblem>) -> Merged {
    let mut merged = Merged::default();
    for layer in layers {
        for (section, value) in layer.table {
            if let Err(msg) = probe(&section, None) {
                problems.push(ConfigProblem::new(
                    &layer.label,
                    &section,
                    shown(&section, &value),
                    msg,
                ));
                continue;
            }
            let toml::Value::Table(entries) = value else {
                problems.push(ConfigProblem::new(
                    &layer.label,
                    &section,
                    shown(&section, &value),
                    format!("must be a table ([{section}])"),
                ));
                continue;
            };
            for (key, value) in entries {
                let dotted = format!("{section}.{key}");
                if section == "database" && key == "password" && !layer.may_hold_password {
                    problems.push(ConfigProblem::new(
                        &layer.label,
                        dotted,
                        "***",
                        format!("a password is not accepted in a config file; {PASSWORD_HINT}"),
                    ));
                    continue;
                }
                if let Err(msg) = probe(&section, Some((&key, &value))) {
                    let value = shown(&key, &value);
                    problems.push(ConfigProblem::new(&layer.label, dotted, value, msg));
                    continue;
                }
                let slot = merged
                    .table
                    .entry(section.clone())
                    .or_insert_with(|| toml::Value::Table(toml::Table::new()));
                if let toml::Value::Table(slot) = slot {
                    slot.insert(key, value);
                }
                merged.origin.insert(dotted, layer.label.clone());
            }
        }
    }
    merged
}

/// How a value appears in a problem: strings bare, tables elided, anything password-like
/// hidden.
pub(super) fn shown(key: &str, value: &toml::Value) -> String {
    let lower = key.to_ascii_lowercase();
    if lower.contains("pass") || lower.contains("secret") {
        return "***".to_owned();
    }
    match value {
        toml::Value::String(s) => s.clone(),
        toml::Value::Table(_) => "{…}".to_owned(),
        other => other.to_string(),
    }
}

/// Names the key on the offending line when there is one; never echoes the line itself
/// (it might hold a secret).
fn syntax_problem(label: &str, text: &str, e: &toml::de::Error) -> ConfigProblem {
    let offset = e.span().map_or(0, |s| s.start).min(text.len());
    let before = &text[..offset];
    let line_no = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
    let mut section = String::new();
    for line in text.lines().take(line_no - 1) {
        let t = line.trim();
        if t.starts_with('[') {
            section = t.trim_matches(|c| c == '[' || c == ']').trim().to_owned();
        }
    }
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim())
        .filter(|k| !k.is_empty() && !k.starts_with('[') && !k.starts_with('#'))
        .map(|k| match section.as_str() {
            "" => k.to_owned(),
            s => format!("{s}.{k}"),
        })
        .unwrap_or_else(|| format!("line {line_no}"));
    ConfigProblem::new(
        label,
        key,
        format!("<invalid TOML at line {line_no}, column {column}>"),
        format!("TOML syntax error: {}", e.message().trim()),
    )
}
