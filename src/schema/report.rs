//! `qlsched db status`: what the database has applied, the range of binaries it serves, this
//! binary, and what each live replica runs.

use serde::Serialize;

use super::compat::{self, file_name, MigrationSet};
use super::{BINARY_VERSION, HISTORY_TABLE};
use crate::db::StoreError;

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct AppliedMigration {
    pub version: i32,
    pub file: String,
    pub checksum: String,
    pub applied_on: String,
    /// As the database records it (V13), else as this binary knows it; None: neither.
    pub kind: Option<String>,
    /// "same" | "changed" (checksum differs from this binary's) | "unknown" (newer than
    /// this binary).
    pub binary: &'static str,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct ReplicaVersion {
    pub replica_id: String,
    pub hostname: String,
    /// None: a replica of a binary from before V13.
    pub binary_version: Option<String>,
    pub newest_migration: Option<i32>,
    pub heartbeat_age_ms: i64,
}

#[derive(Clone, Debug, Serialize, PartialEq, Eq)]
pub struct SchemaStatus {
    pub applied: Vec<AppliedMigration>,
    /// Binaries that know this migration or a later one are served.
    pub floor: i32,
    /// The contract migration that set the floor (None: the baseline, V11).
    pub floor_migration: Option<String>,
    pub newest: i32,
    pub binary_version: String,
    pub binary_newest_migration: i32,
    /// Whether this binary's `db check` would accept the migration stream (grants aside).
    pub binary_served: bool,
    /// Live replicas (guard not stopped, not expired).
    pub replicas: Vec<ReplicaVersion>,
    /// What an applied expand deprecated and a later release's contract removes
    /// ([`DEPRECATIONS`]).
    pub deprecations: Vec<String>,
}

/// (migration, what it deprecated): shown by `db status` once that migration is applied,
/// until the contract that removes it ships.
pub const DEPRECATIONS: [(i32, &str); 1] = [(
    16,
    "deprecated (V16): the direct writes of the dispatcher role (INSERT on run_events; UPDATE \
     of runs(status) and attempts(state, started_at_ms, finished_at_ms, result, error)) and \
     the admin role's UPDATE on execution_revisions; a contract migration of a later release \
     revokes them: move every dispatcher onto the qlsched.dispatch_* functions \
     (docs/dispatcher.md)",
)];

/// Reads it in one snapshot (any role with SELECT on the history, `schema_compat` and
/// `replicas`).
pub async fn read(client: &tokio_postgres::Client) -> Result<SchemaStatus, StoreError> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let res = read_in_snapshot(client).await;
    let end = if res.is_ok() { "COMMIT" } else { "ROLLBACK" };
    client.batch_execute(end).await?;
    res
}

async fn read_in_snapshot(client: &tokio_postgres::Client) -> Result<SchemaStatus, StoreError> {
    let set = MigrationSet::embedded();
    let applied = applied_migrations(client, &set).await?;
    let range = compat::range(client).await?;
    let known = set.newest();
    let binary_served = range.serves(known)
        && set.migrations.iter().all(|m| {
            applied
                .iter()
                .any(|a| a.version == m.version() && a.binary == "same")
        })
        && applied
            .iter()
            .all(|a| a.binary == "same" || (a.binary == "unknown" && a.version > known));
    let replicas = live_replicas(client).await?;
    let deprecations = DEPRECATIONS
        .iter()
        .filter(|(v, _)| applied.iter().any(|a| a.version == *v))
        .map(|(_, what)| what.to_string())
        .collect();
    Ok(SchemaStatus {
        applied,
        floor: range.floor,
        floor_migration: range.floor_file,
        newest: range.newest,
        binary_version: BINARY_VERSION.to_string(),
        binary_newest_migration: known,
        binary_served,
        replicas,
        deprecations,
    })
}

/// The applied stream, each migration compared with `set`'s and with its recorded kind
/// (this binary's idea of the kind before `schema_compat` existed).
async fn applied_migrations(
    client: &tokio_postgres::Client,
    set: &MigrationSet,
) -> Result<Vec<AppliedMigration>, StoreError> {
    let has_compat: bool = client
        .query_one(
            "SELECT to_regclass('qlsched.schema_compat') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    let kinds_sql = if has_compat {
        "(SELECT c.kind FROM qlsched.schema_compat c WHERE c.version = h.version)"
    } else {
        "NULL::text"
    };
    let rows = client
        .query(
            &format!(
                "SELECT h.version, h.name, h.checksum, h.applied_on, {kinds_sql}
                   FROM {HISTORY_TABLE} h ORDER BY h.version"
            ),
            &[],
        )
        .await?;
    let mut applied = Vec::with_capacity(rows.len());
    for r in rows {
        let version: i32 = r.get(0);
        let name: String = r.get(1);
        let checksum: String = r.get(2);
        let recorded: Option<String> = r.get(4);
        let binary = match set.get(version) {
            Some(m) if m.name() == name && m.checksum().to_string() == checksum => "same",
            Some(_) => "changed",
            None => "unknown",
        };
        let kind = recorded.or_else(|| {
            set.get(version)
                .map(|_| set.kind(version).as_str().to_string())
        });
        applied.push(AppliedMigration {
            version,
            file: file_name(version, &name),
            checksum,
            applied_on: r.get(3),
            kind,
            binary,
        });
    }
    Ok(applied)
}

/// The live replicas and the versions they recorded (none before V13).
async fn live_replicas(client: &tokio_postgres::Client) -> Result<Vec<ReplicaVersion>, StoreError> {
    let has_versions: bool = client
        .query_one(
            "SELECT EXISTS (SELECT 1 FROM pg_attribute WHERE attrelid = 'qlsched.replicas'::regclass
                              AND attname = 'binary_version' AND NOT attisdropped)",
            &[],
        )
        .await?
        .get(0);
    let cols = if has_versions {
        "r.binary_version, r.newest_migration"
    } else {
        "NULL::text, NULL::int4"
    };
    Ok(client
        .query(
            &format!(
                "SELECT r.replica_id, r.hostname, {cols}, {now} - r.heartbeat_at_ms
                   FROM qlsched.replicas r
                  WHERE r.stopped_at_ms IS NULL AND r.expires_at_ms > {now}
                  ORDER BY r.replica_id",
                now = crate::db_now_ms!()
            ),
            &[],
        )
        .await?
        .iter()
        .map(|r| ReplicaVersion {
            replica_id: r.get(0),
            hostname: r.get(1),
            binary_version: r.get(2),
            newest_migration: r.get(3),
            heartbeat_age_ms: r.get(4),
        })
        .collect())
}
