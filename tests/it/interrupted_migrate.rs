//! An interrupted `db migrate` (docs/design.md, "Schema changes and rolling upgrades"): every
//! migration commits with its history row, its kind and the grants (with their manifest) of
//! what exists once it is applied, so a `db migrate` killed between any two migrations leaves
//! a database that the binary of the last applied migration accepts, that the binary before
//! it accepts when that migration is a recorded expand, that the newest binary reports as an
//! older schema to migrate, and on which the next `db migrate` completes.
//!
//! The walk goes over every migration of the stream: each step copies the database the
//! previous binary migrated (`CREATE DATABASE … TEMPLATE`), kills a `db migrate` of the
//! whole stream right after the next migration commits, judges the result, then lets a
//! second `db migrate` finish it.

use std::time::Instant;

use qlsched::store::migrate::{
    self, compat::BASELINE, Grant, Kind, MigrateOptions, MigrationSet, Object,
};
use tokio_postgres::Client;

use crate::helpers::roles;
use crate::helpers::{cluster, pg_config, TestDb, NEXT_DB, PREFIX};

const ALL_ROLES: [(&str, &str); 4] = [
    ("qlsched_admin", "admin"),
    ("qlsched_runtime", "runtime"),
    ("qlsched_worker_ingress", "worker_ingress"),
    ("qlsched_dispatcher", "dispatcher"),
];

fn owner() -> String {
    format!("{PREFIX}_owner")
}

fn next_name(letter: &str) -> String {
    format!(
        "{letter}{}_{}",
        std::process::id(),
        NEXT_DB.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
    )
}

/// An empty database as `db bootstrap` leaves it (schema, no migration).
async fn empty_db() -> TestDb {
    let port = cluster().port;
    let name = next_name("k");
    migrate::bootstrap(&pg_config(port, "postgres", "postgres"), &roles(), &name)
        .await
        .expect("bootstrap");
    TestDb { name, port }
}

/// A copy of `db` (nobody may be connected to it), with PUBLIC's TEMPORARY revoked as
/// `db bootstrap` leaves a database (`CREATE DATABASE` does not copy database grants).
async fn copy(db: &TestDb) -> TestDb {
    let name = next_name("k");
    let su = qlsched::store::connect(&pg_config(db.port, "postgres", "postgres"))
        .await
        .unwrap();
    su.batch_execute(&format!(
        "CREATE DATABASE {name} TEMPLATE {} OWNER {}",
        db.name,
        owner()
    ))
    .await
    .expect("copy the database");
    su.batch_execute(&format!("REVOKE TEMPORARY ON DATABASE {name} FROM PUBLIC"))
        .await
        .expect("revoke TEMPORARY on the copy");
    TestDb {
        name,
        port: db.port,
    }
}

async fn drop_db(db: TestDb) {
    let su = qlsched::store::connect(&pg_config(db.port, "postgres", "postgres"))
        .await
        .unwrap();
    su.batch_execute(&format!("DROP DATABASE {} WITH (FORCE)", db.name))
        .await
        .unwrap();
}

/// Whether a grant's object exists in the database (read from the catalog here, not by the
/// code under test).
async fn exists(c: &Client, g: &Grant) -> bool {
    let row = match &g.object {
        Object::Table(t) => {
            c.query_one(
                "SELECT to_regclass(format('qlsched.%I', $1::text)) IS NOT NULL",
                &[t],
            )
            .await
        }
        Object::Column(t, col) => {
            c.query_one(
                "SELECT EXISTS (SELECT 1 FROM pg_attribute
                                 WHERE attrelid = to_regclass(format('qlsched.%I', $1::text))
                                   AND attname = $2 AND attnum > 0 AND NOT attisdropped)",
                &[t, col],
            )
            .await
        }
        Object::Function(f) => {
            c.query_one("SELECT to_regprocedure($1) IS NOT NULL", &[f])
                .await
        }
    };
    row.unwrap().get(0)
}

/// The binary whose newest migration is `version`: the stream up to it, and the grants of
/// `set` on what exists once it is applied (as read in `c`, a database at `version`).
async fn binary_of(set: &MigrationSet, version: i32, c: &Client) -> MigrationSet {
    let mut grants = Vec::new();
    for g in &set.grants {
        if exists(c, g).await {
            grants.push(g.clone());
        }
    }
    MigrationSet {
        migrations: set
            .migrations
            .iter()
            .filter(|m| m.version() <= version)
            .cloned()
            .collect(),
        grants,
        indexes: set
            .indexes
            .iter()
            .filter(|i| i.version <= version)
            .copied()
            .collect(),
    }
}

/// The kind the database recorded for a migration (None: no `schema_compat` yet, or no row).
async fn recorded_kind(c: &Client, version: i32) -> Option<String> {
    let has: bool = c
        .query_one(
            "SELECT to_regclass('qlsched.schema_compat') IS NOT NULL",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    if !has {
        return None;
    }
    c.query_opt(
        "SELECT kind FROM qlsched.schema_compat WHERE version = $1",
        &[&version],
    )
    .await
    .unwrap()
    .map(|r| r.get(0))
}

/// Kills a `db migrate` of `set` after each of its migrations newer than `from` in turn and
/// returns every failure found, one line each. Step n copies a database at V(n-1) as the
/// binary of V(n-1) migrated it (`start`, at `from`, nobody connected; `before` is the
/// binary that migrated it, if any), which the binary of Vn then migrates for the next step.
async fn walk(
    set: &MigrationSet,
    start: TestDb,
    from: i32,
    mut before: Option<MigrationSet>,
) -> Vec<String> {
    let opts = MigrateOptions::default();
    let newest = set.newest();
    let mut failures = Vec::new();
    let prev = start;
    for m in set.migrations.iter().filter(|m| m.version() > from) {
        let n = m.version();
        let file = migrate::file_name(n, m.name());
        let work = copy(&prev).await;
        let applied =
            migrate::migrate_set_killed_after(&work.config(&owner()), &roles(), set, &opts, n)
                .await
                .unwrap_or_else(|e| panic!("db migrate killed after {file}: {e}"));
        assert_eq!(applied.last(), Some(&m.to_string()), "killed after {file}");
        let su = work.superuser().await;
        let at_n = binary_of(set, n, &su).await;
        // The next step starts from the database as the binary of Vn's own `db migrate`
        // leaves it.
        migrate::migrate_set(&prev.config(&owner()), &roles(), &at_n, &opts, &mut |w| {
            panic!("unexpected wait: {w}")
        })
        .await
        .unwrap_or_else(|e| panic!("db migrate of the binary of V{n}: {e}"));

        // Its kind, in its own transaction (once the database records kinds at all).
        let kind = recorded_kind(&su, n).await;
        if let Some(k) = &kind {
            if k != set.kind(n).as_str() {
                failures.push(format!(
                    "killed after {file}: its kind is recorded as {k}, not {}",
                    set.kind(n)
                ));
            }
        }

        // The binary of Vn accepts the database (binaries before the baseline predate
        // schema ranges: a database at the baseline or later serves none of them).
        let problems = migrate::check_with(&su, &ALL_ROLES, &at_n).await.unwrap();
        if n >= BASELINE && !problems.is_empty() {
            failures.push(format!(
                "killed after {file}: the binary of V{n} refuses it: {problems:?}"
            ));
        }

        // The binary before it accepts it when Vn is a recorded expand, and otherwise
        // refuses it naming the migration that made the difference (binaries up to the
        // baseline predate schema ranges and are not judged).
        if let Some(b) = before.as_ref().filter(|_| n > BASELINE) {
            let problems = migrate::check_with(&su, &ALL_ROLES, b).await.unwrap();
            let served = kind.as_deref() == Some(Kind::Expand.as_str());
            let named = problems.len() == 1
                && problems[0].contains(&format!("by the contract migration {file}"));
            if served && !problems.is_empty() {
                failures.push(format!(
                    "killed after {file} (an expand): the binary of V{} refuses it: {problems:?}",
                    b.newest()
                ));
            } else if !served && !named {
                failures.push(format!(
                    "killed after {file} (a contract or unrecorded): the binary of V{} should be \
                     refused naming it, got {problems:?}",
                    b.newest()
                ));
            }
        }

        // The newest binary: an older schema, to migrate.
        let mut expected: Vec<String> = set
            .migrations
            .iter()
            .filter(|l| l.version() > n)
            .map(|l| {
                format!(
                    "migration {} is not applied (run `qlsched db migrate`)",
                    migrate::file_name(l.version(), l.name())
                )
            })
            .collect();
        if n < newest {
            expected.push(format!(
                "this binary knows migrations up to V{newest}; the database's newest is {file}"
            ));
        }
        let problems = migrate::check_with(&su, &ALL_ROLES, set).await.unwrap();
        if problems != expected {
            failures.push(format!(
                "killed after {file}: the binary of V{newest} should see an older schema to \
                 migrate ({expected:?}), got {problems:?}"
            ));
        }

        // The next `db migrate` completes, and the newest binary accepts the result.
        drop(su);
        let rest = migrate::migrate_set(&work.config(&owner()), &roles(), set, &opts, &mut |w| {
            panic!("unexpected wait: {w}")
        })
        .await
        .unwrap_or_else(|e| panic!("db migrate after the one killed after {file}: {e}"));
        let want: Vec<String> = set
            .migrations
            .iter()
            .filter(|l| l.version() > n)
            .map(|l| l.to_string())
            .collect();
        assert_eq!(rest, want, "resumed after {file}");
        let su = work.superuser().await;
        let problems = migrate::check_with(&su, &ALL_ROLES, set).await.unwrap();
        if !problems.is_empty() {
            failures.push(format!(
                "resumed after {file}: the binary of V{newest} refuses the result: {problems:?}"
            ));
        }
        drop(su);

        drop_db(work).await;
        before = Some(at_n);
    }
    drop_db(prev).await;
    failures
}

/// Every migration this binary carries, from an empty database on: killed after each one,
/// `db migrate` leaves a database the binaries on both sides of it accept.
#[tokio::test]
async fn a_migrate_killed_after_any_migration_leaves_a_database_both_binaries_accept() {
    let t = Instant::now();
    let set = MigrationSet::embedded();
    let failures = walk(&set, empty_db().await, 0, None).await;
    eprintln!(
        "{} migrations walked in {:.1} s",
        set.migrations.len(),
        t.elapsed().as_secs_f64()
    );
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// A newer binary's `db migrate` of an expand with a new table and a new function (created
/// without revoking PUBLIC's EXECUTE, as a migration may), then a contract, killed after
/// each: this binary keeps accepting the database after the expand (a grant it needs that
/// the newer binary no longer makes is revoked only with the newer binary's last
/// migration), the newer binary's grants are there with it, and the contract is named.
#[tokio::test]
async fn a_newer_binarys_migrate_killed_after_an_expand_keeps_this_binary_accepting() {
    let mut newer = MigrationSet::embedded()
        .with_migration(
            "V9001__interrupted_expand.sql",
            "-- qlsched: expand
CREATE TABLE qlsched.interrupted (x int, y int);
CREATE FUNCTION qlsched.interrupted_count() RETURNS bigint LANGUAGE sql
    AS 'SELECT count(*) FROM qlsched.interrupted';",
        )
        .unwrap()
        .with_migration(
            "V9002__interrupted_contract.sql",
            "-- qlsched: contract\nALTER TABLE qlsched.interrupted DROP COLUMN y;",
        )
        .unwrap();
    newer
        .grants
        .push(Grant::table("runtime", "interrupted", "SELECT"));
    // A grant this binary needs and the newer one no longer makes.
    let dropped = Grant::table("admin", "capability", "SELECT");
    newer.grants.retain(|g| *g != dropped);
    newer
        .grants
        .push(Grant::function("runtime", "qlsched.interrupted_count()"));
    let failures = walk(
        &newer,
        TestDb::new().await,
        migrate::newest_known(),
        Some(MigrationSet::embedded()),
    )
    .await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
