//! Everyday events that must lose, stall or mis-report nothing: a task deployed while its
//! triggers are claimed, a table rewritten under the scheduler, a claim statement that never
//! answers, a persistent admission error, and refusals diagnosed by cause.

use std::time::{Duration, Instant};

use qlsched::actors::supervisor::{Drain, Probe};
use qlsched::actors::Settings;
use qlsched::metrics::Metrics;
use qlsched::store::admit::{self, Refusal};
use qlsched::store::{self, manage, recovery};

use crate::helpers::claimed::{admission, Claimed};
use crate::helpers::{discard_log, start_supervisor as start, wait_until, TestDb};

fn settings(db: &TestDb, owner: &str, cadence_ms: u64, lease_ms: u64) -> Settings {
    Settings {
        claim_budget: 64,
        admit_timeout: Duration::from_secs(1),
        ..db.settings(owner, cadence_ms, lease_ms)
    }
}

/// Occurrences missing between each trigger's first and last run (every-second triggers).
async fn holes(db: &TestDb) -> i64 {
    db.count(
        "SELECT coalesce(sum(gaps), 0)::bigint FROM (
           SELECT trigger_id, max(scheduled_for_ms) / 1000 - min(scheduled_for_ms) / 1000 + 1 - count(*) AS gaps
             FROM qlsched.runs GROUP BY trigger_id) g",
    )
    .await
}

/// Deploying a new task version while its triggers are claimed refuses no admission (nothing
/// is decided again), no trigger stops, no occurrence is skipped, none is late by more than
/// 2 s, and the runs after the last deployment are pinned to the new execution revision. 200
/// every-second triggers, 2 replicas, the task republished 20 times within 10 s. (That a
/// deployment between a claim and its admission is admitted in the same batch is
/// `a_task_deployed_between_claim_and_admission_is_admitted_in_the_same_batch`.)
#[actix_rt::test]
async fn a_task_deployed_under_running_replicas_drops_no_occurrence() {
    // Lateness is asserted: not alongside the drills, which load both cores.
    let _one = crate::drills::exclusive().await;
    let db = TestDb::new().await;
    db.seed_bulk(200, "* * * * * *", 0).await;
    let (a, ma, _) = start(settings(&db, "a", 200, 30_000));
    let (b, mb, _) = start(settings(&db, "b", 200, 30_000));
    let mut admin = db.admin().await;
    wait_until("first admissions", Duration::from_secs(20), || async {
        db.count("SELECT count(DISTINCT trigger_id) FROM qlsched.runs")
            .await
            == 200
    })
    .await;
    // The task is republished 20 times within 10 s, twice a second. The replicas wake at
    // each whole second and admit within milliseconds of it: one deployment a second lands
    // just after a whole second (0-9 ms, varied), between their claims and their admissions;
    // the other at the half second, between rounds.
    let mut first_publish = None;
    for i in 0..20u64 {
        let phase = if i % 2 == 0 { (i / 2 % 4) * 3 } else { 500 };
        let in_second = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            % 1000;
        let wait = (1000 + phase - in_second) % 1000;
        tokio::time::sleep(Duration::from_millis(wait)).await;
        first_publish.get_or_insert_with(Instant::now);
        manage::publish_task(&mut admin, "proj", "task", &format!("{{\"v\":{i}}}"))
            .await
            .unwrap();
    }
    let span = first_publish.unwrap().elapsed();
    assert!(
        span <= Duration::from_secs(10),
        "20 deployments took {span:?}, not within 10 s"
    );
    let last_publish = db.now_ms().await;
    wait_until("runs on the last revision", Duration::from_secs(20), || async {
        db.count(&format!(
            "SELECT count(DISTINCT trigger_id) FROM qlsched.runs r JOIN qlsched.tasks k USING (task_id)
              WHERE r.scheduled_for_ms > {last_publish} + 1000 AND r.task_revision = k.revision
                AND r.execution_revision_id = k.execution_revision_id"
        ))
        .await
            == 200
    })
    .await;
    let _ = a.send(Drain(Duration::from_secs(2))).await;
    let _ = b.send(Drain(Duration::from_secs(2))).await;
    assert_eq!(holes(&db).await, 0, "occurrences skipped");
    let late: Vec<String> = db
        .superuser()
        .await
        .query(
            "SELECT format('%s at %s: %s ms late (task revision %s)', trigger_id, scheduled_for_ms,
                           queued_at_ms - scheduled_for_ms, task_revision)
               FROM qlsched.runs WHERE queued_at_ms - scheduled_for_ms > 2000
              ORDER BY scheduled_for_ms LIMIT 10",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        late.is_empty(),
        "runs admitted more than 2 s late: {late:#?}"
    );
    let stale = db
        .count(&format!(
            "SELECT count(*) FROM qlsched.runs r JOIN qlsched.tasks k USING (task_id)
              WHERE r.scheduled_for_ms > {last_publish} + 1000 AND r.task_revision <> k.revision"
        ))
        .await;
    assert_eq!(
        stale, 0,
        "runs after the last deployment on an old revision"
    );
    assert_eq!(
        ma.redecides.get() + mb.redecides.get(),
        0,
        "admissions refused by the deployments (each costs its occurrence another round)"
    );
    db.assert_invariants().await;
}

/// A rewrite of the schedule table (`VACUUM FULL`) moves every row's physical address under
/// live claims: the refused admissions are decided again at once, with no back-off and no loss.
/// A rewrite lands between a claim and its admission only in a gap of milliseconds after a
/// whole second, so the rewrites repeat, aimed at offsets sweeping that gap, until at least
/// one admission was refused for a moved row (a re-decision: nothing else changes here), and
/// the test asserts that it happened: the path it is about has run, and every row still
/// comes back at once.
#[actix_rt::test]
async fn a_schedule_table_rewritten_during_operation_loses_nothing() {
    let _one = crate::drills::exclusive().await;
    let db = TestDb::new().await;
    db.seed_bulk(100, "* * * * * *", 0).await;
    let (a, m, _) = start(settings(&db, "a", 200, 30_000));
    wait_until("first admissions", Duration::from_secs(20), || async {
        db.count("SELECT count(DISTINCT trigger_id) FROM qlsched.runs")
            .await
            == 100
    })
    .await;
    assert_eq!(m.redecides.get(), 0, "re-decisions before any rewrite");
    let su = db.superuser().await;
    let mut rewrites = 0;
    let mut offset_ms = 0;
    let deadline = Instant::now() + Duration::from_secs(60);
    while m.redecides.get() == 0 {
        assert!(
            Instant::now() < deadline,
            "{rewrites} rewrites in 60 s and no admission was refused for a moved row \
             (ticks {}, claims {}, admits {}, fence losses {}, rejects {}, errors {}, error back-offs {}, unknown {})",
            m.ticks.get(),
            m.claims.get(),
            m.admits.get(),
            m.fence_losses.get(),
            m.rejects.get(),
            m.errors.get(),
            m.error_backoffs.get(),
            m.unknown_outcomes.get()
        );
        // Every row falls due at a whole second; its claim commits and its admission follows
        // a few milliseconds later. Aim each rewrite at that gap: a whole second plus an
        // offset that sweeps 0..45 ms, one rewrite a second (the database clock is this
        // machine's).
        let now = db.now_ms().await;
        let at = (now / 1000 + 1) * 1000 + offset_ms;
        tokio::time::sleep(Duration::from_millis((at - now) as u64)).await;
        su.batch_execute("VACUUM FULL qlsched.trigger_schedules")
            .await
            .unwrap();
        rewrites += 1;
        offset_ms = (offset_ms + 3) % 45;
    }
    let after = db.now_ms().await;
    wait_until("every trigger admitted after the rewrites", Duration::from_secs(10), || async {
        db.count(&format!(
            "SELECT count(DISTINCT trigger_id) FROM qlsched.runs WHERE scheduled_for_ms > {after} + 1000"
        ))
        .await
            == 100
    })
    .await;
    let _ = a.send(Drain(Duration::from_secs(2))).await;
    assert_eq!(holes(&db).await, 0, "occurrences skipped");
    let backed_off = db
        .count(&format!(
            "SELECT count(*) FROM qlsched.trigger_schedules WHERE claimable_at_ms > {} + 10000",
            db.now_ms().await
        ))
        .await;
    assert_eq!(backed_off, 0, "rows released with a back-off");
    assert_eq!(
        m.rejects.get(),
        0,
        "a moved row was taken for a corrupt one"
    );
    db.assert_invariants().await;
}

/// A claim round whose reply never arrives (the statement committed, the connection was
/// cut before its reply was read) leased rows no actor works on. The rounds after it release
/// them by the round's id: every row is admitted long before its 30 s lease would have
/// expired. (A claim statement abandoned at its client-side bound cannot commit later: the
/// server cancels it at the same bound, `engine::an_abandoned_claim_statement_cannot_commit_later`.)
#[actix_rt::test]
async fn leases_of_a_claim_round_whose_reply_never_came_are_released() {
    use crate::helpers::proxy::{Fault, Proxy};
    let db = TestDb::new().await;
    db.seed_bulk(20, "0 0 0 1 1 *", -1000).await;
    // Faults apply to the claim statement (the only one that skips locked rows).
    let proxy = Proxy::start_with_marker(db.port, "SKIP LOCKED").await;
    proxy.arm(Fault::LoseCommitReply, 1, 1);
    let mut s = settings(&db, "a", 300, 30_000);
    s.connector.pg = crate::helpers::pg_config(proxy.port, "qlsched_runtime", &db.name).into();
    let (sup, metrics, _) = start(s);
    wait_until(
        "a claim round lost its reply",
        Duration::from_secs(15),
        || async { proxy.remaining() == 0 && metrics.errors.get() >= 1 },
    )
    .await;
    let committed = proxy.stats().faults.iter().filter(|f| f.committed).count();
    assert_eq!(committed, 1, "{:?}", proxy.stats().faults);
    let healed = Instant::now();
    wait_until(
        "all rows admitted well within the 30 s lease",
        Duration::from_secs(10),
        || async { db.count("SELECT count(*) FROM qlsched.runs").await == 20 },
    )
    .await;
    assert!(healed.elapsed() < Duration::from_secs(10));
    let probe = sup.send(Probe).await.unwrap();
    assert!(probe.orphans >= 1, "the failed round was not remembered");
    assert!(
        metrics.orphan_releases.get() >= 1,
        "no orphaned row was released"
    );
    db.assert_invariants().await;
}

/// A persistent admission error of one row backs off exponentially instead of repeating
/// every cadence; the other rows are unaffected.
#[actix_rt::test]
async fn a_persistent_admission_error_backs_off_exponentially() {
    let db = TestDb::new().await;
    db.seed_bulk(2, "* * * * * *", 0).await;
    db.superuser()
        .await
        .batch_execute(
            "CREATE FUNCTION qlsched.refuse_one() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF NEW.trigger_id = 'trg-00000' THEN RAISE EXCEPTION 'refused for the test'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER refuse_one BEFORE INSERT ON qlsched.runs
               FOR EACH ROW EXECUTE FUNCTION qlsched.refuse_one();",
        )
        .await
        .unwrap();
    let (sup, metrics, _) = start(settings(&db, "a", 100, 30_000));
    tokio::time::sleep(Duration::from_secs(6)).await;
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    let claims = db
        .count("SELECT claim_version FROM qlsched.trigger_schedules WHERE trigger_id = 'trg-00000'")
        .await;
    // Cadence 100 ms: without back-off ~60 claims in 6 s; with 0.1, 0.2, 0.4 … s about 7.
    assert!(
        claims <= 10,
        "the failing row was claimed {claims} times in 6 s"
    );
    assert!(
        metrics.error_backoffs.get() >= 3,
        "back-offs counted: {}",
        metrics.error_backoffs.get()
    );
    let healthy = db
        .count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 'trg-00001'")
        .await;
    assert!(
        healthy >= 4,
        "the healthy trigger admitted only {healthy} runs"
    );
}

/// A trigger behind its schedule catches up at admission speed even when the timer starts
/// rounds while its claim actor is still admitting (slow admissions make that certain):
/// the catch-up signal raised by the claim actor survives the timer's round. Every UPDATE
/// statement on the schedules (a claim round's, even one that leases nothing) logs whether an
/// admission was asleep in its slow insert at that moment, and a claim round that finds one
/// sleeps 0.6 s, so the admission ends (raising the signal) while the round is in flight: the
/// interleaving that lost the signal before issue 10 happens at every timer round during the
/// catch-up, and at least one must have happened.
#[actix_rt::test]
async fn catch_up_survives_a_timer_round_that_overlaps_the_admission() {
    let db = TestDb::new().await;
    db.seed_bulk(1, "* * * * * *", -20_000).await;
    db.superuser()
        .await
        .batch_execute(
            "CREATE FUNCTION qlsched.slow_admission() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN PERFORM pg_sleep(0.25); RETURN NEW; END $$;
             CREATE TRIGGER slow_admission BEFORE INSERT ON qlsched.runs
               FOR EACH ROW EXECUTE FUNCTION qlsched.slow_admission();
             CREATE TABLE qlsched.test_schedule_updates (during_admission boolean NOT NULL);
             CREATE FUNCTION qlsched.log_schedule_update() RETURNS trigger LANGUAGE plpgsql
               SECURITY DEFINER AS $$
             DECLARE admitting boolean := EXISTS (
               SELECT 1 FROM pg_stat_activity
                WHERE pid <> pg_backend_pid() AND wait_event = 'PgSleep'
                  AND datname = current_database());
             BEGIN
               INSERT INTO qlsched.test_schedule_updates VALUES (admitting);
               -- A claim round inside an admission outlasts it: the admission ends (and
               -- raises the catch-up signal) while this round is still in flight.
               IF admitting AND current_query() LIKE '%picked AS%' THEN
                 PERFORM pg_sleep(0.6);
               END IF;
               RETURN NULL;
             END $$;
             CREATE TRIGGER log_schedule_update AFTER UPDATE ON qlsched.trigger_schedules
               FOR EACH STATEMENT EXECUTE FUNCTION qlsched.log_schedule_update();",
        )
        .await
        .unwrap();
    let (sup, _, _) = start(settings(&db, "a", 4_000, 30_000));
    let started = Instant::now();
    wait_until(
        "the 20 missed occurrences",
        Duration::from_secs(30),
        || async { db.count("SELECT count(*) FROM qlsched.runs").await >= 20 },
    )
    .await;
    let elapsed = started.elapsed();
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    let overlapping = db
        .count("SELECT count(*) FROM qlsched.test_schedule_updates WHERE during_admission")
        .await;
    // Cadence 4 s: a lost catch-up signal leaves the trigger waiting for the next timer round,
    // a gap of several seconds between two of the 20 admissions; kept, the longest gap is the
    // overlapping round (0.6 s) plus one admission (0.25 s).
    let gap = db
        .count(
            "SELECT max(g)::bigint FROM (
               SELECT queued_at_ms - lag(queued_at_ms) OVER (ORDER BY queued_at_ms) AS g
                 FROM (SELECT queued_at_ms FROM qlsched.runs ORDER BY queued_at_ms LIMIT 20) f) x",
        )
        .await;
    assert!(
        gap < 2_000,
        "{gap} ms between two catch-up admissions: the catch-up waited for the timer"
    );
    assert!(
        overlapping >= 1,
        "no claim round ran while an admission was in flight: the overlap never happened"
    );
    assert!(
        elapsed < Duration::from_secs(15),
        "20 occurrences took {elapsed:?}: the catch-up fell back to the cadence"
    );
}

async fn refusal_after(db: &TestDb, change: &str) -> Refusal {
    db.seed(1, "* * * * * *").await;
    db.make_due(-100).await;
    let c = Claimed::new(db, "a", 30_000).await;
    if !change.is_empty() {
        db.superuser().await.batch_execute(change).await.unwrap();
    }
    match c.admit(&c.admission()).await {
        admit::AdmitOutcome::Refused { why } => why,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// Each refusal is named by its real cause.
#[tokio::test]
async fn refusals_are_diagnosed_by_cause() {
    let cases = [
        (
            "UPDATE qlsched.trigger_schedules SET claim_token = gen_random_uuid()",
            Refusal::FenceLost,
        ),
        ("UPDATE qlsched.projects SET status = 'suspended'", Refusal::ProjectInactive),
        (
            "UPDATE qlsched.triggers SET content_digest = repeat('b', 64)",
            Refusal::DefinitionChanged,
        ),
        (
            "ALTER TABLE qlsched.execution_revisions DISABLE TRIGGER execution_revisions_are_immutable; UPDATE qlsched.execution_revisions SET spec = spec || 'tampered'; ALTER TABLE qlsched.execution_revisions ENABLE TRIGGER execution_revisions_are_immutable",
            Refusal::ExecutionRevisionInvalid,
        ),
        (
            "UPDATE qlsched.trigger_schedules SET next_fire_at_ms = next_fire_at_ms - 1000, claimable_at_ms = claimable_at_ms",
            Refusal::CursorMoved,
        ),
        ("VACUUM FULL qlsched.trigger_schedules", Refusal::RowMoved),
    ];
    for (change, want) in cases {
        let db = TestDb::new().await;
        assert_eq!(refusal_after(&db, change).await, want, "after `{change}`");
    }
}

/// Start-up recovery examines `running` runs too, reports the true number of candidates
/// whatever the listing limit, and reads unfinished runs through an index.
#[tokio::test]
async fn recovery_counts_every_candidate_including_running_runs_through_an_index() {
    let db = TestDb::new().await;
    db.seed_bulk(1, "* * * * * *", -100).await;
    let su = db.superuser().await;
    su.batch_execute(
        "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                                   execution_revision_id, idempotency_key, status, scheduled_for_ms, admitted_by, queued_at_ms)
         SELECT gen_random_uuid(), 'proj', 'trg-00000', 1, 'task', 1, k.execution_revision_id,
                'ql3:cron:v1:trg-00000:1:' || g, CASE WHEN g % 2 = 0 THEN 'running' ELSE 'dispatching' END, g, 'x', g
           FROM generate_series(1, 150) g, qlsched.tasks k",
    )
    .await
    .unwrap();
    let pool = db.runtime_pool(1);
    let conn = store::conn(&pool).await.unwrap();
    let report = recovery::recover_on_startup(&conn, 10).await.unwrap();
    assert_eq!(report.candidate_count, 150);
    assert_eq!(report.candidates.len(), 10);
    // History: 20,000 finished runs, each with its attempt, beside the 150 unfinished ones.
    // The plan of the very statement recovery runs (prepared, as tokio-postgres sends it)
    // reads runs only through the partial index of unfinished runs, both times it reads
    // them. (Attempts are joined as the planner prices it: at this size it hashes a
    // sequential scan of them.)
    su.batch_execute(
        "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision,
                                   execution_revision_id, idempotency_key, status, scheduled_for_ms, admitted_by, queued_at_ms)
         SELECT gen_random_uuid(), 'proj', 'trg-00000', 1, 'task', 1, k.execution_revision_id,
                'ql3:cron:v1:trg-00000:1:' || g, 'succeeded', g, 'x', g
           FROM generate_series(1000, 20999) g, qlsched.tasks k;
         INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
         SELECT gen_random_uuid(), run_id, 1, 'remote_worker', 'succeeded', queued_at_ms
           FROM qlsched.runs WHERE status = 'succeeded';
         ANALYZE qlsched.runs; ANALYZE qlsched.attempts;",
    )
    .await
    .unwrap();
    su.batch_execute(&format!(
        "PREPARE recovery(bigint) AS {}",
        recovery::RECOVERY_SQL
    ))
    .await
    .unwrap();
    let plan = crate::helpers::plan(&su, "EXPLAIN (COSTS OFF) EXECUTE recovery(10)", &[]).await;
    assert_eq!(
        plan.matches("runs_unfinished_idx on runs").count(),
        2,
        "both reads of runs go through the partial index:\n{plan}"
    );
    assert!(!plan.contains("Seq Scan on runs"), "{plan}");
}

/// A claimed row whose definition moved on (the trigger changed) or whose physical address moved
/// (`VACUUM FULL`) is released at once by the admit engine, ready to be decided again; only
/// a corrupt definition gets the reject back-off.
#[tokio::test]
async fn the_engine_releases_a_moved_on_row_at_once_and_a_corrupt_one_with_back_off() {
    use qlsched::engine::{Action, Engine, Job, Kind, Outcome};
    use qlsched::store::session::Session;
    let cases = [
        ("SELECT 1", None),
        (
            "VACUUM FULL qlsched.trigger_schedules",
            Some((Refusal::RowMoved, 0)),
        ),
        (
            "UPDATE qlsched.triggers SET content_digest = repeat('c', 64)",
            Some((Refusal::DefinitionChanged, 0)),
        ),
        (
            "ALTER TABLE qlsched.execution_revisions DISABLE TRIGGER execution_revisions_are_immutable; UPDATE qlsched.execution_revisions SET spec = spec || 'tampered'; ALTER TABLE qlsched.execution_revisions ENABLE TRIGGER execution_revisions_are_immutable",
            Some((Refusal::ExecutionRevisionInvalid, 60_000)),
        ),
    ];
    for (change, want) in cases {
        let db = TestDb::new().await;
        db.seed(1, "* * * * * *").await;
        db.make_due(-100).await;
        let c = Claimed::new(&db, "a", 30_000).await;
        db.superuser().await.batch_execute(change).await.unwrap();
        let mut engine = Engine {
            session: Session::new(db.connector()),
            log: discard_log(),
            metrics: Metrics::default(),
            admit_timeout: Duration::from_secs(2),
            max_retries: 3,
            reject_backoff: Duration::from_secs(60),
        };
        let job = Job {
            action: Action::Admit(c.admission().occurrence()),
            kind: Kind::Fire,
            claim: c.row().clone(),
            lease_deadline: Instant::now() + Duration::from_secs(20),
            error_backoff: Duration::from_secs(1),
        };
        let out = engine.process(vec![job]).await.remove(0).unwrap();
        let wait = db
            .count(concat!(
                "SELECT coalesce(claimable_at_ms, 0) - ",
                qlsched::db_now_ms!(),
                " FROM qlsched.trigger_schedules"
            ))
            .await;
        match want {
            None => assert!(matches!(out, Outcome::Admitted { .. }), "{out:?}"),
            Some((why, backoff_ms)) => {
                assert_eq!(out, Outcome::Refused(why), "after `{change}`");
                let owner = db
                    .count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL")
                    .await;
                assert_eq!(owner, 0, "after `{change}` the claim is released");
                if backoff_ms == 0 {
                    assert!(wait <= 0, "after `{change}` claimable again in {wait} ms");
                } else {
                    assert!(
                        (backoff_ms - 5_000..=backoff_ms).contains(&wait),
                        "after `{change}` claimable again in {wait} ms"
                    );
                }
            }
        }
    }
}

/// A task deployed between a claim and its admission (the replicas claim at each whole
/// second; a deploy lands in that gap at random) costs the occurrence nothing: the admission
/// admits it in the same batch, pinned to the task revision and execution revision it read
/// itself (one row version, checked in its own transaction), and the row is not released to
/// be decided again in another round.
#[tokio::test]
async fn a_task_deployed_between_claim_and_admission_is_admitted_in_the_same_batch() {
    use qlsched::engine::{Action, Engine, Job, Kind};
    use qlsched::store::session::Session;
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    db.make_due(-100).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let sf = c.row().next_fire_at_ms.unwrap();
    let (task_revision, execution_revision) =
        manage::publish_task(&mut db.admin().await, "proj", "task", "{\"v\":2}")
            .await
            .unwrap();
    let mut engine = Engine {
        session: Session::new(db.connector()),
        log: discard_log(),
        metrics: Metrics::default(),
        admit_timeout: Duration::from_secs(2),
        max_retries: 3,
        reject_backoff: Duration::from_secs(60),
    };
    let job = Job {
        action: Action::Admit(c.admission().occurrence()),
        kind: Kind::Fire,
        claim: c.row().clone(),
        lease_deadline: Instant::now() + Duration::from_secs(20),
        error_backoff: Duration::from_secs(1),
    };
    let out = engine.process(vec![job]).await.remove(0);
    let runs: Vec<(i64, uuid::Uuid, i64)> = db
        .superuser()
        .await
        .query(
            "SELECT task_revision, execution_revision_id, scheduled_for_ms FROM qlsched.runs",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    assert_eq!(
        runs,
        vec![(task_revision, execution_revision, sf)],
        "the occurrence is admitted in the batch the deploy raced, on the deployed task \
         (engine outcome {out:?})"
    );
    let cursor = db
        .count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules")
        .await;
    assert_eq!(cursor, sf + 1000, "the cursor moved past the occurrence");
    assert_eq!(engine.metrics.redecides.get(), 0, "nothing was re-decided");
    db.assert_invariants().await;
}

/// A database that stops answering in the middle of an admission (every connection
/// blackholed) makes the whole batch's outcome unknown. The engine resolves the batch in one
/// read per attempt and stops at the lease deadline: it never waits member by member.
#[tokio::test]
async fn a_database_outage_during_a_batch_ends_at_the_lease_deadline() {
    use crate::helpers::proxy::{Fault, Proxy};
    use qlsched::engine::{Action, AdmitError, Engine, Job, Kind};
    use qlsched::store::session::{Connector, Session};
    let db = TestDb::new().await;
    db.seed_bulk(50, "* * * * * *", -100).await;
    let claims = Claimed::up_to(&db, "a", 30_000, 50).await;
    assert_eq!(claims.rows.len(), 50);
    let proxy = Proxy::start(db.port).await;
    // Through the proxy (a config built for its port: `Config::port` would add a second).
    let pg = crate::helpers::pg_config(proxy.port, "qlsched_runtime", &db.name);
    let mut engine = Engine {
        session: Session::new(Connector {
            pg: pg.into(),
            connect_timeout: Duration::from_secs(5),
        }),
        log: discard_log(),
        metrics: Metrics::default(),
        admit_timeout: Duration::from_secs(1),
        max_retries: 3,
        reject_backoff: Duration::from_secs(60),
    };
    proxy.arm(Fault::Partition, 1, 1);
    let deadline = Instant::now() + Duration::from_secs(4);
    let jobs: Vec<Job> = claims
        .rows
        .into_iter()
        .map(|c| Job {
            action: Action::Admit(admission(&c).occurrence()),
            kind: Kind::Fire,
            claim: c,
            lease_deadline: deadline,
            error_backoff: Duration::from_secs(1),
        })
        .collect();
    let started = Instant::now();
    let results = engine.process(jobs).await;
    let took = started.elapsed();
    assert!(
        took < Duration::from_millis(5_500),
        "the batch of 50 took {took:?} against a 4 s lease deadline"
    );
    assert!(
        results.iter().all(|r| matches!(
            r,
            Err(AdmitError::OutcomeUnknown(_)) | Err(AdmitError::LeaseOver)
        )),
        "{:?}",
        results.iter().take(3).collect::<Vec<_>>()
    );
    assert_eq!(
        engine.metrics.unknown_outcomes.get(),
        1,
        "one unknown outcome for the batch"
    );
    proxy.heal();
}
