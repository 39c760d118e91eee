//! Documentation that states a default, a bound or a behaviour agrees with the code that has
//! it. Each setting is documented once, in the comments of `config/default.toml`, and
//! docs/settings.md is rendered from them: these tests hold the comments to the keys the
//! configuration accepts, to the bounds it enforces and to the values the file sets, and the
//! page to the comments. Facts still written twice are checked here too: the commented-out
//! defaults of the example replica files, the systemd unit's comment on the stop timings, and
//! the metrics help on what sends notifications.

use std::collections::BTreeSet;

use qlsched::config::reference;
use regex::Regex;

const SETTINGS_PAGE: &str = include_str!("../../docs/settings.md");
const UNIT: &str = include_str!("../../config/systemd/qlsched@.service");
const REPLICA_FILES: [(&str, &str); 3] = [
    (
        "replica-a.toml",
        include_str!("../../config/replica-a.toml"),
    ),
    (
        "replica-b.toml",
        include_str!("../../config/replica-b.toml"),
    ),
    (
        "replica-c.toml",
        include_str!("../../config/replica-c.toml"),
    ),
];

#[test]
fn the_settings_page_is_rendered_from_the_current_defaults() {
    assert!(
        SETTINGS_PAGE == reference::markdown(),
        "docs/settings.md is stale: run `cargo run --example settings-doc` and commit it"
    );
}

#[test]
fn every_accepted_setting_is_documented_in_the_defaults_file_and_nothing_else_is() {
    let accepted: BTreeSet<String> = reference::accepted_keys().into_iter().collect();
    assert!(accepted.len() >= 30, "{accepted:?}");
    let documented: BTreeSet<String> = reference::sections()
        .into_iter()
        .flat_map(|s| s.settings)
        .flat_map(|s| s.keys)
        .collect();
    let undocumented: Vec<_> = accepted.difference(&documented).collect();
    assert!(
        undocumented.is_empty(),
        "accepted by the configuration but without a `# key: …` comment in config/default.toml: \
         {undocumented:?}"
    );
    let unknown: Vec<_> = documented.difference(&accepted).collect();
    assert!(
        unknown.is_empty(),
        "documented in config/default.toml but refused by the configuration: {unknown:?}"
    );
}

/// `5s`, `100ms`, `1d`, `64` → a comparable number (milliseconds for durations).
fn magnitude(number: &str, unit: Option<&str>) -> u128 {
    let n: u128 = number.parse().unwrap();
    n * match unit {
        None => 1,
        Some("ms") => 1,
        Some("s") => 1_000,
        Some("m") => 60_000,
        Some("h") => 3_600_000,
        Some("d") => 86_400_000,
        Some(other) => panic!("unit {other}"),
    }
}

/// Every `lo..=hi` range written in `text`, as magnitudes.
fn ranges(text: &str) -> Vec<(u128, u128)> {
    let re = Regex::new(r"(\d+)(ms|s|m|h|d)?\.\.=(\d+)(ms|s|m|h|d)?").unwrap();
    re.captures_iter(text)
        .map(|c| {
            let unit = |i: usize| c.get(i).map(|m| m.as_str());
            (magnitude(&c[1], unit(2)), magnitude(&c[3], unit(4)))
        })
        .collect()
}

/// The bound the configuration enforces on `key`, as the problem it reports for a value far
/// out of range names it (`must be within 1s..=300s`); `None` for a key without a range.
fn enforced_range(dir: &std::path::Path, key: &str) -> Option<(u128, u128)> {
    let (section, name) = key.split_once('.').unwrap();
    for value in ["99999999", "\"9999d\""] {
        let path = dir.join("replica.toml");
        let err = if section == "worker" {
            std::fs::write(&path, format!("[worker]\nid = \"w\"\n{name} = {value}\n")).unwrap();
            qlsched::config::worker::WorkerFileConfig::load_with_env(&path, []).err()
        } else {
            std::fs::write(
                &path,
                format!("[replica]\nid = \"a\"\n[{section}]\n{name} = {value}\n"),
            )
            .unwrap();
            qlsched::config::Config::load_with_env(&path, []).err()
        };
        let Some(err) = err else {
            continue;
        };
        let bound = err
            .problems()
            .iter()
            .filter(|p| p.key == key)
            .find_map(|p| p.bound.strip_prefix("must be within "));
        if let Some(bound) = bound {
            return ranges(bound).first().copied();
        }
    }
    None
}

#[test]
fn the_defaults_file_states_the_bound_the_configuration_enforces() {
    let dir = tempfile::tempdir().unwrap();
    let mut checked = 0;
    for section in reference::sections().iter().filter(|s| s.name != "replica") {
        for setting in &section.settings {
            for key in &setting.keys {
                let Some(range) = enforced_range(dir.path(), key) else {
                    continue;
                };
                checked += 1;
                assert!(
                    ranges(&setting.text).contains(&range),
                    "config/default.toml on `{key}` does not state the bound the configuration \
                     enforces ({range:?}): {}",
                    setting.text
                );
            }
        }
    }
    assert!(checked >= 15, "only {checked} ranges found");
}

#[test]
fn the_defaults_file_states_the_default_it_sets() {
    let said = Regex::new(r#"\bDefault:? ("[^"]*"|\[\]|\S+)"#).unwrap();
    for setting in reference::sections().into_iter().flat_map(|s| s.settings) {
        let stated = said.captures(&setting.text).map(|c| {
            c[1].trim_end_matches(['.', ',', ':'])
                .trim_matches('"')
                .to_owned()
        });
        for key in &setting.keys {
            let set = reference::default_of(key).map(|v| v.trim_matches('"').to_owned());
            match (&stated, &set) {
                (None, None) => {}
                (Some(stated), None) => assert_eq!(stated, "none", "`{key}`: {}", setting.text),
                (Some(stated), Some(set)) if stated.is_empty() => {
                    assert!(set.is_empty(), "`{key}` is {set:?}: {}", setting.text)
                }
                (Some(stated), Some(set)) => assert!(
                    set.starts_with(stated.as_str()),
                    "`{key}` is {set:?} but its comment says {stated:?}: {}",
                    setting.text
                ),
                (None, Some(set)) => {
                    panic!("`{key}` is set to {set:?} but its comment states no default")
                }
            }
        }
    }
}

/// The example replica files show the keys they leave alone commented out (`# lease = "30s"`),
/// with the value they then keep: the built-in default.
#[test]
fn the_replica_files_commented_out_keys_show_the_built_in_defaults() {
    let commented = Regex::new(r"^# ([a-z_]+) = (.+)$").unwrap();
    let mut checked = 0;
    for (file, text) in REPLICA_FILES {
        let mut section = String::new();
        for line in text.lines() {
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                section = name.to_owned();
            } else if let Some(c) = commented.captures(line) {
                let key = format!("{section}.{}", &c[1]);
                if key == "database.password_file" {
                    continue; // an example path, not a default
                }
                let set = reference::default_of(&key)
                    .unwrap_or_else(|| panic!("{file}: `{key}` has no built-in default"));
                assert_eq!(&c[2], set, "{file}: `{key}`");
                checked += 1;
            }
        }
    }
    assert!(checked >= 30, "only {checked} commented-out keys");
}

#[test]
fn the_unit_files_timing_comment_states_the_built_in_defaults() {
    for key in ["scheduler.cadence", "scheduler.drain"] {
        let re = Regex::new(&format!(r"{} \(default (\S+?)[,)]", regex::escape(key))).unwrap();
        let said = re
            .captures(UNIT)
            .unwrap_or_else(|| panic!("the unit file's comment does not give {key}'s default"));
        let set = reference::default_of(key).unwrap();
        assert_eq!(&said[1], set.trim_matches('"'), "qlsched@.service on {key}");
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
