//! The replica-id guard: at most one live process per replica id, judged by the database
//! clock. A copy-pasted config (two processes, one id) is refused at start instead of
//! silently sharing an owner name. Exactly-once never depends on it (every write carries the
//! claim token), but `release_all_owned` and per-replica status do.
//!
//! Whether a holder still lives is asked of the database, never of the local process table
//! (which another PID namespace does not share: two containers with one host name see each
//! other as dead, and a restarted container's new process is PID 1 like the dead one). The
//! holder records the database session it works on — the backend pid and start of its claim
//! connection, kept current by the claim rounds (`store::claim`) — and a holder whose
//! session is gone from `pg_stat_activity` is gone: the kernel closes a dead process's
//! sockets, and its backends end with them.

use uuid::Uuid;

use crate::db::StoreError;
use crate::schema::BINARY_VERSION;

/// Who holds a replica id now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    pub hostname: String,
    pub pid: i32,
    pub heartbeat_age_ms: i64,
    pub expires_in_ms: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum GuardError {
    #[error(
        "replica id `{id}` is held by a live process (host {}, pid {}, heartbeat {} ms ago, expires in {} ms): \
         each replica needs its own id (a copy-pasted config?)",
        holder.hostname, holder.pid, holder.heartbeat_age_ms, holder.expires_in_ms
    )]
    InUse { id: String, holder: Holder },
    #[error(transparent)]
    Store(#[from] StoreError),
}

const NOW: &str = crate::db_now_ms!();

/// The database session running this statement, as the guard records it.
const SESSION: &str =
    "pg_backend_pid(), (SELECT a.backend_start FROM pg_stat_get_activity(pg_backend_pid()) a)";

/// The class of the advisory lock a holder keeps on a connection of its own while it lives
/// (`pg_try_advisory_lock(IDENTITY_LOCK_CLASS, hashtext(replica_id))`, a two-key lock, so it
/// never meets the one-bigint locks of migrations and pruning): `qlsr`.
pub const IDENTITY_LOCK_CLASS: i32 = 0x716c_7372;

/// The recorded session of guard row `r` no longer exists (a holder that recorded none, from
/// before migration V9, counts as alive: its expiry decides). A session is the recorded one
/// when its backend pid and start both match; a NULL start is unknown, never a match by
/// itself. A recorded NULL matches nothing (a live holder re-records its session at its
/// next claim round). A live session at that pid whose start this role may not see (NULL:
/// another role's) is the holder's only if its role could hold the guard (UPDATE on
/// `replicas`: a replica logging in as another member of the runtime role), so doubt keeps
/// a possible holder; a pid reused by any other role's session does not keep a dead one.
///
/// The recorded session is the holder's claim connection, which the holder itself replaces
/// (a claim round that timed out drops it; the next round records the new one): gone, it
/// proves nothing while the holder's identity lock ([`hold_identity`]) is held by any session
/// of this database, and that lock is looked for too (`pg_locks`, readable by every role).
const SESSION_GONE: &str = "r.session_pid IS NOT NULL AND NOT EXISTS (
        SELECT 1 FROM pg_stat_activity a
         WHERE a.pid = r.session_pid
           AND (a.backend_start = r.session_started_at
                OR (a.backend_start IS NULL AND r.session_started_at IS NOT NULL
                    AND has_table_privilege(a.usesysid, 'qlsched.replicas', 'UPDATE'))))
    AND NOT EXISTS (
        SELECT 1 FROM pg_locks l
         WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
           AND l.database = (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())
           AND l.classid = 1902932850::oid AND l.objid = hashtext(r.replica_id)::oid)";

/// Takes the id if it is free, stopped, expired — or held by a process of this host name
/// whose database session is gone (a crashed predecessor restarted by systemd, or a
/// restarted container, need not wait for expiry). A holder whose session lives keeps the
/// id, in whatever PID namespace either process runs. The row records this binary's version
/// and newest known migration (`qlsched db status`).
pub async fn acquire(
    conn: &tokio_postgres::Client,
    id: &str,
    incarnation: Uuid,
    hostname: &str,
    pid: i32,
    ttl_ms: i64,
) -> Result<(), GuardError> {
    // What this process runs, for `qlsched db status` (V13).
    let newest = crate::schema::newest_known();
    let taken = conn
        .query_opt(
            &format!(
                "INSERT INTO qlsched.replicas AS r (replica_id, incarnation, hostname, pid, started_at_ms, heartbeat_at_ms, expires_at_ms,
                                                    session_pid, session_started_at, binary_version, newest_migration)
                 VALUES ($1, $2, $3, $4, {NOW}, {NOW}, {NOW} + $5, {SESSION}, $6, $7)
                 ON CONFLICT (replica_id) DO UPDATE
                   SET incarnation = EXCLUDED.incarnation, hostname = EXCLUDED.hostname, pid = EXCLUDED.pid,
                       started_at_ms = EXCLUDED.started_at_ms, heartbeat_at_ms = EXCLUDED.heartbeat_at_ms,
                       expires_at_ms = EXCLUDED.expires_at_ms, stopped_at_ms = NULL,
                       session_pid = EXCLUDED.session_pid, session_started_at = EXCLUDED.session_started_at,
                       binary_version = EXCLUDED.binary_version, newest_migration = EXCLUDED.newest_migration
                 WHERE r.stopped_at_ms IS NOT NULL OR r.expires_at_ms <= {NOW}
                 RETURNING 1"
            ),
            &[&id, &incarnation, &hostname, &pid, &ttl_ms, &BINARY_VERSION, &newest],
        )
        .await
        .map_err(StoreError::from)?;
    if taken.is_some() {
        return Ok(());
    }
    let row = conn
        .query_one(
            &format!(
                "SELECT hostname, pid, {NOW} - heartbeat_at_ms, expires_at_ms - {NOW}, incarnation
                   FROM qlsched.replicas WHERE replica_id = $1"
            ),
            &[&id],
        )
        .await
        .map_err(StoreError::from)?;
    let holder = Holder {
        hostname: row.get(0),
        pid: row.get(1),
        heartbeat_age_ms: row.get(2),
        expires_in_ms: row.get(3),
    };
    let previous: Uuid = row.get(4);
    if holder.hostname == hostname {
        // The holder's session is looked for in the statement that takes the row over
        // (guarded by its incarnation): a holder whose session lives keeps the id.
        let n = conn
            .execute(
                &format!(
                    "UPDATE qlsched.replicas r
                        SET incarnation = $2, hostname = $3, pid = $4, started_at_ms = {NOW},
                            heartbeat_at_ms = {NOW}, expires_at_ms = {NOW} + $5, stopped_at_ms = NULL,
                            (session_pid, session_started_at) = (SELECT {SESSION}),
                            binary_version = $7, newest_migration = $8
                      WHERE replica_id = $1 AND incarnation = $6 AND {SESSION_GONE}"
                ),
                &[&id, &incarnation, &hostname, &pid, &ttl_ms, &previous, &BINARY_VERSION, &newest],
            )
            .await
            .map_err(StoreError::from)?;
        if n == 1 {
            return Ok(());
        }
    }
    Err(GuardError::InUse {
        id: id.to_string(),
        holder,
    })
}

/// Takes the identity lock of replica id `id` on `conn`, a connection the holder keeps open
/// for as long as it lives and runs nothing else on (so no time-out ever drops it): true when
/// taken (or already held by this session), false when another session holds it. Taken after
/// [`acquire`] succeeded (the lock would otherwise count against this process's own
/// takeover of a dead predecessor); a second process judges the holder alive while it is held.
///
/// Locking: a session-level advisory lock (never waited for), released when the connection
/// ends.
pub async fn hold_identity(conn: &tokio_postgres::Client, id: &str) -> Result<bool, StoreError> {
    Ok(conn
        .query_one(
            "SELECT pg_try_advisory_lock($1, hashtext($2))",
            &[&IDENTITY_LOCK_CLASS, &id],
        )
        .await?
        .get(0))
}

/// Marks a clean stop so the id is free at once.
pub async fn retire(
    conn: &tokio_postgres::Client,
    id: &str,
    incarnation: Uuid,
) -> Result<(), StoreError> {
    conn.execute(
        &format!("UPDATE qlsched.replicas SET stopped_at_ms = {NOW}, expires_at_ms = {NOW} WHERE replica_id = $1 AND incarnation = $2"),
        &[&id, &incarnation],
    )
    .await?;
    Ok(())
}

/// The end of a graceful stop, conditioned on the guard: in one transaction, only while
/// `incarnation` still holds the id (the row locked against a takeover meanwhile), release
/// every lease under the id and retire the guard. `None` = the guard is no longer ours:
/// another process owns the id and every lease under it, so nothing is released.
///
/// Locking: `FOR SHARE` on the guard row makes a concurrent takeover (an UPDATE of the row)
/// wait for this transaction, whose releases it then finds done; a takeover that committed
/// first leaves the row with another incarnation, and nothing is touched.
pub async fn hand_over(
    conn: &tokio_postgres::Client,
    id: &str,
    incarnation: Uuid,
) -> Result<Option<u64>, StoreError> {
    conn.batch_execute("BEGIN").await?;
    let res = async {
        let held = conn
            .query_opt(
                "SELECT 1 FROM qlsched.replicas
                  WHERE replica_id = $1 AND incarnation = $2 AND stopped_at_ms IS NULL
                    FOR SHARE",
                &[&id, &incarnation],
            )
            .await?;
        if held.is_none() {
            return Ok(None);
        }
        let n = super::release::release_all_owned(conn, id).await?;
        retire(conn, id, incarnation).await?;
        Ok(Some(n))
    }
    .await;
    let end = if res.is_ok() { "COMMIT" } else { "ROLLBACK" };
    conn.batch_execute(end).await?;
    res
}

#[cfg(test)]
mod tests {
    use super::{IDENTITY_LOCK_CLASS, SESSION_GONE};

    #[test]
    fn the_liveness_check_looks_for_the_identity_lock_of_the_class_it_is_taken_with() {
        assert!(SESSION_GONE.contains(&format!("l.classid = {IDENTITY_LOCK_CLASS}::oid")));
    }
}
