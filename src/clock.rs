//! The one conversion between database instants and local ones (docs/design.md, "Waking" and
//! "Lease deadline").
//!
//! Every decision about time is taken by the database clock inside a statement. What the
//! replica does locally — wake at the instant a row becomes claimable, give up an admission
//! at its lease deadline — needs the same instants on its monotonic clock. A [`DbClock`] is
//! one observation of both clocks (a claim round's start, paired with the database clock its
//! statement read) and converts by *differences of database times*: node clock skew does not
//! enter. The local half is taken before the statement read the database clock, so a derived
//! local instant can only be early, by at most that latency, never late: a lease deadline is
//! conservative, and an early wake costs one empty round.

use std::time::{Duration, Instant};

/// A paired observation: the local instant `local` and the database clock `db_ms` (Unix ms)
/// read at (no earlier than) that instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DbClock {
    local: Instant,
    db_ms: i64,
}

impl DbClock {
    pub fn new(local: Instant, db_ms: i64) -> DbClock {
        DbClock { local, db_ms }
    }

    /// The database clock of the observation.
    pub fn db_ms(&self) -> i64 {
        self.db_ms
    }

    /// The local instant at which the database clock reads `at_ms`; an instant at or before
    /// the observation maps to the observation's local instant (it is already due).
    pub fn local_at(&self, at_ms: i64) -> Instant {
        self.local + Duration::from_millis(at_ms.saturating_sub(self.db_ms).max(0) as u64)
    }

    /// The local instant just after the database clock passes `at_ms` (1 ms later): when a
    /// row with `claimable_at_ms = at_ms` is claimable by a statement started then.
    pub fn local_after(&self, at_ms: i64) -> Instant {
        self.local_at(at_ms) + Duration::from_millis(1)
    }

    /// Whether `at_ms` lies after the observation (not yet due when it was taken).
    pub fn is_ahead(&self, at_ms: i64) -> bool {
        at_ms > self.db_ms
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::DbClock;

    #[test]
    fn database_instants_map_by_their_difference_and_never_before_the_observation() {
        let t0 = Instant::now();
        let c = DbClock::new(t0, 1_000_000);
        assert_eq!(c.local_at(1_000_250), t0 + Duration::from_millis(250));
        assert_eq!(c.local_after(1_000_250), t0 + Duration::from_millis(251));
        assert_eq!(c.local_at(999_000), t0, "past instants are due at once");
        assert_eq!(c.local_at(i64::MIN), t0);
        assert!(c.is_ahead(1_000_001) && !c.is_ahead(1_000_000));
    }
}
