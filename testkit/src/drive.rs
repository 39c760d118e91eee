//! The store's statements driven one at a time, as the engine and the supervisor never do:
//! a claim without a replica-id guard, an admission of one occurrence or of a batch on a
//! fresh connection, one cursor move. Tests use them to stage and inspect single steps.

use qlsched::db::StoreError;
use qlsched::store::admission::{self, Admission, AdmitOutcome};
use qlsched::store::claim::{self, ClaimedRow};
use uuid::Uuid;

/// Leases up to `limit` due rows for `owner` for `lease_ms`, stamped with `round`, with no
/// replica-id guard (the nil incarnation).
pub async fn claim_due(
    conn: &tokio_postgres::Client,
    owner: &str,
    lease_ms: i64,
    limit: i64,
    round: Uuid,
) -> Result<Vec<ClaimedRow>, StoreError> {
    let rows = conn
        .query(
            claim::CLAIM_DUE_SQL,
            &[&owner, &lease_ms, &limit, &round, &Uuid::nil(), &0i64],
        )
        .await?;
    Ok(claim::parse_round(&rows).rows)
}

/// One admission transaction for a batch (the statement prepared on `conn` first).
pub async fn admit_batch(
    conn: &tokio_postgres::Client,
    batch: &[Admission<'_>],
) -> Result<Vec<AdmitOutcome>, StoreError> {
    let stmt = conn.prepare(admission::ADMIT_SQL).await?;
    admission::admit_batch_prepared(conn, &stmt, batch).await
}

/// One admission transaction for one occurrence.
pub async fn admit_once(
    conn: &tokio_postgres::Client,
    a: &Admission<'_>,
) -> Result<AdmitOutcome, StoreError> {
    let mut out = admit_batch(conn, std::slice::from_ref(a)).await?;
    Ok(out.remove(0))
}

/// Moves one claimed row's cursor without admitting; whether it moved.
pub async fn advance_cursor(
    conn: &tokio_postgres::Client,
    c: &ClaimedRow,
    next_fire_at_ms: i64,
) -> Result<bool, StoreError> {
    Ok(admission::advance_batch(conn, &[(c.clone(), next_fire_at_ms)]).await?[0])
}
