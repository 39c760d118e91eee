//! Read-only views for `qlsched status`, `qlsched runs list` and the metrics gauges.

use serde::Serialize;

use crate::db::StoreError;

#[derive(Debug, Serialize)]
pub struct ReplicaStatus {
    pub replica_id: String,
    pub hostname: String,
    pub pid: i32,
    pub live: bool,
    pub heartbeat_age_ms: i64,
    pub live_claims: i64,
    /// What the replica recorded at start (V13): its binary version, `None` for a replica
    /// started by a binary from before V13.
    pub binary_version: Option<String>,
}

#[derive(Debug, Serialize)]
pub struct Status {
    pub replicas: Vec<ReplicaStatus>,
    pub live_claims: i64,
    pub due_backlog: i64,
    pub oldest_due_age_ms: Option<i64>,
    /// Admissions and lag per kind of run: a backfill's or a manual fire's lag says nothing
    /// about how late the cron runs.
    pub by_kind: ByKind,
    /// Retention (docs/design.md, "Retention"): horizon, oldest retained finished run, old
    /// queued runs.
    pub retention: RetentionStatus,
}

#[derive(Debug, Serialize)]
pub struct RetentionStatus {
    #[serde(flatten)]
    pub view: super::retention::RetentionView,
    /// The age from which a queued run counts as old (the pruning replica's
    /// `retention.queued_alert_after`, else 1 hour).
    pub queued_alert_after_ms: i64,
}

/// How a run came to be admitted, told from its row alone (docs/operations.md, "qlsched
/// status"): `manual` is `trigger fire` (a `ql3:manual:` key, whatever its version),
/// `backfill` is `trigger backfill` (the cron key, admitted by `backfill:<actor>`; a replica
/// id cannot contain `:`), `cron` is a replica's admission of an occurrence.
pub const RUN_KIND_SQL: &str = "CASE WHEN r.idempotency_key LIKE 'ql3:manual:%' THEN 'manual' \
     WHEN r.admitted_by LIKE 'backfill:%' THEN 'backfill' ELSE 'cron' END";

/// The kinds [`RUN_KIND_SQL`] yields, in the order `status` shows them.
pub const RUN_KINDS: [&str; 3] = ["cron", "manual", "backfill"];

/// One kind's admissions in the last minute and its lag (`queued_at − scheduled_for`) over
/// its last runs.
#[derive(Debug, Default, Serialize)]
pub struct KindStatus {
    pub admitted_last_minute: i64,
    pub lag_p50_ms: Option<f64>,
    pub lag_p99_ms: Option<f64>,
    /// How many runs the percentiles cover (at most `--last`).
    pub lag_sample: i64,
}

#[derive(Debug, Default, Serialize)]
pub struct ByKind {
    pub cron: KindStatus,
    pub manual: KindStatus,
    pub backfill: KindStatus,
}

impl ByKind {
    fn get_mut(&mut self, kind: &str) -> Option<&mut KindStatus> {
        match kind {
            "cron" => Some(&mut self.cron),
            "manual" => Some(&mut self.manual),
            "backfill" => Some(&mut self.backfill),
            _ => None,
        }
    }

    /// The kinds in the order `qlsched status` lists them.
    pub fn iter(&self) -> [(&'static str, &KindStatus); 3] {
        [
            ("cron", &self.cron),
            ("manual", &self.manual),
            ("backfill", &self.backfill),
        ]
    }
}

/// Due backlog (rows a claim would take now: free and due, or holding an expired lease) and
/// the age of the oldest, read from the claim index's head: cheap whatever the table size
/// while the backlog is small.
pub async fn due_backlog(
    client: &impl tokio_postgres::GenericClient,
) -> Result<(i64, Option<i64>), StoreError> {
    // The clock is read first and passed as a value: the range is then planned with it (a
    // handful of due rows, an index range read). Compared with the clock inside the same
    // statement (a materialised scalar subquery), the planner had to guess a third of the
    // table and chose a sequential scan and a sort once the rows grew by a column (V28);
    // a volatile `clock_timestamp()` compared row by row would scan the whole table.
    // `ORDER BY … LIMIT` keeps the range in index order; the count is capped at a million.
    let now: i64 = client
        .query_one(concat!("SELECT ", crate::db_now_ms!()), &[])
        .await?
        .get(0);
    let r = client
        .query_one(
            "SELECT count(*), $1::bigint - min(claimable_at_ms)
               FROM (SELECT claimable_at_ms FROM qlsched.trigger_schedules
                      WHERE claimable_at_ms <= $1::bigint
                      ORDER BY claimable_at_ms LIMIT 1000000) due",
            &[&now],
        )
        .await?;
    Ok((r.get(0), r.get(1)))
}

pub async fn read(
    client: &impl tokio_postgres::GenericClient,
    last: i64,
) -> Result<Status, StoreError> {
    read_bounded(client, last, None).await
}

/// [`read`], with each kind's lag taken over its last `last` runs among the newest `scan`
/// admissions only (the console: a rare kind would otherwise walk the whole index).
pub async fn read_bounded(
    client: &impl tokio_postgres::GenericClient,
    last: i64,
    scan: Option<i64>,
) -> Result<Status, StoreError> {
    let replicas = replicas(client).await?;
    let live_claims = live_claims(client).await?;
    let (due_backlog, oldest_due_age_ms) = due_backlog(client).await?;
    let by_kind = by_kind(client, last, scan).await?;
    let retention = retention(client).await?;
    Ok(Status {
        replicas,
        live_claims,
        due_backlog,
        oldest_due_age_ms,
        by_kind,
        retention,
    })
}

/// Every replica row, with its liveness and live claims by the database clock.
async fn replicas(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Vec<ReplicaStatus>, StoreError> {
    let now_sql = crate::db_now_ms!();
    Ok(client
        .query(
            &format!(
                "SELECT r.replica_id, r.hostname, r.pid, r.expires_at_ms > {now_sql} AND r.stopped_at_ms IS NULL,
                        {now_sql} - r.heartbeat_at_ms,
                        (SELECT count(*) FROM qlsched.trigger_schedules s
                          WHERE s.claim_owner = r.replica_id AND s.claim_expires_at_ms > {now_sql}),
                        r.binary_version
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
            binary_version: r.get(6),
        })
        .collect())
}

/// Leases that have not expired, by the database clock.
async fn live_claims(client: &impl tokio_postgres::GenericClient) -> Result<i64, StoreError> {
    let now_sql = crate::db_now_ms!();
    Ok(client
        .query_one(
            &format!("SELECT count(*) FROM qlsched.trigger_schedules WHERE claim_owner IS NOT NULL AND claim_expires_at_ms > {now_sql}"),
            &[],
        )
        .await?
        .get(0))
}

/// Per run kind: admissions in the last minute and lag percentiles over its last `last` runs
/// (among the newest `scan` admissions when bounded).
async fn by_kind(
    client: &impl tokio_postgres::GenericClient,
    last: i64,
    scan: Option<i64>,
) -> Result<ByKind, StoreError> {
    let now_sql = crate::db_now_ms!();
    let mut by_kind = ByKind::default();
    // Per kind: the last minute's admissions (a range of `runs_queued_at_idx`) and the lag
    // over that kind's last `$1` runs (the same index read backwards, filtered by kind).
    // Bounded by `scan` (the console), the newest `scan` admissions are read once and shared
    // by the kinds, and the last minute once, grouped by kind; unbounded (`qlsched status`),
    // each kind reads backwards until it has its `$1` runs.
    let sql = if scan.is_some() {
        format!(
            "WITH n AS MATERIALIZED (SELECT {now_sql} AS ms),
                  m AS (SELECT ({RUN_KIND_SQL}) AS kind, count(*) AS c FROM qlsched.runs r
                         WHERE r.queued_at_ms > (SELECT ms FROM n) - 60000 GROUP BY 1),
                  recent AS (SELECT kind, lag, row_number() OVER (PARTITION BY kind ORDER BY q DESC) AS nth
                               FROM (SELECT ({RUN_KIND_SQL}) AS kind, r.queued_at_ms AS q,
                                            r.queued_at_ms - r.scheduled_for_ms AS lag
                                       FROM qlsched.runs r
                                      WHERE r.queued_at_ms IS NOT NULL
                                      ORDER BY r.queued_at_ms DESC LIMIT $3) x),
                  l AS (SELECT kind, percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
                               percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99,
                               count(*) AS sample
                          FROM recent WHERE nth <= $1 GROUP BY kind)
             SELECT k.kind, coalesce(m.c, 0), l.p50, l.p99, coalesce(l.sample, 0)
               FROM unnest($2::text[]) AS k(kind)
               LEFT JOIN m ON m.kind = k.kind LEFT JOIN l ON l.kind = k.kind"
        )
    } else {
        format!(
            "WITH n AS MATERIALIZED (SELECT {now_sql} AS ms)
             SELECT k.kind,
                    (SELECT count(*) FROM qlsched.runs r
                      WHERE r.queued_at_ms > (SELECT ms FROM n) - 60000
                        AND ({RUN_KIND_SQL}) = k.kind),
                    l.p50, l.p99, l.sample
               FROM unnest($2::text[]) AS k(kind)
              CROSS JOIN LATERAL (
                    SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
                           percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99,
                           count(*) AS sample
                      FROM (SELECT r.queued_at_ms - r.scheduled_for_ms AS lag
                              FROM qlsched.runs r
                             WHERE r.queued_at_ms IS NOT NULL AND ({RUN_KIND_SQL}) = k.kind
                             ORDER BY r.queued_at_ms DESC LIMIT $1) s) l"
        )
    };
    let kinds = RUN_KINDS.to_vec();
    let rows = match &scan {
        Some(scan) => client.query(&sql, &[&last, &kinds, scan]).await?,
        None => client.query(&sql, &[&last, &kinds]).await?,
    };
    for r in rows {
        let kind: String = r.get(0);
        if let Some(k) = by_kind.get_mut(&kind) {
            *k = KindStatus {
                admitted_last_minute: r.get(1),
                lag_p50_ms: r.get(2),
                lag_p99_ms: r.get(3),
                lag_sample: r.get(4),
            };
        }
    }
    Ok(by_kind)
}

/// The retention line's facts: the view and the recorded queued-run alert age.
async fn retention(
    client: &impl tokio_postgres::GenericClient,
) -> Result<RetentionStatus, StoreError> {
    let alert = super::retention::recorded_alert_age(client).await?;
    Ok(RetentionStatus {
        view: super::retention::view(client, alert).await?,
        queued_alert_after_ms: i64::try_from(alert.as_millis()).unwrap_or(i64::MAX),
    })
}
