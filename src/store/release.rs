//! Giving leases back: after a reject (with back-off), at graceful stop, and at start-up for
//! claims a previous incarnation of this replica id left behind.

use super::claim::Fence;
use super::StoreError;
use crate::db_now_ms;

/// Releases one claim if it is still exactly ours; the row becomes claimable again at
/// `now + backoff_ms` (0 = at once, or at its cursor if that is later).
///
/// Locking: one autocommit UPDATE guarded by owner + token + version; a row that was taken
/// over or republished since is left untouched (0 rows). Expiry is not required: a token
/// that still matches means nobody else has taken the row.
pub async fn release_claim(
    conn: &tokio_postgres::Client,
    trigger_id: &str,
    fence: &Fence,
    backoff_ms: i64,
) -> Result<bool, StoreError> {
    let n = conn
        .execute(
            concat!(
                "WITH obs AS MATERIALIZED (SELECT ",
                db_now_ms!(),
                " AS now_ms)
             UPDATE qlsched.trigger_schedules s
                SET claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                    claimable_at_ms = CASE WHEN $5::bigint > 0 THEN obs.now_ms + $5
                                           ELSE coalesce(s.next_fire_at_ms, 0) END,
                    state_version = s.state_version + 1, updated_at_ms = obs.now_ms
               FROM obs
              WHERE s.trigger_id = $1 AND s.claim_owner = $2 AND s.claim_token = $3
                AND s.claim_version = $4"
            ),
            &[
                &trigger_id,
                &fence.owner,
                &fence.token,
                &fence.version,
                &backoff_ms,
            ],
        )
        .await?;
    Ok(n == 1)
}

/// The release of every claim under owner `$1` that also matches `extra` (a SQL condition):
/// the row becomes free and claimable at its cursor (at once when it is pending).
macro_rules! release_owned_where {
    ($extra:expr) => {
        concat!(
            "UPDATE qlsched.trigger_schedules s
                SET claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                    claimable_at_ms = coalesce(s.next_fire_at_ms, 0),
                    state_version = s.state_version + 1,
                    updated_at_ms = ",
            $crate::db_now_ms!(),
            "
              WHERE s.claim_owner = $1",
            $extra
        )
    };
}

/// Releases every claim held under `owner`. Only safe while this process holds the
/// replica-id guard (no other live process can own claims under the same id): used at
/// start-up for a previous incarnation's leases and at the end of a graceful stop.
///
/// Locking: one autocommit UPDATE; rows another transaction is admitting are waited for and
/// then re-checked (an admitted row no longer has this owner and is skipped).
pub async fn release_all_owned(
    conn: &tokio_postgres::Client,
    owner: &str,
) -> Result<u64, StoreError> {
    Ok(conn.execute(release_owned_where!(""), &[&owner]).await?)
}

/// Releases the rows that this owner's claim rounds `rounds` leased and nobody works on (the
/// round's reply never arrived). Returns how many rows were released.
///
/// Locking: one autocommit UPDATE guarded by owner and round id: rows of any other round
/// (held by live claim actors) or taken over since (another owner) are untouched; a round
/// still running on the server is waited for by row lock and re-checked.
pub async fn release_rounds(
    conn: &tokio_postgres::Client,
    owner: &str,
    rounds: &[uuid::Uuid],
) -> Result<u64, StoreError> {
    Ok(conn
        .execute(
            release_owned_where!(" AND s.claim_round = ANY ($2)"),
            &[&owner, &rounds],
        )
        .await?)
}
