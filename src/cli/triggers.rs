//! Operator trigger management: `trigger list | show | disable | enable | delete | fire |
//! backfill`. All through the admin role; a human table by default, `--json` for scripts.

use clap::Args;
use serde_json::{json, Value};

use super::connect::{self, Target};
use super::error::CliError;
use super::render;
use crate::schedule::Schedule;
use crate::store::manage;
use crate::store::triggers::{self, Changed, ListQuery, StateFilter, TriggerView};

/// `--max` may not exceed this: one backfill admits at most 100,000 occurrences.
pub const BACKFILL_HARD_CAP: usize = 100_000;
/// Default `--max`.
pub const BACKFILL_DEFAULT_MAX: usize = 1_000;
/// Default occurrences per committed chunk.
pub const BACKFILL_DEFAULT_CHUNK: usize = 500;

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

/// Every occurrence of `schedule` in `[from_ms, to_ms)`, in order, or `None` as soon as
/// there are more than `max` (nothing further is computed).
pub fn occurrences_in(
    schedule: &Schedule,
    from_ms: i64,
    to_ms: i64,
    max: usize,
) -> Option<Vec<i64>> {
    let mut out = Vec::new();
    let mut at = from_ms - 1;
    while let Some(t) = schedule.next_after_ms(at) {
        if t >= to_ms {
            break;
        }
        if out.len() == max {
            return None;
        }
        out.push(t);
        at = t;
    }
    Some(out)
}

/// Who an operator action is recorded as: `--actor`, else the login user, plus the
/// database role it ran as (`alice via qlsched_admin`).
async fn actor(client: &tokio_postgres::Client, given: Option<&str>) -> Result<String, CliError> {
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
fn next_fire(v: &TriggerView) -> Option<i64> {
    if !v.enabled || v.project_status != "active" {
        return None;
    }
    v.next_fire_at_ms.or_else(|| {
        Schedule::parse(&v.cron_expr, &v.timezone)
            .ok()?
            .next_after_ms(v.now_ms)
    })
}

fn state_text(v: &TriggerView) -> String {
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

fn holder(v: &TriggerView) -> String {
    match (&v.claim_owner, v.claim_expires_at_ms) {
        (Some(o), Some(exp)) if exp > v.now_ms => format!("{o} until {}", render::utc(Some(exp))),
        (Some(o), Some(_)) => format!("{o} (expired)"),
        _ => "-".into(),
    }
}

fn view_json(v: &TriggerView) -> Result<Value, CliError> {
    let mut j = serde_json::to_value(v)?;
    let next = next_fire(v);
    j["next_fire_ms"] = json!(next);
    j["next_fire_utc"] = json!(next.map(|n| render::utc(Some(n))));
    j["next_fire_local"] = json!(next.map(|n| render::local(Some(n), &v.timezone)));
    j["held"] = json!(v.claim_owner.is_some() && v.claim_expires_at_ms > Some(v.now_ms));
    Ok(j)
}

/// `trigger list`.
pub async fn list(
    target: &Target,
    project: Option<&str>,
    state: StateFilter,
    after: Option<&str>,
    limit: i64,
    json: bool,
) -> Result<(), CliError> {
    if !(1..=10_000).contains(&limit) {
        return Err(CliError::LimitOutOfRange { limit });
    }
    let client = connect::connect_target(target).await?;
    let q = ListQuery {
        project,
        state,
        after,
        limit,
    };
    let page = triggers::list(&client, &q).await?;
    let next_after = (page.len() as i64 == limit).then(|| page[page.len() - 1].trigger_id.clone());
    if json {
        let items = page.iter().map(view_json).collect::<Result<Vec<_>, _>>()?;
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({ "triggers": items, "next_after": next_after }))?
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .iter()
        .map(|v| {
            let next = next_fire(v);
            vec![
                v.trigger_id.clone(),
                v.project_id.clone(),
                v.task_id.clone(),
                v.cron_expr.clone(),
                v.timezone.clone(),
                state_text(v),
                render::utc(next),
                render::local(next, &v.timezone),
                render::utc(v.last_scheduled_at_ms),
                render::span(v.last_lag_ms),
                holder(v),
            ]
        })
        .collect();
    print!(
        "{}",
        render::table(
            &[
                "ID",
                "PROJECT",
                "TASK",
                "CRON",
                "ZONE",
                "STATE",
                "NEXT (UTC)",
                "NEXT (LOCAL)",
                "LAST ADMITTED",
                "LAG",
                "HELD BY"
            ],
            &rows
        )
    );
    if let Some(a) = next_after {
        println!("(more: --after {a})");
    }
    Ok(())
}

/// `trigger show`.
pub async fn show(
    target: &Target,
    id: &str,
    count: usize,
    runs: i64,
    json: bool,
) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    let v = triggers::show(&client, id).await?;
    let upcoming = if v.enabled {
        Schedule::parse(&v.cron_expr, &v.timezone)?.explain(v.now_ms, count)
    } else {
        Vec::new()
    };
    let recent = crate::store::status::list_runs(&client, Some(id), runs).await?;
    if json {
        let mut j = view_json(&v)?;
        j["upcoming"] = json!(upcoming
            .iter()
            .map(|(ms, local)| json!({"ms": ms, "utc": render::utc(Some(*ms)), "local": local}))
            .collect::<Vec<_>>());
        j["recent_runs"] = json!(recent);
        println!("{}", serde_json::to_string_pretty(&j)?);
        return Ok(());
    }
    println!("trigger      {} (revision {})", v.trigger_id, v.revision);
    println!("project      {} ({})", v.project_id, v.project_status);
    println!("task         {}", v.task_id);
    println!("cron         {}  in {}", v.cron_expr, v.timezone);
    println!(
        "misfire      {} (grace {} ms)",
        v.misfire_policy, v.misfire_grace_ms
    );
    println!("state        {}", state_text(&v));
    if let (Some(at), Some(by)) = (v.disabled_at_ms, &v.disabled_by) {
        println!(
            "last disable {} by {}{}",
            render::utc(Some(at)),
            by,
            v.disabled_note
                .as_deref()
                .map(|n| format!(": {n}"))
                .unwrap_or_default()
        );
    }
    if let (Some(at), Some(by)) = (v.enabled_at_ms, &v.enabled_by) {
        println!("last enable  {} by {}", render::utc(Some(at)), by);
    }
    println!(
        "cursor       {}",
        v.next_fire_at_ms
            .map(|c| format!(
                "{}  {}",
                render::utc(Some(c)),
                render::local(Some(c), &v.timezone)
            ))
            .unwrap_or_else(|| "- (decided at the next claim)".into())
    );
    println!(
        "last         {} (lag {})",
        render::utc(v.last_scheduled_at_ms),
        render::span(v.last_lag_ms)
    );
    println!(
        "claim        {} (claim version {}, state version {})",
        holder(&v),
        v.claim_version,
        v.state_version
    );
    println!("next {} occurrences:", upcoming.len());
    for (ms, local) in &upcoming {
        println!("  {}  {local}", render::utc(Some(*ms)));
    }
    println!("last {} runs:", recent.len());
    for r in &recent {
        println!("  {r}");
    }
    Ok(())
}

fn say_changed(id: &str, what: &str, c: Changed) {
    match c {
        Changed::Yes => println!("trigger {id} {what}"),
        Changed::AlreadyThatWay => println!("trigger {id} already {what} (nothing changed)"),
    }
}

/// `trigger disable`.
pub async fn disable(
    target: &Target,
    id: &str,
    note: Option<&str>,
    actor_name: Option<&str>,
) -> Result<(), CliError> {
    let mut client = connect::connect_target(target).await?;
    let by = actor(&client, actor_name).await?;
    let c = triggers::disable(&mut client, id, note, &by).await?;
    say_changed(id, "disabled", c);
    Ok(())
}

/// `trigger enable`.
pub async fn enable(target: &Target, id: &str, actor_name: Option<&str>) -> Result<(), CliError> {
    let mut client = connect::connect_target(target).await?;
    let by = actor(&client, actor_name).await?;
    let c = triggers::enable(&mut client, id, &by).await?;
    say_changed(id, "enabled", c);
    Ok(())
}

/// `trigger delete`.
pub async fn delete(target: &Target, id: &str, actor_name: Option<&str>) -> Result<(), CliError> {
    let mut client = connect::connect_target(target).await?;
    let by = actor(&client, actor_name).await?;
    let c = triggers::delete(&mut client, id, &by).await?;
    say_changed(id, "deleted", c);
    Ok(())
}

fn valid_request_id(s: &str) -> bool {
    (1..=128).contains(&s.len())
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-'))
}

/// `trigger fire`.
pub async fn fire(
    target: &Target,
    id: &str,
    request_id: Option<&str>,
    actor_name: Option<&str>,
    json: bool,
) -> Result<(), CliError> {
    let request_id = match request_id {
        Some(r) if !valid_request_id(r) => return Err(CliError::BadRequestId { value: r.into() }),
        Some(r) => r.to_string(),
        None => uuid::Uuid::new_v4().simple().to_string(),
    };
    let mut client = connect::connect_target(target).await?;
    let by = format!("fire:{}", actor(&client, actor_name).await?);
    let f = triggers::fire(&mut client, id, &request_id, &by).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "trigger_id": id, "request_id": request_id, "run_id": f.run_id.to_string(),
                "idempotency_key": f.idempotency_key, "scheduled_for_ms": f.scheduled_for_ms,
                "admitted": f.admitted,
            }))?
        );
    } else if f.admitted {
        println!(
            "trigger {id} fired: run {} key {} (request id {request_id})",
            f.run_id, f.idempotency_key
        );
    } else {
        println!(
            "trigger {id} was already fired with request id {request_id}: run {} (nothing new admitted)",
            f.run_id
        );
    }
    Ok(())
}

/// What `trigger backfill` takes.
#[derive(Args, Debug)]
pub struct BackfillArgs {
    #[command(flatten)]
    pub target: Target,
    pub id: String,
    /// Window start, inclusive (RFC 3339).
    #[arg(long)]
    pub from: String,
    /// Window end, exclusive (RFC 3339, not in the future).
    #[arg(long)]
    pub to: String,
    /// Refuse a window with more occurrences than this (at most 100000).
    #[arg(long, default_value_t = BACKFILL_DEFAULT_MAX)]
    pub max: usize,
    /// Occurrences per committed transaction.
    #[arg(long, default_value_t = BACKFILL_DEFAULT_CHUNK)]
    pub chunk: usize,
    #[arg(long)]
    pub actor: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// `trigger backfill`: every check happens before the first write; then chunks commit in
/// order, each on its own, so an interrupted run leaves a prefix and a re-run completes it.
pub async fn backfill(a: BackfillArgs) -> Result<(), CliError> {
    let from = parse_time("--from", &a.from)?;
    let to = parse_time("--to", &a.to)?;
    if from >= to {
        return Err(CliError::WindowOrder {
            from: a.from.clone(),
            to: a.to.clone(),
        });
    }
    if !(1..=BACKFILL_HARD_CAP).contains(&a.max) {
        return Err(CliError::MaxOutOfRange {
            max: a.max,
            hard_cap: BACKFILL_HARD_CAP,
        });
    }
    if !(1..=10_000).contains(&a.chunk) {
        return Err(CliError::ChunkOutOfRange { chunk: a.chunk });
    }
    let mut client = connect::connect_target(&a.target).await?;
    let now = manage::db_now(&client).await?;
    if to > now {
        return Err(CliError::WindowInFuture {
            to: a.to.clone(),
            now: render::utc(Some(now)),
        });
    }
    let v = triggers::show(&client, &a.id).await?;
    let revision = triggers::admittable_revision(&mut client, &a.id).await?;
    let schedule = Schedule::parse(&v.cron_expr, &v.timezone)?;
    let occurrences =
        occurrences_in(&schedule, from, to, a.max).ok_or(CliError::WindowOverCap { max: a.max })?;
    let by = format!("backfill:{}", actor(&client, a.actor.as_deref()).await?);
    let mut total = triggers::BackfillCount::default();
    for chunk in occurrences.chunks(a.chunk) {
        let c = triggers::backfill_chunk(&mut client, &a.id, revision, chunk, &by).await?;
        total.admitted += c.admitted;
        total.already_existed += c.already_existed;
    }
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "trigger_id": a.id, "revision": revision, "from_ms": from, "to_ms": to,
                "occurrences": occurrences.len(), "admitted": total.admitted,
                "already_existed": total.already_existed,
            }))?
        );
    } else {
        println!(
            "trigger {} backfill [{}, {}): {} occurrences, {} admitted, {} already existed",
            a.id,
            render::utc(Some(from)),
            render::utc(Some(to)),
            occurrences.len(),
            total.admitted,
            total.already_existed
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn occurrences_cover_a_half_open_window_and_stop_past_the_cap() {
        let s = Schedule::parse("*/15 * * * *", "UTC").unwrap();
        let from = parse_time("--from", "2026-01-01T00:00:00Z").unwrap();
        let to = parse_time("--to", "2026-01-01T01:00:00Z").unwrap();
        let got = occurrences_in(&s, from, to, 10).unwrap();
        assert_eq!(got.len(), 4, "00:00 included, 01:00 excluded");
        assert_eq!(got[0], from);
        assert!(occurrences_in(&s, from, to, 3).is_none());
        assert_eq!(occurrences_in(&s, from, to, 4).unwrap().len(), 4);
    }

    #[test]
    fn backfill_follows_the_gap_rule_in_the_trigger_zone() {
        // Europe/Berlin 2026-03-29: 02:30 does not exist; it fires once at 03:00 CEST.
        let s = Schedule::parse("30 2 * * *", "Europe/Berlin").unwrap();
        let from = parse_time("--from", "2026-03-28T00:00:00Z").unwrap();
        let to = parse_time("--to", "2026-03-30T00:00:00Z").unwrap();
        let got = occurrences_in(&s, from, to, 10).unwrap();
        assert_eq!(
            got,
            vec![
                parse_time("x", "2026-03-28T01:30:00Z").unwrap(),
                parse_time("x", "2026-03-29T01:00:00Z").unwrap()
            ]
        );
    }

    #[test]
    fn request_ids_follow_the_key_alphabet() {
        assert!(valid_request_id("deploy-2026.03:1_a"));
        assert!(!valid_request_id(""));
        assert!(!valid_request_id("has space"));
        assert!(!valid_request_id(&"x".repeat(129)));
    }
}
