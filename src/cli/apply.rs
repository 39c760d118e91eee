//! `qlsched apply` (the plan, then one transaction writing it; `--dry-run`, `--check`: the
//! plan only) and `qlsched export` (docs/apply.md).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;

use super::connect::{self, Target};
use super::error::CliError;
use crate::apply::plan::{Item, Op, Plan};
use crate::apply::write::{self, ApplyError};
use crate::apply::{export, file, plan};
use crate::store::definitions;

/// `--max-delete`'s default.
pub const MAX_DELETE_DEFAULT: usize = 100;

/// What `qlsched apply` takes.
#[derive(Args, Debug)]
pub struct ApplyArgs {
    #[command(flatten)]
    pub target: Target,
    /// A definition file, or a directory of `*.toml` files (repeatable).
    #[arg(short = 'f', long = "file", required = true)]
    pub files: Vec<PathBuf>,
    /// Print the plan and stop.
    #[arg(long)]
    pub dry_run: bool,
    /// Print the plan; exit 5 when the database differs from the files (for CI).
    #[arg(long)]
    pub check: bool,
    /// Delete the triggers labelled with the files' source that no file defines any more.
    #[arg(long)]
    pub prune: bool,
    /// Take over the triggers the files define that are unlabelled or labelled by another
    /// source (label them with the files' source). Unlabelled triggers absent from the files
    /// are never pruned.
    #[arg(long)]
    pub adopt: bool,
    /// Refuse, before writing anything, a plan that deletes more triggers than this.
    #[arg(long, value_name = "N", default_value_t = MAX_DELETE_DEFAULT)]
    pub max_delete: usize,
    /// How long to wait for another `qlsched apply` of the same database (and for any
    /// lock after it) before giving up, naming who holds it (`10s`, `500ms`, `2m`).
    #[arg(long, value_name = "DURATION", default_value = "10s", value_parser = lock_wait)]
    pub lock_wait: Duration,
    /// The person applying, for the audit log (default: $USER).
    #[arg(long)]
    pub actor: Option<String>,
    #[arg(long)]
    pub json: bool,
}

/// `--lock-wait`: a duration as `--jitter` takes it, 1 ms to 1 hour.
fn lock_wait(s: &str) -> Result<Duration, String> {
    let ms = crate::apply::options::parse_jitter(s)?;
    if !(1..=3_600_000).contains(&ms) {
        return Err(format!("{ms} ms must be within 1ms..=1h"));
    }
    Ok(Duration::from_millis(ms as u64))
}

/// A plan line: `create trigger nightly`, `update task report: spec: {…} → {…}`.
fn line(i: &Item) -> String {
    let op = match i.op {
        Op::Create => "create",
        Op::Update => "update",
        Op::Unchanged => "unchanged",
        Op::Delete => "delete",
        Op::Absent => "absent (not in the files; left as it is)",
        Op::Refused => "refused",
    };
    let mut s = format!("{op} {} {}", i.kind, i.id);
    if i.op == Op::Update {
        let fields: Vec<String> = i
            .changes
            .iter()
            .map(|(k, (b, a))| format!("{k}: {b} → {a}"))
            .collect();
        s.push_str(&format!(": {}", fields.join("; ")));
    }
    if let Some(n) = &i.note {
        s.push_str(&format!(" ({n})"));
    }
    s
}

fn print_plan(p: &Plan, json: bool) -> Result<(), CliError> {
    if json {
        println!("{}", serde_json::to_string_pretty(p)?);
        return Ok(());
    }
    for i in &p.items {
        println!("{}", line(i));
    }
    println!(
        "plan: {} to create, {} to update, {} to delete, {} unchanged, {} absent, {} refused",
        p.count(Op::Create),
        p.count(Op::Update),
        p.count(Op::Delete),
        p.count(Op::Unchanged),
        p.count(Op::Absent),
        p.count(Op::Refused)
    );
    Ok(())
}

/// `qlsched apply`: every file checked before connecting; then the plan, and (without
/// `--dry-run`/`--check`) the plan written in one transaction.
pub async fn apply(a: ApplyArgs) -> Result<(), CliError> {
    let defs = file::load(&a.files).map_err(|problems| CliError::ApplyInput {
        problems: problems.iter().map(ToString::to_string).collect(),
    })?;
    super::triggers::at_most("--actor", a.actor.as_deref(), 100)?;
    let opts = plan::Options {
        prune: a.prune,
        adopt: a.adopt,
    };
    let mut client = connect::connect_target(&a.target).await?;
    if a.dry_run || a.check {
        let stored = definitions::read(&mut client, None).await?;
        let p = plan::plan(&defs, &stored, opts);
        print_plan(&p, a.json)?;
        if a.check && p.differs() {
            return Err(CliError::Drift {
                creates: p.count(Op::Create),
                updates: p.count(Op::Update),
                deletes: p.count(Op::Delete),
                refused: p.count(Op::Refused),
            });
        }
        return Ok(());
    }
    let role = crate::schema::current_role(&client).await?;
    let person = super::audit::declare_origin(&client, a.actor.as_deref()).await?;
    let host = crate::startup::hostname();
    let who = person.clone().unwrap_or_else(|| role.clone());
    definitions::name_session(
        &client,
        &format!(
            "qlsched apply by {who}@{host} ({})",
            defs.sources.join(", ")
        ),
    )
    .await?;
    let w = write::Options {
        plan: opts,
        max_delete: a.max_delete,
        lock_wait: a.lock_wait,
        actor: person.clone(),
        host: Some(host),
        by: match &person {
            Some(p) => format!("{p} via {role} (qlsched apply)"),
            None => format!("{role} (qlsched apply)"),
        },
    };
    let (p, r) = write::apply(&mut client, &defs, &w).await;
    if let Some(p) = &p {
        print_plan(p, a.json)?;
    }
    let done = r.map_err(|e| match e {
        ApplyError::Store(e) => CliError::Store(e),
        ApplyError::Manage(e) => CliError::Manage(e),
        ApplyError::Refused(n) => CliError::ApplyRefused { refused: n },
        ApplyError::TooManyDeletes { count, max } => CliError::TooManyDeletes { count, max },
    })?;
    if !a.json {
        println!(
            "applied: {} created, {} updated, {} deleted (one transaction)",
            done.created, done.updated, done.deleted
        );
    }
    Ok(())
}

/// What `qlsched export` takes.
#[derive(Args, Debug)]
pub struct ExportArgs {
    #[command(flatten)]
    pub target: Target,
    /// Only this project's definitions.
    #[arg(long)]
    pub project: Option<String>,
    /// Only the triggers this `qlsched apply` source label owns, with the tasks and
    /// projects they use; the file names that source.
    #[arg(long)]
    pub source: Option<String>,
}

/// `qlsched export`: the stored definitions as one definition file, on stdout.
pub async fn export(a: ExportArgs) -> Result<(), CliError> {
    let mut client = connect::connect_target(&a.target).await?;
    let mut stored = definitions::read(&mut client, a.project.as_deref()).await?;
    let label = match &a.source {
        Some(s) => {
            stored = export::only_source(&stored, s);
            s.clone()
        }
        None => export::label(&stored).map_err(CliError::Export)?,
    };
    print!(
        "{}",
        export::to_toml(&stored, &label).map_err(CliError::Export)?
    );
    Ok(())
}
