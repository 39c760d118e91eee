//! The admission engine's own contract (issue 19, B7–B9, B12, B13, C14, C15): a refused
//! retry is followed up by its cause, releases end at the lease deadline, nothing sent is no
//! unknown outcome, an abandoned statement cannot commit later, a release of an inactive
//! project's row takes it out of the claim index, lag is split by kind, and every count is
//! taken when its write committed, under one cause.

use std::time::{Duration, Instant};

use actix::prelude::*;
use qlsched::actors::admit::AdmitActor;
use qlsched::actors::claim::{ClaimActor, ClaimArgs, ClaimFinished, Report};
use qlsched::db::session::{bounded, Connector, Session};
use qlsched::db::StoreError;
use qlsched::engine::{Action, AdmitError, Engine, Job, Kind, Outcome};
use qlsched::metrics::Metrics;
use qlsched::store::admission::Refusal;
use qlsched::store::claim;
use qlsched::store::claim::ClaimedRow;

use crate::helpers::claimed::{admission, Claimed};
use crate::helpers::drive::{self, job};
use crate::helpers::proxy::{Fault, Proxy};
use crate::helpers::{discard_log, wait_until, TestDb};

/// An engine on `connector` with the replica's bounds: admission bound `admit_timeout`,
/// 3 serialization retries, a 60 s reject back-off.
fn engine(connector: Connector, admit_timeout: Duration) -> Engine {
    drive::engine(Session::bounded(connector, admit_timeout), admit_timeout)
}

fn admit_job(claim: &ClaimedRow, kind: Kind, deadline: Instant) -> Job {
    job(
        claim,
        Action::Admit(admission(claim).occurrence()),
        kind,
        deadline,
    )
}

/// A connector to a port where nothing listens (the connect is refused).
async fn refusing() -> Connector {
    to_port(crate::helpers::pg::free_port())
}

/// A connector to a port that accepts TCP and never answers (the connect hangs), and the
/// listener that keeps it so.
async fn silent() -> (Connector, tokio::net::TcpListener) {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (to_port(port), l)
}

fn to_port(port: u16) -> Connector {
    let mut pg = tokio_postgres::Config::new();
    pg.host("127.0.0.1")
        .port(port)
        .user("qlsched_runtime")
        .dbname("nowhere");
    Connector {
        pg: pg.into(),
        connect_timeout: Duration::from_secs(5),
    }
}

/// The value of the sample `name` (with its labels as rendered) in the exposition.
fn sample(metrics: &Metrics, name: &str) -> Option<f64> {
    metrics.render().lines().find_map(|l| {
        let (n, v) = l.rsplit_once(' ')?;
        (n == name).then(|| v.parse().unwrap())
    })
}

async fn claim_owned(db: &TestDb) -> i64 {
    db.count("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL")
        .await
}

/// B7. An admission whose first outcome was unknown is retried; a retry refused because the
/// definition moved on in between (our first attempt did not commit) is that refusal: the
/// row is released at once to be decided again, and no fence loss is counted.
#[tokio::test]
async fn a_refused_retry_after_an_unknown_outcome_is_followed_up_by_its_cause() {
    let db = TestDb::new().await;
    db.seed(1, "* * * * * *").await;
    db.make_due(-100).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let proxy = Proxy::start(db.port).await;
    // Through the proxy (a config built for its port: `Config::port` would add a second).
    let pg = crate::helpers::pg_config(proxy.port, "qlsched_runtime", &db.name);
    let mut engine = engine(
        Connector {
            pg: pg.into(),
            connect_timeout: Duration::from_secs(5),
        },
        Duration::from_secs(1),
    );
    proxy.arm(Fault::Partition, 1, 1);
    let metrics = engine.metrics.clone();
    let deadline = Instant::now() + Duration::from_secs(20);
    let run = tokio::spawn(async move {
        let out = engine
            .process(vec![admit_job(c.row(), Kind::Fire, deadline)])
            .await;
        (engine, out)
    });
    // The first attempt is held by the partition (its outcome unknown); while it is, the
    // trigger's definition changes, then the partition heals.
    wait_until(
        "the admission is partitioned",
        Duration::from_secs(10),
        || async {
            assert!(!run.is_finished(), "the batch ended before the partition");
            proxy.partitioned()
        },
    )
    .await;
    db.superuser()
        .await
        .batch_execute("UPDATE qlsched.triggers SET content_digest = repeat('c', 64)")
        .await
        .unwrap();
    // The client gave the first attempt up (its outcome unknown) before the heal.
    wait_until(
        "the outcome is unknown",
        Duration::from_secs(10),
        || async { metrics.unknown_outcomes.get() == 1 },
    )
    .await;
    proxy.heal();
    let (engine, mut out) = tokio::time::timeout(Duration::from_secs(25), run)
        .await
        .expect("the batch ends")
        .unwrap();
    let out = out.remove(0).expect("a definite outcome");
    assert_eq!(out, Outcome::Refused(Refusal::DefinitionChanged));
    assert_eq!(claim_owned(&db).await, 0, "the claim was released");
    assert_eq!(
        db.count(concat!(
            "SELECT count(*) FROM qlsched.trigger_schedules WHERE claimable_at_ms <= ",
            qlsched::db_now_ms!()
        ))
        .await,
        1,
        "released at once, to be decided again"
    );
    assert_eq!(engine.metrics.unknown_outcomes.get(), 1);
    assert_eq!(engine.metrics.fence_losses.get(), 0, "no fence was lost");
    assert_eq!(engine.metrics.redecides.get(), 1);
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 0);
}

/// B9. A database that refuses connections, or accepts TCP and never answers, before
/// anything was sent: no unknown outcome, no resolving; the batch ends at once with a store
/// error that says nothing reached the server.
#[tokio::test]
async fn nothing_sent_is_not_an_unknown_outcome() {
    let db = TestDb::with_due(3).await;
    let claims = Claimed::up_to(&db, "a", 30_000, 3).await;
    let (silent, _keep) = silent().await;
    for (what, connector) in [("refused", refusing().await), ("silent", silent)] {
        let mut engine = engine(connector, Duration::from_secs(1));
        let deadline = Instant::now() + Duration::from_secs(4);
        let jobs = claims
            .rows
            .iter()
            .map(|c| admit_job(c, Kind::Fire, deadline))
            .collect();
        let started = Instant::now();
        let results = engine.process(jobs).await;
        let took = started.elapsed();
        assert_eq!(
            engine.metrics.unknown_outcomes.get(),
            0,
            "{what}: counted as an unknown outcome"
        );
        assert!(
            took < Duration::from_millis(2_500),
            "{what}: took {took:?} (resolving until the 4 s deadline?)"
        );
        for r in &results {
            match r {
                Err(AdmitError::Store(e)) => {
                    assert!(!e.reached_server(), "{what}: {e}");
                    assert!(e.is_connection_lost(), "{what}: an outage, not a row error");
                }
                other => panic!("{what}: {other:?}"),
            }
        }
    }
    // A refused connect is typed as not sent, whichever way the session reports it.
    let mut s = Session::new(refusing().await);
    let e = s.client().await.map(|_| ()).unwrap_err();
    assert!(matches!(e, StoreError::NotSent(_)), "{e:?}");
}

/// B8. Releases of a batch are one statement bounded by the earliest lease deadline: ten
/// releases against a database that never answers end at the deadline (1 s), not after ten
/// admission bounds (10 × 2 s).
#[tokio::test]
async fn a_batch_of_releases_ends_at_the_earliest_lease_deadline() {
    let db = TestDb::with_due(10).await;
    let claims = Claimed::up_to(&db, "a", 30_000, 10).await;
    let (silent, _keep) = silent().await;
    let mut engine = engine(silent, Duration::from_secs(2));
    let deadline = Instant::now() + Duration::from_secs(1);
    let jobs: Vec<Job> = claims
        .rows
        .iter()
        .map(|c| {
            let release = Action::Release {
                backoff: Duration::ZERO,
            };
            job(c, release, Kind::NotDue, deadline)
        })
        .collect();
    let started = Instant::now();
    let results = tokio::time::timeout(Duration::from_secs(6), engine.process(jobs))
        .await
        .expect("ten releases ended within 6 s");
    let took = started.elapsed();
    assert!(took < Duration::from_millis(1_800), "took {took:?}");
    assert!(results.iter().all(|r| r.is_err()), "{results:?}");

    // Against the database, the same ten are released in one statement, each counted once.
    let mut engine = engine_for(&db);
    let deadline = Instant::now() + Duration::from_secs(20);
    let jobs = claims
        .rows
        .iter()
        .map(|c| {
            let release = Action::Release {
                backoff: Duration::from_secs(60),
            };
            job(c, release, Kind::Reject(bad_policy()), deadline)
        })
        .collect();
    let results = engine.process(jobs).await;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(Outcome::Released { .. }))),
        "{results:?}"
    );
    assert_eq!(claim_owned(&db).await, 0);
    assert_eq!(engine.metrics.rejects.get(), 10);
}

fn bad_policy() -> qlsched::schedule::RejectReason {
    "sometimes"
        .parse::<qlsched::schedule::MisfirePolicy>()
        .unwrap_err()
        .into()
}

fn engine_for(db: &TestDb) -> Engine {
    engine(db.connector(), Duration::from_secs(2))
}

/// B13. An admission refused because the project is no longer active releases the row out
/// of the claim index (`claimable_at_ms` NULL), as `project set` leaves such rows.
#[tokio::test]
async fn a_row_of_an_inactive_project_is_released_out_of_the_claim_index() {
    let db = TestDb::with_due(1).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    db.superuser()
        .await
        .batch_execute("UPDATE qlsched.projects SET status = 'suspended'")
        .await
        .unwrap();
    let mut engine = engine_for(&db);
    let deadline = Instant::now() + Duration::from_secs(20);
    let out = engine
        .process(vec![admit_job(c.row(), Kind::Fire, deadline)])
        .await
        .remove(0)
        .unwrap();
    assert_eq!(out, Outcome::Refused(Refusal::ProjectInactive));
    assert_eq!(claim_owned(&db).await, 0, "released");
    assert_eq!(
        db.count(
            "SELECT count(*) FROM qlsched.trigger_schedules WHERE claimable_at_ms IS NOT NULL"
        )
        .await,
        0,
        "out of the claim index while the project is suspended"
    );
}

/// C14. A `fire_once` misfire's lag is observed apart from the on-time lag, so that the
/// on-time quantiles (and the alerts on them) do not move after an outage.
#[tokio::test]
async fn a_misfired_admission_is_not_in_the_on_time_lag() {
    let db = TestDb::with_due(2).await;
    let claims = Claimed::up_to(&db, "a", 30_000, 2).await;
    let mut engine = engine_for(&db);
    let deadline = Instant::now() + Duration::from_secs(20);
    let jobs = vec![
        admit_job(&claims.rows[0], Kind::Fire, deadline),
        admit_job(&claims.rows[1], Kind::FireOnce, deadline),
    ];
    let results = engine.process(jobs).await;
    assert!(
        results
            .iter()
            .all(|r| matches!(r, Ok(Outcome::Admitted { .. }))),
        "{results:?}"
    );
    let m = &engine.metrics;
    assert_eq!(
        sample(m, "qlsched_lag_seconds_count{kind=\"cron\"}"),
        Some(1.0),
        "{}",
        m.render()
    );
    assert_eq!(
        sample(m, "qlsched_misfire_lag_seconds_count{kind=\"cron\"}"),
        Some(1.0),
        "{}",
        m.render()
    );
}

/// B12. A claim statement the client abandoned at its bound is cancelled by the server at
/// the same bound: it cannot lease rows later (after a stop's final release).
#[tokio::test]
async fn an_abandoned_claim_statement_cannot_commit_later() {
    let db = TestDb::with_due(3).await;
    let s = db.actor_settings("a");
    let bound = Duration::from_secs(1);
    // The session the supervisor's claim round uses, with the round's bound.
    let mut session = Session::bounded(db.connector(), bound);
    // Prepared before the lock, as in a running replica: the execution is what waits.
    let (variant, _) = claim::claim_variant(16);
    session.prepared(variant).await.unwrap();
    let mut locker = db.superuser().await;
    let tx = locker.transaction().await.unwrap();
    tx.batch_execute("LOCK TABLE qlsched.trigger_schedules IN EXCLUSIVE MODE")
        .await
        .unwrap();
    let res = bounded("the claim statement", bound, async {
        let (c, stmt) = session.prepared(variant).await?;
        claim::claim_round(
            c,
            &stmt,
            &s.owner,
            30_000,
            uuid::Uuid::new_v4(),
            claim::Extras::default(),
        )
        .await
    })
    .await;
    // Whichever comes first: the client's bound, or the server cancelling at the same bound
    // (57014 query_canceled).
    match &res {
        Err(StoreError::Timeout { .. }) => {}
        Err(e) if e.code() == Some(&tokio_postgres::error::SqlState::QUERY_CANCELED) => {}
        other => panic!("{other:?}"),
    }
    wait_until(
        "the server ends the abandoned claim statement",
        Duration::from_secs(5),
        || async {
            db.count(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()
                   AND usename = 'qlsched_runtime' AND state = 'active'
                   AND query LIKE '%claim_expires_at_ms%'",
            )
            .await
                == 0
        },
    )
    .await;
    tx.commit().await.unwrap();
    assert_eq!(
        claim_owned(&db).await,
        0,
        "nothing leased after the lock went"
    );
}

/// Collects what claim actors report.
struct Reports(tokio::sync::mpsc::UnboundedSender<ClaimFinished>);

impl Actor for Reports {
    type Context = Context<Self>;
}

impl Handler<ClaimFinished> for Reports {
    type Result = ();
    fn handle(&mut self, msg: ClaimFinished, _: &mut Self::Context) {
        let _ = self.0.send(msg);
    }
}

/// Runs one claim actor over `claim` through an admit actor on `connector`, as the
/// supervisor does; returns its report.
async fn run_claim(
    db: &TestDb,
    connector: Connector,
    claim: ClaimedRow,
    metrics: &Metrics,
) -> Report {
    let settings = qlsched::actors::Settings {
        connector,
        admit_timeout: Duration::from_secs(1),
        ..db.actor_settings("a")
    };
    let admit = AdmitActor::new(&settings, metrics.clone(), &discard_log()).start();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let reports = Reports(tx).start();
    let args = ClaimArgs {
        child: 1,
        claim,
        claimed_at: Instant::now(),
        lease: Duration::from_secs(20),
        reject_backoff: settings.reject_backoff,
        error_backoff: Duration::from_secs(1),
    };
    ClaimActor::new(args, admit, reports.recipient(), &discard_log()).start();
    tokio::time::timeout(Duration::from_secs(30), rx.recv())
        .await
        .expect("the claim actor reports")
        .expect("a report")
        .report
}

/// C15. Skips and initialisations are counted when the cursor move committed, not when
/// decided: against an unreachable database nothing is counted; against the database each
/// once. A reject whose release found the fence lost is counted as a fence loss only.
#[actix_rt::test]
async fn decisions_are_counted_when_committed_under_one_cause() {
    // A misfired skip (two minutes late, policy skip) and an initialisation (a row with no
    // cursor, as written before V8: publishing sets the first cursor since).
    let db = TestDb::new().await;
    db.seed(2, "* * * * * *").await;
    db.superuser()
        .await
        .batch_execute(concat!(
            "UPDATE qlsched.trigger_schedules SET next_fire_at_ms = ",
            qlsched::db_now_ms!(),
            " - 120000, claimable_at_ms = 0, state_version = state_version + 1
              WHERE trigger_id = 'trg-00000';
             UPDATE qlsched.trigger_schedules SET next_fire_at_ms = NULL, claimable_at_ms = 0,
                    state_version = state_version + 1
              WHERE trigger_id = 'trg-00001'"
        ))
        .await
        .unwrap();
    let c = Claimed::up_to(&db, "a", 30_000, 2).await;
    assert_eq!(c.rows.len(), 2);
    for row in &c.rows {
        let m = Metrics::default();
        let r = run_claim(&db, refusing().await, row.clone(), &m).await;
        assert!(matches!(r, Report::Failed(_)), "{r:?}");
        assert_eq!(
            (m.skips.get(), m.initialisations.get()),
            (0, 0),
            "{}: counted though nothing committed",
            row.trigger_id
        );
    }
    let m = Metrics::default();
    for row in &c.rows {
        let r = run_claim(&db, db.connector(), row.clone(), &m).await;
        assert!(matches!(r, Report::Done(Outcome::Advanced)), "{r:?}");
    }
    assert_eq!((m.skips.get(), m.initialisations.get()), (1, 1));

    // A reject (an expression that does not parse) whose fence was lost before the release.
    let db = TestDb::with_due(1).await;
    db.superuser()
        .await
        .batch_execute("UPDATE qlsched.triggers SET cron_expr = 'not cron'")
        .await
        .unwrap();
    let c = Claimed::new(&db, "a", 30_000).await;
    db.superuser()
        .await
        .batch_execute("UPDATE qlsched.trigger_schedules SET claim_token = gen_random_uuid()")
        .await
        .unwrap();
    let m = Metrics::default();
    let r = run_claim(&db, db.connector(), c.row().clone(), &m).await;
    assert!(
        matches!(r, Report::Done(Outcome::Refused(Refusal::FenceLost))),
        "{r:?}"
    );
    assert_eq!(
        (m.rejects.get(), m.fence_losses.get()),
        (0, 1),
        "counted once, as a fence loss"
    );
}

/// E20. The misfire policy is parsed where the claimed row is read; a stored spelling this
/// replica does not know (e.g. written by a newer version during a rolling upgrade) fails
/// closed: the row is released with the reject back-off and counted as a reject, nothing
/// admitted, no panic.
#[actix_rt::test]
async fn an_unknown_stored_misfire_policy_is_rejected_with_back_off() {
    let db = TestDb::with_due(1).await;
    db.superuser()
        .await
        .batch_execute(
            "ALTER TABLE qlsched.triggers DROP CONSTRAINT triggers_misfire_policy_check;
             UPDATE qlsched.triggers SET misfire_policy = 'fire_all'",
        )
        .await
        .unwrap();
    let c = Claimed::new(&db, "a", 30_000).await;
    assert!(c.row().def.misfire_policy.is_err(), "{:?}", c.row().def);
    let m = Metrics::default();
    let r = run_claim(&db, db.connector(), c.row().clone(), &m).await;
    assert!(
        matches!(r, Report::Done(Outcome::Released { backoff }) if backoff == Duration::from_secs(60)),
        "{r:?}"
    );
    assert_eq!(m.rejects.get(), 1);
    assert_eq!(claim_owned(&db).await, 0);
    assert_eq!(db.count("SELECT count(*) FROM qlsched.runs").await, 0);
    let wait = db
        .count(concat!(
            "SELECT claimable_at_ms - ",
            qlsched::db_now_ms!(),
            " FROM qlsched.trigger_schedules"
        ))
        .await;
    assert!(
        (55_000..=60_000).contains(&wait),
        "claimable again in {wait} ms"
    );
}

/// B7, the split path. Two admissions whose first attempt's outcome was unknown (the backend
/// died under it) are retried; the retry fails on a statement error of one member, so the
/// batch is split and each member is tried alone. A member whose earlier COMMIT may have
/// landed must keep its `uncertain` flag on the split path: its refusal alone is resolved by
/// reading, and our run found under its key and run id is our admission, not a refusal.
///
/// Staged in the database, deterministically: a row trigger on the schedule fires for the
/// first row an admission updates and acts through `dblink` (autonomous, so its writes survive
/// the rollbacks): 1st time it terminates its own backend (outcome unknown); 2nd time it
/// changes both triggers' definitions (their digests) and commits member A's run as A's
/// earlier COMMIT would have (same key, same run id), then raises (the statement error that
/// splits the batch). Alone, both members are refused (their triggers moved on): A's refusal
/// is resolved to our run, B's stands and B is released.
#[tokio::test]
async fn a_member_retried_alone_keeps_its_uncertain_flag() {
    let db = TestDb::with_due(2).await;
    let claims = Claimed::up_to(&db, "a", 30_000, 2).await;
    assert_eq!(claims.rows.len(), 2);
    let (a, b) = (&claims.rows[0], &claims.rows[1]);
    let a_adm = admission(a);
    let dsn = format!(
        "host=127.0.0.1 port={} dbname={} user=postgres",
        db.port, db.name
    );
    let su = db.superuser().await;
    su.batch_execute(&format!(
        "CREATE EXTENSION IF NOT EXISTS dblink;
         CREATE TABLE qlsched.test_phase (n int); INSERT INTO qlsched.test_phase VALUES (0);
         CREATE TABLE qlsched.test_late AS
           SELECT '{run}'::uuid AS run_id, '{key}'::text AS ikey, {sf}::bigint AS sf;
         CREATE FUNCTION qlsched.test_stage() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER AS $f$
         DECLARE n int;
         BEGIN
           SELECT t.n INTO n FROM dblink('{dsn}',
             'UPDATE qlsched.test_phase SET n = n + 1 RETURNING n') AS t(n int);
           IF n = 1 THEN
             PERFORM pg_terminate_backend(pg_backend_pid());
             PERFORM pg_sleep(5);
           ELSIF n = 2 THEN
             PERFORM dblink_exec('{dsn}',
               'UPDATE qlsched.triggers SET content_digest = repeat(''c'', 64)');
             PERFORM dblink_exec('{dsn}',
               'INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                     task_revision, execution_revision_id, idempotency_key, status, scheduled_for_ms,
                     queued_at_ms, admitted_by)
                SELECT l.run_id, t.project_id, t.trigger_id, t.revision, t.task_id, 1,
                       k.execution_revision_id, l.ikey, ''queued'', l.sf, l.sf, ''a''
                  FROM qlsched.test_late l, qlsched.triggers t, qlsched.tasks k
                 WHERE t.trigger_id = ''{a_id}'' AND k.task_id = t.task_id');
             RAISE EXCEPTION 'staged statement error';
           END IF;
           RETURN NEW;
         END $f$;
         CREATE TRIGGER test_stage BEFORE UPDATE ON qlsched.trigger_schedules
           FOR EACH ROW EXECUTE FUNCTION qlsched.test_stage();",
        run = a_adm.run_id,
        key = a_adm.key(),
        sf = a_adm.scheduled_for_ms,
        a_id = a.trigger_id,
    ))
    .await
    .unwrap();
    let mut engine = engine_for(&db);
    let deadline = Instant::now() + Duration::from_secs(20);
    let jobs = vec![
        job(a, Action::Admit(a_adm.occurrence()), Kind::Fire, deadline),
        admit_job(b, Kind::Fire, deadline),
    ];
    let out = engine.process(jobs).await;
    assert_eq!(engine.metrics.unknown_outcomes.get(), 1);
    assert!(
        matches!(out[0], Ok(Outcome::Admitted { .. })),
        "A, whose run is ours: {:?}",
        out[0]
    );
    assert_eq!(
        out[1].as_ref().unwrap(),
        &Outcome::Refused(Refusal::DefinitionChanged),
        "B"
    );
    assert_eq!(engine.metrics.admits.get(), 1);
    assert_eq!(
        db.count("SELECT n::bigint FROM qlsched.test_phase").await,
        3,
        "staged: unknown outcome, statement error, B's release (alone, A and B match no row)"
    );
}
