use std::time::Duration;

use qlsched::store::admit::{self, Admission, AdmitOutcome, Refusal, Resolution};
use qlsched::store::{manage, release};
use uuid::Uuid;

use crate::helpers::claimed::{admission, Claimed};
use crate::helpers::{poll_until, unique_owner, wait_until, TestDb};

async fn written(db: &TestDb) -> (i64, i64, i64) {
    (
        db.count("SELECT count(*) FROM qlsched.runs").await,
        db.count("SELECT count(*) FROM qlsched.attempts").await,
        db.count("SELECT count(*) FROM qlsched.run_events").await,
    )
}

#[tokio::test]
async fn one_admission_writes_one_run_one_attempt_two_events_and_advances_the_cursor() {
    let db = TestDb::with_due(1).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let a = c.admission();
    let out = c.admit(&a).await;
    assert!(matches!(out, AdmitOutcome::Admitted { .. }), "{out:?}");
    assert_eq!(written(&db).await, (1, 1, 2));
    let su = db.superuser().await;
    let r = su
        .query_one(
            "SELECT r.idempotency_key, r.status, r.scheduled_for_ms, a.executor, a.state, a.attempt_no,
                    num_nonnulls(a.worker_id, a.session_id, a.lease_id, a.offer_id, a.callback_token, a.started_at_ms, a.result, a.error),
                    s.next_fire_at_ms, s.last_scheduled_at_ms, s.claim_owner IS NULL, s.claimable_at_ms,
                    (SELECT string_agg(kind, ',' ORDER BY seq) FROM qlsched.run_events e WHERE e.run_id = r.run_id)
               FROM qlsched.runs r JOIN qlsched.attempts a USING (run_id)
               JOIN qlsched.trigger_schedules s ON s.trigger_id = r.trigger_id",
            &[],
        )
        .await
        .unwrap();
    assert_eq!(
        r.get::<_, String>(0),
        format!("ql3:cron:v1:trg-00000:1:{}", a.scheduled_for_ms)
    );
    assert_eq!(r.get::<_, String>(1), "queued");
    assert_eq!(r.get::<_, i64>(2), a.scheduled_for_ms);
    assert_eq!(
        (
            r.get::<_, String>(3),
            r.get::<_, String>(4),
            r.get::<_, i32>(5)
        ),
        ("remote_worker".into(), "claimed".into(), 1)
    );
    assert_eq!(
        r.get::<_, i32>(6),
        0,
        "attempt fields are NULL at admission"
    );
    assert_eq!(r.get::<_, Option<i64>>(7), Some(a.next_fire_at_ms));
    assert_eq!(r.get::<_, Option<i64>>(8), Some(a.scheduled_for_ms));
    assert!(r.get::<_, bool>(9), "claim cleared");
    assert_eq!(r.get::<_, Option<i64>>(10), Some(a.next_fire_at_ms));
    assert_eq!(r.get::<_, String>(11), "run.created,run.queued");
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_stale_owner_token_or_version_each_cannot_commit() {
    let db = TestDb::with_due(1).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let mut wrong_owner = c.admission();
    wrong_owner.claim.fence.owner = "b".into();
    let mut wrong_token = c.admission();
    wrong_token.claim.fence.token = Uuid::new_v4();
    let mut wrong_version = c.admission();
    wrong_version.claim.fence.version -= 1;
    let mut wrong_state = c.admission();
    wrong_state.claim.state_version -= 1;
    for (what, a) in [
        ("owner", wrong_owner),
        ("token", wrong_token),
        ("version", wrong_version),
        ("state_version", wrong_state),
    ] {
        assert_eq!(
            c.admit(&a).await,
            AdmitOutcome::Refused {
                why: Refusal::FenceLost
            },
            "stale {what}"
        );
        assert_eq!(
            written(&db).await,
            (0, 0, 0),
            "stale {what} wrote something"
        );
    }
    assert!(matches!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Admitted { .. }
    ));
}

#[tokio::test]
async fn a_stale_holder_cannot_commit_after_a_takeover() {
    let db = TestDb::with_due(1).await;
    let old = Claimed::new(&db, &unique_owner("a"), 300).await;
    let b = unique_owner("b");
    let new = poll_until("takeover after expiry", Duration::from_secs(10), || async {
        let rows = old.claim_more(&b, 30_000, 1).await;
        (!rows.is_empty()).then_some(rows)
    })
    .await;
    assert_eq!(
        old.admit(&old.admission()).await,
        AdmitOutcome::Refused {
            why: Refusal::FenceLost
        }
    );
    assert!(matches!(
        old.admit(&admission(&new[0])).await,
        AdmitOutcome::Admitted { .. }
    ));
    assert_eq!(written(&db).await, (1, 1, 2));
}

#[tokio::test]
async fn an_expired_lease_cannot_commit_even_if_nobody_took_it() {
    let db = TestDb::with_due(1).await;
    let c = Claimed::new(&db, "a", 200).await;
    wait_until(
        "the database clock to pass the expiry",
        Duration::from_secs(5),
        || {
            let db = &db;
            let exp = c.row().fence.expires_at_ms;
            async move {
                db.count("SELECT (extract(epoch FROM clock_timestamp())*1000)::bigint")
                    .await
                    > exp
            }
        },
    )
    .await;
    assert_eq!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Refused {
            why: Refusal::FenceLost
        }
    );
    assert_eq!(written(&db).await, (0, 0, 0));
}

#[tokio::test]
async fn advancing_without_admission_moves_only_the_cursor() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    db.make_due(-100_000).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let conn = c.conn().await;
    let next = c.row().observed_at_ms + 1000;
    assert!(crate::helpers::drive::advance_cursor(&conn, c.row(), next)
        .await
        .unwrap());
    assert_eq!(written(&db).await, (0, 0, 0));
    assert_eq!(
        db.count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules WHERE claim_owner IS NULL")
            .await,
        next
    );
    assert!(
        !crate::helpers::drive::advance_cursor(&conn, c.row(), next + 1000)
            .await
            .unwrap(),
        "a used claim advances nothing"
    );
}

/// Each of the five writes of an admission is made to fail in turn by a trigger the test
/// installs; every time, nothing at all is written and the claim is untouched.
#[tokio::test]
async fn a_failure_in_any_of_the_five_writes_rolls_back_everything() {
    let db = TestDb::with_due(1).await;
    let su = db.superuser().await;
    su.batch_execute(
        "CREATE TABLE public.fail_at (what text);
         GRANT USAGE ON SCHEMA public TO qlsched_runtime;
         GRANT SELECT ON public.fail_at TO qlsched_runtime;
         CREATE FUNCTION public.fail_if() RETURNS trigger LANGUAGE plpgsql AS $$
         DECLARE k text := TG_ARGV[0];
         BEGIN
           IF k = 'event' THEN k := k || (to_jsonb(NEW) ->> 'seq'); END IF;
           IF EXISTS (SELECT 1 FROM public.fail_at WHERE what = k) THEN
             RAISE EXCEPTION 'injected failure at %', k;
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER f BEFORE INSERT ON qlsched.runs FOR EACH ROW EXECUTE FUNCTION public.fail_if('run');
         CREATE TRIGGER f BEFORE INSERT ON qlsched.attempts FOR EACH ROW EXECUTE FUNCTION public.fail_if('attempt');
         CREATE TRIGGER f BEFORE INSERT ON qlsched.run_events FOR EACH ROW EXECUTE FUNCTION public.fail_if('event');
         CREATE TRIGGER f BEFORE UPDATE ON qlsched.trigger_schedules FOR EACH ROW
             WHEN (OLD.claim_owner IS NOT NULL AND NEW.claim_owner IS NULL) EXECUTE FUNCTION public.fail_if('schedule');",
    )
    .await
    .unwrap();
    let c = Claimed::new(&db, "a", 60_000).await;
    let before = db
        .count("SELECT state_version FROM qlsched.trigger_schedules")
        .await;
    for what in ["run", "attempt", "event1", "event2", "schedule"] {
        su.execute("TRUNCATE public.fail_at", &[]).await.unwrap();
        su.execute("INSERT INTO public.fail_at VALUES ($1)", &[&what])
            .await
            .unwrap();
        let conn = c.conn().await;
        let err = crate::helpers::drive::admit_once(&conn, &c.admission())
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("injected failure"),
            "{what}: {err}"
        );
        assert_eq!(written(&db).await, (0, 0, 0), "{what} left writes behind");
        assert_eq!(
            db.count("SELECT state_version FROM qlsched.trigger_schedules")
                .await,
            before,
            "{what}"
        );
        assert_eq!(
            db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner = 'a'")
                .await,
            1
        );
    }
    su.execute("TRUNCATE public.fail_at", &[]).await.unwrap();
    assert!(matches!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Admitted { .. }
    ));
    db.assert_invariants().await;
}

#[tokio::test]
async fn a_corrupt_execution_revision_is_refused_and_the_claim_released_with_back_off() {
    let db = TestDb::with_due(1).await;
    db.superuser()
        .await
        .batch_execute("ALTER TABLE qlsched.execution_revisions DISABLE TRIGGER execution_revisions_are_immutable; UPDATE qlsched.execution_revisions SET spec = spec || ' '; ALTER TABLE qlsched.execution_revisions ENABLE TRIGGER execution_revisions_are_immutable")
        .await
        .unwrap();
    let c = Claimed::new(&db, "a", 30_000).await;
    assert_eq!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Refused {
            why: Refusal::ExecutionRevisionInvalid
        }
    );
    assert_eq!(written(&db).await, (0, 0, 0));
    let conn = c.conn().await;
    assert!(
        release::release_claim(&conn, &c.row().trigger_id, &c.row().fence, 60_000)
            .await
            .unwrap()
    );
    let wait = db
        .count("SELECT claimable_at_ms - (extract(epoch FROM clock_timestamp())*1000)::bigint FROM qlsched.trigger_schedules WHERE claim_owner IS NULL")
        .await;
    assert!((55_000..=60_000).contains(&wait), "back-off {wait} ms");
    assert!(
        c.claim_more("b", 30_000, 10).await.is_empty(),
        "backed-off row not claimable"
    );
}

#[tokio::test]
async fn a_republished_trigger_fences_out_an_old_claim() {
    let db = TestDb::with_due(1).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let mut admin = db.admin().await;
    let published = manage::publish_trigger(
        &mut admin,
        &manage::TriggerSpec::new("trg-00000", "proj", "task", "*/2 * * * * *", "UTC"),
    )
    .await
    .unwrap();
    assert_eq!(published.revision, 2);
    assert_eq!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Refused {
            why: Refusal::FenceLost
        }
    );
    assert_eq!(written(&db).await, (0, 0, 0));
    let row = db.superuser().await.query_one("SELECT next_fire_at_ms, claim_owner, claim_version, claimable_at_ms FROM qlsched.trigger_schedules", &[]).await.unwrap();
    let cursor = row
        .get::<_, Option<i64>>(0)
        .expect("the new revision's first cursor");
    // The claimed occurrence was due and not admitted: the new revision starts at the first
    // */2 occurrence at or after it (docs/design.md, "Who moves the cursor").
    let owed = c.row().next_fire_at_ms.unwrap();
    assert_eq!(
        cursor,
        (owed + 1_999).div_euclid(2_000) * 2_000,
        "the first */2 occurrence at or after the owed cursor {owed}"
    );
    assert_eq!(row.get::<_, Option<String>>(1), None, "claim cleared");
    assert_eq!(
        row.get::<_, i64>(2),
        c.row().fence.version + 1,
        "claim_version bumped"
    );
    assert_eq!(
        row.get::<_, Option<i64>>(3),
        Some(cursor),
        "claimable at its first occurrence"
    );
}

#[tokio::test]
async fn an_existing_idempotency_key_writes_no_run_and_advances_the_cursor_under_the_fence() {
    let db = TestDb::with_due(1).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let a = c.admission();
    db.superuser()
        .await
        .execute(
            "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id, task_revision, execution_revision_id, idempotency_key, scheduled_for_ms, admitted_by)
             SELECT gen_random_uuid(), 'proj', 'trg-00000', 1, 'task', 1, execution_revision_id, $1, $2, 'elsewhere' FROM qlsched.tasks",
            &[&a.key(), &a.scheduled_for_ms],
        )
        .await
        .unwrap();
    assert_eq!(c.admit(&a).await, AdmitOutcome::AlreadyAdmitted);
    assert_eq!(written(&db).await, (1, 0, 0));
    let (cursor, owner) = (
        db.count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules")
            .await,
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL")
            .await,
    );
    assert_eq!(
        (cursor, owner),
        (a.next_fire_at_ms, 0),
        "the cursor moved past the existing occurrence and the claim was cleared"
    );
}

#[tokio::test]
async fn an_unknown_outcome_is_resolved_by_key_and_fence() {
    let db = TestDb::with_due(2).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let a = c.admission();
    assert_eq!(resolve(&c, &a).await, Resolution::NotCommittedClaimHeld);
    assert!(matches!(c.admit(&a).await, AdmitOutcome::Admitted { .. }));
    assert!(matches!(
        resolve(&c, &a).await,
        Resolution::Committed { .. }
    ));
    let other = c.another("a", 30_000).await;
    let conn = c.conn().await;
    release::release_claim(&conn, &other.trigger_id, &other.fence, 0)
        .await
        .unwrap();
    assert_eq!(resolve(&c, &admission(&other)).await, Resolution::NotOurs);
}

async fn resolve(c: &Claimed, a: &Admission) -> Resolution {
    let conn = c.conn().await;
    admit::resolve_batch(&conn, std::slice::from_ref(a))
        .await
        .unwrap()
        .remove(0)
}

#[tokio::test]
async fn the_runtime_role_admits_without_insert_on_schedules() {
    let db = TestDb::with_due(1).await;
    let rt = db.client("qlsched_runtime").await;
    let has_insert: bool = rt
        .query_one(
            "SELECT has_table_privilege('qlsched.trigger_schedules', 'INSERT')",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert!(!has_insert);
    let c = Claimed::new(&db, "a", 30_000).await;
    assert!(matches!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Admitted { .. }
    ));
}

/// A batch admits its members independently: a stale member is refused and writes
/// nothing, the others commit in the same transaction. The schedule rows are reached by a
/// TID scan (tuple-level predicate locks), not a primary-key probe.
#[tokio::test]
async fn a_batch_admits_its_valid_members_and_refuses_only_the_stale_one() {
    let db = TestDb::with_due(5).await;
    let claims = Claimed::up_to(&db, "a", 30_000, 5).await;
    let mut batch = claims.admissions();
    batch[2].claim.fence.token = Uuid::new_v4();
    let conn = claims.conn().await;
    let out = crate::helpers::drive::admit_batch(&conn, &batch)
        .await
        .unwrap();
    assert_eq!(
        out.iter()
            .filter(|o| matches!(o, AdmitOutcome::Admitted { .. }))
            .count(),
        4
    );
    assert_eq!(
        out[2],
        AdmitOutcome::Refused {
            why: Refusal::FenceLost
        }
    );
    assert_eq!(written(&db).await, (4, 4, 8));
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM qlsched.runs WHERE trigger_id = '{}'",
            batch[2].claim.trigger_id
        ))
        .await,
        0
    );
    db.assert_invariants().await;

    // The plan of the admission statement's schedule access.
    let su = db.superuser().await;
    let tids =
        crate::helpers::plan(&su, "SELECT ctid::text FROM qlsched.trigger_schedules", &[]).await;
    su.batch_execute("BEGIN; SET LOCAL enable_seqscan = off")
        .await
        .unwrap();
    let plan = crate::helpers::plan(
        &su,
        "EXPLAIN SELECT 1 FROM qlsched.trigger_schedules s WHERE s.ctid = ANY ($1::text[]::tid[])",
        &[&tids],
    )
    .await;
    su.batch_execute("ROLLBACK").await.unwrap();
    assert!(plan.contains("Tid Scan on trigger_schedules"), "{plan}");
}

#[tokio::test]
async fn a_batch_of_cursor_moves_moves_only_rows_whose_fence_holds() {
    let db = TestDb::with_due(3).await;
    let claims = Claimed::up_to(&db, "a", 30_000, 3).await;
    let conn = claims.conn().await;
    let mut batch: Vec<_> = claims
        .rows
        .iter()
        .map(|c| (c.clone(), c.observed_at_ms + 1000))
        .collect();
    batch[0].0.fence.version += 1;
    assert_eq!(
        admit::advance_batch(&conn, &batch).await.unwrap(),
        vec![false, true, true]
    );
    assert_eq!(db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NULL AND next_fire_at_ms IS NOT NULL").await, 2);
}

#[test]
fn run_ids_of_one_replica_share_a_prefix_and_increase() {
    let a1 = admit::mint_run_id("a");
    std::thread::sleep(Duration::from_millis(2));
    let a2 = admit::mint_run_id("a");
    let b = admit::mint_run_id("b");
    assert_eq!(a1.as_bytes()[..4], a2.as_bytes()[..4]);
    assert_ne!(a1.as_bytes()[..4], b.as_bytes()[..4]);
    assert!(a2 > a1, "time-ordered within a replica");
    assert_eq!(a1.get_version_num(), 8);
}

/// The pipelined BEGIN / statement / COMMIT really run in that order: the statement sees a
/// SERIALIZABLE transaction with the transaction-local planner setting applied.
#[tokio::test]
async fn the_admission_statement_runs_inside_its_serializable_transaction() {
    let db = TestDb::with_due(2).await;
    db.superuser()
        .await
        .batch_execute(
            "CREATE TABLE public.probe (isolation text, seqscan text, xid bigint);
             GRANT USAGE ON SCHEMA public TO qlsched_runtime;
             GRANT INSERT ON public.probe TO qlsched_runtime;
             CREATE FUNCTION public.probe() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               INSERT INTO public.probe VALUES (current_setting('transaction_isolation'),
                                                current_setting('enable_seqscan'), txid_current());
               RETURN NEW;
             END $$;
             CREATE TRIGGER probe BEFORE INSERT ON qlsched.runs FOR EACH ROW EXECUTE FUNCTION public.probe();
             CREATE TRIGGER probe BEFORE UPDATE ON qlsched.trigger_schedules FOR EACH ROW
                 WHEN (OLD.claim_owner IS NOT NULL AND NEW.claim_owner IS NULL) EXECUTE FUNCTION public.probe();",
        )
        .await
        .unwrap();
    let claims = Claimed::up_to(&db, "a", 30_000, 2).await;
    let conn = claims.conn().await;
    let out = crate::helpers::drive::admit_batch(&conn, &claims.admissions())
        .await
        .unwrap();
    assert!(
        out.iter()
            .all(|o| matches!(o, AdmitOutcome::Admitted { .. })),
        "{out:?}"
    );
    let rows = db
        .superuser()
        .await
        .query("SELECT isolation, seqscan, xid FROM public.probe", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), 4, "two schedule updates and two run inserts");
    for r in &rows {
        assert_eq!(r.get::<_, String>(0), "serializable");
        assert_eq!(r.get::<_, String>(1), "off");
    }
    let xids: std::collections::HashSet<i64> = rows.iter().map(|r| r.get(2)).collect();
    assert_eq!(xids.len(), 1, "one transaction for the whole batch");
}
