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
}

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
) -> Result<(), CliError> {
    let schedule = Schedule::parse(cron, tz)?;
    let after_ms = match after {
        Some(s) => super::triggers::parse_time("--after", s)?,
        None => chrono::Utc::now().timestamp_millis(),
    };
    for (ms, local) in schedule.explain(after_ms, count) {
        let utc = chrono::DateTime::from_timestamp_millis(ms)
            .map(|d| d.to_rfc3339())
            .unwrap_or_default();
        println!("{utc}  {local}");
    }
    Ok(())
}
