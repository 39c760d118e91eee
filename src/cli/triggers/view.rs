//! `trigger list` and `trigger show`.

use serde_json::json;

use super::{holder, next_fire, state_text, view_json};
use crate::cli::connect::{self, Target};
use crate::cli::error::CliError;
use crate::cli::render;
use crate::schedule::Schedule;
use crate::store::triggers::{self, ListQuery, StateFilter};

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
    // From the cursor when it is set (a due occurrence not yet admitted is still upcoming),
    // else from now.
    let upcoming = if v.enabled {
        let from = v
            .next_fire_at_ms
            .map_or(v.now_ms, |c| (c - 1).min(v.now_ms));
        Schedule::parse(&v.cron_expr, &v.timezone)?.explain(from, count)
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
