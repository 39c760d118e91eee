//! Accepted forms and the exact reasons bad expressions and zones are refused.

use super::test_util::schedule;
use super::{Schedule, ScheduleError};

/// (expression, fragment the error message must contain).
const BAD: &[(&str, &str)] = &[
    ("", "empty cron expression"),
    ("   ", "empty cron expression"),
    (
        "30 2 * *",
        "has 4 fields: expected 5 (minute hour day-of-month month day-of-week), or 6 or 7",
    ),
    ("0 0 0 1 1 * 2027 5", "has 8 fields"),
    ("@fortnightly", "unknown cron macro `@fortnightly`"),
    (
        "0 9 * * 8",
        "cron field 5 (day-of-week) `8`: value out of range 0-7",
    ),
    (
        "60 * * * *",
        "cron field 1 (minute) `60`: value out of range 0-59",
    ),
    (
        "0 24 * * *",
        "cron field 2 (hour) `24`: value out of range 0-23",
    ),
    (
        "0 0 0 * *",
        "cron field 3 (day-of-month) `0`: value out of range 1-31",
    ),
    (
        "0 0 1 13 *",
        "cron field 4 (month) `13`: value out of range 1-12",
    ),
    (
        "0 0 * * 1,2,9",
        "cron field 5 (day-of-week) `9`: value out of range 0-7",
    ),
    (
        "0 0 * * 5-1",
        "cron field 5 (day-of-week) `5-1`: range start 5 is greater than end 1",
    ),
    (
        "*/0 * * * *",
        "cron field 1 (minute) `*/0`: step 0 out of range 1-59",
    ),
    (
        "*/x * * * *",
        "cron field 1 (minute) `*/x`: step `x` is not a number",
    ),
    (
        "0 0 L * *",
        "cron field 3 (day-of-month) `L`: unparsable token",
    ),
    (
        "0 0 * * 5#3",
        "cron field 5 (day-of-week) `5#3`: unparsable token",
    ),
    (
        "0 0 * FOO *",
        "cron field 4 (month) `FOO`: unknown name, expected JAN-DEC",
    ),
    (
        "0 0 * * MOON",
        "cron field 5 (day-of-week) `MOON`: unknown name, expected SUN-SAT",
    ),
    (
        "1,,2 * * * *",
        "cron field 1 (minute) `1,,2`: empty list item",
    ),
    ("0 -5 * * *", "cron field 2 (hour) `-5`: missing value"),
    ("0 ? * * *", "cron field 2 (hour) `?`: unparsable token"),
    // Quartz form: seconds first, day-of-week 1-7, optional year.
    (
        "60 0 0 * * *",
        "cron field 1 (second) `60`: value out of range 0-59",
    ),
    (
        "0 0 0 * * 0",
        "cron field 6 (day-of-week) `0`: value out of range 1-7",
    ),
    (
        "0 0 0 1 1 * 1969",
        "cron field 7 (year) `1969`: value out of range 1970-2100",
    ),
    (
        "0 0 0 * * MON/2",
        "cron expression `0 0 0 * * MON/2`: the cron parser cannot read `/2`",
    ),
    (
        "0 0 30 2 *",
        "expression never fires (e.g. day 30 of February): `0 0 30 2 *` matches no date",
    ),
    ("0 0 31 4,6,9,11 *", "never fires"),
];

#[test]
fn bad_expressions_name_the_field_and_the_reason() {
    for (expr, fragment) in BAD {
        let err = Schedule::parse(expr, "UTC").expect_err(expr).to_string();
        assert!(
            err.contains(fragment),
            "`{expr}`: {err:?} lacks {fragment:?}"
        );
    }
}

#[test]
fn unknown_zones_are_quoted() {
    for tz in ["Europe/Berln", "", "CEST", "europe/berlin", " UTC"] {
        let err = Schedule::parse("0 * * * *", tz).expect_err(tz);
        assert_eq!(err, ScheduleError::UnknownTimeZone(tz.to_string()));
        assert_eq!(err.to_string(), format!("unknown IANA time zone `{tz}`"));
    }
}

#[test]
fn good_expressions_and_zones_parse() {
    let good = [
        "30 2 * * *",
        "*/15 * * * *",
        "0 9 * * 1-5",
        "0 9 * * MON-FRI",
        "0 0 1,15 * *",
        "5/10 * * * *",
        "0 0 * * 0,7",
        "0 0 ? * MON",
        "  0   0  *  *  *  ",
        "@HOURLY",
        "0 */5 * * * *",
        "0 0 9 ? * MON-FRI",
        "0 0 0 1 1 ? 2030",
        "* * * * * *",
        "0 0 12 * JAN-MAR/2 *",
        "0 0 * * SUN-SAT/2",
    ];
    for expr in good {
        for tz in [
            "UTC",
            "Europe/Berlin",
            "Australia/Lord_Howe",
            "America/Argentina/Buenos_Aires",
        ] {
            let s = schedule(expr, tz);
            assert_eq!(s.expression(), expr, "the user's text is kept for display");
        }
    }
}

#[test]
fn overlap_repetition_follows_the_hour_field() {
    let cases = [
        ("0 * * * *", true),
        ("*/15 * * * *", true),
        ("0 */2 * * *", true),
        ("0 0-23 * * *", true),
        ("0 5/1 * * *", true),
        ("@hourly", true),
        ("30 2 * * *", false),
        ("0 1,2,3 * * *", false),
        ("*/5 1-3 * * *", false),
        ("@daily", false),
        ("0 30 2 * * *", false),
        ("0 0 * * * *", true),
    ];
    for (expr, repeats) in cases {
        assert_eq!(schedule(expr, "UTC").repeat_in_overlap, repeats, "{expr}");
    }
}
