//! The actor system of one replica (docs/design.md, "Actors"):
//!
//! - [`supervisor::Supervisor`] owns the cadence timer and the round loop; each round claims
//!   up to the free budget in one statement and spawns one [`claim::ClaimActor`] per leased
//!   row; it tracks them, restarts children that fail, and drains them on stop.
//! - [`claim::ClaimActor`] holds exactly one lease: it runs the pure decision
//!   ([`claim::plan`]), sends the decision to the admit actor, reports the outcome and stops.
//!   It never touches the database.
//! - [`admit::AdmitActor`] is the single actor per replica that writes leases: admissions,
//!   cursor moves and releases, through the [`crate::engine::Engine`] on its own connection
//!   (the engine and the health state are not actors: they live in `crate::engine` and
//!   `crate::health`).

pub mod admit;
pub mod claim;
pub mod faults;
pub mod supervisor;

use std::time::Duration;

use crate::db::session::Connector;

/// Settings the actors need, parsed once from the config. Every timer not set directly is
/// derived here, in one place (docs/design.md, "What each setting bounds").
#[derive(Clone)]
pub struct Settings {
    pub owner: String,
    pub claim_budget: u32,
    pub lease: Duration,
    pub cadence: Duration,
    pub drain: Duration,
    pub admit_timeout: Duration,
    pub max_serialization_retries: u32,
    pub reject_backoff: Duration,
    /// Listen for change notifications (`scheduler.listen`).
    pub listen: bool,
    /// The replica-id guard this process holds (incarnation, TTL), extended by the claim
    /// rounds; `None` = no guard (tests driving the actors directly).
    pub guard: Option<(uuid::Uuid, Duration)>,
    /// How often a claim round also reads the due backlog (`metrics.backlog_interval`).
    pub backlog_interval: Duration,
    /// How the claim round and the admit engine open their own connections.
    pub connector: Connector,
}

/// The hard cap on claims per round, whatever the config says.
pub const HARD_CLAIM_CAP: u32 = 256;

impl Settings {
    pub fn from_config(cfg: &crate::config::Config, connector: Connector) -> Settings {
        let s = &cfg.scheduler;
        Settings {
            owner: cfg.replica_id.as_str().to_string(),
            claim_budget: s.claim_budget.min(HARD_CLAIM_CAP),
            lease: s.lease,
            cadence: s.cadence,
            drain: s.drain,
            admit_timeout: s.admit_timeout,
            max_serialization_retries: s.max_serialization_retries,
            reject_backoff: s.reject_backoff,
            listen: s.listen,
            guard: None,
            backlog_interval: cfg.metrics.backlog_interval,
            connector,
        }
    }

    /// Client-side bound on one claim statement: the admission bound (both are single
    /// statements on a dedicated connection).
    pub fn claim_bound(&self) -> Duration {
        self.admit_timeout
    }

    /// Back-off after the `failures`-th consecutive admission error of one row: one cadence,
    /// doubling, capped at `reject_backoff`.
    pub fn error_backoff(&self, failures: u32) -> Duration {
        let doubled = self.cadence.saturating_mul(
            1u32.checked_shl(failures.saturating_sub(1))
                .unwrap_or(u32::MAX),
        );
        doubled.min(self.reject_backoff)
    }

    /// How long a claim round whose reply never arrived is remembered (its rows released
    /// at each later round): two leases, after which anything it leased has expired.
    pub fn orphan_memory(&self) -> Duration {
        self.lease * 2
    }

    /// How long the supervisor remembers a trigger's strikes (crashes, row errors) since the
    /// last one: the longest error back-off plus two leases and a cadence. A row still ours
    /// is claimed again within it; one that is not (deleted, taken over) is forgotten.
    pub fn strike_memory(&self) -> Duration {
        self.reject_backoff + self.lease * 2 + self.cadence
    }

    /// Claim rounds failing for longer than this make the replica not ready (`/readyz` 503).
    pub fn unready_after(&self) -> Duration {
        self.lease
    }
}

/// Timers derived from the lease for the replica-id guard and the TCP connection.
pub mod derived {
    use std::time::Duration;

    /// The replica-id guard expires this long after its last heartbeat (database clock):
    /// one lease, so a replica that cannot heartbeat loses its id no later than its leases.
    pub fn guard_ttl(lease: Duration) -> Duration {
        lease
    }

    /// The claim rounds extend the guard once this much of its TTL has passed: three
    /// extensions per TTL.
    pub fn guard_refresh(ttl: Duration) -> Duration {
        ttl / 3
    }

    /// TCP user timeout: unacknowledged data for half a lease breaks the connection, so a
    /// vanished peer is noticed well before the leases expire.
    pub fn tcp_user_timeout(lease: Duration) -> Duration {
        lease / 2
    }
}
