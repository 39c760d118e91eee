//! Bound checks that record a problem (blamed on the layer that wrote the key) instead of
//! stopping at the first one.

use std::time::Duration;

use super::error::ConfigProblem;
use super::layers::Merged;

/// Collects problems, each blamed on the layer that wrote its key.
pub(super) struct Checker<'a> {
    merged: &'a Merged,
    /// Blamed for keys no layer wrote (missing required keys): the replica file.
    fallback: &'a str,
    pub(super) problems: Vec<ConfigProblem>,
}

impl<'a> Checker<'a> {
    pub(super) fn new(merged: &'a Merged, fallback: &'a str) -> Self {
        Checker {
            merged,
            fallback,
            problems: Vec::new(),
        }
    }

    pub(super) fn problem(
        &mut self,
        key: &str,
        value: impl Into<String>,
        bound: impl Into<String>,
    ) {
        let file = self.merged.origin_of(key, self.fallback);
        self.problems
            .push(ConfigProblem::new(file, key, value, bound));
    }

    /// A problem with `key` blamed on the layer that wrote `blame` (e.g. the bind address
    /// that makes a default unacceptable).
    pub(super) fn problem_blaming(
        &mut self,
        blame: &str,
        key: &str,
        value: impl Into<String>,
        bound: impl Into<String>,
    ) {
        let file = self.merged.origin_of(blame, self.fallback);
        self.problems
            .push(ConfigProblem::new(file, key, value, bound));
    }

    pub(super) fn required<T>(&mut self, key: &str, value: Option<T>) -> Option<T> {
        if value.is_none() {
            self.problem(key, "(missing)", "is required");
        }
        value
    }

    /// `why` (may be empty) is appended to the bound to explain it.
    pub(super) fn int(
        &mut self,
        key: &str,
        value: Option<i64>,
        (lo, hi): (u32, u32),
        why: &str,
    ) -> Option<u32> {
        let v = self.required(key, value)?;
        match u32::try_from(v) {
            Ok(n) if (lo..=hi).contains(&n) => Some(n),
            _ => {
                self.problem(
                    key,
                    v.to_string(),
                    format!("must be within {lo}..={hi}{why}"),
                );
                None
            }
        }
    }

    pub(super) fn duration(
        &mut self,
        key: &str,
        value: Option<String>,
        lo: Duration,
        hi: Duration,
    ) -> Option<(Duration, String)> {
        let text = self.required(key, value)?;
        match super::duration::parse(&text) {
            Ok(d) if (lo..=hi).contains(&d) => Some((d, text)),
            Ok(_) => {
                let bound = format!(
                    "must be within {}..={}",
                    super::duration::format(lo),
                    super::duration::format(hi)
                );
                self.problem(key, text, bound);
                None
            }
            Err(msg) => {
                self.problem(key, text, msg);
                None
            }
        }
    }

    pub(super) fn one_of(
        &mut self,
        key: &str,
        value: Option<String>,
        allowed: &[&str],
    ) -> Option<String> {
        let v = self.required(key, value)?;
        if allowed.contains(&v.as_str()) {
            Some(v)
        } else {
            self.problem(key, v, format!("must be one of {}", allowed.join(", ")));
            None
        }
    }
}
