use qlsched::store::migrate::{self, Drift, Grant, MigrateOptions, MigrationSet, Roles};

use std::time::Duration;

use crate::helpers::cli::{ok, ql};
use crate::helpers::replica::ReplicaProc;
use crate::helpers::roles;
use crate::helpers::TestDb;

#[tokio::test]
async fn migrations_apply_from_empty_and_are_idempotent() {
    let db = TestDb::new().await;
    let owner = db.client("qlsched_owner").await;
    assert!(migrate::stream_drift(&owner).await.unwrap().is_empty());
    let again = migrate::migrate(&db.config("qlsched_owner"), &roles())
        .await
        .unwrap();
    assert!(again.is_empty(), "second migrate applied {again:?}");
    let problems = migrate::check(
        &owner,
        &[
            ("qlsched_admin", "admin"),
            ("qlsched_runtime", "runtime"),
            ("qlsched_worker_ingress", "worker_ingress"),
        ],
    )
    .await
    .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}

#[tokio::test]
async fn a_fresh_database_reports_every_migration_not_applied() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute(&format!("DROP TABLE {}", migrate::HISTORY_TABLE))
        .await
        .unwrap();
    let drift = migrate::stream_drift(&su).await.unwrap();
    assert_eq!(drift.len(), migrate::embedded_count());
    assert!(drift.iter().all(|d| matches!(d, Drift::NotApplied { .. })));
    assert_eq!(
        drift[0].to_string(),
        "migration V1__definitions.sql is not applied (run `qlsched db migrate`)"
    );
}

#[tokio::test]
async fn an_edited_migration_is_refused_by_check_with_its_file_named() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute(&format!(
        "UPDATE {} SET checksum = '42' WHERE version = 2",
        migrate::HISTORY_TABLE
    ))
    .await
    .unwrap();
    let problems = migrate::check(&su, &[]).await.unwrap();
    assert_eq!(problems, vec!["migration V2__trigger_schedules.sql was changed after it was applied (checksum differs)"]);
    let err = migrate::migrate(&db.config("qlsched_owner"), &roles())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("V2__trigger_schedules.sql was changed"),
        "{err}"
    );
}

#[tokio::test]
async fn a_missing_migration_is_refused_by_check_with_its_file_named() {
    let n = migrate::newest_known();
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute(&format!(
        "DELETE FROM {} WHERE version = 3",
        migrate::HISTORY_TABLE
    ))
    .await
    .unwrap();
    let problems = migrate::check(&su, &[]).await.unwrap();
    assert_eq!(
        problems,
        vec![
            "migration V3__admitted_work.sql is not applied (run `qlsched db migrate`)".to_string(),
            format!(
                "this binary knows migrations up to V{n}; the database's newest is {}",
                newest_file(&su).await
            )
        ]
    );
}

/// The file name of the newest migration the database has applied.
async fn newest_file(c: &tokio_postgres::Client) -> String {
    let r = c
        .query_one(
            &format!(
                "SELECT version, name FROM {} ORDER BY version DESC LIMIT 1",
                migrate::HISTORY_TABLE
            ),
            &[],
        )
        .await
        .unwrap();
    migrate::file_name(r.get(0), &r.get::<_, String>(1))
}

/// A migration applied by hand, with no kind recorded, counts as a contract: this binary's
/// check refuses it naming it, and its `db migrate` refuses to touch the newer database.
#[tokio::test]
async fn an_unrecorded_newer_migration_is_refused_by_check_and_migrate() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute(&format!(
        "INSERT INTO {} (version, name, applied_on, checksum) VALUES (99, 'from_the_future', 'x', '1')",
        migrate::HISTORY_TABLE
    ))
    .await
    .unwrap();
    let problems = migrate::check(&su, &[]).await.unwrap();
    let n = migrate::newest_known();
    assert_eq!(
        problems,
        vec![format!(
            "the database is at V99__from_the_future.sql, migrated past this binary (which knows up \
             to V{n}) by the contract migration V99__from_the_future.sql: it serves only binaries \
             that know V99 or later; run a binary that knows V99__from_the_future.sql \
             (docs/operations.md, upgrades)"
        )]
    );
    let err = migrate::migrate(&db.config("qlsched_owner"), &roles())
        .await
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        "refusing to migrate: migration V99__from_the_future.sql is applied in the database but \
         unknown to this binary"
    );
}

#[tokio::test]
async fn a_wrong_capability_version_is_refused() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute("UPDATE qlsched.capability SET version = 7")
        .await
        .unwrap();
    let problems = migrate::check(&su, &[]).await.unwrap();
    assert_eq!(problems, vec!["capability is cluster_scheduler_admission v7, this binary needs cluster_scheduler_admission v1"]);
}

#[tokio::test]
async fn an_extra_grant_is_reported_by_check() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute("GRANT INSERT ON qlsched.trigger_schedules TO qlsched_runtime")
        .await
        .unwrap();
    let problems = migrate::check(&su, &[("qlsched_runtime", "runtime")])
        .await
        .unwrap();
    assert_eq!(
        problems,
        vec!["role qlsched_runtime has INSERT on qlsched.trigger_schedules, which it must not"]
    );
}

#[test]
fn role_prefixes_are_validated() {
    assert!(Roles::with_prefix("Bad-Prefix").is_err());
    assert!(Roles::with_prefix("").is_err());
    assert_eq!(
        Roles::with_prefix("acme").unwrap().worker_ingress,
        "acme_worker_ingress"
    );
}

const ALL_ROLES: [(&str, &str); 4] = [
    ("qlsched_admin", "admin"),
    ("qlsched_runtime", "runtime"),
    ("qlsched_worker_ingress", "worker_ingress"),
    ("qlsched_dispatcher", "dispatcher"),
];

/// A newer binary: this one's migrations and grants plus an expand migration that adds a
/// table the runtime role may read.
fn newer_binary() -> MigrationSet {
    let mut set = MigrationSet::embedded()
        .with_migration(
            "V90__newer_table.sql",
            "-- qlsched: expand\nCREATE TABLE qlsched.newer (x int);",
        )
        .unwrap();
    set.grants.push(Grant::table("runtime", "newer", "SELECT"));
    set
}

async fn migrate_as(db: &TestDb, set: &MigrationSet) -> Vec<String> {
    migrate::migrate_set(
        &db.config("qlsched_owner"),
        &roles(),
        set,
        &MigrateOptions::default(),
        &mut |w| panic!("unexpected wait: {w}"),
    )
    .await
    .unwrap()
}

/// Rolling upgrade, the expand half: after a newer binary's `db migrate`, this (older)
/// binary's readiness gate still accepts the database, including the newer migrator's
/// recorded grant on its new table; a grant made by hand on that table is still refused, and
/// so is checksum drift of a migration this binary knows.
#[tokio::test]
async fn a_later_expand_database_is_served_and_only_recorded_grants_accepted() {
    let db = TestDb::new().await;
    let newer = newer_binary();
    assert_eq!(migrate_as(&db, &newer).await, vec!["V90__newer_table"]);
    let su = db.superuser().await;
    assert_eq!(
        migrate::check(&su, &ALL_ROLES).await.unwrap(),
        Vec::<String>::new()
    );
    assert_eq!(
        migrate::check_with(&su, &ALL_ROLES, &newer).await.unwrap(),
        Vec::<String>::new()
    );
    // The newer binary's kind was recorded with its migration.
    let kind: String = su
        .query_one(
            "SELECT kind FROM qlsched.schema_compat WHERE version = 90",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(kind, "expand");
    su.batch_execute("GRANT INSERT ON qlsched.newer TO qlsched_runtime")
        .await
        .unwrap();
    assert_eq!(
        migrate::check(&su, &ALL_ROLES).await.unwrap(),
        vec!["role qlsched_runtime has INSERT on qlsched.newer, which it must not"]
    );
    su.batch_execute(&format!(
        "REVOKE INSERT ON qlsched.newer FROM qlsched_runtime;
         UPDATE {} SET checksum = '42' WHERE version = 2",
        migrate::HISTORY_TABLE
    ))
    .await
    .unwrap();
    assert_eq!(
        migrate::check(&su, &ALL_ROLES).await.unwrap(),
        vec!["migration V2__trigger_schedules.sql was changed after it was applied (checksum differs)"]
    );
}

/// Rolling upgrade, the contract half: once a newer binary applied a contract migration,
/// this binary is refused, naming its newest migration, the database's newest and the
/// contract; the newer binary itself is served.
#[tokio::test]
async fn a_contract_database_is_refused_by_the_older_binary_naming_the_migration() {
    let db = TestDb::new().await;
    let newest = newer_binary()
        .with_migration(
            "V91__drop_newer_x.sql",
            "-- qlsched: contract\nALTER TABLE qlsched.newer DROP COLUMN x;",
        )
        .unwrap()
        .with_migration(
            "V92__later_expand.sql",
            "-- qlsched: expand\nALTER TABLE qlsched.newer ADD COLUMN y int;",
        )
        .unwrap();
    migrate_as(&db, &newest).await;
    let su = db.superuser().await;
    let n = migrate::newest_known();
    assert_eq!(
        migrate::check(&su, &ALL_ROLES).await.unwrap(),
        vec![format!(
            "the database is at V92__later_expand.sql, migrated past this binary (which knows up \
             to V{n}) by the contract migration V91__drop_newer_x.sql: it serves only binaries \
             that know V91 or later; run a binary that knows V91__drop_newer_x.sql \
             (docs/operations.md, upgrades)"
        )]
    );
    assert_eq!(
        migrate::check_with(&su, &ALL_ROLES, &newest).await.unwrap(),
        Vec::<String>::new()
    );
}

/// `db status` (the real binary): applied migrations with kind and checksum, the range, this
/// binary, and each live replica's version as its guard row records it; `--json` too.
#[tokio::test]
async fn db_status_shows_migrations_range_binary_and_replica_versions() {
    let db = TestDb::new().await;
    migrate_as(&db, &newer_binary()).await;
    let runtime = db.client("qlsched_runtime").await;
    qlsched::store::replicas::acquire(&runtime, "r-status", uuid::Uuid::new_v4(), "h1", 7, 60_000)
        .await
        .unwrap();
    let n = migrate::newest_known();
    let out = ok(ql(&db, &["db", "status", "--json"]));
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    // No contract after the baseline (V11): every later migration is an expand.
    assert_eq!(v["floor"], 11, "{out}");
    assert_eq!(v["newest"], 90, "{out}");
    assert_eq!(v["binary_newest_migration"], n, "{out}");
    assert_eq!(v["binary_version"], migrate::BINARY_VERSION, "{out}");
    assert_eq!(v["binary_served"], true, "{out}");
    let applied = v["applied"].as_array().unwrap();
    let last = applied.last().unwrap();
    assert_eq!(last["file"], "V90__newer_table.sql");
    assert_eq!(last["kind"], "expand");
    assert_eq!(last["binary"], "unknown");
    let ours = applied.iter().find(|a| a["version"] == n).unwrap();
    assert_eq!(ours["binary"], "same");
    assert!(
        ours["checksum"].as_str().unwrap().parse::<u64>().is_ok(),
        "{ours}"
    );
    assert!(
        ours["applied_on"].as_str().unwrap().ends_with('Z'),
        "{ours}"
    );
    let replicas = v["replicas"].as_array().unwrap();
    assert_eq!(replicas.len(), 1, "{out}");
    assert_eq!(replicas[0]["replica_id"], "r-status");
    assert_eq!(replicas[0]["binary_version"], migrate::BINARY_VERSION);
    assert_eq!(replicas[0]["newest_migration"], n);
    let text = ok(ql(&db, &["db", "status"]));
    eprintln!("{text}");
    for needle in [
        "V90__newer_table.sql",
        "(newer than this binary)",
        "compatible range: V11..V90",
        &format!("knows up to V{n}: served by this database"),
        "r-status",
    ] {
        assert!(text.contains(needle), "`{needle}` missing:\n{text}");
    }
}

/// The replica's readiness gate (the real binary): it starts on a database a newer binary
/// expanded, and refuses to start once that binary applied a contract, naming it.
#[tokio::test]
async fn a_replica_starts_on_a_later_expand_database_and_refuses_a_contract() {
    let db = TestDb::new().await;
    let newer = newer_binary();
    migrate_as(&db, &newer).await;
    let mut a = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "a", "", &[]);
    a.wait_ready(Duration::from_secs(30)).await;
    assert!(a.terminate(Duration::from_secs(20)).await.success());
    let contract = newer
        .with_migration(
            "V91__drop_newer_x.sql",
            "-- qlsched: contract\nALTER TABLE qlsched.newer DROP COLUMN x;",
        )
        .unwrap();
    migrate_as(&db, &contract).await;
    let mut b = ReplicaProc::spawn(&db.dsn("qlsched_runtime"), "b", "", &[]);
    assert!(!b.wait_exit(Duration::from_secs(30)).await.success());
    assert!(
        b.log()
            .contains("by the contract migration V91__drop_newer_x.sql"),
        "{}",
        b.log()
    );
}
