//! Helpers shared by the schedule tests.

use chrono::{DateTime, NaiveDateTime};

use super::Schedule;

/// `"2026-03-29 01:00"` (or with `:ss`) read as UTC, in Unix ms.
pub(super) fn utc(text: &str) -> i64 {
    let parsed = NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M:%S")
        .or_else(|_| NaiveDateTime::parse_from_str(text, "%Y-%m-%d %H:%M"))
        .unwrap_or_else(|e| panic!("bad test instant {text}: {e}"));
    parsed.and_utc().timestamp_millis()
}

/// Unix ms rendered as `"2026-03-29 01:00"` UTC (seconds shown only when not zero).
pub(super) fn show(ms: i64) -> String {
    let t = DateTime::from_timestamp_millis(ms).expect("instant in range");
    if ms % 60_000 == 0 {
        t.format("%Y-%m-%d %H:%M").to_string()
    } else if ms % 1_000 == 0 {
        t.format("%Y-%m-%d %H:%M:%S").to_string()
    } else {
        t.format("%Y-%m-%d %H:%M:%S%.3f").to_string()
    }
}

pub(super) fn schedule(expr: &str, tz: &str) -> Schedule {
    Schedule::parse(expr, tz).unwrap_or_else(|e| panic!("{expr} in {tz}: {e}"))
}

/// The next `n` occurrences after `from` (UTC text), chained, as UTC text.
pub(super) fn fires(expr: &str, tz: &str, from: &str, n: usize) -> Vec<String> {
    let s = schedule(expr, tz);
    let mut at = utc(from);
    let mut out = Vec::new();
    for _ in 0..n {
        at = s
            .next_after_ms(at)
            .unwrap_or_else(|| panic!("{expr} never fires after {}", show(at)));
        out.push(show(at));
    }
    out
}
