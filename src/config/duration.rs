//! Durations as written in the config: a whole number followed by `ms`, `s`, `m`, `h` or `d`.

use std::time::Duration;

/// Parses `"250ms"`, `"30s"`, `"2m"`, `"1h"`, `"30d"`. No spaces, no sign, no fractions.
pub(super) fn parse(text: &str) -> Result<Duration, String> {
    const EXPECTED: &str =
        "expected a whole number followed by ms, s, m, h or d (e.g. \"250ms\", \"30s\", \"2m\", \"1h\", \"30d\")";
    if text.starts_with('-') {
        return Err(format!("must not be negative; {EXPECTED}"));
    }
    let digits_end = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, unit) = text.split_at(digits_end);
    if digits.is_empty() {
        return Err(format!("not a duration; {EXPECTED}"));
    }
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("number too large; {EXPECTED}"))?;
    let millis_per_unit: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        "" => return Err(format!("missing unit; {EXPECTED}")),
        _ => return Err(format!("unknown unit {unit:?}; {EXPECTED}")),
    };
    n.checked_mul(millis_per_unit)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("number too large; {EXPECTED}"))
}

/// The shortest exact rendering in the same units: `250ms`, `30s`, `3600s`.
pub(super) fn format(d: Duration) -> String {
    let ms = d.as_millis();
    if ms % 1_000 == 0 {
        format!("{}s", ms / 1_000)
    } else {
        format!("{ms}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_unit() {
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("2h"), Ok(Duration::from_secs(7200)));
        assert_eq!(parse("30d"), Ok(Duration::from_secs(30 * 86400)));
    }

    #[test]
    fn rejects_malformed_text() {
        for bad in [
            "",
            "s",
            "10",
            "10 s",
            "1.5s",
            "10 parsecs",
            "10w",
            " 1s",
            "-5s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should not parse");
        }
        assert!(parse("-5s").unwrap_err().contains("negative"));
        assert!(parse("99999999999999999999m").is_err());
        assert!(parse("999999999999999999m").is_err());
    }

    #[test]
    fn formats_whole_seconds_as_seconds() {
        assert_eq!(format(Duration::from_secs(3)), "3s");
        assert_eq!(format(Duration::from_millis(300)), "300ms");
        assert_eq!(format(Duration::from_secs(3600)), "3600s");
    }
}
