//! Fault hooks for the actor-crash drills. They exist only with the `fault-injection` cargo
//! feature (never in a release build); without it every hook is a constant `false`.

#[cfg(feature = "fault-injection")]
mod imp {
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::OnceLock;

    struct Plan {
        admit_every: u64,
        claim_every: u64,
        supervisor_panic_at: u64,
    }

    fn plan() -> &'static Plan {
        static PLAN: OnceLock<Plan> = OnceLock::new();
        PLAN.get_or_init(|| {
            // QLSCHED_FAULTS="admit_stop_every=7,claim_stop_every=11,supervisor_panic_at=5"
            let spec = std::env::var("QLSCHED_FAULTS").unwrap_or_default();
            let get = |key: &str| {
                spec.split(',')
                    .filter_map(|kv| kv.split_once('='))
                    .find(|(k, _)| k.trim() == key)
                    .and_then(|(_, v)| v.trim().parse().ok())
                    .unwrap_or(0)
            };
            Plan {
                admit_every: get("admit_stop_every"),
                claim_every: get("claim_stop_every"),
                supervisor_panic_at: get("supervisor_panic_at"),
            }
        })
    }

    static ADMITS: AtomicU64 = AtomicU64::new(0);
    static CLAIMS: AtomicU64 = AtomicU64::new(0);
    static TICKS: AtomicU64 = AtomicU64::new(0);

    fn every(n: u64, counter: &AtomicU64) -> bool {
        n > 0 && (counter.fetch_add(1, Ordering::Relaxed) + 1) % n == 0
    }

    /// The admit actor dies after committing, before replying.
    pub fn admit_actor_should_die() -> bool {
        every(plan().admit_every, &ADMITS)
    }
    /// A claim actor dies after deciding, before sending its decision.
    pub fn claim_actor_should_die() -> bool {
        every(plan().claim_every, &CLAIMS)
    }
    /// The supervisor panics at its n-th timer tick (once).
    pub fn supervisor_should_panic() -> bool {
        let at = plan().supervisor_panic_at;
        at > 0 && TICKS.fetch_add(1, Ordering::Relaxed) + 1 == at
    }
}

#[cfg(not(feature = "fault-injection"))]
mod imp {
    pub fn admit_actor_should_die() -> bool {
        false
    }
    pub fn claim_actor_should_die() -> bool {
        false
    }
    pub fn supervisor_should_panic() -> bool {
        false
    }
}

pub use imp::*;
