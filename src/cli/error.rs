//! Why a command failed, and the exit code each reason maps to.
//!
//! | code | meaning |
//! |------|---------|
//! | 0 | done (including a repeated disable/enable/delete, which changes nothing) |
//! | 1 | the database is unreachable (the host is named) or failed |
//! | 2 | bad input: an argument, a time, a window, a DSN, a config; nothing was written |
//! | 3 | unknown trigger, project or run id (named) |
//! | 4 | refused by state: the trigger is disabled or deleted, its project is not active, or it was republished mid-command; a backfill whose horizon a `runs prune` moved mid-command; `runs cancel --run` of a run a dispatcher took |
//! | 5 | `apply --check`: the database differs from the files |

use std::path::PathBuf;

use crate::config::ConfigError;
use crate::db::StoreError;
use crate::schedule::ScheduleError;
use crate::store::manage::ManageError;

#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("give --config FILE, --dsn DSN, or set QLSCHED_DSN (or libpq's PGHOST, PGHOSTADDR or PGDATABASE)")]
    NoTarget,
    #[error("invalid DSN ({source})")]
    Dsn { source: crate::db::dsn::DsnError },
    #[error("--password-file {}: {source}", path.display())]
    PasswordFile {
        path: PathBuf,
        source: crate::db::credfile::CredFileError,
    },
    #[error("--password-file {}: the file is empty", path.display())]
    EmptyPasswordFile { path: PathBuf },
    #[error("cannot reach the database at {host}: {source}")]
    Unreachable { host: String, source: StoreError },
    #[error("{0}")]
    Config(#[from] ConfigError),
    #[error("{0}")]
    Schedule(#[from] ScheduleError),
    #[error("{0}")]
    Manage(#[from] ManageError),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{arg} `{value}`: not an RFC 3339 time such as 2026-03-01T00:00:00Z ({source})")]
    BadTime {
        arg: &'static str,
        value: String,
        source: chrono::ParseError,
    },
    #[error("--from {from} is not before --to {to}: the window [from, to) is empty or reversed")]
    WindowOrder { from: String, to: String },
    #[error(
        "--to {to} is in the future (database clock {now}): backfill admits past occurrences only"
    )]
    WindowInFuture { to: String, now: String },
    #[error(
        "--from {from} is before the retention horizon {horizon} ({why}): runs of that window \
         may have been pruned, so a backfill could admit them again; nothing was written"
    )]
    WindowPastHorizon {
        from: String,
        horizon: String,
        why: String,
    },
    #[error("--from/--to: the window holds more than {max} occurrences (--max {max}); nothing was written")]
    WindowOverCap { max: usize },
    #[error("--max {max}: must be within 1..={hard_cap}")]
    MaxOutOfRange { max: usize, hard_cap: usize },
    #[error("--chunk {chunk}: must be within 1..=10000")]
    ChunkOutOfRange { chunk: usize },
    #[error("--request-id `{value}`: must match [A-Za-z0-9._:-]{{1,128}}")]
    BadRequestId { value: String },
    #[error("{arg}: {len} characters; at most {max}")]
    TooLong {
        arg: &'static str,
        len: usize,
        max: usize,
    },
    #[error("--limit {limit}: must be within 1..=10000")]
    LimitOutOfRange { limit: i64 },
    #[error("--misfire `{value}`: {source}")]
    Misfire {
        value: String,
        source: ScheduleError,
    },
    #[error("--run `{value}`: not a run id (a UUID)")]
    BadRunId { value: String },
    #[error("run {id} does not exist")]
    UnknownRun { id: String },
    #[error("trigger {id} does not exist")]
    UnknownTriggerId { id: String },
    #[error("run {id} was taken by a dispatcher (it is no longer queued); nothing was written")]
    RunTaken { id: String },
    #[error("more than {max} queued runs match (--max {max}); nothing was written")]
    CancelOverCap { max: usize },
    #[error("more than {max} queued runs were admitted before {before} (--max {max}); nothing was written")]
    PruneOverCap { max: usize, before: String },
    #[error(
        "--queued-before {value} is in the future (database clock {now}); nothing was written"
    )]
    QueuedBeforeInFuture { value: String, now: String },
    #[error("database is not ready ({problems} problem(s))")]
    NotReady { problems: usize },
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Startup(crate::startup::StartupError),
    #[error(transparent)]
    Worker(crate::worker::WorkerError),
    /// `task publish` of a spec `qlsched worker` would refuse (exit 2).
    #[error("{0}")]
    Spec(#[from] crate::worker::spec::SpecError),
    /// `qlsched apply`: the files hold problems (each printed, naming file, line and key).
    #[error("{} problem(s) in the definition files; nothing was written:\n{}", problems.len(), problems.join("\n"))]
    ApplyInput { problems: Vec<String> },
    /// `qlsched apply --check`: the database differs from the files (exit 5).
    #[error("the database differs from the files: {creates} to create, {updates} to update, {deletes} to delete, {refused} refused")]
    Drift {
        creates: usize,
        updates: usize,
        deletes: usize,
        refused: usize,
    },
    /// `qlsched apply`: the plan refuses items (each named in the plan; exit 2).
    #[error("{refused} item(s) of the plan refused (each named above); nothing was written")]
    ApplyRefused { refused: usize },
    /// `qlsched apply --prune` deleting more than `--max-delete` (exit 2).
    #[error("the plan deletes {count} triggers, more than --max-delete {max}; nothing was written (check the files and their source label, or give a larger --max-delete)")]
    TooManyDeletes { count: usize, max: usize },
    /// `qlsched export` of a definition the file format cannot hold.
    #[error("{0}")]
    Export(String),
}

impl CliError {
    /// The process exit code (see the module table).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Manage(m) => match m {
                ManageError::UnknownTrigger { .. }
                | ManageError::UnknownProject { .. }
                | ManageError::UnknownTask { .. } => 3,
                ManageError::Deleted { .. }
                | ManageError::PublishedDisabled { .. }
                | ManageError::Disabled { .. }
                | ManageError::ProjectInactive { .. }
                | ManageError::RevisionChanged { .. }
                | ManageError::HorizonMoved { .. }
                | ManageError::CorruptExecutionRevision { .. }
                | ManageError::Overlap { .. } => 4,
                ManageError::Definition { .. }
                | ManageError::NeverFiresAgain { .. }
                | ManageError::MisfireGrace { .. }
                | ManageError::PauseAfterFailures { .. }
                | ManageError::ExpectSuccessWithin { .. }
                | ManageError::JitterBound { .. }
                | ManageError::JitterTooLong { .. }
                | ManageError::Window { .. }
                | ManageError::TaskInOtherProject { .. } => 2,
                ManageError::Store(_) => 1,
            },
            CliError::Unreachable { .. }
            | CliError::Store(_)
            | CliError::NotReady { .. }
            | CliError::Json(_)
            | CliError::Startup(_)
            | CliError::Worker(_) => 1,
            CliError::UnknownRun { .. } | CliError::UnknownTriggerId { .. } => 3,
            CliError::RunTaken { .. } => 4,
            CliError::Drift { .. } => 5,
            CliError::Export(_) => 1,
            _ => 2,
        }
    }
}
