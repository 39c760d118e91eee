//! The supervisor: owns the cadence timer and the round loop, tracks claim actors, restarts
//! children that fail, and drains on stop.
//!
//! Rounds start in one place, [`Supervisor::start_round`], and never overlap: a round
//! claims up to the free budget in one statement and spawns a claim actor per row. The
//! catch-up signal (`Next::AtOnce`) is raised by a round that filled its budget and by a claim
//! actor whose row is due again right now; only starting a round clears it, so no event can
//! wipe it. Under catch-up the next round starts as soon as the last claim actor has reported
//! (a backlog drains at admission speed); otherwise the timer starts it after the cadence.
//!
//! Every round carries its own id, stamped on the rows it leases. A round whose reply never
//! came (client time-out, lost connection) is remembered, and its rows are released by the
//! rounds after it: a lease is never left without an actor until expiry.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{debug, error, info, o, warn, Logger};
use tokio::sync::oneshot;
use uuid::Uuid;

use super::admission::{AdmitError, Outcome};
use super::admit::AdmitActor;
use super::claim::{ClaimActor, ClaimArgs, ClaimFinished, Report};
use super::health::Health;
use super::Settings;
use crate::metrics::Metrics;
use crate::store::admit::Refusal;
use crate::store::claim::{self, ClaimRound, ClaimedRow};
use crate::store::session::{bounded, Session};
use crate::store::StoreError;

/// Called on every timer tick: the systemd watchdog ping (a wedged actor system stops
/// pinging and gets restarted).
pub type Heartbeat = Arc<dyn Fn() + Send + Sync>;

/// Whether a claim statement is in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Round {
    Idle,
    /// The claim statement runs (on the round connection, moved into its future).
    Claiming,
}

/// When the next round starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Next {
    /// At the next timer tick.
    AtCadence,
    /// As soon as no claim actor is alive (more is due right now).
    AtOnce,
}

/// The round state and the catch-up signal, and every transition between them. The signal
/// is raised by events (a filled round, a row due again) and cleared only by starting a
/// round, so no event can wipe a pending one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RoundGate {
    round: Round,
    next: Next,
}

impl Default for RoundGate {
    fn default() -> Self {
        RoundGate {
            round: Round::Idle,
            next: Next::AtCadence,
        }
    }
}

impl RoundGate {
    /// A round may start now (none in flight).
    pub fn idle(&self) -> bool {
        self.round == Round::Idle
    }
    /// A round started: it takes the pending signal with it.
    pub fn started(&mut self) {
        self.round = Round::Claiming;
        self.next = Next::AtCadence;
    }
    /// The round's statement ended; `filled` = it leased its whole budget.
    pub fn round_done(&mut self, filled: bool) {
        self.round = Round::Idle;
        if filled {
            self.next = Next::AtOnce;
        }
    }
    /// A claim actor's row is due again right now.
    pub fn due_again(&mut self) {
        self.next = Next::AtOnce;
    }
    /// Whether to start a round now, without waiting for the timer.
    pub fn start_at_once(&self, live_claims: usize) -> bool {
        self.idle() && live_claims == 0 && self.next == Next::AtOnce
    }
}

/// Consecutive strikes of one trigger's rows here: claim-actor crashes (respawned up to three
/// times) and admission errors of the row (each doubles its error back-off). Bounded: an
/// entry not struck for [`Settings::strike_memory`] is forgotten, since a row still ours
/// would have come back within it (its back-off and a lease); a deleted trigger or one
/// another replica took over leaves no entry behind.
#[derive(Debug, Default)]
pub struct Strikes {
    restarts: HashMap<String, (u32, Instant)>,
    failures: HashMap<String, (u32, Instant)>,
}

impl Strikes {
    /// Consecutive admission errors of this trigger's row.
    pub fn failures(&self, trigger: &str) -> u32 {
        self.failures.get(trigger).map_or(0, |e| e.0)
    }

    /// A claim actor crashed: the number of crashes in a row.
    pub fn crashed(&mut self, trigger: &str, now: Instant) -> u32 {
        strike(&mut self.restarts, trigger, now)
    }

    /// A claim actor reported. A definite outcome clears both counts, except an
    /// `Unexplained` refusal, which is an error of the row (its back-off grows); a lost
    /// fence clears them too (the row is no longer ours). A row error strikes; an outage or
    /// an unknown outcome leaves the counts as they are.
    pub fn reported(&mut self, trigger: &str, report: &Report, now: Instant) {
        match report {
            Report::Done(Outcome::Refused(Refusal::Unexplained)) => {
                self.restarts.remove(trigger);
                strike(&mut self.failures, trigger, now);
            }
            Report::Done(_) => {
                self.restarts.remove(trigger);
                self.failures.remove(trigger);
            }
            Report::Failed(e) if e.is_row_error() => {
                strike(&mut self.failures, trigger, now);
            }
            Report::Failed(_) | Report::Crashed { .. } => {}
        }
    }

    /// Drops the entries last struck `memory` or longer before `now`.
    pub fn forget_older_than(&mut self, now: Instant, memory: Duration) {
        for map in [&mut self.restarts, &mut self.failures] {
            map.retain(|_, (_, at)| now.saturating_duration_since(*at) < memory);
        }
    }

    /// Triggers with an entry (tests and diagnostics).
    pub fn len(&self) -> usize {
        let mut keys: Vec<&String> = self.restarts.keys().chain(self.failures.keys()).collect();
        keys.sort();
        keys.dedup();
        keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.restarts.is_empty() && self.failures.is_empty()
    }
}

fn strike(map: &mut HashMap<String, (u32, Instant)>, trigger: &str, now: Instant) -> u32 {
    let e = map.entry(trigger.to_string()).or_insert((0, now));
    *e = (e.0 + 1, now);
    e.0
}

pub struct Supervisor {
    settings: Settings,
    metrics: Metrics,
    /// The replica's root logger: children derive theirs from it, never from ours.
    root_log: Logger,
    log: Logger,
    heartbeat: Option<Heartbeat>,
    health: Health,
    /// The claim round's own connection; `None` while a round runs.
    session: Option<Session>,
    admit: Option<Addr<AdmitActor>>,
    live: HashMap<u64, Addr<ClaimActor>>,
    next_child: u64,
    gate: RoundGate,
    stopping: bool,
    drain_waiters: Vec<oneshot::Sender<()>>,
    /// Waiting for the claim statement in flight to end (a stop past its drain).
    round_waiters: Vec<oneshot::Sender<()>>,
    /// Consecutive respawns (actor crashes) and admission errors (the error back-off grows
    /// with them) per trigger.
    strikes: Strikes,
    /// Rounds whose reply never came, with the instant they started.
    orphans: Vec<(Uuid, Instant)>,
    /// Since when claim rounds have been failing.
    failing_since: Option<Instant>,
    /// The next precise wake-up (a row becomes claimable), before the next tick.
    wake: Option<(Instant, SpawnHandle)>,
    /// The last round's start and the database clock it observed: turns database instants
    /// into local ones (a difference of database times, so node clock skew does not matter).
    clock: Option<(Instant, i64)>,
    /// When the guard was last extended and the backlog last read (by a round).
    last_heartbeat: Option<Instant>,
    last_backlog: Option<Instant>,
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
            session: Some(Session::new(settings.connector.clone())),
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
            stopping: false,
            drain_waiters: Vec::new(),
            round_waiters: Vec::new(),
            strikes: Strikes::default(),
            orphans: Vec::new(),
            failing_since: None,
            wake: None,
            clock: None,
            last_heartbeat: None,
            last_backlog: None,
        }
    }

    /// Listens for change notifications on a dedicated connection, reconnecting with a
    /// back-off; tied to this actor's life.
    fn start_listener(&mut self, ctx: &mut Context<Self>) {
        if !self.settings.listen {
            return;
        }
        let (connector, addr, log) = (
            self.settings.connector.clone(),
            ctx.address(),
            self.log.clone(),
        );
        ctx.spawn(
            async move {
                let mut delay = Duration::from_millis(500);
                loop {
                    match crate::store::wake::listen(&connector).await {
                        Ok((client, mut rx)) => {
                            delay = Duration::from_millis(500);
                            debug!(log, "listening for change notifications");
                            while let Some(at_ms) = rx.recv().await {
                                addr.do_send(Wake { at_ms });
                            }
                            drop(client);
                            warn!(log, "change listener disconnected; changes are picked up at the cadence until it reconnects");
                        }
                        Err(e) => debug!(log, "change listener cannot connect"; "error" => %e),
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(30));
                }
            }
            .into_actor(self),
        );
    }

    /// Wakes at `at` (when a row becomes claimable) unless an earlier wake is already set or
    /// the cadence tick comes first anyway. A wake that finds a round running leaves the
    /// catch-up signal, so the round after it starts at once.
    fn wake_at(&mut self, at: Instant, ctx: &mut Context<Self>) {
        let now = Instant::now();
        if at >= now + self.settings.cadence {
            return;
        }
        if let Some((t, h)) = self.wake {
            if t <= at {
                return;
            }
            ctx.cancel_future(h);
        }
        let h = ctx.run_later(at.saturating_duration_since(now), |act, ctx| {
            act.wake = None;
            act.metrics.wakeups.inc();
            act.gate.due_again();
            act.start_round(ctx);
        });
        self.wake = Some((at, h));
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

    /// Starts a round unless one runs, the replica is stopping or the budget is used up.
    /// The only place a round starts; starting one clears the catch-up signal.
    fn start_round(&mut self, ctx: &mut Context<Self>) {
        if !self.gate.idle() || self.stopping {
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
        let Some(mut session) = self.session.take() else {
            return;
        };
        // The claim is prepared with its limit as a constant: a power of two ≤ the free budget.
        let (variant, free) = claim::claim_variant(free);
        let id = Uuid::new_v4();
        self.gate.started();
        self.metrics.ticks.inc();
        let memory = self.settings.orphan_memory();
        self.orphans.retain(|(_, at)| at.elapsed() < memory);
        self.strikes
            .forget_older_than(Instant::now(), self.settings.strike_memory());
        let orphans: Vec<Uuid> = self.orphans.iter().map(|(r, _)| *r).collect();
        let owner = self.settings.owner.clone();
        let lease_ms = self.settings.lease.as_millis() as i64;
        let bound = self.settings.claim_bound();
        let extras = self.round_extras();
        let started = Instant::now();
        let fut = async move {
            let mut released = 0;
            if !orphans.is_empty() {
                let r = bounded("releasing orphaned rounds", bound, async {
                    let c = session.client().await?;
                    crate::store::release::release_rounds(c, &owner, &orphans).await
                })
                .await;
                match r {
                    Ok(n) => released = n,
                    Err(_) => session.discard(),
                }
            }
            let res = bounded("the claim statement", bound, async {
                let (c, stmt) = session.prepared(variant).await?;
                claim::claim_round(c, &stmt, &owner, lease_ms, id, extras).await
            })
            .await;
            if res.as_ref().is_err_and(|e| e.is_connection_lost()) {
                // The statement may still run on the server: never reuse its connection.
                session.discard();
            }
            (session, released, res)
        };
        ctx.spawn(
            fut.into_actor(self)
                .map(move |(session, released, res), act, ctx| {
                    act.session = Some(session);
                    act.gate
                        .round_done(matches!(&res, Ok(r) if r.rows.len() as u32 == free));
                    for w in act.round_waiters.drain(..) {
                        let _ = w.send(());
                    }
                    act.round_done(free, id, started, released, res, ctx);
                }),
        );
    }

    /// The guard this round is conditioned on, extended every third of its TTL.
    fn round_extras(&self) -> claim::Extras {
        let every = self
            .settings
            .guard
            .map_or(Duration::MAX, |g| super::derived::guard_refresh(g.1));
        let due = !self.last_heartbeat.is_some_and(|t| t.elapsed() < every);
        claim::Extras {
            guard: self.settings.guard.map(|(incarnation, ttl)| {
                (incarnation, if due { ttl.as_millis() as i64 } else { 0 })
            }),
        }
    }

    /// The due-backlog gauges. A round that leased less than its budget left nothing due
    /// that it could take: the backlog is empty, known without a statement. After a full
    /// round the backlog is read from the claim index, at most every `backlog_interval`.
    fn update_backlog(&mut self, filled: bool, ctx: &mut Context<Self>) {
        if !filled {
            self.metrics.due_backlog.set(0);
            self.metrics.oldest_due_age_seconds.set(0.0);
            return;
        }
        if self
            .last_backlog
            .is_some_and(|t| t.elapsed() < self.settings.backlog_interval)
        {
            return;
        }
        self.last_backlog = Some(Instant::now());
        let (connector, metrics) = (self.settings.connector.clone(), self.metrics.clone());
        let bound = self.settings.claim_bound();
        ctx.spawn(
            async move {
                let res = bounded("reading the due backlog", bound, async {
                    let c = connector.connect().await?;
                    crate::store::status::due_backlog(&c).await
                })
                .await;
                if let Ok((n, oldest)) = res {
                    metrics.due_backlog.set(n);
                    metrics
                        .oldest_due_age_seconds
                        .set(oldest.unwrap_or(0).max(0) as f64 / 1000.0);
                }
            }
            .into_actor(self),
        );
    }

    #[allow(clippy::too_many_arguments)]
    fn round_done(
        &mut self,
        round_limit: u32,
        id: Uuid,
        started: Instant,
        released: u64,
        res: Result<ClaimRound, StoreError>,
        ctx: &mut Context<Self>,
    ) {
        if released > 0 {
            self.metrics.orphan_releases.inc_by(released);
            info!(self.log, "released rows of claim rounds whose reply never came"; "rows" => released);
        }
        match res {
            Ok(round) => {
                self.failing_since = None;
                self.health.set_db_failing(false);
                self.clock = Some((started, round.now_ms));
                if round.guard_extended == Some(true) {
                    self.last_heartbeat = Some(started);
                }
                if round.guard_held == Some(false) && !self.health.is_guard_lost() {
                    error!(self.log, "the replica-id guard is no longer ours (taken over after its heartbeat lapsed); claiming stopped");
                    self.health.set_guard_lost();
                }
                self.update_backlog(round.rows.len() as u32 >= round_limit, ctx);
                if let Some(next) = round.next_due_ms {
                    let wait = Duration::from_millis((next - round.now_ms).max(0) as u64 + 1);
                    self.wake_at(started + wait, ctx);
                }
                let rows = round.rows;
                self.metrics.claims.inc_by(rows.len() as u64);
                for row in rows {
                    self.spawn_claim(row, started, ctx);
                }
                self.metrics.live_claims.set(self.live.len() as i64);
            }
            Err(e) => {
                // Whatever the statement leased (if it ran at all) belongs to no actor:
                // remember the round so its rows are released.
                self.orphans.push((id, started));
                self.metrics.errors.inc();
                warn!(self.log, "claim round failed"; "error" => %e);
                let since = *self.failing_since.get_or_insert(started);
                if since.elapsed() >= self.settings.unready_after() && !self.health.is_db_failing()
                {
                    error!(self.log, "claim rounds have failed for longer than a lease; not ready";
                           "failing_ms" => since.elapsed().as_millis() as u64);
                    self.health.set_db_failing(true);
                }
            }
        }
        self.after_event(ctx);
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
        let actor = ClaimActor::new(
            args,
            admit,
            ctx.address().recipient(),
            self.metrics.clone(),
            &self.root_log,
        );
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

    /// Drained = no claim actor alive and no claim statement in flight.
    fn maybe_drained(&mut self) {
        if self.live.is_empty() && self.gate.idle() {
            for w in self.drain_waiters.drain(..) {
                let _ = w.send(());
            }
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
        if n <= 3 && !self.stopping {
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

/// A change notification: something may be claimable at `at_ms` (database clock; `None` =
/// now).
#[derive(Message, Debug)]
#[rtype(result = "()")]
pub struct Wake {
    pub at_ms: Option<i64>,
}

impl Handler<Wake> for Supervisor {
    type Result = ();

    fn handle(&mut self, msg: Wake, ctx: &mut Self::Context) {
        self.metrics.notifications.inc();
        if self.stopping {
            return;
        }
        match (msg.at_ms, self.clock) {
            (Some(at), Some((local, db))) if at > db => {
                let at = local + Duration::from_millis((at - db) as u64);
                if at > Instant::now() {
                    self.wake_at(at, ctx);
                    return;
                }
                self.gate.due_again();
                self.start_round(ctx);
            }
            _ => {
                self.gate.due_again();
                self.start_round(ctx);
            }
        }
    }
}

/// Stop claiming, wait up to `drain` for the live claim actors, then report how many were
/// still running (their leases are released by the caller or expire). A claim statement in
/// flight is always waited for (it is bounded), so that whatever it leased is released by
/// the caller too.
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
        let round_bound = self.settings.claim_bound() + Duration::from_secs(1);
        Box::pin(
            async move {
                let _ = tokio::time::timeout(msg.0, rx).await;
            }
            .into_actor(self)
            .then(move |_, act, _| {
                // Past the drain: claim actors are abandoned, but a round still in flight
                // is waited for.
                let waiting = !act.gate.idle();
                let (tx, rx) = oneshot::channel::<()>();
                if waiting {
                    act.round_waiters.push(tx);
                }
                async move {
                    if waiting {
                        let _ = tokio::time::timeout(round_bound, rx).await;
                    }
                }
                .into_actor(act)
            })
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
            orphans: self.orphans.len(),
            strikes: self.strikes.len(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{Report, RoundGate, Strikes};
    use crate::actors::admission::Outcome;
    use crate::store::admit::Refusal;

    /// An `Unexplained` refusal strikes (the back-off grows) instead of clearing the count.
    #[test]
    fn unexplained_refusals_in_a_row_count_up() {
        let (mut s, t0) = (Strikes::default(), Instant::now());
        for n in 1..=3 {
            s.reported(
                "t",
                &Report::Done(Outcome::Refused(Refusal::Unexplained)),
                t0,
            );
            assert_eq!(s.failures("t"), n);
        }
        s.reported("t", &Report::Done(Outcome::Advanced), t0);
        assert_eq!(s.failures("t"), 0, "a definite outcome clears it");
        assert!(s.is_empty());
    }

    /// A trigger that stops reporting here (deleted, or another replica took it over) is
    /// forgotten once its memory has passed; one struck again meanwhile is kept.
    #[test]
    fn strikes_of_triggers_no_longer_seen_are_forgotten() {
        let (mut s, t0) = (Strikes::default(), Instant::now());
        let memory = Duration::from_secs(100);
        s.reported(
            "gone",
            &Report::Done(Outcome::Refused(Refusal::Unexplained)),
            t0,
        );
        s.crashed("gone-too", t0);
        s.crashed("kept", t0);
        s.crashed("kept", t0 + Duration::from_secs(60));
        s.forget_older_than(t0 + Duration::from_secs(99), memory);
        assert_eq!(s.len(), 3);
        s.forget_older_than(t0 + Duration::from_secs(100), memory);
        assert_eq!(s.len(), 1, "{s:?}");
        assert_eq!(s.crashed("kept", t0 + Duration::from_secs(100)), 3);
    }

    /// A lost fence: the row is someone else's now, its counts go.
    #[test]
    fn a_lost_fence_forgets_the_row() {
        let (mut s, t0) = (Strikes::default(), Instant::now());
        s.reported(
            "t",
            &Report::Done(Outcome::Refused(Refusal::Unexplained)),
            t0,
        );
        s.crashed("t", t0);
        s.reported("t", &Report::Done(Outcome::Refused(Refusal::FenceLost)), t0);
        assert!(s.is_empty(), "{s:?}");
    }

    /// The interleaving that lost the catch-up signal: the timer starts a round while a claim
    /// actor still admits; the actor reports "due again" while that round runs; the round
    /// ends without filling its budget. The signal must survive the round's end.
    #[test]
    fn a_catch_up_signal_raised_during_a_timer_round_survives_its_end() {
        let mut gate = RoundGate::default();
        gate.started(); // the timer's round, while a claim actor is still admitting
        gate.due_again(); // the actor: its next occurrence is already due
        gate.round_done(false); // the round leased less than its budget
        assert!(gate.start_at_once(0), "catch-up lost: {gate:?}");
        gate.started();
        assert!(
            !gate.start_at_once(0),
            "starting a round consumes the signal"
        );
    }

    #[test]
    fn a_filled_round_starts_the_next_at_once_only_when_its_actors_are_done() {
        let mut gate = RoundGate::default();
        gate.started();
        gate.round_done(true);
        assert!(!gate.start_at_once(3));
        assert!(gate.start_at_once(0));
    }

    #[test]
    fn rounds_never_overlap() {
        let mut gate = RoundGate::default();
        gate.started();
        gate.due_again();
        assert!(!gate.idle());
        assert!(!gate.start_at_once(0));
    }
}
