//! Jitter and the validity window (docs/policies-jitter.md): when a trigger's occurrence is
//! due, whether it is in the trigger's window, and the shortest gap between two consecutive
//! occurrences (the bound of the jitter, checked at publish).
//!
//! Pure, like the rest of `schedule`: the instants are Unix ms (UTC).
//!
//! # The jitter offset
//!
//! An occurrence of nominal instant `n` of trigger `id` with jitter `j > 0` ms is due at
//! `n + offset`, where
//!
//! ```text
//! h      = SHA-256 of the UTF-8 text "<id>:<n>"   (n in decimal, e.g. "nightly:1767225600000")
//! offset = (first 8 bytes of h, big-endian, top bit cleared) mod j
//! ```
//!
//! so `0 <= offset < j`. The function never changes: every replica and every binary version
//! computes the same offset, and the database computes it too (`store::jitter_offset_sql!`,
//! used where a release or a project resume puts a row back at its cursor). The test
//! `jitter_offsets_are_pinned` holds known values; the integration test
//! `the_database_computes_the_same_offsets` holds the SQL to them.

use chrono::Offset;
use chrono::TimeZone;
use sha2::{Digest, Sha256};

use super::Schedule;

/// The deterministic jitter offset in `[0, jitter_ms)` of the occurrence `nominal_ms` of
/// `trigger_id` (module docs); 0 when `jitter_ms <= 0`.
#[must_use]
pub fn jitter_offset_ms(trigger_id: &str, nominal_ms: i64, jitter_ms: i64) -> i64 {
    if jitter_ms <= 0 {
        return 0;
    }
    let h = Sha256::digest(format!("{trigger_id}:{nominal_ms}").as_bytes());
    let mut head = [0u8; 8];
    head.copy_from_slice(&h[..8]);
    let v = u64::from_be_bytes(head) & 0x7fff_ffff_ffff_ffff;
    (v % jitter_ms as u64) as i64
}

/// A trigger's jitter and validity window, as its row stores them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Timing<'a> {
    pub trigger_id: &'a str,
    /// 0: no jitter (the occurrence is due at its nominal instant).
    pub jitter_ms: i64,
    /// No occurrence whose nominal instant is before this is admitted by the schedule.
    pub start_at_ms: Option<i64>,
    /// No occurrence whose nominal instant is after this is admitted by the schedule.
    pub end_at_ms: Option<i64>,
}

impl Timing<'_> {
    /// When the occurrence of nominal instant `nominal_ms` is due (its jittered instant).
    #[must_use]
    pub fn due_at_ms(&self, nominal_ms: i64) -> i64 {
        nominal_ms.saturating_add(jitter_offset_ms(
            self.trigger_id,
            nominal_ms,
            self.jitter_ms,
        ))
    }

    /// The jittered instant recorded on a run (`runs.due_at_ms`): only with a jitter.
    #[must_use]
    pub fn recorded_due_at_ms(&self, nominal_ms: i64) -> Option<i64> {
        (self.jitter_ms > 0).then(|| self.due_at_ms(nominal_ms))
    }

    /// Whether an occurrence at `nominal_ms` lies after the window's end.
    #[must_use]
    pub fn after_end(&self, nominal_ms: i64) -> bool {
        self.end_at_ms.is_some_and(|end| nominal_ms > end)
    }

    /// Where the claim index should hold a free row whose cursor is `cursor_ms`: at the
    /// cursor's jittered instant, or nowhere (`None`) once the cursor is past the window's end.
    #[must_use]
    pub fn claimable_at_ms(&self, cursor_ms: i64) -> Option<i64> {
        (!self.after_end(cursor_ms)).then(|| self.due_at_ms(cursor_ms))
    }

    /// The instant a first-occurrence search starts after: `after_ms`, or just before the
    /// window's start when that is later (an occurrence exactly at the start is in the window).
    #[must_use]
    pub fn search_from(&self, after_ms: i64) -> i64 {
        match self.start_at_ms {
            Some(start) => after_ms.max(start.saturating_sub(1)),
            None => after_ms,
        }
    }
}

/// How far ahead [`min_gap`] looks from its first occurrence: 400 days, more than a year so
/// that every daylight-saving transition of the zone and a leap day are inside.
pub const GAP_HORIZON_MS: i64 = 400 * 86_400_000;

/// At most this many consecutive occurrences are compared in the main scan of [`min_gap`],
/// and in each window around a transition. An expression that fires more often than that in
/// the horizon (every minute: the first week) is compared over its first this-many
/// occurrences: its pattern of gaps within a day and across day boundaries repeats, so only a
/// transition can shorten a gap further, and those are scanned on their own.
pub const GAP_SCAN_LIMIT: usize = 10_000;

/// The shortest gap found between two consecutive occurrences, and where.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    pub gap_ms: i64,
    /// The earlier occurrence of the shortest pair.
    pub after_ms: i64,
}

/// The shortest gap between two consecutive occurrences of `schedule` whose first is after
/// `from_ms`, up to `until_ms` (the window's end) or [`GAP_HORIZON_MS`] after the first
/// occurrence, whichever is sooner. The scan compares every consecutive pair of the horizon
/// (at most [`GAP_SCAN_LIMIT`]), and also every pair within two days of each change of the
/// zone's UTC offset in the horizon (found by stepping the horizon hour by hour; at most
/// [`GAP_SCAN_LIMIT`] pairs each), where a daylight-saving gap or overlap moves occurrences
/// closer together. It stops early at a gap
/// of `stop_at_or_below` ms or less (the caller's jitter: that is already a refusal).
/// `None`: fewer than two occurrences in the horizon.
#[must_use]
pub fn min_gap(
    schedule: &Schedule,
    from_ms: i64,
    until_ms: Option<i64>,
    stop_at_or_below: i64,
) -> Option<Gap> {
    let first = schedule.next_after_ms(from_ms)?;
    let end = first
        .saturating_add(GAP_HORIZON_MS)
        .min(until_ms.unwrap_or(i64::MAX));
    let mut best: Option<Gap> = None;
    let mut scan = |from: i64, to: i64, limit: usize| -> bool {
        let Some(mut prev) = schedule.next_after_ms(from) else {
            return false;
        };
        for _ in 0..limit {
            let Some(next) = schedule.next_after_ms(prev) else {
                break;
            };
            if next > to {
                break;
            }
            let gap = next - prev;
            if best.map_or(true, |b| gap < b.gap_ms) {
                best = Some(Gap {
                    gap_ms: gap,
                    after_ms: prev,
                });
            }
            if gap <= stop_at_or_below {
                return true;
            }
            prev = next;
        }
        false
    };
    if scan(first - 1, end, GAP_SCAN_LIMIT) {
        return best;
    }
    for t in offset_changes(schedule.timezone(), first, end) {
        let from = (t - 2 * 86_400_000).max(first - 1);
        let to = (t + 2 * 86_400_000).min(end);
        if scan(from, to, GAP_SCAN_LIMIT) {
            return best;
        }
    }
    best
}

/// The instants (to the hour) in `[from_ms, to_ms]` at which `tz`'s UTC offset changes.
fn offset_changes(tz: chrono_tz::Tz, from_ms: i64, to_ms: i64) -> Vec<i64> {
    const HOUR: i64 = 3_600_000;
    let offset_at = |ms: i64| {
        tz.timestamp_millis_opt(ms)
            .single()
            .map(|t| t.offset().fix().local_minus_utc())
    };
    let mut out = Vec::new();
    let mut at = from_ms;
    let mut last = offset_at(at);
    while at < to_ms {
        at = (at + HOUR).min(to_ms);
        let now = offset_at(at);
        if now != last {
            out.push(at);
            last = now;
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The offset function is part of the contract (every binary computes the same): these
    /// values never change.
    #[test]
    fn jitter_offsets_are_pinned() {
        for (id, nominal, jitter, offset) in PINNED {
            assert_eq!(
                jitter_offset_ms(id, nominal, jitter),
                offset,
                "{id} {nominal} {jitter}"
            );
        }
    }

    /// Known values of [`jitter_offset_ms`]; also checked against the SQL
    /// (tests/it/jitter.rs).
    /// (Computed independently with Python's hashlib when pinned.)
    const PINNED: [(&str, i64, i64, i64); 5] = [
        ("nightly", 1_767_225_600_000, 10_000, 8_405),
        ("nightly", 1_767_225_660_000, 10_000, 5_040),
        ("herd-00042", 1_767_225_600_000, 10_000, 7_753),
        ("nightly", 1_767_225_600_000, 1, 0),
        ("ünïcode-trigger", 1_767_225_600_000, 3_600_000, 173_650),
    ];

    #[test]
    fn offsets_stay_within_the_jitter_and_spread_over_it() {
        let jitter = 10_000;
        let mut buckets = [0u32; 10];
        for i in 0..10_000 {
            let o = jitter_offset_ms(&format!("herd-{i:05}"), 1_767_225_600_000, jitter);
            assert!((0..jitter).contains(&o), "{o}");
            buckets[(o / 1000) as usize] += 1;
        }
        // Uniform: each second of the jitter gets about a tenth of the herd.
        for b in buckets {
            assert!((850..=1150).contains(&b), "{buckets:?}");
        }
        assert_eq!(jitter_offset_ms("x", 5, 0), 0);
        assert_eq!(jitter_offset_ms("x", 5, -3), 0);
    }

    #[test]
    fn min_gap_of_an_every_minute_expression_is_a_minute() {
        let s = Schedule::parse("* * * * *", "UTC").unwrap();
        let g = min_gap(&s, 1_767_225_600_000, None, 0).unwrap();
        assert_eq!(g.gap_ms, 60_000);
    }

    #[test]
    fn min_gap_finds_the_shortest_pair_of_a_list() {
        // 00:00, 00:50: gaps of 50 and 10 minutes; the 10 are found.
        let s = Schedule::parse("0,50 * * * *", "UTC").unwrap();
        let g = min_gap(&s, 1_767_225_600_000, None, 0).unwrap();
        assert_eq!(g.gap_ms, 600_000);
    }

    #[test]
    fn min_gap_sees_a_daylight_saving_transition() {
        // Europe/Berlin, 01:50 and 03:10 every day: 80 minutes apart, except on the day the
        // clock jumps from 02:00 to 03:00 (2026-03-29), when they are 20 minutes apart.
        let s = Schedule::parse("50 1 * * *", "Europe/Berlin").unwrap();
        let daily = min_gap(&s, 1_767_225_600_000, None, 0).unwrap();
        assert_eq!(daily.gap_ms, 86_400_000 - 3_600_000, "{daily:?}");
        let s = Schedule::parse("10,50 1,3 * * *", "Europe/Berlin").unwrap();
        let g = min_gap(&s, 1_767_225_600_000, None, 0).unwrap();
        assert_eq!(g.gap_ms, 20 * 60_000, "{g:?}");
        // 2026-03-29 00:50 UTC = 01:50 CET.
        assert_eq!(g.after_ms, 1_774_745_400_000);
    }

    #[test]
    fn min_gap_stops_at_the_window_end_and_early_at_a_refusal() {
        let s = Schedule::parse("0 0 1 * *", "UTC").unwrap();
        // One occurrence before the end: no pair.
        assert_eq!(
            min_gap(
                &s,
                1_767_225_600_000,
                Some(1_767_225_600_000 + 86_400_000),
                0
            ),
            None
        );
        let s = Schedule::parse("* * * * * *", "UTC").unwrap();
        assert_eq!(min_gap(&s, 0, None, 5_000).map(|g| g.gap_ms), Some(1_000));
    }

    #[test]
    fn the_window_and_the_claim_index() {
        let t = Timing {
            trigger_id: "w",
            jitter_ms: 0,
            start_at_ms: Some(1_000),
            end_at_ms: Some(5_000),
        };
        assert_eq!(t.search_from(0), 999);
        assert_eq!(t.search_from(2_000), 2_000);
        assert_eq!(t.claimable_at_ms(5_000), Some(5_000));
        assert_eq!(t.claimable_at_ms(5_001), None);
        assert_eq!(t.recorded_due_at_ms(5_000), None);
        let j = Timing {
            jitter_ms: 10_000,
            ..t
        };
        let due = j.claimable_at_ms(5_000).unwrap();
        assert!((5_000..15_000).contains(&due));
        assert_eq!(j.recorded_due_at_ms(5_000), Some(due));
    }
}
