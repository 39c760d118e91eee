//! `qlsched runs cancel`: an operator withdraws queued runs nobody has taken yet (a
//! mistaken backfill, a fire by error). Admin role, column-level UPDATE on `runs(status,
//! cancelled)` and `attempts(state, finished_at_ms)` (src/schema/grants.rs, COLUMN_GRANTS).

use serde::Serialize;
use uuid::Uuid;

use super::status::RUN_KIND_SQL;
use crate::db::StoreError;
use crate::db_now_ms;

/// Which runs a cancel is about.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selection {
    /// One run.
    Run(Uuid),
    /// A trigger's runs scheduled in `[from_ms, to_ms)`, optionally of one kind (`cron`,
    /// `manual`, `backfill`: [`RUN_KIND_SQL`]).
    Window {
        trigger: String,
        from_ms: i64,
        to_ms: i64,
        kind: Option<String>,
    },
}

/// The runs of a selection by status, read before anything is written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct Census {
    /// Runs in the selection, whatever their status.
    pub matched: i64,
    /// Still `queued`: what a cancel would withdraw.
    pub queued: i64,
    /// `dispatching`, `running`, `succeeded` or `failed`: a dispatcher took them.
    pub taken: i64,
    /// `cancelled` already.
    pub cancelled: i64,
}

fn selection_sql(what: &str) -> String {
    format!(
        "SELECT {what} FROM qlsched.runs r
          WHERE CASE WHEN $1::uuid IS NOT NULL THEN r.run_id = $1
                     ELSE r.trigger_id = $2 AND r.scheduled_for_ms >= $3 AND r.scheduled_for_ms < $4
                          AND ($5::text IS NULL OR ({RUN_KIND_SQL}) = $5) END"
    )
}

type Params<'a> = [&'a (dyn tokio_postgres::types::ToSql + Sync); 5];

fn params(s: &Selection) -> (Option<Uuid>, Option<&str>, i64, i64, Option<&str>) {
    match s {
        Selection::Run(id) => (Some(*id), None, 0, 0, None),
        Selection::Window {
            trigger,
            from_ms,
            to_ms,
            kind,
        } => (None, Some(trigger), *from_ms, *to_ms, kind.as_deref()),
    }
}

/// Counts the selection's runs by status (one statement; the window reads
/// `runs_trigger_idx`).
async fn census(
    client: &tokio_postgres::Transaction<'_>,
    s: &Selection,
) -> Result<Census, StoreError> {
    let p = params(s);
    let ps: Params = [&p.0, &p.1, &p.2, &p.3, &p.4];
    let r = client
        .query_one(
            &selection_sql(
                "count(*), count(*) FILTER (WHERE r.status = 'queued'),
                 count(*) FILTER (WHERE r.status IN ('dispatching', 'running', 'succeeded', 'failed')),
                 count(*) FILTER (WHERE r.status = 'cancelled')",
            ),
            &ps,
        )
        .await?;
    Ok(Census {
        matched: r.get(0),
        queued: r.get(1),
        taken: r.get(2),
        cancelled: r.get(3),
    })
}

/// The ids of the selection's queued runs in id order, at most `limit` (a caller that
/// passes `max + 1` learns whether there are more than `max`).
async fn queued_ids(
    client: &tokio_postgres::Transaction<'_>,
    s: &Selection,
    limit: i64,
) -> Result<Vec<Uuid>, StoreError> {
    let p = params(s);
    let ps: [&(dyn tokio_postgres::types::ToSql + Sync); 6] =
        [&p.0, &p.1, &p.2, &p.3, &p.4, &limit];
    let sql = selection_sql("r.run_id") + " AND r.status = 'queued' ORDER BY r.run_id LIMIT $6";
    Ok(client
        .query(&sql, &ps)
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect())
}

/// The selection's census and the ids of its queued runs (at most `limit`), from one
/// snapshot (a read-only REPEATABLE READ transaction), so that the counts and the ids agree
/// however many runs dispatchers take meanwhile.
pub async fn read_selection(
    client: &mut tokio_postgres::Client,
    s: &Selection,
    limit: i64,
) -> Result<(Census, Vec<Uuid>), StoreError> {
    let tx = super::snapshot(client).await?;
    let census = census(&tx, s).await?;
    let ids = queued_ids(&tx, s, limit).await?;
    tx.commit().await?;
    Ok((census, ids))
}

/// Cancels the runs `$1` (uuid[]) that are still queued and untouched: run `cancelled`
/// (and its `cancelled` flag), attempt `claimed → abandoned` with `finished_at_ms`, event 3
/// `run.cancelled`. Untouched is start-up recovery's pristine: not cancelled, one attempt,
/// `claimed`, every worker field as admitted. Each run is locked `FOR UPDATE SKIP LOCKED`,
/// the lock a dispatcher's take (src/store/dispatch.rs) asks for: a run a dispatcher holds
/// is skipped, one it took and committed fails the re-check of `status`; while we hold it,
/// no dispatcher can take it. Returns the runs cancelled.
const CANCEL_SQL: &str = concat!(
    "WITH obs AS MATERIALIZED (SELECT ",
    db_now_ms!(),
    " AS now_ms), picked AS (
    SELECT r.run_id FROM qlsched.runs r
     WHERE r.run_id = ANY ($1::uuid[]) AND r.status = 'queued' AND NOT r.cancelled
       AND (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id) = 1
       AND EXISTS (SELECT 1 FROM qlsched.attempts a
                    WHERE a.run_id = r.run_id AND a.attempt_no = 1 AND a.state = 'claimed'
                      AND num_nonnulls(a.worker_id, a.session_id, a.lease_id, a.lease_expires_at_ms,
                                       a.offer_id, a.callback_token, a.started_at_ms,
                                       a.finished_at_ms, a.result, a.error) = 0)
     FOR UPDATE OF r SKIP LOCKED
), run AS (
    UPDATE qlsched.runs r SET status = 'cancelled', cancelled = true
      FROM picked WHERE r.run_id = picked.run_id AND r.status = 'queued'
    RETURNING r.run_id, r.trigger_id, r.project_id
), att AS (
    UPDATE qlsched.attempts a SET state = 'abandoned', finished_at_ms = obs.now_ms
      FROM run, obs WHERE a.run_id = run.run_id AND a.attempt_no = 1 AND a.state = 'claimed'
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT run.run_id, 3, 'run.cancelled', obs.now_ms FROM run, obs
)
SELECT run_id, trigger_id, project_id FROM run ORDER BY trigger_id, run_id"
);

/// One committed chunk of `runs cancel`: how many of `ids` it cancelled (the rest a
/// dispatcher took or holds, or they are not untouched: left alone). Appends one audit row
/// per trigger whose runs it cancelled (a `runs cancel` selects one trigger's runs), none
/// when it cancelled nothing.
pub async fn cancel_chunk(
    client: &mut tokio_postgres::Client,
    ids: &[Uuid],
) -> Result<u64, StoreError> {
    let tx = client.transaction().await?;
    let rows = tx.query(CANCEL_SQL, &[&ids]).await?;
    for same in rows.chunk_by(|a, b| a.get::<_, &str>(1) == b.get::<_, &str>(1)) {
        let run_ids: Vec<String> = same
            .iter()
            .map(|r| r.get::<_, Uuid>(0).to_string())
            .collect();
        let entry = super::audit::Entry {
            kind: super::audit::ObjectKind::Trigger,
            id: same[0].get(1),
            project: Some(same[0].get(2)),
            action: "runs.cancel",
            changes: serde_json::json!({"cancelled": run_ids.len(), "run_ids": run_ids}),
            note: None,
            origin: None,
        };
        super::audit::append(&tx, &entry).await?;
    }
    tx.commit().await?;
    Ok(rows.len() as u64)
}

/// Whether a trigger with this id exists (deleted ones included: their runs can be
/// cancelled).
pub async fn trigger_exists(client: &tokio_postgres::Client, id: &str) -> Result<bool, StoreError> {
    Ok(client
        .query_opt(
            "SELECT 1 FROM qlsched.triggers WHERE trigger_id = $1",
            &[&id],
        )
        .await?
        .is_some())
}
