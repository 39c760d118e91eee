//! `qlsched audit`: the audit log, newest first (docs/audit.md); and the origin every
//! writing command declares before it writes, so its audit rows name who asked.

use clap::Args;

use super::connect::{self, Target};
use super::error::CliError;
use super::triggers::parse_time;
use crate::present;
use crate::store::audit::{self, AuditFilter, Origin, Source};

/// The most rows one `qlsched audit` prints.
pub const AUDIT_LIMIT_MAX: i64 = 10_000;

/// Declares this connection's audit origin: the person (`--actor`, else `$USER`, else
/// `$LOGNAME`) and this host, source `cli`. Returns the person, if any.
pub(super) async fn declare_origin(
    client: &tokio_postgres::Client,
    given: Option<&str>,
) -> Result<Option<String>, CliError> {
    let person = given
        .map(str::to_string)
        .or_else(|| std::env::var("USER").ok())
        .or_else(|| std::env::var("LOGNAME").ok())
        .filter(|s| !s.is_empty());
    let origin = Origin {
        actor: person.clone(),
        host: Some(crate::startup::hostname()),
        source: Source::Cli,
        label: None,
    };
    audit::declare(client, &origin).await?;
    Ok(person)
}

/// What `qlsched audit` takes.
#[derive(Args, Debug)]
pub struct AuditArgs {
    #[command(flatten)]
    pub target: Target,
    /// Only this trigger's rows (its definition and the actions on its runs).
    #[arg(long)]
    pub trigger: Option<String>,
    /// Only rows of objects in this project.
    #[arg(long)]
    pub project: Option<String>,
    /// Only rows at or after this time (RFC 3339).
    #[arg(long)]
    pub since: Option<String>,
    /// At most this many rows, newest first (1..=10000).
    #[arg(long, default_value_t = 50)]
    pub limit: i64,
    #[arg(long)]
    pub json: bool,
}

/// `qlsched audit`.
pub async fn audit(a: AuditArgs) -> Result<(), CliError> {
    if !(1..=AUDIT_LIMIT_MAX).contains(&a.limit) {
        return Err(CliError::LimitOutOfRange { limit: a.limit });
    }
    let since_ms = a
        .since
        .as_deref()
        .map(|s| parse_time("--since", s))
        .transpose()?;
    let client = connect::connect_target(&a.target).await?;
    let f = AuditFilter {
        trigger: a.trigger.as_deref(),
        project: a.project.as_deref(),
        since_ms,
        before: None,
        limit: a.limit,
    };
    let page = audit::page(&client, &f).await?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&page)?);
        return Ok(());
    }
    for e in &page.entries {
        println!("{}", present::audit::line(e));
    }
    Ok(())
}
