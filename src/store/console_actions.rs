//! The console's operator actions (migration V24, docs/console.md "Actions"): each a call of
//! one owner function the runtime role may EXECUTE, in the caller's transaction. The
//! functions take the locks and run the checks of the CLI command they mirror (their SQL
//! comments say which) and append the audit row; what stays here is the reading the binary
//! does before (the enable's floor, for the cron arithmetic) and the confirmation counts.
//!
//! Locking: every function locks the trigger row before its schedule row and runs (the
//! admission's order, `schema::lint::LOCK_ORDER`), as the CLI commands do; the reads here
//! take no lock.

use uuid::Uuid;

use crate::db::StoreError;
use crate::db_now_ms;
use crate::store::manage::CursorFloor;

/// Who acts: the console user and the client address (recorded in the audit row).
#[derive(Clone, Copy, Debug)]
pub struct Actor<'a> {
    pub user: &'a str,
    pub host: &'a str,
}

/// `qlsched.console_disable`: `disabled` or `unchanged`.
pub async fn disable(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    note: &str,
    by: Actor<'_>,
) -> Result<String, StoreError> {
    Ok(tx
        .query_one(
            "SELECT qlsched.console_disable($1, $2, $3, $4)",
            &[&id, &note, &by.user, &by.host],
        )
        .await?
        .get(0))
}

/// What an enable computes its first cursor from, read without a lock (the function
/// re-checks it under its locks and answers `stale` if it moved).
#[derive(Clone, Debug)]
pub struct EnableBasis {
    pub revision: i64,
    pub cron_expr: String,
    pub timezone: String,
    pub start_at_ms: Option<i64>,
    pub(crate) floor: CursorFloor,
    pub now_ms: i64,
}

/// The trigger's definition, floor and the database clock, or `None` for an unknown id.
pub async fn enable_basis(
    client: &impl tokio_postgres::GenericClient,
    id: &str,
) -> Result<Option<EnableBasis>, StoreError> {
    let row = client
        .query_opt(
            concat!(
                "SELECT t.revision, t.cron_expr, t.timezone, t.start_at_ms,
                        greatest(s.admitted_through_ms, s.last_scheduled_at_ms,
                                 (SELECT max(r.scheduled_for_ms) FROM qlsched.runs r
                                   WHERE r.trigger_id = t.trigger_id
                                     AND r.idempotency_key LIKE 'ql3:cron:%')), ",
                db_now_ms!(),
                " FROM qlsched.triggers t
                   LEFT JOIN qlsched.trigger_schedules s ON s.trigger_id = t.trigger_id
                  WHERE t.trigger_id = $1"
            ),
            &[&id],
        )
        .await?;
    Ok(row.map(|r| EnableBasis {
        revision: r.get(0),
        cron_expr: r.get(1),
        timezone: r.get(2),
        start_at_ms: r.get(3),
        // A disabled row is not claimable: an enable has no live cursor to honour.
        floor: CursorFloor {
            admitted_through_ms: r.get(4),
            live_cursor_ms: None,
        },
        now_ms: r.get(5),
    }))
}

/// `qlsched.console_enable`: `enabled`, `unchanged` or `stale`.
pub async fn enable(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    revision: i64,
    first_ms: Option<i64>,
    by: Actor<'_>,
) -> Result<String, StoreError> {
    Ok(tx
        .query_one(
            "SELECT qlsched.console_enable($1, $2, $3, $4, $5)",
            &[&id, &revision, &first_ms, &by.user, &by.host],
        )
        .await?
        .get(0))
}

/// What a fire did: `admitted`, `existing` (the request id's run), `overlap_skipped` or
/// `overlap_buffered`, and the run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FireOutcome {
    pub outcome: String,
    pub run_id: Option<Uuid>,
}

/// `qlsched.console_fire` (a retry of `retry_of` when given).
pub async fn fire(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    request_id: &str,
    retry_of: Option<Uuid>,
    note: Option<&str>,
    by: Actor<'_>,
) -> Result<FireOutcome, StoreError> {
    let run_id = crate::store::admission::mint_run_id(&format!("console:{}", by.user));
    let r = tx
        .query_one(
            "SELECT outcome, fired_run_id
               FROM qlsched.console_fire($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &id,
                &request_id,
                &retry_of,
                &run_id,
                &Uuid::new_v4(),
                &by.user,
                &by.host,
                &note,
            ],
        )
        .await?;
    Ok(FireOutcome {
        outcome: r.get(0),
        run_id: r.get(1),
    })
}

/// `qlsched.console_backfill` of `instants` under `revision`: how many were admitted.
pub async fn backfill(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    revision: i64,
    instants: &[i64],
    note: Option<&str>,
    by: Actor<'_>,
) -> Result<i64, StoreError> {
    let owner = format!("backfill:console:{}", by.user);
    let runs: Vec<Uuid> = instants
        .iter()
        .map(|_| crate::store::admission::mint_run_id(&owner))
        .collect();
    let attempts: Vec<Uuid> = instants.iter().map(|_| Uuid::new_v4()).collect();
    Ok(tx
        .query_one(
            "SELECT qlsched.console_backfill($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &id, &revision, &instants, &runs, &attempts, &by.user, &by.host, &note,
            ],
        )
        .await?
        .get(0))
}

/// The runs a backfill of `instants` would find already there (the confirmation's count):
/// a cron-keyed run of the trigger at the instant, under any revision.
pub async fn backfill_existing(
    client: &impl tokio_postgres::GenericClient,
    id: &str,
    instants: &[i64],
) -> Result<i64, StoreError> {
    Ok(client
        .query_one(
            "SELECT count(DISTINCT r.scheduled_for_ms) FROM qlsched.runs r
              WHERE r.trigger_id = $1 AND r.scheduled_for_ms = ANY ($2)
                AND r.idempotency_key LIKE 'ql3:cron:%'",
            &[&id, &instants],
        )
        .await?
        .get(0))
}

/// The queued runs of a trigger scheduled in `[from, to)` a cancel would consider (the
/// confirmation's count; the function takes at most 1000 of them, untouched ones only).
pub async fn queued_count(
    client: &impl tokio_postgres::GenericClient,
    id: &str,
    from_ms: Option<i64>,
    to_ms: Option<i64>,
) -> Result<i64, StoreError> {
    Ok(client
        .query_one(
            "SELECT count(*) FROM qlsched.runs r
              WHERE r.trigger_id = $1 AND r.status = 'queued' AND NOT r.cancelled
                AND ($2::bigint IS NULL OR r.scheduled_for_ms >= $2)
                AND ($3::bigint IS NULL OR r.scheduled_for_ms < $3)",
            &[&id, &from_ms, &to_ms],
        )
        .await?
        .get(0))
}

/// `qlsched.console_cancel_queued`: how many runs were cancelled.
pub async fn cancel_queued(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    from_ms: Option<i64>,
    to_ms: Option<i64>,
    note: Option<&str>,
    by: Actor<'_>,
) -> Result<i64, StoreError> {
    Ok(tx
        .query_one(
            "SELECT qlsched.console_cancel_queued($1, $2, $3, $4, $5, $6)",
            &[&id, &from_ms, &to_ms, &by.user, &by.host, &note],
        )
        .await?
        .get(0))
}

/// The trigger of a run (a retry fires it), or `None` for an unknown run.
pub async fn run_trigger(
    client: &impl tokio_postgres::GenericClient,
    run_id: Uuid,
) -> Result<Option<String>, StoreError> {
    Ok(client
        .query_opt(
            "SELECT trigger_id FROM qlsched.runs WHERE run_id = $1",
            &[&run_id],
        )
        .await?
        .map(|r| r.get(0)))
}

/// `qlsched.console_request_cancel`: 1 when the holder was asked, 0 otherwise.
pub async fn request_cancel(
    tx: &tokio_postgres::Transaction<'_>,
    run_id: Uuid,
    note: Option<&str>,
    by: Actor<'_>,
) -> Result<i64, StoreError> {
    Ok(tx
        .query_one(
            "SELECT qlsched.console_request_cancel($1, $2, $3, $4)",
            &[&run_id, &by.user, &by.host, &note],
        )
        .await?
        .get(0))
}
