//! The decision table (docs/design.md, "Deciding"): grace boundaries, both policies, initialise, not-due, reject, backlog.

use std::time::{Duration, Instant};

use super::test_util::{schedule, utc};
use super::zone::NEXT_AFTER_CALLS;
use super::{decide, decide_with, Decision, MisfirePolicy, DEFAULT_MISFIRE_GRACE_MS};

const GRACE: i64 = DEFAULT_MISFIRE_GRACE_MS;

/// `0 * * * *` in UTC with the default grace.
fn hourly(policy: MisfirePolicy, cursor_ms: Option<i64>, observed_at_ms: i64) -> Decision {
    decide("0 * * * *", "UTC", policy, GRACE, cursor_ms, observed_at_ms)
}

fn next_fire(expr: &str, after_ms: i64) -> i64 {
    schedule(expr, "UTC")
        .next_after_ms(after_ms)
        .expect("fires")
}

#[test]
fn grace_boundaries_for_both_policies() {
    let cursor = utc("2026-05-01 10:00");
    let after_cursor = next_fire("0 * * * *", cursor);
    let fire = Decision::Fire {
        scheduled_for_ms: cursor,
        next_fire_at_ms: after_cursor,
    };
    let skip = Decision::MisfiredSkip {
        missed_ms: cursor,
        next_fire_at_ms: after_cursor,
    };
    let once = Decision::MisfiredFireOnce {
        scheduled_for_ms: cursor,
        next_fire_at_ms: after_cursor,
    };
    let (skip_policy, once_policy) = (MisfirePolicy::Skip, MisfirePolicy::FireOnce);
    // (lateness, policy, expected)
    let cases = [
        (0, skip_policy, &fire),
        (GRACE - 1, skip_policy, &fire),
        (GRACE, skip_policy, &fire),
        (GRACE + 1, skip_policy, &skip),
        (0, once_policy, &fire),
        (GRACE - 1, once_policy, &fire),
        (GRACE, once_policy, &fire),
        (GRACE + 1, once_policy, &once),
    ];
    for (late, policy, expected) in cases {
        let got = hourly(policy, Some(cursor), cursor + late);
        assert_eq!(&got, expected, "{late} ms late, {policy}");
    }
}

#[test]
fn misfire_moves_the_cursor_past_the_observation_not_past_the_cursor() {
    let cursor = utc("2026-05-01 10:00");
    let observed = utc("2026-05-01 13:20");
    let skip = hourly(MisfirePolicy::Skip, Some(cursor), observed);
    assert_eq!(
        skip,
        Decision::MisfiredSkip {
            missed_ms: cursor,
            next_fire_at_ms: utc("2026-05-01 14:00")
        }
    );
    let once = hourly(MisfirePolicy::FireOnce, Some(cursor), observed);
    let expected = Decision::MisfiredFireOnce {
        scheduled_for_ms: cursor,
        next_fire_at_ms: utc("2026-05-01 14:00"),
    };
    assert_eq!(once, expected);
}

#[test]
fn initialise_picks_the_first_occurrence_strictly_after_the_observation() {
    let on_the_hour = utc("2026-05-01 10:00");
    for (observed, next) in [
        (on_the_hour, utc("2026-05-01 11:00")),
        (on_the_hour - 1, on_the_hour),
    ] {
        let got = hourly(MisfirePolicy::Skip, None, observed);
        assert_eq!(
            got,
            Decision::Initialise {
                next_fire_at_ms: next
            }
        );
    }
    let berlin = decide(
        "30 2 * * *",
        "Europe/Berlin",
        MisfirePolicy::Skip,
        GRACE,
        None,
        utc("2026-03-28 12:00"),
    );
    assert_eq!(
        berlin,
        Decision::Initialise {
            next_fire_at_ms: utc("2026-03-29 01:00")
        }
    );
}

#[test]
fn a_cursor_in_the_future_is_not_due() {
    let cursor = utc("2026-05-01 10:00");
    for policy in [MisfirePolicy::Skip, MisfirePolicy::FireOnce] {
        let got = hourly(policy, Some(cursor), cursor - 1);
        assert_eq!(
            got,
            Decision::NotDue {
                next_fire_at_ms: cursor
            }
        );
    }
}

#[test]
fn a_negative_grace_counts_as_zero() {
    let cursor = utc("2026-05-01 10:00");
    let on_time = decide(
        "0 * * * *",
        "UTC",
        MisfirePolicy::Skip,
        -5,
        Some(cursor),
        cursor,
    );
    assert!(matches!(on_time, Decision::Fire { .. }), "{on_time:?}");
    let late = decide(
        "0 * * * *",
        "UTC",
        MisfirePolicy::Skip,
        -5,
        Some(cursor),
        cursor + 1,
    );
    assert!(matches!(late, Decision::MisfiredSkip { .. }), "{late:?}");
}

#[test]
fn definitions_that_cannot_be_evaluated_are_rejected_with_a_reason() {
    let now = utc("2028-01-01 00:00");
    let cases = [
        (
            "0 9 * * 8",
            "UTC",
            "cron field 5 (day-of-week) `8`: value out of range 0-7",
        ),
        (
            "0 * * * *",
            "Europe/Berln",
            "unknown IANA time zone `Europe/Berln`",
        ),
        ("0 0 30 2 *", "UTC", "never fires"),
        ("0 0 0 1 1 * 2027", "UTC", "has no occurrence after"),
    ];
    for (expr, tz, fragment) in cases {
        for cursor in [None, Some(now - 3_600_000)] {
            match decide(expr, tz, MisfirePolicy::FireOnce, GRACE, cursor, now) {
                Decision::Reject { reason } => {
                    assert!(reason.to_string().contains(fragment), "{reason}")
                }
                other => panic!("{expr} in {tz}: expected Reject, got {other:?}"),
            }
        }
    }
}

#[test]
fn a_backlog_of_ten_thousand_seconds_is_not_replayed() {
    let every_second = schedule("*/1 * * * * *", "UTC");
    let observed = utc("2026-05-01 10:00:00") + 250;
    let cursor = utc("2026-05-01 10:00:00") - 10_000_000;
    let next = utc("2026-05-01 10:00:01");
    let skip = decide_with(
        &every_second,
        MisfirePolicy::Skip,
        GRACE,
        Some(cursor),
        observed,
    );
    assert_eq!(
        skip,
        Decision::MisfiredSkip {
            missed_ms: cursor,
            next_fire_at_ms: next
        }
    );
    let once = decide_with(
        &every_second,
        MisfirePolicy::FireOnce,
        GRACE,
        Some(cursor),
        observed,
    );
    assert_eq!(
        once,
        Decision::MisfiredFireOnce {
            scheduled_for_ms: cursor,
            next_fire_at_ms: next
        }
    );
}

#[test]
fn ten_years_of_missed_seconds_cost_at_most_two_searches() {
    let every_second = schedule("*/1 * * * * *", "Europe/Berlin");
    let observed = utc("2036-05-01 10:00:00");
    let cursor = utc("2026-05-01 10:00:00");
    for policy in [MisfirePolicy::Skip, MisfirePolicy::FireOnce] {
        NEXT_AFTER_CALLS.with(|calls| calls.set(0));
        let started = Instant::now();
        let got = decide_with(&every_second, policy, GRACE, Some(cursor), observed);
        let elapsed = started.elapsed();
        let calls = NEXT_AFTER_CALLS.with(|calls| calls.get());
        assert!(calls <= 2, "{calls} next_after calls");
        assert!(elapsed < Duration::from_millis(200), "took {elapsed:?}");
        let next_fire_at_ms = utc("2036-05-01 10:00:01");
        let expected = match policy {
            MisfirePolicy::Skip => Decision::MisfiredSkip {
                missed_ms: cursor,
                next_fire_at_ms,
            },
            MisfirePolicy::FireOnce => Decision::MisfiredFireOnce {
                scheduled_for_ms: cursor,
                next_fire_at_ms,
            },
        };
        assert_eq!(got, expected);
    }
    for cursor in [None, Some(observed - 1), Some(observed + 1)] {
        NEXT_AFTER_CALLS.with(|calls| calls.set(0));
        let got = decide_with(
            &every_second,
            MisfirePolicy::FireOnce,
            GRACE,
            cursor,
            observed,
        );
        assert!(!matches!(got, Decision::Reject { .. }), "{got:?}");
        assert!(NEXT_AFTER_CALLS.with(|calls| calls.get()) <= 2);
    }
}

#[test]
fn misfire_policy_round_trips_through_its_stored_spelling() {
    for policy in [MisfirePolicy::Skip, MisfirePolicy::FireOnce] {
        assert_eq!(policy.as_str().parse::<MisfirePolicy>(), Ok(policy));
        assert_eq!(policy.to_string(), policy.as_str());
    }
    let err = "fire-once"
        .parse::<MisfirePolicy>()
        .expect_err("hyphen is not accepted");
    assert_eq!(
        err.to_string(),
        "unknown misfire policy `fire-once`: expected `skip` or `fire_once`"
    );
    assert_eq!(DEFAULT_MISFIRE_GRACE_MS, 60_000);
}

/// A reject names its cause as a type: a parse error keeps the parser's error, an
/// expression that runs out of occurrences says after which instant.
#[test]
fn a_reject_carries_a_typed_reason() {
    use super::{RejectReason, ScheduleError};
    let now = utc("2026-05-01 10:00:00");
    assert_eq!(
        decide(
            "0 * * * *",
            "Mars/Base",
            MisfirePolicy::Skip,
            GRACE,
            None,
            now
        ),
        Decision::Reject {
            reason: RejectReason::Invalid(ScheduleError::UnknownTimeZone("Mars/Base".into()))
        }
    );
    assert!(matches!(
        decide("0 0 0 1 1 * 2027", "UTC", MisfirePolicy::Skip, GRACE, None, utc("2028-01-01 00:00:00")),
        Decision::Reject { reason: RejectReason::NoOccurrenceAfter { after_ms, .. } }
            if after_ms == utc("2028-01-01 00:00:00")
    ));
}

/// Jitter and window (docs/policies-jitter.md): an hourly trigger with a 10-minute jitter.
mod timed {
    use super::super::{decide_timed, jitter_offset_ms, Timing};
    use super::*;

    const ID: &str = "nightly";
    const JITTER: i64 = 600_000;

    fn timed(timing: &Timing<'_>, cursor: Option<i64>, observed: i64, grace: i64) -> Decision {
        decide_timed(
            &schedule("0 * * * *", "UTC"),
            MisfirePolicy::Skip,
            grace,
            timing,
            cursor,
            observed,
        )
    }

    fn jittered() -> Timing<'static> {
        Timing {
            trigger_id: ID,
            jitter_ms: JITTER,
            ..Timing::default()
        }
    }

    #[test]
    fn a_jittered_occurrence_is_not_due_before_its_jittered_instant() {
        let cursor = utc("2026-05-01 10:00");
        let offset = jitter_offset_ms(ID, cursor, JITTER);
        assert!(offset > 0, "pick an id whose offset is not 0");
        let t = jittered();
        assert_eq!(
            timed(&t, Some(cursor), cursor + offset - 1, GRACE),
            Decision::NotDue {
                next_fire_at_ms: cursor
            }
        );
        assert_eq!(
            timed(&t, Some(cursor), cursor + offset, GRACE),
            Decision::Fire {
                scheduled_for_ms: cursor,
                next_fire_at_ms: utc("2026-05-01 11:00"),
            }
        );
    }

    #[test]
    fn the_misfire_grace_counts_from_the_jittered_instant() {
        let cursor = utc("2026-05-01 10:00");
        let offset = jitter_offset_ms(ID, cursor, JITTER);
        let t = jittered();
        let grace = 1_000;
        // Later than the grace from the nominal instant, within it from the jittered one.
        assert!(matches!(
            timed(&t, Some(cursor), cursor + offset + grace, grace),
            Decision::Fire { .. }
        ));
        assert!(matches!(
            timed(&t, Some(cursor), cursor + offset + grace + 1, grace),
            Decision::MisfiredSkip { missed_ms, .. } if missed_ms == cursor
        ));
    }

    #[test]
    fn nothing_before_the_start_or_after_the_end_of_the_window() {
        let start = utc("2026-05-01 10:30");
        let end = utc("2026-05-01 12:00");
        let t = Timing {
            trigger_id: ID,
            start_at_ms: Some(start),
            end_at_ms: Some(end),
            ..Timing::default()
        };
        // A pending row, or a cursor before the start, goes to the first occurrence in it.
        for cursor in [None, Some(utc("2026-05-01 10:00"))] {
            assert_eq!(
                timed(&t, cursor, utc("2026-05-01 09:00"), GRACE),
                Decision::Initialise {
                    next_fire_at_ms: utc("2026-05-01 11:00")
                }
            );
        }
        // The end itself is in the window; after it, the trigger has ended.
        assert!(matches!(
            timed(&t, Some(end), end, GRACE),
            Decision::Fire { scheduled_for_ms, .. } if scheduled_for_ms == end
        ));
        assert_eq!(
            timed(
                &t,
                Some(utc("2026-05-01 13:00")),
                utc("2026-05-01 13:00"),
                GRACE
            ),
            Decision::Ended {
                next_fire_at_ms: utc("2026-05-01 13:00")
            }
        );
    }

    #[test]
    fn without_jitter_or_window_it_is_the_plain_decision() {
        let t = Timing {
            trigger_id: ID,
            ..Timing::default()
        };
        let cursor = utc("2026-05-01 10:00");
        for observed in [cursor - 1, cursor, cursor + GRACE, cursor + GRACE + 1] {
            for c in [None, Some(cursor)] {
                assert_eq!(
                    timed(&t, c, observed, GRACE),
                    decide_with(
                        &schedule("0 * * * *", "UTC"),
                        MisfirePolicy::Skip,
                        GRACE,
                        c,
                        observed
                    )
                );
            }
        }
    }
}
