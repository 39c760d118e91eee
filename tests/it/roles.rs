//! Each role can do exactly what docs/design.md ("Roles and grants") grants, and nothing more, proven against the
//! catalog and by trying.

use qlsched::schema;

use crate::helpers::TestDb;

#[tokio::test]
async fn catalog_privileges_match_the_spec_exactly_for_every_role() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    for (role, kind) in [
        ("qlsched_admin", "admin"),
        ("qlsched_runtime", "runtime"),
        ("qlsched_worker_ingress", "worker_ingress"),
        ("qlsched_dispatcher", "dispatcher"),
    ] {
        let have = schema::table_privileges(&su, role).await.unwrap();
        assert_eq!(have, schema::expected_privileges(kind), "role {role}");
    }
    // The dispatcher: reads admitted work and the pinned spec, appends events; nothing else
    // at table level (its updates are column-level).
    let dispatcher = schema::table_privileges(&su, "qlsched_dispatcher")
        .await
        .unwrap();
    let want: Vec<(String, String)> = [
        ("attempts", "SELECT"),
        ("execution_revisions", "SELECT"),
        ("run_events", "INSERT"),
        ("run_events", "SELECT"),
        ("runs", "SELECT"),
    ]
    .iter()
    .map(|(t, p)| (t.to_string(), p.to_string()))
    .collect();
    assert_eq!(dispatcher, want);
    // Column-level UPDATEs, as the catalog holds them.
    let columns = |role: &'static str| {
        let su = &su;
        async move {
            su.query(
                "SELECT c.relname::text, a.attname::text, acl.privilege_type
                   FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid
                   JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'qlsched'
                   CROSS JOIN LATERAL aclexplode(a.attacl) acl
                  WHERE acl.grantee = $1::text::regrole ORDER BY 1, 2, 3",
                &[&role],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| {
                format!(
                    "{}.{} {}",
                    r.get::<_, String>(0),
                    r.get::<_, String>(1),
                    r.get::<_, String>(2)
                )
            })
            .collect::<Vec<_>>()
        }
    };
    assert_eq!(
        columns("qlsched_dispatcher").await,
        [
            "attempts.error UPDATE",
            "attempts.finished_at_ms UPDATE",
            "attempts.result UPDATE",
            "attempts.started_at_ms UPDATE",
            "attempts.state UPDATE",
            "runs.status UPDATE"
        ]
    );
    assert_eq!(
        columns("qlsched_admin").await,
        [
            "attempts.finished_at_ms UPDATE",
            "attempts.state UPDATE",
            "audit_log.action INSERT",
            "audit_log.actor INSERT",
            "audit_log.changes INSERT",
            "audit_log.host INSERT",
            "audit_log.note INSERT",
            "audit_log.object_id INSERT",
            "audit_log.object_kind INSERT",
            "audit_log.project_id INSERT",
            "audit_log.source INSERT",
            "audit_log.source_label INSERT",
            "maintenance.finished_after_floor_ms UPDATE",
            "runs.cancelled UPDATE",
            "runs.status UPDATE",
        ]
    );
    // The runtime claims the 'prune' lease with its table UPDATE; V15's row trigger keeps the
    // recorded horizon and the floor out of its reach (the CASES below). Its only column
    // grant is the audit log's INSERT (V22), without the database's own columns.
    assert_eq!(
        columns("qlsched_runtime").await,
        [
            "audit_log.action INSERT",
            "audit_log.actor INSERT",
            "audit_log.changes INSERT",
            "audit_log.host INSERT",
            "audit_log.note INSERT",
            "audit_log.object_id INSERT",
            "audit_log.object_kind INSERT",
            "audit_log.project_id INSERT",
            "audit_log.source INSERT",
            "audit_log.source_label INSERT",
        ]
    );
    assert!(columns("qlsched_worker_ingress").await.is_empty());
    let runtime = schema::table_privileges(&su, "qlsched_runtime")
        .await
        .unwrap();
    let on_schedules: Vec<&str> = runtime
        .iter()
        .filter(|(t, _)| t == "trigger_schedules")
        .map(|(_, p)| p.as_str())
        .collect();
    assert_eq!(on_schedules, vec!["SELECT", "UPDATE"]);
    // The admin role admits operator runs (fire, backfill): INSERT and SELECT only.
    let admin = schema::table_privileges(&su, "qlsched_admin")
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
    // Retention (V15): the runtime claims the lease and reads the tombstones of pruned
    // occurrences; the horizon and the floor are the database's.
    ("qlsched_runtime", "UPDATE qlsched.maintenance SET lease_owner = 'x', lease_token = NULL, lease_expires_at = NULL, finished_after_ms = 0, queued_alert_after_ms = 1, last_pass_at = NULL", true),
    ("qlsched_runtime", "UPDATE qlsched.maintenance SET pruned_through_ms = 0", false),
    ("qlsched_runtime", "UPDATE qlsched.maintenance SET finished_after_floor_ms = 0", false),
    ("qlsched_runtime", "SELECT count(*) FROM qlsched.pruned_occurrences", true),
    ("qlsched_runtime", "INSERT INTO qlsched.pruned_occurrences (idempotency_key, trigger_id, scheduled_for_ms, pruned_at_ms) VALUES ('k', 't', 0, 0)", false),
    ("qlsched_runtime", "DELETE FROM qlsched.pruned_occurrences", false),
    ("qlsched_admin", "UPDATE qlsched.maintenance SET finished_after_floor_ms = 0", true),
    ("qlsched_admin", "UPDATE qlsched.maintenance SET pruned_through_ms = NULL", false),
    ("qlsched_admin", "DELETE FROM qlsched.pruned_occurrences", false),
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
    // `runs cancel`: status and the cancelled flag of a run, state and finish time of its
    // attempt (V10); nothing else of admitted work.
    ("qlsched_admin", "UPDATE qlsched.runs SET status = status, cancelled = cancelled", true),
    ("qlsched_admin", "UPDATE qlsched.attempts SET state = state, finished_at_ms = finished_at_ms", true),
    ("qlsched_admin", "SELECT run_id FROM qlsched.runs FOR UPDATE SKIP LOCKED", true),
    ("qlsched_admin", "UPDATE qlsched.runs SET idempotency_key = idempotency_key", false),
    ("qlsched_admin", "UPDATE qlsched.runs SET scheduled_for_ms = 0", false),
    ("qlsched_admin", "UPDATE qlsched.attempts SET worker_id = 'w'", false),
    ("qlsched_admin", "UPDATE qlsched.attempts SET started_at_ms = 0", false),
    ("qlsched_admin", "DELETE FROM qlsched.attempts", false),
    ("qlsched_admin", "UPDATE qlsched.run_events SET at_ms = 0", false),
    ("qlsched_admin", "DELETE FROM qlsched.run_events", false),
    ("qlsched_admin", "TRUNCATE qlsched.runs", false),
    // Definition rows are permanent (V7): soft delete and disable are the operator's tools.
    ("qlsched_admin", "DELETE FROM qlsched.projects", false),
    ("qlsched_admin", "DELETE FROM qlsched.execution_revisions", false),
    ("qlsched_admin", "DELETE FROM qlsched.tasks", false),
    ("qlsched_admin", "DELETE FROM qlsched.triggers", false),
    // The dispatcher (docs/dispatcher.md): takes queued runs, moves run and attempt
    // forward, appends events. Nothing else.
    ("qlsched_dispatcher", "SELECT count(*) FROM qlsched.runs", true),
    ("qlsched_dispatcher", "SELECT count(*) FROM qlsched.attempts", true),
    ("qlsched_dispatcher", "SELECT count(*) FROM qlsched.run_events", true),
    ("qlsched_dispatcher", "SELECT spec FROM qlsched.execution_revisions", true),
    ("qlsched_dispatcher", "SELECT run_id FROM qlsched.runs WHERE status = 'queued' LIMIT 10 FOR UPDATE SKIP LOCKED", true),
    ("qlsched_dispatcher", "UPDATE qlsched.runs SET status = status", true),
    ("qlsched_dispatcher", "UPDATE qlsched.attempts SET state = state, started_at_ms = started_at_ms, finished_at_ms = finished_at_ms, result = result, error = error", true),
    // The privilege (until the contract migration); V16's trigger refuses any row out of step.
    ("qlsched_dispatcher", "INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms) SELECT gen_random_uuid(), 3, 'run.dispatching', 0 WHERE false", true),
    ("qlsched_dispatcher", "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id, idempotency_key, scheduled_for_ms, admitted_by) SELECT gen_random_uuid(), 'proj', 'trg-00000', 1, 'task', 1, execution_revision_id, 'ql3:cron:v1:trg-00000:1:0', 0, 'x' FROM qlsched.execution_revisions", false),
    ("qlsched_dispatcher", "INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms) VALUES (gen_random_uuid(), gen_random_uuid(), 2, 'remote_worker', 'claimed', 0)", false),
    ("qlsched_dispatcher", "UPDATE qlsched.runs SET cancelled = true", false),
    ("qlsched_dispatcher", "UPDATE qlsched.runs SET idempotency_key = idempotency_key", false),
    ("qlsched_dispatcher", "UPDATE qlsched.runs SET admitted_by = admitted_by", false),
    ("qlsched_dispatcher", "UPDATE qlsched.attempts SET run_id = run_id", false),
    ("qlsched_dispatcher", "UPDATE qlsched.attempts SET worker_id = 'w'", false),
    ("qlsched_dispatcher", "UPDATE qlsched.run_events SET at_ms = 0", false),
    ("qlsched_dispatcher", "DELETE FROM qlsched.runs", false),
    ("qlsched_dispatcher", "DELETE FROM qlsched.attempts", false),
    ("qlsched_dispatcher", "DELETE FROM qlsched.run_events", false),
    ("qlsched_dispatcher", "TRUNCATE qlsched.runs", false),
    ("qlsched_dispatcher", "SELECT count(*) FROM qlsched.trigger_schedules", false),
    ("qlsched_dispatcher", "UPDATE qlsched.trigger_schedules SET claimable_at_ms = 0", false),
    ("qlsched_dispatcher", "DELETE FROM qlsched.trigger_schedules", false),
    ("qlsched_dispatcher", "SELECT count(*) FROM qlsched.triggers", false),
    ("qlsched_dispatcher", "SELECT count(*) FROM qlsched.tasks", false),
    ("qlsched_dispatcher", "SELECT count(*) FROM qlsched.projects", false),
    ("qlsched_dispatcher", "SELECT count(*) FROM qlsched.replicas", false),
    ("qlsched_dispatcher", "UPDATE qlsched.triggers SET enabled = false", false),
    ("qlsched_dispatcher", "CREATE TABLE qlsched.sneaky (x int)", false),
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

fn all_roles() -> [(&'static str, &'static str); 4] {
    [
        ("qlsched_admin", "admin"),
        ("qlsched_runtime", "runtime"),
        ("qlsched_worker_ingress", "worker_ingress"),
        ("qlsched_dispatcher", "dispatcher"),
    ]
}

/// Every function some role may call: (function, the role granted EXECUTE, a role that must
/// not hold it).
const EXECUTE_GRANTS: &[(&str, &str, &str)] = &[
    (
        "qlsched.prune_finished(bigint,integer,text,uuid)",
        "qlsched_runtime",
        "qlsched_admin",
    ),
    (
        "qlsched.prune_queued(bigint,uuid[])",
        "qlsched_admin",
        "qlsched_runtime",
    ),
    (
        "qlsched.request_cancel(uuid[])",
        "qlsched_admin",
        "qlsched_dispatcher",
    ),
    (
        "qlsched.dispatch_take(text,text[],integer,bigint)",
        "qlsched_dispatcher",
        "qlsched_runtime",
    ),
    (
        "qlsched.dispatch_take_executable(text,text[],text[],integer,bigint)",
        "qlsched_dispatcher",
        "qlsched_admin",
    ),
    (
        "qlsched.dispatch_take_batch(text,text[],text[],integer,bigint)",
        "qlsched_dispatcher",
        "qlsched_runtime",
    ),
    (
        "qlsched.dispatch_take_start(text,text[],text[],integer,bigint)",
        "qlsched_dispatcher",
        "qlsched_runtime",
    ),
    (
        "qlsched.dispatch_finish_batch(uuid[],uuid[],text[],integer[],text[],text[],jsonb[])",
        "qlsched_dispatcher",
        "qlsched_admin",
    ),
    (
        "qlsched.spec_pool(text)",
        "qlsched_admin",
        "qlsched_runtime",
    ),
    (
        "qlsched.spec_executor(text)",
        "qlsched_admin",
        "qlsched_dispatcher",
    ),
    (
        "qlsched.dispatch_start(uuid,uuid,bigint)",
        "qlsched_dispatcher",
        "qlsched_admin",
    ),
    (
        "qlsched.dispatch_heartbeat(uuid,uuid,bigint)",
        "qlsched_dispatcher",
        "qlsched_runtime",
    ),
    (
        "qlsched.dispatch_finish(uuid,uuid,text,integer,text,text,jsonb)",
        "qlsched_dispatcher",
        "qlsched_worker_ingress",
    ),
    (
        "qlsched.dispatch_release(uuid,uuid)",
        "qlsched_dispatcher",
        "qlsched_runtime",
    ),
    (
        "qlsched.dispatch_expire(integer)",
        "qlsched_dispatcher",
        "qlsched_admin",
    ),
    (
        "qlsched.overlap_adopt(text)",
        "qlsched_admin",
        "qlsched_runtime",
    ),
    (
        "qlsched.overlap_prune_skips(bigint)",
        "qlsched_runtime",
        "qlsched_admin",
    ),
    (
        "qlsched.overlap_decide(tid[],text[],text[],text[],boolean[],bigint[])",
        "qlsched_runtime",
        "qlsched_admin",
    ),
    (
        "qlsched.overlap_undo(text[])",
        "qlsched_runtime",
        "qlsched_admin",
    ),
    (
        "qlsched.overlap_decide_with(tid[],text[],text[],text[],boolean[],bigint[],bigint[])",
        "qlsched_runtime",
        "qlsched_dispatcher",
    ),
    (
        "qlsched.overlap_release(text[])",
        "qlsched_runtime",
        "qlsched_admin",
    ),
    (
        "qlsched.prune_audit(bigint,integer,text,uuid)",
        "qlsched_runtime",
        "qlsched_admin",
    ),
    (
        "qlsched.console_disable(text,text,text,text)",
        "qlsched_runtime",
        "qlsched_dispatcher",
    ),
    (
        "qlsched.console_enable(text,bigint,bigint,text,text)",
        "qlsched_runtime",
        "qlsched_admin",
    ),
    (
        "qlsched.console_fire(text,text,uuid,uuid,uuid,text,text,text)",
        "qlsched_runtime",
        "qlsched_worker_ingress",
    ),
    (
        "qlsched.console_backfill(text,bigint,bigint[],uuid[],uuid[],text,text,text)",
        "qlsched_runtime",
        "qlsched_dispatcher",
    ),
    (
        "qlsched.console_cancel_queued(text,bigint,bigint,text,text,text)",
        "qlsched_runtime",
        "qlsched_admin",
    ),
    (
        "qlsched.console_request_cancel(uuid,text,text,text)",
        "qlsched_runtime",
        "qlsched_dispatcher",
    ),
];

/// `db check` expects exactly the one EXECUTE grant of each function: an extra grant to
/// another role is named, and so is the grant's absence.
#[tokio::test]
async fn db_check_expects_exactly_the_execute_grant_of_each_function() {
    let mut cases: Vec<&str> = EXECUTE_GRANTS.iter().map(|c| c.0).collect();
    let mut granted: Vec<&str> = schema::EXECUTE_GRANTS.iter().map(|g| g.0).collect();
    cases.sort_unstable();
    granted.sort_unstable();
    assert_eq!(cases, granted, "one case per function `db migrate` grants");
    let mut failures = Vec::new();
    for (function, holder, other) in EXECUTE_GRANTS {
        let db = TestDb::new().await;
        let su = db.superuser().await;
        let check = || async { schema::check(&su, &all_roles()).await.unwrap() };
        let steps = [
            (String::new(), vec![]),
            (
                format!("GRANT EXECUTE ON FUNCTION {function} TO {other}"),
                vec![format!(
                    "role {other} may EXECUTE function {function}, which it must not"
                )],
            ),
            (
                format!("REVOKE EXECUTE ON FUNCTION {function} FROM {other}, {holder}"),
                vec![format!(
                    "role {holder} lacks EXECUTE on function {function}"
                )],
            ),
        ];
        for (sql, want) in steps {
            su.batch_execute(&sql).await.unwrap();
            let got = check().await;
            if got != want {
                failures.push(format!(
                    "{function}: after `{sql}` db check said {got:?}, not {want:?}"
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test]
async fn check_names_and_refuses_every_kind_of_extra_grant() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    assert_eq!(
        schema::check(&su, &all_roles()).await.unwrap(),
        Vec::<String>::new(),
        "a migrated database is clean"
    );
    // (grant, the problem check must report)
    let cases: &[(&str, &str)] = &[
        (
            "GRANT SELECT (trigger_id) ON qlsched.triggers TO PUBLIC",
            "role qlsched_worker_ingress has column-level SELECT on qlsched.triggers(trigger_id)",
        ),
        (
            "GRANT UPDATE (admitted_by) ON qlsched.runs TO qlsched_dispatcher",
            "role qlsched_dispatcher has column-level UPDATE on qlsched.runs(admitted_by)",
        ),
        (
            "GRANT UPDATE (status) ON qlsched.runs TO qlsched_runtime",
            "role qlsched_runtime has column-level UPDATE on qlsched.runs(status)",
        ),
        (
            "GRANT UPDATE ON qlsched.runs TO qlsched_dispatcher",
            "role qlsched_dispatcher has UPDATE on qlsched.runs",
        ),
        (
            "GRANT DELETE ON qlsched.run_events TO qlsched_dispatcher",
            "role qlsched_dispatcher has DELETE on qlsched.run_events",
        ),
        (
            "REVOKE UPDATE (status) ON qlsched.runs FROM qlsched_dispatcher",
            "role qlsched_dispatcher lacks column-level UPDATE on qlsched.runs(status)",
        ),
        (
            "REVOKE UPDATE (cancelled) ON qlsched.runs FROM qlsched_admin",
            "role qlsched_admin lacks column-level UPDATE on qlsched.runs(cancelled)",
        ),
        (
            "GRANT CREATE ON SCHEMA qlsched TO qlsched_runtime",
            "role qlsched_runtime has CREATE on schema qlsched",
        ),
        (
            "CREATE SCHEMA side; GRANT CREATE ON SCHEMA side TO qlsched_admin",
            "role qlsched_admin has CREATE on schema side",
        ),
        (
            "GRANT USAGE ON SCHEMA qlsched TO qlsched_worker_ingress",
            "role qlsched_worker_ingress has USAGE on schema qlsched",
        ),
        (
            "GRANT CREATE ON DATABASE current_db TO qlsched_runtime",
            "role qlsched_runtime has CREATE on database",
        ),
        (
            "GRANT TEMPORARY ON DATABASE current_db TO qlsched_dispatcher",
            "role qlsched_dispatcher has TEMPORARY on database",
        ),
        (
            "ALTER DEFAULT PRIVILEGES FOR ROLE qlsched_owner IN SCHEMA qlsched \
             GRANT SELECT ON TABLES TO qlsched_worker_ingress",
            "role qlsched_worker_ingress gets SELECT on future tables created by qlsched_owner in schema qlsched (default privileges)",
        ),
        (
            "ALTER DEFAULT PRIVILEGES FOR ROLE qlsched_owner \
             GRANT EXECUTE ON FUNCTIONS TO qlsched_runtime",
            "role qlsched_runtime gets EXECUTE on future functions created by qlsched_owner (default privileges)",
        ),
        (
            "CREATE FUNCTION qlsched.sneaky(int) RETURNS int LANGUAGE sql AS 'SELECT 1'; \
             REVOKE EXECUTE ON FUNCTION qlsched.sneaky(int) FROM PUBLIC; \
             GRANT EXECUTE ON FUNCTION qlsched.sneaky(int) TO qlsched_admin",
            "role qlsched_admin may EXECUTE function qlsched.sneaky(integer)",
        ),
        (
            "CREATE SEQUENCE qlsched.counter; GRANT USAGE ON SEQUENCE qlsched.counter TO qlsched_runtime",
            "role qlsched_runtime has USAGE on sequence qlsched.counter",
        ),
    ];
    for (grant, expected) in cases {
        let fresh = TestDb::new().await;
        let su = fresh.superuser().await;
        su.batch_execute(&grant.replace("current_db", &fresh.name))
            .await
            .unwrap_or_else(|e| panic!("{grant}: {e}"));
        let problems = schema::check(&su, &all_roles()).await.unwrap();
        assert!(
            problems.iter().any(|p| p.starts_with(expected)),
            "`{grant}` must be reported as `{expected}`; got {problems:?}"
        );
    }
    // A function left with PostgreSQL's default (EXECUTE to PUBLIC) reaches every role.
    su.batch_execute(
        "CREATE FUNCTION qlsched.open_to_all() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    )
    .await
    .unwrap();
    let problems = schema::check(&su, &all_roles()).await.unwrap();
    for (role, _) in all_roles() {
        let want = format!("role {role} may EXECUTE function qlsched.open_to_all()");
        assert!(
            problems.iter().any(|p| p.starts_with(&want)),
            "{want}: {problems:?}"
        );
    }
}

#[tokio::test]
async fn db_check_refuses_an_extra_grant_with_a_failing_exit() {
    let db = TestDb::new().await;
    db.superuser()
        .await
        .batch_execute("GRANT CREATE ON SCHEMA qlsched TO qlsched_runtime")
        .await
        .unwrap();
    let out = std::process::Command::new(crate::helpers::replica::binary())
        .args(["db", "check", "--dsn", &db.dsn("postgres")])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains("role qlsched_runtime has CREATE on schema qlsched"),
        "{stderr}"
    );
}

/// PostgreSQL grants TEMPORARY on every new database to PUBLIC, so every role may create
/// temporary tables there. `db bootstrap` revokes it (with everything else PUBLIC holds on
/// the database); `db check` refuses a database that still grants it, naming each role it
/// reaches.
#[tokio::test]
async fn db_check_refuses_temporary_on_the_database_and_bootstrap_revokes_it() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute(&format!(
        "GRANT TEMPORARY ON DATABASE \"{}\" TO PUBLIC",
        db.name
    ))
    .await
    .unwrap();
    let problems = schema::check(&su, &all_roles()).await.unwrap();
    for (role, _) in all_roles() {
        let want = format!("role {role} has TEMPORARY on database");
        assert!(
            problems.iter().any(|p| p.starts_with(&want)),
            "{want}: {problems:?}"
        );
    }
    // A database `db bootstrap` creates grants it to none of them.
    let name = format!(
        "boot{}_{}",
        std::process::id(),
        crate::helpers::NEXT_DB.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    );
    let roles = crate::helpers::roles();
    schema::bootstrap(
        &crate::helpers::pg_config(db.port, "postgres", "postgres"),
        &roles,
        &name,
    )
    .await
    .unwrap();
    for (role, _) in all_roles() {
        let temp: bool = su
            .query_one(
                "SELECT has_database_privilege($1, $2, 'TEMPORARY')",
                &[&role, &name],
            )
            .await
            .unwrap()
            .get(0);
        assert!(
            !temp,
            "role {role} may create temporary tables in a bootstrapped database"
        );
    }
}
