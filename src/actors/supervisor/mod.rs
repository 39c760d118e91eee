//! The supervisor (docs/design.md, "Actors", "Waking", "Lease deadline"): owns the cadence
//! timer and the round loop, tracks claim actors, restarts children that fail, and drains on
//! stop. In parts:
//!
//! - [`gate`]: when a round may start ([`RoundGate`]) and how a row's failures count
//!   ([`Strikes`]), pure state;
//! - [`round`]: the claim round, started in one place and never overlapping; a round claims up
//!   to the free budget in one statement and spawns a claim actor per row;
//! - [`wake`]: rounds before the cadence tick, when a row becomes claimable sooner;
//! - [`drain`]: the stop.
//!
//! The catch-up signal (`Next::AtOnce`) is raised by a round that filled its budget and by a
//! claim actor whose row is due again right now; only starting a round clears it, so no event
//! can wipe it. Under catch-up the next round starts as soon as the last claim actor has
//! reported (a backlog drains at admission speed); otherwise the timer starts it after the
//! cadence.
//!
//! Every round carries its own id, stamped on the rows it leases. A round whose reply never
//! came (client time-out, lost connection) is remembered, and its rows are released by the
//! rounds after it: a lease is never left without an actor until expiry.

mod drain;
mod gate;
mod round;
mod wake;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use actix::prelude::*;
use slog::{debug, error, info, o, warn, Logger};

pub use drain::Drain;
pub use gate::{Next, Round, RoundGate, Strikes};
pub use wake::Wake;

use super::admit::AdmitActor;
use super::claim::{ClaimActor, ClaimArgs, ClaimFinished, Report};
use super::Settings;
use crate::db::session::Session;
use crate::engine::{AdmitError, Outcome};
use crate::health::Health;
use crate::metrics::Metrics;
use crate::store::claim::ClaimedRow;

/// Called on every timer tick: the systemd watchdog ping (a wedged actor system stops
/// pinging and gets restarted).
pub type Heartbeat = Arc<dyn Fn() + Send + Sync>;

pub struct Supervisor {
    settings: Settings,
    metrics: Metrics,
    /// The replica's root logger: children derive theirs from it, never from ours.
    root_log: Logger,
    log: Logger,
    heartbeat: Option<Heartbeat>,
    health: Health,
    admit: Option<Addr<AdmitActor>>,
    live: HashMap<u64, Addr<ClaimActor>>,
    next_child: u64,
    gate: RoundGate,
    /// Consecutive respawns (actor crashes) and admission errors (the error back-off grows
    /// with them) per trigger.
    strikes: Strikes,
    round: round::RoundState,
    wake: wake::WakeState,
    drain: drain::DrainState,
}

impl Supervisor {
    /// `log` is the replica's root logger.
    pub fn new(
        settings: Settings,
        metrics: Metrics,
        log: &Logger,
        heartbeat: Option<Heartbeat>,
        health: Health,
    ) -> Self {
        Supervisor {
            // The server cancels a claim statement the round abandoned (its bound).
            round: round::RoundState::new(Session::bounded(
                settings.connector.clone(),
                settings.claim_bound(),
            )),
            settings,
            metrics,
            root_log: log.clone(),
            log: log.new(o!("actor" => "supervisor")),
            heartbeat,
            health,
            admit: None,
            live: HashMap::new(),
            next_child: 0,
            gate: RoundGate::default(),
            strikes: Strikes::default(),
            wake: wake::WakeState::default(),
            drain: drain::DrainState::default(),
        }
    }

    /// The admit actor, restarted if it has stopped.
    fn admit_addr(&mut self) -> Addr<AdmitActor> {
        match &self.admit {
            Some(a) if a.connected() => a.clone(),
            previous => {
                if previous.is_some() {
                    self.metrics.actor_restarts.inc();
                    warn!(self.log, "admit actor stopped; restarting it");
                }
                let addr =
                    AdmitActor::new(&self.settings, self.metrics.clone(), &self.root_log).start();
                self.admit = Some(addr.clone());
                addr
            }
        }
    }

    fn on_tick(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = &self.heartbeat {
            h();
        }
        if super::faults::supervisor_should_panic() {
            panic!("fault drill: supervisor panics in its round");
        }
        self.start_round(ctx);
    }

    fn spawn_claim(&mut self, claim: ClaimedRow, claimed_at: Instant, ctx: &mut Context<Self>) {
        let child = self.next_child;
        self.next_child += 1;
        let failures = self.strikes.failures(&claim.trigger_id);
        let args = ClaimArgs {
            child,
            claim,
            claimed_at,
            lease: self.settings.lease,
            reject_backoff: self.settings.reject_backoff,
            error_backoff: self.settings.error_backoff(failures + 1),
        };
        let admit = self.admit_addr();
        let actor = ClaimActor::new(args, admit, ctx.address().recipient(), &self.root_log);
        self.live.insert(child, actor.start());
    }

    /// After a round or a claim actor ended: wake drain waiters, or start the next round at
    /// once when more is due and no claim actor is alive.
    fn after_event(&mut self, ctx: &mut Context<Self>) {
        self.maybe_drained();
        if self.gate.start_at_once(self.live.len()) {
            self.start_round(ctx);
        }
    }

    fn respawn(
        &mut self,
        trigger_id: &str,
        claim: ClaimedRow,
        claimed_at: Instant,
        ctx: &mut Context<Self>,
    ) {
        let n = self.strikes.crashed(trigger_id, Instant::now());
        if n <= 3 && !self.drain.stopping {
            self.metrics.actor_restarts.inc();
            warn!(self.log, "claim actor stopped before reporting; restarting it"; "trigger" => trigger_id);
            self.spawn_claim(claim, claimed_at, ctx);
        } else {
            error!(self.log, "claim actor keeps failing; leaving the lease to expire"; "trigger" => trigger_id);
        }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Armed here so that a restarted supervisor re-arms its timer.
        ctx.run_interval(self.settings.cadence, |act, ctx| act.on_tick(ctx));
        self.admit_addr();
        self.start_listener(ctx);
        info!(self.log, "scheduler started";
              "budget" => self.settings.claim_budget, "lease_ms" => self.settings.lease.as_millis() as u64,
              "cadence_ms" => self.settings.cadence.as_millis() as u64);
        self.start_round(ctx);
    }
}

impl Handler<ClaimFinished> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: ClaimFinished, ctx: &mut Self::Context) {
        self.live.remove(&msg.child);
        if msg.still_due {
            self.gate.due_again();
        }
        if let Some(at) = msg.next_cursor_at {
            self.wake_at(at, ctx);
        }
        let trigger = msg.trigger_id;
        self.strikes.reported(&trigger, &msg.report, Instant::now());
        match msg.report {
            Report::Done(outcome) => {
                if let Outcome::Admitted { lag_ms, .. } = outcome {
                    debug!(self.log, "admitted"; "trigger" => &trigger, "lag_ms" => lag_ms);
                }
            }
            Report::Failed(e) => {
                warn!(self.log, "claim ended without a definite outcome"; "trigger" => &trigger, "error" => %e);
                if let AdmitError::ActorGone = e {
                    // Restarted on the next round; the lease expires.
                    self.admit_addr();
                }
            }
            Report::Crashed { claim, claimed_at } => {
                self.respawn(&trigger, *claim, claimed_at, ctx)
            }
        }
        self.metrics.live_claims.set(self.live.len() as i64);
        self.after_event(ctx);
    }
}

/// A look inside, for tests and diagnostics.
#[derive(Message)]
#[rtype(result = "ProbeReport")]
pub struct Probe;

#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// Claim actors alive now.
    pub live: usize,
    /// The current admit actor.
    pub admit: Option<Addr<AdmitActor>>,
    /// Rounds whose reply never came, still remembered.
    pub orphans: usize,
    /// Triggers with strikes remembered (crashes, row errors).
    pub strikes: usize,
}

impl Handler<Probe> for Supervisor {
    type Result = MessageResult<Probe>;
    fn handle(&mut self, _: Probe, _: &mut Self::Context) -> Self::Result {
        MessageResult(ProbeReport {
            live: self.live.len(),
            admit: self.admit.clone(),
            orphans: self.round.orphans.len(),
            strikes: self.strikes.len(),
        })
    }
}
