use qlsched::store::migrate::{self, Drift, Roles};

use crate::helpers::{TestDb, PREFIX};

fn roles() -> Roles {
    Roles::with_prefix(PREFIX).unwrap()
}

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
        vec!["migration V3__admitted_work.sql is not applied (run `qlsched db migrate`)"]
    );
}

#[tokio::test]
async fn an_extra_migration_is_refused_by_check_with_its_file_named() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute(&format!(
        "INSERT INTO {} (version, name, applied_on, checksum) VALUES (99, 'from_the_future', 'x', '1')",
        migrate::HISTORY_TABLE
    ))
    .await
    .unwrap();
    let problems = migrate::check(&su, &[]).await.unwrap();
    assert_eq!(problems, vec!["migration V99__from_the_future.sql is applied in the database but unknown to this binary"]);
    let err = migrate::migrate(&db.config("qlsched_owner"), &roles())
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("V99__from_the_future.sql"),
        "{err}"
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
