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

/// Takes up to `batch` queued runs through the V10 contract's take ([`TAKE_SQL`]) on `c` (a
/// dispatcher's connection); their run ids.
///
/// [`TAKE_SQL`]: qlsched::store::dispatch::TAKE_SQL
pub async fn take(c: &tokio_postgres::Client, batch: i64) -> Vec<Uuid> {
    c.query(qlsched::store::dispatch::TAKE_SQL, &[&batch])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// Starts taken `runs` through the direct start ([`START_SQL`]) on `c`; how many started.
///
/// [`START_SQL`]: qlsched::store::dispatch::START_SQL
pub async fn start_direct(c: &tokio_postgres::Client, runs: &[Uuid]) -> usize {
    c.query(qlsched::store::dispatch::START_SQL, &[&runs])
        .await
        .unwrap()
        .len()
}

/// Finishes started `run` as `status`, with no error, through the direct finish
/// ([`FINISH_SQL`]) on `c`; how many finished.
///
/// [`FINISH_SQL`]: qlsched::store::dispatch::FINISH_SQL
pub async fn finish_direct(c: &tokio_postgres::Client, run: Uuid, status: &str) -> usize {
    c.query(
        qlsched::store::dispatch::FINISH_SQL,
        &[&vec![run], &vec![status], &vec![None::<String>]],
    )
    .await
    .unwrap()
    .len()
}

/// An engine on `session` with the replica's bounds: admission bound `admit_timeout`, 3
/// serialization retries, a 60 s reject back-off.
pub fn engine(
    session: qlsched::db::session::Session,
    admit_timeout: std::time::Duration,
) -> qlsched::engine::Engine {
    qlsched::engine::Engine {
        session,
        log: crate::discard_log(),
        metrics: qlsched::metrics::Metrics::default(),
        admit_timeout,
        max_retries: 3,
        reject_backoff: std::time::Duration::from_secs(60),
    }
}

/// A job for the engine: `action` on the claimed row `claim`, under a lease ending at
/// `deadline`, with a 1 s back-off after an error.
pub fn job(
    claim: &ClaimedRow,
    action: qlsched::engine::Action,
    kind: qlsched::engine::Kind,
    deadline: std::time::Instant,
) -> qlsched::engine::Job {
    qlsched::engine::Job {
        claim: claim.clone(),
        action,
        kind,
        lease_deadline: deadline,
        error_backoff: std::time::Duration::from_secs(1),
    }
}
