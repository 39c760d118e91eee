//! `qlsched db bootstrap | migrate | check`.

use std::path::PathBuf;

use clap::Subcommand;

use super::connect::{self, Target};
use super::error::CliError;
use crate::store::migrate;

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
        /// A file whose first line is the superuser's password.
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
    /// Apply migrations as the owner role and install the exact grants (every role must
    /// exist: after an upgrade that adds one, run `db bootstrap` again first).
    Migrate {
        /// DSN connecting as `<prefix>_owner` to the qlsched database.
        #[arg(long)]
        dsn: String,
        #[arg(long, default_value = "qlsched")]
        prefix: String,
        /// A file whose first line is the owner's password.
        #[arg(long)]
        password_file: Option<PathBuf>,
    },
    /// The readiness gate: migration stream, capability and grants.
    Check {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value = "qlsched")]
        prefix: String,
    },
}

pub async fn run(cmd: DbCommand) -> Result<(), CliError> {
    match cmd {
        DbCommand::Bootstrap {
            superuser_dsn,
            prefix,
            database,
            password_file,
        } => bootstrap(&superuser_dsn, &prefix, &database, password_file).await,
        DbCommand::Migrate {
            dsn,
            prefix,
            password_file,
        } => migrate(&dsn, &prefix, password_file).await,
        DbCommand::Check { target, prefix } => check(&target, &prefix).await,
    }
}

async fn bootstrap(
    dsn: &str,
    prefix: &str,
    database: &str,
    password_file: Option<PathBuf>,
) -> Result<(), CliError> {
    let roles = migrate::Roles::with_prefix(prefix)?;
    let pg = connect::with_password(dsn, password_file.as_deref())?;
    migrate::bootstrap(&pg, &roles, database)
        .await
        .map_err(|source| unreachable_or(&pg, source))?;
    println!(
        "bootstrapped database {database} with roles {}, {}, {}, {}, {}",
        roles.owner, roles.admin, roles.runtime, roles.worker_ingress, roles.dispatcher
    );
    Ok(())
}

async fn migrate(dsn: &str, prefix: &str, password_file: Option<PathBuf>) -> Result<(), CliError> {
    let roles = migrate::Roles::with_prefix(prefix)?;
    let pg = connect::with_password(dsn, password_file.as_deref())?;
    let applied = migrate::migrate(&pg, &roles)
        .await
        .map_err(|source| unreachable_or(&pg, source))?;
    if applied.is_empty() {
        println!("schema up to date; grants installed");
    } else {
        println!("applied {}; grants installed", applied.join(", "));
    }
    Ok(())
}

async fn check(target: &Target, prefix: &str) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    let roles = migrate::Roles::with_prefix(prefix)?;
    let problems = migrate::check(&client, &roles.checked()).await?;
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("{p}");
        }
        return Err(CliError::NotReady {
            problems: problems.len(),
        });
    }
    println!(
        "database ready: migrations, capability {} v{} and grants as expected",
        migrate::CAPABILITY.0,
        migrate::CAPABILITY.1
    );
    Ok(())
}

/// A connection that could not be made names the host; other errors stay as they are.
fn unreachable_or(pg: &tokio_postgres::Config, e: crate::store::StoreError) -> CliError {
    match &e {
        crate::store::StoreError::Db(db) if db.as_db_error().is_none() => CliError::Unreachable {
            host: connect::host_of(pg),
            source: e,
        },
        _ => CliError::Store(e),
    }
}
