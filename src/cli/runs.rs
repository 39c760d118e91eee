//! `runs list` and `runs show`: admitted runs, read-only; `runs cancel`: withdraw queued runs
//! nobody took yet; `runs prune`: remove a queued backlog nobody will dispatch (both as the
//! admin role).

use clap::Args;
use serde_json::json;
use uuid::Uuid;

use super::connect::{self, Target};
use super::error::CliError;
use super::triggers::parse_time;
use crate::present as render;
use crate::store::runs::{self, Selection};
use crate::store::{browse, queued_prune};

/// Default `--max`: like `trigger backfill`.
pub const CANCEL_DEFAULT_MAX: usize = 1_000;
/// `--max` may not exceed this.
pub const CANCEL_HARD_CAP: usize = 100_000;
/// Runs per committed transaction.
const CANCEL_CHUNK: usize = 500;

/// What `runs cancel` takes.
#[derive(Args, Debug)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["run", "trigger"])))]
pub struct CancelArgs {
    #[command(flatten)]
    pub target: Target,
    /// One run, by id.
    #[arg(long, conflicts_with_all = ["from", "to", "kind"])]
    pub run: Option<String>,
    /// A trigger's runs scheduled in [--from, --to).
    #[arg(long, requires_all = ["from", "to"])]
    pub trigger: Option<String>,
    /// Window start, inclusive (RFC 3339).
    #[arg(long)]
    pub from: Option<String>,
    /// Window end, exclusive (RFC 3339).
    #[arg(long)]
    pub to: Option<String>,
    /// Only runs of this kind.
    #[arg(long, value_parser = ["backfill", "manual", "cron"])]
    pub kind: Option<String>,
    /// Refuse (writing nothing) when more queued runs than this match (at most 100000).
    #[arg(long, default_value_t = CANCEL_DEFAULT_MAX)]
    pub max: usize,
    #[arg(long)]
    pub json: bool,
}

fn selection(a: &CancelArgs) -> Result<Selection, CliError> {
    if let Some(run) = &a.run {
        let id = Uuid::parse_str(run).map_err(|_| CliError::BadRunId { value: run.clone() })?;
        return Ok(Selection::Run(id));
    }
    let (from_s, to_s) = (
        a.from.as_deref().unwrap_or(""),
        a.to.as_deref().unwrap_or(""),
    );
    let from_ms = parse_time("--from", from_s)?;
    let to_ms = parse_time("--to", to_s)?;
    if from_ms >= to_ms {
        return Err(CliError::WindowOrder {
            from: from_s.into(),
            to: to_s.into(),
        });
    }
    Ok(Selection::Window {
        trigger: a.trigger.clone().unwrap_or_default(),
        from_ms,
        to_ms,
        kind: a.kind.clone(),
    })
}

/// `runs cancel`: every check before the first write (input, the run or trigger exists,
/// at most `--max` queued runs match); then chunks of 500 commit one by one. A run a
/// dispatcher took (before the read, or between it and its chunk) is left alone and
/// counted, as is a cron-keyed run at or after the cursor of a trigger whose schedule row is
/// claimed at that moment (V15: removed by a later run, with a tombstone).
pub async fn cancel(a: CancelArgs) -> Result<(), CliError> {
    let sel = selection(&a)?;
    if !(1..=CANCEL_HARD_CAP).contains(&a.max) {
        return Err(CliError::MaxOutOfRange {
            max: a.max,
            hard_cap: CANCEL_HARD_CAP,
        });
    }
    let mut client = connect::connect_target(&a.target).await?;
    super::audit::declare_origin(&client, None).await?;
    // Counts and ids from one snapshot: a run taken after it is left alone by its chunk.
    let (census, ids) = runs::read_selection(&mut client, &sel, a.max as i64 + 1).await?;
    match &sel {
        Selection::Run(id) if census.matched == 0 => {
            return Err(CliError::UnknownRun { id: id.to_string() })
        }
        Selection::Run(id) if census.taken > 0 => {
            return Err(CliError::RunTaken { id: id.to_string() })
        }
        Selection::Window { trigger, .. } if !runs::trigger_exists(&client, trigger).await? => {
            return Err(CliError::UnknownTriggerId {
                id: trigger.clone(),
            })
        }
        _ => {}
    }
    if ids.len() > a.max {
        return Err(CliError::CancelOverCap { max: a.max });
    }
    let mut cancelled = 0u64;
    for chunk in ids.chunks(CANCEL_CHUNK) {
        cancelled += runs::cancel_chunk(&mut client, chunk).await?;
    }
    // Queued when read, not cancelled by us: a dispatcher took them in between (or they
    // were not untouched).
    let left_alone = census.taken as u64 + (ids.len() as u64 - cancelled);
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "matched": census.matched, "cancelled": cancelled,
                "left_alone": left_alone, "already_cancelled": census.cancelled,
            }))?
        );
    } else {
        let what = match &sel {
            Selection::Run(id) => format!("run {id}"),
            Selection::Window {
                trigger,
                from_ms,
                to_ms,
                kind,
            } => format!(
                "trigger {trigger} [{}, {}){}",
                render::utc(Some(*from_ms)),
                render::utc(Some(*to_ms)),
                kind.as_deref()
                    .map(|k| format!(" kind {k}"))
                    .unwrap_or_default()
            ),
        };
        println!(
            "{what}: {} matched, {cancelled} cancelled, {left_alone} left alone (taken by a dispatcher), {} already cancelled",
            census.matched, census.cancelled
        );
    }
    Ok(())
}

/// `--max` of `runs prune` may not exceed this.
pub const PRUNE_HARD_CAP: usize = 100_000;
/// Runs per committed transaction of `runs prune`.
const PRUNE_CHUNK: usize = 500;

/// What `runs prune` takes.
#[derive(Args, Debug)]
pub struct PruneArgs {
    #[command(flatten)]
    pub target: Target,
    /// Remove queued runs admitted (and scheduled) before this time (RFC 3339, not in the
    /// future).
    #[arg(long)]
    pub queued_before: String,
    /// Refuse (writing nothing) when more queued runs than this match (at most 100000).
    #[arg(long, default_value_t = CANCEL_DEFAULT_MAX)]
    pub max: usize,
    #[arg(long)]
    pub json: bool,
}

/// `runs prune`: every check before the first write (input, the bound not in the future,
/// at most `--max` queued runs match); then chunks of 500 commit one by one through
/// `qlsched.prune_queued`, each raising the recorded horizon to the bound first. A run a
/// dispatcher took (before the read, or between it and its chunk) is left alone and
/// counted, as is a cron-keyed run at or after the cursor of a trigger whose schedule row is
/// claimed at that moment (V15: removed by a later run, with a tombstone).
pub async fn prune(a: PruneArgs) -> Result<(), CliError> {
    let before = parse_time("--queued-before", &a.queued_before)?;
    if !(1..=PRUNE_HARD_CAP).contains(&a.max) {
        return Err(CliError::MaxOutOfRange {
            max: a.max,
            hard_cap: PRUNE_HARD_CAP,
        });
    }
    let mut client = connect::connect_target(&a.target).await?;
    super::audit::declare_origin(&client, None).await?;
    let now = crate::store::manage::db_now(&client).await?;
    if before > now {
        return Err(CliError::QueuedBeforeInFuture {
            value: a.queued_before.clone(),
            now: render::utc(Some(now)),
        });
    }
    // Counts and ids from one snapshot: a run taken after it is left alone by its chunk.
    let (backlog, ids) =
        queued_prune::read_queued_backlog(&mut client, before, a.max as i64 + 1).await?;
    if ids.len() > a.max {
        return Err(CliError::PruneOverCap {
            max: a.max,
            before: render::utc(Some(before)),
        });
    }
    let mut removed = 0u64;
    for chunk in ids.chunks(PRUNE_CHUNK) {
        removed += queued_prune::prune_queued_chunk(&mut client, before, chunk).await?;
    }
    let left_alone = backlog.matched as u64 - removed;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "queued_before_ms": before, "matched": backlog.matched, "removed": removed,
                "untouched_when_read": backlog.untouched, "left_alone": left_alone,
                "backfill_refused_before_ms": (removed > 0).then_some(before),
            }))?
        );
    } else {
        println!(
            "queued runs admitted before {}: {} matched, {removed} removed with their attempts and events, {left_alone} left alone (taken by a dispatcher meanwhile, no longer untouched, or at or after the cursor of a trigger being admitted: run it again)",
            render::utc(Some(before)),
            backlog.matched
        );
        if removed > 0 {
            println!(
                "trigger backfill now refuses windows starting before {} (their runs' keys are gone)",
                render::utc(Some(before))
            );
        }
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
    let f = browse::RunFilter {
        trigger,
        status,
        limit,
        ..browse::RunFilter::default()
    };
    let page = browse::run_page(&client, &f).await?;
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
    let Some(d) = browse::run_detail(&mut client, id).await? else {
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
                line += &format!("  {name} {}", render::rfc3339(ms));
            }
        }
        if let Some(x) = a.exit_status {
            line += &format!("  exit {x}");
        }
        if let Some(e) = &a.error {
            line += &format!("  error: {e}");
        }
        println!("{line}");
        if let Some(r) = &a.result {
            println!("  result: {r}");
        }
        if let Some(tail) = a.output_tail.as_deref().filter(|t| !t.is_empty()) {
            println!("  output (its tail):");
            for l in tail.lines() {
                println!("    {l}");
            }
        }
    }
    for e in &d.events {
        println!("event {}  {}  {}", e.seq, e.kind, render::rfc3339(e.at_ms));
    }
    Ok(())
}
