//! The overlap policy (migration V21, docs/policies-overlap.md): each policy against real
//! PostgreSQL, and each interleaving of its decision with a concurrent writer forced with
//! locks (docs/design.md, "Overlap").
//!
//! A transaction is held open at a chosen point by a test-only deferred constraint trigger
//! on runs: a run admitted by an owner whose name contains `held` waits, at its COMMIT, for
//! the advisory lock [`HOLD`] that the test holds; everything the transaction locked stays
//! locked meanwhile (the trigger's row of `qlsched.trigger_overlap` above all).

use std::time::Duration;

use qlsched::db::StoreError;
use qlsched::store::admission::{AdmitOutcome, Refusal};
use qlsched::store::manage::{self, ManageError, OverlapPolicy, TriggerSpec};
use qlsched::store::{runs, triggers};
use uuid::Uuid;

use crate::helpers::claimed::Claimed;
use crate::helpers::{drive, wait_until, TestDb};

/// The advisory lock a held transaction waits for at its COMMIT.
const HOLD: i64 = 35_001;

/// A database with trigger `t` (every second) published under `policy`.
async fn with_policy(policy: OverlapPolicy) -> TestDb {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let spec = TriggerSpec {
        overlap_policy: policy,
        ..TriggerSpec::new("t", "proj", "task", "* * * * * *", "UTC")
    };
    manage::publish_trigger(&mut admin, &spec).await.unwrap();
    db
}

/// Makes `t` due and admits its occurrence as `owner` would, on a fresh claim.
async fn scheduled(db: &TestDb, owner: &str) -> (i64, Result<AdmitOutcome, StoreError>) {
    db.make_due(-100).await;
    let c = Claimed::new(db, owner, 30_000).await;
    let a = c.admission();
    let conn = c.conn().await;
    (a.scheduled_for_ms, drive::admit_once(&conn, &a).await)
}

/// What `trigger show` says of the policy: (unfinished counted, skipped, last skipped,
/// buffered instant).
async fn state(db: &TestDb) -> (Option<i32>, i64, Vec<i64>, Option<i64>) {
    let v = triggers::show(&db.admin().await, "t").await.unwrap();
    (
        v.overlap_unfinished,
        v.skipped_overlap,
        v.last_skipped_ms,
        v.buffered_for_ms,
    )
}

/// The runs of `t`: (run id, scheduled for, status), in admission order.
async fn runs_of_t(db: &TestDb) -> Vec<(Uuid, i64, String)> {
    db.superuser()
        .await
        .query(
            "SELECT run_id, scheduled_for_ms, status FROM qlsched.runs WHERE trigger_id = 't'
              ORDER BY queued_at_ms, run_id",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// Cancels the queued run `id` (`runs cancel`, the admin role).
async fn cancel(db: &TestDb, id: Uuid) {
    let n = runs::cancel_chunk(&mut db.admin().await, &[id])
        .await
        .unwrap();
    assert_eq!(n, 1, "run {id} cancelled");
}

/// Installs the hold (see the module's comment): a deferred constraint trigger on
/// `qlsched.trigger_overlap` whose function, for a session whose login role is listed in
/// `public.hold_roles`, waits at COMMIT for the advisory lock [`HOLD`].
async fn install_hold(db: &TestDb, role: &str) {
    db.superuser()
        .await
        .batch_execute(&format!(
            "CREATE TABLE public.hold_roles (role text PRIMARY KEY);
             GRANT SELECT ON public.hold_roles TO PUBLIC;
             INSERT INTO public.hold_roles VALUES ('{role}');
             CREATE FUNCTION public.hold_at_commit() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $$
             BEGIN
                 IF EXISTS (SELECT 1 FROM public.hold_roles h WHERE h.role = session_user::text) THEN
                     PERFORM pg_advisory_xact_lock({HOLD});
                 END IF;
                 RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER hold_at_commit AFTER UPDATE ON qlsched.trigger_overlap
                 DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION public.hold_at_commit();"
        ))
        .await
        .unwrap();
}

/// Releases `c`'s lease as the engine does after a refusal that leaves it ours.
async fn release_lease(c: &Claimed) {
    let row = c.row();
    let conn = c.conn().await;
    assert!(
        qlsched::store::release::release_claim(&conn, &row.trigger_id, &row.fence, 0)
            .await
            .unwrap(),
        "the lease was still ours"
    );
}

/// A session holding [`HOLD`] until [`release`].
async fn hold(db: &TestDb) -> tokio_postgres::Client {
    let c = db.superuser().await;
    c.batch_execute(&format!("SELECT pg_advisory_lock({HOLD})"))
        .await
        .unwrap();
    c
}

async fn release(holder: &tokio_postgres::Client) {
    holder
        .batch_execute(&format!("SELECT pg_advisory_unlock({HOLD})"))
        .await
        .unwrap();
}

/// Waits until exactly `n` sessions of the database wait for a lock.
async fn waiting(db: &TestDb, what: &str, n: i64) {
    wait_until(what, Duration::from_secs(10), || async {
        db.count(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'",
        )
        .await
            == n
    })
    .await;
}

/// The admission of `c`'s row, on a connection of its pool, in a task.
fn admit_in_task(c: &Claimed) -> tokio::task::JoinHandle<Result<AdmitOutcome, StoreError>> {
    let rows = c.rows.clone();
    let pool = c.pool.clone();
    tokio::spawn(async move {
        let conn = qlsched::db::conn(&pool).await.unwrap();
        drive::admit_once(&conn, &crate::helpers::claimed::admission(&rows[0])).await
    })
}

async fn login_role(c: &Claimed) -> String {
    c.conn()
        .await
        .query_one("SELECT session_user::text", &[])
        .await
        .unwrap()
        .get(0)
}

fn serialization_failure(r: &Result<AdmitOutcome, StoreError>) -> bool {
    matches!(r, Err(e) if e.is_serialization())
}

#[tokio::test]
async fn forbid_skips_while_a_run_is_unfinished_records_the_skip_and_admits_again_after_it() {
    let db = with_policy(OverlapPolicy::Forbid).await;
    let (_, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    assert_eq!(state(&db).await, (Some(1), 0, vec![], None));
    // Due while the first run is queued: not admitted, recorded, the cursor moves on.
    let (second_sf, second) = scheduled(&db, "a").await;
    assert_eq!(second.unwrap(), AdmitOutcome::Overlap);
    // A key admitted before (here by a backfill) is still a duplicate key, not a skip.
    db.make_due(-100).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let dup = c.admission();
    let n = triggers::backfill_chunk(
        &mut db.admin().await,
        "t",
        1,
        &[dup.scheduled_for_ms],
        "ops",
    )
    .await
    .unwrap();
    assert_eq!(n.admitted, 1);
    assert_eq!(c.admit(&dup).await, AdmitOutcome::AlreadyAdmitted);
    let backfilled = runs_of_t(&db).await.pop().unwrap().0;
    cancel(&db, backfilled).await;
    assert_eq!(state(&db).await, (Some(1), 1, vec![second_sf], None));
    let cursor = db
        .count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules WHERE trigger_id = 't'")
        .await;
    assert!(
        cursor > second_sf,
        "the cursor moved past the skipped instant"
    );
    let r = runs_of_t(&db).await;
    assert_eq!(r.len(), 2, "the first run and the backfilled one: {r:?}");
    cancel(&db, r[0].0).await;
    assert_eq!(
        state(&db).await.0,
        Some(0),
        "the run's end lowered the count"
    );
    let (_, third) = scheduled(&db, "a").await;
    assert!(
        matches!(third, Ok(AdmitOutcome::Admitted { .. })),
        "{third:?}"
    );
    assert_eq!(runs_of_t(&db).await.len(), 3);
    db.assert_invariants().await;
}

/// What an admission statement from before V26 writes for a forbid trigger, as the runtime
/// role: a run of `t` at `sf` counted under forbid and not counted by the statement itself
/// (overlap_counted NULL), its attempt and events. How many runs it inserted.
async fn admit_as_before_v26(db: &TestDb, sf: i64) -> i64 {
    db.client("qlsched_runtime")
        .await
        .query_one(
            "WITH r AS (
                 INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                           task_revision, execution_revision_id, idempotency_key,
                                           status, scheduled_for_ms, queued_at_ms, admitted_by,
                                           pool, executor, overlap_policy)
                 SELECT gen_random_uuid(), project_id, trigger_id, trigger_revision, task_id,
                        task_revision, execution_revision_id,
                        'ql3:cron:v1:t:' || trigger_revision || ':' || $1::int8, 'queued', $1::int8,
                        queued_at_ms, 'before-v26', pool, executor, 'forbid'
                   FROM qlsched.runs WHERE trigger_id = 't' ORDER BY queued_at_ms LIMIT 1
                 RETURNING run_id, queued_at_ms
             ), a AS (
                 INSERT INTO qlsched.attempts (attempt_id, run_id, attempt_no, executor, state, created_at_ms)
                 SELECT gen_random_uuid(), run_id, 1, 'remote_worker', 'claimed', queued_at_ms FROM r
             ), e AS (
                 INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
                 SELECT run_id, s.seq, s.kind, queued_at_ms
                   FROM r, (VALUES (1, 'run.created'), (2, 'run.queued')) AS s(seq, kind)
             )
             SELECT count(*) FROM r",
            &[&sf],
        )
        .await
        .unwrap()
        .get(0)
}

/// The scheduled admission decides and counts a forbid trigger's run in its own statement
/// (V26: the run is marked counted, V21's row triggers are not called for it), while a run
/// inserted the way a binary before V26 admits (unmarked) is still decided and counted by
/// those triggers: both paths keep one count.
#[tokio::test]
async fn forbid_is_decided_in_the_admission_and_an_older_binarys_admission_is_still_counted() {
    let db = with_policy(OverlapPolicy::Forbid).await;
    let (sf, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    let marked = "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 't' AND overlap_counted";
    assert_eq!(db.count(marked).await, 1, "counted by the statement");
    assert_eq!(state(&db).await, (Some(1), 0, vec![], None));

    // An older binary's admission while the run is unfinished: V21's trigger skips it.
    let old_sf = sf - 3_600_000;
    assert_eq!(admit_as_before_v26(&db, old_sf).await, 0);
    assert_eq!(state(&db).await, (Some(1), 1, vec![old_sf], None));

    // Once the run ended: admitted and counted by the trigger, ended and uncounted again.
    let run = runs_of_t(&db).await[0].0;
    cancel(&db, run).await;
    assert_eq!(state(&db).await.0, Some(0));
    // (Another instant: the skipped one is accounted for by its skip.)
    let old_sf = sf - 7_200_000;
    assert_eq!(admit_as_before_v26(&db, old_sf).await, 1);
    assert_eq!(state(&db).await.0, Some(1), "the older admission counted");
    assert_eq!(db.count(marked).await, 1, "the older run is not marked");
    let (_, refused) = scheduled(&db, "a").await;
    assert_eq!(refused.unwrap(), AdmitOutcome::Overlap);
    let old = runs_of_t(&db)
        .await
        .iter()
        .find(|r| r.1 == old_sf)
        .unwrap()
        .0;
    cancel(&db, old).await;
    assert_eq!(state(&db).await.0, Some(0));
    db.assert_invariants().await;
}

/// The count's parts for `t`: (the overlap row's unfinished, the schedule row's
/// overlap_admitted, the overlap row's overlap_released); the count is the first plus the
/// second minus the third (V28).
async fn parts(db: &TestDb) -> (i32, i64, i64) {
    let r = db
        .superuser()
        .await
        .query_one(
            "SELECT o.unfinished, s.overlap_admitted, o.overlap_released
               FROM qlsched.trigger_overlap o JOIN qlsched.trigger_schedules s USING (trigger_id)
              WHERE trigger_id = 't'",
            &[],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1), r.get(2))
}

/// V28: a run an idle forbid trigger's admission counted on the schedule row is seen by every
/// other reader of the count (an older binary's decision, a republish's recount, the run's
/// end), and an idle admission whose run is not inserted (its key existed) undoes its count.
#[tokio::test]
async fn the_part_of_the_count_on_the_schedule_row_is_seen_by_every_reader_and_undone_when_no_run_is_inserted(
) {
    let db = with_policy(OverlapPolicy::Forbid).await;
    let (sf, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    assert_eq!(
        parts(&db).await,
        (0, 1, 0),
        "counted on the schedule row alone"
    );
    assert_eq!(state(&db).await.0, Some(1));

    // A V26/V27 binary's decision (overlap_decide, the runtime role's) sees the run unfinished.
    let rt = db.client("qlsched_runtime").await;
    rt.batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE")
        .await
        .unwrap();
    let busy: bool = rt
        .query_one(
            "SELECT d.busy FROM qlsched.trigger_overlap o,
                    qlsched.overlap_decide(ARRAY[o.ctid], ARRAY['t'], ARRAY['forbid'], ARRAY['not-a-key'],
                                           ARRAY[false], ARRAY[$1::int8]) d
              WHERE o.trigger_id = 't'",
            &[&(sf + 1000)],
        )
        .await
        .unwrap()
        .get(0);
    rt.batch_execute("ROLLBACK").await.unwrap();
    assert!(
        busy,
        "an older binary's decision missed the run counted on the schedule row"
    );

    // A republish recounts: the run moves to the overlap row's part, the schedule row's is 0.
    let mut admin = db.admin().await;
    let republish = |policy| TriggerSpec {
        overlap_policy: policy,
        ..TriggerSpec::new("t", "proj", "task", "* * * * * *", "UTC")
    };
    manage::publish_trigger(&mut admin, &republish(OverlapPolicy::BufferOne))
        .await
        .unwrap();
    assert_eq!(parts(&db).await, (1, 1, 1));
    let run = runs_of_t(&db).await[0].0;
    cancel(&db, run).await;
    assert_eq!(
        parts(&db).await,
        (0, 1, 1),
        "the run's end lowered the count"
    );
    manage::publish_trigger(&mut admin, &republish(OverlapPolicy::Forbid))
        .await
        .unwrap();

    // An occurrence a backfill admitted (and whose run ended) is claimed idle: its key exists,
    // so no run is inserted and the count the admission raised is released again.
    db.make_due(-100).await;
    let instant = db
        .count("SELECT next_fire_at_ms FROM qlsched.trigger_schedules WHERE trigger_id = 't'")
        .await;
    let revision = db
        .count("SELECT revision FROM qlsched.triggers WHERE trigger_id = 't'")
        .await;
    let n = triggers::backfill_chunk(&mut admin, "t", revision, &[instant], "ops")
        .await
        .unwrap();
    assert_eq!(n.admitted, 1);
    assert_eq!(
        parts(&db).await,
        (1, 2, 2),
        "the backfill marked the idle trigger"
    );
    let backfilled = runs_of_t(&db).await.pop().unwrap().0;
    cancel(&db, backfilled).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let a = c.admission();
    assert_eq!(a.scheduled_for_ms, instant);
    assert_eq!(c.admit(&a).await, AdmitOutcome::AlreadyAdmitted);
    assert_eq!(parts(&db).await, (0, 3, 3), "raised and released");
    assert_eq!(state(&db).await.0, Some(0));
    db.assert_invariants().await;
}

/// Whatever isolation level sessions default to, a run's end lowers the count an idle
/// admission kept on the schedule row, and a fire marks an idle forbid trigger so that a
/// claim that read it idle is refused and decided again (only the admission statement itself
/// skips those steps, by a setting of its own transaction, not by its isolation level).
#[tokio::test]
async fn a_serializable_default_isolation_changes_neither_a_run_end_nor_the_mark_of_a_fire() {
    let db = with_policy(OverlapPolicy::Forbid).await;
    db.superuser()
        .await
        .batch_execute(
            "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET default_transaction_isolation = serializable',
                                        current_database()); END $$",
        )
        .await
        .unwrap();
    let (_, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    let run = runs_of_t(&db).await[0].0;
    cancel(&db, run).await;
    assert_eq!(
        parts(&db).await,
        (0, 1, 1),
        "the run's end released its count"
    );
    assert_eq!(state(&db).await.0, Some(0));

    db.make_due(-100).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    assert!(c.row().overlap_idle, "claimed idle");
    let fired = triggers::fire(&mut db.admin().await, "t", "one", "ops")
        .await
        .unwrap();
    assert!(fired.admitted);
    assert_eq!(
        c.admit(&c.admission()).await,
        AdmitOutcome::Refused {
            why: Refusal::RowMoved
        },
        "the fire did not mark the schedule row"
    );
    release_lease(&c).await;
    let (_, out) = scheduled(&db, "a").await;
    assert_eq!(out.unwrap(), AdmitOutcome::Overlap);
    assert_eq!(
        runs_of_t(&db).await.len(),
        2,
        "the first run and the fired one"
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn buffer_one_keeps_one_occurrence_skips_the_next_and_admits_it_when_the_run_ends() {
    let db = with_policy(OverlapPolicy::BufferOne).await;
    let (_, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    let (kept, _) = scheduled(&db, "a").await;
    let (skipped, _) = scheduled(&db, "a").await;
    assert_eq!(state(&db).await, (Some(1), 1, vec![skipped], Some(kept)));
    let r = runs_of_t(&db).await;
    assert_eq!(r.len(), 1, "one run while the first is unfinished: {r:?}");
    // The end of the first run (an operator's cancel, the admin role) admits the kept one.
    cancel(&db, r[0].0).await;
    let r = runs_of_t(&db).await;
    assert_eq!(r.len(), 2, "{r:?}");
    assert_eq!((r[1].1, r[1].2.as_str()), (kept, "queued"));
    assert_eq!(state(&db).await, (Some(1), 1, vec![skipped], None));
    let (att, events) = (
        db.count(&format!(
            "SELECT count(*) FROM qlsched.attempts WHERE run_id = '{}' AND state = 'claimed'",
            r[1].0
        ))
        .await,
        db.count(&format!(
            "SELECT count(*) FROM qlsched.run_events WHERE run_id = '{}'",
            r[1].0
        ))
        .await,
    );
    assert_eq!(
        (att, events),
        (1, 2),
        "the kept run's attempt and two events"
    );
    db.assert_invariants().await;
}

#[tokio::test]
async fn replace_cancels_a_queued_run_asks_a_running_one_to_stop_and_admits() {
    let db = with_policy(OverlapPolicy::Replace).await;
    let (_, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    let (_, second) = scheduled(&db, "a").await;
    assert!(
        matches!(second, Ok(AdmitOutcome::Admitted { .. })),
        "{second:?}"
    );
    let r = runs_of_t(&db).await;
    assert_eq!(
        r.iter().map(|x| x.2.as_str()).collect::<Vec<_>>(),
        ["cancelled", "queued"],
        "the queued run was cancelled"
    );
    assert_eq!(state(&db).await.0, Some(1));
    // The second run taken and started by a dispatcher, then a third occurrence.
    let disp = db.client("qlsched_dispatcher").await;
    let taken = drive::take(&disp, 10).await;
    assert_eq!(taken, vec![r[1].0]);
    assert_eq!(drive::start_direct(&disp, &taken).await, 1);
    let (_, third) = scheduled(&db, "a").await;
    assert!(
        matches!(third, Ok(AdmitOutcome::Admitted { .. })),
        "{third:?}"
    );
    let asked = db
        .count(&format!(
            "SELECT count(*) FROM qlsched.runs WHERE run_id = '{}' AND status = 'running'
                AND cancel_requested_at_ms IS NOT NULL",
            r[1].0
        ))
        .await;
    assert_eq!(
        asked, 1,
        "the running run is asked to stop at its next heartbeat"
    );
    assert_eq!(state(&db).await.0, Some(2));
    assert_eq!(drive::finish_direct(&disp, r[1].0, "failed").await, 1);
    assert_eq!(state(&db).await.0, Some(1));
    db.assert_invariants().await;
}

#[tokio::test]
async fn fire_follows_the_policy_unless_told_otherwise_and_backfill_admits_what_it_was_asked() {
    let db = with_policy(OverlapPolicy::Forbid).await;
    let mut admin = db.admin().await;
    let f = triggers::fire(&mut admin, "t", "one", "ops").await.unwrap();
    assert!(f.admitted);
    let refused = triggers::fire(&mut admin, "t", "two", "ops").await;
    assert!(
        matches!(
            refused,
            Err(ManageError::Overlap {
                buffered: false,
                ..
            })
        ),
        "{refused:?}"
    );
    assert_eq!(state(&db).await.1, 1, "the refused fire is a recorded skip");
    let anyway = triggers::fire_with(&mut admin, "t", "three", "ops", Some(OverlapPolicy::Allow))
        .await
        .unwrap();
    assert!(anyway.admitted);
    assert_eq!(state(&db).await.0, Some(2), "a run fired anyway is counted");
    // A scheduled occurrence sees the fired runs.
    let (_, s) = scheduled(&db, "a").await;
    assert_eq!(s.unwrap(), AdmitOutcome::Overlap);
    // A backfill admits every occurrence it was asked for; with --overlap forbid, none.
    let now = db.now_ms().await / 1000 * 1000;
    let past: Vec<i64> = (1..=3).map(|i| now - 60_000 - i * 1000).collect();
    let c = triggers::backfill_chunk(&mut admin, "t", 1, &past[..2], "ops")
        .await
        .unwrap();
    assert_eq!(c.admitted, 2);
    let c =
        triggers::backfill_chunk_with(&mut admin, "t", 1, &past[2..], "ops", OverlapPolicy::Forbid)
            .await
            .unwrap();
    assert_eq!(c.admitted, 0);
    assert_eq!(state(&db).await, (Some(4), 3, state(&db).await.2, None));
    db.assert_invariants().await;
}

/// The recorded skip instants are kept as long as finished runs: the pruning replica
/// (runtime role) drops those before its horizon; the count stays.
#[tokio::test]
async fn retention_drops_old_skip_instants_and_keeps_the_count() {
    let db = with_policy(OverlapPolicy::Forbid).await;
    let (_, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    let (sf, _) = scheduled(&db, "a").await;
    let runtime = db.client("qlsched_runtime").await;
    let kept = qlsched::store::retention::prune_skips(&runtime, Duration::from_secs(3600))
        .await
        .unwrap();
    assert_eq!(kept, 0, "an instant within the hour stays");
    assert_eq!(state(&db).await.2, vec![sf]);
    wait_until("the skip in the past", Duration::from_secs(5), || async {
        db.now_ms().await > sf
    })
    .await;
    let n = qlsched::store::retention::prune_skips(&runtime, Duration::ZERO)
        .await
        .unwrap();
    assert_eq!(n, 1);
    assert_eq!(state(&db).await, (Some(1), 1, vec![], None));
    db.assert_invariants().await;
}

/// A policy set on a trigger with unfinished runs counts them (they were admitted under
/// allow), and a republish with the policy unchanged is no new revision.
#[tokio::test]
async fn a_policy_set_later_counts_the_runs_admitted_before_it() {
    let db = with_policy(OverlapPolicy::Allow).await;
    let (_, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    assert_eq!(state(&db).await.0, None, "an allow trigger counts nothing");
    let mut admin = db.admin().await;
    let spec = TriggerSpec {
        overlap_policy: OverlapPolicy::Forbid,
        ..TriggerSpec::new("t", "proj", "task", "* * * * * *", "UTC")
    };
    let p = manage::publish_trigger(&mut admin, &spec).await.unwrap();
    assert_eq!((p.revision, p.changed), (2, true));
    assert_eq!(state(&db).await.0, Some(1));
    let again = manage::publish_trigger(&mut admin, &spec).await.unwrap();
    assert_eq!((again.revision, again.changed), (2, false));
    let (_, s) = scheduled(&db, "a").await;
    assert_eq!(s.unwrap(), AdmitOutcome::Overlap);
    let r = runs_of_t(&db).await;
    cancel(&db, r[0].0).await;
    assert_eq!(state(&db).await.0, Some(0));
    db.assert_invariants().await;
}

/// forbid, a finish racing the admission: the admission has taken its snapshot (it waits
/// on the schedule row, locked by a session that changes nothing) when the run's cancel
/// commits. Its decision then reads a row changed after its snapshot: a serialization
/// failure, nothing written, and the retry sees the run finished and admits.
#[tokio::test]
async fn forbid_a_finish_committed_after_the_admissions_snapshot_fails_it_and_the_retry_admits() {
    let db = with_policy(OverlapPolicy::Forbid).await;
    let (_, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    let run = runs_of_t(&db).await[0].0;
    db.make_due(-100).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let blocker = db.superuser().await;
    blocker
        .batch_execute(
            "BEGIN; SELECT 1 FROM qlsched.trigger_schedules WHERE trigger_id = 't' FOR UPDATE",
        )
        .await
        .unwrap();
    let admitting = admit_in_task(&c);
    waiting(&db, "the admission waiting on the schedule row", 1).await;
    cancel(&db, run).await;
    blocker.batch_execute("COMMIT").await.unwrap();
    let out = admitting.await.unwrap();
    assert!(serialization_failure(&out), "{out:?}");
    assert_eq!(
        state(&db).await,
        (Some(0), 0, vec![], None),
        "nothing recorded"
    );
    let out = c.admit(&c.admission()).await;
    assert!(matches!(out, AdmitOutcome::Admitted { .. }), "{out:?}");
    assert_eq!(state(&db).await.0, Some(1));
    db.assert_invariants().await;
}

/// forbid and buffer_one, a finish racing an admission that holds the decision's row (held
/// at its COMMIT): the finish waits for it, so the admission saw the run unfinished. Under
/// forbid it recorded a skip; under buffer_one it kept the occurrence, and the finish —
/// which then reads the kept occurrence — admits it: never neither.
#[tokio::test]
async fn a_finish_waiting_for_a_held_admission_sees_its_decision() {
    for policy in [OverlapPolicy::Forbid, OverlapPolicy::BufferOne] {
        let db = with_policy(policy).await;
        let (_, first) = scheduled(&db, "a").await;
        assert!(
            matches!(first, Ok(AdmitOutcome::Admitted { .. })),
            "{first:?}"
        );
        let run = runs_of_t(&db).await[0].0;
        db.make_due(-100).await;
        let c = Claimed::new(&db, "a", 30_000).await;
        let sf = c.admission().scheduled_for_ms;
        install_hold(&db, &login_role(&c).await).await;
        let holder = hold(&db).await;
        let admitting = admit_in_task(&c);
        waiting(&db, "the admission held at its commit", 1).await;
        let cancel_db = db.clone();
        let cancelling = tokio::spawn(async move { cancel(&cancel_db, run).await });
        waiting(&db, "the cancel waiting for the admission", 2).await;
        release(&holder).await;
        let out = admitting.await.unwrap();
        assert_eq!(out.unwrap(), AdmitOutcome::Overlap, "{policy}");
        cancelling.await.unwrap();
        let r = runs_of_t(&db).await;
        if policy == OverlapPolicy::Forbid {
            assert_eq!(state(&db).await, (Some(0), 1, vec![sf], None));
            assert_eq!(r.len(), 1);
        } else {
            assert_eq!(state(&db).await, (Some(1), 0, vec![], None));
            assert_eq!((r.len(), r[1].1), (2, sf), "the kept occurrence admitted");
        }
        db.assert_invariants().await;
    }
}

/// A fire holding the decision's row (held at its COMMIT), a scheduled forbid admission
/// and a second fire racing it: the admission waits for the fire, then fails to serialize
/// (the row changed after its snapshot) and writes nothing; its retry sees the fired run
/// and skips. The second fire (READ COMMITTED, like the first) waits, then sees the fired
/// run and is refused. One run of three tries.
#[tokio::test]
async fn a_fire_and_an_admission_racing_under_forbid_admit_one_run() {
    let db = with_policy(OverlapPolicy::Forbid).await;
    db.make_due(-100).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let admin_role: String = db
        .admin()
        .await
        .query_one("SELECT session_user::text", &[])
        .await
        .unwrap()
        .get(0);
    install_hold(&db, &admin_role).await;
    let holder = hold(&db).await;
    let fire_db = db.clone();
    let firing =
        tokio::spawn(
            async move { triggers::fire(&mut fire_db.admin().await, "t", "one", "ops").await },
        );
    waiting(&db, "the fire held at its commit", 1).await;
    let admitting = admit_in_task(&c);
    waiting(&db, "the admission waiting for the fire", 2).await;
    let fire_db = db.clone();
    let second_fire =
        tokio::spawn(
            async move { triggers::fire(&mut fire_db.admin().await, "t", "two", "ops").await },
        );
    waiting(&db, "the second fire waiting", 3).await;
    release(&holder).await;
    assert!(firing.await.unwrap().unwrap().admitted);
    let out = admitting.await.unwrap();
    assert!(serialization_failure(&out), "{out:?}");
    let second = second_fire.await.unwrap();
    assert!(
        matches!(second, Err(ManageError::Overlap { .. })),
        "{second:?}"
    );
    // The fire found the trigger idle, so it marked the schedule row (V28): the claim taken
    // before it, which read the trigger idle, is refused and decided again at once, as the
    // engine does; the new claim's admission sees the fired run.
    let out = c.admit(&c.admission()).await;
    assert_eq!(
        out,
        AdmitOutcome::Refused {
            why: Refusal::RowMoved
        }
    );
    release_lease(&c).await;
    let (_, out) = scheduled(&db, "a").await;
    assert_eq!(out.unwrap(), AdmitOutcome::Overlap);
    assert_eq!(runs_of_t(&db).await.len(), 1, "one run of the three tries");
    assert_eq!(state(&db).await.0, Some(1));
    assert_eq!(
        state(&db).await.1,
        2,
        "the second fire and the admission recorded as skips"
    );
    db.assert_invariants().await;
}

/// The writes a policy needs that the role ending a run may not make go through the
/// owner's row triggers: a dispatcher (no INSERT on runs) finishing a run admits the kept
/// occurrence of buffer_one. No role may call the decision or the run end itself, and the
/// policy's table is read-only to every role.
#[tokio::test]
async fn a_dispatchers_finish_admits_the_kept_occurrence_through_the_owners_trigger() {
    let db = with_policy(OverlapPolicy::BufferOne).await;
    let (_, first) = scheduled(&db, "a").await;
    assert!(
        matches!(first, Ok(AdmitOutcome::Admitted { .. })),
        "{first:?}"
    );
    let (kept, _) = scheduled(&db, "a").await;
    let disp = db.client("qlsched_dispatcher").await;
    let taken = drive::take(&disp, 10).await;
    assert_eq!(drive::start_direct(&disp, &taken).await, 1);
    assert_eq!(drive::finish_direct(&disp, taken[0], "succeeded").await, 1);
    let r = runs_of_t(&db).await;
    assert_eq!((r.len(), r[1].1, r[1].2.as_str()), (2, kept, "queued"));
    let su = db.superuser().await;
    for role in [
        "qlsched_admin",
        "qlsched_runtime",
        "qlsched_dispatcher",
        "qlsched_worker_ingress",
    ] {
        let row = su
            .query_one(
                "SELECT has_function_privilege($1, 'qlsched.overlap_admit()', 'EXECUTE')
                            OR has_function_privilege($1, 'qlsched.overlap_counted()', 'EXECUTE'),
                        has_function_privilege($1, 'qlsched.overlap_run_ended()', 'EXECUTE'),
                        has_table_privilege($1, 'qlsched.trigger_overlap', 'INSERT, UPDATE, DELETE')",
                &[&role],
            )
            .await
            .unwrap();
        assert_eq!(
            (
                row.get::<_, bool>(0),
                row.get::<_, bool>(1),
                row.get::<_, bool>(2)
            ),
            (false, false, false),
            "{role}"
        );
    }
    let refused = disp
        .execute("UPDATE qlsched.trigger_overlap SET unfinished = 0", &[])
        .await;
    assert!(
        refused.is_err(),
        "a dispatcher cannot write the policy's row"
    );
    db.assert_invariants().await;
}

/// The command line: `trigger publish --overlap` (a changed policy is a new revision, the
/// same one again is not), `trigger show` and `trigger list` (text and `--json`), and `trigger
/// fire` refused under forbid (exit 4) unless `--overlap allow`.
#[tokio::test]
async fn the_command_line_publishes_shows_lists_and_fires_under_the_policy() {
    use crate::helpers::cli::{json, ok, ql, refused};
    let db = TestDb::new().await;
    drop(db.admin_with_project().await);
    let publish = |policy: &'static str| {
        let db = db.clone();
        async move {
            ok(ql(
                &db,
                &[
                    "trigger",
                    "publish",
                    "--id",
                    "t",
                    "--project",
                    "proj",
                    "--task",
                    "task",
                    "--cron",
                    "0 0 * * * *",
                    "--overlap",
                    policy,
                ],
            ))
        }
    };
    assert!(publish("allow").await.contains("revision 1"));
    assert!(publish("forbid").await.contains("revision 2"));
    assert!(publish("forbid").await.contains("revision 2 (unchanged)"));
    let shown = ok(ql(&db, &["trigger", "show", "t"]));
    assert!(
        shown.contains("overlap      forbid · 0 unfinished"),
        "{shown}"
    );
    assert!(ok(ql(&db, &["trigger", "fire", "t"])).contains("fired"));
    refused(
        ql(&db, &["trigger", "fire", "t"]),
        4,
        &["a run of the trigger is unfinished", "--overlap allow"],
    );
    assert!(ok(ql(&db, &["trigger", "fire", "t", "--overlap", "allow"])).contains("fired"));
    let listed = ok(ql(&db, &["trigger", "list"]));
    assert!(listed.contains("enabled · forbid · 1 skipped"), "{listed}");
    let v = json(ok(ql(&db, &["trigger", "show", "t", "--json"])));
    assert_eq!(v["overlap_policy"], "forbid", "{v}");
    assert_eq!(v["skipped_overlap"], 1, "{v}");
    assert_eq!(v["overlap_unfinished"], 2, "{v}");
    assert_eq!(
        v["last_skipped_ms"].as_array().map(Vec::len),
        Some(1),
        "{v}"
    );
    db.assert_invariants().await;
}

/// A batch of forbid triggers whose runs have all ended reads no overlap row at all (V28:
/// each run counted on the schedule row its admission writes anyway). A batch of busy ones
/// reads and writes each overlap row in turn (`overlap_decide_with`; V26, V27): every
/// tuple-level predicate lock it takes on `trigger_overlap` is dropped when it writes the
/// tuple, so it never holds the page or relation lock PostgreSQL substitutes for more than 2
/// tuple locks of a page (or a relation's share of `max_pred_locks_per_transaction`), which
/// would make every concurrent admission's write of a row on those pages a read-write
/// conflict (serialization failures at each boundary). The rows are reached by the TIDs the
/// claim read, so no leaf page of the primary key is locked either. A serializable
/// transaction open across the admission keeps the committed admission's predicate locks
/// visible in `pg_locks`.
#[tokio::test]
async fn a_forbid_batch_holds_no_page_or_relation_predicate_lock_on_the_overlap_rows() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    for i in 0..40 {
        let spec = TriggerSpec {
            overlap_policy: OverlapPolicy::Forbid,
            ..TriggerSpec::new(&format!("t{i:02}"), "proj", "task", "* * * * * *", "UTC")
        };
        manage::publish_trigger(&mut admin, &spec).await.unwrap();
    }
    let written = "SELECT count(*) FROM qlsched.trigger_overlap WHERE last_busy IS NOT NULL";
    let counted_once = "SELECT count(*) FROM qlsched.trigger_overlap o JOIN qlsched.trigger_schedules s USING (trigger_id)
                         WHERE o.unfinished + s.overlap_admitted - o.overlap_released = 1";

    // Idle: admitted, counted on the schedule rows, the overlap rows neither read nor written.
    let (out, locks) = admit_all_watching_overlap_locks(&db).await;
    assert!(
        out.iter()
            .all(|o| matches!(o, AdmitOutcome::Admitted { .. })),
        "{out:?}"
    );
    assert_eq!(locks, vec![], "the idle batch read overlap rows");
    assert_eq!(
        db.count(written).await,
        0,
        "the idle batch wrote overlap rows"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE overlap_admitted = 1")
            .await,
        40
    );
    assert_eq!(
        db.count(counted_once).await,
        40,
        "each admitted run counted once"
    );

    // Busy (every run still queued): decided on the overlap rows, each skip recorded.
    let (out, locks) = admit_all_watching_overlap_locks(&db).await;
    assert!(
        out.iter().all(|o| matches!(o, AdmitOutcome::Overlap)),
        "{out:?}"
    );
    assert!(
        locks.iter().all(|(_, kind, _)| kind == "tuple"),
        "page or relation predicate locks on the overlap rows: {locks:?}"
    );
    assert_eq!(
        db.count(written).await,
        40,
        "every busy member decided on its row"
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.trigger_overlap WHERE skipped_overlap = 1")
            .await,
        40
    );
    assert_eq!(db.count(counted_once).await, 40, "skips count no run");
    db.assert_invariants().await;
}

/// Claims every due row (made due now), admits them in one batch, and returns the outcomes
/// and the predicate locks the admission left on `trigger_overlap` and its primary key
/// (relation, lock type, count), seen from a serializable transaction open across it.
async fn admit_all_watching_overlap_locks(
    db: &TestDb,
) -> (Vec<AdmitOutcome>, Vec<(String, String, i64)>) {
    db.make_due(-100).await;
    let c = Claimed::up_to(db, "a", 30_000, 64).await;
    assert_eq!(c.rows.len(), 40);
    let watcher = db.superuser().await;
    watcher
        .batch_execute("BEGIN ISOLATION LEVEL SERIALIZABLE; SELECT 1")
        .await
        .unwrap();
    let conn = c.conn().await;
    let out = drive::admit_batch(&conn, &c.admissions()).await.unwrap();
    let locks = db
        .superuser()
        .await
        .query(
            // pg_locks is the cluster's: databases cloned from one template share relation
            // OIDs, so another test's database is left out by its own OID.
            "SELECT relation::regclass::text, locktype, count(*) FROM pg_locks
              WHERE mode = 'SIReadLock'
                AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND relation IN ('qlsched.trigger_overlap'::regclass,
                                 'qlsched.trigger_overlap_pkey'::regclass)
              GROUP BY 1, 2 ORDER BY 1, 2",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect();
    watcher.batch_execute("COMMIT").await.unwrap();
    (out, locks)
}
