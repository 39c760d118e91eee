//! Operator trigger management: `trigger list | show | disable | enable | delete | fire |
//! backfill`. All through the admin role; a human table by default, `--json` for scripts.

//!
//! `view` prints (`list`, `show`), `ops` changes state and fires (`disable`, `enable`,
//! `delete`, `fire`), `backfill` admits a past window.

mod backfill;
mod ops;
mod show;

pub use backfill::{
    backfill, occurrences_in, BackfillArgs, BACKFILL_DEFAULT_MAX, BACKFILL_HARD_CAP,
};
pub use ops::{delete, disable, enable, fire, ChangeArgs};
pub use show::{list, show};

use super::error::CliError;

/// Parses an RFC 3339 time given to `arg` into Unix ms.
pub fn parse_time(arg: &'static str, value: &str) -> Result<i64, CliError> {
    chrono::DateTime::parse_from_rfc3339(value)
        .map(|t| t.timestamp_millis())
        .map_err(|source| CliError::BadTime {
            arg,
            value: value.into(),
            source,
        })
}

/// Who an operator action is recorded as: `--actor`, else the login user, plus the
/// database role it ran as (`alice via qlsched_admin`).
/// Refuses an argument longer than `max` characters (before anything is written).
pub(super) fn at_most(arg: &'static str, value: Option<&str>, max: usize) -> Result<(), CliError> {
    match value.map(|v| v.chars().count()) {
        Some(len) if len > max => Err(CliError::TooLong { arg, len, max }),
        _ => Ok(()),
    }
}

pub(super) async fn actor(
    client: &tokio_postgres::Client,
    given: Option<&str>,
) -> Result<String, CliError> {
    at_most("--actor", given, 100)?;
    let role = crate::schema::current_role(client).await?;
    let person = crate::cli::audit::declare_origin(client, given).await?;
    Ok(match person {
        Some(p) => format!("{p} via {role}"),
        None => role,
    })
}
