//! Operator trigger management: `trigger list | show | disable | enable | delete | fire |
//! backfill`. All through the admin role; a human table by default, `--json` for scripts.

//!
//! `view` prints (`list`, `show`), `ops` changes state and fires (`disable`, `enable`,
//! `delete`, `fire`), `backfill` admits a past window.

mod backfill;
mod ops;
mod view;

pub use backfill::{
    backfill, occurrences_in, BackfillArgs, BACKFILL_DEFAULT_MAX, BACKFILL_HARD_CAP,
};
pub use ops::{delete, disable, enable, fire, ChangeArgs};
pub use view::{list, show};

use serde_json::{json, Value};

use super::error::CliError;
use super::render;
use crate::schedule::Schedule;
use crate::store::triggers::TriggerView;

/// Parses an RFC 3339 time given to `arg` into Unix ms.
pub fn parse_time(arg: &'static str, value: &str) -> Result<i64, CliError> {
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|t| t.timestamp_millis())
        .map_err(|source| CliError::BadTime {
            arg,
            value: value.into(),
            source,
        })
}

/// Who an operator action is recorded as: `--actor`, else the login user, plus the
/// database role it ran as (`alice via qlsched_admin`).
/// Refuses an argument longer than `max` characters (before anything is written).
pub(super) fn at_most(arg: &'static str, value: Option<&str>, max: usize) -> Result<(), CliError> {
    match value.map(|v| v.chars().count()) {
        Some(len) if len > max => Err(CliError::TooLong { arg, len, max }),
        _ => Ok(()),
    }
}

pub(super) async fn actor(
    client: &tokio_postgres::Client,
    given: Option<&str>,
) -> Result<String, CliError> {
    at_most("--actor", given, 100)?;
    let role = crate::store::migrate::current_role(client).await?;
    let person = given
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .filter(|s| !s.is_empty());
    Ok(match person {
        Some(p) => format!("{p} via {role}"),
        None => role,
    })
}

/// The next occurrence the cron will admit: the cursor, or (not yet decided) the first
/// after now; none while the trigger cannot fire.
pub(super) fn next_fire(v: &TriggerView) -> Option<i64> {
    if !v.enabled || v.project_status != "active" {
        return None;
    }
    v.next_fire_at_ms.or_else(|| {
        Schedule::parse(&v.cron_expr, &v.timezone)
            .ok()?
            .next_after_ms(v.now_ms)
    })
}

pub(super) fn state_text(v: &TriggerView) -> String {
    if v.deleted_at_ms.is_some() {
        return format!(
            "deleted {} by {}",
            render::utc(v.deleted_at_ms),
            v.deleted_by.as_deref().unwrap_or("-")
        );
    }
    let base = if v.enabled { "enabled" } else { "disabled" };
    let mut s = base.to_string();
    if !v.enabled && v.operator_disabled {
        s = format!(
            "disabled {} by {}",
            render::utc(v.disabled_at_ms),
            v.disabled_by.as_deref().unwrap_or("-")
        );
        if let Some(n) = &v.disabled_note {
            s.push_str(&format!(": {n}"));
        }
    }
    if v.project_status != "active" {
        s.push_str(&format!(" (project {})", v.project_status));
    }
    s
}

pub(super) fn holder(v: &TriggerView) -> String {
    match (&v.claim_owner, v.claim_expires_at_ms) {
        (Some(o), Some(exp)) if exp > v.now_ms => format!("{o} until {}", render::utc(Some(exp))),
        (Some(o), Some(_)) => format!("{o} (expired)"),
        _ => "-".into(),
    }
}

pub(super) fn view_json(v: &TriggerView) -> Result<Value, CliError> {
    let mut j = serde_json::to_value(v)?;
    let next = next_fire(v);
    j["next_fire_ms"] = json!(next);
    j["next_fire_utc"] = json!(next.map(|n| render::utc(Some(n))));
    j["next_fire_local"] = json!(next.map(|n| render::local(Some(n), &v.timezone)));
    j["held"] = json!(v.claim_owner.is_some() && v.claim_expires_at_ms > Some(v.now_ms));
    Ok(j)
}
