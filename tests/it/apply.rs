//! `qlsched apply`'s plan (`--dry-run`, `--check`) and `qlsched export` through the real
//! binary: an export's plan against its own database is all unchanged (every publish
//! option); a change in the files is drift named field by field; bad files are refused
//! before connecting, naming file, line and key.

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
    ok(ql(
        db,
        &[
            "trigger",
            "publish",
            "--id",
            "paused",
            "--project",
            "pay",
            "--task",
            "report",
            "--cron",
            "0 * * * *",
        ],
    ));
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
        text.contains("plan: 1 to create, 1 to update, 4 unchanged, 0 absent, 1 refused"),
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
    // Applying itself is not built yet: refused, naming the flags that are.
    refused(ql(&db, &["apply", "-f", &f]), 2, &["--dry-run", "--check"]);
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
