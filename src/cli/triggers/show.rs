//! `trigger list` and `trigger show`.

use crate::cli::connect::{self, Target};
use crate::cli::error::CliError;
use crate::present as render;
use crate::present::triggers::{
    holder, outcome_lines, outcome_mark, overlap_mark, overlap_text, state_text, timing_text,
    trigger_detail, trigger_page,
};
use crate::store::browse::TriggerFilter;
use crate::store::triggers::StateFilter;

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
    let f = TriggerFilter {
        project,
        state,
        prefix: None,
        after,
        limit,
    };
    let page = trigger_page(&client, &f, false).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(&page)?)?
        );
        return Ok(());
    }
    let rows: Vec<Vec<String>> = page
        .triggers
        .iter()
        .map(|item| {
            let v = &item.view;
            let next = item.next_fire_ms;
            vec![
                v.trigger_id.clone(),
                v.project_id.clone(),
                v.task_id.clone(),
                v.cron_expr.clone(),
                v.timezone.clone(),
                format!("{}{}", state_text(v), overlap_mark(v)),
                render::utc(next),
                render::local(next, &v.timezone),
                render::utc(v.last_scheduled_at_ms),
                render::span(v.last_lag_ms),
                holder(v),
                if v.jitter_ms > 0 {
                    render::span(Some(v.jitter_ms))
                } else {
                    "-".into()
                },
                outcome_mark(&v.outcome),
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
                "HELD BY",
                "JITTER",
                "OUTCOME"
            ],
            &rows
        )
    );
    if let Some(a) = page.next_after {
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
    // Upcoming from the cursor when it is set (a due occurrence not yet admitted is still
    // upcoming), else from now.
    let d = trigger_detail(&client, id, count, runs).await?;
    if json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::to_value(&d)?)?
        );
        return Ok(());
    }
    let v = &d.item.view;
    let (upcoming, recent) = (&d.upcoming, &d.recent_runs);
    println!("trigger      {} (revision {})", v.trigger_id, v.revision);
    println!("project      {} ({})", v.project_id, v.project_status);
    println!("task         {}", v.task_id);
    println!("cron         {}  in {}", v.cron_expr, v.timezone);
    println!(
        "misfire      {} (grace {} ms)",
        v.misfire_policy, v.misfire_grace_ms
    );
    println!("overlap      {}", overlap_text(v));
    println!("state        {}", state_text(v));
    println!("timing       {}", timing_text(v));
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
        "cursor       {}{}",
        v.next_fire_at_ms
            .map(|c| format!(
                "{}  {}",
                render::utc(Some(c)),
                render::local(Some(c), &v.timezone)
            ))
            .unwrap_or_else(|| "- (decided at the next claim)".into()),
        d.item
            .next_due_utc
            .as_deref()
            .map(|due| format!("  due {due} (jittered)"))
            .unwrap_or_default()
    );
    println!(
        "last         {} (lag {})",
        render::utc(v.last_scheduled_at_ms),
        render::span(v.last_lag_ms)
    );
    println!(
        "claim        {} (claim version {}, state version {})",
        holder(v),
        v.claim_version,
        v.state_version
    );
    for (label, text) in outcome_lines(&v.outcome) {
        println!("{label:<12} {text}");
    }
    println!("next {} occurrences:", upcoming.len());
    for o in upcoming {
        match &o.due_utc {
            Some(due) => println!("  {}  {}  due {due}", o.utc, o.local),
            None => println!("  {}  {}", o.utc, o.local),
        }
    }
    println!("last {} runs:", recent.len());
    for r in recent {
        println!("  {r}");
    }
    Ok(())
}
