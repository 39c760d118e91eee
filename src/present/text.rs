//! Human output: aligned tables, durations and times in UTC and in a trigger's zone.

use chrono::{DateTime, TimeZone};
use chrono_tz::Tz;

/// `2026-03-29T01:00:00Z`, or `-`.
pub fn utc(ms: Option<i64>) -> String {
    ms.and_then(DateTime::from_timestamp_millis)
        .map(|d| d.format("%Y-%m-%dT%H:%M:%SZ").to_string())
        .unwrap_or_else(|| "-".into())
}

/// `2026-03-29 03:00:00 CEST` in `zone`, or `-`.
pub fn local(ms: Option<i64>, zone: &str) -> String {
    let (Some(ms), Ok(tz)) = (ms, zone.parse::<Tz>()) else {
        return "-".into();
    };
    tz.timestamp_millis_opt(ms)
        .single()
        .map(|t| t.format("%Y-%m-%d %H:%M:%S %Z").to_string())
        .unwrap_or_else(|| "-".into())
}

/// A duration in ms as `850 ms`, `12.3 s`, `4 min`, `-`.
pub fn span(ms: Option<i64>) -> String {
    match ms {
        None => "-".into(),
        Some(v) if v.abs() < 1_000 => format!("{v} ms"),
        Some(v) if v.abs() < 60_000 => format!("{:.1} s", v as f64 / 1000.0),
        Some(v) if v.abs() < 3_600_000 => format!("{} min", v / 60_000),
        Some(v) => format!("{:.1} h", v as f64 / 3_600_000.0),
    }
}

/// Left-aligned columns separated by two spaces; the header row first.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut width: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut s = String::new();
        for (i, (c, w)) in cells.iter().zip(&width).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(c);
            } else {
                s.push_str(&format!("{c:<w$}  ", w = *w));
            }
        }
        s.trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// RFC 3339 with the offset spelled `+00:00` (`runs show`), or the bare ms when out of
/// range.
pub fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339())
        .unwrap_or_else(|| ms.to_string())
}

/// `3d 4h`, `2h 5m`, `1m 30s`, `400ms`: the two largest units (retention's ages and
/// horizons in `qlsched status`).
pub fn two_units(ms: i64) -> String {
    let units = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ];
    let mut parts = Vec::new();
    let mut rest = ms.max(0);
    for (name, size) in units {
        if rest >= size || !parts.is_empty() {
            parts.push(format!("{}{name}", rest / size));
            rest %= size;
        }
        if parts.len() == 2 {
            break;
        }
    }
    if parts.is_empty() {
        return format!("{}ms", ms.max(0));
    }
    parts.retain(|p| !p.starts_with('0'));
    parts.join(" ")
}

#[cfg(test)]
mod tests {
    use super::two_units as span;

    #[test]
    fn spans_show_the_two_largest_units() {
        assert_eq!(span(3_600_000), "1h");
        assert_eq!(span(2 * 86_400_000 + 3 * 3_600_000 + 5_000), "2d 3h");
        assert_eq!(span(30 * 86_400_000), "30d");
        assert_eq!(span(90_000), "1m 30s");
        assert_eq!(span(400), "400ms");
    }
}
