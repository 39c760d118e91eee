//! The admit actor: the single writer of admissions on this replica. It runs one
//! transaction at a time (`AtomicResponse`), retries serialization failures a bounded number
//! of times while the lease is live, and resolves a lost COMMIT reply by key and fence.

use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{debug, o, warn, Logger};

use crate::metrics::Metrics;
use crate::store::admit::{self, Admission, AdmitOutcome, Refusal, Resolution};
use crate::store::claim::ClaimedRow;
use crate::store::{self, release, Pool, StoreError};

/// What to do with one leased row, as the claim actor decided.
#[derive(Clone, Debug)]
pub enum Action {
    /// Admit the occurrence (fire, or misfired fire_once).
    Admit(Box<Admission>),
    /// Move the cursor only (initialise, misfired skip, not due).
    Advance { next_fire_at_ms: i64 },
    /// Give the lease back, claimable again after `backoff` (reject, or shutting down).
    Release { backoff: Duration },
}

/// A decision message from a claim actor.
#[derive(Message, Debug)]
#[rtype(result = "Result<Outcome, StoreError>")]
pub struct Apply {
    pub claim: ClaimedRow,
    pub action: Action,
    /// Local monotonic instant after which the lease is surely expired (claim time + lease);
    /// work that starts later is refused without a round trip.
    pub lease_deadline: Instant,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    Admitted { queued_at_ms: i64, lag_ms: i64 },
    Advanced,
    Released,
    Refused(Refusal),
}

pub struct AdmitActor {
    pool: Pool,
    log: Logger,
    metrics: Metrics,
    admit_timeout: Duration,
    max_retries: u32,
}

impl AdmitActor {
    pub fn new(
        pool: Pool,
        log: &Logger,
        metrics: Metrics,
        admit_timeout: Duration,
        max_retries: u32,
    ) -> Self {
        AdmitActor {
            pool,
            log: log.new(o!("actor" => "admit")),
            metrics,
            admit_timeout,
            max_retries,
        }
    }
}

impl Actor for AdmitActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.set_mailbox_capacity(HARD_MAILBOX);
        debug!(self.log, "admit actor started");
    }
}

/// Mailbox bound: at most one message per live claim actor, which the hard cap bounds.
pub const HARD_MAILBOX: usize = super::HARD_CLAIM_CAP as usize * 2;

impl Handler<Apply> for AdmitActor {
    type Result = AtomicResponse<Self, Result<Outcome, StoreError>>;

    fn handle(&mut self, msg: Apply, _ctx: &mut Self::Context) -> Self::Result {
        let pool = self.pool.clone();
        let log = self.log.new(o!("trigger" => msg.claim.trigger_id.clone(), "claim_version" => msg.claim.fence.version));
        let metrics = self.metrics.clone();
        let (timeout, retries) = (self.admit_timeout, self.max_retries);
        AtomicResponse::new(Box::pin(
            async move { apply(&pool, &log, &metrics, msg, timeout, retries).await }
                .into_actor(self)
                .map(|res, _act, ctx| {
                    if matches!(res, Ok(Outcome::Admitted { .. }))
                        && super::faults::admit_actor_should_die()
                    {
                        // Fault drill: the transaction committed, the reply is never sent.
                        ctx.stop();
                    }
                    res
                }),
        ))
    }
}

/// Stops the actor (operators' and tests' way to exercise the supervisor's restart).
#[derive(Message)]
#[rtype(result = "()")]
pub struct Stop;

impl Handler<Stop> for AdmitActor {
    type Result = ();
    fn handle(&mut self, _: Stop, ctx: &mut Self::Context) {
        warn!(self.log, "admit actor asked to stop");
        ctx.stop();
    }
}

async fn apply(
    pool: &Pool,
    log: &Logger,
    metrics: &Metrics,
    msg: Apply,
    timeout: Duration,
    retries: u32,
) -> Result<Outcome, StoreError> {
    if Instant::now() >= msg.lease_deadline {
        metrics.fence_losses.inc();
        return Ok(Outcome::Refused(Refusal::FenceLost));
    }
    let out = match msg.action {
        Action::Admit(a) => {
            admit_with_retries(pool, log, metrics, &a, msg.lease_deadline, timeout, retries).await?
        }
        Action::Advance { next_fire_at_ms } => {
            let conn = store::conn(pool).await?;
            match tokio::time::timeout(
                timeout,
                admit::advance_cursor(&conn, &msg.claim, next_fire_at_ms),
            )
            .await
            {
                Ok(Ok(true)) => Outcome::Advanced,
                Ok(Ok(false)) => Outcome::Refused(Refusal::FenceLost),
                Ok(Err(e)) => return Err(e),
                // A fenced autocommit UPDATE that timed out either moved the cursor or did not;
                // both leave the row consistent, and a lost lease expires.
                Err(_) => return Err(StoreError::OutcomeUnknown),
            }
        }
        Action::Release { backoff } => {
            let conn = store::conn(pool).await?;
            let ms = backoff.as_millis() as i64;
            match release::release_claim(&conn, &msg.claim.trigger_id, &msg.claim.fence, ms).await?
            {
                true => Outcome::Released,
                false => Outcome::Refused(Refusal::FenceLost),
            }
        }
    };
    if let Outcome::Refused(why) = &out {
        match why {
            Refusal::DuplicateKey => metrics.duplicate_keys.inc(),
            _ => metrics.fence_losses.inc(),
        };
        warn!(log, "write refused"; "why" => ?why);
    }
    Ok(out)
}

async fn admit_with_retries(
    pool: &Pool,
    log: &Logger,
    metrics: &Metrics,
    a: &Admission,
    lease_deadline: Instant,
    timeout: Duration,
    retries: u32,
) -> Result<Outcome, StoreError> {
    let mut attempt = 0;
    loop {
        let res = match store::conn(pool).await {
            Ok(mut conn) => {
                match tokio::time::timeout(timeout, admit::admit_once(&mut conn, a)).await {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::OutcomeUnknown),
                }
            }
            Err(e) => return Err(e),
        };
        match res {
            Ok(AdmitOutcome::Admitted { queued_at_ms }) => {
                return Ok(admitted(metrics, a, queued_at_ms))
            }
            Ok(AdmitOutcome::Refused { why }) => return Ok(Outcome::Refused(why)),
            Err(e)
                if e.is_serialization() && attempt < retries && Instant::now() < lease_deadline =>
            {
                metrics.serialization_retries.inc();
                attempt += 1;
                debug!(log, "serialization failure, retrying"; "attempt" => attempt);
            }
            Err(e) if e.is_connection_lost() => {
                metrics.unknown_outcomes.inc();
                warn!(log, "admission outcome unknown; resolving by idempotency key and fence"; "error" => %e);
                match resolve(pool, log, a, lease_deadline).await? {
                    Resolution::Committed { queued_at_ms } => {
                        return Ok(admitted(metrics, a, queued_at_ms))
                    }
                    Resolution::NotOurs => return Ok(Outcome::Refused(Refusal::FenceLost)),
                    // Not committed and the lease is still ours: the retry is itself fenced,
                    // so it cannot double-admit even if the old COMMIT is still in flight.
                    Resolution::NotCommittedClaimHeld
                        if attempt < retries && Instant::now() < lease_deadline =>
                    {
                        attempt += 1;
                    }
                    Resolution::NotCommittedClaimHeld => return Err(StoreError::OutcomeUnknown),
                }
            }
            Err(e) => return Err(e),
        }
    }
}

/// Reads key and fence until the database answers or the lease is surely over; after that
/// the row is another replica's to decide, and the unique key still holds.
async fn resolve(
    pool: &Pool,
    log: &Logger,
    a: &Admission,
    lease_deadline: Instant,
) -> Result<Resolution, StoreError> {
    loop {
        match admit::resolve_unknown(pool, a).await {
            Ok(r) => {
                debug!(log, "outcome resolved"; "resolution" => ?r);
                return Ok(r);
            }
            Err(e) if Instant::now() < lease_deadline => {
                debug!(log, "cannot resolve yet"; "error" => %e);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    }
}

fn admitted(metrics: &Metrics, a: &Admission, queued_at_ms: i64) -> Outcome {
    let lag_ms = queued_at_ms - a.scheduled_for_ms;
    metrics.admits.inc();
    metrics.lag_seconds.observe(lag_ms.max(0) as f64 / 1000.0);
    Outcome::Admitted {
        queued_at_ms,
        lag_ms,
    }
}
