//! A trigger's cursor never returns to an instant already admitted: a republish (or an
//! enable) racing an admission, or made while the database clock stands behind an admitted
//! instant (a promoted standby whose clock is behind), sets the first cursor strictly after
//! every instant admitted under any revision (docs/design.md, "Who moves the cursor").

use std::time::Duration;

use qlsched::actors::supervisor::Drain;
use qlsched::store::manage::{self, TriggerSpec};
use qlsched::store::triggers;

use crate::helpers::pg::{chown_for_server, libfaketime, Server};
use crate::helpers::{make_template, remove_at_exit, start_supervisor, wait_until, TestDb};

const EVERY_SECOND: &str = "* * * * * *";

fn every_second(grace_ms: i64) -> TriggerSpec {
    TriggerSpec {
        misfire_grace_ms: grace_ms,
        ..TriggerSpec::new("t", "proj", "task", EVERY_SECOND, "UTC")
    }
}

/// Instants of `t` admitted more than once (any revision), and the gaps between its first and
/// last admitted instant.
/// A database with `t` published (every second, grace 60 s), and the admin session that
/// published it.
async fn published() -> (TestDb, tokio_postgres::Client) {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    manage::publish_trigger(&mut admin, &every_second(60_000))
        .await
        .unwrap();
    (db, admin)
}

async fn duplicates_and_gaps(db: &TestDb) -> (Vec<(i64, i64)>, i64) {
    let su = db.superuser().await;
    let dups = crate::helpers::pairs(
        &su,
        "SELECT scheduled_for_ms, count(*) FROM qlsched.runs WHERE trigger_id = 't'
              GROUP BY 1 HAVING count(*) > 1 ORDER BY 1",
    )
    .await;
    let gaps: i64 = su
        .query_one(
            "SELECT coalesce((max(scheduled_for_ms) - min(scheduled_for_ms)) / 1000 + 1
                             - count(DISTINCT scheduled_for_ms), 0)
               FROM qlsched.runs WHERE trigger_id = 't'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    (dups, gaps)
}

/// The publish reads the clock, then (held up on the way to its writes) an admission of the
/// next instant under the old revision would commit, then the publish writes its cursor.
/// The publish is held by a `SHARE` lock on `qlsched.triggers` (its row upsert waits;
/// claims and admissions only read triggers). Before V14 the publish set the new revision's
/// cursor to the instant just admitted, and that instant was admitted twice.
#[actix_rt::test]
async fn a_republish_racing_an_admission_admits_the_instant_once() {
    let (db, _admin) = published().await;
    let (sup, _, _) = start_supervisor(qlsched::actors::Settings {
        cadence: Duration::from_millis(100),
        ..db.actor_settings("a")
    });
    let runs = "SELECT count(*) FROM qlsched.runs WHERE trigger_id = 't'";
    wait_until("two admitted runs", Duration::from_secs(15), || async {
        db.count(runs).await >= 2
    })
    .await;

    let blocker = db.superuser().await;
    blocker
        .batch_execute("BEGIN; LOCK TABLE qlsched.triggers IN SHARE MODE")
        .await
        .unwrap();
    let publisher_db = db.clone();
    let publish = tokio::spawn(async move {
        let mut admin = publisher_db.admin().await;
        manage::publish_trigger(&mut admin, &every_second(61_000)).await
    });
    // The publish has read the clock once it waits for the table lock.
    wait_until("the publish waiting", Duration::from_secs(10), || async {
        db.count(
            "SELECT count(*) FROM pg_stat_activity
              WHERE datname = current_database() AND wait_event_type = 'Lock'
                AND query LIKE '%INSERT INTO qlsched.triggers%'",
        )
        .await
            == 1
    })
    .await;
    let waiting_at = db.now_ms().await;
    // The next whole second after the publish's clock reading is at most this one; let
    // the replica have 1.5 s past it to admit it under the old revision (it could before V14).
    let next = (waiting_at / 1000 + 1) * 1000;
    wait_until(
        "the database clock 1.5 s past the next instant",
        Duration::from_secs(10),
        || async { db.now_ms().await > next + 1500 },
    )
    .await;
    blocker.batch_execute("COMMIT").await.unwrap();
    let published = publish.await.unwrap().unwrap();
    assert!(published.changed);
    // The new revision admits what is due, on to two seconds past the held instant.
    wait_until(
        "a run of the new revision 2 s past the held instant",
        Duration::from_secs(15),
        || async {
            db.count(&format!(
                "SELECT count(*) FROM qlsched.runs
                  WHERE trigger_id = 't' AND trigger_revision = 2 AND scheduled_for_ms >= {}",
                next + 2000
            ))
            .await
                >= 1
        },
    )
    .await;
    let _ = sup.send(Drain(Duration::from_secs(2))).await;

    let (dups, gaps) = duplicates_and_gaps(&db).await;
    assert_eq!(
        dups,
        vec![],
        "instants (scheduled_for_ms, runs) admitted twice across the republish (the held instant \
         was {next})"
    );
    assert_eq!(gaps, 0, "instants missing between the first and last run");
}

/// A server whose clock reads what `offset` says (libfaketime, re-read on every call), a
/// migrated template on it, and the file the offset is written to.
struct SteppedClockServer {
    server: Server,
    offset: std::path::PathBuf,
}

impl SteppedClockServer {
    fn start() -> SteppedClockServer {
        let lib = libfaketime();
        let root = std::env::temp_dir().join(format!(
            "qlsched-it-{}-stepped-clock-{}",
            std::process::id(),
            crate::helpers::NEXT_DB.fetch_add(1, std::sync::atomic::Ordering::SeqCst)
        ));
        let _ = std::fs::remove_dir_all(&root);
        let mut server = Server::init(&root, "fsync = off\nsynchronous_commit = off\n");
        remove_at_exit(root.clone());
        let offset = root.join("faketime");
        std::fs::write(&offset, "+0\n").unwrap();
        chown_for_server(&offset);
        server.env = vec![
            ("LD_PRELOAD".into(), lib.to_string_lossy().into_owned()),
            (
                "FAKETIME_TIMESTAMP_FILE".into(),
                offset.to_string_lossy().into_owned(),
            ),
            ("FAKETIME_NO_CACHE".into(), "1".into()),
            ("FAKETIME_DONT_FAKE_MONOTONIC".into(), "1".into()),
        ];
        server.start();
        SteppedClockServer { server, offset }
    }

    /// Steps the server's clock to `secs` from real time.
    fn set_offset(&self, secs: i64) {
        std::fs::write(&self.offset, format!("{secs:+}\n")).unwrap();
    }
}

/// Admits a few instants, then steps the server's clock back by a minute (as a promoted
/// standby whose clock is behind would read) and republishes and re-enables: the cursor
/// goes past every admitted instant, not back to the clock's. Before V14 it went back to the
/// stepped clock's next second, and every instant of that minute would have been admitted
/// again under the new revision.
#[actix_rt::test]
async fn a_clock_stepped_back_moves_no_cursor_before_an_admitted_instant() {
    let clock = SteppedClockServer::start();
    make_template(clock.server.port).await;
    let (db, _su) = TestDb::from_template(clock.server.port, "c").await;
    let mut admin = db.admin_with_project().await;
    manage::publish_trigger(&mut admin, &every_second(60_000))
        .await
        .unwrap();
    let (sup, _, _) = start_supervisor(qlsched::actors::Settings {
        cadence: Duration::from_millis(100),
        ..db.actor_settings("a")
    });
    wait_until("three admitted runs", Duration::from_secs(15), || async {
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 't'")
            .await
            >= 3
    })
    .await;
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    let admitted = db
        .count("SELECT max(scheduled_for_ms) FROM qlsched.runs WHERE trigger_id = 't'")
        .await;

    let before = db.now_ms().await;
    clock.set_offset(-60);
    let after = db.now_ms().await;
    assert!(
        after < before - 50_000,
        "the server's clock did not step back (read {before}, then {after})"
    );
    let cursor = "SELECT next_fire_at_ms FROM qlsched.trigger_schedules WHERE trigger_id = 't'";

    // A republish with the clock behind.
    let published = manage::publish_trigger(&mut admin, &every_second(61_000))
        .await
        .unwrap();
    assert!(published.changed);
    let first = db.count(cursor).await;
    assert!(
        first > admitted,
        "the republish set the cursor to {first}, at or before the admitted instant {admitted} \
         (the database clock read {after})"
    );

    // An enable with the clock behind.
    triggers::disable(&mut admin, "t", Some("drill"), "test")
        .await
        .unwrap();
    triggers::enable(&mut admin, "t", "test").await.unwrap();
    let enabled = db.count(cursor).await;
    assert!(
        enabled > admitted,
        "the enable set the cursor to {enabled}, at or before the admitted instant {admitted}"
    );
}

/// A republish of a running trigger whose cursor is due but not admitted yet (no replica
/// got to it, or a claim of it is in flight and the publish fences it out) keeps that
/// occurrence: the new revision starts at it, not after the publish's clock reading. Found
/// by the republish drill (9 occurrences lost in 67 republishes before).
#[actix_rt::test]
async fn a_republish_keeps_an_occurrence_that_is_due_and_not_admitted() {
    let (db, mut admin) = published().await;
    let cursor = "SELECT next_fire_at_ms FROM qlsched.trigger_schedules WHERE trigger_id = 't'";
    let due = db.count(cursor).await;
    wait_until(
        "the cursor 1.5 s overdue",
        Duration::from_secs(5),
        || async { db.now_ms().await > due + 1500 },
    )
    .await;
    assert!(
        manage::publish_trigger(&mut admin, &every_second(61_000))
            .await
            .unwrap()
            .changed
    );
    assert_eq!(
        db.count(cursor).await,
        due,
        "the republish moved the cursor past the owed occurrence {due}"
    );
    let (sup, _, _) = start_supervisor(db.actor_settings("a"));
    wait_until(
        "the owed occurrence and the next two admitted",
        Duration::from_secs(15),
        || async {
            db.count(&format!(
                "SELECT count(DISTINCT scheduled_for_ms) FROM qlsched.runs
                  WHERE trigger_id = 't' AND scheduled_for_ms BETWEEN {due} AND {}",
                due + 2000
            ))
            .await
                == 3
        },
    )
    .await;
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    let (dups, gaps) = duplicates_and_gaps(&db).await;
    assert_eq!((dups, gaps), (vec![], 0));
}

/// The query docs/operations.md gives for instants a database admitted twice before V14
/// lists exactly such an instant, with both runs in admission order.
#[actix_rt::test]
async fn the_documented_query_lists_an_instant_admitted_under_two_revisions() {
    let docs = include_str!("../../docs/operations.md");
    let after = docs
        .split("<!-- duplicate-occurrences-query -->\n```sql\n")
        .nth(1)
        .expect("docs/operations.md has the duplicate-occurrences query");
    let query = &after[..after.find("```").unwrap()];

    let (db, _admin) = published().await;
    let (sup, _, _) = start_supervisor(db.actor_settings("a"));
    wait_until("two admitted runs", Duration::from_secs(15), || async {
        db.count("SELECT count(*) FROM qlsched.runs WHERE trigger_id = 't'")
            .await
            >= 2
    })
    .await;
    let _ = sup.send(Drain(Duration::from_secs(2))).await;
    let su = db.superuser().await;
    assert!(su.query(query, &[]).await.unwrap().is_empty());
    // The same instant again under revision 2, as a pre-V14 republish could admit it.
    let twin = uuid::Uuid::new_v4();
    let instant: i64 = su
        .query_one(
            "INSERT INTO qlsched.runs (run_id, project_id, trigger_id, trigger_revision, task_id,
                                       task_revision, execution_revision_id, idempotency_key,
                                       status, scheduled_for_ms, queued_at_ms, admitted_by)
             SELECT $1, project_id, trigger_id, 2, task_id, task_revision, execution_revision_id,
                    'ql3:cron:v1:t:2:' || scheduled_for_ms, 'queued', scheduled_for_ms,
                    queued_at_ms + 1, admitted_by
               FROM qlsched.runs WHERE trigger_id = 't' ORDER BY scheduled_for_ms LIMIT 1
             RETURNING scheduled_for_ms",
            &[&twin],
        )
        .await
        .unwrap()
        .get(0);
    let rows = su.query(query, &[]).await.unwrap();
    assert_eq!(rows.len(), 1, "one instant listed");
    let r = &rows[0];
    assert_eq!(r.get::<_, &str>("trigger_id"), "t");
    assert_eq!(r.get::<_, i64>("runs"), 2);
    assert_eq!(r.get::<_, Vec<i64>>("revisions"), vec![1, 2]);
    assert_eq!(r.get::<_, Vec<uuid::Uuid>>("run_ids")[1], twin);
    let listed = r
        .get::<_, chrono::DateTime<chrono::Utc>>("scheduled_for")
        .timestamp_millis();
    assert_eq!(listed, instant);
}
