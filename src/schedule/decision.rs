//! The pure misfire decision (docs/design.md, "Deciding"): given a trigger's schedule, its cursor and the
//! database's observation time, say what to admit and where the cursor goes next.

use std::fmt;
use std::str::FromStr;

use super::{Schedule, ScheduleError, Timing};

/// What to do with an occurrence found more than the grace late.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MisfirePolicy {
    /// Admit nothing; move the cursor past the observation.
    Skip,
    /// Admit exactly the cursor's own occurrence; move the cursor past the observation.
    FireOnce,
}

impl MisfirePolicy {
    /// The stored spelling: `skip` or `fire_once`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            MisfirePolicy::Skip => "skip",
            MisfirePolicy::FireOnce => "fire_once",
        }
    }
}

impl FromStr for MisfirePolicy {
    type Err = ScheduleError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "skip" => Ok(MisfirePolicy::Skip),
            "fire_once" => Ok(MisfirePolicy::FireOnce),
            other => Err(ScheduleError::UnknownMisfirePolicy(other.to_string())),
        }
    }
}

impl fmt::Display for MisfirePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How late an occurrence may be admitted and still count as on time (the default of every trigger).
pub const DEFAULT_MISFIRE_GRACE_MS: i64 = 60_000;

/// The outcome of one decision; all instants are Unix ms (UTC).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// cursor was NULL: first occurrence strictly after the observation; no run.
    Initialise { next_fire_at_ms: i64 },
    /// on time (observed_at - cursor <= grace): admit the cursor's occurrence, next = next_after(cursor).
    Fire {
        scheduled_for_ms: i64,
        next_fire_at_ms: i64,
    },
    /// late beyond grace, policy skip: no run, next = first occurrence strictly after observed_at.
    MisfiredSkip {
        missed_ms: i64,
        next_fire_at_ms: i64,
    },
    /// late beyond grace, policy fire_once: admit exactly the cursor's own occurrence
    /// (deterministic under takeover), next = first occurrence strictly after observed_at.
    MisfiredFireOnce {
        scheduled_for_ms: i64,
        next_fire_at_ms: i64,
    },
    /// not due yet (cursor > observed_at): nothing to do, keep the cursor. (Can happen if a
    /// claim races a republish.)
    NotDue { next_fire_at_ms: i64 },
    /// definition cannot be evaluated: nothing admitted; the caller releases the claim with
    /// back-off.
    Reject { reason: RejectReason },
    /// The cursor is past the trigger's validity window (`end_at`): nothing admitted, the
    /// cursor kept; the row leaves the claim index (docs/policies-jitter.md).
    Ended { next_fire_at_ms: i64 },
}

/// Why a definition cannot be evaluated.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum RejectReason {
    /// The expression, the zone or the misfire policy does not parse.
    #[error(transparent)]
    Invalid(#[from] ScheduleError),
    /// The expression has no occurrence after the instant the decision needs one after.
    #[error("expression `{expression}` in {timezone} has no occurrence after {after_ms} ms")]
    NoOccurrenceAfter {
        expression: String,
        timezone: String,
        after_ms: i64,
    },
}

/// Pure: no clock reads, no I/O. Parses the expression and zone (`Reject` on error or an
/// expression that never fires), then applies the decision table through [`decide_with`].
#[must_use]
pub fn decide(
    expr: &str,
    timezone: &str,
    policy: MisfirePolicy,
    grace_ms: i64,
    cursor_ms: Option<i64>,
    observed_at_ms: i64,
) -> Decision {
    match Schedule::parse(expr, timezone) {
        Ok(schedule) => decide_with(&schedule, policy, grace_ms, cursor_ms, observed_at_ms),
        Err(e) => Decision::Reject { reason: e.into() },
    }
}

/// Same as [`decide`], with an already-parsed schedule.
///
/// Constant time in the number of missed occurrences: exactly one `next_after` search, from
/// the cursor (on time) or from the observation (initialise, misfire); a backlog is never
/// walked. A negative grace counts as zero.
#[must_use]
pub fn decide_with(
    schedule: &Schedule,
    policy: MisfirePolicy,
    grace_ms: i64,
    cursor_ms: Option<i64>,
    observed_at_ms: i64,
) -> Decision {
    let next_after = |from: i64| {
        schedule
            .next_after_ms(from)
            .ok_or_else(|| Decision::Reject {
                reason: RejectReason::NoOccurrenceAfter {
                    expression: schedule.expression().to_string(),
                    timezone: schedule.timezone().name().to_string(),
                    after_ms: from,
                },
            })
    };
    let decided = match cursor_ms {
        None => next_after(observed_at_ms)
            .map(|next_fire_at_ms| Decision::Initialise { next_fire_at_ms }),
        Some(cursor) if cursor > observed_at_ms => Ok(Decision::NotDue {
            next_fire_at_ms: cursor,
        }),
        Some(cursor) if observed_at_ms.saturating_sub(cursor) <= grace_ms.max(0) => {
            next_after(cursor).map(|next_fire_at_ms| Decision::Fire {
                scheduled_for_ms: cursor,
                next_fire_at_ms,
            })
        }
        Some(cursor) => next_after(observed_at_ms).map(|next_fire_at_ms| match policy {
            MisfirePolicy::Skip => Decision::MisfiredSkip {
                missed_ms: cursor,
                next_fire_at_ms,
            },
            MisfirePolicy::FireOnce => Decision::MisfiredFireOnce {
                scheduled_for_ms: cursor,
                next_fire_at_ms,
            },
        }),
    };
    decided.unwrap_or_else(|reject| reject)
}

/// [`decide_with`] under a trigger's jitter and validity window ([`Timing`],
/// docs/policies-jitter.md):
///
/// - a cursor past the window's end is [`Decision::Ended`];
/// - a NULL cursor, or one before the window's start, moves to the first occurrence in the
///   window after the observation ([`Decision::Initialise`]);
/// - otherwise the cursor's occurrence is due at its jittered instant: the decision is
///   [`decide_with`]'s with the observation moved back by the cursor's offset, so it is not
///   due before the jittered instant, the misfire grace counts from it, and a misfire moves the
///   cursor to the first occurrence after the observation less that offset.
///
/// With no jitter and no window this is exactly [`decide_with`].
#[must_use]
pub fn decide_timed(
    schedule: &Schedule,
    policy: MisfirePolicy,
    grace_ms: i64,
    timing: &Timing<'_>,
    cursor_ms: Option<i64>,
    observed_at_ms: i64,
) -> Decision {
    match cursor_ms {
        Some(cursor) if timing.after_end(cursor) => Decision::Ended {
            next_fire_at_ms: cursor,
        },
        Some(cursor) if timing.start_at_ms.map_or(true, |start| cursor >= start) => {
            let offset = timing.due_at_ms(cursor) - cursor;
            decide_with(
                schedule,
                policy,
                grace_ms,
                Some(cursor),
                observed_at_ms.saturating_sub(offset),
            )
        }
        _ => decide_with(
            schedule,
            policy,
            grace_ms,
            None,
            timing.search_from(observed_at_ms),
        ),
    }
}
