//! The worker's take of V18 (`dispatch_take_batch`, docs/worker.md "Which runs a worker
//! takes"): pool and executor read from the run's copied columns through `runs_take_idx`,
//! runs queued without the copy (an older binary's, or queued before V18) taken through
//! `runs_queued_legacy_idx`, a batch bounded by `max_runs`, and two concurrent takes sharing
//! nothing.

use std::collections::BTreeSet;

use qlsched::store::worker::{self as store, TAKE_EXECUTABLE};
use uuid::Uuid;

use crate::helpers::TestDb;

const LEASE_MS: i64 = 30_000;

/// A new execution revision of `spec` in project `proj` (as the superuser).
async fn revision(su: &tokio_postgres::Client, spec: &str) -> Uuid {
    su.query_one(
        "INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
         VALUES (gen_random_uuid(), 'proj', 'remote_worker', $1, encode(sha256(convert_to($1, 'UTF8')), 'hex'), 0)
         RETURNING execution_revision_id",
        &[&spec],
    )
    .await
    .unwrap()
    .get(0)
}

/// `n` queued runs of trg-00000 pinning `rev`, queued at `from`, `from + step`, …; with
/// `copied`, the revision's pool and executor copied onto them as a V18 admission does,
/// without as an older binary's admission leaves them. Their run ids, oldest first.
async fn queue(
    su: &tokio_postgres::Client,
    rev: Uuid,
    n: i64,
    from: i64,
    step: i64,
    copied: bool,
) -> Vec<Uuid> {
    let tag = Uuid::new_v4().simple().to_string();
    crate::helpers::insert_runs(
        su,
        &format!(
            "SELECT gen_random_uuid() AS run_id, 'trg-00000' AS trigger_id,
                    '{rev}'::uuid AS execution_revision_id, 'queued' AS status,
                    ({from} + g * {step})::bigint AS scheduled_for_ms,
                    ({from} + g * {step})::bigint AS queued_at_ms, '{tag}' AS admitted_by
               FROM generate_series(0, {n} - 1) g"
        ),
    )
    .await;
    if copied {
        su.execute(
            "UPDATE qlsched.runs r SET pool = e.pool, executor = e.executor
               FROM qlsched.execution_revisions e
              WHERE e.execution_revision_id = r.execution_revision_id AND r.admitted_by = $1",
            &[&tag],
        )
        .await
        .unwrap();
    }
    su.query(
        "SELECT run_id FROM qlsched.runs WHERE admitted_by = $1 ORDER BY queued_at_ms",
        &[&tag],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| r.get(0))
    .collect()
}

/// The worker's take (`store::worker::take`, V18's function): the run ids, in take order.
async fn take(c: &tokio_postgres::Client, pools: &[&str], executors: &[&str], n: i32) -> Vec<Uuid> {
    let pools: Vec<String> = pools.iter().map(|p| p.to_string()).collect();
    store::take(c, "w", &pools, executors, n, LEASE_MS)
        .await
        .unwrap()
        .iter()
        .map(|t| t.run_id)
        .collect()
}

fn set(ids: &[Uuid]) -> BTreeSet<Uuid> {
    ids.iter().copied().collect()
}

#[tokio::test]
async fn the_batch_take_takes_its_pools_and_executors_whether_the_run_carries_them_or_not() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    let http_p1 = revision(
        &su,
        r#"{"executor":"http","pool":"p1","url":"http://127.0.0.1:9/"}"#,
    )
    .await;
    let shell_p2 = revision(
        &su,
        r#"{"executor":"shell","pool":"p2","command":["/bin/true"]}"#,
    )
    .await;
    let none_p1 = revision(&su, r#"{"pool":"p1"}"#).await;
    let http_default = revision(&su, r#"{"executor":"http","url":"http://127.0.0.1:9/"}"#).await;
    let not_json = revision(&su, "not json").await;
    let mut want_p1 = Vec::new();
    let mut want_other = Vec::new();
    let mut never = Vec::new();
    for (i, copied) in [true, false].into_iter().enumerate() {
        let base = 1_000 + i as i64;
        want_p1.extend(queue(&su, http_p1, 5, base, 10, copied).await);
        want_other.extend(queue(&su, shell_p2, 5, base + 2, 10, copied).await);
        want_other.extend(queue(&su, http_default, 5, base + 4, 10, copied).await);
        never.extend(queue(&su, none_p1, 5, base + 6, 10, copied).await);
        never.extend(queue(&su, not_json, 5, base + 8, 10, copied).await);
    }
    let d = db.client("qlsched_dispatcher").await;

    assert!(take(&d, &["p1"], &["shell"], 100).await.is_empty());
    let p1 = take(&d, &["p1"], &["http"], 100).await;
    let other = take(&d, &["p2", "default"], &["shell", "http"], 100).await;

    assert_eq!(set(&p1), set(&want_p1), "p1's http runs, copied or not");
    assert_eq!(set(&other), set(&want_other));
    assert!(take(&d, &["p1", "p2", "default"], &["http", "shell"], 100)
        .await
        .is_empty());
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'queued'")
            .await,
        never.len() as i64,
        "runs naming no executor (or no JSON) stay queued"
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn the_batch_take_takes_at_most_max_runs_oldest_first_across_pools_and_copies() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    let p1 = revision(
        &su,
        r#"{"executor":"http","pool":"p1","url":"http://127.0.0.1:9/"}"#,
    )
    .await;
    let p2 = revision(
        &su,
        r#"{"executor":"http","pool":"p2","url":"http://127.0.0.1:9/"}"#,
    )
    .await;
    // Interleaved in queued_at_ms: p1 copied at 0, 4, …; p2 copied at 1, 5, …; p1 without the
    // copy at 2, 6, …; p2 without at 3, 7, …
    let mut all: Vec<(i64, Uuid)> = Vec::new();
    for (k, (rev, copied)) in [(p1, true), (p2, true), (p1, false), (p2, false)]
        .into_iter()
        .enumerate()
    {
        let ids = queue(&su, rev, 10, k as i64, 4, copied).await;
        all.extend(
            ids.into_iter()
                .enumerate()
                .map(|(i, id)| (k as i64 + 4 * i as i64, id)),
        );
    }
    all.sort();
    let oldest: Vec<Uuid> = all.iter().map(|(_, id)| *id).collect();
    let d = db.client("qlsched_dispatcher").await;

    let first = take(&d, &["p1", "p2"], &["http"], 7).await;
    let second = take(&d, &["p2", "p1"], &["http"], 30).await;
    let rest = take(&d, &["p1", "p2"], &["http"], 30).await;

    assert_eq!(first, oldest[..7], "the 7 oldest, in queued_at_ms order");
    assert_eq!(second, oldest[7..37]);
    assert_eq!(rest, oldest[37..]);
    db.assert_invariants().await;
}

/// Each of two workers takes batches until none is left: every run is taken once, each
/// batch in queued_at_ms order.
#[tokio::test]
async fn two_concurrent_batch_takes_take_each_run_once() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    let rev = revision(&su, r#"{"executor":"http","url":"http://127.0.0.1:9/"}"#).await;
    let mut queued = queue(&su, rev, 2_500, 0, 2, true).await;
    queued.extend(queue(&su, rev, 2_500, 1, 2, false).await);
    let race = |db: TestDb| async move {
        let c = db.client("qlsched_dispatcher").await;
        let (mut got, mut calls) = (Vec::new(), 0);
        loop {
            let batch = take(&c, &["default"], &["http"], 64).await;
            calls += 1;
            if batch.is_empty() {
                return (got, calls);
            }
            got.extend(batch);
        }
    };
    let (a, b) = tokio::join!(
        tokio::spawn(race(db.clone())),
        tokio::spawn(race(db.clone()))
    );
    let ((a, a_calls), (b, b_calls)) = (a.unwrap(), b.unwrap());
    assert!(
        !a.is_empty() && !b.is_empty(),
        "both took ({} and {})",
        a.len(),
        b.len()
    );
    let mut all: Vec<Uuid> = a.iter().chain(&b).copied().collect();
    all.sort();
    let n = all.len();
    all.dedup();
    assert_eq!(
        (n, all.len()),
        (5_000, 5_000),
        "each run taken exactly once"
    );
    assert_eq!(set(&all), set(&queued));
    assert!(
        a_calls + b_calls <= 2 * 5_000 / 64 + 10,
        "{a_calls} + {b_calls} calls for 5,000 runs in batches of 64"
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_corrupt_pinned_spec_is_failed_by_the_batch_take_never_handed_out() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    let good = revision(&su, r#"{"executor":"http","url":"http://127.0.0.1:9/"}"#).await;
    let bad = revision(&su, r#"{"executor":"http","url":"http://127.0.0.1:8/"}"#).await;
    let good_runs = queue(&su, good, 3, 0, 2, true).await;
    queue(&su, bad, 3, 1, 2, true).await;
    su.batch_execute(&format!(
        "ALTER TABLE qlsched.execution_revisions DISABLE TRIGGER execution_revisions_are_immutable;
         UPDATE qlsched.execution_revisions SET spec_digest = repeat('0', 64) WHERE execution_revision_id = '{bad}';
         ALTER TABLE qlsched.execution_revisions ENABLE TRIGGER execution_revisions_are_immutable"
    ))
    .await
    .unwrap();
    let d = db.client("qlsched_dispatcher").await;
    assert_eq!(take(&d, &["default"], &["http"], 10).await, good_runs);
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.attempts WHERE state = 'failed' AND error LIKE '%fails its digest%'")
            .await,
        3
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn the_batch_take_refuses_null_or_too_many_pools() {
    let db = TestDb::new().await;
    let d = db.client("qlsched_dispatcher").await;
    for pools in ["NULL", "ARRAY[]::text[]", "ARRAY[NULL]::text[]"] {
        let e = d
            .query(
                &format!("SELECT * FROM qlsched.dispatch_take_batch('w', {pools}, ARRAY['http'], 10, 30000)"),
                &[],
            )
            .await
            .unwrap_err();
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE),
            "{pools}: {e:?}"
        );
    }
}

/// The take's cost behind a backlog (issue 34): 20,000 queued runs of another pool, older
/// than the worker's 10,000 (and 1,000 newer ones without the copied columns). Taking 64
/// reads the runs it takes (and their attempts and revision), not the backlog; V17's take,
/// which parses the spec of every candidate on its way, is measured beside it and printed
/// (95,672 buffers for the same 64 runs when this test was written).
#[tokio::test]
async fn a_batch_take_behind_a_backlog_reads_only_the_runs_it_takes() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    let mine = revision(&su, r#"{"executor":"http","url":"http://127.0.0.1:9/"}"#).await;
    let other = revision(
        &su,
        r#"{"executor":"http","pool":"other","url":"http://127.0.0.1:9/"}"#,
    )
    .await;
    // The other pool's runs are the oldest: a scan in queued_at_ms order meets them first.
    queue(&su, other, 20_000, 0, 1, true).await;
    queue(&su, mine, 10_000, 20_000, 1, true).await;
    queue(&su, mine, 1_000, 30_000, 1, false).await;
    for q in [
        "VACUUM ANALYZE qlsched.runs",
        "VACUUM ANALYZE qlsched.attempts",
    ] {
        su.batch_execute(q).await.unwrap();
    }
    let measure = |f: &'static str| {
        let su = &su;
        async move {
            let call = format!(
                "SELECT * FROM qlsched.{f}('w', ARRAY['default'], ARRAY['http'], 64, 30000)"
            );
            // A long-running worker's session: its statements are planned already.
            su.batch_execute(&format!(
                "BEGIN; {call}; {call}; {call}; {call}; {call}; {call}"
            ))
            .await
            .unwrap();
            let plan = crate::helpers::plan(
                su,
                &format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {call}"),
                &[],
            )
            .await;
            su.batch_execute("ROLLBACK").await.unwrap();
            (crate::helpers::plan_buffers(&plan, ""), plan)
        }
    };
    let (old, old_plan) = measure("dispatch_take_executable").await;
    let (new, new_plan) = measure("dispatch_take_batch").await;
    println!("taking 64 behind 20,000 runs of another pool: dispatch_take_executable {old} buffers, dispatch_take_batch {new} buffers\n{old_plan}\n{new_plan}");
    // About 65 buffers a run are the run's own writes (its status, attempt and event, each
    // row's index entries and triggers): the candidates themselves cost about 10 a run.
    assert!(
        new < 64 * 100,
        "dispatch_take_batch: taking 64 touched {new} buffers:\n{new_plan}"
    );
}

/// Rolling upgrade: V18 applied over a V17 database with queued runs (none carries the
/// copied columns); a worker of the previous release keeps taking through V17's function
/// before and after it, and V18's take takes the runs queued before it.
#[tokio::test]
async fn v18_over_queued_runs_keeps_the_v17_take_working_and_takes_them_itself() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    // The database as V17 left it: V18 and every later migration not applied.
    su.batch_execute(&format!(
        "{}
         DROP FUNCTION qlsched.dispatch_take_batch(text, text[], text[], integer, bigint);
         DROP INDEX qlsched.runs_take_idx, qlsched.runs_queued_legacy_idx;
         ALTER TABLE qlsched.runs DROP COLUMN pool, DROP COLUMN executor;
         ALTER TABLE qlsched.execution_revisions DROP COLUMN pool, DROP COLUMN executor;
         DELETE FROM {} WHERE version >= 18;
         DELETE FROM qlsched.schema_compat WHERE version >= 18",
        crate::live_migrate::UNDO_AFTER_V18,
        qlsched::schema::HISTORY_TABLE
    ))
    .await
    .unwrap();
    let rev = revision(&su, r#"{"executor":"http","url":"http://127.0.0.1:9/"}"#).await;
    let queued = queue(&su, rev, 100, 0, 1, false).await;
    let d = db.client("qlsched_dispatcher").await;
    let v17 = |n: i32| {
        let d = &d;
        async move {
            d.query(
                TAKE_EXECUTABLE,
                &[
                    &"old",
                    &vec!["default".to_string()],
                    &vec!["http".to_string()],
                    &n,
                    &LEASE_MS,
                ],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, Uuid>("run_id"))
            .collect::<Vec<_>>()
        }
    };
    let before = v17(10).await;

    let applied = qlsched::schema::migrate(&db.config("qlsched_owner"), &crate::helpers::roles())
        .await
        .unwrap();

    assert_eq!(applied[0], "V18__worker_take_batch", "{applied:?}");
    assert_eq!(
        db.count(
            "SELECT count(*) FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid
              WHERE c.relname IN ('runs_take_idx', 'runs_queued_legacy_idx') AND i.indisvalid"
        )
        .await,
        2
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.execution_revisions WHERE execution_revision_id = '{rev}' AND pool = 'default' AND executor = 'http'".replace("{rev}", &rev.to_string()).as_str())
            .await,
        1,
        "the generated columns of a revision published before V18"
    );
    let after = v17(10).await;
    let rest = take(&d, &["default"], &["http"], 1000).await;
    assert_eq!(before, queued[..10]);
    assert_eq!(after, queued[10..20]);
    assert_eq!(
        rest,
        queued[20..],
        "V18's take takes the runs queued before it"
    );
    // Runs a V18 binary admits are taken by V17's function too.
    let copied = queue(&su, rev, 5, 1_000, 1, true).await;
    assert_eq!(v17(10).await, copied);
    let d2 = db.superuser().await;
    assert_eq!(
        qlsched::schema::check(
            &d2,
            &[
                ("qlsched_admin", "admin"),
                ("qlsched_runtime", "runtime"),
                ("qlsched_worker_ingress", "worker_ingress"),
                ("qlsched_dispatcher", "dispatcher"),
            ]
        )
        .await
        .unwrap(),
        Vec::<String>::new()
    );
    db.assert_invariants().await;
}
