//! The claim round: the only place a round starts ([`Supervisor::start_round`]), its one
//! statement on the round's own connection (release orphaned rounds, claim, extend the
//! guard), and what its reply sets off (claim actors, the next wake, the backlog gauges,
//! readiness, the guard's loss).

use std::time::{Duration, Instant};

use actix::prelude::*;
use slog::{error, info, warn};
use uuid::Uuid;

use super::Supervisor;
use crate::clock::DbClock;
use crate::db::session::{bounded, Session};
use crate::db::StoreError;
use crate::store::claim::{self, ClaimRound};

/// The round's state between rounds.
pub(super) struct RoundState {
    /// The claim round's own connection; `None` while a round runs.
    pub(super) session: Option<Session>,
    /// Rounds whose reply never came, with the instant they started.
    pub(super) orphans: Vec<(Uuid, Instant)>,
    /// Since when claim rounds have been failing.
    pub(super) failing_since: Option<Instant>,
    /// When the guard was last extended and the backlog last read (by a round).
    pub(super) last_heartbeat: Option<Instant>,
    pub(super) last_backlog: Option<Instant>,
}

impl RoundState {
    pub(super) fn new(session: Session) -> RoundState {
        RoundState {
            session: Some(session),
            orphans: Vec::new(),
            failing_since: None,
            last_heartbeat: None,
            last_backlog: None,
        }
    }
}

/// What one round asks of the database, fixed when it starts.
struct RoundPlan {
    id: Uuid,
    /// The prepared claim variant and the limit it carries.
    variant: &'static str,
    limit: u32,
    orphans: Vec<Uuid>,
    owner: String,
    lease_ms: i64,
    bound: Duration,
    extras: claim::Extras,
}

/// What came back: the connection, the rows of orphaned rounds released, the claim's result.
type RoundReply = (Session, u64, Result<ClaimRound, StoreError>);

impl Supervisor {
    /// Starts a round unless one runs, the replica is stopping or the budget is used up.
    /// The only place a round starts; starting one clears the catch-up signal.
    pub(super) fn start_round(&mut self, ctx: &mut Context<Self>) {
        if !self.gate.idle() || self.drain.stopping {
            return;
        }
        self.admit_addr();
        let free = self
            .settings
            .claim_budget
            .min(crate::actors::HARD_CLAIM_CAP)
            .saturating_sub(self.live.len() as u32);
        if free == 0 {
            return;
        }
        let Some(session) = self.round.session.take() else {
            return;
        };
        self.gate.started();
        self.metrics.ticks.inc();
        let plan = self.plan_round(free);
        let (id, limit, started) = (plan.id, plan.limit, Instant::now());
        ctx.spawn(run_round(session, plan).into_actor(self).map(
            move |(session, released, res), act, ctx| {
                act.round.session = Some(session);
                act.gate
                    .round_done(matches!(&res, Ok(r) if r.rows.len() as u32 == limit));
                act.round_ended();
                act.round_done(limit, id, started, released, res, ctx);
            },
        ));
    }

    /// Forgets what has aged out and fixes the round's terms.
    fn plan_round(&mut self, free: u32) -> RoundPlan {
        let memory = self.settings.orphan_memory();
        self.round.orphans.retain(|(_, at)| at.elapsed() < memory);
        self.strikes
            .forget_older_than(Instant::now(), self.settings.strike_memory());
        // The claim is prepared with its limit as a constant: a power of two ≤ the free budget.
        let (variant, limit) = claim::claim_variant(free);
        RoundPlan {
            id: Uuid::new_v4(),
            variant,
            limit,
            orphans: self.round.orphans.iter().map(|(r, _)| *r).collect(),
            owner: self.settings.owner.clone(),
            lease_ms: self.settings.lease.as_millis() as i64,
            bound: self.settings.claim_bound(),
            extras: self.round_extras(),
        }
    }

    /// The guard this round is conditioned on, extended every third of its TTL.
    fn round_extras(&self) -> claim::Extras {
        let every = self.settings.guard.map_or(Duration::MAX, |g| {
            crate::actors::derived::guard_refresh(g.1)
        });
        let due = !self
            .round
            .last_heartbeat
            .is_some_and(|t| t.elapsed() < every);
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
            .round
            .last_backlog
            .is_some_and(|t| t.elapsed() < self.settings.backlog_interval)
        {
            return;
        }
        self.round.last_backlog = Some(Instant::now());
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

    fn round_done(
        &mut self,
        limit: u32,
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
            Ok(round) => self.round_succeeded(limit, started, round, ctx),
            Err(e) => self.round_failed(id, started, e),
        }
        self.after_event(ctx);
    }

    fn round_succeeded(
        &mut self,
        limit: u32,
        started: Instant,
        round: ClaimRound,
        ctx: &mut Context<Self>,
    ) {
        self.round.failing_since = None;
        self.health.set_db_failing(false);
        if round.guard_extended == Some(true) {
            self.round.last_heartbeat = Some(started);
        }
        if round.guard_held == Some(false) && !self.health.is_guard_lost() {
            error!(self.log, "the replica-id guard is no longer ours (taken over after its heartbeat lapsed); claiming stopped");
            self.health.set_guard_lost();
        }
        self.update_backlog(round.rows.len() as u32 >= limit, ctx);
        // The round's start paired with the clock its statement read: the local half is
        // taken first, so every instant derived from it is late, never early.
        let clock = DbClock::new(started, round.now_ms);
        self.wake_for_round(clock, round.next_due_ms, ctx);
        self.metrics.claims.inc_by(round.rows.len() as u64);
        for row in round.rows {
            self.spawn_claim(row, started, ctx);
        }
        self.metrics.live_claims.set(self.live.len() as i64);
    }

    /// Whatever the statement leased (if it ran at all) belongs to no actor: the round is
    /// remembered so its rows are released. Failing for longer than a lease: not ready.
    fn round_failed(&mut self, id: Uuid, started: Instant, e: StoreError) {
        self.round.orphans.push((id, started));
        self.metrics.errors.inc();
        warn!(self.log, "claim round failed"; "error" => %e);
        let since = *self.round.failing_since.get_or_insert(started);
        if since.elapsed() >= self.settings.unready_after() && !self.health.is_db_failing() {
            error!(self.log, "claim rounds have failed for longer than a lease; not ready";
                   "failing_ms" => since.elapsed().as_millis() as u64);
            self.health.set_db_failing(true);
        }
    }
}

/// The round's statements on its own connection, each bounded: release the rows of rounds
/// whose reply never came, then claim. A connection that may still run a statement on the
/// server is never reused.
async fn run_round(mut session: Session, p: RoundPlan) -> RoundReply {
    let mut released = 0;
    if !p.orphans.is_empty() {
        let r = bounded("releasing orphaned rounds", p.bound, async {
            let c = session.client().await?;
            crate::store::release::release_rounds(c, &p.owner, &p.orphans).await
        })
        .await;
        match r {
            Ok(n) => released = n,
            Err(_) => session.discard(),
        }
    }
    let res = bounded("the claim statement", p.bound, async {
        let (c, stmt) = session.prepared(p.variant).await?;
        claim::claim_round(c, &stmt, &p.owner, p.lease_ms, p.id, p.extras).await
    })
    .await;
    if res.as_ref().is_err_and(|e| e.is_connection_lost()) {
        session.discard();
    }
    (session, released, res)
}
