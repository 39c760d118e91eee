//! The command line: parse, call into the library, map the result to an exit code.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};

use crate::config::{Config, LogFormat};
use crate::schedule::{MisfirePolicy, Schedule};
use crate::store::{self, manage, migrate};

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
    /// Validate a replica config (no database is opened); exit 0 or one line per problem.
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
    /// Database set-up and the readiness gate.
    #[command(subcommand)]
    Db(DbCommand),
    /// Projects (admin role).
    #[command(subcommand)]
    Project(ProjectCommand),
    /// Tasks and their pinned execution revision (admin role).
    #[command(subcommand)]
    Task(TaskCommand),
    /// Cron triggers (admin role for publish; explain needs no database).
    #[command(subcommand)]
    Trigger(TriggerCommand),
    /// Replicas, claims, backlog, lag (any role with SELECT).
    Status {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        json: bool,
        /// Lag percentiles over the last N runs.
        #[arg(long, default_value_t = 1000)]
        last: i64,
    },
    /// Admitted runs.
    #[command(subcommand)]
    Runs(RunsCommand),
}

/// Where to connect: a replica config (its DSN and password) or an explicit DSN.
#[derive(Args, Debug, Clone)]
pub struct Target {
    #[arg(long, conflicts_with = "dsn")]
    pub config: Option<PathBuf>,
    #[arg(long)]
    pub dsn: Option<String>,
}

#[derive(Subcommand, Debug)]
pub enum DbCommand {
    /// Create the LOGIN roles, the database and the schema (as a superuser). Idempotent.
    Bootstrap {
        #[arg(long)]
        superuser_dsn: String,
        #[arg(long, default_value = "qlsched")]
        prefix: String,
        #[arg(long, default_value = "qlsched")]
        database: String,
    },
    /// Apply migrations as the owner role and install the exact grants.
    Migrate {
        /// DSN connecting as `<prefix>_owner` to the qlsched database.
        #[arg(long)]
        dsn: String,
        #[arg(long, default_value = "qlsched")]
        prefix: String,
    },
    /// The readiness gate: migration stream, capability and grants.
    Check {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value = "qlsched")]
        prefix: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum ProjectCommand {
    /// Create a project or set its status (active | suspended | archived).
    Set {
        #[arg(long)]
        dsn: String,
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
        #[arg(long)]
        dsn: String,
        #[arg(long)]
        project: String,
        #[arg(long)]
        id: String,
        /// The remote_worker spec document (any text, typically JSON).
        #[arg(long)]
        spec: String,
    },
}

#[derive(Subcommand, Debug)]
pub enum TriggerCommand {
    /// Validate and publish a cron trigger (a changed definition is a new revision).
    Publish {
        #[arg(long)]
        dsn: String,
        #[arg(long)]
        id: String,
        #[arg(long)]
        project: String,
        #[arg(long)]
        task: String,
        #[arg(long)]
        cron: String,
        #[arg(long, default_value = "UTC")]
        tz: String,
        #[arg(long, default_value = "skip", value_parser = ["skip", "fire_once"])]
        misfire: String,
        #[arg(long, default_value_t = crate::schedule::DEFAULT_MISFIRE_GRACE_MS)]
        grace_ms: i64,
        #[arg(long)]
        disabled: bool,
    },
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
    },
}

#[derive(Subcommand, Debug)]
pub enum RunsCommand {
    /// The newest admitted runs.
    List {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        trigger: Option<String>,
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
}

pub fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::CheckConfig { config } => match Config::load(&config) {
            Ok(_) => {
                println!("{}: ok", config.display());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("{e}");
                ExitCode::from(2)
            }
        },
        Command::Run { config, log_format } => {
            let cfg = match Config::load(&config) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("{e}");
                    return ExitCode::from(2);
                }
            };
            let format = match log_format.as_deref() {
                Some("text") => LogFormat::Text,
                Some(_) => LogFormat::Json,
                None => cfg.log.format,
            };
            match crate::startup::run(cfg, format) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("qlsched: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        other => {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("tokio runtime");
            match rt.block_on(admin_command(other)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("qlsched: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn parse_dsn(dsn: &str) -> anyhow::Result<tokio_postgres::Config> {
    dsn.parse().map_err(|e| anyhow::anyhow!("invalid DSN: {e}"))
}

async fn connect_target(t: &Target) -> anyhow::Result<tokio_postgres::Client> {
    let pg = match (&t.config, &t.dsn) {
        (Some(path), _) => {
            Config::load(path)
                .map_err(|e| anyhow::anyhow!("{e}"))?
                .database
                .pg
        }
        (None, Some(dsn)) => parse_dsn(dsn)?,
        (None, None) => anyhow::bail!("give --config FILE or --dsn DSN"),
    };
    Ok(store::connect(&pg).await?)
}

async fn admin_command(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Db(DbCommand::Bootstrap {
            superuser_dsn,
            prefix,
            database,
        }) => {
            let roles = migrate::Roles::with_prefix(&prefix)?;
            migrate::bootstrap(&parse_dsn(&superuser_dsn)?, &roles, &database).await?;
            println!(
                "bootstrapped database {database} with roles {}, {}, {}, {}",
                roles.owner, roles.admin, roles.runtime, roles.worker_ingress
            );
        }
        Command::Db(DbCommand::Migrate { dsn, prefix }) => {
            let roles = migrate::Roles::with_prefix(&prefix)?;
            let applied = migrate::migrate(&parse_dsn(&dsn)?, &roles).await?;
            if applied.is_empty() {
                println!("schema up to date; grants installed");
            } else {
                println!("applied {}; grants installed", applied.join(", "));
            }
        }
        Command::Db(DbCommand::Check { target, prefix }) => {
            let client = connect_target(&target).await?;
            let roles = migrate::Roles::with_prefix(&prefix)?;
            let problems = migrate::check(
                &client,
                &[
                    (&roles.admin, "admin"),
                    (&roles.runtime, "runtime"),
                    (&roles.worker_ingress, "worker_ingress"),
                ],
            )
            .await?;
            if !problems.is_empty() {
                for p in &problems {
                    eprintln!("{p}");
                }
                anyhow::bail!("database is not ready ({} problem(s))", problems.len());
            }
            println!(
                "database ready: migrations, capability {} v{} and grants as expected",
                migrate::CAPABILITY.0,
                migrate::CAPABILITY.1
            );
        }
        Command::Project(ProjectCommand::Set { dsn, id, status }) => {
            let mut c = store::connect(&parse_dsn(&dsn)?).await?;
            manage::set_project(&mut c, &id, &status).await?;
            println!("project {id} {status}");
        }
        Command::Task(TaskCommand::Publish {
            dsn,
            project,
            id,
            spec,
        }) => {
            let mut c = store::connect(&parse_dsn(&dsn)?).await?;
            let (rev, exec) = manage::publish_task(&mut c, &project, &id, &spec).await?;
            println!("task {id} revision {rev} execution revision {exec}");
        }
        Command::Trigger(TriggerCommand::Publish {
            dsn,
            id,
            project,
            task,
            cron,
            tz,
            misfire,
            grace_ms,
            disabled,
        }) => {
            let spec = manage::TriggerSpec {
                trigger_id: id.clone(),
                project_id: project,
                task_id: task,
                cron_expr: cron,
                timezone: tz,
                misfire_policy: misfire
                    .parse::<MisfirePolicy>()
                    .map_err(|e| anyhow::anyhow!("{e}"))?,
                misfire_grace_ms: grace_ms,
                enabled: !disabled,
            };
            // Validate before connecting: a bad expression never needs a database to be refused.
            Schedule::parse(&spec.cron_expr, &spec.timezone)
                .map_err(|e| anyhow::anyhow!("trigger {id}: {e}"))?;
            let mut c = store::connect(&parse_dsn(&dsn)?).await?;
            let p = manage::publish_trigger(&mut c, &spec).await?;
            println!(
                "trigger {id} revision {}{}",
                p.revision,
                if p.changed { "" } else { " (unchanged)" }
            );
        }
        Command::Trigger(TriggerCommand::Explain {
            cron,
            tz,
            count,
            after,
        }) => {
            let schedule = Schedule::parse(&cron, &tz)?;
            let after_ms = match after {
                Some(s) => chrono::DateTime::parse_from_rfc3339(&s)
                    .map_err(|e| anyhow::anyhow!("--after `{s}`: {e}"))?
                    .timestamp_millis(),
                None => chrono::Utc::now().timestamp_millis(),
            };
            for (ms, local) in schedule.explain(after_ms, count) {
                let utc = chrono::DateTime::from_timestamp_millis(ms)
                    .map(|d| d.to_rfc3339())
                    .unwrap_or_default();
                println!("{utc}  {local}");
            }
        }
        Command::Status { target, json, last } => {
            let client = connect_target(&target).await?;
            let s = store::status::read(&client, last).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&s)?);
            } else {
                print!("{}", s.render());
            }
        }
        Command::Runs(RunsCommand::List {
            target,
            trigger,
            limit,
        }) => {
            let client = connect_target(&target).await?;
            for r in store::status::list_runs(&client, trigger.as_deref(), limit).await? {
                println!("{}", r);
            }
        }
        Command::CheckConfig { .. } | Command::Run { .. } => unreachable!("handled in main"),
    }
    Ok(())
}
