//! The systemd unit: the keys operators rely on, and `systemd-analyze verify` when present.

use std::process::Command;

use crate::helpers::replica::binary;

const UNIT: &str = include_str!("../../../config/systemd/qlsched@.service");
const INSTALLED_BINARY: &str = "/usr/bin/qlsched";
/// The config bound on `scheduler.drain` (config/validate.rs): TimeoutStopSec must exceed it.
const MAX_DRAIN_SECS: u64 = 60;

type Sections = Vec<(String, Vec<(String, String)>)>;

#[test]
fn the_systemd_unit_has_the_required_keys_and_passes_systemd_analyze_verify() {
    let unit = parse_unit(UNIT);
    let required: &[(&str, &str, &str)] = &[
        ("Service", "Type", "notify"),
        ("Service", "NotifyAccess", "main"),
        ("Service", "WatchdogSec", "30s"),
        ("Service", "Restart", "on-failure"),
        ("Service", "RestartSec", "2s"),
        ("Service", "KillSignal", "SIGTERM"),
        (
            "Service",
            "ExecStartPre",
            "/usr/bin/qlsched check-config --config /etc/qlsched/%i.toml",
        ),
        (
            "Service",
            "ExecStart",
            "/usr/bin/qlsched run --config /etc/qlsched/%i.toml",
        ),
        (
            "Service",
            "LoadCredential",
            "db-password:/etc/qlsched/%i.password",
        ),
        ("Service", "User", "qlsched"),
        ("Service", "Group", "qlsched"),
        ("Service", "NoNewPrivileges", "yes"),
        ("Service", "ProtectSystem", "strict"),
        ("Service", "ProtectHome", "yes"),
        ("Service", "PrivateTmp", "yes"),
        ("Service", "PrivateDevices", "yes"),
        ("Service", "ProtectKernelTunables", "yes"),
        ("Service", "ProtectKernelModules", "yes"),
        ("Service", "ProtectControlGroups", "yes"),
        (
            "Service",
            "RestrictAddressFamilies",
            "AF_INET AF_INET6 AF_UNIX",
        ),
        ("Service", "LockPersonality", "yes"),
        ("Service", "MemoryDenyWriteExecute", "yes"),
        ("Service", "RestrictRealtime", "yes"),
        ("Service", "SystemCallArchitectures", "native"),
        ("Service", "CapabilityBoundingSet", ""),
        ("Install", "WantedBy", "multi-user.target"),
    ];
    for (section, key, want) in required {
        let got = unit_values(&unit, section, key);
        assert!(
            got.contains(&want.to_string()),
            "[{section}] {key}={want} missing; the unit has {got:?}"
        );
    }
    let stop = unit_values(&unit, "Service", "TimeoutStopSec");
    let stop_secs: u64 = stop
        .first()
        .and_then(|v| v.strip_suffix('s')?.parse().ok())
        .unwrap_or_else(|| panic!("TimeoutStopSec must be whole seconds, got {stop:?}"));
    assert!(
        stop_secs > MAX_DRAIN_SECS,
        "TimeoutStopSec={stop_secs}s must exceed the largest scheduler.drain ({MAX_DRAIN_SECS}s)"
    );

    match systemd_analyze_verify() {
        Some(out) => println!("systemd-analyze verify: clean\n{out}"),
        None => println!("systemd-analyze not installed: checked the unit's syntax and keys only"),
    }
}

/// Sections of `Key=Value` lines in order; panics on any line that is neither a comment, a
/// `[Section]` header nor an assignment inside a section.
fn parse_unit(text: &str) -> Sections {
    let mut sections: Sections = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        assert!(!line.ends_with('\\'), "line {}: no continuations", n + 1);
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            sections.push((name.to_string(), Vec::new()));
            continue;
        }
        let (key, value) = line
            .split_once('=')
            .unwrap_or_else(|| panic!("line {}: not Key=Value: {line}", n + 1));
        assert!(
            !key.is_empty() && key.chars().all(|c| c.is_ascii_alphanumeric()),
            "line {}: bad key {key:?}",
            n + 1
        );
        let (_, keys) = sections
            .last_mut()
            .unwrap_or_else(|| panic!("line {}: assignment before any [Section]", n + 1));
        keys.push((key.to_string(), value.trim().to_string()));
    }
    let names: Vec<&str> = sections.iter().map(|(s, _)| s.as_str()).collect();
    assert_eq!(
        names,
        ["Unit", "Service", "Install"],
        "sections of the unit"
    );
    sections
}

fn unit_values(unit: &Sections, section: &str, key: &str) -> Vec<String> {
    unit.iter()
        .filter(|(s, _)| s == section)
        .flat_map(|(_, keys)| keys.iter().filter(|(k, _)| k == key))
        .map(|(_, v)| v.clone())
        .collect()
}

/// Runs `systemd-analyze verify` on an instance of a copy of the unit whose commands point at
/// the binary under test (verify checks that they are executable). None: tool not installed.
fn systemd_analyze_verify() -> Option<String> {
    let dir = tempfile::tempdir().unwrap();
    let unit_path = dir.path().join("qlsched@.service");
    std::fs::write(
        &unit_path,
        UNIT.replace(INSTALLED_BINARY, binary().to_str().unwrap()),
    )
    .unwrap();
    let out = match Command::new("systemd-analyze")
        .arg("verify")
        .arg(dir.path().join("qlsched@a.service"))
        .output()
    {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        other => other.expect("run systemd-analyze"),
    };
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let ours = format!("{}:", unit_path.display());
    for line in text.lines() {
        assert!(
            !line.contains("Unknown key")
                && !line.contains("Unknown section")
                && !line.starts_with(&ours),
            "systemd-analyze verify complains about the unit: {line}\n{text}"
        );
    }
    assert!(
        out.status.success(),
        "systemd-analyze verify failed:\n{text}"
    );
    Some(text)
}

/// The unit's exposure as `systemd-analyze security --offline=true` scores it: at most 1.5
/// (0 = locked down, 10 = fully exposed). The tool is required (Debian package `systemd`;
/// scripts/test.sh installs it): without it the test fails naming the package.
#[test]
fn the_units_exposure_in_systemd_analyze_security_is_at_most_1_5() {
    let dir = tempfile::tempdir().unwrap();
    let unit_path = dir.path().join("qlsched@.service");
    std::fs::write(&unit_path, UNIT).unwrap();
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=true", "--no-pager"])
        .arg(&unit_path)
        .current_dir(dir.path())
        .output()
        .unwrap_or_else(|e| {
            panic!("systemd-analyze cannot run ({e}): install the Debian package systemd")
        });
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let exposure: f64 = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for ").nth(1))
        .and_then(|rest| rest.split(": ").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure in:\n{text}"));
    let open: Vec<&str> = text.lines().filter(|l| l.starts_with('✗')).collect();
    println!("exposure {exposure}; still open:\n{}", open.join("\n"));
    assert!(
        exposure <= 1.5,
        "systemd-analyze security scores qlsched@.service {exposure} (at most 1.5); open:\n{}",
        open.join("\n")
    );
}
