//! The dispatcher contract (docs/dispatcher.md): the statements a dispatcher, logged in as
//! `<prefix>_dispatcher`, runs to take queued runs and move them forward. The scheduler
//! never runs them; `examples/dispatcher.rs` and the tests do.
//!
//! Every statement moves run, attempt and event together (one statement, one
//! transaction), so a run's status, its attempt's state and its last event always agree.
//! Migration V10's triggers refuse any status change that is not a step forward.
//!
//! [`TAKE_SQL`], [`START_SQL`] and [`FINISH_SQL`] are the V10 contract, deprecated: they
//! keep working until the contract migration a release after V16 revokes the dispatcher's
//! direct grants. New dispatchers call the functions of [`protocol`].

use crate::db_now_ms;

/// Takes up to `$1` queued runs and marks them `dispatching` (attempt `dispatching`, event
/// 3 `run.dispatching`). Only pristine runs are taken (not cancelled, exactly one attempt,
/// `claimed`, every worker field as admitted: what start-up recovery calls the dispatcher's);
/// anything else is an operator's. `FOR UPDATE SKIP LOCKED`: concurrent dispatchers take
/// disjoint runs; a run another transaction holds (a dispatcher's take, a `runs cancel`) is
/// skipped, and one that was taken and committed meanwhile fails the re-check of `status`.
/// Order: `runs_unfinished_idx` (status, run_id), read in that order and stopped at the
/// limit: the attempt test is one scalar subquery per run, which PostgreSQL cannot turn into
/// a join over every queued run's attempt (with a backlog, that scan and sort made each take
/// slower the further behind a dispatcher was); the updates reach their rows by key arrays,
/// so even a generic plan (which cannot know the limit) never hashes a whole table. Returns run id, attempt id, trigger id,
/// scheduled instant (Unix ms), idempotency key and the execution revision's spec.
pub const TAKE_SQL: &str = concat!(
    "WITH obs AS MATERIALIZED (SELECT ",
    db_now_ms!(),
    " AS now_ms), picked AS (
    SELECT r.run_id FROM qlsched.runs r
     WHERE r.status = 'queued' AND NOT r.cancelled
       AND (SELECT count(*) = 1
                   AND bool_and(a.attempt_no = 1 AND a.state = 'claimed'
                                AND num_nonnulls(a.worker_id, a.session_id, a.lease_id,
                                                 a.lease_expires_at_ms, a.offer_id,
                                                 a.callback_token, a.started_at_ms,
                                                 a.finished_at_ms, a.result, a.error) = 0)
              FROM qlsched.attempts a WHERE a.run_id = r.run_id)
     ORDER BY r.status, r.run_id
     LIMIT $1
     FOR UPDATE OF r SKIP LOCKED
), run AS (
    UPDATE qlsched.runs r SET status = 'dispatching'
     WHERE r.run_id = ANY (ARRAY(SELECT run_id FROM picked)) AND r.status = 'queued'
    RETURNING r.run_id, r.trigger_id, r.scheduled_for_ms, r.idempotency_key, r.execution_revision_id
), att AS (
    UPDATE qlsched.attempts a SET state = 'dispatching'
     WHERE a.run_id = ANY (ARRAY(SELECT run_id FROM run)) AND a.attempt_no = 1
       AND a.state = 'claimed'
    RETURNING a.run_id, a.attempt_id
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT run.run_id, 3, 'run.dispatching', obs.now_ms FROM run, obs
)
SELECT run.run_id, att.attempt_id, run.trigger_id, run.scheduled_for_ms, run.idempotency_key, e.spec
  FROM run JOIN att ON att.run_id = run.run_id
  LEFT JOIN qlsched.execution_revisions e ON e.execution_revision_id = run.execution_revision_id
 ORDER BY run.run_id"
);

/// Marks the runs `$1` (uuid[]) `running`: the work has started. Run `dispatching →
/// running`, attempt `dispatching → running` with `started_at_ms`, event 4 `run.started`.
/// Returns the runs it moved (a run not `dispatching` is not touched).
pub const START_SQL: &str = concat!(
    "WITH obs AS MATERIALIZED (SELECT ",
    db_now_ms!(),
    " AS now_ms), run AS (
    UPDATE qlsched.runs r SET status = 'running'
     WHERE r.run_id = ANY ($1::uuid[]) AND r.status = 'dispatching'
    RETURNING r.run_id
), att AS (
    UPDATE qlsched.attempts a SET state = 'running', started_at_ms = obs.now_ms
      FROM run, obs WHERE a.run_id = run.run_id AND a.attempt_no = 1 AND a.state = 'dispatching'
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT run.run_id, 4, 'run.started', obs.now_ms FROM run, obs
)
SELECT run_id FROM run ORDER BY run_id"
);

/// Finishes runs: per row of the arrays `$1` run id, `$2` outcome (`succeeded` |
/// `failed`), `$3` error (text, NULL on success). A `running` run becomes the outcome; a
/// `dispatching` run (its work never started) may only fail. Attempt likewise, with
/// `finished_at_ms` and `error`; event 5 `run.finished` (the outcome is the run's status).
/// Returns the runs it moved.
pub const FINISH_SQL: &str = concat!(
    "WITH obs AS MATERIALIZED (SELECT ",
    db_now_ms!(),
    " AS now_ms), d AS (
    SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[]) AS d(run_id, outcome, error)
), run AS (
    UPDATE qlsched.runs r SET status = d.outcome
      FROM d WHERE r.run_id = d.run_id AND d.outcome IN ('succeeded', 'failed')
       AND (r.status = 'running' OR (r.status = 'dispatching' AND d.outcome = 'failed'))
    RETURNING r.run_id, d.outcome, d.error
), att AS (
    UPDATE qlsched.attempts a SET state = run.outcome, finished_at_ms = obs.now_ms, error = run.error
      FROM run, obs WHERE a.run_id = run.run_id AND a.attempt_no = 1
       AND a.state IN ('running', 'dispatching')
), ev AS (
    INSERT INTO qlsched.run_events (run_id, seq, kind, at_ms)
    SELECT run.run_id, (SELECT max(seq) + 1 FROM qlsched.run_events e WHERE e.run_id = run.run_id),
           'run.finished', obs.now_ms
      FROM run, obs
)
SELECT run_id FROM run ORDER BY run_id"
);

/// The dispatcher protocol (V16, docs/dispatcher.md): calls of the `qlsched.dispatch_*`
/// functions, the dispatcher role's only EXECUTE grants. Each function is one transaction in
/// autocommit; none is ever called by a replica. Every write but the take and the expiry is
/// fenced by the attempt's lease token and its expiry on the database clock: a call that
/// does not hold the lease writes nothing and answers `false` / NULL.
pub mod protocol {
    /// `$1` worker id, `$2` pools (text[], NULL: all), `$3` max runs (int4), `$4` lease ms.
    /// Returns run id, attempt id, attempt no, lease token, lease expiry (ms), trigger id,
    /// scheduled instant, idempotency key, pinned spec; in `queued_at_ms` order.
    /// Locking: each run `FOR UPDATE SKIP LOCKED` in `runs_queued_order_idx` order (another
    /// take or a `runs cancel` holding a run makes this take skip it); its attempt is then
    /// updated under that lock.
    pub const TAKE: &str =
        "SELECT run_id, attempt_id, attempt_no, lease_token, lease_expires_at_ms,
        trigger_id, scheduled_for_ms, idempotency_key, spec
   FROM qlsched.dispatch_take($1, $2, $3, $4)";

    /// `$1` attempt id, `$2` lease token, `$3` lease ms: the work started; the lease runs
    /// `$3` from now. Returns whether the lease was held.
    /// Locking: the run row `FOR UPDATE` (waits for a concurrent expiry of the same run).
    pub const START: &str = "SELECT qlsched.dispatch_start($1, $2, $3)";

    /// `$1` attempt id, `$2` lease token, `$3` lease ms: extends a held lease; returns the
    /// new expiry (ms) or NULL when it is not held any more (stop the work: it may be retried
    /// elsewhere), and whether an operator asked to stop the run (`qlsched.request_cancel`).
    /// Locking: the run row `FOR UPDATE`.
    pub const HEARTBEAT: &str = "SELECT lease_expires_at_ms, cancel_requested
   FROM qlsched.dispatch_heartbeat($1, $2, $3)";

    /// `$1` attempt id, `$2` lease token, `$3` 'succeeded' | 'failed', `$4` exit status
    /// (int4), `$5` output tail, `$6` error (≤ 8 KiB), `$7` result (jsonb, ≤ 64 KiB). Returns
    /// whether it was recorded. Locking: the run row `FOR UPDATE`.
    pub const FINISH: &str = "SELECT qlsched.dispatch_finish($1, $2, $3, $4, $5, $6, $7)";

    /// `$1` attempt id, `$2` lease token: gives back a held attempt whose work never started
    /// (graceful stop). Returns whether it did. Locking: the run row `FOR UPDATE`.
    pub const RELEASE: &str = "SELECT qlsched.dispatch_release($1, $2)";

    /// `$1` max rows: marks attempts whose lease ended (database clock) lost and retries or
    /// fails their runs. Returns (lost, retried). Locking: each run `FOR UPDATE SKIP
    /// LOCKED` (a run whose holder is mid-call is left for the next pass).
    pub const EXPIRE: &str = "SELECT lost, retried FROM qlsched.dispatch_expire($1)";
}
