//! Giving leases back: after a reject (with back-off), at graceful stop, and at start-up for
//! claims a previous incarnation of this replica id left behind.

use super::claim::Fence;
use crate::db::StoreError;
use crate::db_now_ms;

/// Where a released row goes in the claim index: at `now + backoff_ms`, or (0) at its cursor's
/// jittered instant (at once while it is pending; out of the index once the cursor is past the
/// trigger's window, `claimable_at_sql!`), or out of the index (NULL) while its project is not
/// active or its trigger is disabled, as `project set` and `trigger disable` leave such rows
/// (they come back at their cursors when resumed or enabled).
macro_rules! released_claimable_at {
    ($backoff:expr) => {
        concat!(
            "(SELECT CASE WHEN ",
            $backoff,
            " > 0 THEN obs.now_ms + ",
            $backoff,
            " ELSE ",
            claimable_at_sql!("s.trigger_id", "s.next_fire_at_ms"),
            " END
                FROM qlsched.triggers t JOIN qlsched.projects p ON p.project_id = t.project_id
               WHERE t.trigger_id = s.trigger_id AND t.enabled AND p.status = 'active')"
        )
    };
}

/// Releases one claim if it is still exactly ours; see [`release_batch`].
pub async fn release_claim(
    conn: &tokio_postgres::Client,
    trigger_id: &str,
    fence: &Fence,
    backoff_ms: i64,
) -> Result<bool, StoreError> {
    Ok(release_batch(conn, &[(trigger_id, fence, backoff_ms)]).await?[0])
}

/// Releases a batch of claims in one statement; per claim, whether it was still exactly ours
/// (and so released). A released row becomes claimable again at `now + backoff_ms` (0 = at
/// once, or at its cursor if that is later), or leaves the claim index while its project is
/// not active or its trigger disabled.
///
/// Locking: one autocommit UPDATE by primary key guarded, per row, by owner + token +
/// version; a row that was taken over or republished since is left untouched. Expiry is not
/// required: a token that still matches means nobody else has taken the row.
pub async fn release_batch(
    conn: &tokio_postgres::Client,
    batch: &[(&str, &Fence, i64)],
) -> Result<Vec<bool>, StoreError> {
    let ids: Vec<&str> = batch.iter().map(|(id, _, _)| *id).collect();
    let owners: Vec<&str> = batch.iter().map(|(_, f, _)| f.owner.as_str()).collect();
    let tokens: Vec<uuid::Uuid> = batch.iter().map(|(_, f, _)| f.token).collect();
    let cvs: Vec<i64> = batch.iter().map(|(_, f, _)| f.version).collect();
    let backoffs: Vec<i64> = batch.iter().map(|(_, _, b)| *b).collect();
    let rows = conn
        .query(
            concat!(
                "WITH obs AS MATERIALIZED (SELECT ",
                db_now_ms!(),
                " AS now_ms), d AS (
                 SELECT * FROM unnest($1::text[], $2::text[], $3::uuid[], $4::int8[], $5::int8[])
                     AS d(trigger_id, owner, token, cv, backoff_ms)
             )
             UPDATE qlsched.trigger_schedules s
                SET claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                    claimable_at_ms = ",
                released_claimable_at!("d.backoff_ms"),
                ",
                    state_version = s.state_version + 1, updated_at_ms = obs.now_ms
               FROM obs, d
              WHERE s.trigger_id = d.trigger_id AND s.claim_owner = d.owner
                AND s.claim_token = d.token AND s.claim_version = d.cv
             RETURNING s.trigger_id"
            ),
            &[&ids, &owners, &tokens, &cvs, &backoffs],
        )
        .await?;
    Ok(ids
        .iter()
        .map(|id| rows.iter().any(|r| r.get::<_, &str>(0) == *id))
        .collect())
}

/// The release of every claim under owner `$1` that also matches `extra` (a SQL condition):
/// the row becomes free and claimable at its cursor (at once when it is pending), or leaves
/// the claim index while its project is not active or its trigger disabled.
macro_rules! release_owned_where {
    ($extra:expr) => {
        concat!(
            "WITH obs AS MATERIALIZED (SELECT ",
            $crate::db_now_ms!(),
            " AS now_ms)
             UPDATE qlsched.trigger_schedules s
                SET claim_owner = NULL, claim_token = NULL, claim_expires_at_ms = NULL,
                    claimable_at_ms = ",
            released_claimable_at!("0"),
            ",
                    state_version = s.state_version + 1,
                    updated_at_ms = obs.now_ms
               FROM obs
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
