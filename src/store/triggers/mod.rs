//! Operator management of triggers (admin role): list and show, disable / enable with a
//! note, delete, fire one occurrence now, and backfill a past window.
//!
//! Every write takes the trigger row first (`FOR UPDATE` to change its state, `FOR SHARE`
//! to admit a run for it), so a fire or a backfill chunk never commits after a disable or
//! delete of the same trigger has returned, and each state change is one transaction.
//!
//! `view` answers `list` and `show`; `state` changes a trigger's state (disable, enable,
//! delete); `admit` writes the runs an operator admits (fire, backfill).

mod admit;
mod state;
mod view;

pub use admit::{admittable_revision, backfill_chunk, fire, manual_key, BackfillCount, Fired};
pub use state::{delete, disable, enable};
pub use view::{list, show, ListQuery, StateFilter, TriggerView, LIST_SQL};

use super::manage::ManageError;

/// Whether a state change did anything (repeating one is a no-op).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Changed {
    Yes,
    AlreadyThatWay,
}

/// The trigger row, locked in `mode` until the transaction ends: (enabled, deleted,
/// revision, project). `UnknownTrigger` if absent.
pub(super) async fn lock_trigger(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    mode: &str,
) -> Result<(bool, bool, i64, String), ManageError> {
    let sql = format!(
        "SELECT enabled, deleted_at_ms IS NOT NULL, revision, project_id
           FROM qlsched.triggers WHERE trigger_id = $1 FOR {mode}"
    );
    match tx.query_opt(&sql, &[&id]).await? {
        Some(r) => Ok((r.get(0), r.get(1), r.get(2), r.get(3))),
        None => Err(ManageError::UnknownTrigger { id: id.into() }),
    }
}
