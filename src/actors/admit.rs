//! The admit actor: the single writer of admissions on this replica. It runs one
//! transaction at a time. Decisions that arrive while a transaction runs are queued and go
//! together into the next one (a batch: one round trip and one WAL flush for many
//! occurrences). It retries serialization failures a bounded number of times while the
//! leases are live, isolates a failing member by retrying the batch one by one, and
//! resolves a lost COMMIT reply by key and fence.

use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{debug, o, warn, Logger};
use tokio::sync::oneshot;

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
    queue: Vec<Pending>,
    busy: bool,
}

type Reply = oneshot::Sender<Result<Outcome, StoreError>>;

struct Pending {
    msg: Apply,
    reply: Reply,
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
            queue: Vec::new(),
            busy: false,
        }
    }

    /// Takes everything queued and runs it as one batch; when done, the next batch.
    fn run_batch(&mut self, ctx: &mut Context<Self>) {
        let items = std::mem::take(&mut self.queue);
        if items.is_empty() {
            self.busy = false;
            return;
        }
        let (pool, log, metrics) = (self.pool.clone(), self.log.clone(), self.metrics.clone());
        let (timeout, retries) = (self.admit_timeout, self.max_retries);
        ctx.spawn(
            async move { process(&pool, &log, &metrics, items, timeout, retries).await }
                .into_actor(self)
                .map(|replies, act, ctx| {
                    let admitted = replies
                        .iter()
                        .any(|(_, r)| matches!(r, Ok(Outcome::Admitted { .. })));
                    if admitted && super::faults::admit_actor_should_die() {
                        // Fault drill: the transaction committed, the replies are never sent.
                        ctx.stop();
                        return;
                    }
                    for (reply, result) in replies {
                        let _ = reply.send(result);
                    }
                    act.run_batch(ctx);
                }),
        );
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
    type Result = ResponseFuture<Result<Outcome, StoreError>>;

    fn handle(&mut self, msg: Apply, ctx: &mut Self::Context) -> Self::Result {
        let (reply, rx) = oneshot::channel();
        self.queue.push(Pending { msg, reply });
        if !self.busy {
            // Start on the next turn of the event loop, so that the decisions the claim
            // actors of one round send together land in one batch.
            self.busy = true;
            ctx.run_later(Duration::ZERO, |act, ctx| act.run_batch(ctx));
        }
        Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(StoreError::Invalid(
                    "admit actor stopped before replying".into(),
                ))
            })
        })
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

/// Runs one batch: lease-expired items are refused at once, releases one by one, cursor
/// moves in one statement, admissions in one transaction.
async fn process(
    pool: &Pool,
    log: &Logger,
    metrics: &Metrics,
    items: Vec<Pending>,
    timeout: Duration,
    retries: u32,
) -> Vec<(Reply, Result<Outcome, StoreError>)> {
    let now = Instant::now();
    let mut out = Vec::with_capacity(items.len());
    let mut advances = Vec::new();
    let mut admits = Vec::new();
    for p in items {
        if now >= p.msg.lease_deadline {
            out.push((p.reply, Ok(Outcome::Refused(Refusal::FenceLost))));
            continue;
        }
        match p.msg.action {
            Action::Admit(a) => admits.push((p.reply, *a, p.msg.lease_deadline)),
            Action::Advance { next_fire_at_ms } => {
                advances.push((p.reply, p.msg.claim, next_fire_at_ms))
            }
            Action::Release { backoff } => {
                let res = release_one(pool, &p.msg.claim, backoff).await;
                out.push((p.reply, res));
            }
        }
    }
    if !advances.is_empty() {
        let batch: Vec<(ClaimedRow, i64)> =
            advances.iter().map(|(_, c, n)| (c.clone(), *n)).collect();
        let res = match store::conn(pool).await {
            Ok(conn) => {
                match tokio::time::timeout(timeout, admit::advance_batch(&conn, &batch)).await {
                    Ok(r) => r,
                    // A fenced autocommit UPDATE that timed out either moved the cursors or did
                    // not; both leave the rows consistent, and the leases expire.
                    Err(_) => Err(StoreError::OutcomeUnknown),
                }
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(moved) => {
                for ((reply, _, _), m) in advances.into_iter().zip(moved) {
                    out.push((
                        reply,
                        Ok(if m {
                            Outcome::Advanced
                        } else {
                            Outcome::Refused(Refusal::FenceLost)
                        }),
                    ));
                }
            }
            Err(e) => {
                let msg = e.to_string();
                for (reply, _, _) in advances {
                    out.push((reply, Err(StoreError::Invalid(msg.clone()))));
                }
            }
        }
    }
    if !admits.is_empty() {
        let deadline = admits.iter().map(|(_, _, d)| *d).min().expect("non-empty");
        let batch: Vec<Admission> = admits.iter().map(|(_, a, _)| a.clone()).collect();
        let results = admit_loop(pool, log, metrics, batch, deadline, timeout, retries, true).await;
        for ((reply, _, _), r) in admits.into_iter().zip(results) {
            out.push((reply, r));
        }
    }
    for (_, r) in &out {
        if let Ok(Outcome::Refused(why)) = r {
            match why {
                Refusal::DuplicateKey => metrics.duplicate_keys.inc(),
                _ => metrics.fence_losses.inc(),
            };
            warn!(log, "write refused"; "why" => ?why);
        }
    }
    out
}

async fn release_one(
    pool: &Pool,
    claim: &ClaimedRow,
    backoff: Duration,
) -> Result<Outcome, StoreError> {
    let conn = store::conn(pool).await?;
    let ms = backoff.as_millis() as i64;
    Ok(
        match release::release_claim(&conn, &claim.trigger_id, &claim.fence, ms).await? {
            true => Outcome::Released,
            false => Outcome::Refused(Refusal::FenceLost),
        },
    )
}

/// Admits a batch; returns one result per member, in order.
#[allow(clippy::too_many_arguments)]
async fn admit_loop(
    pool: &Pool,
    log: &Logger,
    metrics: &Metrics,
    batch: Vec<Admission>,
    deadline: Instant,
    timeout: Duration,
    retries: u32,
    may_split: bool,
) -> Vec<Result<Outcome, StoreError>> {
    let n = batch.len();
    let mut results: Vec<Option<Result<Outcome, StoreError>>> = (0..n).map(|_| None).collect();
    let mut pending: Vec<usize> = (0..n).collect();
    let mut attempt = 0;
    while !pending.is_empty() {
        let group: Vec<Admission> = pending.iter().map(|&i| batch[i].clone()).collect();
        let res = match store::conn(pool).await {
            Ok(mut conn) => {
                match tokio::time::timeout(timeout, admit::admit_batch(&mut conn, &group)).await {
                    Ok(r) => r,
                    Err(_) => Err(StoreError::OutcomeUnknown),
                }
            }
            Err(e) => Err(e),
        };
        match res {
            Ok(outs) => {
                for (&i, o) in pending.iter().zip(outs) {
                    results[i] = Some(Ok(match o {
                        AdmitOutcome::Admitted { queued_at_ms } => {
                            admitted(metrics, &batch[i], queued_at_ms)
                        }
                        AdmitOutcome::Refused { why } => Outcome::Refused(why),
                    }));
                }
                pending.clear();
            }
            Err(e) if e.is_serialization() && attempt < retries && Instant::now() < deadline => {
                metrics.serialization_retries.inc();
                attempt += 1;
                debug!(log, "serialization failure, retrying"; "attempt" => attempt, "batch" => group.len());
            }
            Err(e) if e.is_connection_lost() && !matches!(e, StoreError::PoolTimeout(_)) => {
                metrics.unknown_outcomes.inc();
                warn!(log, "admission outcome unknown; resolving by idempotency key and fence";
                      "error" => %e, "batch" => group.len());
                attempt += 1;
                let mut still = Vec::new();
                for &i in &pending {
                    match resolve(pool, log, &batch[i], deadline).await {
                        Ok(Resolution::Committed { queued_at_ms }) => {
                            results[i] = Some(Ok(admitted(metrics, &batch[i], queued_at_ms)))
                        }
                        Ok(Resolution::NotOurs) => {
                            results[i] = Some(Ok(Outcome::Refused(Refusal::FenceLost)))
                        }
                        // Not committed and the lease is still ours: the retry is itself
                        // fenced, so it cannot double-admit even if the old COMMIT is still
                        // in flight on the old backend.
                        Ok(Resolution::NotCommittedClaimHeld)
                            if attempt <= retries && Instant::now() < deadline =>
                        {
                            still.push(i)
                        }
                        Ok(Resolution::NotCommittedClaimHeld) => {
                            results[i] = Some(Err(StoreError::OutcomeUnknown))
                        }
                        Err(e) => results[i] = Some(Err(e)),
                    }
                }
                pending = still;
            }
            Err(e) if may_split && pending.len() > 1 => {
                // One member's failure aborted the batch: retry one by one to isolate it.
                debug!(log, "batch failed; retrying its members one by one"; "error" => %e);
                for &i in &pending {
                    let one = vec![batch[i].clone()];
                    let mut r = Box::pin(admit_loop(
                        pool, log, metrics, one, deadline, timeout, retries, false,
                    ))
                    .await;
                    results[i] = Some(r.remove(0));
                }
                pending.clear();
            }
            Err(e) => {
                let msg = e.to_string();
                for &i in &pending {
                    results[i] = Some(Err(StoreError::Invalid(msg.clone())));
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
