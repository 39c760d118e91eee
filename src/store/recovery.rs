//! Start-up recovery (docs/design.md, "Start-up recovery"): classify admitted work before the
//! lifecycle starts.

use crate::db::StoreError;

/// A run whose admission no longer has the exact pristine shape.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RecoveryCandidate {
    pub run_id: uuid::Uuid,
    pub idempotency_key: String,
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Unfinished runs that are the dispatcher's: queued runs whose latest attempt is still
    /// exactly as admitted (or queued again by the protocol after lost attempts), and runs
    /// held under a lease of the protocol (V16).
    pub pristine: i64,
    /// How many unfinished runs are not pristine (the true count, whatever the list holds).
    pub candidate_count: i64,
    /// The first of them (at most the caller's limit): reported, never dispatched by this
    /// daemon.
    pub candidates: Vec<RecoveryCandidate>,
}

/// The classification [`recover_on_startup`] runs (`$1`: how many candidates to list). The
/// first row carries the counts; the rest are the candidates. A run whose attempts all follow
/// the dispatcher protocol (V16) is no candidate: one taken under a lease (the attempt's
/// `lease_id`, its state the run's status) is ended by `qlsched.dispatch_expire`, and one
/// queued again after lost attempts (each earlier attempt failed `lost: …`) is untouched
/// work like any queued run. Runs a dispatcher of the V10 statements took are still
/// reported and left alone. Public so that a test can
/// EXPLAIN this very statement (`runs_unfinished_idx`, `tests/it/edges.rs`).
pub const RECOVERY_SQL: &str = "WITH latest AS (
                 SELECT DISTINCT ON (a.run_id) a.*
                   FROM qlsched.attempts a
                   JOIN qlsched.runs r ON r.run_id = a.run_id
                  WHERE r.status IN ('queued', 'dispatching', 'running')
                  ORDER BY a.run_id, a.attempt_no DESC)
             , classified AS (
             SELECT r.run_id, r.idempotency_key,
                    CASE
                      WHEN l.run_id IS NULL THEN 'no attempt'
                      WHEN r.status <> 'queued' AND l.lease_id IS NOT NULL AND l.state = r.status
                        THEN NULL
                      WHEN r.status <> 'queued' THEN 'run is ' || r.status
                      WHEN r.cancelled THEN 'run is cancelled'
                      WHEN r.queued_at_ms IS NULL THEN 'run has no queued_at_ms'
                      WHEN l.attempt_no <> 1
                           AND EXISTS (SELECT 1 FROM qlsched.attempts p
                                        WHERE p.run_id = r.run_id AND p.attempt_no < l.attempt_no
                                          AND (p.state <> 'failed' OR p.error NOT LIKE 'lost: %'))
                        THEN 'a newer attempt exists'
                      WHEN l.executor <> 'remote_worker' OR l.state <> 'claimed'
                        THEN 'attempt is ' || l.executor || '/' || l.state
                      WHEN num_nonnulls(l.worker_id, l.session_id, l.lease_id, l.lease_expires_at_ms,
                                        l.offer_id, l.callback_token, l.started_at_ms,
                                        l.finished_at_ms, l.result, l.error) > 0
                        THEN 'attempt fields drifted from admission'
                    END AS reason
               FROM qlsched.runs r
               LEFT JOIN latest l ON l.run_id = r.run_id
              WHERE r.status IN ('queued', 'dispatching', 'running'))
             (SELECT NULL::uuid, NULL::text, NULL::text, count(*) FILTER (WHERE reason IS NULL),
                     count(*) FILTER (WHERE reason IS NOT NULL) FROM classified)
             UNION ALL
             (SELECT run_id, idempotency_key, reason, 0, 0 FROM classified WHERE reason IS NOT NULL
               ORDER BY run_id LIMIT $1)";

/// Classifies unfinished runs. Read-only: the scheduler never dispatches or repairs work, so
/// candidates are reported (fail closed) and left to the dispatcher or an operator.
///
/// Unfinished means `queued`, `dispatching` or `running`; the partial index
/// `runs_unfinished_idx` holds exactly those, so finished history is never scanned.
///
/// Locking: plain READ COMMITTED reads; nothing is locked.
pub async fn recover_on_startup(
    conn: &tokio_postgres::Client,
    limit: i64,
) -> Result<RecoveryReport, StoreError> {
    let rows = conn.query(RECOVERY_SQL, &[&limit]).await?;
    let mut report = RecoveryReport::default();
    for r in rows {
        match r.get::<_, Option<String>>(2) {
            None => {
                report.pristine = r.get(3);
                report.candidate_count = r.get(4);
            }
            Some(reason) => report.candidates.push(RecoveryCandidate {
                run_id: r.get(0),
                idempotency_key: r.get(1),
                reason,
            }),
        }
    }
    Ok(report)
}
