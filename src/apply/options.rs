//! The texts of `trigger publish`'s timing and policy options, parsed once for the command
//! line and for the `[[trigger]]` tables of [`super::file`] (so both take the same spellings
//! and refuse the same ones), and written back by [`super::export`].

use std::time::Duration;

/// `500ms`, `2s`, `10m`, `1h` (a bare number is seconds); more than 0.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (n, unit) = s.split_at(split);
    let n: u64 = n
        .parse()
        .map_err(|_| format!("`{s}`: not a duration such as 500ms, 2s, 10m"))?;
    let ms = match unit {
        "ms" => n,
        "" | "s" => n * 1000,
        "m" | "min" => n * 60_000,
        "h" => n * 3_600_000,
        _ => return Err(format!("`{s}`: unit must be ms, s, m or h")),
    };
    if ms == 0 {
        return Err(format!("`{s}`: must be more than 0"));
    }
    Ok(Duration::from_millis(ms))
}

/// `--jitter`: a duration (`250ms`, `10s`, `2m`, `0s`), in ms.
pub fn parse_jitter(text: &str) -> Result<i64, String> {
    let d = crate::config::parse_duration(text)?;
    i64::try_from(d.as_millis()).map_err(|_| "too large".to_string())
}

/// `--start-at`, `--end-at`: an RFC 3339 time, in Unix ms.
pub fn parse_instant(text: &str) -> Result<i64, String> {
    chrono::DateTime::parse_from_rfc3339(text)
        .map(|t| t.timestamp_millis())
        .map_err(|e| format!("not an RFC 3339 time such as 2026-03-01T00:00:00Z ({e})"))
}

/// A policy's duration (`--expect-success-within`): `500ms`, `2s`, `10m`, `26h` as
/// [`parse_duration`] takes them, or `7d`.
pub fn policy_duration(s: &str) -> Result<Duration, String> {
    match s.trim().strip_suffix('d').map(str::parse::<u64>) {
        Some(Ok(n)) if n > 0 => Ok(Duration::from_secs(n.saturating_mul(86_400))),
        Some(_) => Err(format!("`{s}`: not a duration such as 10m, 26h, 7d")),
        None => parse_duration(s),
    }
}

/// A duration in ms as both parsers above take it back: the largest whole unit (`26h`,
/// `90s`, `250ms`; `7d` for whole days, `0s` for none).
#[must_use]
pub fn duration_text(ms: i64) -> String {
    const UNITS: [(i64, &str); 4] = [
        (86_400_000, "d"),
        (3_600_000, "h"),
        (60_000, "m"),
        (1_000, "s"),
    ];
    if ms == 0 {
        return "0s".into();
    }
    UNITS
        .iter()
        .find(|(n, _)| ms % n == 0)
        .map_or_else(|| format!("{ms}ms"), |(n, u)| format!("{}{u}", ms / n))
}

/// An instant in Unix ms as RFC 3339 in UTC, as [`parse_instant`] takes it back
/// (milliseconds only when there are some).
#[must_use]
pub fn instant_text(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms).map_or_else(
        || format!("{ms}"),
        |t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn policy_durations_take_days_too() {
        assert_eq!(policy_duration("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(policy_duration("26h"), Ok(Duration::from_secs(26 * 3_600)));
        assert!(policy_duration("0d").is_err());
        assert!(policy_duration("xd").is_err());
        assert!(policy_duration("1w").is_err());
    }

    #[test]
    fn durations_and_instants_are_written_as_they_are_read() {
        for ms in [
            0,
            250,
            1_500,
            10_000,
            120_000,
            93_600_000,
            86_400_000,
            604_800_000,
        ] {
            let text = duration_text(ms);
            assert_eq!(parse_jitter(&text), Ok(ms), "{text}");
            if ms >= 1 {
                let back = policy_duration(&text).map(|d| d.as_millis() as i64);
                assert_eq!(back, Ok(ms), "{text}");
            }
        }
        for ms in [0, 1_772_323_200_000, 1_772_323_200_123] {
            let text = instant_text(ms);
            assert_eq!(parse_instant(&text), Ok(ms), "{text}");
        }
        assert_eq!(instant_text(1_772_323_200_000), "2026-03-01T00:00:00Z");
    }
}
