//! The admission engine: every lease write of a replica (admissions, cursor moves, releases)
//! on one dedicated connection, one batch at a time. The admit actor queues and batches; the
//! engine runs a batch to a definite, counted outcome per member:
//!
//! - serialization failures are retried a bounded number of times while the leases live;
//! - nothing sent (the connection could not be had): the leases decide, nothing to resolve;
//! - a lost COMMIT reply (or a time-out once the statement was sent) discards the connection
//!   and resolves the whole batch in one read by idempotency key and fence, retrying the read
//!   until the earliest lease deadline, after which the lease decides;
//! - a refusal is followed up by its cause: a definition that moved on is released at once
//!   (decided again on the next round), a corrupt one with the reject back-off, a lost fence
//!   not at all;
//! - a statement error isolates the failing member (one by one) and releases it with its
//!   error back-off.
//!
//! Every release a batch owes (decided releases, refusals, failed members) is written at the
//! end of the batch in one statement, bounded by the earliest lease deadline among them.
//!
//! Metrics are counted here, exactly once per outcome and when it committed: `admits` equals
//! the runs this replica committed, `initialisations` and `skips` the cursor moves that
//! committed, `rejects` the back-off releases that committed; a write that found the fence
//! lost counts as a fence loss only.

use std::sync::Arc;
use std::time::{Duration, Instant};

use slog::{debug, warn, Logger};

use crate::db::session::{bounded, Session};
use crate::db::StoreError;
use crate::metrics::Metrics;
use crate::schedule::RejectReason;
use crate::store::admission::{self, Admission, AdmitOutcome, Occurrence, Refusal, Resolution};
use crate::store::claim::ClaimedRow;
use crate::store::release;

/// What to do with one leased row, as the claim actor decided. The row itself is the job's
/// `claim` (it travels once).
#[derive(Clone, Debug)]
pub enum Action {
    /// Admit the occurrence (fire, or misfired fire_once).
    Admit(Occurrence),
    /// Move the cursor only (initialise, misfired skip).
    Advance { next_fire_at_ms: i64 },
    /// Give the lease back, claimable again after `backoff` (reject, not due).
    Release { backoff: Duration },
}

/// What the decision was: what a committed outcome is counted as.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Kind {
    Initialise,
    Fire,
    FireOnce,
    Skip,
    NotDue,
    /// The cursor is past the trigger's validity window: released out of the claim index.
    Ended,
    Reject(RejectReason),
}

/// One decided lease: what the engine runs (a claim actor hands it to the admit actor in
/// `actors::admit::Admit`).
#[derive(Clone, Debug)]
pub struct Job {
    pub claim: ClaimedRow,
    pub action: Action,
    pub kind: Kind,
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

/// One admission of a batch: which job, and whether an earlier attempt of it had an unknown
/// outcome (a later refusal may then be our own earlier COMMIT having won, so it is resolved
/// by reading before it is believed).
#[derive(Clone, Copy, Debug)]
struct Member {
    at: usize,
    uncertain: bool,
}

/// What a release the batch owes is counted as once it committed.
#[derive(Clone, Copy, Debug)]
enum Cause {
    /// A decided release (not due) or a reject, counted by the job's kind.
    Decided,
    /// A corrupt execution revision: released with the reject back-off.
    Reject,
    /// A definition that moved on: released at once to be decided again.
    Redecide,
    /// An admission error of this row (statement error, unexplained refusal).
    ErrorBackoff,
}

/// A release the batch owes: the job, its back-off, the job's result once released, and its
/// cause.
struct Owed {
    at: usize,
    backoff: Duration,
    then: JobResult,
    cause: Cause,
}

/// A batch in progress: its jobs, a result slot per job, and the releases it owes.
struct Batch<'a> {
    jobs: &'a [Job],
    results: Vec<Option<JobResult>>,
    owed: Vec<Owed>,
}

impl Batch<'_> {
    fn set(&mut self, at: usize, r: JobResult) {
        self.results[at] = Some(r);
    }

    /// The admission statement's input for member `m`: its claimed row and occurrence.
    fn admission(&self, m: Member) -> Admission<'_> {
        let job = &self.jobs[m.at];
        match &job.action {
            Action::Admit(o) => Admission::new(&job.claim, *o),
            _ => unreachable!("only admissions are members"),
        }
    }

    fn deadline(&self, ats: impl Iterator<Item = usize>) -> Option<Instant> {
        ats.map(|at| self.jobs[at].lease_deadline).min()
    }
}

impl Engine {
    /// Runs one batch; one result per job, in order.
    pub async fn process(&mut self, jobs: Vec<Job>) -> Vec<JobResult> {
        let now = Instant::now();
        let mut batch = Batch {
            jobs: &jobs,
            results: (0..jobs.len()).map(|_| None).collect(),
            owed: Vec::new(),
        };
        let (mut admits, mut advances) = (Vec::new(), Vec::new());
        for (at, job) in jobs.iter().enumerate() {
            if now >= job.lease_deadline {
                batch.set(at, Err(AdmitError::LeaseOver));
                continue;
            }
            match &job.action {
                Action::Admit(_) => admits.push(Member {
                    at,
                    uncertain: false,
                }),
                Action::Advance { .. } => advances.push(at),
                Action::Release { backoff } => batch.owed.push(Owed {
                    at,
                    backoff: *backoff,
                    then: Ok(Outcome::Released { backoff: *backoff }),
                    cause: Cause::Decided,
                }),
            }
        }
        if !advances.is_empty() {
            self.advance(&mut batch, &advances).await;
        }
        if !admits.is_empty() {
            self.admit(&mut batch, admits, true).await;
        }
        if !batch.owed.is_empty() {
            self.release_owed(&mut batch).await;
        }
        batch
            .results
            .into_iter()
            .map(|r| r.expect("every job has a result"))
            .collect()
    }

    /// Moves the cursors of `ats` in one fenced statement.
    async fn advance(&mut self, batch: &mut Batch<'_>, ats: &[usize]) {
        let moves: Vec<(ClaimedRow, i64)> = ats
            .iter()
            .map(|&at| match &batch.jobs[at].action {
                Action::Advance { next_fire_at_ms } => {
                    (batch.jobs[at].claim.clone(), *next_fire_at_ms)
                }
                _ => unreachable!("only advances are passed"),
            })
            .collect();
        let bound = self.admit_timeout;
        let res = bounded("moving cursors", bound, async {
            let c = self.session.client().await?;
            admission::advance_batch(c, &moves).await
        })
        .await;
        match res {
            Ok(moved) => {
                for (&at, m) in ats.iter().zip(moved) {
                    let r = if m {
                        self.count_advanced(&batch.jobs[at].kind);
                        Outcome::Advanced
                    } else {
                        self.fence_lost()
                    };
                    batch.set(at, Ok(r));
                }
            }
            // A fenced autocommit UPDATE either moved the cursors or did not; both leave the
            // rows consistent, and the leases expire.
            Err(e) => {
                self.discard_if_unknown(&e);
                self.metrics.errors.inc();
                warn!(self.log, "moving cursors failed; the leases will expire"; "error" => %e, "batch" => moves.len());
                let e = Arc::new(e);
                for &at in ats {
                    batch.set(at, Err(AdmitError::Store(e.clone())));
                }
            }
        }
    }

    /// Admits `pending` until each has a definite outcome or the earliest lease deadline
    /// passes, splitting the batch to isolate a failing member when `may_split`.
    async fn admit(&mut self, batch: &mut Batch<'_>, mut pending: Vec<Member>, may_split: bool) {
        let Some(deadline) = batch.deadline(pending.iter().map(|m| m.at)) else {
            return;
        };
        let mut attempt = 0;
        while !pending.is_empty() {
            let remaining = deadline.saturating_duration_since(Instant::now());
            if remaining.is_zero() {
                for m in pending {
                    batch.set(m.at, Err(AdmitError::LeaseOver));
                }
                return;
            }
            attempt += 1;
            match self.attempt(batch, &pending, remaining).await {
                Ok(outs) => return self.on_outcomes(batch, pending, outs, deadline).await,
                Err(e) if e.is_serialization() && attempt <= self.max_retries => {
                    self.metrics.serialization_retries.inc();
                    debug!(self.log, "serialization failure, retrying"; "attempt" => attempt, "batch" => pending.len());
                }
                // Nothing sent because the database could not be reached: nothing to
                // resolve. (Nothing sent because the session's setup or a prepare failed with
                // a statement error is a statement error, handled below.)
                Err(e) if !e.reached_server() && e.is_connection_lost() => {
                    return self.unreachable(batch, &pending, e)
                }
                Err(e) if e.is_connection_lost() => {
                    pending = self
                        .on_unknown_outcome(batch, pending, e, attempt, deadline)
                        .await;
                }
                Err(e) if may_split && pending.len() > 1 => {
                    return self.isolate_members(batch, pending, e).await
                }
                Err(e) => return self.release_failed(batch, &pending, e),
            }
        }
    }

    /// One admission transaction for `pending`, within `remaining` (and the admission bound).
    /// Getting the connection ready is bounded apart from the statement, so that a failure
    /// before the statement was sent is [`StoreError::NotSent`].
    async fn attempt(
        &mut self,
        batch: &Batch<'_>,
        pending: &[Member],
        remaining: Duration,
    ) -> Result<Vec<AdmitOutcome>, Arc<StoreError>> {
        let group: Vec<Admission> = pending.iter().map(|&m| batch.admission(m)).collect();
        let bound = self.admit_timeout.min(remaining);
        let started = Instant::now();
        // Prepared once per connection: no planning per batch; its cached plans keep the TID
        // access (tests/it/plans.rs).
        let (c, stmt) = self
            .session
            .prepared_within(admission::ADMIT_SQL, bound)
            .await?;
        let left = bound
            .saturating_sub(started.elapsed())
            .max(Duration::from_millis(1));
        bounded(
            "the admission transaction",
            left,
            admission::admit_batch_prepared(c, &stmt, &group),
        )
        .await
        .map_err(Arc::new)
    }

    /// Definite outcomes of an attempt: each member's follow-up; a refusal of an uncertain
    /// member is first resolved by reading (it may be our own earlier COMMIT having won).
    async fn on_outcomes(
        &mut self,
        batch: &mut Batch<'_>,
        pending: Vec<Member>,
        outs: Vec<AdmitOutcome>,
        deadline: Instant,
    ) {
        let mut doubtful = Vec::new();
        for (m, o) in pending.into_iter().zip(outs) {
            match o {
                AdmitOutcome::Refused { why } if m.uncertain => doubtful.push((m, why)),
                o => self.follow_up(batch, m, o),
            }
        }
        if doubtful.is_empty() {
            return;
        }
        let members: Vec<Member> = doubtful.iter().map(|(m, _)| *m).collect();
        match self.resolve(batch, &members, deadline).await {
            Ok(res) => {
                for ((m, why), r) in doubtful.into_iter().zip(res) {
                    match r {
                        Resolution::Committed { queued_at_ms } => {
                            let r = self.admitted(&batch.jobs[m.at], queued_at_ms);
                            batch.set(m.at, Ok(r));
                        }
                        Resolution::NotOurs => batch.set(m.at, Ok(self.fence_lost())),
                        // Our earlier attempt did not commit and the claim is still ours: the
                        // refusal stands, with its own follow-up.
                        Resolution::NotCommittedClaimHeld => {
                            self.follow_up(batch, m, AdmitOutcome::Refused { why })
                        }
                    }
                }
            }
            Err(e) => {
                let e = Arc::new(e);
                for (m, _) in doubtful {
                    batch.set(m.at, Err(AdmitError::OutcomeUnknown(e.clone())));
                }
            }
        }
    }

    /// The statement may have reached the server and its outcome is unknown: resolve the
    /// batch in one read. Returns the members to try again (not committed, claim still ours:
    /// the retry is itself fenced, so it cannot double-admit even if the old COMMIT is still
    /// in flight on the old backend).
    async fn on_unknown_outcome(
        &mut self,
        batch: &mut Batch<'_>,
        pending: Vec<Member>,
        e: Arc<StoreError>,
        attempt: u32,
        deadline: Instant,
    ) -> Vec<Member> {
        // The transaction may have committed on a backend we no longer talk to: never send
        // anything else on that connection.
        self.session.discard();
        self.metrics.unknown_outcomes.inc();
        warn!(self.log, "admission outcome unknown; resolving by idempotency key and fence";
              "error" => %e, "batch" => pending.len());
        let res = match self.resolve(batch, &pending, deadline).await {
            Ok(res) => res,
            Err(re) => {
                self.metrics.errors.inc();
                warn!(self.log, "outcome unresolved before the lease deadline; the lease decides";
                      "error" => %re, "batch" => pending.len());
                for m in pending {
                    batch.set(m.at, Err(AdmitError::OutcomeUnknown(e.clone())));
                }
                return Vec::new();
            }
        };
        let mut again = Vec::new();
        for (m, r) in pending.into_iter().zip(res) {
            match r {
                Resolution::Committed { queued_at_ms } => {
                    let r = self.admitted(&batch.jobs[m.at], queued_at_ms);
                    batch.set(m.at, Ok(r));
                }
                Resolution::NotOurs => batch.set(m.at, Ok(self.fence_lost())),
                Resolution::NotCommittedClaimHeld if attempt <= self.max_retries => {
                    again.push(Member {
                        uncertain: true,
                        ..m
                    })
                }
                Resolution::NotCommittedClaimHeld => {
                    batch.set(m.at, Err(AdmitError::OutcomeUnknown(e.clone())))
                }
            }
        }
        again
    }

    /// Nothing reached the database: nothing to resolve, the leases decide.
    fn unreachable(&mut self, batch: &mut Batch<'_>, pending: &[Member], e: Arc<StoreError>) {
        self.discard_if_unknown(&e);
        self.metrics.errors.inc();
        warn!(self.log, "database unreachable; leases left to expire"; "error" => %e, "batch" => pending.len());
        for m in pending {
            batch.set(m.at, Err(AdmitError::Store(e.clone())));
        }
    }

    /// One member's failure aborted the batch: try the members one by one to isolate it,
    /// each keeping its own `uncertain` flag.
    async fn isolate_members(
        &mut self,
        batch: &mut Batch<'_>,
        pending: Vec<Member>,
        e: Arc<StoreError>,
    ) {
        debug!(self.log, "batch failed; retrying its members one by one"; "error" => %e);
        for m in pending {
            Box::pin(self.admit(batch, vec![m], false)).await;
        }
    }

    /// A statement error of these members (the transaction rolled back): release them with
    /// their error back-off so that they are not retried every round.
    fn release_failed(&mut self, batch: &mut Batch<'_>, pending: &[Member], e: Arc<StoreError>) {
        self.metrics.errors.inc();
        for m in pending {
            let job = &batch.jobs[m.at];
            warn!(self.log, "admission failed; releasing with back-off";
                  "trigger" => &job.claim.trigger_id, "error" => %e,
                  "backoff_ms" => job.error_backoff.as_millis() as u64);
            batch.owed.push(Owed {
                at: m.at,
                backoff: job.error_backoff,
                then: Err(AdmitError::Store(e.clone())),
                cause: Cause::ErrorBackoff,
            });
        }
    }

    /// Turns a definite statement outcome into the lease's end; a refusal that leaves the
    /// claim ours owes a release.
    fn follow_up(&mut self, batch: &mut Batch<'_>, m: Member, o: AdmitOutcome) {
        let job = &batch.jobs[m.at];
        let trigger = &job.claim.trigger_id;
        let (why, backoff, cause) = match o {
            AdmitOutcome::Admitted { queued_at_ms } => {
                let r = self.admitted(job, queued_at_ms);
                return batch.set(m.at, Ok(r));
            }
            AdmitOutcome::Overlap => {
                self.metrics.overlap_skips.inc();
                debug!(self.log, "occurrence not admitted by the overlap policy; cursor advanced";
                       "trigger" => trigger, "key" => batch.admission(m).key());
                return batch.set(m.at, Ok(Outcome::AlreadyAdmitted));
            }
            AdmitOutcome::AlreadyAdmitted => {
                self.metrics.duplicate_keys.inc();
                debug!(self.log, "occurrence already admitted; cursor advanced";
                       "trigger" => trigger, "key" => batch.admission(m).key());
                return batch.set(m.at, Ok(Outcome::AlreadyAdmitted));
            }
            AdmitOutcome::Refused { why } => match why {
                Refusal::FenceLost => {
                    debug!(self.log, "admission refused: the lease is no longer ours"; "trigger" => trigger);
                    return batch.set(m.at, Ok(self.fence_lost()));
                }
                Refusal::ExecutionRevisionInvalid => (why, self.reject_backoff, Cause::Reject),
                Refusal::Unexplained => {
                    self.metrics.errors.inc();
                    (why, job.error_backoff, Cause::ErrorBackoff)
                }
                Refusal::DefinitionChanged
                | Refusal::ProjectInactive
                | Refusal::CursorMoved
                | Refusal::RowMoved => (why, Duration::ZERO, Cause::Redecide),
            },
        };
        warn!(self.log, "admission refused; releasing"; "trigger" => trigger,
              "why" => ?why, "backoff_ms" => backoff.as_millis() as u64);
        batch.owed.push(Owed {
            at: m.at,
            backoff,
            then: Ok(Outcome::Refused(why)),
            cause,
        });
    }

    /// Writes every release the batch owes in one statement, bounded by the earliest lease
    /// deadline among them (and the admission bound); each is counted once it committed.
    async fn release_owed(&mut self, batch: &mut Batch<'_>) {
        let owed = std::mem::take(&mut batch.owed);
        let deadline = batch
            .deadline(owed.iter().map(|o| o.at))
            .expect("non-empty");
        let remaining = deadline.saturating_duration_since(Instant::now());
        if remaining.is_zero() {
            for o in owed {
                // A failed member keeps its own error (the supervisor grows its back-off).
                let r = o.then.and(Err(AdmitError::LeaseOver));
                batch.set(o.at, r);
            }
            return;
        }
        let rows: Vec<(&str, &crate::store::claim::Fence, i64)> = owed
            .iter()
            .map(|o| {
                let c = &batch.jobs[o.at].claim;
                (
                    c.trigger_id.as_str(),
                    &c.fence,
                    o.backoff.as_millis() as i64,
                )
            })
            .collect();
        let bound = self.admit_timeout.min(remaining);
        let started = Instant::now();
        let res = match self.session.client_within(bound).await {
            Ok(c) => {
                let left = bound
                    .saturating_sub(started.elapsed())
                    .max(Duration::from_millis(1));
                bounded("releasing claims", left, release::release_batch(c, &rows)).await
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(released) => {
                for (o, ok) in owed.into_iter().zip(released) {
                    let r = if ok {
                        self.count_released(&batch.jobs[o.at], o.cause);
                        o.then
                    } else {
                        let lost = self.fence_lost();
                        o.then.map(|_| lost)
                    };
                    batch.set(o.at, r);
                }
            }
            Err(e) => {
                self.discard_if_unknown(&e);
                self.metrics.errors.inc();
                warn!(self.log, "releasing claims failed; the leases will expire"; "error" => %e, "batch" => owed.len());
                let e = Arc::new(e);
                for o in owed {
                    let r = o.then.and(Err(AdmitError::Store(e.clone())));
                    batch.set(o.at, r);
                }
            }
        }
    }

    /// Reads key and fence for `members` in one statement, retrying on a fresh connection
    /// until the database answers or `deadline` passes.
    async fn resolve(
        &mut self,
        batch: &Batch<'_>,
        members: &[Member],
        deadline: Instant,
    ) -> Result<Vec<Resolution>, StoreError> {
        let group: Vec<Admission> = members.iter().map(|&m| batch.admission(m)).collect();
        loop {
            let remaining = deadline.saturating_duration_since(Instant::now());
            let bound = self
                .admit_timeout
                .min(remaining)
                .max(Duration::from_millis(1));
            let res = bounded("resolving an unknown outcome", bound, async {
                let c = self.session.client().await?;
                admission::resolve_batch(c, &group).await
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

    /// Our run committed: counted, and its lag observed by kind (on time or misfired), from
    /// the instant the occurrence was due (its jittered instant under a jitter).
    fn admitted(&self, job: &Job, queued_at_ms: i64) -> Outcome {
        let scheduled_for_ms = match &job.action {
            Action::Admit(o) => o.scheduled_for_ms,
            _ => unreachable!("only admissions are admitted"),
        };
        let due_at_ms = job
            .claim
            .def
            .timing(&job.claim.trigger_id)
            .due_at_ms(scheduled_for_ms);
        let lag_ms = queued_at_ms - due_at_ms;
        self.metrics.admits.inc();
        let lag = lag_ms.max(0) as f64 / 1000.0;
        match job.kind {
            Kind::FireOnce => self.metrics.misfire_lag_seconds.observe(lag),
            _ => self.metrics.lag_seconds.observe(lag),
        }
        Outcome::Admitted {
            queued_at_ms,
            lag_ms,
        }
    }

    /// A write found the claim no longer ours: counted as that and nothing else.
    fn fence_lost(&self) -> Outcome {
        self.metrics.fence_losses.inc();
        Outcome::Refused(Refusal::FenceLost)
    }

    fn count_advanced(&self, kind: &Kind) {
        match kind {
            Kind::Initialise => self.metrics.initialisations.inc(),
            Kind::Skip => self.metrics.skips.inc(),
            _ => 0,
        };
    }

    fn count_released(&self, job: &Job, cause: Cause) {
        match (cause, &job.kind) {
            (Cause::Decided, Kind::Reject(reason)) => {
                self.metrics.rejects.inc();
                warn!(self.log, "definition rejected; released with back-off";
                      "trigger" => &job.claim.trigger_id, "reason" => %reason,
                      "backoff_ms" => self.reject_backoff.as_millis() as u64);
            }
            (Cause::Decided, _) => {}
            (Cause::Reject, _) => {
                self.metrics.rejects.inc();
            }
            (Cause::Redecide, _) => {
                self.metrics.redecides.inc();
            }
            (Cause::ErrorBackoff, _) => {
                self.metrics.error_backoffs.inc();
            }
        }
    }

    fn discard_if_unknown(&mut self, e: &StoreError) {
        if e.is_connection_lost() {
            self.session.discard();
        }
    }
}
