//! Cron schedules evaluated in an IANA time zone, and the pure misfire decision (docs/design.md, "Deciding").
//!
//! Nothing here reads a clock or does I/O: every function takes the instants it needs as
//! Unix milliseconds (UTC) and returns plain values, so the whole module is tested without a
//! database.
//!
//! # Expressions
//!
//! - 5 fields, classic crontab: `minute hour day-of-month month day-of-week`. Day-of-week is
//!   0–7 with 0 and 7 = Sunday, 1 = Monday … 6 = Saturday; names `SUN`–`SAT` and `JAN`–`DEC`;
//!   ranges, lists and steps. When both day-of-month and day-of-week are restricted (neither
//!   starts with `*` or `?`) a day matches if *either* matches, as in Vixie cron.
//! - 6 or 7 fields, seconds first (and an optional year last): the `cron` crate's Quartz-style
//!   meaning, passed through. **There day-of-week numbers are 1 = Sunday … 7 = Saturday**, and
//!   day-of-month and day-of-week must both match.
//! - `@hourly`, `@daily` (= `@midnight`), `@weekly`, `@monthly`, `@yearly` (= `@annually`).
//!
//! # Daylight-saving time
//!
//! The pattern is matched against *local wall-clock times* of the trigger's zone; each matching
//! wall-clock time is then mapped to instants by two rules.
//!
//! **Gap rule.** A wall-clock time that does not exist (the clock jumps forward over it) fires
//! once, at the first instant after the gap, i.e. the instant of the transition. Several
//! matches inside one gap, and a match at the first valid time after it, collapse into that
//! one instant. Example: Europe/Berlin, `30 2 * * *`: on 2026-03-29 the clock jumps from 02:00
//! CET to 03:00 CEST, so 02:30 does not exist and the trigger fires at 03:00 CEST = 01:00 UTC.
//! `*/15 * * * *` fires at 01:45 CET, then once at 03:00 CEST = 01:00 UTC (for 02:00, 02:15,
//! 02:30, 02:45 and 03:00 together), then 03:15 CEST; `30 * * * *` fires at 01:30 CET, at
//! 03:00 CEST (for the missing 02:30) and at 03:30 CEST.
//!
//! **Overlap rule.** A wall-clock time that happens twice (the clock falls back over it) fires
//! once, at its first occurrence, when the hour field is fixed (a value, a list or a range
//! that does not cover the whole day, as in `30 2 * * *`, `*/20 1-3 * * *` or `@daily`). When
//! the hour field is a wildcard, a step or the whole day (`*`, `*/2`, `0-23`: interval-like
//! patterns such as `0 * * * *`, `*/15 * * * *` or `@hourly`) it fires in both passes, because
//! those triggers mean "every so often".
//! Example: Europe/Berlin on 2026-10-25 the clock falls back from 03:00 CEST to 02:00 CET, so
//! 02:00–02:59 happens twice. `30 2 * * *` fires once, at 02:30 CEST = 00:30 UTC.
//! `*/15 * * * *` fires at 02:00, 02:15, 02:30 and 02:45 of both passes: 00:00, 00:15, 00:30,
//! 00:45 UTC (CEST) and 01:00, 01:15, 01:30, 01:45 UTC (CET).
//!
//! Every instant returned is strictly after the instant asked about, and chained calls never
//! repeat an instant.

mod decision;
mod error;
mod expr;
mod field;
mod timing;
mod zone;

#[cfg(test)]
mod test_util;
#[cfg(test)]
mod tests_decision;
#[cfg(test)]
mod tests_expr;
#[cfg(test)]
mod tests_props;
#[cfg(test)]
mod tests_zone;

pub use decision::{
    decide, decide_timed, decide_with, Decision, MisfirePolicy, RejectReason,
    DEFAULT_MISFIRE_GRACE_MS,
};
pub use error::ScheduleError;
pub use timing::{jitter_offset_ms, min_gap, Gap, Timing, GAP_HORIZON_MS, GAP_SCAN_LIMIT};

use chrono_tz::Tz;

/// A validated cron expression bound to an IANA time zone.
#[derive(Clone, Debug)]
pub struct Schedule {
    /// The user's text, kept for display.
    expression: String,
    tz: Tz,
    /// `cron` patterns in Quartz form, matched against naive local times; a wall-clock time
    /// matches if any of them matches (two only for crontab day-of-month OR day-of-week).
    patterns: Vec<cron::Schedule>,
    /// Interval-like hour field: fire in both passes of a repeated hour.
    repeat_in_overlap: bool,
}

impl Schedule {
    /// Validates `expr` (see the module docs for the accepted forms) and `timezone` (an IANA
    /// name such as `Europe/Berlin`, or `UTC`).
    ///
    /// # Errors
    ///
    /// [`ScheduleError`] naming the field and the reason, the unknown zone, or an expression
    /// that matches no date.
    pub fn parse(expr: &str, timezone: &str) -> Result<Schedule, ScheduleError> {
        let parsed = expr::parse(expr)?;
        let tz: Tz = timezone
            .parse()
            .map_err(|_| ScheduleError::UnknownTimeZone(timezone.to_string()))?;
        let schedule = Schedule {
            expression: expr.to_string(),
            tz,
            patterns: parsed.patterns,
            repeat_in_overlap: parsed.repeat_in_overlap,
        };
        if !schedule.fires_at_all() {
            return Err(ScheduleError::NeverFires(expr.to_string()));
        }
        Ok(schedule)
    }

    /// The IANA zone the expression is evaluated in.
    #[must_use]
    pub fn timezone(&self) -> Tz {
        self.tz
    }

    /// The expression as the user wrote it.
    #[must_use]
    pub fn expression(&self) -> &str {
        &self.expression
    }
}

/// Every occurrence of `schedule` in `[from_ms, to_ms)`, in order, or `None` as soon as
/// there are more than `max` (nothing further is computed).
pub fn occurrences_in(
    schedule: &Schedule,
    from_ms: i64,
    to_ms: i64,
    max: usize,
) -> Option<Vec<i64>> {
    let mut out = Vec::new();
    let mut at = from_ms - 1;
    while let Some(t) = schedule.next_after_ms(at) {
        if t >= to_ms {
            break;
        }
        if out.len() == max {
            return None;
        }
        out.push(t);
        at = t;
    }
    Some(out)
}
