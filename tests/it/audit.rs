//! The audit log (V22, docs/audit.md): every change and operator action appends exactly one
//! row in its own transaction, naming who and what; a refused or idle command appends none;
//! no role can rewrite the log; retention removes only old rows.

use std::time::Duration;

use serde_json::Value;
use tokio_postgres::error::SqlState;

use qlsched::store::audit::{self, AuditFilter, Entry, ObjectKind, Origin};

use crate::helpers::cli::{backfill, ok, ql, refused};
use crate::helpers::{iso, TestDb};
use crate::retention::{cfg, pruner};

async fn rows(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM qlsched.audit_log").await
}

/// The newest row, as `qlsched audit --json --limit 1` prints it.
fn newest(db: &TestDb) -> Value {
    let page: Value =
        serde_json::from_str(&ok(ql(db, &["audit", "--json", "--limit", "1"]))).unwrap();
    page["entries"][0].clone()
}

/// Runs `args` through the binary; it must succeed and append exactly one row, which is
/// returned.
async fn one_row(db: &TestDb, args: &[&str]) -> Value {
    let before = rows(db).await;
    ok(ql(db, args));
    assert_eq!(
        rows(db).await,
        before + 1,
        "`{}` appends one row",
        args.join(" ")
    );
    newest(db)
}

/// Runs `args`; it must append nothing.
async fn no_row(db: &TestDb, args: &[&str]) -> std::process::Output {
    let before = rows(db).await;
    let out = ql(db, args);
    assert_eq!(
        rows(db).await,
        before,
        "`{}` appends nothing",
        args.join(" ")
    );
    out
}

fn assert_row(e: &Value, kind: &str, id: &str, action: &str) {
    assert_eq!(
        (
            e["object_kind"].as_str(),
            e["object_id"].as_str(),
            e["action"].as_str()
        ),
        (Some(kind), Some(id), Some(action)),
        "{e}"
    );
    // Who: the CLI's user and host as it reports them, and the database's session_user.
    assert_eq!(e["actor"], "tester", "{e}");
    assert_eq!(e["host"], qlsched::startup::hostname(), "{e}");
    assert_eq!(e["db_user"], "qlsched_admin", "{e}");
    assert_eq!(e["source"], "cli", "{e}");
}

fn change<'a>(e: &'a Value, field: &str) -> (&'a Value, &'a Value) {
    let c = &e["changes"][field];
    (&c["before"], &c["after"])
}

#[tokio::test]
async fn every_operator_command_appends_one_row_naming_who_what_and_each_change() {
    let db = TestDb::new().await;
    assert_eq!(rows(&db).await, 0);

    let e = one_row(&db, &["project", "set", "--id", "pay"]).await;
    assert_row(&e, "project", "pay", "set");
    assert_eq!(change(&e, "status").1, "active", "{e}");
    no_row(&db, &["project", "set", "--id", "pay"]).await;

    let spec = r#"{"executor": "shell", "command": ["true"]}"#;
    let e = one_row(
        &db,
        &[
            "task",
            "publish",
            "--project",
            "pay",
            "--id",
            "t",
            "--spec",
            spec,
        ],
    )
    .await;
    assert_row(&e, "task", "t", "publish");
    assert_eq!(e["project_id"], "pay");
    assert_eq!(change(&e, "spec").1, spec, "{e}");
    no_row(
        &db,
        &[
            "task",
            "publish",
            "--project",
            "pay",
            "--id",
            "t",
            "--spec",
            spec,
        ],
    )
    .await;

    let publish = |cron: &'static str| {
        [
            "trigger",
            "publish",
            "--id",
            "nightly",
            "--project",
            "pay",
            "--task",
            "t",
            "--cron",
            cron,
        ]
    };
    let e = one_row(&db, &publish("* * * * *")).await;
    assert_row(&e, "trigger", "nightly", "publish");
    assert_eq!(change(&e, "revision"), (&Value::Null, &Value::from(1)));
    // An identical re-publish changes nothing and appends nothing.
    let out = no_row(&db, &publish("* * * * *")).await;
    assert!(ok(out).contains("(unchanged)"));
    let e = one_row(&db, &publish("*/2 * * * *")).await;
    assert_eq!(
        change(&e, "cron_expr"),
        (&Value::from("* * * * *"), &Value::from("*/2 * * * *"))
    );
    assert_eq!(change(&e, "revision"), (&Value::from(1), &Value::from(2)));
    assert!(
        e["changes"].get("timezone").is_none(),
        "only changed fields: {e}"
    );

    let e = one_row(
        &db,
        &["trigger", "disable", "nightly", "--note", "db upgrade"],
    )
    .await;
    assert_row(&e, "trigger", "nightly", "disable");
    assert_eq!(e["note"], "db upgrade");
    assert_eq!(
        change(&e, "enabled"),
        (&Value::from(true), &Value::from(false))
    );
    no_row(&db, &["trigger", "disable", "nightly"]).await;
    let e = one_row(&db, &["trigger", "enable", "nightly"]).await;
    assert_row(&e, "trigger", "nightly", "enable");
    assert_eq!(
        change(&e, "enabled"),
        (&Value::from(false), &Value::from(true))
    );

    let e = one_row(&db, &["trigger", "fire", "nightly", "--request-id", "r1"]).await;
    assert_row(&e, "trigger", "nightly", "fire");
    let run: String = db
        .superuser()
        .await
        .query_one(
            "SELECT run_id::text FROM qlsched.runs WHERE request_id = 'r1'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(e["changes"]["run_id"], run.as_str(), "{e}");
    no_row(&db, &["trigger", "fire", "nightly", "--request-id", "r1"]).await;

    // Two occurrences of */2 in a past window of five minutes: one chunk, one row.
    let now = db.now_ms().await;
    let (from, to) = (now - 10 * 60_000, now - 5 * 60_000);
    let before = rows(&db).await;
    ok(backfill(&db, "nightly", from, to, &[]));
    assert_eq!(rows(&db).await, before + 1);
    let e = newest(&db);
    assert_row(&e, "trigger", "nightly", "backfill");
    let admitted = e["changes"]["admitted"].as_i64().unwrap();
    assert!((2..=3).contains(&admitted), "{e}");

    let (f, t) = (iso(from), iso(to));
    let e = one_row(
        &db,
        &[
            "runs",
            "cancel",
            "--trigger",
            "nightly",
            "--from",
            &f,
            "--to",
            &t,
        ],
    )
    .await;
    assert_row(&e, "trigger", "nightly", "runs.cancel");
    assert_eq!(e["changes"]["cancelled"].as_i64(), Some(admitted), "{e}");
    assert_eq!(
        e["changes"]["run_ids"].as_array().unwrap().len() as i64,
        admitted
    );

    // The fired run is still queued: a prune removes it and raises the horizon.
    let cut = iso(db.now_ms().await);
    let e = one_row(&db, &["runs", "prune", "--queued-before", &cut]).await;
    assert_row(&e, "maintenance", "prune", "runs.prune");
    assert_eq!(e["changes"]["removed"], 1, "{e}");
    assert_eq!(change(&e, "pruned_through_ms").0, &Value::Null, "{e}");

    let e = one_row(&db, &["trigger", "delete", "nightly"]).await;
    assert_row(&e, "trigger", "nightly", "delete");
    no_row(&db, &["trigger", "delete", "nightly"]).await;

    // The filters: one trigger's rows, one project's, newest first.
    let page: Value =
        serde_json::from_str(&ok(ql(&db, &["audit", "--json", "--trigger", "nightly"]))).unwrap();
    let actions: Vec<&str> = page["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    assert_eq!(
        actions,
        [
            "delete",
            "runs.cancel",
            "backfill",
            "fire",
            "enable",
            "disable",
            "publish",
            "publish"
        ]
    );
    let page: Value =
        serde_json::from_str(&ok(ql(&db, &["audit", "--json", "--project", "pay"]))).unwrap();
    assert_eq!(page["entries"].as_array().unwrap().len(), 10, "{page}");
    let text = ok(ql(&db, &["audit", "--trigger", "nightly", "--limit", "3"]));
    assert_eq!(text.lines().count(), 3, "{text}");
    let first = text.lines().next().unwrap();
    assert!(
        first.contains("trigger nightly delete") && first.contains("tester@"),
        "{text}"
    );
    let later = iso(db.now_ms().await + 60_000);
    let none: Value =
        serde_json::from_str(&ok(ql(&db, &["audit", "--json", "--since", &later]))).unwrap();
    assert_eq!(none["entries"], Value::Array(vec![]));
    refused(ql(&db, &["audit", "--since", "yesterday"]), 2, &["--since"]);
    refused(ql(&db, &["audit", "--limit", "0"]), 2, &["--limit"]);
}

#[tokio::test]
async fn a_refused_command_appends_nothing() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * *").await;
    let id = "trg-00000";
    let before = rows(&db).await;
    refused(ql(&db, &["trigger", "disable", "nope"]), 3, &["nope"]);
    refused(
        ql(
            &db,
            &[
                "trigger",
                "publish",
                "--id",
                "x",
                "--project",
                "proj",
                "--task",
                "missing",
                "--cron",
                "* * * * *",
            ],
        ),
        3,
        &["missing"],
    );
    ok(ql(&db, &["trigger", "disable", id]));
    let after_disable = rows(&db).await;
    assert_eq!(after_disable, before + 1);
    refused(ql(&db, &["trigger", "fire", id]), 4, &["disabled"]);
    let now = db.now_ms().await;
    refused(
        backfill(&db, id, now - 600_000, now - 60_000, &[]),
        4,
        &["disabled"],
    );
    assert_eq!(
        rows(&db).await,
        after_disable,
        "refused commands appended rows"
    );
}

/// A row commits with its change or not at all: an append that fails (here an actor over
/// the column's bound, declared past the CLI's check) rolls the change back with it.
#[tokio::test]
async fn a_change_whose_row_cannot_be_appended_is_not_made() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * *").await;
    let mut admin = db.admin().await;
    let origin = Origin {
        actor: Some("a".repeat(201)),
        host: None,
        source: audit::Source::Cli,
        label: None,
    };
    audit::declare(&admin, &origin).await.unwrap();
    let n = rows(&db).await;
    let err = qlsched::store::triggers::disable(&mut admin, "trg-00000", None, "tester")
        .await
        .unwrap_err();
    assert!(err.to_string().contains("audit_log_actor_check"), "{err}");
    let enabled: bool = db
        .superuser()
        .await
        .query_one(
            "SELECT enabled FROM qlsched.triggers WHERE trigger_id = 'trg-00000'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(enabled, "the disable committed without its audit row");
    assert_eq!(rows(&db).await, n);
}

/// No role rewrites the log: the roles hold neither UPDATE nor DELETE (nor may they give
/// the database's own columns), and the owner is held to the retention path by a trigger.
#[tokio::test]
async fn no_role_may_update_delete_or_forge_audit_rows() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * *").await;
    ok(ql(&db, &["trigger", "disable", "trg-00000"]));
    for role in ["qlsched_admin", "qlsched_runtime", "qlsched_dispatcher"] {
        let c = db.client(role).await;
        for sql in [
            "UPDATE qlsched.audit_log SET note = 'rewritten'",
            "DELETE FROM qlsched.audit_log",
            "TRUNCATE qlsched.audit_log",
            "INSERT INTO qlsched.audit_log (db_user, source, object_kind, object_id, action) \
             VALUES ('someone_else', 'cli', 'trigger', 'x', 'publish')",
            "INSERT INTO qlsched.audit_log (at_ms, source, object_kind, object_id, action) \
             VALUES (0, 'cli', 'trigger', 'x', 'publish')",
        ] {
            let err = c.batch_execute(sql).await.unwrap_err();
            assert_eq!(
                err.code(),
                Some(&SqlState::INSUFFICIENT_PRIVILEGE),
                "{role}: `{sql}`: {err}"
            );
        }
    }
    // The dispatcher neither reads nor appends.
    let d = db.client("qlsched_dispatcher").await;
    let err = d
        .batch_execute("SELECT 1 FROM qlsched.audit_log")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INSUFFICIENT_PRIVILEGE));
    let owner = db.client("qlsched_owner").await;
    for sql in [
        "UPDATE qlsched.audit_log SET note = 'rewritten'",
        "DELETE FROM qlsched.audit_log",
        "TRUNCATE qlsched.audit_log",
    ] {
        let err = owner.batch_execute(sql).await.unwrap_err();
        assert_eq!(
            err.code(),
            Some(&SqlState::RESTRICT_VIOLATION),
            "owner: `{sql}`: {err}"
        );
    }
    // The runtime role appends (a replica's own actions) with the database's time and user.
    let n = rows(&db).await;
    let mut runtime = db.client("qlsched_runtime").await;
    let tx = runtime.transaction().await.unwrap();
    let entry = Entry {
        kind: ObjectKind::Trigger,
        id: "trg-00000",
        project: Some("proj"),
        action: "pause",
        changes: serde_json::json!({"failures": 3}),
        note: None,
        origin: Some(&Origin::system()),
    };
    audit::append(&tx, &entry).await.unwrap();
    tx.commit().await.unwrap();
    let page = audit::page(
        &runtime,
        &AuditFilter {
            limit: 1,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let e = &page.entries[0];
    assert_eq!(
        (
            e.actor.as_deref(),
            e.source.as_str(),
            e.db_user.as_str(),
            e.action.as_str()
        ),
        (Some("qlsched"), "system", "qlsched_runtime", "pause")
    );
    assert_eq!(rows(&db).await, n + 1);
}

/// Retention removes rows older than `retention.audit_after`, and only through
/// `qlsched.prune_audit` under the prune lease; no caller can ask for less than 7 days.
#[tokio::test]
async fn retention_prunes_audit_rows_older_than_audit_after_only() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * *").await;
    ok(ql(&db, &["trigger", "disable", "trg-00000"]));
    ok(ql(&db, &["trigger", "enable", "trg-00000"]));
    // Two rows made old by the owner (the only role that could write at_ms), the way time
    // would: the statement trigger refuses UPDATE, so they are inserted old.
    db.client("qlsched_owner")
        .await
        .batch_execute(
            "INSERT INTO qlsched.audit_log (at_ms, source, object_kind, object_id, action)
             SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint - d::bigint * 86400000,
                    'cli', 'trigger', 'trg-00000', 'publish'
               FROM (VALUES (8), (40)) v(d)",
        )
        .await
        .unwrap();
    let all = rows(&db).await;
    let mut c = cfg(Duration::from_secs(30 * 86_400), 1);
    c.audit_after = Some(Duration::from_secs(7 * 86_400));
    let conn = db.client("qlsched_runtime").await;
    let report = pruner("a", c).pass(&conn).await.unwrap();
    assert_eq!(report.audit_pruned, 2, "{report:?}");
    assert_eq!(rows(&db).await, all - 2);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.audit_log WHERE action IN ('disable', 'enable')")
            .await,
        2,
        "recent rows stay"
    );
    // Without the lease, or with less than 7 days, the function refuses.
    for (keep, code) in [
        (86_400_000_i64, SqlState::INVALID_PARAMETER_VALUE),
        (7 * 86_400_000, SqlState::LOCK_NOT_AVAILABLE),
    ] {
        let err = conn
            .query_one(
                "SELECT qlsched.prune_audit($1, 10, 'a', gen_random_uuid())",
                &[&keep],
            )
            .await
            .unwrap_err();
        assert_eq!(err.code(), Some(&code), "{err}");
    }
}

/// `db check` holds the audit log's grants exact: an UPDATE or DELETE granted by hand to any
/// role, or a column INSERT of the database's own columns, is named.
#[tokio::test]
async fn db_check_names_a_grant_that_would_let_a_role_rewrite_the_log() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    let roles = [
        ("qlsched_admin", "admin"),
        ("qlsched_runtime", "runtime"),
        ("qlsched_dispatcher", "dispatcher"),
    ];
    assert_eq!(
        qlsched::schema::check(&su, &roles).await.unwrap(),
        Vec::<String>::new()
    );
    su.batch_execute(
        "GRANT UPDATE ON qlsched.audit_log TO qlsched_admin;
         GRANT DELETE ON qlsched.audit_log TO qlsched_runtime;
         GRANT INSERT (db_user) ON qlsched.audit_log TO qlsched_admin;
         GRANT SELECT ON qlsched.audit_log TO qlsched_dispatcher",
    )
    .await
    .unwrap();
    let problems = qlsched::schema::check(&su, &roles)
        .await
        .unwrap()
        .join("\n");
    for needle in [
        "qlsched_admin has UPDATE on qlsched.audit_log",
        "qlsched_runtime has DELETE on qlsched.audit_log",
        "db_user",
        "qlsched_dispatcher has SELECT on qlsched.audit_log",
    ] {
        assert!(problems.contains(needle), "lacks `{needle}`:\n{problems}");
    }
}

/// The console's /audit page and /api/v1/audit: the CLI's JSON, keyset pages, every value
/// escaped (the note and the actor hold markup).
#[tokio::test]
async fn the_console_audit_page_pages_escapes_and_serves_the_clis_json() {
    let db = TestDb::new().await;
    crate::console::seed(&db).await;
    let mut r =
        crate::helpers::replica::ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "aud1", "", &[]);
    r.wait_ready(Duration::from_secs(30)).await;
    let api = |path: &str| -> Value {
        let (status, _, body) = crate::console::get(r.http, path, &[]);
        assert_eq!(status, 200, "{path}: {body}");
        serde_json::from_str(&body).unwrap()
    };
    let first = api("/api/v1/audit?trigger=con-x&limit=1");
    let cli: Value = serde_json::from_str(&ok(ql(
        &db,
        &["audit", "--json", "--trigger", "con-x", "--limit", "1"],
    )))
    .unwrap();
    assert_eq!(first["entries"], cli["entries"]);
    assert_eq!(first["entries"][0]["action"], "disable", "{first}");
    // Keyset paging: the next page is the publish before the disable, then nothing.
    let next = first["next_before"].as_str().expect("a next page");
    let second = api(&format!(
        "/api/v1/audit?trigger=con-x&limit=1&before={next}"
    ));
    assert_eq!(second["entries"][0]["action"], "publish", "{second}");
    let last = second["next_before"]
        .as_str()
        .expect("a full page has a cursor");
    let third = api(&format!(
        "/api/v1/audit?trigger=con-x&limit=1&before={last}"
    ));
    assert_eq!(third["entries"], Value::Array(vec![]), "{third}");
    assert_eq!(third["next_before"], Value::Null);

    let (status, _, page) = crate::console::get(r.http, "/audit?trigger=con-x", &[]);
    assert_eq!(status, 200, "{page}");
    assert!(
        page.contains("&lt;script&gt;window.__xss=1&lt;/script&gt;"),
        "{page}"
    );
    assert!(
        page.contains("&lt;img src=x onerror=alert(1)&gt;"),
        "{page}"
    );
    assert!(
        !page.contains("<script>window") && !page.contains("<img"),
        "{page}"
    );
    assert!(page.contains("href=\"/triggers/con-x\""), "{page}");
    let (status, _, body) = crate::console::get(r.http, "/api/v1/audit?before=nonsense", &[]);
    assert_eq!(status, 400, "{body}");
    let (status, _, _) = crate::console::get(r.http, "/api/v1/audit?limit=101", &[]);
    assert_eq!(status, 400);
}
