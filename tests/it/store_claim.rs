use std::time::Duration;

use qlsched::db;
use qlsched::store::claim;

use crate::helpers::{poll_until, unique_owner, TestDb};

#[tokio::test]
async fn pending_rows_come_first_then_due_rows_in_cursor_order_and_concurrent_claimers_take_disjoint_rows(
) {
    let db = TestDb::new().await;
    let ids = db.seed(6, "0 0 0 1 1 *").await;
    let su = db.superuser().await;
    // trg-00000..02 due 30 s, 20 s, 10 s ago; 03..04 pending initialisation (rows written
    // before V8 have no cursor); 05 in the future.
    for (i, off) in [(0, -30_000i64), (1, -20_000), (2, -10_000), (5, 60_000)] {
        su.execute(
            "UPDATE qlsched.trigger_schedules SET next_fire_at_ms = (extract(epoch FROM clock_timestamp())*1000)::bigint + $2,
                    claimable_at_ms = (extract(epoch FROM clock_timestamp())*1000)::bigint + $2 WHERE trigger_id = $1",
            &[&ids[i], &off],
        )
        .await
        .unwrap();
    }
    for i in [3, 4] {
        su.execute(
            "UPDATE qlsched.trigger_schedules SET next_fire_at_ms = NULL, claimable_at_ms = 0
              WHERE trigger_id = $1",
            &[&ids[i]],
        )
        .await
        .unwrap();
    }
    let pool = db.runtime_pool(2);
    let conn = db::conn(&pool).await.unwrap();
    let a = crate::helpers::drive::claim_due(&conn, "a", 30_000, 3, uuid::Uuid::new_v4())
        .await
        .unwrap();
    let got: Vec<&str> = a.iter().map(|r| r.trigger_id.as_str()).collect();
    assert_eq!(got.len(), 3);
    // pending ones first (NULLS FIRST), then the oldest due one
    assert!(
        got.contains(&"trg-00003") && got.contains(&"trg-00004") && got.contains(&"trg-00000"),
        "{got:?}"
    );
    let b = crate::helpers::drive::claim_due(&conn, "b", 30_000, 10, uuid::Uuid::new_v4())
        .await
        .unwrap();
    let got_b: Vec<&str> = b.iter().map(|r| r.trigger_id.as_str()).collect();
    assert_eq!(
        got_b,
        vec!["trg-00001", "trg-00002"],
        "the future row is not due; claimed rows are not retaken"
    );
    for r in a.iter().chain(b.iter()) {
        assert_eq!(r.fence.expires_at_ms, r.observed_at_ms + 30_000);
        assert_eq!(r.fence.version, 1);
    }
}

#[tokio::test]
async fn a_live_claim_is_never_taken_and_an_expired_one_only_after_the_database_expiry() {
    let db = TestDb::with_due(1).await;
    let pool = db.runtime_pool(2);
    let conn = db::conn(&pool).await.unwrap();
    let first =
        crate::helpers::drive::claim_due(&conn, &unique_owner("a"), 700, 10, uuid::Uuid::new_v4())
            .await
            .unwrap();
    assert_eq!(first.len(), 1);
    let expiry = first[0].fence.expires_at_ms;
    let b = unique_owner("b");
    drop(conn);
    let taken = poll_until(
        "the expired claim to be taken over",
        Duration::from_secs(10),
        || {
            let (pool, b) = (pool.clone(), b.clone());
            async move {
                let conn = db::conn(&pool).await.unwrap();
                let rows =
                    crate::helpers::drive::claim_due(&conn, &b, 30_000, 10, uuid::Uuid::new_v4())
                        .await
                        .unwrap();
                (!rows.is_empty()).then_some(rows)
            }
        },
    )
    .await;
    assert!(
        taken[0].observed_at_ms >= expiry,
        "taken at {} before expiry {expiry}",
        taken[0].observed_at_ms
    );
    assert_eq!(taken[0].fence.version, first[0].fence.version + 1);
    assert_ne!(taken[0].fence.token, first[0].fence.token);
    assert!(taken[0].state_version > first[0].state_version);
}

#[tokio::test]
async fn disabled_triggers_and_suspended_projects_are_not_claimed() {
    let db = TestDb::with_due(2).await;
    let mut admin = db.admin().await;
    let mut spec =
        qlsched::store::manage::TriggerSpec::new("trg-00000", "proj", "task", "* * * * * *", "UTC");
    spec.enabled = false;
    qlsched::store::manage::publish_trigger(&mut admin, &spec)
        .await
        .unwrap();
    let pool = db.runtime_pool(2);
    let conn = db::conn(&pool).await.unwrap();
    let rows = crate::helpers::drive::claim_due(&conn, "a", 30_000, 10, uuid::Uuid::new_v4())
        .await
        .unwrap();
    assert_eq!(
        rows.iter()
            .map(|r| r.trigger_id.as_str())
            .collect::<Vec<_>>(),
        vec!["trg-00001"]
    );
    qlsched::store::release::release_claim(&conn, "trg-00001", &rows[0].fence, 0)
        .await
        .unwrap();
    qlsched::store::manage::set_project(&mut admin, "proj", "suspended")
        .await
        .unwrap();
    assert!(
        crate::helpers::drive::claim_due(&conn, "a", 30_000, 10, uuid::Uuid::new_v4())
            .await
            .unwrap()
            .is_empty()
    );
    qlsched::store::manage::set_project(&mut admin, "proj", "active")
        .await
        .unwrap();
    assert_eq!(
        crate::helpers::drive::claim_due(&conn, "a", 30_000, 10, uuid::Uuid::new_v4())
            .await
            .unwrap()
            .len(),
        1
    );
}

/// The claim is an index range scan that never visits live-claimed rows: with 1,000 live
/// claims in front of 1,000 due rows, the plan has no sort and no sequential scan of the
/// schedules, and the index scan removes nothing by filter.
#[tokio::test]
async fn the_claim_is_an_index_range_scan_that_never_visits_live_claims() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    su.batch_execute(
        "INSERT INTO qlsched.projects VALUES ('proj', 'active', 0, 0);
         INSERT INTO qlsched.execution_revisions VALUES ('00000000-0000-0000-0000-000000000001', 'proj', 'remote_worker', 'x', encode(sha256('x'), 'hex'), 0);
         INSERT INTO qlsched.tasks VALUES ('task', 'proj', 1, repeat('a', 64), '00000000-0000-0000-0000-000000000001', 0);
         INSERT INTO qlsched.triggers (trigger_id, project_id, task_id, revision, cron_expr, timezone, content_digest, updated_at_ms)
              SELECT 'trg-' || lpad(g::text, 6, '0'), 'proj', 'task', 1, '* * * * * *', 'UTC', repeat('b', 64), 0 FROM generate_series(1, 20000) g;
         INSERT INTO qlsched.trigger_schedules (trigger_id, project_id, trigger_revision, next_fire_at_ms, claimable_at_ms, updated_at_ms)
              SELECT trigger_id, 'proj', 1, 1000 + (row_number() OVER ()), 1000 + (row_number() OVER ()), 0 FROM qlsched.triggers;
         ANALYZE;",
    )
    .await
    .unwrap();
    let pool = db.runtime_pool(2);
    let conn = db::conn(&pool).await.unwrap();
    let live =
        crate::helpers::drive::claim_due(&conn, "holder", 600_000, 1000, uuid::Uuid::new_v4())
            .await
            .unwrap();
    assert_eq!(live.len(), 1000);
    su.batch_execute("ANALYZE qlsched.trigger_schedules")
        .await
        .unwrap();
    su.batch_execute("BEGIN").await.unwrap();
    let sql = claim::CLAIM_DUE_SQL
        .replace("$1", "'probe'")
        .replace("$2", "30000")
        .replace("$3", "16")
        .replace("$4", "gen_random_uuid()")
        .replace("$5", "'00000000-0000-0000-0000-000000000000'")
        .replace("$6", "0");
    let plan = crate::helpers::plan(
        &su,
        &format!("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) {sql}"),
        &[],
    )
    .await;
    su.batch_execute("ROLLBACK").await.unwrap();
    let text = plan.clone();
    let plan: Vec<&str> = text.lines().collect();
    assert!(
        text.contains("Index Scan using trigger_schedules_claimable_idx"),
        "{text}"
    );
    assert!(!text.contains("Seq Scan on trigger_schedules"), "{text}");
    assert!(!text.contains("Sort"), "{text}");
    // Rows removed by filter anywhere on the schedule scan would mean live claims were walked.
    let idx_line = plan
        .iter()
        .position(|l| l.contains("trigger_schedules_claimable_idx"))
        .unwrap();
    let scan_block: Vec<&&str> = plan[idx_line + 1..]
        .iter()
        .take_while(|l| {
            l.trim_start().starts_with("Index Cond")
                || l.trim_start().starts_with("Filter")
                || l.trim_start().starts_with("Rows Removed")
        })
        .collect();
    assert!(
        scan_block
            .iter()
            .all(|l| !l.contains("Rows Removed by Filter")),
        "{text}"
    );
    // The two lanes (oldest first, newest first) read 12 + 4 index entries for a limit of 16.
    let read: u64 = plan
        .iter()
        .filter(|l| {
            l.contains("Scan")
                && l.contains("using trigger_schedules_claimable_idx on trigger_schedules s")
        })
        .map(|l| crate::helpers::line_actual_rows(l).unwrap())
        .sum();
    assert_eq!(
        read, 16,
        "the scans read exactly the rows they claimed: {text}"
    );
    assert!(
        text.contains("Index Scan Backward using trigger_schedules_claimable_idx"),
        "the fresh lane reads the index backwards: {text}"
    );
}

/// The backlog gauge reads a range of the claim index, not the whole table.
#[tokio::test]
async fn the_backlog_gauge_is_an_index_range_read() {
    let db = TestDb::new().await;
    db.seed_bulk(5000, "0 0 0 1 1 *", 3_600_000).await;
    let su = db.superuser().await;
    su.batch_execute("UPDATE qlsched.trigger_schedules SET claimable_at_ms = 0, next_fire_at_ms = 0 WHERE trigger_id < 'trg-00010'; ANALYZE qlsched.trigger_schedules").await.unwrap();
    let (n, oldest) = qlsched::store::status::due_backlog(&su).await.unwrap();
    assert_eq!(n, 10);
    assert!(
        oldest.unwrap() > 1_000_000_000_000,
        "oldest due age from claimable_at_ms = 0"
    );
    // As the gauge plans it: with the clock's value (read by a statement before it).
    let now: i64 = su
        .query_one(
            "SELECT (extract(epoch FROM clock_timestamp())*1000)::bigint",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    let plan = crate::helpers::plan(
        &su,
        "EXPLAIN SELECT count(*), $1::bigint - min(claimable_at_ms)
           FROM (SELECT claimable_at_ms FROM qlsched.trigger_schedules
                  WHERE claimable_at_ms <= $1::bigint
                  ORDER BY claimable_at_ms LIMIT 1000000) due",
        &[&now],
    )
    .await;
    assert!(plan.contains("trigger_schedules_claimable_idx"), "{plan}");
    assert!(!plan.contains("Seq Scan on trigger_schedules"), "{plan}");
}

/// A backlog drains oldest first, yet a row that has just fallen due is leased in the next
/// round, not after the whole backlog: the claim's fresh lane (a quarter of the limit, read
/// newest first). An every-second trigger one second into a 100,000-row boundary is that row.
#[tokio::test]
async fn a_row_just_due_is_leased_beside_an_older_backlog() {
    let db = TestDb::new().await;
    db.seed_bulk(300, "0 0 0 1 1 *", -60_000).await;
    let su = db.superuser().await;
    su.batch_execute(
        "UPDATE qlsched.trigger_schedules
            SET next_fire_at_ms = (extract(epoch FROM clock_timestamp())*1000)::bigint - 5,
                claimable_at_ms = (extract(epoch FROM clock_timestamp())*1000)::bigint - 5
          WHERE trigger_id = 'trg-00150'",
    )
    .await
    .unwrap();
    let pool = db.runtime_pool(2);
    let conn = db::conn(&pool).await.unwrap();
    // As the daemon runs it: the variant for a limit of 16, prepared.
    let (variant, limit) = claim::claim_variant(16);
    let stmt = conn.prepare(variant).await.unwrap();
    let round = claim::claim_round(
        &conn,
        &stmt,
        "a",
        30_000,
        uuid::Uuid::new_v4(),
        claim::Extras::default(),
    )
    .await
    .unwrap();
    let mut got: Vec<&str> = round.rows.iter().map(|r| r.trigger_id.as_str()).collect();
    got.sort();
    assert_eq!(got.len(), limit as usize, "{got:?}");
    assert!(
        got.contains(&"trg-00150"),
        "the row due 5 ms ago waits behind 299 rows due a minute ago: {got:?}"
    );
    // The backlog still moves oldest first: three quarters of the round are its head.
    let head: Vec<String> = (0..12).map(|i| format!("trg-{i:05}")).collect();
    assert!(
        head.iter().all(|h| got.contains(&h.as_str())),
        "the oldest 12 rows were not leased: {got:?}"
    );
    // A limit below 4 has no fresh lane: the oldest row left comes first.
    let one = crate::helpers::drive::claim_due(&conn, "b", 30_000, 1, uuid::Uuid::new_v4())
        .await
        .unwrap();
    assert_eq!(one.len(), 1);
    assert_eq!(one[0].trigger_id, "trg-00012");
}
