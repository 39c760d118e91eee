//! A twin: a second process taking a replica's id while the first still runs (a restarted
//! VM whose old process lives on). The superuser plays it: it takes the guard row and every
//! lease under the id with a token of its own.

use std::time::Duration;

use crate::{wait_until, TestDb};

/// The claim token of every lease the twin holds.
pub const TOKEN: &str = "00000000-0000-0000-0000-00000000beef";

/// Waits until `rows` schedule rows are initialised (a cursor set) and unclaimed.
pub async fn await_idle_schedule(db: &TestDb, rows: i64, within: Duration) {
    wait_until("the schedule initialised", within, || async {
        db.count(
            "SELECT count(*) FROM qlsched.trigger_schedules
              WHERE next_fire_at_ms IS NOT NULL AND claim_owner IS NULL",
        )
        .await
            == rows
    })
    .await;
}

/// The twin takes the guard row of `id` (a new incarnation) and a lease on every schedule
/// row under `id`, for ten minutes of the database clock.
pub async fn take_the_id(db: &TestDb, id: &str) {
    db.superuser()
        .await
        .batch_execute(&format!(
            "BEGIN;
             UPDATE qlsched.replicas SET incarnation = gen_random_uuid(), pid = 1,
                    heartbeat_at_ms = {now}, expires_at_ms = {now} + 600000 WHERE replica_id = '{id}';
             UPDATE qlsched.trigger_schedules
                SET claim_owner = '{id}', claim_token = '{TOKEN}',
                    claim_version = claim_version + 1, claim_expires_at_ms = {now} + 600000,
                    claimable_at_ms = {now} + 600000, state_version = state_version + 1;
             COMMIT;",
            now = qlsched::db_now_ms!()
        ))
        .await
        .unwrap();
}

/// The leases the twin still holds under `id`.
pub async fn leases_held(db: &TestDb, id: &str) -> i64 {
    db.count(&format!(
        "SELECT count(*) FROM qlsched.trigger_schedules
          WHERE claim_owner = '{id}' AND claim_token = '{TOKEN}'"
    ))
    .await
}
