//! `qlsched runs prune --queued-before T`: the queued runs nobody will dispatch, counted
//! and then removed in committed chunks through `qlsched.prune_queued` (V12), under the
//! advisory lock each `trigger backfill` chunk shares.

use serde::Serialize;
use uuid::Uuid;

use super::audit::{self, ObjectKind};
use crate::db::StoreError;

/// The advisory lock `qlsched.prune_queued` (V12) takes exclusively and each `trigger
/// backfill` chunk shares (src/store/triggers/manual.rs): a chunk never admits an occurrence
/// whose run a concurrent prune is removing.
pub const PRUNE_QUEUED_LOCK: i64 = 8_173_034_294_560_948_225;
/// [`PRUNE_QUEUED_LOCK`] as errors name it.
pub const PRUNE_LOCK_NAME: &str = "prune lock (advisory lock 8173034294560948225)";

/// `qlsched runs prune --queued-before T` (docs/operations.md, "Pruning a queued backlog"):
/// the queued runs admitted and scheduled before `before_ms`, read before anything is
/// written.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
pub struct QueuedBacklog {
    /// Queued runs admitted and scheduled before the bound.
    pub matched: i64,
    /// Of those, how many are untouched (what a prune would remove unless a dispatcher
    /// takes them meanwhile).
    pub untouched: i64,
}

/// The backlog's counts and the ids of its queued runs (oldest first, at most `limit`), from
/// one snapshot (a read-only REPEATABLE READ transaction); reads `runs_queued_at_idx`.
pub async fn read_queued_backlog(
    client: &mut tokio_postgres::Client,
    before_ms: i64,
    limit: i64,
) -> Result<(QueuedBacklog, Vec<Uuid>), StoreError> {
    const WHERE: &str = "r.status = 'queued' AND r.queued_at_ms < $1 AND r.scheduled_for_ms < $1";
    let tx = super::snapshot(client).await?;
    let row = tx
        .query_one(
            &format!(
                "SELECT count(*),
                        count(*) FILTER (WHERE NOT r.cancelled
                          AND (SELECT count(*) FROM qlsched.attempts a WHERE a.run_id = r.run_id) = 1
                          AND EXISTS (SELECT 1 FROM qlsched.attempts a
                                       WHERE a.run_id = r.run_id AND a.attempt_no = 1
                                         AND a.state = 'claimed'
                                         AND num_nonnulls(a.worker_id, a.session_id, a.lease_id,
                                               a.lease_expires_at_ms, a.offer_id, a.callback_token,
                                               a.started_at_ms, a.finished_at_ms, a.result,
                                               a.error) = 0))
                   FROM qlsched.runs r WHERE {WHERE}"
            ),
            &[&before_ms],
        )
        .await?;
    let ids = tx
        .query(
            &format!(
                "SELECT r.run_id FROM qlsched.runs r WHERE {WHERE}
                  ORDER BY r.queued_at_ms, r.run_id LIMIT $2"
            ),
            &[&before_ms, &limit],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    tx.commit().await?;
    Ok((
        QueuedBacklog {
            matched: row.get(0),
            untouched: row.get(1),
        },
        ids,
    ))
}

/// One committed chunk of `runs prune`: removes those of `ids` still queued and untouched
/// (admitted and scheduled before `before_ms`) with their attempts and events, through
/// `qlsched.prune_queued` (V12; it first raises the recorded horizon to `before_ms`).
/// Returns how many; the rest a dispatcher took or holds: left alone.
///
/// Locking: the function takes [`PRUNE_QUEUED_LOCK`] exclusively, which any role may hold
/// (advisory locks take no privilege), then locks runs `FOR UPDATE SKIP LOCKED` and the
/// maintenance row. Its transaction's lock waits are bounded (db::locks), and a time-out
/// names the lock's holders.
pub async fn prune_queued_chunk(
    client: &mut tokio_postgres::Client,
    before_ms: i64,
    ids: &[Uuid],
) -> Result<u64, StoreError> {
    let tx = client.transaction().await?;
    let bound = crate::db::locks::bound_waits(&tx).await?;
    let before = audit::snapshot(&tx, ObjectKind::Maintenance, "prune").await?;
    let pruned = tx
        .query_one(
            "SELECT qlsched.prune_queued($1::bigint, $2::uuid[])",
            &[&before_ms, &ids],
        )
        .await;
    match pruned {
        Ok(row) => {
            let removed = row.get::<_, i64>(0);
            let after = audit::snapshot(&tx, ObjectKind::Maintenance, "prune").await?;
            let mut changes = audit::diff(before.as_ref(), after.as_ref());
            if removed > 0 || changes.as_object().is_some_and(|c| !c.is_empty()) {
                changes["removed"] = removed.into();
                changes["queued_before_ms"] = before_ms.into();
                let entry = audit::Entry {
                    kind: ObjectKind::Maintenance,
                    id: "prune",
                    project: None,
                    action: "runs.prune",
                    changes,
                    note: None,
                    origin: None,
                };
                audit::append(&tx, &entry).await?;
            }
            tx.commit().await?;
            Ok(removed as u64)
        }
        Err(e) => {
            tx.rollback().await?;
            let lock = (PRUNE_LOCK_NAME, PRUNE_QUEUED_LOCK);
            Err(crate::db::locks::wait_error(client, e, "runs prune", lock, bound).await)
        }
    }
}
