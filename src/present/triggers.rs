//! The read-only views as the CLI's `--json`, its text and the console show them: a trigger
//! with its next fire in UTC and its zone, its state and lease in words, its upcoming
//! occurrences with DST marks, a run as one line. The rows are [`crate::store::browse`]'s.

use chrono::TimeZone;
use chrono_tz::Tz;
use serde::Serialize;

use super::text::{local, utc};
use crate::db::StoreError;
use crate::schedule::{Schedule, Timing};
use crate::store::browse::{next_fire, run_page, RunFilter, RunItem, TriggerFilter, TriggerRows};
use crate::store::manage::{ManageError, ProjectStatus};
use crate::store::triggers::{self, TriggerOutcome, TriggerView};

/// One trigger as `trigger list --json` prints it: the stored view plus the next fire (UTC
/// and the trigger's zone) and whether a live lease holds it.
#[derive(Clone, Debug, Serialize)]
pub struct TriggerItem {
    #[serde(flatten)]
    pub view: TriggerView,
    pub next_fire_ms: Option<i64>,
    pub next_fire_utc: Option<String>,
    pub next_fire_local: Option<String>,
    /// The next fire's jittered instant (a trigger with a jitter only).
    pub next_due_ms: Option<i64>,
    pub next_due_utc: Option<String>,
    pub held: bool,
}

impl TriggerItem {
    pub fn new(view: TriggerView) -> TriggerItem {
        let next = next_fire(&view);
        let due = next.and_then(|n| timing(&view).recorded_due_at_ms(n));
        TriggerItem {
            next_fire_ms: next,
            next_due_ms: due,
            next_due_utc: due.map(|d| utc(Some(d))),
            next_fire_utc: next.map(|n| utc(Some(n))),
            next_fire_local: next.map(|n| local(Some(n), &view.timezone)),
            held: view.claim_owner.is_some() && view.claim_expires_at_ms > Some(view.now_ms),
            view,
        }
    }
}

/// The jitter and window of a trigger as read.
pub fn timing(v: &TriggerView) -> Timing<'_> {
    Timing {
        trigger_id: &v.trigger_id,
        jitter_ms: v.jitter_ms,
        start_at_ms: v.start_at_ms,
        end_at_ms: v.end_at_ms,
    }
}

/// `jitter 10s, window 2026-… → 2026-…`, or `-` (docs/policies-jitter.md).
pub fn timing_text(v: &TriggerView) -> String {
    let mut parts = Vec::new();
    if v.jitter_ms > 0 {
        parts.push(format!("jitter {}", super::text::span(Some(v.jitter_ms))));
    }
    if v.start_at_ms.is_some() || v.end_at_ms.is_some() {
        let at = |ms: Option<i64>| ms.map_or("…".to_string(), |m| utc(Some(m)));
        parts.push(format!(
            "window {} → {}",
            at(v.start_at_ms),
            at(v.end_at_ms)
        ));
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(", ")
    }
}

/// `enabled`, `ended 2026-…`, `disabled 2026-… by alice via qlsched_admin: note`, `deleted …`,
/// with the project's status when it is not active.
pub fn state_text(v: &TriggerView) -> String {
    if v.deleted_at_ms.is_some() {
        return format!(
            "deleted {} by {}",
            utc(v.deleted_at_ms),
            v.deleted_by.as_deref().unwrap_or("-")
        );
    }
    if v.ended {
        return format!("ended {}", utc(v.end_at_ms));
    }
    let base = if v.enabled { "enabled" } else { "disabled" };
    let mut s = base.to_string();
    if !v.enabled && v.operator_disabled {
        s = format!(
            "disabled {} by {}",
            utc(v.disabled_at_ms),
            v.disabled_by.as_deref().unwrap_or("-")
        );
        if let Some(n) = &v.disabled_note {
            s.push_str(&format!(": {n}"));
        }
    }
    if v.project_status != ProjectStatus::Active {
        s.push_str(&format!(" (project {})", v.project_status));
    }
    s
}

/// The short outcome mark of `trigger list` and the console's list: `OVERDUE`, `PAUSED`
/// (by the system after its failures), `3 failed` (in a row), `ok` (the last outcome was a
/// success), `-` (no outcome recorded yet), joined by spaces.
pub fn outcome_mark(o: &TriggerOutcome) -> String {
    let mut parts = Vec::new();
    if o.overdue {
        parts.push("OVERDUE".to_string());
    }
    if o.system_paused_at_ms.is_some() {
        parts.push("PAUSED".to_string());
    }
    if o.consecutive_failures > 0 {
        parts.push(format!("{} failed", o.consecutive_failures));
    } else if o.last_success_at_ms.is_some() {
        parts.push("ok".to_string());
    }
    if parts.is_empty() {
        "-".into()
    } else {
        parts.join(" ")
    }
}

/// `pause after 3 failures; expect success within 26.0 h` or `none`.
pub fn policies_text(o: &TriggerOutcome) -> String {
    let mut parts = Vec::new();
    if let Some(n) = o.pause_after_failures {
        parts.push(format!("pause after {n} failures"));
    }
    if let Some(ms) = o.expect_success_within_ms {
        parts.push(format!(
            "expect success within {}",
            super::text::span(Some(ms))
        ));
    }
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join("; ")
    }
}

/// The summary lines of `trigger show` and the console's trigger page: (label, text).
pub fn outcome_lines(o: &TriggerOutcome) -> Vec<(&'static str, String)> {
    let run = |at: Option<i64>, id: &Option<String>| match (at, id) {
        (Some(at), Some(id)) => format!("{} (run {id})", utc(Some(at))),
        _ => "- (none recorded since the outcome summary began)".into(),
    };
    let mut out = vec![
        ("policies", policies_text(o)),
        (
            "last success",
            run(o.last_success_at_ms, &o.last_success_run_id),
        ),
        (
            "last failure",
            match &o.last_failure_error {
                Some(e) => format!("{}: {e}", run(o.last_failure_at_ms, &o.last_failure_run_id)),
                None => run(o.last_failure_at_ms, &o.last_failure_run_id),
            },
        ),
        ("failures", format!("{} in a row", o.consecutive_failures)),
    ];
    if o.last_cancelled_at_ms.is_some() {
        out.push((
            "last cancel",
            run(o.last_cancelled_at_ms, &o.last_cancelled_run_id),
        ));
    }
    if let Some(at) = o.system_paused_at_ms {
        out.push((
            "paused",
            format!(
                "{} by qlsched after its failures (`trigger enable` resumes it)",
                utc(Some(at))
            ),
        ));
    }
    if let Some(due) = o.success_due_at_ms {
        out.push((
            "success due",
            format!(
                "{}{}",
                utc(Some(due)),
                if o.overdue { " (OVERDUE)" } else { "" }
            ),
        ));
    }
    out
}

/// The overlap policy and what it did: `allow`, or `forbid · 2 unfinished · skipped 3
/// (overlap), last 2026-…` (and `· buffered 2026-…` under buffer_one).
pub fn overlap_text(v: &TriggerView) -> String {
    let mut s = v.overlap_policy.clone();
    if v.overlap_policy != "allow" {
        if let Some(n) = v.overlap_unfinished {
            s.push_str(&format!(" · {n} unfinished"));
        }
    }
    if let Some(b) = v.buffered_for_ms {
        s.push_str(&format!(" · buffered {}", utc(Some(b))));
    }
    if v.skipped_overlap > 0 {
        s.push_str(&format!(" · skipped {} (overlap)", v.skipped_overlap));
        if let Some(&last) = v.last_skipped_ms.last() {
            s.push_str(&format!(", last {}", utc(Some(last))));
        }
    }
    s
}

/// The list's mark of a policy other than allow (` · forbid`), and of recorded skips.
pub fn overlap_mark(v: &TriggerView) -> String {
    let mut s = String::new();
    if v.overlap_policy != "allow" {
        s.push_str(&format!(" · {}", v.overlap_policy));
    }
    if v.skipped_overlap > 0 {
        s.push_str(&format!(" · {} skipped", v.skipped_overlap));
    }
    s
}

/// `a until 2026-…`, `a (expired)` or `-`.
pub fn holder(v: &TriggerView) -> String {
    match (&v.claim_owner, v.claim_expires_at_ms) {
        (Some(o), Some(exp)) if exp > v.now_ms => format!("{o} until {}", utc(Some(exp))),
        (Some(o), Some(_)) => format!("{o} (expired)"),
        _ => "-".into(),
    }
}

/// `trigger list --json`: one page and the id to continue after.
#[derive(Clone, Debug, Serialize)]
pub struct TriggerPage {
    pub triggers: Vec<TriggerItem>,
    pub next_after: Option<String>,
}

impl From<TriggerRows> for TriggerPage {
    fn from(rows: TriggerRows) -> TriggerPage {
        TriggerPage {
            triggers: rows.triggers.into_iter().map(TriggerItem::new).collect(),
            next_after: rows.next_after,
        }
    }
}

/// One page of live triggers ([`crate::store::browse::trigger_rows`]), as shown.
pub async fn trigger_page(
    client: &impl tokio_postgres::GenericClient,
    f: &TriggerFilter<'_>,
    walk: bool,
) -> Result<TriggerPage, StoreError> {
    Ok(crate::store::browse::trigger_rows(client, f, walk)
        .await?
        .into())
}

/// One upcoming occurrence: instant, UTC, wall clock in the trigger's zone, and a mark when
/// the zone's offset differs from the previous occurrence's (a DST change in between).
#[derive(Clone, Debug, Serialize)]
pub struct Occurrence {
    pub ms: i64,
    pub utc: String,
    pub local: String,
    /// `+01:00 → +02:00` when the offset changed since the previous occurrence (or since
    /// the start of the listing).
    pub dst: Option<String>,
    /// The jittered instant it is due at, in UTC (a trigger with a jitter only).
    pub due_ms: Option<i64>,
    pub due_utc: Option<String>,
}

/// The next `count` occurrences after `from_ms` (src/schedule), with DST marks.
pub fn occurrences(schedule: &Schedule, from_ms: i64, count: usize) -> Vec<Occurrence> {
    let tz: Tz = schedule.timezone();
    let offset = |ms: i64| {
        tz.timestamp_millis_opt(ms)
            .single()
            .map(|t| t.format("%:z").to_string())
    };
    let mut prev = offset(from_ms);
    schedule
        .explain(from_ms, count)
        .into_iter()
        .map(|(ms, local)| {
            let now = offset(ms);
            let dst = match (&prev, &now) {
                (Some(a), Some(b)) if a != b => Some(format!("{a} → {b}")),
                _ => None,
            };
            prev = now;
            Occurrence {
                ms,
                utc: utc(Some(ms)),
                local,
                dst,
                due_ms: None,
                due_utc: None,
            }
        })
        .collect()
}

/// `trigger show --json`: the trigger, its next occurrences, its last runs (as the lines
/// `runs list` prints, and as rows).
#[derive(Clone, Debug, Serialize)]
pub struct TriggerDetail {
    #[serde(flatten)]
    pub item: TriggerItem,
    pub upcoming: Vec<Occurrence>,
    pub recent_runs: Vec<String>,
    pub runs: Vec<RunItem>,
}

/// One trigger (deleted ones too), its next `count` occurrences (from the cursor when it is
/// set, else from now; none while disabled) and its last `runs` runs.
pub async fn trigger_detail(
    client: &impl tokio_postgres::GenericClient,
    id: &str,
    count: usize,
    runs: i64,
) -> Result<TriggerDetail, ManageError> {
    let v = triggers::show(client, id).await?;
    let upcoming = if v.enabled {
        let from = v
            .next_fire_at_ms
            .map_or(v.now_ms, |c| (c - 1).min(v.now_ms));
        let s = Schedule::parse(&v.cron_expr, &v.timezone).map_err(|source| {
            ManageError::Definition {
                id: id.into(),
                source,
            }
        })?;
        // Each with its jittered instant; none after the window's end.
        let t = timing(&v);
        occurrences(&s, from, count)
            .into_iter()
            .filter(|o| !t.after_end(o.ms))
            .map(|o| {
                let due = t.recorded_due_at_ms(o.ms);
                Occurrence {
                    due_ms: due,
                    due_utc: due.map(|d| utc(Some(d))),
                    ..o
                }
            })
            .collect()
    } else {
        Vec::new()
    };
    let page = run_page(
        client,
        &RunFilter {
            trigger: Some(id),
            limit: runs,
            ..RunFilter::default()
        },
    )
    .await?;
    Ok(TriggerDetail {
        item: TriggerItem::new(v),
        upcoming,
        recent_runs: page.runs.iter().map(RunItem::line).collect(),
        runs: page.runs,
    })
}

impl RunItem {
    /// The line `runs list` prints.
    pub fn line(&self) -> String {
        let when = chrono::DateTime::from_timestamp_millis(self.scheduled_for_ms)
            .map(|d| d.to_rfc3339())
            .unwrap_or_default();
        format!(
            "{}  {}  scheduled {}  lag {} ms  by {}",
            self.idempotency_key,
            self.status,
            when,
            self.lag_ms.unwrap_or(-1),
            self.admitted_by
        )
    }
}
