//! Parsing, checking and normalising cron expressions into `cron` crate (Quartz) patterns.
//!
//! Fields are checked in `field` first; the `cron` crate then only matches them against naive
//! local times.

use std::collections::BTreeSet;
use std::str::FromStr;

use super::field::{
    expand_all, DAY_OF_MONTH, DAY_OF_WEEK, DAY_OF_WEEK_QUARTZ, HOUR, MINUTE, MONTH, SECOND, YEAR,
};
use super::ScheduleError;

/// An expression ready to be matched.
pub(super) struct Parsed {
    /// A wall-clock time matches if any pattern matches.
    pub(super) patterns: Vec<cron::Schedule>,
    /// The hour field is `*`, a step, or covers the whole day.
    pub(super) repeat_in_overlap: bool,
}

/// Parses any accepted form (see the module docs).
pub(super) fn parse(expr: &str) -> Result<Parsed, ScheduleError> {
    let trimmed = expr.trim();
    if trimmed.is_empty() {
        return Err(ScheduleError::Empty);
    }
    if trimmed.starts_with('@') {
        let five = match trimmed.to_ascii_lowercase().as_str() {
            "@hourly" => "0 * * * *",
            "@daily" | "@midnight" => "0 0 * * *",
            "@weekly" => "0 0 * * 0",
            "@monthly" => "0 0 1 * *",
            "@yearly" | "@annually" => "0 0 1 1 *",
            _ => return Err(ScheduleError::UnknownMacro(trimmed.to_string())),
        };
        return crontab(&five.split(' ').collect::<Vec<_>>(), expr);
    }
    let fields: Vec<&str> = trimmed.split_whitespace().collect();
    match fields.len() {
        5 => crontab(&fields, expr),
        6 | 7 => quartz(&fields, expr),
        found => Err(ScheduleError::FieldCount {
            expr: expr.to_string(),
            found,
        }),
    }
}

/// Classic 5-field crontab, translated to Quartz form with seconds `0` and day-of-week + 1.
fn crontab(fields: &[&str], expr: &str) -> Result<Parsed, ScheduleError> {
    let specs = [&MINUTE, &HOUR, &DAY_OF_MONTH, &MONTH, &DAY_OF_WEEK];
    let sets = expand_all(fields, &specs)?;
    let render = |set: &Option<BTreeSet<u32>>| match set {
        None => "*".to_string(),
        Some(values) => join(values.iter().copied()),
    };
    let (minute, hour, dom, month) = (
        render(&sets[0]),
        render(&sets[1]),
        render(&sets[2]),
        render(&sets[3]),
    );
    let dow = match &sets[4] {
        None => "*".to_string(),
        Some(days) => join(days.iter().map(|d| d % 7 + 1).collect::<BTreeSet<_>>()),
    };
    let unrestricted = |text: &str| text.starts_with('*') || text.starts_with('?');
    let texts = if !unrestricted(fields[2]) && !unrestricted(fields[4]) {
        // Vixie cron: both restricted means either may match.
        vec![
            format!("0 {minute} {hour} {dom} {month} *"),
            format!("0 {minute} {hour} * {month} {dow}"),
        ]
    } else {
        vec![format!("0 {minute} {hour} {dom} {month} {dow}")]
    };
    let patterns = texts
        .iter()
        .map(|t| compile(t, expr))
        .collect::<Result<_, _>>()?;
    Ok(Parsed {
        patterns,
        repeat_in_overlap: interval_like(fields[1], &sets[1]),
    })
}

/// 6 or 7 fields, seconds first: checked here, then handed to `cron` unchanged.
fn quartz(fields: &[&str], expr: &str) -> Result<Parsed, ScheduleError> {
    let specs = [
        &SECOND,
        &MINUTE,
        &HOUR,
        &DAY_OF_MONTH,
        &MONTH,
        &DAY_OF_WEEK_QUARTZ,
        &YEAR,
    ];
    let sets = expand_all(fields, &specs[..fields.len()])?;
    let pattern = compile(&fields.join(" "), expr)?;
    Ok(Parsed {
        patterns: vec![pattern],
        repeat_in_overlap: interval_like(fields[2], &sets[2]),
    })
}

fn interval_like(hour_text: &str, hours: &Option<BTreeSet<u32>>) -> bool {
    hour_text.contains('*')
        || hour_text.contains('/')
        || hours.as_ref().map_or(true, |h| h.len() == 24)
}

fn compile(text: &str, expr: &str) -> Result<cron::Schedule, ScheduleError> {
    cron::Schedule::from_str(text).map_err(|e| {
        let raw = e.to_string();
        // The parser prints the input with a caret under the failing position.
        let caret = raw.lines().find_map(|line| line.find('^'));
        let message = match caret.and_then(|at| text.get(at..)) {
            Some(rest) => format!("the cron parser cannot read `{rest}`"),
            None => raw.split_whitespace().collect::<Vec<_>>().join(" "),
        };
        ScheduleError::Cron {
            expr: expr.to_string(),
            message,
        }
    })
}

fn join(values: impl IntoIterator<Item = u32>) -> String {
    values
        .into_iter()
        .map(|v| v.to_string())
        .collect::<Vec<_>>()
        .join(",")
}
