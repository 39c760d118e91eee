//! Each role can do exactly what docs/design.md ("Roles and grants") grants, and nothing more, proven against the
//! catalog and by trying.

use qlsched::store::migrate;

use crate::helpers::TestDb;

#[tokio::test]
async fn catalog_privileges_match_the_spec_exactly_for_every_role() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    for (role, kind) in [
        ("qlsched_admin", "admin"),
        ("qlsched_runtime", "runtime"),
        ("qlsched_worker_ingress", "worker_ingress"),
    ] {
        let have = migrate::table_privileges(&su, role).await.unwrap();
        assert_eq!(have, migrate::expected_privileges(kind), "role {role}");
    }
    let runtime = migrate::table_privileges(&su, "qlsched_runtime")
        .await
        .unwrap();
    let on_schedules: Vec<&str> = runtime
        .iter()
        .filter(|(t, _)| t == "trigger_schedules")
        .map(|(_, p)| p.as_str())
        .collect();
    assert_eq!(on_schedules, vec!["SELECT", "UPDATE"]);
    // The admin role admits operator runs (fire, backfill): INSERT and SELECT only.
    let admin = migrate::table_privileges(&su, "qlsched_admin")
        .await
        .unwrap();
    for table in ["runs", "attempts", "run_events"] {
        let privs: Vec<&str> = admin
            .iter()
            .filter(|(t, _)| t == table)
            .map(|(_, p)| p.as_str())
            .collect();
        assert_eq!(privs, vec!["INSERT", "SELECT"], "admin on {table}");
    }
}

/// (role, statement, allowed?)
const CASES: &[(&str, &str, bool)] = &[
    ("qlsched_runtime", "SELECT count(*) FROM qlsched.trigger_schedules", true),
    ("qlsched_runtime", "UPDATE qlsched.trigger_schedules SET updated_at_ms = updated_at_ms", true),
    ("qlsched_runtime", "INSERT INTO qlsched.trigger_schedules (trigger_id, project_id, trigger_revision, updated_at_ms) VALUES ('trg-00000', 'proj', 1, 0)", false),
    ("qlsched_runtime", "DELETE FROM qlsched.trigger_schedules", false),
    ("qlsched_runtime", "TRUNCATE qlsched.trigger_schedules", false),
    ("qlsched_runtime", "SELECT count(*) FROM qlsched.triggers", true),
    ("qlsched_runtime", "UPDATE qlsched.triggers SET enabled = false", false),
    ("qlsched_runtime", "INSERT INTO qlsched.projects (project_id, created_at_ms, updated_at_ms) VALUES ('x', 0, 0)", false),
    ("qlsched_runtime", "UPDATE qlsched.runs SET status = 'failed'", false),
    ("qlsched_runtime", "DELETE FROM qlsched.runs", false),
    ("qlsched_runtime", "DELETE FROM qlsched.run_events", false),
    ("qlsched_runtime", "CREATE TABLE qlsched.sneaky (x int)", false),
    ("qlsched_worker_ingress", "SELECT count(*) FROM qlsched.trigger_schedules", false),
    ("qlsched_worker_ingress", "SELECT count(*) FROM qlsched.runs", false),
    ("qlsched_worker_ingress", "SELECT count(*) FROM qlsched.triggers", false),
    ("qlsched_worker_ingress", "SELECT count(*) FROM qlsched.attempts", false),
    ("qlsched_admin", "INSERT INTO qlsched.projects (project_id, created_at_ms, updated_at_ms) VALUES ('x', 0, 0)", true),
    ("qlsched_admin", "UPDATE qlsched.trigger_schedules SET next_fire_at_ms = NULL, claimable_at_ms = 0", true),
    ("qlsched_admin", "DELETE FROM qlsched.trigger_schedules", true),
    ("qlsched_admin", "DELETE FROM qlsched.trigger_schedules; INSERT INTO qlsched.trigger_schedules (trigger_id, project_id, trigger_revision, updated_at_ms) VALUES ('trg-00000', 'proj', 1, 0)", true),
    ("qlsched_admin", "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id, idempotency_key, scheduled_for_ms, admitted_by) SELECT gen_random_uuid(), 'proj', 'trg-00000', 1, 'task', 1, execution_revision_id, 'ql3:cron:v1:trg-00000:1:0', 0, 'x' FROM qlsched.tasks", true),
    ("qlsched_admin", "DELETE FROM qlsched.runs", false),
    ("qlsched_admin", "UPDATE qlsched.runs SET status = 'failed'", false),
    ("qlsched_admin", "UPDATE qlsched.attempts SET state = 'failed'", false),
    ("qlsched_admin", "DELETE FROM qlsched.attempts", false),
    ("qlsched_admin", "UPDATE qlsched.run_events SET at_ms = 0", false),
    ("qlsched_admin", "DELETE FROM qlsched.run_events", false),
    ("qlsched_admin", "TRUNCATE qlsched.runs", false),
];

#[tokio::test]
async fn each_role_can_do_exactly_what_it_is_granted() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let mut failures = Vec::new();
    for (role, sql, allowed) in CASES {
        let client = db.client(role).await;
        // Each case in a rolled-back transaction so cases do not affect each other.
        client.batch_execute("BEGIN").await.unwrap();
        let res = client.batch_execute(sql).await;
        client.batch_execute("ROLLBACK").await.unwrap();
        let denied = matches!(&res, Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE));
        match (allowed, &res) {
            (true, Ok(_)) => {}
            (false, Err(_)) if denied => {}
            _ => failures.push(format!(
                "{role}: `{sql}` expected {} got {res:?}",
                if *allowed {
                    "allowed"
                } else {
                    "permission denied"
                }
            )),
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
