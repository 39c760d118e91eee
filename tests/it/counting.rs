//! Each admission outcome is counted once, as what it was (issue 10 item 13): an admission
//! whose COMMIT outlives the client's bound is committed by the server all the same, and the
//! replica must count it as admitted, not as a lost fence.

use std::time::Duration;

use qlsched::actors::supervisor::Drain;
use qlsched::actors::Settings;

use crate::helpers::{start_supervisor, wait_until, TestDb};

/// One due occurrence; a deferred constraint trigger makes the first admission's COMMIT take
/// 2 s on the server against a 1 s client bound. The client gives up (outcome unknown) while
/// the server goes on and commits. The replica ends with one run, counted once as admitted.
#[actix_rt::test]
async fn an_admission_whose_commit_outlives_the_client_bound_is_counted_as_admitted() {
    let db = TestDb::new().await;
    db.seed_bulk(1, "0 0 0 1 1 *", -1000).await;
    db.superuser()
        .await
        .batch_execute(
            "CREATE TABLE qlsched.test_slow_commit (on_ boolean);
             INSERT INTO qlsched.test_slow_commit VALUES (true);
             CREATE FUNCTION qlsched.slow_commit() RETURNS trigger LANGUAGE plpgsql
               SECURITY DEFINER AS $$
             BEGIN
               IF EXISTS (SELECT 1 FROM qlsched.test_slow_commit) THEN
                 DELETE FROM qlsched.test_slow_commit;
                 PERFORM pg_sleep(2);
               END IF;
               RETURN NULL;
             END $$;
             CREATE CONSTRAINT TRIGGER slow_commit AFTER INSERT ON qlsched.runs
               DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION qlsched.slow_commit();",
        )
        .await
        .unwrap();
    let (sup, m, _) = start_supervisor(Settings {
        cadence: Duration::from_millis(200),
        admit_timeout: Duration::from_secs(1),
        ..db.actor_settings("a")
    });
    wait_until(
        "the run committed and the row free again",
        Duration::from_secs(20),
        || async {
            db.count(
                "SELECT count(*) FROM qlsched.runs r, qlsched.trigger_schedules s
                  WHERE s.claim_owner IS NULL AND NOT EXISTS (SELECT 1 FROM qlsched.test_slow_commit)",
            )
            .await
                == 1
        },
    )
    .await;
    let _ = sup.send(Drain(Duration::from_secs(5))).await;
    let runs = db
        .count("SELECT count(*) FROM qlsched.runs WHERE admitted_by = 'a'")
        .await;
    assert_eq!(runs, 1);
    assert!(
        m.unknown_outcomes.get() >= 1,
        "the client did not give up on the slow COMMIT: the test did not exercise an unknown outcome"
    );
    assert_eq!(
        (
            m.admits.get() as i64,
            m.fence_losses.get(),
            m.duplicate_keys.get()
        ),
        (runs, 0, 0),
        "(admits, fence losses, duplicate keys) counted for one committed admission"
    );
    db.assert_invariants().await;
}
