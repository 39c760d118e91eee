//! The settings reference. Each setting is documented once, in the comments of
//! `config/default.toml` (a worker's `[worker]` keys in those of `config/worker-default.toml`);
//! `docs/settings.md` is rendered from them
//! (`cargo run --example settings-doc`), and a test holds the page and the comments to the
//! keys the configuration structs accept.
//!
//! The comment grammar is the file's own: a comment line `# key: text` (or
//! `# key_a, key_b: text`) opens a setting, the comment lines after it continue it until a
//! blank or value line; comment lines of a section before its first setting describe the
//! section. The default shown is the value the file sets (none for a key it leaves unset).

use std::fmt::Write as _;
use std::sync::OnceLock;

use regex::Regex;

use super::worker::WORKER_DEFAULTS;
use super::DEFAULT_TOML;

/// One documented setting (or several documented together, such as a certificate and its key).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Setting {
    /// Dotted keys, e.g. `["http.tls_cert_file", "http.tls_key_file"]`.
    pub keys: Vec<String>,
    /// The comment, its lines joined: meaning, default and bound.
    pub text: String,
}

/// A `[section]` of the file, with the prose before its first setting.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    pub name: String,
    pub prose: String,
    pub settings: Vec<Setting>,
}

/// The comments of `config/default.toml` before its first section: how the layers work.
pub fn preamble() -> String {
    DEFAULT_TOML
        .lines()
        .take_while(|l| !l.starts_with('['))
        .filter_map(|l| l.strip_prefix('#'))
        .map(str::trim)
        .collect::<Vec<_>>()
        .join(" ")
}

/// Every section of `config/default.toml` with its documented settings, in file order, then
/// the `[worker]` section of `config/worker-default.toml` (its other sections only override
/// replica defaults, documented in `config/default.toml`).
pub fn sections() -> Vec<Section> {
    let mut out = parse_sections(DEFAULT_TOML);
    out.extend(
        parse_sections(WORKER_DEFAULTS)
            .into_iter()
            .filter(|s| s.name == "worker"),
    );
    out
}

fn parse_sections(file: &str) -> Vec<Section> {
    static OPENS: OnceLock<Regex> = OnceLock::new();
    let opens = OPENS.get_or_init(|| {
        Regex::new(r"^# ([a-z_][a-z0-9_]*(?:, [a-z_][a-z0-9_]*)*): (.*)$").expect("valid regex")
    });
    let mut out: Vec<Section> = Vec::new();
    // Whether the comment lines being read continue a setting (or the section's prose).
    let mut in_setting = false;
    for line in file.lines() {
        let line = line.trim_end();
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            out.push(Section {
                name: name.to_owned(),
                prose: String::new(),
                settings: Vec::new(),
            });
            in_setting = false;
            continue;
        }
        let Some(section) = out.last_mut() else {
            continue;
        };
        if let Some(caps) = opens.captures(line) {
            let keys = caps[1]
                .split(", ")
                .map(|k| format!("{}.{k}", section.name))
                .collect();
            section.settings.push(Setting {
                keys,
                text: caps[2].trim().to_owned(),
            });
            in_setting = true;
        } else if let Some(comment) = line.strip_prefix('#') {
            let target = match (in_setting, section.settings.last_mut()) {
                (true, Some(setting)) => &mut setting.text,
                _ => &mut section.prose,
            };
            join(target, comment.trim());
        } else {
            in_setting = false;
        }
    }
    out
}

fn join(text: &mut String, more: &str) {
    if more.is_empty() {
        return;
    }
    if !text.is_empty() {
        text.push(' ');
    }
    text.push_str(more);
}

/// The value `config/default.toml` sets for `key` (`section.key`), as TOML, or for a
/// `worker.` key `config/worker-default.toml`; `None` if unset.
pub fn default_of(key: &str) -> Option<String> {
    let (section, name) = key.split_once('.')?;
    let file = if section == "worker" {
        WORKER_DEFAULTS
    } else {
        DEFAULT_TOML
    };
    let table: toml::Table = file.parse().ok()?;
    table.get(section)?.get(name).map(|v| v.to_string())
}

/// Every `section.key` the configuration accepts, as the structs every layer is checked
/// against report them (their unknown-field refusal lists the expected names).
pub fn accepted_keys() -> Vec<String> {
    let probe_key = "\u{1}unknown";
    let sections = expected(&super::raw::probe(probe_key, None));
    let mut out = Vec::new();
    for section in sections {
        let value = toml::Value::Integer(0);
        for key in expected(&super::raw::probe(&section, Some((probe_key, &value)))) {
            out.push(format!("{section}.{key}"));
        }
    }
    out
}

/// The backquoted names after "expected" in serde's unknown-field message.
fn expected(refusal: &Result<(), String>) -> Vec<String> {
    let Err(message) = refusal else {
        return Vec::new();
    };
    let Some((_, names)) = message.split_once("expected") else {
        return Vec::new();
    };
    names
        .split('`')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// `docs/settings.md`.
pub fn markdown() -> String {
    let mut page = String::from(
        "# Settings\n\n\
         <!-- Written by `cargo run --example settings-doc` from the comments of \
         config/default.toml: edit those, then run it again. -->\n\n",
    );
    let _ = writeln!(page, "{}\n", preamble());
    page.push_str(
        "Each row is the comment of `config/default.toml` on the key (of \
         `config/worker-default.toml` for `[worker]`, the section only a `qlsched worker` file \
         has); the default is the value that file sets (`—`: it sets none). \
         `qlsched check-config --config FILE` checks every bound before the database is \
         opened.\n",
    );
    for section in sections() {
        let _ = write!(page, "\n## `[{}]`\n\n", section.name);
        if !section.prose.is_empty() {
            let _ = writeln!(page, "{}\n", section.prose);
        }
        page.push_str("| key | default | meaning and bound |\n|---|---|---|\n");
        for setting in &section.settings {
            let keys: Vec<String> = setting.keys.iter().map(|k| format!("`{k}`")).collect();
            let mut defaults: Vec<String> = setting
                .keys
                .iter()
                .map(|k| default_of(k).map_or("—".to_owned(), |v| format!("`{v}`")))
                .collect();
            defaults.dedup();
            let _ = writeln!(
                page,
                "| {} | {} | {} |",
                keys.join(", "),
                defaults.join(", "),
                setting.text.replace('|', "\\|")
            );
        }
    }
    page
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_setting_opens_at_its_key_and_continues_to_its_value() {
        let sections = sections();
        let scheduler = sections.iter().find(|s| s.name == "scheduler").unwrap();
        let lease = scheduler
            .settings
            .iter()
            .find(|s| s.keys == ["scheduler.lease"])
            .unwrap();
        assert!(
            lease.text.starts_with("how long a claimed row"),
            "{lease:?}"
        );
        assert!(lease.text.ends_with("at least 3 x cadence."), "{lease:?}");
        let http = sections.iter().find(|s| s.name == "http").unwrap();
        assert!(http
            .settings
            .iter()
            .any(|s| s.keys == ["http.tls_cert_file", "http.tls_key_file"]));
        let retention = sections.iter().find(|s| s.name == "retention").unwrap();
        assert!(
            retention.prose.starts_with("Finished runs"),
            "{retention:?}"
        );
    }

    #[test]
    fn the_accepted_keys_come_from_the_structs() {
        let keys = accepted_keys();
        for key in [
            "replica.id",
            "database.password",
            "log.level",
            "http.public_names",
        ] {
            assert!(keys.iter().any(|k| k == key), "{key} in {keys:?}");
        }
        assert_eq!(default_of("scheduler.lease").as_deref(), Some("\"30s\""));
        assert_eq!(default_of("replica.id"), None);
    }
}
