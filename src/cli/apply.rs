//! `qlsched apply` (its plan: `--dry-run`, `--check`) and `qlsched export` (docs/apply.md).

use std::path::PathBuf;

use clap::Args;

use super::connect::{self, Target};
use super::error::CliError;
use crate::apply::plan::{Item, Op, Plan};
use crate::apply::{export, file, plan};
use crate::store::definitions;

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
    #[arg(long)]
    pub json: bool,
}

/// A plan line: `create trigger nightly`, `update task report: spec: {…} → {…}`.
fn line(i: &Item) -> String {
    let op = match i.op {
        Op::Create => "create",
        Op::Update => "update",
        Op::Unchanged => "unchanged",
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
        "plan: {} to create, {} to update, {} unchanged, {} absent, {} refused",
        p.count(Op::Create),
        p.count(Op::Update),
        p.count(Op::Unchanged),
        p.count(Op::Absent),
        p.count(Op::Refused)
    );
    Ok(())
}

/// `qlsched apply`: every file checked before connecting, then the plan.
pub async fn apply(a: ApplyArgs) -> Result<(), CliError> {
    let defs = file::load(&a.files).map_err(|problems| CliError::ApplyInput {
        problems: problems.iter().map(ToString::to_string).collect(),
    })?;
    if !a.dry_run && !a.check {
        return Err(CliError::ApplyNotBuilt);
    }
    let mut client = connect::connect_target(&a.target).await?;
    let stored = definitions::read(&mut client, None).await?;
    let p = plan::plan(&defs, &stored);
    print_plan(&p, a.json)?;
    if a.check && p.differs() {
        return Err(CliError::Drift {
            creates: p.count(Op::Create),
            updates: p.count(Op::Update),
            refused: p.count(Op::Refused),
        });
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
}

/// `qlsched export`: the stored definitions as one definition file, on stdout.
pub async fn export(a: ExportArgs) -> Result<(), CliError> {
    let mut client = connect::connect_target(&a.target).await?;
    let stored = definitions::read(&mut client, a.project.as_deref()).await?;
    print!("{}", export::to_toml(&stored).map_err(CliError::Export)?);
    Ok(())
}
