//! Definitions: `project set`, `task publish`, `trigger publish`, `trigger explain`.

use clap::Args;

use super::connect::{self, Target};
use super::error::CliError;
use crate::schedule::{MisfirePolicy, Schedule};
use crate::store::manage;

pub async fn project_set(target: &Target, id: &str, status: &str) -> Result<(), CliError> {
    let mut c = connect::connect_target(target).await?;
    super::audit::declare_origin(&c, None).await?;
    manage::set_project(&mut c, id, status).await?;
    println!("project {id} {status}");
    Ok(())
}

pub async fn task_publish(
    target: &Target,
    project: &str,
    id: &str,
    spec: &str,
) -> Result<(), CliError> {
    // Refused before connecting: a spec `qlsched worker` could not run (docs/worker.md).
    crate::worker::spec::parse(spec)?;
    let mut c = connect::connect_target(target).await?;
    super::audit::declare_origin(&c, None).await?;
    let (rev, exec) = manage::publish_task(&mut c, project, id, spec).await?;
    println!("task {id} revision {rev} execution revision {exec}");
    Ok(())
}

/// What `trigger publish` takes.
#[derive(Args, Debug)]
pub struct PublishArgs {
    #[command(flatten)]
    pub target: Target,
    #[arg(long)]
    pub id: String,
    #[arg(long)]
    pub project: String,
    #[arg(long)]
    pub task: String,
    #[arg(long)]
    pub cron: String,
    #[arg(long, default_value = "UTC")]
    pub tz: String,
    #[arg(long, default_value = "skip", value_parser = ["skip", "fire_once"])]
    pub misfire: String,
    #[arg(long, default_value_t = crate::schedule::DEFAULT_MISFIRE_GRACE_MS)]
    pub grace_ms: i64,
    #[arg(long)]
    pub disabled: bool,
    /// Disable the trigger (by `qlsched`) after this many consecutive failed runs (1..=1000).
    #[arg(long, value_name = "N")]
    pub pause_after_failures: Option<i32>,
    /// Overdue when no run succeeds within this long (1m..=366d), e.g. 26h.
    #[arg(long, value_name = "DURATION", value_parser = policy_duration)]
    pub expect_success_within: Option<std::time::Duration>,
    /// Admit each occurrence at its nominal instant plus a deterministic offset in [0, this)
    /// (`10s`, `250ms`, `2m`; default none). Must be shorter than the shortest gap between two
    /// consecutive occurrences (docs/policies-jitter.md).
    #[arg(long, value_parser = parse_jitter, default_value = "0s")]
    pub jitter: i64,
    /// Admit no occurrence whose nominal instant is before this (RFC 3339).
    #[arg(long, value_parser = parse_instant)]
    pub start_at: Option<i64>,
    /// Admit no occurrence whose nominal instant is after this (RFC 3339); then the trigger
    /// is ended.
    #[arg(long, value_parser = parse_instant)]
    pub end_at: Option<i64>,
    /// What an occurrence due while a run of the trigger is unfinished does
    /// (docs/policies-overlap.md).
    #[arg(long, default_value = "allow", value_parser = crate::store::overlap::OverlapPolicy::NAMES)]
    pub overlap: String,
}

pub(super) use crate::apply::options::parse_jitter;
use crate::apply::options::{parse_instant, policy_duration};

pub async fn trigger_publish(a: PublishArgs) -> Result<(), CliError> {
    let misfire_policy =
        a.misfire
            .parse::<MisfirePolicy>()
            .map_err(|source| CliError::Misfire {
                value: a.misfire.clone(),
                source,
            })?;
    let spec = manage::TriggerSpec {
        trigger_id: a.id.clone(),
        project_id: a.project,
        task_id: a.task,
        cron_expr: a.cron,
        timezone: a.tz,
        misfire_policy,
        misfire_grace_ms: a.grace_ms,
        enabled: !a.disabled,
        outcome_policy: manage::OutcomePolicy {
            pause_after_failures: a.pause_after_failures,
            expect_success_within_ms: a
                .expect_success_within
                .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX)),
        },
        jitter_ms: a.jitter,
        start_at_ms: a.start_at,
        end_at_ms: a.end_at,
        overlap_policy: a.overlap.parse().expect("clap checked the spelling"),
    };
    // Validate before connecting: a bad expression never needs a database to be refused.
    Schedule::parse(&spec.cron_expr, &spec.timezone).map_err(|source| {
        manage::ManageError::Definition {
            id: a.id.clone(),
            source,
        }
    })?;
    let mut c = connect::connect_target(&a.target).await?;
    super::audit::declare_origin(&c, None).await?;
    let p = manage::publish_trigger(&mut c, &spec).await?;
    println!(
        "trigger {} revision {}{}",
        a.id,
        p.revision,
        if p.changed { "" } else { " (unchanged)" }
    );
    Ok(())
}

pub fn trigger_explain(
    cron: &str,
    tz: &str,
    count: usize,
    after: Option<&str>,
    jitter: Option<(&str, i64)>,
) -> Result<(), CliError> {
    let schedule = Schedule::parse(cron, tz)?;
    let after_ms = match after {
        Some(s) => super::triggers::parse_time("--after", s)?,
        None => chrono::Utc::now().timestamp_millis(),
    };
    let rfc3339 = |ms: i64| {
        chrono::DateTime::from_timestamp_millis(ms)
            .map(|d| d.to_rfc3339())
            .unwrap_or_default()
    };
    if let Some((_, jitter_ms)) = jitter.filter(|(_, j)| *j > 0) {
        match crate::schedule::min_gap(&schedule, after_ms, None, jitter_ms) {
            Some(g) if g.gap_ms <= jitter_ms => println!(
                "jitter {jitter_ms} ms is not shorter than the shortest gap, {} ms after {}: \
                 publish refuses it",
                g.gap_ms,
                rfc3339(g.after_ms)
            ),
            Some(g) => println!(
                "jitter {jitter_ms} ms; shortest gap {} ms (after {})",
                g.gap_ms,
                rfc3339(g.after_ms)
            ),
            None => println!("jitter {jitter_ms} ms"),
        }
    }
    for (ms, local) in schedule.explain(after_ms, count) {
        match jitter {
            Some((id, jitter_ms)) if jitter_ms > 0 => {
                let due = crate::schedule::Timing {
                    trigger_id: id,
                    jitter_ms,
                    ..Default::default()
                }
                .due_at_ms(ms);
                println!("{}  {local}  due {}", rfc3339(ms), rfc3339(due));
            }
            _ => println!("{}  {local}", rfc3339(ms)),
        }
    }
    Ok(())
}
