//! The claim actor: holds exactly one lease. It runs the pure decision ([`plan`]), sends the
//! decided action to the admit actor, reports the outcome to the supervisor and stops. It
//! never touches the database: every lease write goes through the admit actor. Ids are
//! minted here, and only for decisions that admit.

use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{debug, o, Logger};
use uuid::Uuid;

use super::admit::AdmitActor;
pub use crate::engine::Kind;
use crate::engine::{Action, AdmitError, Job, Outcome};
use crate::schedule::{self, Decision, Schedule};
use crate::store::admission::Occurrence;
use crate::store::claim::ClaimedRow;

/// The decision for one claimed row, as an action for the admit actor and the kind it is
/// counted as once it committed. Pure: a function of the claimed row (and the reject
/// back-off); ids are minted only for admissions. A misfire policy that did not parse
/// where the row was read is a reject (released with back-off, diagnosed when released).
pub fn plan(claim: &ClaimedRow, reject_backoff: Duration) -> (Action, Kind) {
    let def = &claim.def;
    let timing = def.timing(&claim.trigger_id);
    let decision = match (
        &def.misfire_policy,
        Schedule::parse(&def.cron_expr, &def.timezone),
    ) {
        (Ok(policy), Ok(schedule)) => schedule::decide_timed(
            &schedule,
            *policy,
            def.misfire_grace_ms,
            &timing,
            claim.next_fire_at_ms,
            claim.observed_at_ms,
        ),
        (Err(e), _) => Decision::Reject {
            reason: e.clone().into(),
        },
        (_, Err(e)) => Decision::Reject { reason: e.into() },
    };
    let admit = |scheduled_for_ms: i64, next_fire_at_ms: i64| {
        Action::Admit(Occurrence {
            scheduled_for_ms,
            next_fire_at_ms,
            run_id: crate::store::admission::mint_run_id(&claim.fence.owner),
            attempt_id: Uuid::new_v4(),
        })
    };
    let advance = |next_fire_at_ms: i64| Action::Advance { next_fire_at_ms };
    match decision {
        Decision::Initialise { next_fire_at_ms } => (advance(next_fire_at_ms), Kind::Initialise),
        Decision::Fire {
            scheduled_for_ms,
            next_fire_at_ms,
        } => (admit(scheduled_for_ms, next_fire_at_ms), Kind::Fire),
        Decision::MisfiredFireOnce {
            scheduled_for_ms,
            next_fire_at_ms,
        } => (admit(scheduled_for_ms, next_fire_at_ms), Kind::FireOnce),
        Decision::MisfiredSkip {
            next_fire_at_ms, ..
        } => (advance(next_fire_at_ms), Kind::Skip),
        // Claimed before its time (a republish raced the claim, or a release put a jittered
        // row back at its nominal instant): give it back untouched; the release puts it at its
        // jittered instant.
        Decision::NotDue { .. } => (
            Action::Release {
                backoff: Duration::ZERO,
            },
            Kind::NotDue,
        ),
        // Past its window: the release takes the row out of the claim index.
        Decision::Ended { .. } => (
            Action::Release {
                backoff: Duration::ZERO,
            },
            Kind::Ended,
        ),
        Decision::Reject { reason } => (
            Action::Release {
                backoff: reject_backoff,
            },
            Kind::Reject(reason),
        ),
    }
}

/// How a claim actor's lease ended, as reported to the supervisor.
#[derive(Debug)]
pub enum Report {
    Done(Outcome),
    /// No definite outcome: the lease decides (it expires), unless the engine could release it.
    Failed(AdmitError),
    /// The actor stopped before reporting; the supervisor may respawn it with the same claim
    /// and the same claim time (the lease did not restart).
    Crashed {
        claim: Box<ClaimedRow>,
        claimed_at: Instant,
    },
}

#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct ClaimFinished {
    pub child: u64,
    pub trigger_id: String,
    pub report: Report,
    /// The row is due again right now (its next occurrence was already due when claimed, or
    /// it was released to be decided again): the supervisor starts the next round at once.
    pub still_due: bool,
    /// When the row's new cursor falls due (local time), if this claim moved it.
    pub next_cursor_at: Option<Instant>,
}

/// What a claim actor is given.
pub struct ClaimArgs {
    pub child: u64,
    pub claim: ClaimedRow,
    /// Local instant of the claim (the lease deadline is this + lease; kept across respawns).
    pub claimed_at: Instant,
    pub lease: Duration,
    pub reject_backoff: Duration,
    pub error_backoff: Duration,
}

pub struct ClaimActor {
    args: ClaimArgs,
    admit: Addr<AdmitActor>,
    supervisor: Recipient<ClaimFinished>,
    log: Logger,
    reported: bool,
    /// The cursor an admission moves to, if this claim admits.
    next_after_admit: Option<i64>,
    /// The cursor this claim's action moves to (admission or advance).
    next_cursor_ms: Option<i64>,
}

impl ClaimActor {
    /// `log` is the replica's root logger; the actor adds its own keys.
    pub fn new(
        args: ClaimArgs,
        admit: Addr<AdmitActor>,
        supervisor: Recipient<ClaimFinished>,
        log: &Logger,
    ) -> Self {
        let log = log.new(
            o!("actor" => "claim", "trigger" => args.claim.trigger_id.clone(),
                             "claim_version" => args.claim.fence.version),
        );
        ClaimActor {
            args,
            admit,
            supervisor,
            log,
            reported: false,
            next_after_admit: None,
            next_cursor_ms: None,
        }
    }

    fn report(&mut self, report: Report) {
        self.reported = true;
        let claim = &self.args.claim;
        let still_due = match &report {
            Report::Done(Outcome::Admitted { .. }) | Report::Done(Outcome::AlreadyAdmitted) => self
                .next_after_admit
                .is_some_and(|n| n <= claim.observed_at_ms),
            Report::Done(Outcome::Refused(why)) => why.claim_still_ours() && redecide(*why),
            _ => false,
        };
        let moved = matches!(
            &report,
            Report::Done(Outcome::Admitted { .. } | Outcome::AlreadyAdmitted | Outcome::Advanced)
        );
        let clock = crate::clock::DbClock::new(self.args.claimed_at, claim.observed_at_ms);
        let next_cursor_at = self
            .next_cursor_ms
            .filter(|_| moved)
            .map(|next| clock.local_after(next));
        self.supervisor.do_send(ClaimFinished {
            child: self.args.child,
            trigger_id: claim.trigger_id.clone(),
            report,
            still_due,
            next_cursor_at,
        });
    }
}

/// Refusals released at once so the row is decided again in the next round.
fn redecide(why: crate::store::admission::Refusal) -> bool {
    use crate::store::admission::Refusal::*;
    matches!(
        why,
        DefinitionChanged | ProjectInactive | CursorMoved | RowMoved
    )
}

impl Actor for ClaimActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        let (action, kind) = plan(&self.args.claim, self.args.reject_backoff);
        let timing = self.args.claim.def.timing(&self.args.claim.trigger_id);
        debug!(self.log, "decided"; "decision" => ?kind);
        match &action {
            // When the row is claimable next: its new cursor's jittered instant (none once the
            // cursor is past the trigger's window).
            Action::Admit(a) => {
                self.next_after_admit = timing.claimable_at_ms(a.next_fire_at_ms);
                self.next_cursor_ms = self.next_after_admit;
            }
            Action::Advance { next_fire_at_ms } => {
                self.next_cursor_ms = timing.claimable_at_ms(*next_fire_at_ms)
            }
            Action::Release { .. } => {}
        }
        if super::faults::claim_actor_should_die() {
            // Fault drill: die after deciding, before the decision is sent.
            ctx.stop();
            return;
        }
        let msg = Job {
            claim: self.args.claim.clone(),
            action,
            kind,
            // The database expiry on the local clock (docs/design.md, "Lease deadline").
            lease_deadline: crate::clock::DbClock::new(
                self.args.claimed_at,
                self.args.claim.observed_at_ms,
            )
            .local_at(self.args.claim.fence.expires_at_ms),
            error_backoff: self.args.error_backoff,
        };
        // The engine bounds its own work by the lease deadline; the extra margin covers a
        // batch that started just before it.
        let bound = self.args.lease + Duration::from_secs(5);
        ctx.wait(
            self.admit
                .send(super::admit::Admit(msg))
                .timeout(bound)
                .into_actor(self)
                .map(move |res, act, ctx| {
                    let report = match res {
                        Ok(Ok(outcome)) => Report::Done(outcome),
                        Ok(Err(e)) => Report::Failed(e),
                        Err(MailboxError::Closed) => Report::Failed(AdmitError::ActorGone),
                        Err(MailboxError::Timeout) => Report::Failed(AdmitError::Timeout(bound)),
                    };
                    act.report(report);
                    ctx.stop();
                }),
        );
    }

    fn stopped(&mut self, _ctx: &mut Self::Context) {
        if !self.reported {
            let claim = Box::new(self.args.claim.clone());
            let claimed_at = self.args.claimed_at;
            self.report(Report::Crashed { claim, claimed_at });
        }
    }
}
