//! One cron field: its bounds and names, and the set of values a field's text selects.
//!
//! Every field is checked here before the `cron` crate sees it, so that errors name the
//! field by position and name and say why.

use std::collections::BTreeSet;

use super::ScheduleError;

pub(super) struct FieldSpec {
    name: &'static str,
    min: u32,
    max: u32,
    /// Upper end of `*` when stepping (`*/2`): crontab day-of-week stops at 6, not 7.
    star_max: u32,
    /// `?` is accepted as a synonym of `*` (day-of-month and day-of-week).
    allows_any: bool,
    names: &'static [(&'static str, u32)],
    names_hint: &'static str,
}

#[rustfmt::skip]
const MONTH_NAMES: &[(&str, u32)] = &[
    ("jan", 1), ("january", 1), ("feb", 2), ("february", 2), ("mar", 3), ("march", 3),
    ("apr", 4), ("april", 4), ("may", 5), ("jun", 6), ("june", 6), ("jul", 7), ("july", 7),
    ("aug", 8), ("august", 8), ("sep", 9), ("september", 9), ("oct", 10), ("october", 10),
    ("nov", 11), ("november", 11), ("dec", 12), ("december", 12),
];
/// Crontab numbering: 0 = Sunday.
#[rustfmt::skip]
const DOW_NAMES: &[(&str, u32)] = &[
    ("sun", 0), ("sunday", 0), ("mon", 1), ("monday", 1), ("tue", 2), ("tues", 2),
    ("tuesday", 2), ("wed", 3), ("wednesday", 3), ("thu", 4), ("thurs", 4), ("thursday", 4),
    ("fri", 5), ("friday", 5), ("sat", 6), ("saturday", 6),
];
/// Quartz numbering (the `cron` crate): 1 = Sunday.
#[rustfmt::skip]
const DOW_NAMES_QUARTZ: &[(&str, u32)] = &[
    ("sun", 1), ("sunday", 1), ("mon", 2), ("monday", 2), ("tue", 3), ("tues", 3),
    ("tuesday", 3), ("wed", 4), ("wednesday", 4), ("thu", 5), ("thurs", 5), ("thursday", 5),
    ("fri", 6), ("friday", 6), ("sat", 7), ("saturday", 7),
];

const fn spec(name: &'static str, min: u32, max: u32) -> FieldSpec {
    FieldSpec {
        name,
        min,
        max,
        star_max: max,
        allows_any: false,
        names: &[],
        names_hint: "",
    }
}
pub(super) const SECOND: FieldSpec = spec("second", 0, 59);
pub(super) const MINUTE: FieldSpec = spec("minute", 0, 59);
pub(super) const HOUR: FieldSpec = spec("hour", 0, 23);
pub(super) const DAY_OF_MONTH: FieldSpec = FieldSpec {
    allows_any: true,
    ..spec("day-of-month", 1, 31)
};
pub(super) const MONTH: FieldSpec = FieldSpec {
    names: MONTH_NAMES,
    names_hint: "JAN-DEC",
    ..spec("month", 1, 12)
};
pub(super) const DAY_OF_WEEK: FieldSpec = FieldSpec {
    star_max: 6,
    allows_any: true,
    names: DOW_NAMES,
    names_hint: "SUN-SAT",
    ..spec("day-of-week", 0, 7)
};
pub(super) const DAY_OF_WEEK_QUARTZ: FieldSpec = FieldSpec {
    allows_any: true,
    names: DOW_NAMES_QUARTZ,
    names_hint: "SUN-SAT",
    ..spec("day-of-week", 1, 7)
};
pub(super) const YEAR: FieldSpec = spec("year", 1970, 2100);

pub(super) fn expand_all(
    fields: &[&str],
    specs: &[&FieldSpec],
) -> Result<Vec<Option<BTreeSet<u32>>>, ScheduleError> {
    let positions = fields.iter().zip(specs).enumerate();
    positions
        .map(|(i, (text, spec))| expand(text, i + 1, spec))
        .collect()
}

/// The values a field selects; `None` when it is unrestricted (`*`, or `?` where allowed).
fn expand(
    text: &str,
    position: usize,
    spec: &FieldSpec,
) -> Result<Option<BTreeSet<u32>>, ScheduleError> {
    if text == "*" || (text == "?" && spec.allows_any) {
        return Ok(None);
    }
    let field = Field {
        position,
        spec,
        text,
    };
    let mut set = BTreeSet::new();
    for item in text.split(',') {
        field.expand_item(item, &mut set)?;
    }
    Ok(Some(set))
}

struct Field<'a> {
    position: usize,
    spec: &'a FieldSpec,
    text: &'a str,
}

impl Field<'_> {
    fn error(&self, token: &str, reason: impl Into<String>) -> ScheduleError {
        ScheduleError::Field {
            position: self.position,
            name: self.spec.name,
            token: token.to_string(),
            reason: reason.into(),
        }
    }

    fn expand_item(&self, item: &str, set: &mut BTreeSet<u32>) -> Result<(), ScheduleError> {
        if item.is_empty() {
            return Err(self.error(self.text, "empty list item"));
        }
        let (base, step) = match item.split_once('/') {
            Some((base, step)) => (base, Some(self.step(item, step)?)),
            None => (item, None),
        };
        let spec = self.spec;
        let (lo, hi) = if base == "*" || (base == "?" && spec.allows_any) {
            (spec.min, spec.star_max)
        } else if let Some((a, b)) = base.split_once('-') {
            let (a, b) = (self.value(item, a)?, self.value(item, b)?);
            if a > b {
                return Err(self.error(item, format!("range start {a} is greater than end {b}")));
            }
            (a, b)
        } else {
            let v = self.value(item, base)?;
            (
                v,
                if step.is_some() {
                    spec.star_max.max(v)
                } else {
                    v
                },
            )
        };
        set.extend((lo..=hi).step_by(step.unwrap_or(1) as usize));
        Ok(())
    }

    fn step(&self, item: &str, step: &str) -> Result<u32, ScheduleError> {
        let max = self.spec.max;
        match step.parse::<u32>() {
            Ok(n) if (1..=max).contains(&n) => Ok(n),
            Ok(n) => Err(self.error(item, format!("step {n} out of range 1-{max}"))),
            Err(_) => Err(self.error(item, format!("step `{step}` is not a number"))),
        }
    }

    fn value(&self, item: &str, token: &str) -> Result<u32, ScheduleError> {
        let spec = self.spec;
        if token.is_empty() {
            return Err(self.error(item, "missing value (a range needs a start and an end)"));
        }
        if token.bytes().all(|b| b.is_ascii_digit()) {
            return match token.parse::<u32>() {
                Ok(v) if (spec.min..=spec.max).contains(&v) => Ok(v),
                _ => Err(self.error(
                    token,
                    format!("value out of range {}-{}", spec.min, spec.max),
                )),
            };
        }
        if token.bytes().all(|b| b.is_ascii_alphabetic()) && !spec.names.is_empty() {
            let lower = token.to_ascii_lowercase();
            return match spec.names.iter().find(|(name, _)| *name == lower) {
                Some((_, v)) => Ok(*v),
                None => {
                    Err(self.error(token, format!("unknown name, expected {}", spec.names_hint)))
                }
            };
        }
        let names = if spec.names.is_empty() {
            ""
        } else {
            ", a name"
        };
        Err(self.error(
            token,
            format!("unparsable token: expected a number{names}, `*`, a range `a-b`, a step `/n` or a list `a,b`"),
        ))
    }
}
