//! The statements of `qlsched worker` (docs/worker.md): the dispatcher protocol
//! (docs/dispatcher.md) called through typed functions. The take is V25's
//! `dispatch_take_start` (V18's `dispatch_take_batch`, whose runs come back started: only runs
//! whose spec names an executor this worker runs, read through the pool's index); the finish
//! is V25's `dispatch_finish_batch` (several attempts per call, each judged by its own lease);
//! heartbeat and expire are V16's calls in [`super::dispatch::protocol`]. Each call is one
//! transaction in autocommit; no transaction is held across an execution.

use uuid::Uuid;

use super::dispatch::protocol;
use crate::db::StoreError;

/// `$1` worker id, `$2` pools (text[], 1..32), `$3` executors (text[]), `$4` max runs
/// (int4), `$5` lease ms. Locking: each pool's oldest queued runs `FOR UPDATE SKIP LOCKED`
/// in `runs_take_idx` order (and those admitted without the copied pool and executor, in
/// `runs_queued_legacy_idx` order); each taken run's attempt is updated under that lock.
pub const TAKE_BATCH: &str =
    "SELECT run_id, attempt_id, attempt_no, lease_token, lease_expires_at_ms,
        trigger_id, scheduled_for_ms, queued_at_ms, idempotency_key, spec
   FROM qlsched.dispatch_take_batch($1, $2, $3, $4, $5)";

/// [`TAKE_BATCH`] whose runs come back started (V25, `dispatch_take_start`): run and attempt
/// `running`, the lease `$5` ms from the take's reading of the database clock. Locking: as
/// [`TAKE_BATCH`].
pub const TAKE_START: &str =
    "SELECT run_id, attempt_id, attempt_no, lease_token, lease_expires_at_ms,
        trigger_id, scheduled_for_ms, queued_at_ms, idempotency_key, spec
   FROM qlsched.dispatch_take_start($1, $2, $3, $4, $5)";

/// `dispatch_finish` of several attempts (V25, `dispatch_finish_batch`): per element of the
/// arrays `$1` attempt id, `$2` lease token, `$3` outcome, `$4` exit status (int4), `$5`
/// output tail, `$6` error, `$7` result (jsonb). Returns (attempt id, recorded) in that
/// order. Locking: the attempts' runs `FOR UPDATE` in run_id order, then each attempt is
/// judged by its own lease.
pub const FINISH_BATCH: &str = "SELECT attempt_id, recorded
   FROM qlsched.dispatch_finish_batch($1, $2, $3, $4, $5, $6, $7)";

/// The take of V17 (`dispatch_take_executable`), same arguments and rows: what a worker of
/// the previous release calls (kept for the tests of that contract).
pub const TAKE_EXECUTABLE: &str =
    "SELECT run_id, attempt_id, attempt_no, lease_token, lease_expires_at_ms,
        trigger_id, scheduled_for_ms, queued_at_ms, idempotency_key, spec
   FROM qlsched.dispatch_take_executable($1, $2, $3, $4, $5)";

/// One run taken under a lease.
#[derive(Debug, Clone)]
pub struct Taken {
    pub run_id: Uuid,
    pub attempt_id: Uuid,
    pub attempt_no: i32,
    pub token: Uuid,
    /// The lease's end on the database clock (ms); `taken_at_ms` is it less the lease.
    pub lease_expires_at_ms: i64,
    pub trigger_id: String,
    pub scheduled_for_ms: i64,
    pub queued_at_ms: i64,
    pub idempotency_key: String,
    pub spec: Option<String>,
}

/// What a heartbeat answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// The lease runs on.
    Held,
    /// Held, and an operator asked to stop the run (`qlsched.request_cancel`).
    CancelRequested,
    /// Not held any more (ended, expired, another token): stop the work.
    Lost,
}

/// How an attempt ended, as `dispatch_finish` records it.
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    pub succeeded: bool,
    pub exit_status: Option<i32>,
    pub output_tail: Option<String>,
    pub error: Option<String>,
    pub result: Option<serde_json::Value>,
}

/// Takes up to `max_runs` runs of `pools` whose spec names one of `executors` (V18's take:
/// each run is `dispatching` until [`start`]).
pub async fn take(
    c: &tokio_postgres::Client,
    worker_id: &str,
    pools: &[String],
    executors: &[&str],
    max_runs: i32,
    lease_ms: i64,
) -> Result<Vec<Taken>, StoreError> {
    take_with(
        c, TAKE_BATCH, worker_id, pools, executors, max_runs, lease_ms,
    )
    .await
}

/// [`take`], each run started (V25): the worker executes them at once, no [`start`] call.
pub async fn take_started(
    c: &tokio_postgres::Client,
    worker_id: &str,
    pools: &[String],
    executors: &[&str],
    max_runs: i32,
    lease_ms: i64,
) -> Result<Vec<Taken>, StoreError> {
    take_with(
        c, TAKE_START, worker_id, pools, executors, max_runs, lease_ms,
    )
    .await
}

async fn take_with(
    c: &tokio_postgres::Client,
    sql: &str,
    worker_id: &str,
    pools: &[String],
    executors: &[&str],
    max_runs: i32,
    lease_ms: i64,
) -> Result<Vec<Taken>, StoreError> {
    let executors: Vec<String> = executors.iter().map(|s| s.to_string()).collect();
    let rows = c
        .query(sql, &[&worker_id, &pools, &executors, &max_runs, &lease_ms])
        .await?;
    Ok(rows
        .iter()
        .map(|r| Taken {
            run_id: r.get("run_id"),
            attempt_id: r.get("attempt_id"),
            attempt_no: r.get("attempt_no"),
            token: r.get("lease_token"),
            lease_expires_at_ms: r.get("lease_expires_at_ms"),
            trigger_id: r.get("trigger_id"),
            scheduled_for_ms: r.get("scheduled_for_ms"),
            queued_at_ms: r.get("queued_at_ms"),
            idempotency_key: r.get("idempotency_key"),
            spec: r.get("spec"),
        })
        .collect())
}

/// The work starts: whether the lease was held (run and attempt now `running`).
pub async fn start(
    c: &tokio_postgres::Client,
    t: &Taken,
    lease_ms: i64,
) -> Result<bool, StoreError> {
    let r = c
        .query_one(protocol::START, &[&t.attempt_id, &t.token, &lease_ms])
        .await?;
    Ok(r.get(0))
}

/// Extends the lease to `lease_ms` from now.
pub async fn heartbeat(
    c: &tokio_postgres::Client,
    t: &Taken,
    lease_ms: i64,
) -> Result<Beat, StoreError> {
    let r = c
        .query_one(protocol::HEARTBEAT, &[&t.attempt_id, &t.token, &lease_ms])
        .await?;
    let expiry: Option<i64> = r.get("lease_expires_at_ms");
    let cancel: bool = r.get("cancel_requested");
    Ok(match (expiry, cancel) {
        (None, _) => Beat::Lost,
        (Some(_), true) => Beat::CancelRequested,
        (Some(_), false) => Beat::Held,
    })
}

/// Records the outcome: whether it was (false: the lease was not held any more).
pub async fn finish(c: &tokio_postgres::Client, t: &Taken, f: &Finish) -> Result<bool, StoreError> {
    let outcome = if f.succeeded { "succeeded" } else { "failed" };
    let r = c
        .query_one(
            protocol::FINISH,
            &[
                &t.attempt_id,
                &t.token,
                &outcome,
                &f.exit_status,
                &f.output_tail,
                &f.error,
                &f.result,
            ],
        )
        .await?;
    Ok(r.get(0))
}

/// Records several outcomes in one call: per attempt, in the order given, whether it was
/// (false: its lease was not held any more; the others are recorded all the same).
pub async fn finish_batch(
    c: &tokio_postgres::Client,
    ended: &[(&Taken, &Finish)],
) -> Result<Vec<bool>, StoreError> {
    let mut ids = Vec::with_capacity(ended.len());
    let mut tokens = Vec::with_capacity(ended.len());
    let mut outcomes = Vec::with_capacity(ended.len());
    let mut statuses = Vec::with_capacity(ended.len());
    let mut tails = Vec::with_capacity(ended.len());
    let mut errors = Vec::with_capacity(ended.len());
    let mut results = Vec::with_capacity(ended.len());
    for (t, f) in ended {
        ids.push(t.attempt_id);
        tokens.push(t.token);
        outcomes.push(if f.succeeded { "succeeded" } else { "failed" });
        statuses.push(f.exit_status);
        tails.push(f.output_tail.as_deref());
        errors.push(f.error.as_deref());
        results.push(f.result.as_ref());
    }
    let rows = c
        .query(
            FINISH_BATCH,
            &[
                &ids, &tokens, &outcomes, &statuses, &tails, &errors, &results,
            ],
        )
        .await?;
    // One row per attempt given (the function answers each); looked up by id all the same.
    let answered: std::collections::HashMap<Uuid, bool> =
        rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    Ok(ids
        .iter()
        .map(|id| answered.get(id).copied().unwrap_or(false))
        .collect())
}

/// Gives back an attempt whose work never started: whether it did.
pub async fn release(c: &tokio_postgres::Client, t: &Taken) -> Result<bool, StoreError> {
    let r = c
        .query_one(protocol::RELEASE, &[&t.attempt_id, &t.token])
        .await?;
    Ok(r.get(0))
}

/// Marks up to `max_rows` lapsed attempts (anyone's) lost: (lost, retried).
pub async fn expire(c: &tokio_postgres::Client, max_rows: i32) -> Result<(i64, i64), StoreError> {
    let r = c.query_one(protocol::EXPIRE, &[&max_rows]).await?;
    Ok((r.get(0), r.get(1)))
}

/// The worker's readiness gate (the dispatcher role reads no schema history, so `db check`
/// is not its to run): the take and the finish of V25 exist and this role may execute them,
/// and so may it every V16 call the worker makes. Returns every problem found (empty = ready).
/// Locking: none (catalog reads).
pub async fn readiness(c: &tokio_postgres::Client) -> Result<Vec<String>, StoreError> {
    const FUNCTIONS: [&str; 4] = [
        "qlsched.dispatch_take_start(text,text[],text[],integer,bigint)",
        "qlsched.dispatch_finish_batch(uuid[],uuid[],text[],integer[],text[],text[],jsonb[])",
        "qlsched.dispatch_heartbeat(uuid,uuid,bigint)",
        "qlsched.dispatch_expire(integer)",
    ];
    let rows = c
        .query(
            "SELECT f, to_regprocedure(f) IS NOT NULL,
                    to_regprocedure(f) IS NOT NULL AND has_function_privilege(to_regprocedure(f), 'EXECUTE'),
                    current_user::text
               FROM unnest($1::text[]) f",
            &[&FUNCTIONS.to_vec()],
        )
        .await?;
    Ok(rows
        .iter()
        .filter_map(|r| {
            let (f, exists, may, role): (String, bool, bool, String) =
                (r.get(0), r.get(1), r.get(2), r.get(3));
            match (exists, may) {
                (false, _) => Some(format!(
                    "{f} is missing: the schema is older than this worker (run `qlsched db migrate`)"
                )),
                (true, false) => Some(format!(
                    "role {role} may not EXECUTE {f}: a worker logs in as the dispatcher role"
                )),
                _ => None,
            }
        })
        .collect())
}
