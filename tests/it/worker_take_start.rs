//! The worker's calls of V25 (docs/worker.md, "Attempts, leases and stopping"):
//! `dispatch_take_start` hands out runs already started under a lease by the database clock,
//! `dispatch_finish_batch` records several outcomes in one call, each judged by its own lease
//! (a refused or lost one leaves the others recorded); the calls of V16 and V18 that older
//! workers make keep working beside them.

use qlsched::store::worker::{self as store, Beat, Finish, Taken};
use uuid::Uuid;

use crate::helpers::TestDb;

const LEASE_MS: i64 = 30_000;

/// `n` queued runs of trg-00000 pinning an http revision, copied as a V18 admission does.
async fn queue_http(db: &TestDb, n: i64) -> Vec<Uuid> {
    let su = db.superuser().await;
    let spec = r#"{"executor":"http","url":"http://127.0.0.1:9/"}"#;
    let rev: Uuid = su
        .query_one(
            "INSERT INTO qlsched.execution_revisions (execution_revision_id, project_id, kind, spec, spec_digest, created_at_ms)
             VALUES (gen_random_uuid(), 'proj', 'remote_worker', $1, encode(sha256(convert_to($1, 'UTF8')), 'hex'), 0)
             RETURNING execution_revision_id",
            &[&spec],
        )
        .await
        .unwrap()
        .get(0);
    let tag = Uuid::new_v4().simple().to_string();
    crate::helpers::insert_runs(
        &su,
        &format!(
            "SELECT gen_random_uuid() AS run_id, 'trg-00000' AS trigger_id,
                    '{rev}'::uuid AS execution_revision_id, 'queued' AS status,
                    g::bigint AS scheduled_for_ms, g::bigint AS queued_at_ms, '{tag}' AS admitted_by
               FROM generate_series(1, {n}) g"
        ),
    )
    .await;
    su.execute(
        "UPDATE qlsched.runs SET pool = 'default', executor = 'http' WHERE admitted_by = $1",
        &[&tag],
    )
    .await
    .unwrap();
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

async fn take_started(d: &tokio_postgres::Client, n: i32) -> Vec<Taken> {
    store::take_started(d, "w", &["default".into()], &["http"], n, LEASE_MS)
        .await
        .unwrap()
}

fn ok(code: i32) -> Finish {
    Finish {
        succeeded: code == 0,
        exit_status: Some(code),
        output_tail: Some(format!("tail {code}")),
        error: (code != 0).then(|| format!("exited with status {code}")),
        result: Some(serde_json::json!({ "http_status": 200 + code })),
    }
}

async fn events(db: &TestDb, run: Uuid) -> Vec<String> {
    db.superuser()
        .await
        .query(
            "SELECT kind FROM qlsched.run_events WHERE run_id = $1 ORDER BY seq",
            &[&run],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

async fn db_now_ms(c: &tokio_postgres::Client) -> i64 {
    c.query_one(
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::bigint",
        &[],
    )
    .await
    .unwrap()
    .get(0)
}

#[tokio::test]
async fn the_started_take_hands_out_running_attempts_leased_by_the_database_clock() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let queued = queue_http(&db, 3).await;
    let d = db.client("qlsched_dispatcher").await;

    let before = db_now_ms(&d).await;
    let taken = take_started(&d, 10).await;
    let after = db_now_ms(&d).await;

    assert_eq!(
        taken.iter().map(|t| t.run_id).collect::<Vec<_>>(),
        queued,
        "every run, oldest first"
    );
    let su = db.superuser().await;
    for t in &taken {
        let r = su
            .query_one(
                "SELECT r.status, a.state, a.worker_id, a.started_at_ms, a.lease_expires_at_ms
                   FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id)
                  WHERE a.attempt_id = $1",
                &[&t.attempt_id],
            )
            .await
            .unwrap();
        let (status, state, worker): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        let (started, expires): (i64, i64) = (r.get(3), r.get(4));
        assert_eq!(
            (status.as_str(), state.as_str(), worker.as_str()),
            ("running", "running", "w")
        );
        assert!(
            (before..=after).contains(&started),
            "{before} <= {started} <= {after}"
        );
        assert_eq!(
            (expires, t.lease_expires_at_ms),
            (started + LEASE_MS, started + LEASE_MS)
        );
        assert_eq!(
            events(&db, t.run_id).await,
            ["run.created", "run.queued", "run.started"]
        );
    }
    assert!(
        take_started(&d, 10).await.is_empty(),
        "nothing is taken twice"
    );
    // A started attempt is not started again, and its lease is only its token's.
    let t = &taken[0];
    assert!(!store::start(&d, t, LEASE_MS).await.unwrap());
    let stranger = Taken {
        token: Uuid::new_v4(),
        ..t.clone()
    };
    assert_eq!(
        store::heartbeat(&d, &stranger, LEASE_MS).await.unwrap(),
        Beat::Lost
    );
    assert_eq!(store::heartbeat(&d, t, LEASE_MS).await.unwrap(), Beat::Held);
    // An operator's cancel reaches the holder's heartbeat.
    let admin = db.client("qlsched_admin").await;
    let asked: i64 = admin
        .query_one("SELECT qlsched.request_cancel($1)", &[&vec![t.run_id]])
        .await
        .unwrap()
        .get(0);
    assert_eq!(asked, 1);
    assert_eq!(
        store::heartbeat(&d, t, LEASE_MS).await.unwrap(),
        Beat::CancelRequested
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_refused_or_lost_finish_in_a_batch_leaves_the_others_recorded() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    queue_http(&db, 5).await;
    let d = db.client("qlsched_dispatcher").await;
    let taken = take_started(&d, 5).await;
    assert_eq!(taken.len(), 5);
    let su = db.superuser().await;
    // taken[1]: another token. taken[2]: its lease ended by the database clock, not yet
    // expired. taken[3]: its lease ended and an expiry marked it lost (queued again is not
    // allowed by max_attempts 1: failed).
    let stranger = Taken {
        token: Uuid::new_v4(),
        ..taken[1].clone()
    };
    su.execute(
        "UPDATE qlsched.attempts SET lease_expires_at_ms = 1 WHERE attempt_id = ANY ($1)",
        &[&vec![taken[2].attempt_id, taken[3].attempt_id]],
    )
    .await
    .unwrap();
    let lost: i64 = su
        .query_one("SELECT lost FROM qlsched.dispatch_expire(1)", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(lost, 1, "one of the two ended leases expired");
    let expired: Uuid = su
        .query_one(
            "SELECT attempt_id FROM qlsched.attempts WHERE attempt_id = ANY ($1) AND state = 'failed'",
            &[&vec![taken[2].attempt_id, taken[3].attempt_id]],
        )
        .await
        .unwrap()
        .get(0);
    let ended_only = if expired == taken[2].attempt_id {
        &taken[3]
    } else {
        &taken[2]
    };
    let expired = if expired == taken[2].attempt_id {
        &taken[2]
    } else {
        &taken[3]
    };
    let fs: Vec<Finish> = (0..5).map(ok).collect();

    let answers = store::finish_batch(
        &d,
        &[
            (&taken[0], &fs[0]),
            (&stranger, &fs[1]),
            (ended_only, &fs[2]),
            (expired, &fs[3]),
            (&taken[4], &fs[4]),
        ],
    )
    .await
    .unwrap();

    assert_eq!(answers, [true, false, false, false, true]);
    let row = |a: Uuid| {
        let su = &su;
        async move {
            let r = su
                .query_one(
                    "SELECT r.status, a.state, a.exit_status, a.output_tail, a.error, a.result::text
                       FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id) WHERE a.attempt_id = $1",
                    &[&a],
                )
                .await
                .unwrap();
            let cols: (
                String,
                String,
                Option<i32>,
                Option<String>,
                Option<String>,
                Option<String>,
            ) = (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5));
            cols
        }
    };
    assert_eq!(
        row(taken[0].attempt_id).await,
        (
            "succeeded".into(),
            "succeeded".into(),
            Some(0),
            Some("tail 0".into()),
            None,
            Some(r#"{"http_status": 200}"#.into())
        )
    );
    assert_eq!(
        row(taken[4].attempt_id).await,
        (
            "failed".into(),
            "failed".into(),
            Some(4),
            Some("tail 4".into()),
            Some("exited with status 4".into()),
            Some(r#"{"http_status": 204}"#.into())
        )
    );
    let untouched = row(taken[1].attempt_id).await;
    assert_eq!(
        (untouched.0.as_str(), untouched.1.as_str(), untouched.2),
        ("running", "running", None)
    );
    let ended = row(ended_only.attempt_id).await;
    assert_eq!(
        (ended.0.as_str(), ended.1.as_str(), ended.2),
        ("running", "running", None)
    );
    let lost = row(expired.attempt_id).await;
    assert_eq!(
        (lost.1.as_str(), lost.2),
        ("failed", None),
        "the expiry's outcome stays"
    );
    assert!(lost.4.unwrap().starts_with("lost: "));
    assert_eq!(
        events(&db, taken[0].run_id).await,
        ["run.created", "run.queued", "run.started", "run.finished"]
    );
    // The stranger is refused alone too; the holder of taken[1] still finishes it.
    assert_eq!(
        store::finish_batch(&d, &[(&stranger, &fs[1])])
            .await
            .unwrap(),
        [false]
    );
    assert_eq!(
        store::finish_batch(&d, &[(&taken[1], &fs[0])])
            .await
            .unwrap(),
        [true]
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn the_batch_finish_refuses_bad_arguments_as_a_whole() {
    let db = TestDb::new().await;
    let d = db.client("qlsched_dispatcher").await;
    let a = Uuid::new_v4();
    for args in [
        // Arrays of different lengths.
        "ARRAY[$1]::uuid[], ARRAY[$1, $1]::uuid[], ARRAY['failed'], ARRAY[NULL]::int[], ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::jsonb[]",
        // One attempt twice.
        "ARRAY[$1, $1]::uuid[], ARRAY[$1, $1]::uuid[], ARRAY['failed', 'failed'], ARRAY[NULL, NULL]::int[], ARRAY[NULL, NULL]::text[], ARRAY[NULL, NULL]::text[], ARRAY[NULL, NULL]::jsonb[]",
        // An outcome that is none.
        "ARRAY[$1]::uuid[], ARRAY[$1]::uuid[], ARRAY['done'], ARRAY[NULL]::int[], ARRAY[NULL]::text[], ARRAY[NULL]::text[], ARRAY[NULL]::jsonb[]",
        // An error over 8 KiB.
        "ARRAY[$1]::uuid[], ARRAY[$1]::uuid[], ARRAY['failed'], ARRAY[NULL]::int[], ARRAY[NULL]::text[], ARRAY[repeat('e', 8193)], ARRAY[NULL]::jsonb[]",
        // None at all.
        "(ARRAY[$1]::uuid[])[2:1], ARRAY[]::uuid[], ARRAY[]::text[], ARRAY[]::int[], ARRAY[]::text[], ARRAY[]::text[], ARRAY[]::jsonb[]",
    ] {
        let e = d
            .query(&format!("SELECT * FROM qlsched.dispatch_finish_batch({args})"), &[&a])
            .await
            .expect_err(args);
        assert_eq!(
            e.code(),
            Some(&tokio_postgres::error::SqlState::INVALID_PARAMETER_VALUE),
            "{args}: {e:?}"
        );
    }
}

/// A worker of the previous release (V18's take, V16's start and finish, one call per run)
/// and one of this release (V25) serve the same database at once: each run is taken once,
/// both record their outcomes, and the invariants hold.
#[tokio::test]
async fn an_older_workers_calls_keep_working_beside_the_started_take() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let queued = queue_http(&db, 40).await;
    let old = db.client("qlsched_dispatcher").await;
    let new = db.client("qlsched_dispatcher").await;
    let (mut by_old, mut by_new) = (Vec::new(), Vec::new());
    loop {
        let a = store::take(&old, "old", &["default".into()], &["http"], 3, LEASE_MS)
            .await
            .unwrap();
        for t in &a {
            assert!(store::start(&old, t, LEASE_MS).await.unwrap());
            assert_eq!(
                store::heartbeat(&old, t, LEASE_MS).await.unwrap(),
                Beat::Held
            );
            assert!(store::finish(&old, t, &ok(0)).await.unwrap());
        }
        let b = take_started(&new, 5).await;
        let fs: Vec<Finish> = b.iter().map(|_| ok(0)).collect();
        if !b.is_empty() {
            let pairs: Vec<(&Taken, &Finish)> = b.iter().zip(&fs).collect();
            assert!(store::finish_batch(&new, &pairs)
                .await
                .unwrap()
                .iter()
                .all(|r| *r));
        }
        if a.is_empty() && b.is_empty() {
            break;
        }
        by_old.extend(a.iter().map(|t| t.run_id));
        by_new.extend(b.iter().map(|t| t.run_id));
    }
    assert!(!by_old.is_empty() && !by_new.is_empty());
    let mut all: Vec<Uuid> = by_old.iter().chain(&by_new).copied().collect();
    all.sort();
    let mut want = queued.clone();
    want.sort();
    assert_eq!(all, want, "each run taken once");
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'succeeded'")
            .await,
        40
    );
    assert_eq!(
        events(&db, by_old[0]).await,
        [
            "run.created",
            "run.queued",
            "run.dispatching",
            "run.started",
            "run.finished"
        ]
    );
    db.assert_invariants().await;
}

/// `EXPLAIN (ANALYZE, BUFFERS)` of `call` as `c`: (buffers of the whole statement, the
/// execution time in ms).
async fn explain(c: &tokio_postgres::Client, call: &str) -> (u64, f64) {
    let plan = crate::helpers::plan(
        c,
        &format!("EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) {call}"),
        &[],
    )
    .await;
    let ms = plan
        .lines()
        .find_map(|l| l.trim().strip_prefix("Execution Time: "))
        .and_then(|v| v.trim_end_matches(" ms").parse().ok())
        .unwrap_or_else(|| panic!("no execution time in\n{plan}"));
    (crate::helpers::plan_buffers(&plan, ""), ms)
}

/// The attempts `worker` holds in `state`: (attempt id, lease token).
async fn held(su: &tokio_postgres::Client, worker: &str, state: &str) -> Vec<(Uuid, String)> {
    su.query(
        "SELECT attempt_id, lease_id FROM qlsched.attempts WHERE worker_id = $1 AND state = $2 ORDER BY attempt_id",
        &[&worker, &state],
    )
    .await
    .unwrap()
    .iter()
    .map(|r| (r.get(0), r.get(1)))
    .collect()
}

/// What the database pays per run for the worker's calls (issue 34, row W1), behind a
/// history of 20,000 finished runs, 64 runs each way in one session: V18's take, then V16's
/// start and finish per run (what a worker of the previous release makes), against V25's
/// started take and one batch finish. Printed with each statement of a start (the
/// breakdown of its buffers: its three writes are most of them, each a new row version with
/// its index entries); the buffers per run must fall by a fifth at least. When this test was
/// written: 179 buffers and 0.52 ms of execution per run before, 126 and 0.16 ms after.
#[tokio::test]
async fn the_started_take_and_the_batch_finish_cost_fewer_buffers_per_run() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    let su = db.superuser().await;
    let rev: Uuid = su
        .query_one(
            "SELECT execution_revision_id FROM qlsched.execution_revisions LIMIT 1",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    crate::helpers::insert_runs(
        &su,
        &format!(
            "SELECT gen_random_uuid() AS run_id, 'trg-00000' AS trigger_id,
                    '{rev}'::uuid AS execution_revision_id, 'succeeded' AS status,
                    -g::bigint AS scheduled_for_ms, -g::bigint AS queued_at_ms, 'history' AS admitted_by
               FROM generate_series(1, 20000) g"
        ),
    )
    .await;
    queue_http(&db, 3 * 64).await;
    for t in ["runs", "attempts", "run_events"] {
        su.batch_execute(&format!("VACUUM ANALYZE qlsched.{t}"))
            .await
            .unwrap();
    }
    let d = db.client("qlsched_dispatcher").await;
    let take = |f: &str| {
        format!("SELECT * FROM qlsched.{f}('w', ARRAY['default'], ARRAY['http'], 64, 30000)")
    };
    let finish_one = |(a, t): &(Uuid, String)| {
        format!("SELECT qlsched.dispatch_finish('{a}', '{t}', 'succeeded', 0, NULL, NULL, '{{\"http_status\": 200}}')")
    };
    // Warm the session (plans, catalog caches) with one run each way.
    let warm = store::take(&d, "warm", &["default".into()], &["http"], 1, LEASE_MS)
        .await
        .unwrap();
    assert!(store::start(&d, &warm[0], LEASE_MS).await.unwrap());
    assert!(store::finish(&d, &warm[0], &ok(0)).await.unwrap());
    let warm = take_started(&d, 1).await;
    assert_eq!(
        store::finish_batch(&d, &[(&warm[0], &ok(0))])
            .await
            .unwrap(),
        [true]
    );

    // Before: the take, then a start and a finish per run.
    let (mut old_take, mut old_start, mut old_finish) = ((0, 0.0), (0, 0.0), (0, 0.0));
    let add = |acc: &mut (u64, f64), (b, ms): (u64, f64)| {
        acc.0 += b;
        acc.1 += ms;
    };
    add(
        &mut old_take,
        explain(&d, &take("dispatch_take_batch")).await,
    );
    let taken = held(&su, "w", "dispatching").await;
    assert_eq!(taken.len(), 64);
    for (a, t) in &taken {
        add(
            &mut old_start,
            explain(
                &d,
                &format!("SELECT qlsched.dispatch_start('{a}', '{t}', 30000)"),
            )
            .await,
        );
    }
    for at in &taken {
        add(&mut old_finish, explain(&d, &finish_one(at)).await);
    }
    // After: the started take, one finish for the 64.
    let new_take = explain(&d, &take("dispatch_take_start")).await;
    let taken = held(&su, "w", "running").await;
    assert_eq!(taken.len(), 64);
    let ids: Vec<String> = taken.iter().map(|(a, _)| format!("'{a}'")).collect();
    let tokens: Vec<String> = taken.iter().map(|(_, t)| format!("'{t}'")).collect();
    let new_finish = explain(
        &d,
        &format!(
            "SELECT * FROM qlsched.dispatch_finish_batch(ARRAY[{}]::uuid[], ARRAY[{}]::uuid[],
                    array_fill('succeeded'::text, ARRAY[64]), array_fill(0, ARRAY[64]),
                    array_fill(NULL::text, ARRAY[64]), array_fill(NULL::text, ARRAY[64]),
                    array_fill('{{\"http_status\": 200}}'::jsonb, ARRAY[64]))",
            ids.join(","),
            tokens.join(",")
        ),
    )
    .await;
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE status = 'succeeded' AND admitted_by <> 'history'").await,
        2 * 64 + 2
    );

    // Where a start's buffers go: its statements one by one, on the third batch's first run.
    add(
        &mut (0, 0.0),
        explain(&d, &take("dispatch_take_batch")).await,
    );
    let (a, t) = held(&su, "w", "dispatching").await[0].clone();
    su.batch_execute("BEGIN").await.unwrap();
    let mut breakdown = Vec::new();
    for (what, sql) in [
        ("find the attempt's run", format!("SELECT a.run_id FROM qlsched.attempts a WHERE a.attempt_id = '{a}'")),
        ("lock the run", format!("SELECT 1 FROM qlsched.runs r WHERE r.run_id = (SELECT run_id FROM qlsched.attempts WHERE attempt_id = '{a}') FOR UPDATE")),
        ("read the attempt again", format!("SELECT 1 FROM qlsched.attempts a WHERE a.attempt_id = '{a}' AND a.lease_id = '{t}' AND a.state = 'dispatching'")),
        ("run -> running", format!("UPDATE qlsched.runs r SET status = 'running' WHERE r.run_id = (SELECT run_id FROM qlsched.attempts WHERE attempt_id = '{a}')")),
        ("attempt -> running", format!("UPDATE qlsched.attempts a SET state = 'running', started_at_ms = 1, lease_expires_at_ms = a.lease_expires_at_ms + 1 WHERE a.attempt_id = '{a}'")),
        ("event run.started", format!("INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms) SELECT run_id, 3, 'run.started', 1 FROM qlsched.attempts WHERE attempt_id = '{a}'")),
    ] {
        // Once to warm the session's caches (undone), then measured.
        su.batch_execute("SAVEPOINT warm").await.unwrap();
        explain(&su, &sql).await;
        su.batch_execute("ROLLBACK TO SAVEPOINT warm").await.unwrap();
        breakdown.push(format!("  {what}: {} buffers", explain(&su, &sql).await.0));
    }
    su.batch_execute("ROLLBACK").await.unwrap();

    let per = |(b, ms): (u64, f64)| (b as f64 / 64.0, ms / 64.0);
    let (ot, os, of) = (per(old_take), per(old_start), per(old_finish));
    let (nt, nf) = (per(new_take), per(new_finish));
    let old = ot.0 + os.0 + of.0;
    let new = nt.0 + nf.0;
    println!(
        "per run, 64 runs behind 20,000 finished (buffers, ms of execution):\n\
         before: take {:.1} / {:.3}, start {:.1} / {:.3}, finish {:.1} / {:.3}: {old:.1} buffers, {:.3} ms\n\
         after:  started take {:.1} / {:.3}, batch finish {:.1} / {:.3}: {new:.1} buffers, {:.3} ms\n\
         one start's statements:\n{}",
        ot.0, ot.1, os.0, os.1, of.0, of.1, ot.1 + os.1 + of.1,
        nt.0, nt.1, nf.0, nf.1, nt.1 + nf.1,
        breakdown.join("\n")
    );
    // The start's own writes (a run and an attempt row version, an event: about 60 buffers)
    // are gone; the finish's remain, batched or not.
    assert!(new < old * 0.8, "{new:.1} buffers per run against {old:.1}");
    // (No invariants check: the history rows are bare, written without their later events.)
}
