//! The claim and the admission are prepared once per connection, so after the first
//! executions PostgreSQL may switch to a generic plan (planned without the parameter values).
//! These tests prove the generic plans keep the claim index's range scan and the admission's
//! TID access: a plan that regresses fails here, not in a benchmark.

use qlsched::store::admission::ADMIT_SQL;
use qlsched::store::claim::claim_variant;

use crate::helpers::{plan, TestDb};

/// A table shaped like production: 10,000 schedules, a few hundred claimed, history in runs.
async fn populated() -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::new().await;
    db.seed_bulk(10_000, "* * * * * *", 60_000).await;
    let su = db.superuser().await;
    su.batch_execute(concat!(
        "UPDATE qlsched.trigger_schedules SET claimable_at_ms = ",
        qlsched::db_now_ms!(),
        " - 1000, next_fire_at_ms = ",
        qlsched::db_now_ms!(),
        " - 1000 WHERE trigger_id < 'trg-00500';
         ANALYZE;"
    ))
    .await
    .unwrap();
    (db, su)
}

/// Every prepared claim variant (limits 1, 2, 4 … 256: the supervisor prepares the one for
/// its free budget, so the default budget's 64 and a nearly full replica's 1 both run in
/// production) keeps the claim index's range scan, after six executions and generically.
#[tokio::test]
async fn every_claim_variant_keeps_its_index_range_scan_after_six_executions_and_as_a_generic_plan()
{
    let (_db, su) = populated().await;
    let exec = "('probe', 30000, gen_random_uuid(), gen_random_uuid(), 30000)";
    let mut limits = Vec::new();
    let mut failures = Vec::new();
    for e in 0..=8u32 {
        let (variant, limit) = claim_variant(1 << e);
        assert_eq!(limit, 1 << e);
        // Its two lanes: three quarters oldest first, a quarter newest first.
        assert!(
            variant.contains(&format!("LIMIT {}\n", limit - limit / 4))
                && variant.contains(&format!("LIMIT {}\n", limit / 4)),
            "{variant}"
        );
        limits.push(limit);
        su.batch_execute(&format!(
            "PREPARE claim_{limit}(text, bigint, uuid, uuid, bigint) AS {variant}"
        ))
        .await
        .unwrap();
        // Six executions with the default plan cache mode (in a transaction rolled back, so
        // the rows stay due), then the plan PostgreSQL now uses.
        su.batch_execute("BEGIN; SET LOCAL plan_cache_mode = auto")
            .await
            .unwrap();
        for _ in 0..6 {
            su.batch_execute(&format!("EXECUTE claim_{limit}{exec}"))
                .await
                .unwrap();
        }
        let after_six = plan(
            &su,
            &format!("EXPLAIN (COSTS OFF) EXECUTE claim_{limit}{exec}"),
            &[],
        )
        .await;
        su.batch_execute("ROLLBACK; BEGIN; SET LOCAL plan_cache_mode = force_generic_plan")
            .await
            .unwrap();
        let generic = plan(
            &su,
            &format!("EXPLAIN (COSTS OFF) EXECUTE claim_{limit}{exec}"),
            &[],
        )
        .await;
        su.batch_execute("ROLLBACK").await.unwrap();
        for (what, p) in [("after six executions", &after_six), ("generic", &generic)] {
            let bad = if !p.contains("Index Scan using trigger_schedules_claimable_idx") {
                Some("no range scan of the claim index")
            } else if p.contains("Seq Scan on trigger_schedules") {
                Some("a sequential scan")
            } else if !p
                .contains("Index Scan using trigger_schedules_pkey on trigger_schedules s_2")
            {
                Some("the update does not reach the picked rows by primary key")
            } else if limit >= 4
                && !p.contains("Index Scan Backward using trigger_schedules_claimable_idx")
            {
                Some("no fresh lane (a backward range scan of the claim index)")
            } else if p.contains("Sort") {
                Some("a sort (the index gives the order)")
            } else {
                None
            };
            if let Some(bad) = bad {
                failures.push(format!("LIMIT {limit}, {what}: {bad}:\n{p}"));
            }
        }
    }
    assert_eq!(limits, [1, 2, 4, 8, 16, 32, 64, 128, 256]);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `projects` (and `tasks`, with one task for many triggers) hold a few rows, so autovacuum
/// never analyses them: on an install whose definitions came through the CLI they stay
/// "never analysed" (`reltuples` -1), and the planner then guesses hundreds of projects. The
/// claim's generic plan must not depend on that guess: with every schedule due (a boundary
/// herd), it still walks the claim index in order and stops at its limit — no sequential scan
/// of the schedules, no hash join over every due row, no sort.
#[tokio::test]
async fn the_claim_keeps_its_index_range_scan_when_projects_and_tasks_were_never_analysed() {
    let db = TestDb::new().await;
    db.seed_bulk(10_000, "* * * * * *", 60_000).await;
    let su = db.superuser().await;
    // seed_bulk analyses every table; put the two small ones back to the state autovacuum
    // leaves them in (never vacuumed or analysed), and make every schedule due.
    su.batch_execute(concat!(
        "UPDATE pg_class SET reltuples = -1, relpages = 0
          WHERE oid IN ('qlsched.projects'::regclass, 'qlsched.tasks'::regclass);
         DELETE FROM pg_statistic
          WHERE starelid IN ('qlsched.projects'::regclass, 'qlsched.tasks'::regclass);
         UPDATE qlsched.trigger_schedules SET claimable_at_ms = ",
        qlsched::db_now_ms!(),
        " - 1000, next_fire_at_ms = ",
        qlsched::db_now_ms!(),
        " - 1000;
         ANALYZE qlsched.trigger_schedules, qlsched.triggers;"
    ))
    .await
    .unwrap();
    let unanalysed: i64 = su
        .query_one(
            "SELECT count(*) FROM pg_class WHERE reltuples < 0
                AND oid IN ('qlsched.projects'::regclass, 'qlsched.tasks'::regclass)",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        unanalysed, 2,
        "the precondition: both tables look never analysed"
    );
    let (variant, limit) = claim_variant(64);
    su.batch_execute(&format!(
        "PREPARE claim(text, bigint, uuid, uuid, bigint) AS {variant};
         BEGIN; SET LOCAL plan_cache_mode = force_generic_plan"
    ))
    .await
    .unwrap();
    let p = plan(
        &su,
        "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF)
         EXECUTE claim('probe', 30000, gen_random_uuid(),
                       '00000000-0000-0000-0000-000000000000', 0)",
        &[],
    )
    .await;
    su.batch_execute("ROLLBACK").await.unwrap();
    assert_eq!(limit, 64);
    assert!(
        p.contains("rows=64"),
        "the claim leased its limit (no guard):\n{p}"
    );
    assert!(
        p.contains("Index Scan using trigger_schedules_claimable_idx"),
        "no range scan of the claim index:\n{p}"
    );
    assert!(
        !p.contains("Seq Scan on trigger_schedules") && !p.contains("Sort"),
        "the claim scans or sorts every due row:\n{p}"
    );
}

/// The admission reaches each schedule row by its TID (a tuple-level predicate lock under
/// SERIALIZABLE; a primary-key probe would lock whole B-tree leaf pages and make admissions of
/// neighbouring trigger ids conflict), whether planned with its values or generically.
#[tokio::test]
async fn the_admission_keeps_its_tid_access_after_six_executions_and_as_a_generic_plan() {
    let (_db, su) = populated().await;
    su.batch_execute(&format!("PREPARE admit AS {ADMIT_SQL}"))
        .await
        .unwrap();
    su.batch_execute("SET enable_seqscan = off").await.unwrap();
    let args = "ARRAY['(0,1)'], ARRAY['trg-00000'], ARRAY[1::int8], ARRAY[2::int8], ARRAY[0::int8],
                ARRAY['a'], ARRAY[gen_random_uuid()], ARRAY[1::int8], ARRAY[0::int8], ARRAY[0::int8],
                ARRAY[1000::int8], ARRAY['d'], ARRAY['task'], ARRAY[gen_random_uuid()],
                ARRAY[gen_random_uuid()], ARRAY['k'], ARRAY['a'], ARRAY[1000::int8],
                ARRAY[NULL::int8], ARRAY[NULL::text], ARRAY[false]";
    // Six executions (they admit nothing: the fence does not match), then the plan in use.
    for _ in 0..6 {
        su.batch_execute(&format!("EXECUTE admit({args})"))
            .await
            .unwrap();
    }
    let after_six = plan(
        &su,
        &format!("EXPLAIN (COSTS OFF) EXECUTE admit({args})"),
        &[],
    )
    .await;
    su.batch_execute("SET plan_cache_mode = force_generic_plan")
        .await
        .unwrap();
    let generic = plan(
        &su,
        &format!("EXPLAIN (COSTS OFF) EXECUTE admit({args})"),
        &[],
    )
    .await;
    for (what, p) in [("after six executions", &after_six), ("generic", &generic)] {
        assert!(p.contains("Tid Scan on trigger_schedules"), "{what}:\n{p}");
        assert!(
            !p.contains("Index Scan using trigger_schedules_pkey"),
            "{what}:\n{p}"
        );
        assert!(!p.contains("Seq Scan"), "{what}:\n{p}");
        // The tombstones of pruned occurrences (V15): one probe of their key per member.
        assert!(
            p.contains("Index Only Scan using pruned_occurrences_pkey")
                || p.contains("Index Scan using pruned_occurrences_pkey"),
            "{what}:\n{p}"
        );
    }
}

/// Right after a mass publish (10,000 triggers through the CLI), the replicas prepare the
/// admission before autovacuum has analysed the new rows: `triggers`, `trigger_schedules`,
/// `tasks`, `projects` and `execution_revisions` have no column statistics. The admission's
/// generic plan must not depend on them: it reaches the batch's schedule rows by TID and each
/// definition row by its key, and never scans a definition table.
#[tokio::test]
async fn the_admission_reaches_definitions_by_key_when_no_table_was_analysed() {
    let db = TestDb::new().await;
    db.seed_bulk(10_000, "* * * * * *", 60_000).await;
    let su = db.superuser().await;
    su.batch_execute(
        "UPDATE pg_class SET reltuples = -1, relpages = 0
          WHERE oid IN ('qlsched.projects'::regclass, 'qlsched.tasks'::regclass,
                        'qlsched.triggers'::regclass, 'qlsched.trigger_schedules'::regclass,
                        'qlsched.execution_revisions'::regclass);
         DELETE FROM pg_statistic
          WHERE starelid IN ('qlsched.projects'::regclass, 'qlsched.tasks'::regclass,
                             'qlsched.triggers'::regclass, 'qlsched.trigger_schedules'::regclass,
                             'qlsched.execution_revisions'::regclass);",
    )
    .await
    .unwrap();
    su.batch_execute(&format!(
        "PREPARE admit AS {ADMIT_SQL}; SET plan_cache_mode = force_generic_plan"
    ))
    .await
    .unwrap();
    // A batch of 64 live claims, and the admission's arguments read from those rows (so every
    // fence and definition check holds and each joined row is really reached).
    let args: String = su
        .query_one(
            concat!(
                "WITH picked AS (
                   UPDATE qlsched.trigger_schedules
                      SET claim_owner = 'a', claim_token = '00000000-0000-0000-0000-000000000001',
                          claim_version = 1, claim_expires_at_ms = n.e, claimable_at_ms = n.e,
                          next_fire_at_ms = 1000, updated_at_ms = 2000
                     FROM (SELECT ",
                qlsched::db_now_ms!(),
                " + 600000 AS e) n
                    WHERE trigger_id IN (SELECT trigger_id FROM qlsched.trigger_schedules
                                          ORDER BY trigger_id DESC LIMIT 64)
                   RETURNING ctid::text AS tid, trigger_id, trigger_revision AS rev, state_version AS sv
                 ), c AS (
                   SELECT p.*, t.content_digest AS tdig, t.task_id
                     FROM picked p JOIN qlsched.triggers t USING (trigger_id)
                 )
                 SELECT concat_ws(', ',
                     format('%L::text[]', array_agg(tid)), format('%L::text[]', array_agg(trigger_id)),
                     format('%L::int8[]', array_agg(rev)), format('%L::int8[]', array_agg(sv)),
                     format('%L::int8[]', array_agg(1000::int8)), format('%L::text[]', array_agg('a'::text)),
                     format('%L::uuid[]', array_agg('00000000-0000-0000-0000-000000000001'::uuid)),
                     format('%L::int8[]', array_agg(1::int8)), format('%L::int8[]', array_agg(2000::int8)),
                     format('%L::int8[]', array_agg(1000::int8)), format('%L::int8[]', array_agg(61000::int8)),
                     format('%L::text[]', array_agg(tdig)), format('%L::text[]', array_agg(task_id)),
                     format('%L::uuid[]', array_agg(gen_random_uuid())),
                     format('%L::uuid[]', array_agg(gen_random_uuid())),
                     format('%L::text[]', array_agg('ql3:cron:v1:' || trigger_id || ':' || rev || ':1000')),
                     format('%L::text[]', array_agg('a'::text)),
                     format('%L::int8[]', array_agg(61000::int8)),
                     format('%L::int8[]', array_agg(NULL::int8)),
                     format('%L::text[]', array_agg(NULL::text)),
                     format('%L::bool[]', array_agg(false)))
                   FROM c"
            ),
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let p = plan(
        &su,
        &format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF, TIMING OFF) EXECUTE admit({args})"),
        &[],
    )
    .await;
    // The buffers of the statement's schedule update (it includes the definition re-checks).
    let pages = crate::helpers::plan_buffers(&p, "Update on trigger_schedules s");
    assert!(
        crate::helpers::plan_actual_rows(&p, "Update on trigger_schedules s (") == 64,
        "the batch was not admitted whole:\n{p}"
    );
    assert!(p.contains("Tid Scan on trigger_schedules s"), "{p}");
    assert!(
        p.contains("Index Scan using triggers_pkey on triggers t"),
        "the trigger rows are not reached by key:\n{p}"
    );
    for bad in [
        "triggers_task_idx",
        "Seq Scan on triggers",
        "Seq Scan on trigger_schedules",
    ] {
        assert!(!p.contains(bad), "{bad}:\n{p}");
    }
    // About 20 pages per member (TID, four key probes, the update); the plan that walked the
    // task's triggers read thousands per member.
    assert!(pages < 64 * 40, "{pages} pages for 64 members:\n{p}");
}
