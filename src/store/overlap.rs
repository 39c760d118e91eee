//! The overlap policy of a trigger (migration V21, docs/policies-overlap.md): what an
//! occurrence due while a run of the trigger is unfinished does. The decision itself is the
//! database's, inside whichever transaction inserts the run: the replica's admission
//! statement for `forbid` and `buffer_one` (V26, `store::admission::ADMIT_SQL`), the row
//! trigger `qlsched.overlap_admit` for everything else; this module sets the policy at
//! publish and names a request's own.

use std::fmt;
use std::str::FromStr;

use crate::store::manage::ManageError;

/// allow (every occurrence admitted, the default), forbid (skipped while a run is
/// unfinished), buffer_one (one kept and admitted when the run ends, further ones skipped),
/// replace (the unfinished runs get a cancel, the occurrence is admitted).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OverlapPolicy {
    #[default]
    Allow,
    Forbid,
    BufferOne,
    Replace,
}

impl OverlapPolicy {
    /// The stored spelling (triggers.overlap_policy, runs.overlap_policy).
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            OverlapPolicy::Allow => "allow",
            OverlapPolicy::Forbid => "forbid",
            OverlapPolicy::BufferOne => "buffer_one",
            OverlapPolicy::Replace => "replace",
        }
    }

    /// Every spelling, for the command line.
    pub const NAMES: [&'static str; 4] = ["allow", "forbid", "buffer_one", "replace"];
}

impl FromStr for OverlapPolicy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow" => Ok(OverlapPolicy::Allow),
            "forbid" => Ok(OverlapPolicy::Forbid),
            "buffer_one" => Ok(OverlapPolicy::BufferOne),
            "replace" => Ok(OverlapPolicy::Replace),
            other => Err(format!(
                "unknown overlap policy `{other}` (allow, forbid, buffer_one, replace)"
            )),
        }
    }
}

impl fmt::Display for OverlapPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Writes the policy of a new revision of trigger `id`, inside its publish transaction
/// (the trigger row and the schedule row locked by it, so no admission, fire or backfill of
/// the trigger runs meanwhile). A policy other than allow makes the trigger's unfinished
/// runs counted and its count exact (`qlsched.overlap_adopt`, the admin role's).
pub async fn set_policy(
    tx: &tokio_postgres::Transaction<'_>,
    id: &str,
    policy: OverlapPolicy,
) -> Result<(), ManageError> {
    tx.execute(
        "UPDATE qlsched.triggers SET overlap_policy = $2
          WHERE trigger_id = $1 AND overlap_policy <> $2",
        &[&id, &policy.as_str()],
    )
    .await?;
    if policy != OverlapPolicy::Allow {
        tx.execute("SELECT qlsched.overlap_adopt($1)", &[&id])
            .await?;
    }
    Ok(())
}
