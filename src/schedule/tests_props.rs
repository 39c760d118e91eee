//! Properties over random instants in 2026–2030, biased towards daylight-saving transitions,
//! in zones with whole-hour, half-hour and midnight shifts and with none.

use std::sync::OnceLock;

use chrono::{DateTime, LocalResult, NaiveDate, NaiveDateTime, Offset, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use proptest::prelude::*;

use super::test_util::schedule;
use super::Schedule;

const ZONES: &[&str] = &[
    "Europe/Berlin",
    "America/New_York",
    "Australia/Lord_Howe",
    "Asia/Shanghai",
    "UTC",
    "America/Santiago",
    "Pacific/Chatham",
    "Europe/London",
    "America/Havana",
];
const PATTERNS: &[&str] = &[
    "30 2 * * *",
    "0 * * * *",
    "*/15 * * * *",
    "45 1 * * *",
    "0 0 * * *",
    "30 * * * *",
    "0 2 * * *",
    "10 */2 * * *",
    "0 0 12 * * *",
    "*/20 1-3 * * *",
    "0 9 * * 1-5",
    "5 4 * * SUN",
];
/// Patterns that fire exactly once on every local calendar day.
const DAILY: &[&str] = &[
    "30 2 * * *",
    "45 1 * * *",
    "0 0 * * *",
    "0 2 * * *",
    "59 23 * * *",
    "@daily",
];

fn start_2026() -> i64 {
    NaiveDate::from_ymd_opt(2026, 1, 1)
        .and_then(|d| d.and_hms_opt(0, 0, 0))
        .expect("date")
        .and_utc()
        .timestamp()
}
const FIVE_YEARS_SECS: i64 = 5 * 365 * 86_400;

fn offset(tz: Tz, secs: i64) -> i32 {
    let utc = DateTime::from_timestamp(secs, 0)
        .expect("in range")
        .naive_utc();
    tz.offset_from_utc_datetime(&utc).fix().local_minus_utc()
}

/// Every offset change of each zone in 2026–2030 (to the hour), so cases can land near them.
fn transitions(zone: usize) -> &'static [i64] {
    static ALL: OnceLock<Vec<Vec<i64>>> = OnceLock::new();
    let all = ALL.get_or_init(|| {
        let scan = |tz: Tz| {
            let hours = (0..FIVE_YEARS_SECS / 3600).map(|h| start_2026() + h * 3600);
            hours
                .filter(|&t| offset(tz, t) != offset(tz, t + 3600))
                .collect()
        };
        ZONES
            .iter()
            .map(|z| scan(z.parse().expect("zone")))
            .collect()
    });
    &all[zone]
}

/// (zone index, instant in ms): half the time within ±4 h of a transition.
fn zone_and_instant() -> impl Strategy<Value = (usize, i64)> {
    let jitter = -4 * 3_600_000i64..4 * 3_600_000;
    (
        0..ZONES.len(),
        any::<bool>(),
        any::<prop::sample::Index>(),
        0..FIVE_YEARS_SECS * 1000,
        jitter,
    )
        .prop_map(|(zone, near, pick, uniform, jitter)| {
            let near_ones = transitions(zone);
            let at = if near && !near_ones.is_empty() {
                near_ones[pick.index(near_ones.len())] * 1000 + jitter
            } else {
                start_2026() * 1000 + uniform
            };
            (zone, at)
        })
}

fn local(tz: Tz, ms: i64) -> NaiveDateTime {
    DateTime::<Utc>::from_timestamp_millis(ms)
        .expect("in range")
        .with_timezone(&tz)
        .naive_local()
}

fn matches(s: &Schedule, naive: NaiveDateTime) -> bool {
    s.patterns.iter().any(|p| p.includes(naive.and_utc()))
}

/// The DST rules written out plainly: every match in a window, each mapped on its own.
fn reference_next(s: &Schedule, after_ms: i64) -> Option<i64> {
    let tz = s.timezone();
    let here = local(tz, after_ms);
    let (start, end) = (here - TimeDelta::days(2), here + TimeDelta::days(3));
    let mut instants = Vec::new();
    for pattern in &s.patterns {
        for hit in pattern
            .after(&start.and_utc())
            .map(|t| t.naive_utc())
            .take_while(|t| *t <= end)
        {
            match tz.from_local_datetime(&hit) {
                LocalResult::Single(t) => instants.push(t.timestamp_millis()),
                LocalResult::Ambiguous(first, second) => {
                    instants.push(first.timestamp_millis());
                    if s.repeat_in_overlap {
                        instants.push(second.timestamp_millis());
                    }
                }
                LocalResult::None => {
                    // The first valid minute after the gap (gaps end on whole minutes).
                    let mut later = hit;
                    let valid = loop {
                        later += TimeDelta::minutes(1);
                        if let Some(t) = tz.from_local_datetime(&later).earliest() {
                            break t;
                        }
                    };
                    instants.push(valid.timestamp_millis());
                }
            }
        }
    }
    instants.into_iter().filter(|&t| t > after_ms).min()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn next_after_matches_the_plain_reference((zone, at) in zone_and_instant(), p in 0..PATTERNS.len()) {
        let s = schedule(PATTERNS[p], ZONES[zone]);
        if let Some(expected) = reference_next(&s, at) {
            prop_assert_eq!(s.next_after_ms(at), Some(expected));
        }
    }

    #[test]
    fn chained_occurrences_strictly_increase_at_valid_wall_clock_times(
        (zone, at) in zone_and_instant(), p in 0..PATTERNS.len(),
    ) {
        let s = schedule(PATTERNS[p], ZONES[zone]);
        let tz = s.timezone();
        let mut previous = at;
        for _ in 0..12 {
            let next = s.next_after_ms(previous).expect("fires again");
            prop_assert!(next > previous, "{} then {}", previous, next);
            // The wall-clock time shown for the instant exists and maps back to it.
            let wall = local(tz, next);
            let back = tz.from_local_datetime(&wall);
            prop_assert!(back.single().or(back.latest()).is_some());
            prop_assert!(back.earliest().map(|t| t.timestamp_millis()) == Some(next)
                || back.latest().map(|t| t.timestamp_millis()) == Some(next));
            // It matches the pattern, or it ends a gap that contains a match.
            let just_before = local(tz, next - 1000);
            let ends_matched_gap = wall - just_before > TimeDelta::seconds(1)
                && s.patterns.iter().any(|pat| pat.after(&just_before.and_utc()).next().map(|t| t.naive_utc()) <= Some(wall));
            prop_assert!(matches(&s, wall) || ends_matched_gap, "{} at {}", PATTERNS[p], wall);
            previous = next;
        }
    }

    #[test]
    fn fixed_hour_daily_patterns_fire_once_per_local_day(
        (zone, at) in zone_and_instant(), p in 0..DAILY.len(),
    ) {
        let s = schedule(DAILY[p], ZONES[zone]);
        let mut previous = at;
        let mut days: Vec<NaiveDate> = Vec::new();
        for _ in 0..8 {
            previous = s.next_after_ms(previous).expect("fires again");
            days.push(local(s.timezone(), previous).date());
        }
        for pair in days.windows(2) {
            prop_assert_eq!(pair[1], pair[0].succ_opt().expect("next day"), "{} in {}", DAILY[p], ZONES[zone]);
        }
    }
}
