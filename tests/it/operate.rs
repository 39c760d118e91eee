//! Operating the real binary as a systemd service: the unit file, sd_notify messages on a fake
//! notify socket, readiness transitions over HTTP, and lease hand-over on SIGTERM vs SIGKILL.

mod handover;
mod notify;
mod readiness;
mod unit;

use crate::helpers::RunsLock;

/// A count query with one text parameter (`$1`: a replica id or an application name).
async fn count(c: &tokio_postgres::Client, sql: &str, who: &str) -> i64 {
    c.query_one(sql, &[&who]).await.unwrap().get(0)
}

const LEASES_OF: &str = "SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner = $1";
const RUNS_ADMITTED_BY: &str = "SELECT count(*) FROM qlsched.runs WHERE admitted_by = $1";
const ADMISSIONS_WAITING_FOR_A_LOCK: &str = "SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND wait_event_type = 'Lock' AND application_name = $1";
const BACKENDS_OF: &str = "SELECT count(*) FROM pg_stat_activity
    WHERE datname = current_database() AND application_name = $1";
