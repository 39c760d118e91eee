//! Jitter and validity windows of cron triggers (docs/policies-jitter.md; issue 35 items 5
//! and 6), against real PostgreSQL: the offset the database computes is the binary's, the
//! claim index holds a jittered row at its jittered instant, the admission keeps the nominal
//! instant and records the jittered one, the misfire grace counts from the jittered instant,
//! the gap check refuses naming the gap, and nothing is admitted outside the window.

use std::time::Duration;

use qlsched::actors::claim::{plan, Kind};
use qlsched::engine::Action;
use qlsched::schedule::jitter_offset_ms;
use qlsched::store::admission::AdmitOutcome;
use qlsched::store::manage::{self, ManageError, TriggerSpec};
use qlsched::store::{release, triggers};

use crate::helpers::claimed::Claimed;
use crate::helpers::{db_now_ms, wait_until, TestDb};

const ID: &str = "jittered";

/// An every-minute trigger with a 50 s jitter (and the grace given).
fn minutely(jitter_ms: i64, grace_ms: i64) -> TriggerSpec {
    TriggerSpec {
        jitter_ms,
        misfire_grace_ms: grace_ms,
        ..TriggerSpec::new(ID, "proj", "task", "0 * * * * *", "UTC")
    }
}

/// (next_fire_at_ms, claimable_at_ms) of the schedule row of `id`.
async fn cursor(db: &TestDb, id: &str) -> (Option<i64>, Option<i64>) {
    let r = db
        .superuser()
        .await
        .query_one(
            "SELECT next_fire_at_ms, claimable_at_ms FROM qlsched.trigger_schedules WHERE trigger_id = $1",
            &[&id],
        )
        .await
        .unwrap();
    (r.get(0), r.get(1))
}

/// A nominal instant of `id` at or before `now` whose jittered instant (under `jitter_ms`)
/// lies in `[now + from_ms, now + to_ms]` and whose offset exceeds `min_offset_ms`.
fn nominal_due_within(
    now: i64,
    jitter_ms: i64,
    from_ms: i64,
    to_ms: i64,
    min_offset_ms: i64,
) -> i64 {
    (now - jitter_ms..=now)
        .rev()
        .find(|n| {
            let o = jitter_offset_ms(ID, *n, jitter_ms);
            o > min_offset_ms && (now + from_ms..=now + to_ms).contains(&(n + o))
        })
        .expect("some instant of the jitter window has such an offset")
}

/// Puts the schedule row of `id` at cursor `nominal`, claimable at `claimable`.
async fn set_cursor(db: &TestDb, nominal: i64, claimable: i64) {
    db.superuser()
        .await
        .execute(
            "UPDATE qlsched.trigger_schedules
                SET next_fire_at_ms = $2, claimable_at_ms = $3, state_version = state_version + 1
              WHERE trigger_id = $1",
            &[&ID, &nominal, &claimable],
        )
        .await
        .unwrap();
}

/// The SQL the releases and `project set` use computes the offsets `schedule::jitter_offset_ms`
/// computes (and the pinned ones of the unit test), for many ids, instants and jitters.
#[tokio::test]
async fn the_database_computes_the_same_offsets() {
    let db = TestDb::new().await;
    let su = db.superuser().await;
    let stmt = su
        .prepare(concat!(
            "SELECT ",
            qlsched::jitter_offset_sql!("$1::text", "$2::bigint", "$3::bigint")
        ))
        .await
        .unwrap();
    let mut cases = vec![
        (
            "nightly".to_string(),
            1_767_225_600_000i64,
            10_000i64,
            8_405i64,
        ),
        ("nightly".into(), 1_767_225_660_000, 10_000, 5_040),
        ("herd-00042".into(), 1_767_225_600_000, 10_000, 7_753),
        (
            "ünïcode-trigger".into(),
            1_767_225_600_000,
            3_600_000,
            173_650,
        ),
        ("nightly".into(), 1_767_225_600_000, 0, 0),
    ];
    for i in 0..300i64 {
        let (id, n, j) = (
            format!("t-{i}"),
            1_767_225_600_000 + i * 60_000,
            1 + i * 997,
        );
        cases.push((id.clone(), n, j, jitter_offset_ms(&id, n, j)));
    }
    for (id, nominal, jitter, want) in cases {
        assert_eq!(
            jitter_offset_ms(&id, nominal, jitter),
            want,
            "{id} {nominal} {jitter}"
        );
        let got: i64 = su
            .query_one(&stmt, &[&id, &nominal, &jitter])
            .await
            .unwrap()
            .get(0);
        assert_eq!(got, want, "SQL offset of {id} {nominal} {jitter}");
    }
}

/// A publish puts the first cursor (nominal) in the claim index at its jittered instant;
/// without a jitter at the cursor itself, and its runs record no due instant.
#[tokio::test]
async fn a_publish_puts_the_first_cursor_at_its_jittered_instant() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    manage::publish_trigger(&mut admin, &minutely(50_000, 60_000))
        .await
        .unwrap();
    let (next, claimable) = cursor(&db, ID).await;
    let next = next.unwrap();
    assert_eq!(next % 60_000, 0, "the cursor stays the nominal instant");
    assert_eq!(claimable, Some(next + jitter_offset_ms(ID, next, 50_000)));
    // Jitter off again: a new revision, claimable at the cursor.
    let p = manage::publish_trigger(&mut admin, &minutely(0, 60_000))
        .await
        .unwrap();
    assert_eq!((p.revision, p.changed), (2, true));
    let (next, claimable) = cursor(&db, ID).await;
    assert_eq!(claimable, next);
}

/// The claim does not take a jittered row at its nominal instant: a row put back in the
/// claim index at its nominal instant (as a binary before V20 releases it) is claimed,
/// decided not due, and released to its jittered instant; claimed there, it is admitted under
/// the nominal instant's key with the jittered instant recorded beside it, and the next
/// cursor waits at its own jittered instant.
#[tokio::test]
async fn a_jittered_occurrence_is_admitted_at_its_jittered_instant_under_its_nominal_key() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let jitter = 50_000;
    manage::publish_trigger(&mut admin, &minutely(jitter, 60_000))
        .await
        .unwrap();
    let now = db_now_ms(&db.superuser().await).await;
    // Nominal instant past, jittered instant 20–40 s ahead.
    let nominal = nominal_due_within(now, jitter, 20_000, 40_000, 0);
    let due = nominal + jitter_offset_ms(ID, nominal, jitter);
    set_cursor(&db, nominal, nominal).await;

    let c = Claimed::new(&db, "a", 30_000).await;
    let (action, kind) = plan(c.row(), Duration::from_secs(60));
    assert_eq!(kind, Kind::NotDue, "{action:?}");
    let conn = c.conn().await;
    assert!(release::release_claim(&conn, ID, &c.row().fence, 0)
        .await
        .unwrap());
    assert_eq!(cursor(&db, ID).await, (Some(nominal), Some(due)));
    assert!(
        Claimed::up_to(&db, "a", 30_000, 1).await.rows.is_empty(),
        "not claimable before its jittered instant"
    );

    // At the jittered instant (the row moved so that it is due now): admitted.
    let now = db_now_ms(&db.superuser().await).await;
    let nominal = nominal_due_within(now, jitter, -2_000, -1, 0);
    let due = nominal + jitter_offset_ms(ID, nominal, jitter);
    set_cursor(&db, nominal, due).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let (action, kind) = plan(c.row(), Duration::from_secs(60));
    assert_eq!(kind, Kind::Fire);
    let Action::Admit(o) = action else {
        panic!("{action:?}")
    };
    assert_eq!(o.scheduled_for_ms, nominal);
    let a = qlsched::store::admission::Admission::new(c.row(), o);
    assert!(matches!(c.admit(&a).await, AdmitOutcome::Admitted { .. }));
    let r = db
        .superuser()
        .await
        .query_one(
            "SELECT scheduled_for_ms, due_at_ms, queued_at_ms, idempotency_key FROM qlsched.runs
              WHERE trigger_id = $1",
            &[&ID],
        )
        .await
        .unwrap();
    assert_eq!(r.get::<_, i64>(0), nominal);
    assert_eq!(r.get::<_, Option<i64>>(1), Some(due));
    assert!(
        r.get::<_, i64>(2) >= due,
        "queued before its jittered instant"
    );
    assert_eq!(
        r.get::<_, String>(3),
        format!("ql3:cron:v1:{ID}:1:{nominal}")
    );
    let next = o.next_fire_at_ms;
    assert_eq!(
        cursor(&db, ID).await,
        (Some(next), Some(next + jitter_offset_ms(ID, next, jitter)))
    );
    db.assert_invariants().await;
}

/// A replica running with a jittered every-second trigger admits each occurrence at or after
/// its jittered instant, once, with both instants on the run.
#[actix_rt::test]
async fn a_replica_admits_each_jittered_occurrence_at_or_after_its_jittered_instant() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let spec = TriggerSpec {
        jitter_ms: 900,
        ..TriggerSpec::new(ID, "proj", "task", "* * * * * *", "UTC")
    };
    manage::publish_trigger(&mut admin, &spec).await.unwrap();
    let (sup, _metrics, _) = crate::helpers::start_supervisor(db.settings("a", 200, 5_000));
    wait_until("three jittered runs", Duration::from_secs(15), || async {
        db.count("SELECT count(*) FROM qlsched.runs").await >= 3
    })
    .await;
    let _ = sup
        .send(qlsched::actors::supervisor::Drain(Duration::from_secs(2)))
        .await;
    let rows = crate::helpers::pairs::<i64, Option<i64>>(
        &db.superuser().await,
        "SELECT scheduled_for_ms, due_at_ms FROM qlsched.runs ORDER BY scheduled_for_ms",
    )
    .await;
    for (nominal, due) in &rows {
        assert_eq!(*due, Some(nominal + jitter_offset_ms(ID, *nominal, 900)));
    }
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE queued_at_ms < due_at_ms")
            .await,
        0,
        "a run queued before its jittered instant"
    );
    db.assert_invariants().await;
}

/// The misfire grace counts from the jittered instant: an occurrence more than the grace
/// after its nominal instant but within it after its jittered one is on time; more than the
/// grace after its jittered instant it is a misfire.
#[tokio::test]
async fn the_misfire_grace_counts_from_the_jittered_instant() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let (jitter, grace) = (50_000, 2_000);
    manage::publish_trigger(&mut admin, &minutely(jitter, grace))
        .await
        .unwrap();
    let su = db.superuser().await;
    // Due 0.5–1 s ago (within the grace), nominal more than the grace + 5 s ago.
    let now = db_now_ms(&su).await;
    let nominal = nominal_due_within(now, jitter, -1_000, -500, grace + 5_000);
    set_cursor(&db, nominal, nominal).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    assert_eq!(plan(c.row(), Duration::from_secs(60)).1, Kind::Fire);
    release::release_claim(&*c.conn().await, ID, &c.row().fence, 0)
        .await
        .unwrap();
    // Due 3–4 s ago: later than the grace from the jittered instant.
    let now = db_now_ms(&su).await;
    let nominal = nominal_due_within(now, jitter, -4_000, -3_000, 0);
    set_cursor(&db, nominal, nominal).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    assert_eq!(plan(c.row(), Duration::from_secs(60)).1, Kind::Skip);
}

/// A jitter not shorter than the shortest gap between two occurrences is refused at publish,
/// naming the gap (exit 2 through the CLI); nothing is written. One shorter is accepted.
#[tokio::test]
async fn a_jitter_as_long_as_the_shortest_gap_is_refused_naming_the_gap() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    // Every 10 s: the gap is 10 s.
    let spec = |jitter_ms| TriggerSpec {
        jitter_ms,
        ..TriggerSpec::new(ID, "proj", "task", "*/10 * * * * *", "UTC")
    };
    let err = manage::publish_trigger(&mut admin, &spec(10_000))
        .await
        .unwrap_err();
    assert!(
        matches!(err, ManageError::JitterTooLong { gap_ms: 10_000, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("10000 ms"), "{err}");
    assert_eq!(db.count("SELECT count(*) FROM qlsched.triggers").await, 0);
    // 0,50 past each minute: gaps of 50 s and 10 s; the 10 s one bounds the jitter.
    let list = TriggerSpec {
        jitter_ms: 20_000,
        ..TriggerSpec::new(ID, "proj", "task", "0,50 * * * * *", "UTC")
    };
    let err = manage::publish_trigger(&mut admin, &list)
        .await
        .unwrap_err();
    assert!(
        matches!(err, ManageError::JitterTooLong { gap_ms: 10_000, .. }),
        "{err}"
    );
    manage::publish_trigger(&mut admin, &spec(9_999))
        .await
        .unwrap();

    // Through the CLI: exit 2, the gap named.
    let out = crate::helpers::cli::ql(
        &db,
        &[
            "trigger",
            "publish",
            "--id",
            "cli",
            "--project",
            "proj",
            "--task",
            "task",
            "--cron",
            "*/10 * * * * *",
            "--jitter",
            "10s",
        ],
    );
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("shortest gap") && err.contains("10000 ms"),
        "{err}"
    );
}

/// A changed jitter or window is a new revision; the same publish again is a no-op; a
/// trigger published without them keeps the digest it had before V20.
#[tokio::test]
async fn jitter_and_window_are_part_of_the_definition() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let plain = TriggerSpec::new(ID, "proj", "task", "0 * * * * *", "UTC");
    // The digest as binaries before V20 computed it.
    let before_v20 = manage::sha256_hex(
        "trigger:v1\nproj\ntask\n0 * * * * *\nUTC\nskip\n60000\ntrue".as_bytes(),
    );
    assert_eq!(plain.content_digest(), before_v20);
    let now = db_now_ms(&db.superuser().await).await;
    let mut revisions = Vec::new();
    for spec in [
        plain.clone(),
        plain.clone(),
        TriggerSpec {
            jitter_ms: 5_000,
            ..plain.clone()
        },
        TriggerSpec {
            jitter_ms: 5_000,
            ..plain.clone()
        },
        TriggerSpec {
            jitter_ms: 5_000,
            start_at_ms: Some(now),
            ..plain.clone()
        },
        TriggerSpec {
            jitter_ms: 5_000,
            start_at_ms: Some(now),
            end_at_ms: Some(now + 3_600_000),
            ..plain.clone()
        },
    ] {
        let p = manage::publish_trigger(&mut admin, &spec).await.unwrap();
        revisions.push((p.revision, p.changed));
    }
    assert_eq!(
        revisions,
        [
            (1, true),
            (1, false),
            (2, true),
            (2, false),
            (3, true),
            (4, true)
        ]
    );
    let v = triggers::show(&admin, ID).await.unwrap();
    assert_eq!(
        (v.jitter_ms, v.start_at_ms, v.end_at_ms, v.ended),
        (5_000, Some(now), Some(now + 3_600_000), false)
    );
    // A window whose start is not before its end is refused; so is it in the table.
    let err = manage::publish_trigger(
        &mut admin,
        &TriggerSpec {
            start_at_ms: Some(now),
            end_at_ms: Some(now),
            ..plain.clone()
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err, ManageError::Window { .. }), "{err}");
    let refused = db
        .superuser()
        .await
        .execute(
            "UPDATE qlsched.triggers SET start_at_ms = end_at_ms WHERE trigger_id = $1",
            &[&ID],
        )
        .await
        .unwrap_err();
    assert_eq!(
        refused.code(),
        Some(&tokio_postgres::error::SqlState::CHECK_VIOLATION)
    );
}

/// Nothing is admitted before the window's start: the first cursor is the first occurrence
/// at or after it.
#[tokio::test]
async fn the_first_cursor_is_not_before_the_window_start() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let now = db_now_ms(&db.superuser().await).await;
    let start = (now / 60_000 + 30) * 60_000 + 1;
    manage::publish_trigger(
        &mut admin,
        &TriggerSpec {
            start_at_ms: Some(start),
            ..TriggerSpec::new(ID, "proj", "task", "0 * * * * *", "UTC")
        },
    )
    .await
    .unwrap();
    // The occurrence at the start itself would be in it; this one is a millisecond after a
    // minute, so the first is the next minute.
    assert_eq!(
        cursor(&db, ID).await,
        (Some(start - 1 + 60_000), Some(start - 1 + 60_000))
    );
    // A cursor before the start (written by an older binary) is moved into the window.
    set_cursor(&db, now - 1_000, now - 1_000).await;
    let c = Claimed::new(&db, "a", 30_000).await;
    let (action, kind) = plan(c.row(), Duration::from_secs(60));
    assert_eq!(kind, Kind::Initialise);
    assert!(
        matches!(action, Action::Advance { next_fire_at_ms } if next_fire_at_ms == start - 1 + 60_000)
    );
}

/// After the window's end nothing is admitted: a replica admits the occurrences up to the end,
/// then the row leaves the claim index and the trigger shows as ended (list, show, JSON);
/// `trigger fire` still admits a run (an operator's explicit fire is not the schedule).
#[actix_rt::test]
async fn a_trigger_past_its_end_is_ended_and_leaves_the_claim_index() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let now = db_now_ms(&db.superuser().await).await;
    let end = (now / 1_000 + 3) * 1_000;
    manage::publish_trigger(
        &mut admin,
        &TriggerSpec {
            end_at_ms: Some(end),
            ..TriggerSpec::new(ID, "proj", "task", "* * * * * *", "UTC")
        },
    )
    .await
    .unwrap();
    let (sup, _metrics, _) = crate::helpers::start_supervisor(db.settings("a", 200, 5_000));
    wait_until(
        "the row out of the claim index",
        Duration::from_secs(15),
        || async { cursor(&db, ID).await.1.is_none() },
    )
    .await;
    let _ = sup
        .send(qlsched::actors::supervisor::Drain(Duration::from_secs(2)))
        .await;
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM qlsched.runs WHERE scheduled_for_ms = {end}"
        ))
        .await,
        1,
        "the end itself is in the window"
    );
    assert_eq!(
        db.count(&format!(
            "SELECT count(*) FROM qlsched.runs WHERE scheduled_for_ms > {end}"
        ))
        .await,
        0
    );
    let (next, _) = cursor(&db, ID).await;
    assert_eq!(next, Some(end + 1_000));
    let v = triggers::show(&admin, ID).await.unwrap();
    assert!(v.ended, "{v:?}");
    let item = qlsched::present::triggers::TriggerItem::new(v.clone());
    assert_eq!(item.next_fire_ms, None);
    assert!(qlsched::present::triggers::state_text(&v).starts_with("ended "));
    let json = serde_json::to_value(&item).unwrap();
    assert_eq!(json["ended"], true, "{json}");
    // A release or a project resume keeps it out of the index.
    manage::set_project(&mut admin, "proj", "suspended")
        .await
        .unwrap();
    manage::set_project(&mut admin, "proj", "active")
        .await
        .unwrap();
    assert_eq!(cursor(&db, ID).await.1, None);
    // An operator's fire is not the schedule: admitted.
    let f = triggers::fire(&mut admin, ID, "after-the-end", "test")
        .await
        .unwrap();
    assert!(f.admitted);
    db.assert_invariants().await;
}

/// A publish whose window has already ended writes the trigger ended: out of the claim index.
#[tokio::test]
async fn a_trigger_published_after_its_end_is_ended_at_once() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let now = db_now_ms(&db.superuser().await).await;
    manage::publish_trigger(
        &mut admin,
        &TriggerSpec {
            start_at_ms: Some(now - 7_200_000),
            end_at_ms: Some(now - 3_600_000),
            ..TriggerSpec::new(ID, "proj", "task", "0 * * * * *", "UTC")
        },
    )
    .await
    .unwrap();
    assert_eq!(cursor(&db, ID).await.1, None);
    assert!(triggers::show(&admin, ID).await.unwrap().ended);
    // Enabling after a disable keeps it out too.
    triggers::disable(&mut admin, ID, None, "test")
        .await
        .unwrap();
    triggers::enable(&mut admin, ID, "test").await.unwrap();
    assert_eq!(cursor(&db, ID).await.1, None);
}

/// V20 over a database that holds triggers and runs from before it: the migration applies
/// (its lint and lock order are checked by the unit tests of `schema::lint`), the existing
/// trigger has no jitter and no window and keeps its digest (its identical publish changes
/// nothing), the existing run has no due instant, and `db check` is clean.
#[tokio::test]
async fn v20_applies_over_triggers_and_runs_written_before_it() {
    let db = TestDb::new().await;
    let mut admin = db.admin_with_project().await;
    let plain = TriggerSpec::new(ID, "proj", "task", "0 * * * * *", "UTC");
    manage::publish_trigger(&mut admin, &plain).await.unwrap();
    triggers::fire(&mut admin, ID, "before-v20", "test")
        .await
        .unwrap();
    // The database as V18 left it, with those rows in it.
    let applied = crate::live_migrate::back_to_v18_and_migrate(&db).await;
    assert!(
        applied
            .iter()
            .any(|m| m.starts_with("V20__jitter_and_window")),
        "{applied:?}"
    );
    let v = triggers::show(&admin, ID).await.unwrap();
    assert_eq!(
        (v.revision, v.jitter_ms, v.start_at_ms, v.end_at_ms, v.ended),
        (1, 0, None, None, false)
    );
    assert_eq!(
        db.count("SELECT count(*) FROM qlsched.runs WHERE due_at_ms IS NULL")
            .await,
        1
    );
    let p = manage::publish_trigger(&mut admin, &plain).await.unwrap();
    assert_eq!((p.revision, p.changed), (1, false));
    let problems = qlsched::schema::check(
        &db.client("qlsched_owner").await,
        &[
            ("qlsched_admin", "admin"),
            ("qlsched_runtime", "runtime"),
            ("qlsched_worker_ingress", "worker_ingress"),
        ],
    )
    .await
    .unwrap();
    assert!(problems.is_empty(), "{problems:?}");
}
