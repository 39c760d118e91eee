//! Retention of finished runs (docs/design.md, "Retention"): the 'prune' maintenance lease,
//! one prune batch through `qlsched.prune_finished`, and the reads behind the retention
//! gauges, `qlsched status` and `trigger backfill`'s horizon check.

use std::time::Duration;

use serde::Serialize;
use uuid::Uuid;

use crate::db::StoreError;

/// The database clock in epoch milliseconds, as SQL.
const NOW_MS: &str = "(extract(epoch FROM clock_timestamp()) * 1000)::bigint";

/// Runs with these statuses are finished; only they are ever pruned.
pub const FINISHED: [&str; 3] = ["succeeded", "failed", "cancelled"];

/// A held 'prune' lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PruneLease {
    pub token: Uuid,
    /// How long it stays ours from the claim, by the database clock.
    pub remaining: Duration,
}

/// Claims the 'prune' lease for `owner` if it is free, expired or already `owner`'s
/// (`FOR UPDATE SKIP LOCKED`: a replica mid-batch holds the row locked and is skipped, never
/// waited for), recording this replica's `finished_after` (ms, 0 = forever) for
/// `trigger backfill`. `None`: another replica holds it.
pub async fn claim_lease(
    client: &tokio_postgres::Client,
    owner: &str,
    lease: Duration,
    finished_after: Duration,
) -> Result<Option<PruneLease>, StoreError> {
    let token = Uuid::new_v4();
    let lease_ms = i64::try_from(lease.as_millis()).unwrap_or(i64::MAX);
    let keep_ms = i64::try_from(finished_after.as_millis()).unwrap_or(i64::MAX);
    let row = client
        .query_opt(
            "UPDATE qlsched.maintenance m
                SET lease_owner = $1, lease_token = $2,
                    lease_expires_at = clock_timestamp() + $3::bigint * interval '1 millisecond',
                    finished_after_ms = $4, last_pass_at = clock_timestamp()
              WHERE m.task = (SELECT task FROM qlsched.maintenance
                               WHERE task = 'prune'
                                 AND (lease_expires_at IS NULL
                                      OR lease_expires_at <= clock_timestamp()
                                      OR lease_owner = $1)
                                 FOR UPDATE SKIP LOCKED)
            RETURNING (extract(epoch FROM lease_expires_at - clock_timestamp()) * 1000)::bigint",
            &[&owner, &token, &lease_ms, &keep_ms],
        )
        .await?;
    Ok(row.map(|r| PruneLease {
        token,
        remaining: Duration::from_millis(r.get::<_, i64>(0).max(0) as u64),
    }))
}

/// Records the lease holder's `queued_alert_after` for `qlsched status`.
pub async fn record_alert_age(
    client: &tokio_postgres::Client,
    owner: &str,
    queued_alert_after: Duration,
) -> Result<(), StoreError> {
    let ms = i64::try_from(queued_alert_after.as_millis()).unwrap_or(i64::MAX);
    client
        .execute(
            "UPDATE qlsched.maintenance SET queued_alert_after_ms = $2
              WHERE task = 'prune' AND lease_owner = $1",
            &[&owner, &ms],
        )
        .await?;
    Ok(())
}

/// The age `qlsched status` counts queued runs as old from while no replica recorded one.
pub const DEFAULT_QUEUED_ALERT_AFTER: Duration = Duration::from_secs(3600);

/// The recorded `queued_alert_after`, or [`DEFAULT_QUEUED_ALERT_AFTER`].
pub async fn recorded_alert_age(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Duration, StoreError> {
    let ms: Option<i64> = client
        .query_opt(
            "SELECT queued_alert_after_ms FROM qlsched.maintenance WHERE task = 'prune'",
            &[],
        )
        .await?
        .and_then(|r| r.get(0));
    Ok(ms
        .map(|ms| Duration::from_millis(ms.max(0) as u64))
        .unwrap_or(DEFAULT_QUEUED_ALERT_AFTER))
}

/// Gives the lease back early (expires it now), if it is still `token`'s.
pub async fn release_lease(
    client: &tokio_postgres::Client,
    owner: &str,
    token: Uuid,
) -> Result<(), StoreError> {
    client
        .execute(
            "UPDATE qlsched.maintenance SET lease_expires_at = clock_timestamp()
              WHERE task = 'prune' AND lease_owner = $1 AND lease_token = $2",
            &[&owner, &token],
        )
        .await?;
    Ok(())
}

/// Runs pruned by one batch, per status (only finished statuses ever appear).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Pruned {
    pub by_status: Vec<(String, i64)>,
}

impl Pruned {
    pub fn total(&self) -> i64 {
        self.by_status.iter().map(|(_, n)| n).sum()
    }
}

/// SQL of one batch: the horizon asked for is `finished_after` before the database clock;
/// `prune_finished` (V15) uses the earlier of it and the clock minus the database's floor.
pub const PRUNE_SQL: &str = "SELECT status, pruned FROM qlsched.prune_finished(\
     (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $1::bigint, $2::integer, $3, $4)";

/// One prune batch, in its own transaction (one statement): up to `max_rows` finished runs
/// scheduled and finished more than `finished_after` (at least the floor) ago, with their
/// attempts and events. Waits for a `trigger backfill` chunk in progress (the prune lock).
pub async fn prune_batch(
    client: &tokio_postgres::Client,
    finished_after: Duration,
    max_rows: u32,
    owner: &str,
    token: Uuid,
) -> Result<Pruned, StoreError> {
    let keep_ms = i64::try_from(finished_after.as_millis()).unwrap_or(i64::MAX);
    let max = i32::try_from(max_rows).unwrap_or(i32::MAX);
    let rows = client
        .query(PRUNE_SQL, &[&keep_ms, &max, &owner, &token])
        .await?;
    Ok(Pruned {
        by_status: rows.iter().map(|r| (r.get(0), r.get(1))).collect(),
    })
}

/// Drops the recorded overlap skip instants (V21) scheduled more than `finished_after`
/// before the database clock; the skip counts stay. Returns the triggers changed. One
/// statement through `qlsched.overlap_prune_skips` (the runtime's EXECUTE).
pub async fn prune_skips(
    client: &tokio_postgres::Client,
    finished_after: Duration,
) -> Result<i64, StoreError> {
    let keep_ms = i64::try_from(finished_after.as_millis()).unwrap_or(i64::MAX);
    Ok(client
        .query_one(
            "SELECT qlsched.overlap_prune_skips(
                 (extract(epoch FROM clock_timestamp()) * 1000)::bigint - $1::bigint)",
            &[&keep_ms],
        )
        .await?
        .get(0))
}

/// One batch of audit retention (V22), in its own transaction (one statement): up to
/// `max_rows` rows of `qlsched.audit_log` older than `keep` by the database clock, oldest
/// first, through `qlsched.prune_audit` (which refuses a `keep` under 7 days and a caller
/// that does not hold the 'prune' lease). Returns how many.
pub async fn prune_audit_batch(
    client: &tokio_postgres::Client,
    keep: Duration,
    max_rows: u32,
    owner: &str,
    token: Uuid,
) -> Result<i64, StoreError> {
    let keep_ms = i64::try_from(keep.as_millis()).unwrap_or(i64::MAX);
    let max = i32::try_from(max_rows).unwrap_or(i32::MAX);
    Ok(client
        .query_one(
            "SELECT qlsched.prune_audit($1::bigint, $2::integer, $3, $4)",
            &[&keep_ms, &max, &owner, &token],
        )
        .await?
        .get(0))
}

/// What the retention gauges and `qlsched status` show.
#[derive(Debug, Default, Clone, Serialize, PartialEq, Eq)]
pub struct RetentionView {
    /// The `finished_after` (ms) last recorded by a pruning replica; 0 = forever; `None`:
    /// no replica has pruned yet.
    pub finished_after_ms: Option<i64>,
    /// The highest horizon (epoch ms) any prune used.
    pub pruned_through_ms: Option<i64>,
    /// Age (ms, database clock) of the oldest retained finished run (by `queued_at_ms`).
    pub oldest_finished_age_ms: Option<i64>,
    /// Queued runs admitted more than `queued_alert_after` ago.
    pub old_queued: i64,
    /// Attempts taken under a lease of the dispatcher protocol (V16) whose lease ended by the
    /// database clock and that no `qlsched.dispatch_expire` has marked lost yet, up to
    /// [`OLD_QUEUED_CAP`].
    pub lapsed_attempts: i64,
}

/// Where the view stops counting old queued runs: a count of `OLD_QUEUED_CAP` means that many
/// or more.
pub const OLD_QUEUED_CAP: i64 = 10_000;

/// Counts queued runs admitted more than `$1` ms ago (database clock), up to
/// [`OLD_QUEUED_CAP`] (the `LIMIT` below).
/// Stops at [`OLD_QUEUED_CAP`], so a backlog of millions costs what ten thousand do.
pub const OLD_QUEUED_SQL: &str = concat!(
    "SELECT count(*) FROM (SELECT 1 FROM qlsched.runs r
      WHERE r.status = 'queued' AND r.queued_at_ms < ",
    crate::db_now_ms!(),
    " - $1::bigint LIMIT 10000) q"
);

/// Counts attempts whose lease ended (database clock) and that are still `dispatching` or
/// `running`, through `attempts_lease_expiry_idx` (V16), up to [`OLD_QUEUED_CAP`]. Replicas
/// only count them: ending them is `qlsched.dispatch_expire`'s, which no replica calls.
pub const LAPSED_ATTEMPTS_SQL: &str = concat!(
    "SELECT count(*) FROM (SELECT 1 FROM qlsched.attempts a
      WHERE a.state IN ('dispatching', 'running') AND a.lease_id IS NOT NULL
        AND a.lease_expires_at_ms <= ",
    crate::db_now_ms!(),
    " LIMIT 10000) l"
);

/// Queued runs read per pool by [`queued_by_pool`]: past this many the count stops (a
/// backlog of millions costs what this many do).
pub const QUEUED_BY_POOL_CAP: i64 = 100_000;

/// Queued runs per execution revision, at most [`QUEUED_BY_POOL_CAP`] runs read and 1000
/// revisions answered (the largest counts), each with its pinned spec. Locking: plain reads;
/// the queued runs through the partial index of the take's order (`runs_queued_order_idx`,
/// V16), each revision by the primary key of `execution_revisions`, once per revision (grouped
/// first). 100,000 queued runs among 300,000: about 50 ms
/// (`retention::queued_runs_are_counted_per_pool_of_their_pinned_spec` prints the plan).
pub const QUEUED_BY_REVISION_SQL: &str = "
    SELECT e.spec, q.n
      FROM (SELECT r.execution_revision_id, count(*) AS n
              FROM (SELECT execution_revision_id FROM qlsched.runs
                     WHERE status = 'queued' LIMIT 100000) r
             GROUP BY 1 ORDER BY n DESC LIMIT 1000) q
      JOIN qlsched.execution_revisions e ON e.execution_revision_id = q.execution_revision_id";

/// The pool of a spec, as `qlsched.spec_pool` (V16) decides it: its `pool`, `default` when
/// absent, null or the spec is not JSON. (Replicas may not execute that function; the spec
/// is read and decided here.)
pub fn spec_pool(spec: &str) -> String {
    match serde_json::from_str::<serde_json::Value>(spec)
        .ok()
        .as_ref()
        .and_then(|v| v.get("pool"))
    {
        None | Some(serde_json::Value::Null) => "default".to_owned(),
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(other) => other.to_string(),
    }
}

/// Queued runs per pool (the pool of each run's pinned execution revision), sorted by pool,
/// read through [`QUEUED_BY_REVISION_SQL`].
pub async fn queued_by_pool(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Vec<(String, i64)>, StoreError> {
    let mut by_pool = std::collections::BTreeMap::<String, i64>::new();
    for row in client.query(QUEUED_BY_REVISION_SQL, &[]).await? {
        *by_pool.entry(spec_pool(row.get("spec"))).or_default() += row.get::<_, i64>("n");
    }
    Ok(by_pool.into_iter().collect())
}

/// Reads the retention view. `old_queued` counts queued runs through `runs_unfinished_idx`
/// (only unfinished runs are in it); the oldest finished run is the head of
/// `runs_finished_idx` (V11).
pub async fn view(
    client: &impl tokio_postgres::GenericClient,
    queued_alert_after: Duration,
) -> Result<RetentionView, StoreError> {
    let alert_ms = i64::try_from(queued_alert_after.as_millis()).unwrap_or(i64::MAX);
    let row = client
        .query_one(
            &format!(
                "WITH now AS (SELECT {NOW_MS} AS ms)
                 SELECT m.finished_after_ms, m.pruned_through_ms,
                        (SELECT now.ms - min(r.queued_at_ms) FROM qlsched.runs r
                          WHERE r.status IN ('succeeded', 'failed', 'cancelled')),
                        ({OLD_QUEUED_SQL}), ({LAPSED_ATTEMPTS_SQL})
                   FROM now LEFT JOIN qlsched.maintenance m ON m.task = 'prune'"
            ),
            &[&alert_ms],
        )
        .await?;
    Ok(RetentionView {
        finished_after_ms: row.get(0),
        pruned_through_ms: row.get(1),
        oldest_finished_age_ms: row.get(2),
        old_queued: row.get(3),
        lapsed_attempts: row.get(4),
    })
}

/// How far inside the retention horizon a backfill window must start (`trigger backfill`
/// and the console's): covers a prune pass that starts while the backfill runs
/// (docs/design.md, "Retention").
pub const BACKFILL_HORIZON_MARGIN: Duration = Duration::from_secs(3600);

/// The earliest `scheduled_for` (epoch ms) an operator may still admit without risking a
/// pruned run's occurrence being admitted again: the later of the highest horizon any prune
/// used and `now − max(finished_after, floor) + margin` (the floor: V15) (the margin covers a prune that starts while the
/// backfill runs). `None`: nothing was or will be pruned (no pruning replica yet, or
/// retention 0 = forever and nothing pruned before).
pub async fn backfill_floor_ms(
    client: &impl tokio_postgres::GenericClient,
    margin: Duration,
) -> Result<Option<(i64, Option<i64>)>, StoreError> {
    let margin_ms = i64::try_from(margin.as_millis()).unwrap_or(i64::MAX);
    let row = client
        .query_opt(
            &format!(
                "SELECT CASE WHEN finished_after_ms > 0
                             THEN {NOW_MS} - greatest(finished_after_ms, finished_after_floor_ms)
                                  + $1::bigint END,
                        pruned_through_ms, finished_after_ms
                   FROM qlsched.maintenance WHERE task = 'prune'"
            ),
            &[&margin_ms],
        )
        .await?;
    let Some(row) = row else { return Ok(None) };
    let by_setting: Option<i64> = row.get(0);
    let pruned: Option<i64> = row.get(1);
    let finished_after: Option<i64> = row.get(2);
    Ok(match (by_setting, pruned) {
        (None, None) => None,
        (a, b) => Some((a.max(b).expect("one is set"), finished_after)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_per_pool_read_stops_at_its_cap() {
        assert!(QUEUED_BY_REVISION_SQL.contains(&format!("LIMIT {QUEUED_BY_POOL_CAP})")));
    }

    #[test]
    fn a_specs_pool_is_decided_as_spec_pool_decides_it() {
        assert_eq!(
            spec_pool(r#"{"executor": "shell", "pool": "backups"}"#),
            "backups"
        );
        assert_eq!(spec_pool(r#"{"image": "demo"}"#), "default");
        assert_eq!(spec_pool(r#"{"pool": null}"#), "default");
        assert_eq!(spec_pool(r#"["pool"]"#), "default");
        assert_eq!(spec_pool("not json"), "default");
        assert_eq!(spec_pool(r#"{"pool": 7}"#), "7");
    }

    /// The count's `LIMIT` is written into the SQL text (a `const` string); it must stay the
    /// cap the status line and the console compare with.
    #[test]
    fn the_old_queued_count_stops_at_its_cap() {
        assert!(super::OLD_QUEUED_SQL.ends_with(&format!(" LIMIT {}) q", super::OLD_QUEUED_CAP)));
    }
}
