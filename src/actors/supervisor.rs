//! The supervisor: owns the cadence timer and the round loop, tracks claim actors, restarts
//! children that fail, and drains on stop.
//!
//! Rounds never overlap: a round claims up to the free budget in one statement and spawns a
//! claim actor per row. When a round filled its budget, or admitted an occurrence whose next
//! one was already due (a trigger behind its schedule), the next round starts as soon as the
//! last of its claim actors has reported (catch-up: a backlog drains at admission speed);
//! otherwise the next round waits for the cadence.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{debug, error, info, o, warn, Logger};
use tokio::sync::oneshot;

use super::admit::{AdmitActor, Outcome};
use super::claim::{ClaimActor, ClaimFinished, Report};
use super::Settings;
use crate::metrics::Metrics;
use crate::store::{self, claim, Pool};

/// Called on every timer tick: the systemd watchdog ping (a wedged actor system stops
/// pinging and gets restarted).
pub type Heartbeat = Arc<dyn Fn() + Send + Sync>;

pub struct Supervisor {
    settings: Settings,
    pool: Pool,
    metrics: Metrics,
    log: Logger,
    heartbeat: Option<Heartbeat>,
    admit: Option<Addr<AdmitActor>>,
    live: HashMap<u64, Addr<ClaimActor>>,
    next_child: u64,
    rounds_in_flight: u32,
    /// More is due right now: start the next round as soon as this one's actors are done.
    round_filled: bool,
    stopping: bool,
    drain_waiters: Vec<oneshot::Sender<()>>,
    /// Most rounds ever in flight at once (tests assert it stays 1).
    pub max_concurrent_rounds: u32,
    restarts: HashMap<String, u32>,
}

impl Supervisor {
    pub fn new(
        settings: Settings,
        pool: Pool,
        metrics: Metrics,
        log: &Logger,
        heartbeat: Option<Heartbeat>,
    ) -> Self {
        Supervisor {
            settings,
            pool,
            metrics,
            log: log.new(o!("actor" => "supervisor")),
            heartbeat,
            admit: None,
            live: HashMap::new(),
            next_child: 0,
            rounds_in_flight: 0,
            round_filled: false,
            stopping: false,
            drain_waiters: Vec::new(),
            max_concurrent_rounds: 0,
            restarts: HashMap::new(),
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
                let s = &self.settings;
                let addr = AdmitActor::new(
                    self.pool.clone(),
                    &self.log,
                    self.metrics.clone(),
                    s.admit_timeout,
                    s.max_serialization_retries,
                )
                .start();
                self.admit = Some(addr.clone());
                addr
            }
        }
    }

    fn round(&mut self, ctx: &mut Context<Self>) {
        if let Some(h) = &self.heartbeat {
            h();
        }
        if self.rounds_in_flight > 0 || self.stopping {
            return;
        }
        self.admit_addr();
        let free = self
            .settings
            .claim_budget
            .min(super::HARD_CLAIM_CAP)
            .saturating_sub(self.live.len() as u32);
        if free == 0 {
            return;
        }
        self.rounds_in_flight += 1;
        self.max_concurrent_rounds = self.max_concurrent_rounds.max(self.rounds_in_flight);
        self.metrics.ticks.inc();
        let pool = self.pool.clone();
        let owner = self.settings.owner.clone();
        let lease_ms = self.settings.lease.as_millis() as i64;
        let started = Instant::now();
        let bound = self.settings.admit_timeout;
        let fut = async move {
            let conn = store::conn(&pool).await?;
            // A claim that does not answer within the bound ends the round; whatever it
            // leased (if it ran at all) expires by the database clock.
            match tokio::time::timeout(
                bound,
                claim::claim_due(&conn, &owner, lease_ms, free as i64),
            )
            .await
            {
                Ok(r) => r,
                Err(_) => Err(store::StoreError::Invalid(format!(
                    "claim statement did not answer within {bound:?}"
                ))),
            }
        };
        ctx.spawn(fut.into_actor(self).map(move |res, act, ctx| {
            act.rounds_in_flight -= 1;
            match res {
                Ok(rows) => {
                    act.round_filled = rows.len() as u32 == free;
                    act.metrics.claims.inc_by(rows.len() as u64);
                    for row in rows {
                        act.spawn_claim(row, started, ctx);
                    }
                    act.metrics.live_claims.set(act.live.len() as i64);
                }
                Err(e) => {
                    act.round_filled = false;
                    act.metrics.errors.inc();
                    warn!(act.log, "claim round failed"; "error" => %e);
                }
            }
            // A stop that came while this round ran waits for it and its claim actors.
            act.maybe_drained();
        }));
    }

    fn spawn_claim(
        &mut self,
        row: claim::ClaimedRow,
        claimed_at: Instant,
        ctx: &mut Context<Self>,
    ) {
        let child = self.next_child;
        self.next_child += 1;
        let admit = self.admit_addr();
        let actor = ClaimActor::new(
            child,
            row,
            admit,
            ctx.address().recipient(),
            self.pool.clone(),
            self.settings.lease,
            self.settings.reject_backoff,
            claimed_at,
            self.metrics.clone(),
            &self.log,
        );
        self.live.insert(child, actor.start());
    }

    /// Drained = no claim actor alive and no claim statement in flight (a round that is still
    /// running may yet lease rows, which the caller releases after the drain).
    fn maybe_drained(&mut self) {
        if self.live.is_empty() && self.rounds_in_flight == 0 {
            for w in self.drain_waiters.drain(..) {
                let _ = w.send(());
            }
        }
    }
}

impl Actor for Supervisor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        // Armed here so that a restarted supervisor re-arms its timer.
        ctx.run_interval(self.settings.cadence, |act, ctx| act.round(ctx));
        self.admit_addr();
        info!(self.log, "scheduler started";
              "budget" => self.settings.claim_budget, "lease_ms" => self.settings.lease.as_millis() as u64,
              "cadence_ms" => self.settings.cadence.as_millis() as u64);
        self.round(ctx);
    }
}

impl Handler<ClaimFinished> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: ClaimFinished, ctx: &mut Self::Context) {
        self.live.remove(&msg.child);
        if msg.still_due {
            self.round_filled = true;
        }
        match msg.report {
            Report::Done(Outcome::Admitted { lag_ms, .. }) => {
                debug!(self.log, "admitted"; "trigger" => &msg.trigger_id, "lag_ms" => lag_ms);
                self.restarts.remove(&msg.trigger_id);
            }
            Report::Done(_) => {
                self.restarts.remove(&msg.trigger_id);
            }
            Report::Failed(why) => {
                self.metrics.errors.inc();
                warn!(self.log, "claim failed"; "trigger" => &msg.trigger_id, "why" => why);
            }
            Report::Crashed(claim) => {
                let n = self.restarts.entry(msg.trigger_id.clone()).or_insert(0);
                *n += 1;
                if *n <= 3 && !self.stopping {
                    self.metrics.actor_restarts.inc();
                    warn!(self.log, "claim actor stopped before reporting; restarting it"; "trigger" => &msg.trigger_id);
                    self.spawn_claim(*claim, Instant::now(), ctx);
                } else {
                    error!(self.log, "claim actor keeps failing; leaving the lease to expire"; "trigger" => &msg.trigger_id);
                }
            }
        }
        self.metrics.live_claims.set(self.live.len() as i64);
        self.maybe_drained();
        if self.live.is_empty() && self.round_filled && !self.stopping {
            // Catch-up: the round used its whole budget, or a trigger is behind its schedule,
            // so more is due right now.
            self.round_filled = false;
            self.round(ctx);
        }
    }
}

/// Stop claiming, wait up to `drain` for the live claim actors, then report how many were
/// still running (their leases are released by the caller or expire).
#[derive(Message)]
#[rtype(result = "usize")]
pub struct Drain(pub Duration);

impl Handler<Drain> for Supervisor {
    type Result = ResponseActFuture<Self, usize>;

    fn handle(&mut self, msg: Drain, _ctx: &mut Self::Context) -> Self::Result {
        self.stopping = true;
        let (tx, rx) = oneshot::channel();
        self.drain_waiters.push(tx);
        self.maybe_drained();
        Box::pin(
            async move {
                let _ = tokio::time::timeout(msg.0, rx).await;
            }
            .into_actor(self)
            .map(|_, act, _| act.live.len()),
        )
    }
}

/// A look inside, for tests and diagnostics.
#[derive(Message)]
#[rtype(result = "ProbeReport")]
pub struct Probe;

#[derive(Debug, Clone)]
pub struct ProbeReport {
    /// Most rounds ever in flight at once (never more than 1).
    pub max_concurrent_rounds: u32,
    /// Claim actors alive now.
    pub live: usize,
    /// The current admit actor.
    pub admit: Option<Addr<AdmitActor>>,
}

impl Handler<Probe> for Supervisor {
    type Result = MessageResult<Probe>;
    fn handle(&mut self, _: Probe, _: &mut Self::Context) -> Self::Result {
        MessageResult(ProbeReport {
            max_concurrent_rounds: self.max_concurrent_rounds,
            live: self.live.len(),
            admit: self.admit.clone(),
        })
    }
}
