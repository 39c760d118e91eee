//! The claim actor: holds exactly one lease. It runs the pure decision, sends the decision
//! to the admit actor, reports the outcome to the supervisor and stops. Ids are minted here,
//! and only for decisions that admit.

use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{o, warn, Logger};
use uuid::Uuid;

use super::admit::{Action, AdmitActor, Apply, Outcome};
use crate::metrics::Metrics;
use crate::schedule::{self, Decision, MisfirePolicy};
use crate::store::admit::{Admission, Refusal, Resolution};
use crate::store::claim::ClaimedRow;
use crate::store::{self, release, Pool};

/// How a claim actor's lease ended, as reported to the supervisor.
#[derive(Clone, Debug)]
pub enum Report {
    Done(Outcome),
    /// The decision could not be applied (database unreachable, admit actor gone); the
    /// lease was released when that was provably safe, else it expires.
    Failed(String),
    /// The actor stopped before reporting; the supervisor may respawn it from `claim`.
    Crashed(Box<ClaimedRow>),
}

#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ClaimFinished {
    pub child: u64,
    pub trigger_id: String,
    pub report: Report,
    /// The admitted occurrence's next one was already due when the row was claimed (the
    /// trigger is behind its schedule): the supervisor starts the next round at once.
    pub still_due: bool,
}

pub struct ClaimActor {
    pub child: u64,
    pub claim: ClaimedRow,
    pub admit: Addr<AdmitActor>,
    pub supervisor: Recipient<ClaimFinished>,
    pub pool: Pool,
    pub lease: Duration,
    pub reject_backoff: Duration,
    pub claimed_at: Instant,
    pub metrics: Metrics,
    pub log: Logger,
    reported: bool,
    /// The cursor an admission moves to, if this claim admits.
    next_after_admit: Option<i64>,
}

impl ClaimActor {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        child: u64,
        claim: ClaimedRow,
        admit: Addr<AdmitActor>,
        supervisor: Recipient<ClaimFinished>,
        pool: Pool,
        lease: Duration,
        reject_backoff: Duration,
        claimed_at: Instant,
        metrics: Metrics,
        log: &Logger,
    ) -> Self {
        let log = log
            .new(o!("trigger" => claim.trigger_id.clone(), "claim_version" => claim.fence.version));
        ClaimActor {
            child,
            claim,
            admit,
            supervisor,
            pool,
            lease,
            reject_backoff,
            claimed_at,
            metrics,
            log,
            reported: false,
            next_after_admit: None,
        }
    }

    /// The pure decision (SPEC §4) turned into an action; ids minted only for admissions.
    pub fn decide(
        claim: &ClaimedRow,
        reject_backoff: Duration,
        metrics: &Metrics,
        log: &Logger,
    ) -> Action {
        let def = &claim.def;
        let policy = match def.misfire_policy.parse::<MisfirePolicy>() {
            Ok(p) => p,
            Err(e) => return reject(metrics, log, &e.to_string(), reject_backoff),
        };
        let decision = schedule::decide(
            &def.cron_expr,
            &def.timezone,
            policy,
            def.misfire_grace_ms,
            claim.next_fire_at_ms,
            claim.observed_at_ms,
        );
        let admit = |scheduled_for_ms: i64, next_fire_at_ms: i64| {
            Action::Admit(Box::new(Admission {
                claim: claim.clone(),
                scheduled_for_ms,
                next_fire_at_ms,
                run_id: crate::store::admit::mint_run_id(&claim.fence.owner),
                attempt_id: Uuid::new_v4(),
                admitted_by: claim.fence.owner.clone(),
            }))
        };
        match decision {
            Decision::Initialise { next_fire_at_ms } => {
                metrics.initialisations.inc();
                Action::Advance { next_fire_at_ms }
            }
            Decision::Fire {
                scheduled_for_ms,
                next_fire_at_ms,
            } => admit(scheduled_for_ms, next_fire_at_ms),
            Decision::MisfiredFireOnce {
                scheduled_for_ms,
                next_fire_at_ms,
            } => admit(scheduled_for_ms, next_fire_at_ms),
            Decision::MisfiredSkip {
                next_fire_at_ms, ..
            } => {
                metrics.skips.inc();
                Action::Advance { next_fire_at_ms }
            }
            // Claimed before its time (a republish raced the claim): give it back untouched.
            Decision::NotDue { .. } => Action::Release {
                backoff: Duration::ZERO,
            },
            Decision::Reject { reason } => reject(metrics, log, &reason, reject_backoff),
        }
    }

    fn report(&mut self, report: Report) {
        self.reported = true;
        let admitted = matches!(report, Report::Done(Outcome::Admitted { .. }));
        let still_due = admitted
            && self
                .next_after_admit
                .is_some_and(|n| n <= self.claim.observed_at_ms);
        self.supervisor.do_send(ClaimFinished {
            child: self.child,
            trigger_id: self.claim.trigger_id.clone(),
            report,
            still_due,
        });
    }
}

fn reject(metrics: &Metrics, log: &Logger, reason: &str, backoff: Duration) -> Action {
    metrics.rejects.inc();
    warn!(log, "definition rejected; releasing with back-off"; "reason" => reason, "backoff_ms" => backoff.as_millis() as u64);
    Action::Release { backoff }
}

impl Actor for ClaimActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let action = Self::decide(&self.claim, self.reject_backoff, &self.metrics, &self.log);
        if let Action::Admit(a) = &action {
            self.next_after_admit = Some(a.next_fire_at_ms);
        }
        if super::faults::claim_actor_should_die() {
            // Fault drill: die after deciding, before the decision is sent.
            ctx.stop();
            return;
        }
        let lease_deadline = self.claimed_at + self.lease;
        let msg = Apply {
            claim: self.claim.clone(),
            action: action.clone(),
            lease_deadline,
        };
        let send = self.admit.send(msg).timeout(self.lease);
        let pool = self.pool.clone();
        let claim = self.claim.clone();
        let log = self.log.clone();
        let admit = self.admit.clone();
        let (backoff, metrics) = (self.reject_backoff, self.metrics.clone());
        ctx.wait(
            async move {
                match send.await {
                    Ok(Ok(Outcome::Refused(why @ (Refusal::CorruptExecutionRevision | Refusal::DefinitionChanged)))) => {
                        // Fail closed: nothing was admitted; give the row back with a back-off
                        // so a broken definition is not retried every round.
                        metrics.rejects.inc();
                        warn!(log, "admission refused by the definition checks; releasing with back-off";
                              "why" => ?why, "backoff_ms" => backoff.as_millis() as u64);
                        let release = Apply { claim, action: Action::Release { backoff }, lease_deadline };
                        let _ = admit.send(release).await;
                        Report::Done(Outcome::Refused(why))
                    }
                    Ok(Ok(outcome)) => Report::Done(outcome),
                    Ok(Err(e)) => {
                        Report::Failed(settle(&pool, &claim, &action, &log, &e.to_string()).await)
                    }
                    Err(e) => Report::Failed(
                        settle(&pool, &claim, &action, &log, &format!("admit actor: {e}")).await,
                    ),
                }
            }
            .into_actor(self)
            .map(|report, act, ctx| {
                act.report(report);
                ctx.stop();
            }),
        );
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        if !self.reported {
            let claim = Box::new(self.claim.clone());
            self.report(Report::Crashed(claim));
        }
    }
}

/// After a failed apply, leave the row in a provable state: if the admission may have
/// committed, read key and fence; release the lease only when nothing was written and the
/// claim is still ours. Otherwise the lease simply expires.
async fn settle(
    pool: &Pool,
    claim: &ClaimedRow,
    action: &Action,
    log: &Logger,
    error: &str,
) -> String {
    if let Action::Admit(a) = action {
        match store::admit::resolve_unknown(pool, a).await {
            Ok(Resolution::Committed { .. }) => return format!("{error}; resolved: committed"),
            Ok(Resolution::NotOurs) => return format!("{error}; resolved: lease no longer ours"),
            Ok(Resolution::NotCommittedClaimHeld) => {}
            Err(e) => {
                warn!(log, "apply failed and outcome unresolved; lease will expire"; "error" => error, "resolve_error" => %e);
                return format!("{error}; unresolved, lease left to expire");
            }
        }
    }
    let released = match store::conn(pool).await {
        Ok(conn) => release::release_claim(&conn, &claim.trigger_id, &claim.fence, 0)
            .await
            .unwrap_or(false),
        Err(_) => false,
    };
    warn!(log, "apply failed"; "error" => error, "released" => released);
    format!("{error}; released: {released}")
}
