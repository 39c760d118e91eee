//! Read-only views: `status`, `runs list`, `runs show`.

use super::connect::{self, Target};
use super::error::CliError;
use crate::store::{status, views};

pub async fn status(target: &Target, json: bool, last: i64) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    let s = status::read(&client, last).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", s.render());
    }
    Ok(())
}

pub async fn runs_list(
    target: &Target,
    trigger: Option<&str>,
    status: Option<&str>,
    limit: i64,
    json: bool,
) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    let f = views::RunFilter {
        trigger,
        status,
        limit,
        ..views::RunFilter::default()
    };
    let page = views::run_page(&client, &f).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    for r in &page.runs {
        println!("{}", r.line());
    }
    Ok(())
}

pub async fn runs_show(target: &Target, run: &str, json: bool) -> Result<(), CliError> {
    let id = uuid::Uuid::parse_str(run).map_err(|_| CliError::BadRunId {
        value: run.to_string(),
    })?;
    let mut client = connect::connect_target(target).await?;
    let Some(d) = views::run_detail(&mut client, id).await? else {
        return Err(CliError::UnknownRun {
            id: run.to_string(),
        });
    };
    if json {
        println!("{}", serde_json::to_string_pretty(&d)?);
        return Ok(());
    }
    println!("{}", d.run.line());
    println!(
        "run {}  trigger {}  execution revision {}{}",
        d.run.run_id,
        d.run.trigger_id,
        d.execution_revision_id,
        if d.cancelled { "  cancelled" } else { "" }
    );
    for a in &d.attempts {
        let mut line = format!("attempt {}  {}", a.attempt_no, a.state);
        if let Some(w) = &a.worker_id {
            line += &format!("  worker {w}");
        }
        for (name, v) in [
            ("started", a.started_at_ms),
            ("finished", a.finished_at_ms),
            ("lease until", a.lease_expires_at_ms),
            ("not before", a.not_before_ms),
        ] {
            if let Some(ms) = v {
                line += &format!("  {name} {}", rfc3339(ms));
            }
        }
        if let Some(x) = a.exit_status {
            line += &format!("  exit {x}");
        }
        if let Some(e) = &a.error {
            line += &format!("  error: {e}");
        }
        println!("{line}");
    }
    for e in &d.events {
        println!("event {}  {}  {}", e.seq, e.kind, rfc3339(e.at_ms));
    }
    Ok(())
}

fn rfc3339(ms: i64) -> String {
    chrono::DateTime::from_timestamp_millis(ms)
        .map(|d| d.to_rfc3339())
        .unwrap_or_else(|| ms.to_string())
}
