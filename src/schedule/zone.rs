//! The time-zone layer: cron patterns are matched against naive local wall-clock times (the
//! `cron` crate is run in UTC treated as "local", so it never sees daylight-saving time), and
//! each match is mapped to instants here by the gap and overlap rules of the module docs.

use chrono::{DateTime, LocalResult, NaiveDateTime, Offset, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;

use super::Schedule;

/// Bound on map-and-retry steps of one search; each step moves strictly forward. Real zones
/// need at most a few.
const MAX_STEPS: usize = 1_000;
/// Larger than any UTC offset in the tz database (the extremes are about ±15.5 h).
const MAX_OFFSET_SECS: i64 = 18 * 3600;

#[cfg(test)]
thread_local! {
    /// Calls of `next_after_ms` on this thread, so tests can show the decision never walks a
    /// backlog.
    pub(super) static NEXT_AFTER_CALLS: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

impl Schedule {
    /// First occurrence strictly after `after_ms` (Unix ms, UTC). `None` only if it never
    /// fires again (the `cron` crate stops at the year 2100) or `after_ms` is out of range.
    #[must_use]
    pub fn next_after_ms(&self, after_ms: i64) -> Option<i64> {
        #[cfg(test)]
        NEXT_AFTER_CALLS.with(|calls| calls.set(calls.get() + 1));
        let local = DateTime::<Utc>::from_timestamp_millis(after_ms)?
            .with_timezone(&self.tz)
            .naive_local();
        let forward = self.next_forward(after_ms, local);
        match (forward, self.second_pass_after(after_ms, local)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The next `n` occurrences strictly after `after_ms`, each with its wall-clock rendering
    /// in the schedule's zone, e.g. `2026-03-29 03:00:00 CEST (+02:00)`.
    #[must_use]
    pub fn explain(&self, after_ms: i64, n: usize) -> Vec<(i64, String)> {
        let mut out = Vec::with_capacity(n.min(1024));
        let mut at = after_ms;
        while out.len() < n {
            let Some(next) = self.next_after_ms(at) else {
                break;
            };
            let shown = match self.tz.timestamp_millis_opt(next) {
                LocalResult::Single(t) => t.format("%Y-%m-%d %H:%M:%S %Z (%:z)").to_string(),
                _ => format!("{next} ms"),
            };
            out.push((next, shown));
            at = next;
        }
        out
    }

    /// Whether any wall-clock time from 1970 on matches (rejects `0 0 30 2 *`).
    pub(super) fn fires_at_all(&self) -> bool {
        let start = DateTime::<Utc>::from_timestamp(-1, 0).map(|t| t.naive_utc());
        start.and_then(|s| self.naive_next(s)).is_some()
    }

    /// Smallest matching wall-clock time strictly after `after` (whole seconds).
    fn naive_next(&self, after: NaiveDateTime) -> Option<NaiveDateTime> {
        let after = Utc.from_utc_datetime(&after);
        let matches = self.patterns.iter().filter_map(|p| p.after(&after).next());
        matches.map(|t| t.naive_utc()).min()
    }

    /// Walks matching wall-clock times forward from the local time of `after_ms` and returns
    /// the first mapped instant after it.
    fn next_forward(&self, after_ms: i64, local: NaiveDateTime) -> Option<i64> {
        let mut candidate = self.naive_next(local)?;
        for _ in 0..MAX_STEPS {
            match self.tz.from_local_datetime(&candidate) {
                LocalResult::Single(t) if t.timestamp_millis() > after_ms => {
                    return Some(t.timestamp_millis());
                }
                LocalResult::None => {
                    let gap_end_ms = gap_end(self.tz, candidate)? * 1000;
                    if gap_end_ms > after_ms {
                        return Some(gap_end_ms);
                    }
                }
                LocalResult::Ambiguous(first, second) => {
                    let (first_ms, second_ms) =
                        (first.timestamp_millis(), second.timestamp_millis());
                    if first_ms > after_ms {
                        return Some(first_ms);
                    }
                    if self.repeat_in_overlap && second_ms > after_ms {
                        return Some(second_ms);
                    }
                    if !self.repeat_in_overlap {
                        // `after_ms` is in the second pass: no fixed-hour match fires again in
                        // this overlap, so resume at its end.
                        let end = overlap(self.tz, &first, &second)?.end;
                        candidate = end - TimeDelta::seconds(1);
                    }
                }
                LocalResult::Single(_) => {}
            }
            candidate = self.naive_next(candidate)?;
        }
        None
    }

    /// When `after_ms` is in the first pass of a repeated hour, interval-like patterns also
    /// fire at second-pass instants whose wall-clock time is at or before the current one.
    fn second_pass_after(&self, after_ms: i64, local: NaiveDateTime) -> Option<i64> {
        if !self.repeat_in_overlap {
            return None;
        }
        let LocalResult::Ambiguous(first, second) = self.tz.from_local_datetime(&local) else {
            return None;
        };
        if first.timestamp_millis() != after_ms {
            return None;
        }
        let repeated = overlap(self.tz, &first, &second)?;
        let hit = self.naive_next(repeated.start - TimeDelta::seconds(1))?;
        if hit >= repeated.end {
            return None;
        }
        let instant = hit.and_utc().timestamp() - repeated.second_offset;
        Some(instant * 1000)
    }
}

/// The repeated wall-clock range `[start, end)` of an overlap, and the offset of its second pass.
struct Overlap {
    start: NaiveDateTime,
    end: NaiveDateTime,
    second_offset: i64,
}

/// The overlap containing the two interpretations `first` < `second` of one wall-clock time.
fn overlap(tz: Tz, first: &DateTime<Tz>, second: &DateTime<Tz>) -> Option<Overlap> {
    let first_offset = offset_secs(tz, first.timestamp())?;
    let second_offset = offset_secs(tz, second.timestamp())?;
    // The transition: the first instant in (first, second] with the second pass's offset.
    let (mut lo, mut hi) = (first.timestamp(), second.timestamp());
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if offset_secs(tz, mid)? == first_offset {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    Some(Overlap {
        start: naive_at(hi + second_offset)?,
        end: naive_at(hi + first_offset)?,
        second_offset,
    })
}

/// The first instant (Unix seconds) whose wall-clock time is later than `local`, which lies in
/// a gap: the instant of the transition that skips it.
fn gap_end(tz: Tz, local: NaiveDateTime) -> Option<i64> {
    let at = local.and_utc().timestamp();
    let later = |instant: i64| -> Option<bool> { Some(instant + offset_secs(tz, instant)? > at) };
    let (mut lo, mut hi) = (at - MAX_OFFSET_SECS, at + MAX_OFFSET_SECS);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if later(mid)? {
            hi = mid;
        } else {
            lo = mid + 1;
        }
    }
    Some(hi)
}

fn offset_secs(tz: Tz, instant: i64) -> Option<i64> {
    let utc = DateTime::<Utc>::from_timestamp(instant, 0)?.naive_utc();
    Some(i64::from(
        tz.offset_from_utc_datetime(&utc).fix().local_minus_utc(),
    ))
}

fn naive_at(secs: i64) -> Option<NaiveDateTime> {
    DateTime::<Utc>::from_timestamp(secs, 0).map(|t| t.naive_utc())
}
