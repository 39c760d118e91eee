//! `qlsched apply`'s plan (`--dry-run`, `--check`) and `qlsched export` through the real
//! binary: an export's plan against its own database is all unchanged (every publish
//! option); a change in the files is drift named field by field; bad files are refused
//! before connecting, naming file, line and key.

mod write;

use serde_json::Value;

use crate::helpers::cli::{ok, ql, refused, stdout};
use crate::helpers::TestDb;

/// A project, a task with a full shell spec, and triggers using every publish option; one
/// disabled by an operator, one deleted.
fn seed(db: &TestDb) {
    ok(ql(db, &["project", "set", "--id", "pay"]));
    let spec = r#"{"executor": "shell", "command": ["sh", "-c", "echo $X"], "env": {"X": "1"}, "max_attempts": 3}"#;
    ok(ql(
        db,
        &[
            "task",
            "publish",
            "--project",
            "pay",
            "--id",
            "report",
            "--spec",
            spec,
        ],
    ));
    ok(ql(
        db,
        &[
            "trigger",
            "publish",
            "--id",
            "nightly",
            "--project",
            "pay",
            "--task",
            "report",
            "--cron",
            "30 2 * * *",
            "--tz",
            "Europe/Berlin",
            "--misfire",
            "fire_once",
            "--grace-ms",
            "5000",
        ],
    ));
    ok(ql(
        db,
        &[
            "trigger",
            "publish",
            "--id",
            "held",
            "--project",
            "pay",
            "--task",
            "report",
            "--cron",
            "*/5 * * * *",
            "--disabled",
        ],
    ));
    publish_hourly(db, "paused");
    ok(ql(
        db,
        &["trigger", "disable", "paused", "--note", "incident"],
    ));
    ok(ql(
        db,
        &[
            "trigger",
            "publish",
            "--id",
            "gone",
            "--project",
            "pay",
            "--task",
            "report",
            "--cron",
            "0 * * * *",
        ],
    ));
    ok(ql(db, &["trigger", "delete", "gone"]));
}

/// `qlsched trigger publish` of an hourly trigger `id` of project pay and task report (a
/// trigger no apply labelled).
fn publish_hourly(db: &TestDb, id: &str) {
    ok(ql(
        db,
        &[
            "trigger",
            "publish",
            "--id",
            id,
            "--project",
            "pay",
            "--task",
            "report",
            "--cron",
            "0 * * * *",
        ],
    ));
}

fn write(dir: &std::path::Path, name: &str, text: &str) -> String {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p.display().to_string()
}

fn ops(plan: &Value) -> Vec<String> {
    plan["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{} {} {}",
                i["op"].as_str().unwrap(),
                i["kind"].as_str().unwrap(),
                i["id"].as_str().unwrap()
            )
        })
        .collect()
}

#[tokio::test]
async fn an_export_applied_to_its_own_database_changes_nothing() {
    let db = TestDb::new().await;
    seed(&db);
    let dir = tempdir();
    let exported = ok(ql(&db, &["export"]));
    assert!(
        !exported.contains("\"gone\""),
        "a deleted trigger is not exported:\n{exported}"
    );
    let f = write(&dir, "all.toml", &exported);
    let plan: Value =
        serde_json::from_str(&ok(ql(&db, &["apply", "-f", &f, "--check", "--json"]))).unwrap();
    assert_eq!(
        ops(&plan),
        [
            "unchanged project pay",
            "unchanged task report",
            "unchanged trigger held",
            "unchanged trigger nightly",
            "unchanged trigger paused",
        ],
        "{exported}"
    );
    // The operator's disable is reported, not drift.
    let paused = &plan["items"][4];
    assert!(
        paused["note"]
            .as_str()
            .unwrap()
            .contains("disabled by an operator"),
        "{paused}"
    );
    // --project: one project's definitions.
    let none = ok(ql(&db, &["export", "--project", "other"]));
    assert!(!none.contains("nightly"), "{none}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_changed_file_is_drift_named_field_by_field_and_check_exits_5() {
    let db = TestDb::new().await;
    seed(&db);
    let dir = tempdir();
    let exported = ok(ql(&db, &["export"]));
    let changed = exported.replace("cron = \"30 2 * * *\"", "cron = \"45 2 * * *\"")
        + "\n[[trigger]]\nid = \"gone\"\nproject = \"pay\"\ntask = \"report\"\ncron = \"0 * * * *\"\n"
        + "\n[[trigger]]\nid = \"fresh\"\nproject = \"pay\"\ntask = \"report\"\ncron = \"0 * * * *\"\n";
    let f = write(&dir, "all.toml", &changed);
    let out = ql(&db, &["apply", "-f", &f, "--check"]);
    assert_eq!(out.status.code(), Some(5), "{}", stdout(&out));
    let text = stdout(&out);
    assert!(
        text.contains("update trigger nightly: cron: \"30 2 * * *\" → \"45 2 * * *\""),
        "{text}"
    );
    assert!(text.contains("create trigger fresh"), "{text}");
    assert!(
        text.contains("refused trigger gone") && text.contains("never reused"),
        "{text}"
    );
    assert!(
        text.contains(
            "plan: 1 to create, 1 to update, 0 to delete, 4 unchanged, 0 absent, 1 refused"
        ),
        "{text}"
    );
    // --dry-run prints the same plan and exits 0; nothing was written.
    ok(ql(&db, &["apply", "-f", &f, "--dry-run"]));
    let again = ok(ql(&db, &["export"]));
    assert_eq!(again, exported, "a plan writes nothing");
    // A file without the trigger reports it absent (left as it is).
    let fewer = exported.replace("id = \"held\"", "id = \"held2\"");
    let f2 = write(&dir, "fewer.toml", &fewer);
    let text = stdout(&ql(&db, &["apply", "-f", &f2, "--dry-run"]));
    assert!(
        text.contains("absent (not in the files; left as it is) trigger held"),
        "{text}"
    );
    // Applying it is refused as a whole (the deleted id), naming the way out.
    refused(
        ql(&db, &["apply", "-f", &f]),
        2,
        &["1 item(s) of the plan refused", "nothing was written"],
    );
    assert_eq!(
        ok(ql(&db, &["export"])),
        exported,
        "a refused apply writes nothing"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_bad_file_is_refused_before_connecting_naming_file_line_and_key() {
    let db = TestDb::new().await;
    let dir = tempdir();
    let a = write(&dir, "a.toml", "source = \"t\"\n\n[[trigger]]\nid = \"x\"\nproject = \"p\"\ntask = \"k\"\ncron = \"* * * * *\"\n\n[[trigger]]\nid = \"y\"\nproject = \"p\"\ntask = \"k\"\ncron = \"99 * * * *\"\n");
    let b = write(&dir, "b.toml", "source = \"t\"\n\n[[trigger]]\nid = \"x\"\nproject = \"p\"\ntask = \"k\"\ncron = \"* * * * *\"\n");
    let mut cmd = crate::helpers::cli::command(&db, &["apply", "-f", &a, "-f", &b, "--check"]);
    cmd.env(
        "QLSCHED_DSN",
        "host=192.0.2.1 connect_timeout=1 user=nobody dbname=none",
    );
    let err = refused(
        cmd.output().unwrap(),
        2,
        &["2 problem(s)", "nothing was written"],
    );
    assert!(
        err.contains("a.toml:13: trigger.cron: cron field 1 (minute) `99`"),
        "{err}"
    );
    assert!(
        err.contains("b.toml:3: trigger.id: trigger `x` is defined twice: here and at"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn tempdir() -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("qlsched-apply-it-{}", uuid::Uuid::new_v4()));
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `seed`, and a trigger published with every timing and policy option of `trigger publish`.
fn seed_tuned(db: &TestDb) {
    seed(db);
    ok(ql(
        db,
        &[
            "trigger",
            "publish",
            "--id",
            "tuned",
            "--project",
            "pay",
            "--task",
            "report",
            "--cron",
            "*/10 * * * *",
            "--jitter",
            "30s",
            "--start-at",
            "2026-01-01T00:00:00Z",
            "--end-at",
            "2099-01-01T00:00:00+00:00",
            "--pause-after-failures",
            "3",
            "--expect-success-within",
            "26h",
            "--overlap",
            "forbid",
        ],
    ));
}

#[tokio::test]
async fn every_publish_option_is_exported_and_its_export_plans_unchanged() {
    let db = TestDb::new().await;
    seed_tuned(&db);
    let dir = tempdir();
    let exported = ok(ql(&db, &["export"]));
    for line in [
        "jitter = \"30s\"",
        "start_at = \"2026-01-01T00:00:00Z\"",
        "end_at = \"2099-01-01T00:00:00Z\"",
        "pause_after_failures = 3",
        "expect_success_within = \"26h\"",
        "overlap = \"forbid\"",
    ] {
        // Only the trigger that set it writes it: the others were published without them.
        assert_eq!(exported.matches(line).count(), 1, "{line}:\n{exported}");
        let key = line.split(" = ").next().unwrap();
        assert_eq!(
            exported.matches(&format!("\n{key} = ")).count(),
            1,
            "{key}:\n{exported}"
        );
    }
    let f = write(&dir, "all.toml", &exported);
    let plan: Value =
        serde_json::from_str(&ok(ql(&db, &["apply", "-f", &f, "--check", "--json"]))).unwrap();
    assert_eq!(
        ops(&plan),
        [
            "unchanged project pay",
            "unchanged task report",
            "unchanged trigger held",
            "unchanged trigger nightly",
            "unchanged trigger paused",
            "unchanged trigger tuned",
        ],
        "{exported}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_changed_publish_option_is_drift_named_before_and_after() {
    let db = TestDb::new().await;
    seed_tuned(&db);
    let dir = tempdir();
    let exported = ok(ql(&db, &["export"]));
    let cases = [
        (
            "jitter = \"30s\"",
            "jitter = \"45s\"",
            "jitter: \"30s\" → \"45s\"",
        ),
        ("jitter = \"30s\"\n", "", "jitter: \"30s\" → null"),
        (
            "start_at = \"2026-01-01T00:00:00Z\"",
            "start_at = \"2026-02-01T01:00:00+01:00\"",
            "start_at: \"2026-01-01T00:00:00Z\" → \"2026-02-01T00:00:00Z\"",
        ),
        (
            "end_at = \"2099-01-01T00:00:00Z\"",
            "end_at = \"2098-01-01T00:00:00Z\"",
            "end_at: \"2099-01-01T00:00:00Z\" → \"2098-01-01T00:00:00Z\"",
        ),
        (
            "pause_after_failures = 3",
            "pause_after_failures = 5",
            "pause_after_failures: 3 → 5",
        ),
        (
            "expect_success_within = \"26h\"",
            "expect_success_within = \"2d\"",
            "expect_success_within: \"26h\" → \"2d\"",
        ),
        (
            "overlap = \"forbid\"",
            "overlap = \"replace\"",
            "overlap: \"forbid\" → \"replace\"",
        ),
    ];
    for (from, to, shown) in cases {
        assert!(exported.contains(from), "{from}:\n{exported}");
        let f = write(&dir, "changed.toml", &exported.replacen(from, to, 1));
        let out = ql(&db, &["apply", "-f", &f, "--check"]);
        let text = stdout(&out);
        assert_eq!(out.status.code(), Some(5), "{from}: {text}");
        assert!(
            text.contains(&format!("update trigger tuned: {shown}\n")),
            "{from}: {text}"
        );
        assert!(
            text.contains("plan: 0 to create, 1 to update, 0 to delete, 5 unchanged"),
            "{from}: {text}"
        );
    }
    // An option written at its default is no change from one never set.
    let defaults = exported.replace(
        "id = \"nightly\"",
        "id = \"nightly\"\njitter = \"0s\"\noverlap = \"allow\"",
    );
    let f = write(&dir, "defaults.toml", &defaults);
    ok(ql(&db, &["apply", "-f", &f, "--check"]));
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn a_bad_publish_option_is_refused_naming_file_line_and_key() {
    let db = TestDb::new().await;
    let dir = tempdir();
    let f = write(
        &dir,
        "o.toml",
        "source = \"t\"\n\n[[trigger]]\nid = \"x\"\nproject = \"p\"\ntask = \"k\"\ncron = \"*/10 * * * *\"\n\
         jitter = \"10m\"\nstart_at = \"soon\"\npause_after_failures = 0\n\
         expect_success_within = \"30s\"\noverlap = \"queue\"\n\n\
         [[trigger]]\nid = \"y\"\nproject = \"p\"\ntask = \"k\"\ncron = \"* * * * *\"\n\
         start_at = \"2030-01-01T00:00:00Z\"\nend_at = \"2029-01-01T00:00:00Z\"\njitter = \"2d\"\n",
    );
    let err = refused(
        ql(&db, &["apply", "-f", &f, "--check"]),
        2,
        &["nothing was written"],
    );
    for want in [
        "o.toml:9: trigger.start_at: `soon`: not an RFC 3339 time",
        "o.toml:10: trigger.pause_after_failures: 0: must be within 1..=1000",
        "o.toml:11: trigger.expect_success_within: `30s`: 30000 ms must be within 1 minute..=366 days",
        "o.toml:12: trigger.overlap: `queue`: unknown overlap policy",
        "o.toml:21: trigger.jitter: `2d`: 172800000 ms must be within 0..=86400000",
    ] {
        assert!(err.contains(want), "{want}:\n{err}");
    }
    // With its other options refused the jitter of x is not checked against the schedule;
    // alone, it is: 10m is not shorter than the 10-minute gap.
    let g = write(
        &dir,
        "g.toml",
        "source = \"t\"\n\n[[trigger]]\nid = \"x\"\nproject = \"p\"\ntask = \"k\"\ncron = \"*/10 * * * *\"\njitter = \"10m\"\n\n\
         [[trigger]]\nid = \"y\"\nproject = \"p\"\ntask = \"k\"\ncron = \"* * * * *\"\n\
         start_at = \"2030-01-01T00:00:00Z\"\nend_at = \"2029-01-01T00:00:00Z\"\n",
    );
    let err = refused(
        ql(&db, &["apply", "-f", &g, "--check"]),
        2,
        &["2 problem(s)"],
    );
    for want in [
        "g.toml:8: trigger.jitter: `10m`: 600000 ms must be shorter than the shortest gap",
        "g.toml:16: trigger.end_at: ",
        "after its start",
    ] {
        assert!(err.contains(want), "{want}:\n{err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}
