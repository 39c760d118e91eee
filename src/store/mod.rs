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

/// The jitter offset of an occurrence in SQL: the same function as
/// `schedule::jitter_offset_ms` (docs/policies-jitter.md), of a trigger id, a nominal
/// instant (ms) and a jitter (ms), each a SQL expression. 0 without a jitter. Exported for
/// the test that holds it to the Rust function.
#[macro_export]
macro_rules! jitter_offset_sql {
    ($id:literal, $nominal:literal, $jitter:literal) => {
        concat!(
            "CASE WHEN ",
            $jitter,
            " > 0 THEN (('x' || left(encode(sha256(convert_to(",
            $id,
            " || ':' || (",
            $nominal,
            ")::text, 'UTF8')), 'hex'), 16))::bit(64)::bigint
                  & 9223372036854775807) % ",
            $jitter,
            " ELSE 0 END"
        )
    };
}

/// Where the claim index holds a free schedule row whose cursor is `$cursor`, in SQL (as
/// `schedule::Timing::claimable_at_ms`): at the cursor's jittered instant, out of the index
/// (NULL) once the cursor is past the trigger's `end_at_ms`, at once (0) while the cursor is
/// pending. The trigger's row is `t` in the statement.
macro_rules! claimable_at_sql {
    ($id:literal, $cursor:literal) => {
        concat!(
            "CASE WHEN (",
            $cursor,
            ") IS NULL THEN 0
                  WHEN (",
            $cursor,
            ") > t.end_at_ms THEN NULL
                  ELSE (",
            $cursor,
            ") + ",
            $crate::jitter_offset_sql!($id, $cursor, "t.jitter_ms"),
            " END"
        )
    };
}

pub mod admission;
pub mod audit;
pub mod browse;
pub mod claim;
pub mod console_actions;
pub mod definitions;
pub mod dispatch;
#[cfg(test)]
mod lock_order;
pub mod manage;
pub mod overlap;

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
