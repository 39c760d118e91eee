//! `db migrate` on a live database (docs/design.md, "Schema changes and rolling upgrades"):
//! a migration behind a long reader lets go of its lock request after `lock_timeout`, so
//! admissions keep committing; it retries with a back-off, gives up after `--max-wait` with
//! nothing of it applied, and succeeds once the reader is gone. An interrupted concurrent
//! index build is resumed by the next run.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use qlsched::db::{self, StoreError};
use qlsched::schema::{self, ConcurrentIndex, MigrateOptions, MigrationSet};

use crate::helpers::claimed::admission;
use crate::helpers::cli::{command, ok, refused};
use crate::helpers::drive::{admit_once, claim_due};
use crate::helpers::roles;
use crate::helpers::{wait_until, TestDb};

/// `db migrate` of [`with_runs_column`] as the owner, which must not wait.
async fn migrate_runs_column(
    db: &TestDb,
    opts: &MigrateOptions,
) -> Result<Vec<String>, StoreError> {
    schema::migrate_set(
        &db.config("qlsched_owner"),
        &roles(),
        &with_runs_column(),
        opts,
        &mut |w| panic!("unexpected wait: {w}"),
    )
    .await
}

/// An expand migration that needs ACCESS EXCLUSIVE on runs for a moment (a catalog change).
fn with_runs_column() -> MigrationSet {
    MigrationSet::embedded()
        .with_migration(
            "V90__runs_note.sql",
            "-- qlsched: expand\nALTER TABLE qlsched.runs ADD COLUMN note text;",
        )
        .unwrap()
}

async fn has_note_column(db: &TestDb) -> bool {
    db.count(
        "SELECT count(*) FROM information_schema.columns
          WHERE table_schema = 'qlsched' AND table_name = 'runs' AND column_name = 'note'",
    )
    .await
        == 1
}

#[tokio::test]
async fn a_migration_behind_a_long_reader_never_blocks_admissions_and_gives_up_then_succeeds() {
    let db = TestDb::with_due(60).await;
    // The long reader: a report holding ACCESS SHARE on runs.
    let reader = db.superuser().await;
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM qlsched.runs")
        .await
        .unwrap();
    let opts = MigrateOptions {
        lock_timeout: Duration::from_millis(300),
        max_wait: Duration::from_secs(2),
    };
    let waits = Arc::new(Mutex::new(Vec::new()));
    let migrating = {
        let (owner, set, opts, waits) = (
            db.config("qlsched_owner"),
            with_runs_column(),
            opts.clone(),
            waits.clone(),
        );
        tokio::spawn(async move {
            schema::migrate_set(&owner, &roles(), &set, &opts, &mut |w| {
                waits.lock().unwrap().push(w.to_string())
            })
            .await
        })
    };
    // One `db migrate` at a time: a second one is refused while the first waits.
    wait_until(
        "the first migrate's advisory lock",
        Duration::from_secs(10),
        || async {
            db.count(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
                    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
            )
            .await
                == 1
        },
    )
    .await;
    let second = migrate_runs_column(&db, &opts).await.unwrap_err();
    assert!(
        matches!(&second, StoreError::MigrateRunning(h) if h.0.iter().any(|h| h.pid > 0)),
        "{second}"
    );
    // Admissions (the engine's claim and admission statements) while the migration waits.
    let pool = db.runtime_pool(2);
    let conn = db::conn(&pool).await.unwrap();
    let (mut admitted, mut slowest) = (0, Duration::ZERO);
    let mut pace = tokio::time::interval(Duration::from_millis(30));
    while !migrating.is_finished() {
        pace.tick().await;
        let started = Instant::now();
        let rows = claim_due(&conn, "r1", 30_000, 1, uuid::Uuid::new_v4())
            .await
            .unwrap();
        let Some(row) = rows.first() else { break };
        admit_once(&conn, &admission(row)).await.unwrap();
        slowest = slowest.max(started.elapsed());
        admitted += 1;
    }
    let err = migrating.await.unwrap().unwrap_err();
    assert!(matches!(err, StoreError::MigrationGaveUp(_)), "{err}");
    let msg = err.to_string();
    for needle in [
        "gave up on migration V90__runs_note.sql after ",
        "nothing of it was applied",
        "(the last attempt waited for AccessExclusiveLock on qlsched.runs, held by: \
         qlsched.runs AccessShareLock by pid",
    ] {
        assert!(msg.contains(needle), "`{needle}` missing: {msg}");
    }
    let waits = waits.lock().unwrap().clone();
    eprintln!(
        "{admitted} admissions while migrating, slowest {slowest:?}; waits: {waits:#?}; {msg}"
    );
    // At least one retry (each wait is one), then the give-up.
    assert!(!waits.is_empty(), "{waits:?}");
    assert!(
        waits[0].starts_with(
            "migration V90__runs_note.sql could not take its locks within lock_timeout (attempt 1); \
             waited for AccessExclusiveLock on qlsched.runs, held by: qlsched.runs AccessShareLock \
             by pid"
        ),
        "{waits:?}"
    );
    // Admissions went on: each waited at most about one lock_timeout behind the migration's
    // queued request (without the time-out the first would wait for the reader).
    assert!(admitted >= 3, "only {admitted} admissions while migrating");
    assert!(
        slowest < Duration::from_millis(1000),
        "an admission took {slowest:?}"
    );
    assert!(!has_note_column(&db).await);
    // The reader goes: the next run applies it.
    reader.batch_execute("COMMIT").await.unwrap();
    let applied = migrate_runs_column(&db, &opts).await.unwrap();
    assert_eq!(applied, vec!["V90__runs_note"]);
    assert!(has_note_column(&db).await);
    db.assert_invariants().await;
}

/// Every migration this binary carries, `V<n>__<name>` in version order.
fn migration_names() -> Vec<String> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let mut names: Vec<(u32, String)> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| {
            let name = e.unwrap().file_name().into_string().unwrap();
            let stem = name.strip_suffix(".sql")?.to_string();
            let version = stem.strip_prefix('V')?.split("__").next()?.parse().ok()?;
            Some((version, stem))
        })
        .collect();
    names.sort();
    names.into_iter().map(|(_, n)| n).collect()
}

/// Undoes every migration after V18, newest first (for the tests that start from an older
/// schema): its objects only, the history rows are the caller's.
pub const UNDO_AFTER_V18: &str = "
    DROP FUNCTION qlsched.overlap_decide_with(tid[], text[], text[], text[], boolean[], bigint[], bigint[]),
                  qlsched.overlap_release(text[]);
    ALTER TABLE qlsched.trigger_overlap DROP COLUMN overlap_released;
    ALTER TABLE qlsched.trigger_schedules DROP COLUMN overlap_admitted;
    ALTER TABLE qlsched.trigger_overlap DROP COLUMN last_busy;
    ALTER TABLE qlsched.runs DROP COLUMN overlap_counted CASCADE;
    DROP FUNCTION qlsched.overlap_decide(tid[], text[], text[], text[], boolean[], bigint[]),
                  qlsched.overlap_undo(text[]);
    DROP FUNCTION qlsched.dispatch_take_start(text, text[], text[], integer, bigint),
                  qlsched.dispatch_finish_batch(uuid[], uuid[], text[], integer[], text[], text[], jsonb[]);
    CREATE OR REPLACE FUNCTION qlsched.run_status_moves_forward() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        step text := OLD.status || '>' || NEW.status;
    BEGIN
        IF NEW.status IS DISTINCT FROM OLD.status
           AND step NOT IN ('queued>dispatching', 'queued>cancelled',
               'dispatching>running', 'dispatching>failed', 'running>succeeded', 'running>failed')
           AND NOT (step IN ('dispatching>queued', 'running>queued', 'queued>failed')
                    AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER')) THEN
            RAISE EXCEPTION 'run % may not move from % to %', OLD.run_id, OLD.status, NEW.status
                USING ERRCODE = 'check_violation';
        END IF;
        IF NEW.cancelled IS DISTINCT FROM (NEW.status = 'cancelled') THEN
            RAISE EXCEPTION 'run %: cancelled is set together with status cancelled, and only then',
                OLD.run_id USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END
    $$;
    CREATE OR REPLACE FUNCTION qlsched.attempt_state_moves_forward() RETURNS trigger LANGUAGE plpgsql AS $$
    DECLARE
        step text := OLD.state || '>' || NEW.state;
    BEGIN
        IF NEW.state IS DISTINCT FROM OLD.state
           AND step NOT IN ('claimed>dispatching', 'claimed>abandoned',
               'dispatching>running', 'dispatching>failed', 'running>succeeded', 'running>failed')
           AND NOT (step IN ('dispatching>claimed', 'claimed>failed')
                    AND pg_has_role(current_user, (SELECT c.relowner FROM pg_catalog.pg_class c WHERE c.oid = TG_RELID), 'MEMBER')) THEN
            RAISE EXCEPTION 'attempt % may not move from % to %', OLD.attempt_id, OLD.state, NEW.state
                USING ERRCODE = 'check_violation';
        END IF;
        RETURN NEW;
    END
    $$;
    DROP FUNCTION qlsched.console_disable(text, text, text, text),
                  qlsched.console_enable(text, bigint, bigint, text, text),
                  qlsched.console_fire(text, text, uuid, uuid, uuid, text, text, text),
                  qlsched.console_backfill(text, bigint, bigint[], uuid[], uuid[], text, text, text),
                  qlsched.console_cancel_queued(text, bigint, bigint, text, text, text),
                  qlsched.console_request_cancel(uuid, text, text, text),
                  qlsched.console_admit(text, bigint[], uuid[], uuid[], text[], text[], text, text),
                  qlsched.console_lock_admittable(text), qlsched.console_check_who(text, text),
                  qlsched.console_audit(text, text, text, jsonb, text, text, text),
                  qlsched.console_snapshot(text), qlsched.console_diff(jsonb, jsonb);
    ALTER TABLE qlsched.triggers DROP COLUMN source_label;
    DROP TABLE qlsched.audit_log;
    DROP FUNCTION qlsched.prune_audit(bigint, integer, text, uuid), qlsched.audit_is_append_only();
    DROP TABLE qlsched.trigger_overlap;
    DROP FUNCTION qlsched.overlap_admit() CASCADE;
    DROP FUNCTION qlsched.overlap_run_ended() CASCADE;
    DROP FUNCTION qlsched.overlap_counted() CASCADE;
    DROP FUNCTION qlsched.overlap_replace(text, bigint), qlsched.overlap_adopt(text),
                  qlsched.overlap_record_skip(text, bigint, bigint),
                  qlsched.overlap_prune_skips(bigint);
    ALTER TABLE qlsched.runs DROP COLUMN overlap_policy;
    ALTER TABLE qlsched.triggers DROP COLUMN overlap_policy;
    ALTER TABLE qlsched.runs DROP COLUMN due_at_ms;
    ALTER TABLE qlsched.triggers DROP COLUMN jitter_ms, DROP COLUMN start_at_ms, DROP COLUMN end_at_ms;
    DROP FUNCTION qlsched.trigger_outcome_of_run(), qlsched.trigger_outcome_follows_trigger() CASCADE;
    DROP TABLE qlsched.trigger_outcomes;
    ALTER TABLE qlsched.triggers DROP COLUMN pause_after_failures, DROP COLUMN expect_success_within_ms;";

/// Takes `db` back to the schema V18 left ([`UNDO_AFTER_V18`], the later history and
/// compatibility rows deleted) with the rows written before, then migrates it forward again
/// as the owner; returns the migrations applied.
pub async fn back_to_v18_and_migrate(db: &TestDb) -> Vec<String> {
    db.superuser()
        .await
        .batch_execute(&format!(
            "{UNDO_AFTER_V18}
             DELETE FROM {} WHERE version > 18;
             DELETE FROM qlsched.schema_compat WHERE version > 18",
            schema::HISTORY_TABLE
        ))
        .await
        .unwrap();
    schema::migrate(&db.config("qlsched_owner"), &roles())
        .await
        .unwrap()
}

/// The real binary behind a reader: each wait on stderr, then exit 1 with V13 not applied;
/// after the reader, V13 and V14 apply and `db check` passes.
#[tokio::test]
async fn db_migrate_reports_each_wait_gives_up_with_exit_1_and_resumes() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    // The database as the release before V13 left it: V13 and later not applied (V15 replaces
    // V11's and V12's functions and drops nothing they need; they stay).
    su.batch_execute(&format!(
        "{UNDO_AFTER_V18}
         DROP FUNCTION qlsched.dispatch_take_batch(text, text[], text[], integer, bigint);
         DROP INDEX qlsched.runs_take_idx, qlsched.runs_queued_legacy_idx;
         ALTER TABLE qlsched.runs DROP COLUMN pool, DROP COLUMN executor;
         ALTER TABLE qlsched.execution_revisions DROP COLUMN pool, DROP COLUMN executor;
         DROP TABLE qlsched.schema_compat, qlsched.grant_manifest, qlsched.pruned_occurrences;
         DROP FUNCTION qlsched.keep_pruned_out(uuid[]);
         DROP FUNCTION qlsched.maintenance_horizon_is_guarded() CASCADE;
         REVOKE UPDATE (finished_after_floor_ms) ON qlsched.maintenance FROM qlsched_admin;
         ALTER TABLE qlsched.maintenance DROP COLUMN finished_after_floor_ms;
         ALTER TABLE qlsched.replicas DROP COLUMN binary_version, DROP COLUMN newest_migration;
         ALTER TABLE qlsched.trigger_schedules DROP COLUMN admitted_through_ms;
         DROP FUNCTION qlsched.attempt_follows_the_protocol() CASCADE;
         DROP FUNCTION qlsched.attempt_is_the_only_live_one() CASCADE;
         DROP FUNCTION qlsched.run_event_follows_its_run() CASCADE;
         DROP FUNCTION qlsched.refuse_revision_update() CASCADE;
         DROP FUNCTION qlsched.spec_setting(text, text, bigint, bigint, bigint),
                       qlsched.spec_pool(text),
                       qlsched.dispatch_take(text, text[], integer, bigint),
                       qlsched.dispatch_held(uuid, uuid, text[]),
                       qlsched.dispatch_start(uuid, uuid, bigint),
                       qlsched.dispatch_heartbeat(uuid, uuid, bigint),
                       qlsched.dispatch_finish(uuid, uuid, text, integer, text, text, jsonb),
                       qlsched.dispatch_release(uuid, uuid),
                       qlsched.dispatch_expire(integer),
                       qlsched.request_cancel(uuid[]),
                       qlsched.spec_executor(text),
                       qlsched.dispatch_take_executable(text, text[], text[], integer, bigint);
         ALTER TABLE qlsched.runs DROP COLUMN cancel_requested_at_ms;
         DROP INDEX qlsched.runs_queued_order_idx, qlsched.attempts_lease_expiry_idx;
         ALTER TABLE qlsched.attempts DROP COLUMN not_before_ms, DROP COLUMN exit_status,
                                      DROP COLUMN output_tail;
         DELETE FROM {} WHERE version >= 13",
        schema::HISTORY_TABLE
    ))
    .await
    .unwrap();
    let reader = db.superuser().await;
    reader
        .batch_execute("BEGIN; SELECT count(*) FROM qlsched.replicas")
        .await
        .unwrap();
    let owner = db.dsn("qlsched_owner");
    let args = [
        "db",
        "migrate",
        "--dsn",
        &owner,
        "--lock-timeout",
        "300ms",
        "--max-wait",
        "1s",
    ];
    let err = refused(
        command(&db, &args).output().unwrap(),
        1,
        &[
            "qlsched: waiting: migration V13__schema_compat_and_replica_versions.sql could not take \
             its locks within lock_timeout (attempt 1); waited for AccessExclusiveLock on \
             qlsched.replicas, held by: qlsched.replicas AccessShareLock by pid",
            "retrying in 0.3 s",
            "qlsched: gave up on migration V13__schema_compat_and_replica_versions.sql after ",
            "nothing of it was applied",
        ],
    );
    assert!(!err.contains("attempt 9"), "{err}");
    assert_eq!(
        db.count("SELECT count(*) FROM pg_class WHERE relname = 'schema_compat'")
            .await,
        0
    );
    reader.batch_execute("COMMIT").await.unwrap();
    let out = ok(command(&db, &args).output().unwrap());
    let names = migration_names();
    let newest = schema::newest_known();
    // No contract after the baseline: every later migration is an expand.
    let floor = 11;
    let from_v13: Vec<String> = names.into_iter().skip(12).collect();
    assert_eq!(
        out,
        format!("applied {}; grants installed\n", from_v13.join(", "))
    );
    let ready = ok(
        command(&db, &["db", "check", "--dsn", &db.dsn("qlsched_runtime")])
            .output()
            .unwrap(),
    );
    assert!(
        ready.starts_with(&format!(
            "database ready: migrations (the database at V{newest}, serving binaries that \
                 know V{floor} or later; this binary knows up to V{newest})"
        )),
        "{ready}"
    );
}

#[tokio::test]
async fn an_interrupted_concurrent_index_build_is_resumed_by_the_next_migrate() {
    let db = TestDb::new().await;
    let owner = db.client("qlsched_owner").await;
    // A unique index over duplicate rows: the build fails after creating the index, which
    // is left INVALID, as a cancelled or crashed build leaves it.
    owner
        .batch_execute(
            "CREATE TABLE qlsched.scratch (x int); INSERT INTO qlsched.scratch VALUES (1), (1)",
        )
        .await
        .unwrap();
    let mut set = MigrationSet::embedded();
    set.indexes.push(ConcurrentIndex {
        version: schema::newest_known(),
        name: "scratch_x_key",
        unique: true,
        on: "qlsched.scratch (x)",
    });
    let (cfg, roles, opts) = (
        db.config("qlsched_owner"),
        roles(),
        MigrateOptions::default(),
    );
    let run = || async {
        schema::migrate_set(&cfg, &roles, &set, &opts, &mut |w| {
            panic!("unexpected wait: {w}")
        })
        .await
    };
    let index = || async {
        owner
            .query_opt(
                "SELECT i.indexrelid::oid, i.indisvalid FROM pg_index i
                  WHERE i.indexrelid = to_regclass('qlsched.scratch_x_key')",
                &[],
            )
            .await
            .unwrap()
            .map(|r| (r.get::<_, u32>(0), r.get::<_, bool>(1)))
    };
    let err = run().await.unwrap_err().to_string();
    assert!(
        err.starts_with("building index qlsched.scratch_x_key CONCURRENTLY (migration V")
            && err.contains("left INVALID"),
        "{err}"
    );
    let (invalid, valid) = index().await.expect("the interrupted build left its index");
    assert!(!valid);
    owner
        .batch_execute(
            "UPDATE qlsched.scratch SET x = 2 WHERE ctid = (SELECT min(ctid) FROM qlsched.scratch)",
        )
        .await
        .unwrap();
    run().await.unwrap();
    let (rebuilt, valid) = index().await.unwrap();
    assert!(valid);
    assert_ne!(
        rebuilt, invalid,
        "the INVALID index was dropped and built again"
    );
    // A valid one is kept as it is.
    run().await.unwrap();
    assert_eq!(index().await, Some((rebuilt, true)));
}
