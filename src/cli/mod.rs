//! The command line: parse, call into the library, map the result to an exit code (see
//! [`error`] for the codes). One function per subcommand, in the module of its group; no
//! SQL here (every statement is in `store/`).

mod apply;
mod audit;
mod connect;
mod db;
mod define;
pub mod error;

mod runs;
mod status;
mod triggers;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

pub use connect::Target;
pub use error::CliError;
pub use triggers::{occurrences_in, BACKFILL_DEFAULT_MAX, BACKFILL_HARD_CAP};

use crate::config::{Config, LogFormat};
use crate::store::triggers::StateFilter;

#[derive(Parser, Debug)]
#[command(
    name = "qlsched",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("QLSCHED_GIT_COMMIT"), ")"),
    about = "Leaderless cluster cron scheduler on PostgreSQL"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Subcommand, Debug)]
pub enum Command {
    /// Validate a replica's or a worker's config (a file with a [worker] table is a
    /// worker's); no database is opened; exit 0 or one line per problem.
    CheckConfig {
        #[arg(long)]
        config: PathBuf,
    },
    /// Run a replica until SIGTERM/SIGINT.
    Run {
        #[arg(long)]
        config: PathBuf,
        /// Override the config's log format.
        #[arg(long, value_parser = ["json", "text"])]
        log_format: Option<String>,
    },
    /// Run a worker until SIGTERM/SIGINT: execute the runs the replicas admit (shell and
    /// http executors; docs/worker.md), as the dispatcher role.
    Worker {
        #[arg(long)]
        config: PathBuf,
        /// Override the config's log format.
        #[arg(long, value_parser = ["json", "text"])]
        log_format: Option<String>,
    },
    /// Database set-up and the readiness gate.
    #[command(subcommand)]
    Db(db::DbCommand),
    /// Projects (admin role).
    #[command(subcommand)]
    Project(ProjectCommand),
    /// Tasks and their pinned execution revision (admin role).
    #[command(subcommand)]
    Task(TaskCommand),
    /// Cron triggers: publish, list, show, disable, enable, delete, fire, backfill (admin
    /// role); explain needs no database.
    #[command(subcommand)]
    Trigger(TriggerCommand),
    /// Replicas, claims, backlog, lag (any role with SELECT).
    Status {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        json: bool,
        /// Lag percentiles over the last N runs of each kind (cron, manual, backfill).
        #[arg(long, default_value_t = 1000)]
        last: i64,
    },
    /// Admitted runs.
    #[command(subcommand)]
    Runs(RunsCommand),
    /// The audit log, newest first: who changed which project, task or trigger, or acted on
    /// runs, when, and each changed field before -> after (admin role; docs/audit.md).
    Audit(audit::AuditArgs),
    /// Make the database hold what definition files say (projects, tasks, triggers;
    /// docs/apply.md): print the plan, then write it in one transaction; --dry-run stops
    /// after the plan, --check exits 5 on drift (admin role).
    Apply(apply::ApplyArgs),
    /// Write the stored definitions in the format `apply` reads, on stdout (admin role).
    Export(apply::ExportArgs),
}

#[derive(Subcommand, Debug)]
pub enum ProjectCommand {
    /// Create a project or set its status (active | suspended | archived).
    Set {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        id: String,
        #[arg(long, default_value = "active", value_parser = ["active", "suspended", "archived"])]
        status: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum TaskCommand {
    /// Create or update a task; a changed spec pins a new execution revision.
    Publish {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        project: String,
        #[arg(long)]
        id: String,
        /// The spec: a JSON object (docs/worker.md, "Spec"); with an "executor" it is
        /// checked in full and run by `qlsched worker`, without one it is left to an
        /// external dispatcher.
        #[arg(long)]
        spec: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum TriggerCommand {
    /// Validate and publish a cron trigger (a changed definition is a new revision).
    Publish(define::PublishArgs),
    /// Show the next occurrences of an expression in a zone (no database).
    Explain {
        #[arg(long)]
        cron: String,
        #[arg(long, default_value = "UTC")]
        tz: String,
        #[arg(long, default_value_t = 10)]
        count: usize,
        /// Start after this instant (RFC 3339); default now.
        #[arg(long)]
        after: Option<String>,
        /// With --id: print each occurrence's jittered due instant beside its nominal one
        /// (the offset is derived from the trigger id; docs/policies-jitter.md).
        #[arg(long, value_parser = define::parse_jitter, requires = "id")]
        jitter: Option<i64>,
        /// The trigger id the jitter is derived from.
        #[arg(long)]
        id: Option<String>,
    },
    /// One page of triggers in id order: state, next fire (UTC and local), last admitted
    /// occurrence and its lag, the claim holder.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        project: Option<String>,
        #[arg(long, default_value = "all", value_parser = ["enabled", "disabled", "all", "overdue"])]
        state: String,
        /// Page size (1..=10000).
        #[arg(long, default_value_t = 100)]
        limit: i64,
        /// Start after this trigger id (the last id of the previous page).
        #[arg(long)]
        after: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// A trigger's definition, state, claim, next occurrences and last runs.
    Show {
        #[command(flatten)]
        target: Target,
        id: String,
        /// How many upcoming occurrences to print.
        #[arg(long, default_value_t = 5)]
        count: usize,
        /// How many recent runs to print.
        #[arg(long, default_value_t = 5)]
        runs: i64,
        #[arg(long)]
        json: bool,
    },
    /// Stop a trigger now (a live claim is fenced out); the note, who and when are kept.
    Disable {
        #[command(flatten)]
        change: triggers::ChangeArgs,
        #[arg(long)]
        note: Option<String>,
    },
    /// Start a disabled trigger again from the first occurrence after now (no replay).
    Enable(triggers::ChangeArgs),
    /// Stop a trigger for good and drop it from `list`; its runs stay.
    Delete(triggers::ChangeArgs),
    /// Admit one occurrence now; the same --request-id twice admits one run.
    Fire {
        #[command(flatten)]
        target: Target,
        id: String,
        /// Idempotency of the request ([A-Za-z0-9._:-]{1,128}); default: a random one (printed).
        #[arg(long)]
        request_id: Option<String>,
        #[arg(long)]
        actor: Option<String>,
        /// This fire's overlap policy instead of the trigger's (docs/policies-overlap.md).
        #[arg(long, value_parser = crate::store::overlap::OverlapPolicy::NAMES)]
        overlap: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Admit every occurrence in [--from, --to) that has no run yet (cron keys).
    Backfill(triggers::BackfillArgs),
}

#[derive(Subcommand, Debug)]
pub enum RunsCommand {
    /// The newest admitted runs.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        trigger: Option<String>,
        /// Only runs in this status.
        #[arg(long, value_parser = ["queued", "dispatching", "running", "succeeded", "failed", "cancelled"])]
        status: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: i64,
        #[arg(long)]
        json: bool,
    },
    /// One run with every attempt and event.
    Show {
        #[command(flatten)]
        target: Target,
        /// The run id (a UUID).
        run: String,
        #[arg(long)]
        json: bool,
    },
    /// Cancel queued runs nobody took yet (--run ID, or --trigger ID --from --to [--kind]);
    /// runs a dispatcher took are left alone and counted (admin role).
    Cancel(runs::CancelArgs),
    /// Remove queued, untouched runs admitted before --queued-before T, with their attempts
    /// and events (a backlog nobody will dispatch); backfill then refuses windows before T
    /// (admin role).
    Prune(runs::PruneArgs),
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::CheckConfig { config } => check_config(&config),
        Command::Run { config, log_format } => run(&config, log_format.as_deref()),
        Command::Worker { config, log_format } => worker(&config, log_format.as_deref()),
        other => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("tokio runtime")
            .block_on(admin_command(other)),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("qlsched: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn check_config(config: &std::path::Path) -> Result<(), CliError> {
    if crate::config::worker::is_worker_file(config) {
        crate::config::worker::WorkerFileConfig::load(config)?;
    } else {
        Config::load(config)?;
    }
    println!("{}: ok", config.display());
    Ok(())
}

fn run(config: &std::path::Path, log_format: Option<&str>) -> Result<(), CliError> {
    let cfg = Config::load(config)?;
    let format = match log_format {
        Some("text") => LogFormat::Text,
        Some(_) => LogFormat::Json,
        None => cfg.log.format,
    };
    crate::startup::run(cfg, format).map_err(CliError::Startup)
}

fn worker(config: &std::path::Path, log_format: Option<&str>) -> Result<(), CliError> {
    let cfg = crate::config::worker::WorkerFileConfig::load(config)?;
    let format = match log_format {
        Some("text") => LogFormat::Text,
        Some(_) => LogFormat::Json,
        None => cfg.log.format,
    };
    crate::worker::run(cfg, format).map_err(CliError::Worker)
}

async fn admin_command(cmd: Command) -> Result<(), CliError> {
    match cmd {
        Command::Db(c) => db::run(c).await,
        Command::Project(ProjectCommand::Set { target, id, status }) => {
            define::project_set(&target, &id, &status).await
        }
        Command::Task(TaskCommand::Publish {
            target,
            project,
            id,
            spec,
        }) => define::task_publish(&target, &project, &id, &spec).await,
        Command::Trigger(c) => trigger_command(c).await,
        Command::Status { target, json, last } => status::status(&target, json, last).await,
        Command::Runs(RunsCommand::List {
            target,
            trigger,
            status,
            limit,
            json,
        }) => runs::runs_list(&target, trigger.as_deref(), status.as_deref(), limit, json).await,
        Command::Runs(RunsCommand::Show { target, run, json }) => {
            runs::runs_show(&target, &run, json).await
        }
        Command::Runs(RunsCommand::Cancel(args)) => runs::cancel(args).await,
        Command::Runs(RunsCommand::Prune(args)) => runs::prune(args).await,
        Command::Audit(args) => audit::audit(args).await,
        Command::Apply(args) => apply::apply(args).await,
        Command::Export(args) => apply::export(args).await,
        Command::CheckConfig { .. } | Command::Run { .. } | Command::Worker { .. } => {
            unreachable!("handled in main")
        }
    }
}

async fn trigger_command(cmd: TriggerCommand) -> Result<(), CliError> {
    match cmd {
        TriggerCommand::Publish(args) => define::trigger_publish(args).await,
        TriggerCommand::Explain {
            cron,
            tz,
            count,
            after,
            jitter,
            id,
        } => {
            let jitter = id.as_deref().zip(jitter);
            define::trigger_explain(&cron, &tz, count, after.as_deref(), jitter)
        }
        TriggerCommand::List {
            target,
            project,
            state,
            limit,
            after,
            json,
        } => {
            let state = match state.as_str() {
                "enabled" => StateFilter::Enabled,
                "disabled" => StateFilter::Disabled,
                "overdue" => StateFilter::Overdue,
                _ => StateFilter::All,
            };
            triggers::list(
                &target,
                project.as_deref(),
                state,
                after.as_deref(),
                limit,
                json,
            )
            .await
        }
        TriggerCommand::Show {
            target,
            id,
            count,
            runs,
            json,
        } => triggers::show(&target, &id, count, runs, json).await,
        TriggerCommand::Disable { change, note } => {
            triggers::disable(&change, note.as_deref()).await
        }
        TriggerCommand::Enable(change) => triggers::enable(&change).await,
        TriggerCommand::Delete(change) => triggers::delete(&change).await,
        TriggerCommand::Fire {
            target,
            id,
            request_id,
            actor,
            overlap,
            json,
        } => {
            let overlap = overlap.map(|o| o.parse().expect("clap checked the spelling"));
            triggers::fire(
                &target,
                &id,
                request_id.as_deref(),
                actor.as_deref(),
                overlap,
                json,
            )
            .await
        }
        TriggerCommand::Backfill(args) => triggers::backfill(args).await,
    }
}
