//! `qlsched apply` writing its plan through the real binary: one transaction, an identical
//! definition a no-op (no revision, no fence), operator disables and system pauses left
//! alone, audit rows of source `apply`, nothing written on bad input, ownership by source
//! label (`--prune`, `--adopt`, `--max-delete`, `export --source`) and the apply lock.

use std::time::Duration;

use super::{publish_hourly, seed, tempdir, write};
use crate::helpers::cli::{command, json, ok, ql, refused, stderr, stdout};
use crate::helpers::{wait_until, TestDb};

const HEAD: &str = "[[project]]\nid = \"pay\"\n\n[[task]]\nid = \"report\"\nproject = \"pay\"\n\
                    spec = { executor = \"shell\", command = [\"true\"] }\n";

fn trigger(id: &str, cron: &str) -> String {
    format!(
        "\n[[trigger]]\nid = \"{id}\"\nproject = \"pay\"\ntask = \"report\"\ncron = \"{cron}\"\n"
    )
}

/// A definition file of `source` with the project, the task and `triggers`.
fn file(source: &str, triggers: &[(&str, &str)]) -> String {
    let mut f = format!("source = \"{source}\"\n\n{HEAD}");
    for (id, cron) in triggers {
        f.push_str(&trigger(id, cron));
    }
    f
}

/// (trigger, revision, state_version, claim_version, enabled, source_label), by id.
async fn versions(db: &TestDb) -> Vec<(String, i64, i64, i64, bool, Option<String>)> {
    db.superuser()
        .await
        .query(
            "SELECT t.trigger_id, t.revision, s.state_version, s.claim_version, t.enabled,
                    t.source_label
               FROM qlsched.triggers t JOIN qlsched.trigger_schedules s USING (trigger_id)
              ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect()
}

#[tokio::test]
async fn apply_writes_the_plan_and_an_identical_apply_changes_nothing() {
    let db = TestDb::new().await;
    let dir = tempdir();
    let f = write(
        &dir,
        "a.toml",
        &file(
            "team/a",
            &[("nightly", "30 2 * * *"), ("hourly", "0 * * * *")],
        ),
    );
    let out = ok(ql(&db, &["apply", "-f", &f]));
    assert!(out.contains("create trigger nightly"), "{out}");
    assert!(
        out.contains("applied: 4 created, 0 updated, 0 deleted"),
        "{out}"
    );
    let first = versions(&db).await;
    assert_eq!(first.len(), 2, "{first:?}");
    assert!(
        first.iter().all(|t| t.5.as_deref() == Some("team/a")),
        "created triggers carry the files' source: {first:?}"
    );
    let audit_rows = db.count("SELECT count(*) FROM qlsched.audit_log").await;
    // The same files again: no revision, no fence (state and claim versions), no audit row.
    let out = ok(ql(&db, &["apply", "-f", &f]));
    assert!(
        out.contains("applied: 0 created, 0 updated, 0 deleted"),
        "{out}"
    );
    assert_eq!(versions(&db).await, first);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.audit_log").await,
        audit_rows
    );
    // One changed cron: one new revision of that trigger only, and one audit row naming
    // the source `apply` and the files' label.
    let g = write(
        &dir,
        "a.toml",
        &file(
            "team/a",
            &[("nightly", "45 2 * * *"), ("hourly", "0 * * * *")],
        ),
    );
    let out = ok(ql(&db, &["apply", "-f", &g]));
    assert!(
        out.contains("applied: 0 created, 1 updated, 0 deleted"),
        "{out}"
    );
    let after = versions(&db).await;
    assert_eq!(after[0], first[0], "hourly is untouched");
    assert_eq!(after[1].1, first[1].1 + 1, "nightly's next revision");
    let audit = json(ok(ql(
        &db,
        &["audit", "--trigger", "nightly", "--limit", "1", "--json"],
    )));
    let row = &audit["entries"][0];
    assert_eq!(row["source"], "apply", "{row}");
    assert_eq!(row["source_label"], "team/a", "{row}");
    assert_eq!(row["actor"], "tester", "{row}");
    assert_eq!(row["changes"]["cron_expr"]["after"], "45 2 * * *", "{row}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn applying_an_export_mints_nothing_and_never_re_enables_a_disabled_or_paused_trigger() {
    let db = TestDb::new().await;
    seed(&db);
    // A system pause (what V19's pause after failures writes).
    publish_hourly(&db, "flaky");
    db.superuser()
        .await
        .execute(
            "UPDATE qlsched.triggers SET enabled = false, operator_disabled = true,
                    disabled_by = 'qlsched' WHERE trigger_id = 'flaky'",
            &[],
        )
        .await
        .unwrap();
    let dir = tempdir();
    let exported = ok(ql(&db, &["export"]));
    let before = versions(&db).await;
    let f = write(&dir, "all.toml", &exported);
    let out = ok(ql(&db, &["apply", "-f", &f]));
    assert!(
        out.contains("applied: 0 created, 0 updated, 0 deleted"),
        "{out}"
    );
    assert_eq!(
        versions(&db).await,
        before,
        "an export applied mints nothing"
    );
    // A changed definition of both: written, and both stay disabled.
    let changed = exported.replace("cron = \"0 * * * *\"", "cron = \"15 * * * *\"");
    let f = write(&dir, "all.toml", &changed);
    let out = ok(ql(&db, &["apply", "-f", &f]));
    assert!(
        out.contains("update trigger flaky: cron: \"0 * * * *\" → \"15 * * * *\" (paused by qlsched after failures: apply leaves it paused"),
        "{out}"
    );
    assert!(
        out.contains("update trigger paused: cron: \"0 * * * *\" → \"15 * * * *\" (disabled by an operator: apply leaves it disabled"),
        "{out}"
    );
    let now = versions(&db).await;
    for id in ["flaky", "paused"] {
        let t = now.iter().find(|t| t.0 == id).unwrap();
        assert!(!t.4, "{id} stays disabled: {now:?}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn bad_input_writes_nothing() {
    let db = TestDb::new().await;
    let dir = tempdir();
    let nothing = || async {
        db.count("SELECT (SELECT count(*) FROM qlsched.projects) + (SELECT count(*) FROM qlsched.tasks)
                        + (SELECT count(*) FROM qlsched.triggers) + (SELECT count(*) FROM qlsched.audit_log)")
            .await
    };
    // One invalid trigger among good ones.
    let bad = file("t", &[("good", "0 * * * *"), ("bad", "99 * * * *")]);
    let f = write(&dir, "bad.toml", &bad);
    refused(
        ql(&db, &["apply", "-f", &f]),
        2,
        &["bad.toml:", "trigger.cron", "nothing was written"],
    );
    // The same id in two files.
    let a = write(&dir, "a.toml", &file("t", &[("x", "0 * * * *")]));
    let b = write(
        &dir,
        "b.toml",
        &format!("source = \"u\"\n{}", trigger("x", "5 * * * *")),
    );
    refused(
        ql(&db, &["apply", "-f", &a, "-f", &b]),
        2,
        &["is defined twice", "a.toml:", "nothing was written"],
    );
    // A trigger whose task no file defines and the database does not hold.
    let orphan = "source = \"t\"\n\n[[project]]\nid = \"pay\"\n\n[[trigger]]\nid = \"o\"\n\
                  project = \"pay\"\ntask = \"ghost\"\ncron = \"0 * * * *\"\n";
    let f = write(&dir, "orphan.toml", orphan);
    let out = ql(&db, &["apply", "-f", &f]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stderr(&out).contains("nothing was written"),
        "{}",
        stderr(&out)
    );
    assert!(
        stdout(&out).contains(
            "refused trigger o (its task ghost is defined in no file and not in the database"
        ),
        "{}",
        stdout(&out)
    );
    assert_eq!(nothing().await, 0, "nothing was written");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn prune_deletes_only_the_files_own_absent_triggers_within_max_delete() {
    let db = TestDb::new().await;
    let dir = tempdir();
    let a = write(
        &dir,
        "a.toml",
        &file(
            "team/a",
            &[
                ("a1", "0 * * * *"),
                ("a2", "5 * * * *"),
                ("a3", "6 * * * *"),
            ],
        ),
    );
    ok(ql(&db, &["apply", "-f", &a]));
    // Another source's trigger and an unlabelled one (trigger publish).
    let b = write(
        &dir,
        "b.toml",
        &format!("source = \"team/b\"\n{}", trigger("b1", "0 * * * *")),
    );
    ok(ql(&db, &["apply", "-f", &b]));
    publish_hourly(&db, "manual");
    // team/a drops a2 and a3.
    let fewer = write(&dir, "a.toml", &file("team/a", &[("a1", "0 * * * *")]));
    let out = ok(ql(&db, &["apply", "-f", &fewer]));
    assert!(
        out.contains("absent (not in the files; left as it is) trigger a2 (source `team/a`: --prune deletes it)"),
        "without --prune nothing is deleted: {out}"
    );
    let err = refused(
        ql(
            &db,
            &["apply", "-f", &fewer, "--prune", "--max-delete", "1"],
        ),
        2,
        &[
            "deletes 2 triggers, more than --max-delete 1",
            "nothing was written",
        ],
    );
    assert!(!err.is_empty());
    let out = ok(ql(&db, &["apply", "-f", &fewer, "--prune"]));
    assert!(out.contains("delete trigger a2"), "{out}");
    assert!(
        out.contains("applied: 0 created, 0 updated, 2 deleted"),
        "{out}"
    );
    let live: Vec<String> = db
        .superuser()
        .await
        .query(
            "SELECT trigger_id FROM qlsched.triggers WHERE deleted_at_ms IS NULL ORDER BY 1",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(live, ["a1", "b1", "manual"], "only team/a's absent ones");
    let audit = json(ok(ql(
        &db,
        &["audit", "--trigger", "a2", "--limit", "1", "--json"],
    )));
    assert_eq!(audit["entries"][0]["action"], "delete");
    assert_eq!(audit["entries"][0]["source_label"], "team/a");
    // A pruned id brought back by the file: refused, naming the way out.
    let back = write(
        &dir,
        "a.toml",
        &file("team/a", &[("a1", "0 * * * *"), ("a2", "5 * * * *")]),
    );
    let out = ql(&db, &["apply", "-f", &back]);
    assert_eq!(out.status.code(), Some(2), "{}", stderr(&out));
    assert!(
        stdout(&out).contains("refused trigger a2 (trigger a2 was deleted by tester via qlsched_admin (qlsched apply)")
            && stdout(&out).contains("give the trigger another id"),
        "{}",
        stdout(&out)
    );
    // export --source: only that source's triggers (and what they use), under its label.
    let only_b = ok(ql(&db, &["export", "--source", "team/b"]));
    assert!(only_b.starts_with("source = \"team/b\""), "{only_b}");
    assert!(
        only_b.contains("id = \"b1\"") && !only_b.contains("id = \"a1\""),
        "{only_b}"
    );
    let f = write(&dir, "b-export.toml", &only_b);
    let plan = json(ok(ql(
        &db,
        &["apply", "-f", &f, "--check", "--json", "--prune"],
    )));
    assert!(
        plan["items"]
            .as_array()
            .unwrap()
            .iter()
            .all(|i| i["op"] == "unchanged" || i["op"] == "absent"),
        "{plan}"
    );
    // A plain export of several sources is refused, naming them.
    refused(ql(&db, &["export"]), 1, &["team/a, team/b", "--source"]);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn adopt_labels_unlabelled_and_other_sources_triggers_without_a_new_revision() {
    let db = TestDb::new().await;
    let dir = tempdir();
    let b = write(&dir, "b.toml", &file("team/b", &[("b1", "0 * * * *")]));
    ok(ql(&db, &["apply", "-f", &b]));
    publish_hourly(&db, "manual");
    let before = versions(&db).await;
    let a = write(
        &dir,
        "a.toml",
        &file("team/a", &[("b1", "0 * * * *"), ("manual", "0 * * * *")]),
    );
    let out = ql(&db, &["apply", "-f", &a]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        stdout(&out).contains("refused trigger b1 (owned by source `team/b`, not `team/a`"),
        "{}",
        stdout(&out)
    );
    let out = ok(ql(&db, &["apply", "-f", &a, "--adopt"]));
    assert!(
        out.contains("update trigger b1: source: \"team/b\" → \"team/a\"")
            && out.contains("update trigger manual: source: null → \"team/a\""),
        "{out}"
    );
    let after = versions(&db).await;
    for (x, y) in before.iter().zip(&after) {
        assert_eq!(
            (x.1, x.2, x.3),
            (y.1, y.2, y.3),
            "no new revision, no fence: {y:?}"
        );
        assert_eq!(y.5.as_deref(), Some("team/a"));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The apply lock, held by a session of the test as another apply would hold it.
async fn hold_apply_lock(db: &TestDb) -> tokio_postgres::Client {
    let c = db.client("qlsched_admin").await;
    c.batch_execute(&format!(
        "SET application_name = 'holder-apply'; BEGIN; SELECT pg_advisory_xact_lock({})",
        qlsched::store::definitions::APPLY_LOCK
    ))
    .await
    .unwrap();
    c
}

#[tokio::test]
async fn a_second_apply_waits_for_the_first_and_gives_up_naming_the_holder() {
    let db = TestDb::new().await;
    let dir = tempdir();
    let f = write(&dir, "a.toml", &file("team/a", &[("a1", "0 * * * *")]));
    let holder = hold_apply_lock(&db).await;
    let pid = crate::helpers::backend_pid(&holder).await;
    let err = refused(
        ql(&db, &["apply", "-f", &f, "--lock-wait", "300ms"]),
        1,
        &[
            "waited 300ms",
            "apply lock",
            "holder-apply",
            "nothing was written",
        ],
    );
    assert!(
        err.contains(&format!("pid {pid} ")) && err.contains("since "),
        "{err}"
    );
    assert_eq!(db.count("SELECT count(*) FROM qlsched.projects").await, 0);
    // Within its wait, an apply proceeds once the holder ends.
    let child = command(&db, &["apply", "-f", &f, "--lock-wait", "30s"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let key = qlsched::store::definitions::APPLY_LOCK;
    let waiting = format!(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
            AND ((classid::bigint << 32) | objid::bigint) = {key}"
    );
    wait_until(
        "the second apply waits for the lock",
        Duration::from_secs(20),
        || async { db.count(&waiting).await == 1 },
    )
    .await;
    holder.batch_execute("COMMIT").await.unwrap();
    let out = tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap();
    let text = ok(out);
    assert!(text.contains("applied: 3 created"), "{text}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// V23 over a database with a trigger published before it (every migration after V18
/// undone, as the V20 test does, so V23 applies in order): the migration applies, the
/// trigger is unlabelled, an identical publish still changes nothing (its label included),
/// an apply of it without --adopt leaves it unlabelled and with --adopt labels it with no
/// new revision, and `db check` is clean.
#[tokio::test]
async fn v23_applies_over_triggers_written_before_it() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let spec = qlsched::store::manage::TriggerSpec::new("old", "proj", "task", "0 * * * *", "UTC");
    qlsched::store::manage::publish_trigger(&mut admin, &spec)
        .await
        .unwrap();
    let applied = crate::live_migrate::back_to_v18_and_migrate(&db).await;
    assert!(
        applied
            .iter()
            .any(|m| m.starts_with("V23__trigger_source_label")),
        "{applied:?}"
    );
    let p = qlsched::store::manage::publish_trigger(&mut admin, &spec)
        .await
        .unwrap();
    assert_eq!((p.revision, p.changed), (1, false));
    let label =
        "SELECT count(*) FROM qlsched.triggers WHERE trigger_id = 'old' AND source_label IS NULL";
    assert_eq!(db.count(label).await, 1);
    let dir = tempdir();
    let f = write(
        &dir,
        "o.toml",
        "source = \"ops\"\n\n[[trigger]]\nid = \"old\"\nproject = \"proj\"\ntask = \"task\"\ncron = \"0 * * * *\"\n",
    );
    ok(ql(&db, &["apply", "-f", &f]));
    assert_eq!(db.count(label).await, 1, "no --adopt: still unlabelled");
    ok(ql(&db, &["apply", "-f", &f, "--adopt"]));
    assert_eq!(db.count(label).await, 0);
    assert_eq!(
        db.count("SELECT revision FROM qlsched.triggers WHERE trigger_id = 'old'")
            .await,
        1
    );
    let problems = qlsched::schema::check(
        &db.client("qlsched_owner").await,
        &[
            ("qlsched_admin", "admin"),
            ("qlsched_runtime", "runtime"),
            ("qlsched_worker_ingress", "worker_ingress"),
        ],
    )
    .await
    .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
