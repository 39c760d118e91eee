//! The admission engine: every lease write of a replica (admissions, cursor moves, releases)
//! on one dedicated connection, one batch at a time. The admit actor queues and batches; the
//! engine runs a batch to a definite, counted outcome per member:
//!
//! - serialization failures are retried a bounded number of times while the leases live;
//! - a lost COMMIT reply (or a time-out) discards the connection and resolves the whole
//!   batch in one read by idempotency key and fence, retrying the read until the earliest
//!   lease deadline, after which the lease decides;
//! - a refusal is followed up by its cause: a definition that moved on is released at once
//!   (decided again on the next round), a corrupt one with the reject back-off, a lost fence
//!   not at all;
//! - a statement error isolates the failing member (one by one) and releases it with its
//!   error back-off.
//!
//! Metrics are counted here, exactly once per outcome: `admits` equals the runs this replica
//! committed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{debug, warn, Logger};

use crate::metrics::Metrics;
use crate::store::admit::{self, Admission, AdmitOutcome, Refusal, Resolution};
use crate::store::claim::ClaimedRow;
use crate::store::session::{bounded, Session};
use crate::store::{release, StoreError};

/// What to do with one leased row, as the claim actor decided.
#[derive(Clone, Debug)]
pub enum Action {
    /// Admit the occurrence (fire, or misfired fire_once).
    Admit(Box<Admission>),
    /// Move the cursor only (initialise, misfired skip).
    Advance { next_fire_at_ms: i64 },
    /// Give the lease back, claimable again after `backoff` (reject, not due).
    Release { backoff: Duration },
}

/// One decided lease, as the engine receives it.
#[derive(Clone, Debug)]
pub struct Job {
    pub claim: ClaimedRow,
    pub action: Action,
    /// Local monotonic instant after which the lease is surely expired (claim time + lease);
    /// work that would start later is not attempted.
    pub lease_deadline: Instant,
    /// Back-off for a release after an admission error of this row (grows per row with
    /// consecutive errors; the supervisor computes it).
    pub error_backoff: Duration,
}

/// How a lease ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Our run committed (exactly one run, attempt and two events).
    Admitted { queued_at_ms: i64, lag_ms: i64 },
    /// The occurrence's key already existed: the cursor moved past it, nothing new written.
    AlreadyAdmitted,
    /// The cursor moved without a run (initialise, skip).
    Advanced,
    /// The lease was given back (reject, not due, or a definition that must be re-decided).
    Released { backoff: Duration },
    /// Nothing written: the check named failed. For a cause that keeps the claim ours, the
    /// lease was released (at once to re-decide, or with the reject back-off).
    Refused(Refusal),
}

/// Why a lease ended without a definite outcome. The lease then decides: it expires and any
/// replica takes the row over.
#[derive(Debug, thiserror::Error)]
pub enum AdmitError {
    #[error("the lease ran out before the write could start")]
    LeaseOver,
    #[error("admission outcome unknown and not resolvable before the lease deadline: {0}")]
    OutcomeUnknown(#[source] Arc<StoreError>),
    #[error("the admit actor stopped before replying")]
    ActorGone,
    #[error("the admit actor did not answer within {0:?}")]
    Timeout(Duration),
    /// A statement failed (SQLSTATE kept in the store error); the row was released with its
    /// error back-off when that was provably safe.
    #[error(transparent)]
    Store(Arc<StoreError>),
}

impl From<StoreError> for AdmitError {
    fn from(e: StoreError) -> Self {
        AdmitError::Store(Arc::new(e))
    }
}

impl AdmitError {
    /// A persistent-looking error of this row (not an outage, not a lost fence): the
    /// supervisor grows the row's back-off.
    pub fn is_row_error(&self) -> bool {
        matches!(self, AdmitError::Store(e) if !e.is_connection_lost())
    }
}

pub type JobResult = Result<Outcome, AdmitError>;

/// The engine's context: its connection, bounds and sinks.
pub struct Engine {
    pub session: Session,
    pub log: Logger,
    pub metrics: Metrics,
    pub admit_timeout: Duration,
    pub max_retries: u32,
    pub reject_backoff: Duration,
}

impl Engine {
    /// Runs one batch; one result per job, in order.
    pub async fn process(&mut self, jobs: Vec<Job>) -> Vec<JobResult> {
        let now = Instant::now();
        let mut results: Vec<Option<JobResult>> = (0..jobs.len()).map(|_| None).collect();
        let (mut admits, mut advances) = (Vec::new(), Vec::new());
        for (i, job) in jobs.iter().enumerate() {
            if now >= job.lease_deadline {
                results[i] = Some(Err(AdmitError::LeaseOver));
                continue;
            }
            match &job.action {
                Action::Admit(_) => admits.push(i),
                Action::Advance { .. } => advances.push(i),
                Action::Release { backoff } => {
                    results[i] = Some(self.release(&job.claim, *backoff).await);
                }
            }
        }
        if !advances.is_empty() {
            let outs = self.advance(&jobs, &advances).await;
            for (i, r) in advances.into_iter().zip(outs) {
                results[i] = Some(r);
            }
        }
        if !admits.is_empty() {
            let outs = self.admit(&jobs, &admits, true).await;
            for (i, r) in admits.into_iter().zip(outs) {
                results[i] = Some(r);
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every job has a result"))
            .collect()
    }

    async fn release(&mut self, claim: &ClaimedRow, backoff: Duration) -> JobResult {
        let bound = self.admit_timeout;
        let ms = backoff.as_millis() as i64;
        let res = bounded("releasing a claim", bound, async {
            let c = self.session.client().await?;
            release::release_claim(c, &claim.trigger_id, &claim.fence, ms).await
        })
        .await;
        match res {
            Ok(true) => Ok(Outcome::Released { backoff }),
            Ok(false) => {
                self.metrics.fence_losses.inc();
                Ok(Outcome::Refused(Refusal::FenceLost))
            }
            Err(e) => {
                self.discard_if_unknown(&e);
                Err(e.into())
            }
        }
    }

    async fn advance(&mut self, jobs: &[Job], idx: &[usize]) -> Vec<JobResult> {
        let batch: Vec<(ClaimedRow, i64)> = idx
            .iter()
            .map(|&i| match &jobs[i].action {
                Action::Advance { next_fire_at_ms } => (jobs[i].claim.clone(), *next_fire_at_ms),
                _ => unreachable!("only advances are passed"),
            })
            .collect();
        let bound = self.admit_timeout;
        let res = bounded("moving cursors", bound, async {
            let c = self.session.client().await?;
            admit::advance_batch(c, &batch).await
        })
        .await;
        match res {
            Ok(moved) => moved
                .into_iter()
                .map(|m| {
                    if m {
                        Ok(Outcome::Advanced)
                    } else {
                        self.metrics.fence_losses.inc();
                        Ok(Outcome::Refused(Refusal::FenceLost))
                    }
                })
                .collect(),
            // A fenced autocommit UPDATE either moved the cursors or did not; both leave the
            // rows consistent, and the leases expire.
            Err(e) => {
                self.discard_if_unknown(&e);
                self.metrics.errors.inc();
                warn!(self.log, "moving cursors failed; the leases will expire"; "error" => %e, "batch" => batch.len());
                idx.iter()
                    .map(|_| Err(StoreError::OutcomeUnknown.into()))
                    .collect()
            }
        }
    }

    /// Admits the members `idx` of `jobs`, splitting the batch to isolate a failing member
    /// when `may_split`.
    async fn admit(&mut self, jobs: &[Job], idx: &[usize], may_split: bool) -> Vec<JobResult> {
        let batch: Vec<Admission> = idx
            .iter()
            .map(|&i| match &jobs[i].action {
                Action::Admit(a) => (**a).clone(),
                _ => unreachable!("only admissions are passed"),
            })
            .collect();
        let deadline = idx
            .iter()
            .map(|&i| jobs[i].lease_deadline)
            .min()
            .expect("non-empty");
        let mut results: Vec<Option<JobResult>> = (0..batch.len()).map(|_| None).collect();
        // Members whose earlier attempt had an unknown outcome: a later refusal may be our own
        // earlier COMMIT having won, so it is resolved by reading before it is believed.
        let mut uncertain = vec![false; batch.len()];
        let mut pending: Vec<usize> = (0..batch.len()).collect();
        let mut attempt = 0;
        while !pending.is_empty() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                for &m in &pending {
                    results[m] = Some(Err(AdmitError::LeaseOver));
                }
                break;
            }
            let group: Vec<Admission> = pending.iter().map(|&m| batch[m].clone()).collect();
            let bound = self.admit_timeout.min(remaining);
            let res = bounded("the admission transaction", bound, async {
                // Prepared once per connection: no planning per batch; its cached plans keep
                // the TID access (tests/it/plans.rs).
                let (c, stmt) = self.session.prepared(admit::ADMIT_SQL).await?;
                admit::admit_batch_prepared(c, &stmt, &group).await
            })
            .await;
            attempt += 1;
            let res = res.map_err(Arc::new);
            match res {
                Ok(outs) => {
                    let mut again = Vec::new();
                    for (&m, o) in pending.iter().zip(outs) {
                        match o {
                            AdmitOutcome::Refused { .. } if uncertain[m] => again.push(m),
                            o => {
                                results[m] = Some(self.follow_up(&jobs[idx[m]], &batch[m], o).await)
                            }
                        }
                    }
                    pending = again;
                    if !pending.is_empty() {
                        let picked: Vec<Admission> =
                            pending.iter().map(|&m| batch[m].clone()).collect();
                        match self.resolve(&picked, deadline).await {
                            Ok(res) => {
                                for (&m, r) in pending.iter().zip(res) {
                                    results[m] = Some(Ok(match r {
                                        Resolution::Committed { queued_at_ms } => {
                                            self.admitted(&batch[m], queued_at_ms)
                                        }
                                        _ => {
                                            self.metrics.fence_losses.inc();
                                            Outcome::Refused(Refusal::FenceLost)
                                        }
                                    }));
                                }
                            }
                            Err(e) => {
                                let e = Arc::new(e);
                                for &m in &pending {
                                    results[m] = Some(Err(AdmitError::OutcomeUnknown(e.clone())));
                                }
                            }
                        }
                        pending.clear();
                    }
                }
                Err(e) if e.is_serialization() && attempt <= self.max_retries => {
                    self.metrics.serialization_retries.inc();
                    debug!(self.log, "serialization failure, retrying"; "attempt" => attempt, "batch" => group.len());
                }
                Err(e) if e.is_connection_lost() => {
                    // The transaction may have committed on a backend we no longer talk to:
                    // never send anything else on that connection.
                    self.session.discard();
                    let sent = !matches!(
                        *e,
                        StoreError::PoolTimeout(_)
                            | StoreError::Timeout {
                                what: "connecting to the database",
                                ..
                            }
                    );
                    if !sent {
                        // Nothing reached the database; the lease decides.
                        self.metrics.errors.inc();
                        warn!(self.log, "database unreachable; leases left to expire"; "error" => %e, "batch" => group.len());
                        for &m in &pending {
                            results[m] = Some(Err(AdmitError::Store(e.clone())));
                        }
                        break;
                    }
                    self.metrics.unknown_outcomes.inc();
                    warn!(self.log, "admission outcome unknown; resolving by idempotency key and fence";
                          "error" => %e, "batch" => group.len());
                    match self.resolve(&group, deadline).await {
                        Ok(res) => {
                            let mut still = Vec::new();
                            for (&m, r) in pending.iter().zip(res) {
                                match r {
                                    Resolution::Committed { queued_at_ms } => {
                                        results[m] =
                                            Some(Ok(self.admitted(&batch[m], queued_at_ms)))
                                    }
                                    Resolution::NotOurs => {
                                        self.metrics.fence_losses.inc();
                                        results[m] = Some(Ok(Outcome::Refused(Refusal::FenceLost)))
                                    }
                                    // Not committed and still ours: the retry is itself fenced,
                                    // so it cannot double-admit even if the old COMMIT is
                                    // still in flight on the old backend.
                                    Resolution::NotCommittedClaimHeld
                                        if attempt <= self.max_retries =>
                                    {
                                        uncertain[m] = true;
                                        still.push(m)
                                    }
                                    Resolution::NotCommittedClaimHeld => {
                                        results[m] =
                                            Some(Err(AdmitError::OutcomeUnknown(e.clone())))
                                    }
                                }
                            }
                            pending = still;
                        }
                        Err(re) => {
                            self.metrics.errors.inc();
                            warn!(self.log, "outcome unresolved before the lease deadline; the lease decides";
                                  "error" => %re, "batch" => group.len());
                            for &m in &pending {
                                results[m] = Some(Err(AdmitError::OutcomeUnknown(e.clone())));
                            }
                            pending.clear();
                        }
                    }
                }
                Err(e) if may_split && pending.len() > 1 => {
                    // One member's failure aborted the batch: retry one by one to isolate it.
                    debug!(self.log, "batch failed; retrying its members one by one"; "error" => %e);
                    for &m in &pending {
                        let mut r = Box::pin(self.admit(jobs, &[idx[m]], false)).await;
                        results[m] = Some(r.remove(0));
                    }
                    pending.clear();
                }
                Err(e) => {
                    // A statement error of this member (the transaction rolled back): release
                    // it with its error back-off so it is not retried every round.
                    self.metrics.errors.inc();
                    for &m in &pending {
                        let job = &jobs[idx[m]];
                        warn!(self.log, "admission failed; releasing with back-off";
                              "trigger" => &job.claim.trigger_id, "error" => %e,
                              "backoff_ms" => job.error_backoff.as_millis() as u64);
                        self.metrics.error_backoffs.inc();
                        let _ = self.release(&job.claim, job.error_backoff).await;
                        results[m] = Some(Err(AdmitError::Store(e.clone())));
                    }
                    pending.clear();
                }
            }
        }
        results
            .into_iter()
            .map(|r| r.expect("every member has a result"))
            .collect()
    }

    /// Turns a definite statement outcome into the lease's end, releasing where the cause
    /// leaves the claim ours.
    async fn follow_up(&mut self, job: &Job, a: &Admission, o: AdmitOutcome) -> JobResult {
        match o {
            AdmitOutcome::Admitted { queued_at_ms } => Ok(self.admitted(a, queued_at_ms)),
            AdmitOutcome::AlreadyAdmitted => {
                self.metrics.duplicate_keys.inc();
                debug!(self.log, "occurrence already admitted; cursor advanced";
                       "trigger" => &a.claim.trigger_id, "key" => a.key());
                Ok(Outcome::AlreadyAdmitted)
            }
            AdmitOutcome::Refused { why } => {
                let backoff = match why {
                    Refusal::FenceLost => {
                        self.metrics.fence_losses.inc();
                        debug!(self.log, "admission refused: the lease is no longer ours"; "trigger" => &a.claim.trigger_id);
                        return Ok(Outcome::Refused(why));
                    }
                    Refusal::ExecutionRevisionInvalid => {
                        self.metrics.rejects.inc();
                        self.reject_backoff
                    }
                    Refusal::Unexplained => {
                        self.metrics.errors.inc();
                        self.metrics.error_backoffs.inc();
                        job.error_backoff
                    }
                    Refusal::DefinitionChanged
                    | Refusal::ProjectInactive
                    | Refusal::CursorMoved
                    | Refusal::RowMoved => {
                        self.metrics.redecides.inc();
                        Duration::ZERO
                    }
                };
                warn!(self.log, "admission refused; releasing"; "trigger" => &a.claim.trigger_id,
                      "why" => ?why, "backoff_ms" => backoff.as_millis() as u64);
                match self.release(&job.claim, backoff).await {
                    Ok(_) => Ok(Outcome::Refused(why)),
                    Err(e) => Err(e),
                }
            }
        }
    }

    /// Reads key and fence for `batch` in one statement, retrying on a fresh connection until
    /// the database answers or `deadline` passes.
    async fn resolve(
        &mut self,
        batch: &[Admission],
        deadline: Instant,
    ) -> Result<Vec<Resolution>, StoreError> {
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let bound = self
                .admit_timeout
                .min(remaining)
                .max(Duration::from_millis(1));
            let res = bounded("resolving an unknown outcome", bound, async {
                let c = self.session.client().await?;
                admit::resolve_batch(c, batch).await
            })
            .await;
            match res {
                Ok(r) => {
                    debug!(self.log, "outcome resolved"; "resolution" => ?r);
                    return Ok(r);
                }
                Err(e) => {
                    self.session.discard();
                    if Instant::now() + Duration::from_millis(200) >= deadline {
                        return Err(e);
                    }
                    debug!(self.log, "cannot resolve yet"; "error" => %e);
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        }
    }

    fn admitted(&self, a: &Admission, queued_at_ms: i64) -> Outcome {
        let lag_ms = queued_at_ms - a.scheduled_for_ms;
        self.metrics.admits.inc();
        self.metrics
            .lag_seconds
            .observe(lag_ms.max(0) as f64 / 1000.0);
        Outcome::Admitted {
            queued_at_ms,
            lag_ms,
        }
    }

    fn discard_if_unknown(&mut self, e: &StoreError) {
        if e.is_connection_lost() {
            self.session.discard();
        }
    }
}
