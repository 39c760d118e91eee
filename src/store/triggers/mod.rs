//! Operator management of triggers (admin role): list and show, disable / enable with a
//! note, delete, fire one occurrence now, and backfill a past window.
//!
//! Every write takes the trigger row first (`FOR UPDATE` to change its state, `FOR SHARE`
//! to admit a run for it), so a fire or a backfill chunk never commits after a disable or
//! delete of the same trigger has returned, and each state change is one transaction.
//!
//! `view` answers `list` and `show`; `state` changes a trigger's state (disable, enable,
//! delete); `admit` writes the runs an operator admits (fire, backfill).

mod manual;
pub mod outcome;
mod read;
mod state;

pub use manual::{
    backfill_chunk, backfill_chunk_with, backfill_definition, backfill_definition_in, fire,
    fire_with, manual_key, BackfillCount, BackfillDefinition, Fired,
};
pub use outcome::TriggerOutcome;
pub use read::{
    list, list_among, list_with_prefix, show, walk_ids, ListQuery, StateFilter, TriggerView,
    LIST_SQL,
};
pub use state::{delete, disable, enable};

use super::manage::ManageError;

/// Whether a state change did anything (repeating one is a no-op).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Yes,
    AlreadyThatWay,
}

/// A trigger row as the management commands read it, under a row lock.
#[derive(Clone, Debug)]
pub(super) struct LockedTrigger {
    /// Running: published enabled and not disabled by an operator (and not deleted).
    pub enabled: bool,
    pub published_enabled: bool,
    pub operator_disabled: bool,
    pub deleted: bool,
    pub revision: i64,
    pub project: String,
    pub cron_expr: String,
    pub timezone: String,
    /// The start of the trigger's validity window (docs/policies-jitter.md).
    pub start_at_ms: Option<i64>,
}

/// The trigger row, locked in `mode` until the transaction ends. One read, so expression,
/// zone and revision are of one row version. `UnknownTrigger` if absent.
pub(super) async fn lock_trigger(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    mode: &str,
) -> Result<LockedTrigger, ManageError> {
    let sql = format!(
        "SELECT enabled, published_enabled, operator_disabled, deleted_at_ms IS NOT NULL, revision,
                project_id, cron_expr, timezone, start_at_ms
           FROM qlsched.triggers WHERE trigger_id = $1 FOR {mode}"
    );
    match tx.query_opt(&sql, &[&id]).await? {
        Some(r) => Ok(LockedTrigger {
            enabled: r.get(0),
            published_enabled: r.get(1),
            operator_disabled: r.get(2),
            deleted: r.get(3),
            revision: r.get(4),
            project: r.get(5),
            cron_expr: r.get(6),
            timezone: r.get(7),
            start_at_ms: r.get(8),
        }),
        None => Err(ManageError::UnknownTrigger { id: id.into() }),
    }
}
