//! Every SQL statement of qlsched, in one place. Each file is named for the rows it writes or
//! reads; each function for the question it answers, and carries, in one comment, the reason
//! its locking is right.
//!
//! Time is always the database clock (`clock_timestamp()` in Unix ms, [`crate::db_now_ms`]),
//! observed inside the same statement that acts on it. Connections come from [`crate::db`].

/// The tail of a `SET` on `qlsched.trigger_schedules s` that fences out a live claim: the
/// claim is cleared and `claim_version` (when there was a claim) and `state_version` are
/// bumped, so the holder's admission, which carries the whole fence in its WHERE, matches no
/// row. An operator's disable, enable, delete and a project's suspend or resume end with it.
macro_rules! fence_out_claim {
    () => {
        concat!(
            "claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                    claim_version = s.claim_version + CASE WHEN s.claim_owner IS NULL THEN 0 ELSE 1 END,
                    state_version = s.state_version + 1, updated_at_ms = ",
            crate::db_now_ms!()
        )
    };
}

pub mod admission;
pub mod audit;
pub mod browse;
pub mod claim;
pub mod definitions;
pub mod dispatch;
#[cfg(test)]
mod lock_order;
pub mod manage;

pub mod queued_prune;
pub mod recovery;
pub mod release;
pub mod replicas;
pub mod retention;
pub mod runs;
pub mod status;
pub mod triggers;
pub mod wake;
pub mod worker;

/// A read-only REPEATABLE READ transaction: one snapshot for reads that must agree.
pub async fn snapshot(
    client: &mut tokio_postgres::Client,
) -> Result<tokio_postgres::Transaction<'_>, tokio_postgres::Error> {
    client
        .build_transaction()
        .isolation_level(tokio_postgres::IsolationLevel::RepeatableRead)
        .read_only(true)
        .start()
        .await
}
