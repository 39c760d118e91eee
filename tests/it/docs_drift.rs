//! Documentation that states a default or a behaviour agrees with the code that has it: the
//! settings tables of docs/design.md and the README and the systemd unit's comment against
//! the built-in `config/default.toml`, and the metrics help against what sends notifications.

use std::collections::BTreeMap;

const DESIGN: &str = include_str!("../../docs/design.md");
const README: &str = include_str!("../../README.md");
const UNIT: &str = include_str!("../../config/systemd/qlsched@.service");

/// `section.key` → value as written in `config/default.toml` (strings unquoted).
fn defaults() -> BTreeMap<String, String> {
    let t: toml::Table = qlsched::config::DEFAULT_TOML.parse().unwrap();
    let mut out = BTreeMap::new();
    for (section, keys) in t {
        for (key, v) in keys.as_table().into_iter().flatten() {
            let v = match v {
                toml::Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            out.insert(format!("{section}.{key}"), v);
        }
    }
    out
}

/// The `| `key` | default | …` rows of the first table after `heading`: key → default, with
/// backticks and spaces removed (`5 s` and `5s` compare equal).
fn table(doc: &str, heading: &str) -> BTreeMap<String, String> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no `{heading}`"));
    doc[start..]
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let key = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            let default: String = cells
                .get(2)?
                .chars()
                .filter(|c| *c != '`' && *c != ' ')
                .collect();
            Some((key.to_string(), default))
        })
        .collect()
}

fn squeeze(s: &str) -> String {
    s.chars().filter(|c| *c != ' ').collect()
}

#[test]
fn design_md_settings_table_has_every_timing_setting_with_the_built_in_default() {
    let defaults = defaults();
    let rows = table(DESIGN, "## What each setting bounds");
    let wanted = defaults.keys().filter(|k| {
        k.starts_with("scheduler.")
            || k.starts_with("metrics.")
            || *k == "database.pool_size"
            || *k == "database.connect_timeout"
    });
    for key in wanted {
        let doc = rows
            .get(key)
            .unwrap_or_else(|| panic!("docs/design.md's settings table lacks `{key}`"));
        assert_eq!(
            *doc,
            squeeze(&defaults[key]),
            "docs/design.md says `{key}` defaults to {doc}; config/default.toml says {}",
            defaults[key]
        );
    }
}

#[test]
fn readme_settings_table_states_the_built_in_defaults() {
    let defaults = defaults();
    let rows = table(README, "| key | default | bound |");
    assert!(rows.len() >= 15, "{rows:?}");
    for (key, value) in &defaults {
        let doc = rows
            .get(key)
            .unwrap_or_else(|| panic!("the README's settings table lacks `{key}`"));
        let want = if value.is_empty() {
            "none".to_string()
        } else {
            squeeze(value)
        };
        assert_eq!(*doc, want, "README: `{key}`");
    }
}

#[test]
fn the_unit_files_timing_comment_states_the_built_in_defaults() {
    let defaults = defaults();
    for key in ["scheduler.cadence", "scheduler.drain"] {
        let re =
            regex::Regex::new(&format!(r"{} \(default (\S+?)[,)]", regex::escape(key))).unwrap();
        let said = re
            .captures(UNIT)
            .unwrap_or_else(|| panic!("the unit file's comment does not give {key}'s default"));
        assert_eq!(&said[1], defaults[key], "qlsched@.service on {key}");
    }
}

/// Publishing, enabling and resuming a project notify (`store::wake::notify`); a manual fire
/// and a backfill admit their runs in the operator's own transaction and send nothing, so the
/// help of `qlsched_notifications` must not promise that they wake anything.
#[test]
fn the_notifications_help_names_what_notifies_and_not_fire() {
    let text = qlsched::metrics::Metrics::default().render();
    let help = text
        .lines()
        .find(|l| l.starts_with("# HELP qlsched_notifications"))
        .unwrap_or_else(|| panic!("no help line:\n{text}"));
    for sender in ["publish", "enable", "resume"] {
        assert!(help.contains(sender), "{help}");
    }
    for silent in ["fire", "backfill"] {
        assert!(!help.contains(silent), "{help}");
    }
}
