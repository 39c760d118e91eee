//! Read-only views for `qlsched status`, `qlsched runs list` and the metrics gauges.

use std::fmt::Write;

use serde::Serialize;

use super::StoreError;

#[derive(Debug, Serialize)]
pub struct ReplicaStatus {
    pub replica_id: String,
    pub hostname: String,
    pub pid: i32,
    pub live: bool,
    pub heartbeat_age_ms: i64,
    pub live_claims: i64,
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub replicas: Vec<ReplicaStatus>,
    pub live_claims: i64,
    pub due_backlog: i64,
    pub oldest_due_age_ms: Option<i64>,
    pub admitted_last_minute: i64,
    pub lag_p50_ms: Option<f64>,
    pub lag_p99_ms: Option<f64>,
    pub lag_sample: i64,
}

/// Due backlog (rows a claim would take now: free and due, or holding an expired lease) and
/// the age of the oldest, read from the claim index's head: cheap whatever the table size
/// while the backlog is small.
pub async fn due_backlog(
    client: &tokio_postgres::Client,
) -> Result<(i64, Option<i64>), StoreError> {
    let r = client
        .query_one(
            // The clock is read once (materialised) and compared through a scalar subquery, an
            // init plan the index range scan can use; a volatile `clock_timestamp()` compared
            // row by row would scan the whole table.
            // `ORDER BY … LIMIT` keeps the planner on the index whatever it guesses about
            // the range; the count is capped at a million.
            concat!(
                "WITH n AS MATERIALIZED (SELECT ",
                crate::db_now_ms!(),
                " AS ms)
             SELECT count(*), (SELECT ms FROM n) - min(claimable_at_ms)
               FROM (SELECT claimable_at_ms FROM qlsched.trigger_schedules
                      WHERE claimable_at_ms <= (SELECT ms FROM n)
                      ORDER BY claimable_at_ms LIMIT 1000000) due"
            ),
            &[],
        )
        .await?;
    Ok((r.get(0), r.get(1)))
}

pub async fn read(client: &tokio_postgres::Client, last: i64) -> Result<Status, StoreError> {
    let now_sql = crate::db_now_ms!();
    let replicas = client
        .query(
            &format!(
                "SELECT r.replica_id, r.hostname, r.pid, r.expires_at_ms > {now_sql} AND r.stopped_at_ms IS NULL,
                        {now_sql} - r.heartbeat_at_ms,
                        (SELECT count(*) FROM qlsched.trigger_schedules s
                          WHERE s.claim_owner = r.replica_id AND s.claim_expires_at_ms > {now_sql})
                   FROM qlsched.replicas r ORDER BY r.replica_id"
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| ReplicaStatus {
            replica_id: r.get(0),
            hostname: r.get(1),
            pid: r.get(2),
            live: r.get(3),
            heartbeat_age_ms: r.get(4),
            live_claims: r.get(5),
        })
        .collect();
    let live_claims: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL AND claim_expires_at_ms > {now_sql}"),
            &[],
        )
        .await?
        .get(0);
    let (due_backlog, oldest_due_age_ms) = due_backlog(client).await?;
    let admitted_last_minute: i64 = client
        .query_one(
            &format!("SELECT count(*) FROM qlsched.runs WHERE queued_at_ms > {now_sql} - 60000"),
            &[],
        )
        .await?
        .get(0);
    let lag = client
        .query_one(
            "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag), percentile_cont(0.99) WITHIN GROUP (ORDER BY lag), count(*)
               FROM (SELECT queued_at_ms - scheduled_for_ms AS lag FROM qlsched.runs
                      ORDER BY queued_at_ms DESC NULLS LAST LIMIT $1) l",
            &[&last],
        )
        .await?;
    Ok(Status {
        replicas,
        live_claims,
        due_backlog,
        oldest_due_age_ms,
        admitted_last_minute,
        lag_p50_ms: lag.get(0),
        lag_p99_ms: lag.get(1),
        lag_sample: lag.get(2),
    })
}

impl Status {
    pub fn render(&self) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "replicas:");
        for r in &self.replicas {
            let _ = writeln!(
                s,
                "  {:<12} {:<5} heartbeat {:>6} ms ago  claims {:>4}  {}:{}",
                r.replica_id,
                if r.live { "live" } else { "gone" },
                r.heartbeat_age_ms,
                r.live_claims,
                r.hostname,
                r.pid
            );
        }
        let ms = |v: Option<f64>| {
            v.map(|x| format!("{x:.0} ms"))
                .unwrap_or_else(|| "-".into())
        };
        let _ = writeln!(s, "live claims: {}", self.live_claims);
        let _ = writeln!(
            s,
            "due backlog: {} (oldest {})",
            self.due_backlog,
            self.oldest_due_age_ms
                .map(|x| format!("{x} ms"))
                .unwrap_or_else(|| "-".into())
        );
        let _ = writeln!(
            s,
            "admitted in the last minute: {}",
            self.admitted_last_minute
        );
        let _ = writeln!(
            s,
            "lag over last {} runs: p50 {}  p99 {}",
            self.lag_sample,
            ms(self.lag_p50_ms),
            ms(self.lag_p99_ms)
        );
        s
    }
}

pub async fn list_runs(
    client: &tokio_postgres::Client,
    trigger: Option<&str>,
    limit: i64,
) -> Result<Vec<String>, StoreError> {
    let rows = client
        .query(
            "SELECT r.idempotency_key, r.status, r.scheduled_for_ms, r.queued_at_ms, r.admitted_by
               FROM qlsched.runs r
              WHERE $1::text IS NULL OR r.trigger_id = $1
              ORDER BY r.queued_at_ms DESC NULLS LAST LIMIT $2",
            &[&trigger, &limit],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| {
            let sf: i64 = r.get(2);
            let q: Option<i64> = r.get(3);
            let when = chrono::DateTime::from_timestamp_millis(sf)
                .map(|d| d.to_rfc3339())
                .unwrap_or_default();
            format!(
                "{}  {}  scheduled {}  lag {} ms  by {}",
                r.get::<_, String>(0),
                r.get::<_, String>(1),
                when,
                q.map(|q| q - sf).unwrap_or(-1),
                r.get::<_, String>(4)
            )
        })
        .collect())
}
