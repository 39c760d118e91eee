//! The actor system of one replica (SPEC §8):
//!
//! - [`supervisor::Supervisor`] owns the cadence timer; each round claims up to the free
//!   budget in one statement and spawns one [`claim::ClaimActor`] per leased row; it tracks
//!   them, restarts children that fail, and drains them on stop.
//! - [`claim::ClaimActor`] holds exactly one lease: it runs the pure decision, sends the
//!   decision to the admit actor, reports the outcome and stops.
//! - [`admit::AdmitActor`] is the single actor per replica that runs the admission
//!   transaction, one at a time.

pub mod admit;
pub mod claim;
pub mod faults;
pub mod supervisor;

use std::time::Duration;

/// Settings the actors need, parsed once from the config.
#[derive(Clone, Debug)]
pub struct Settings {
    pub owner: String,
    pub claim_budget: u32,
    pub lease: Duration,
    pub cadence: Duration,
    pub drain: Duration,
    pub admit_timeout: Duration,
    pub max_serialization_retries: u32,
    pub reject_backoff: Duration,
}

/// The hard cap on claims per round, whatever the config says.
pub const HARD_CLAIM_CAP: u32 = 256;

impl Settings {
    pub fn from_config(cfg: &crate::config::Config) -> Settings {
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
        }
    }
}
