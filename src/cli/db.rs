//! `qlsched db bootstrap | migrate | check | status`.

use std::path::PathBuf;
use std::time::Duration;

use clap::Subcommand;

use super::connect::{self, Target};
use super::error::CliError;
use crate::schema;

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
        /// How long one migration waits for a table lock before it lets go and retries
        /// (admissions queue behind a waiting migration for at most this long): 500ms, 1s, 2m.
        #[arg(long, default_value = "1s", value_parser = parse_duration)]
        lock_timeout: Duration,
        /// Give up (exit 1, the waiting migration not applied) once lock time-outs and
        /// back-offs have taken this long in total.
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        max_wait: Duration,
    },
    /// The readiness gate: migration stream and compatible range, capability and grants.
    Check {
        #[command(flatten)]
        target: Target,
        #[arg(long, default_value = "qlsched")]
        prefix: String,
    },
    /// Applied migrations (checksum, applied at, kind), the range of binaries the schema
    /// serves, this binary, and what each live replica runs.
    Status {
        #[command(flatten)]
        target: Target,
        #[arg(long)]
        json: bool,
    },
}

pub(crate) use crate::apply::options::parse_duration;

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
            lock_timeout,
            max_wait,
        } => {
            let opts = schema::MigrateOptions {
                lock_timeout,
                max_wait,
            };
            migrate(&dsn, &prefix, password_file, &opts).await
        }
        DbCommand::Check { target, prefix } => check(&target, &prefix).await,
        DbCommand::Status { target, json } => status(&target, json).await,
    }
}

async fn bootstrap(
    dsn: &str,
    prefix: &str,
    database: &str,
    password_file: Option<PathBuf>,
) -> Result<(), CliError> {
    let roles = schema::Roles::with_prefix(prefix)?;
    let pg = connect::with_password(dsn, password_file.as_deref())?;
    schema::bootstrap(&pg, &roles, database)
        .await
        .map_err(|source| unreachable_or(&pg, source))?;
    println!(
        "bootstrapped database {database} with roles {}, {}, {}, {}, {}",
        roles.owner, roles.admin, roles.runtime, roles.worker_ingress, roles.dispatcher
    );
    Ok(())
}

async fn migrate(
    dsn: &str,
    prefix: &str,
    password_file: Option<PathBuf>,
    opts: &schema::MigrateOptions,
) -> Result<(), CliError> {
    let roles = schema::Roles::with_prefix(prefix)?;
    let pg = connect::with_password(dsn, password_file.as_deref())?;
    let set = schema::MigrationSet::embedded();
    let applied = schema::migrate_set(&pg, &roles, &set, opts, &mut |w| {
        eprintln!("qlsched: waiting: {w}")
    })
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
    let roles = schema::Roles::with_prefix(prefix)?;
    let problems = schema::check(&client, &roles.checked()).await?;
    if !problems.is_empty() {
        for p in &problems {
            eprintln!("{p}");
        }
        return Err(CliError::NotReady {
            problems: problems.len(),
        });
    }
    let range = schema::compat::range(&client).await?;
    println!(
        "database ready: migrations (the database at V{}, serving binaries that know V{} or \
         later; this binary knows up to V{}), capability {} v{} and grants as expected",
        range.newest,
        range.floor,
        schema::newest_known(),
        schema::CAPABILITY.0,
        schema::CAPABILITY.1
    );
    Ok(())
}

async fn status(target: &Target, json: bool) -> Result<(), CliError> {
    let client = connect::connect_target(target).await?;
    let s = schema::report::read(&client).await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print!("{}", s.render());
    }
    Ok(())
}

/// A connection that could not be made names the host; other errors stay as they are.
fn unreachable_or(pg: &tokio_postgres::Config, e: crate::db::StoreError) -> CliError {
    match &e {
        crate::db::StoreError::Db(db) if db.as_db_error().is_none() => CliError::Unreachable {
            host: connect::host_of(pg),
            source: e,
        },
        _ => CliError::Store(e),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_duration;
    use std::time::Duration;

    #[test]
    fn durations_take_ms_s_m_h_and_bare_seconds() {
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2s"), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("3"), Ok(Duration::from_secs(3)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("0s").is_err());
        assert!(parse_duration("1d").is_err());
        assert!(parse_duration("ms").is_err());
    }
}
