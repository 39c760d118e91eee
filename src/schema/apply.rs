//! `db migrate` on a live database (docs/design.md, "Schema changes and rolling upgrades").
//!
//! Each pending migration runs in its own transaction with a session `lock_timeout`: a
//! migration that would queue behind a long reader (and so queue every admission and claim
//! behind itself) gives up its lock request after the timeout instead, and is retried with a
//! back-off until `max_wait` is spent. The transaction also writes refinery's history row
//! (same table, same columns, refinery's checksum), the migration's kind into
//! `qlsched.schema_compat`, and the grants of what exists once it is applied with their
//! manifest, so a database is never seen migrated with its range or grants lagging, even
//! when `db migrate` stops between two migrations.
//! Declared concurrent index builds run afterwards, outside any transaction.

use std::fmt;
use std::time::{Duration, Instant};

use tokio_postgres::error::SqlState;

use super::compat::{file_name, MigrationSet};
use super::{manifest, Drift, Roles, HISTORY_TABLE};
use crate::db::{StoreError, SCHEMA};

/// How `db migrate` waits for locks.
#[derive(Clone, Debug)]
pub struct MigrateOptions {
    /// The session `lock_timeout` of each migration's transaction.
    pub lock_timeout: Duration,
    /// How long the retries of lock time-outs may take in total before `db migrate` gives up.
    pub max_wait: Duration,
}

impl Default for MigrateOptions {
    fn default() -> Self {
        MigrateOptions {
            lock_timeout: Duration::from_secs(1),
            max_wait: Duration::from_secs(600),
        }
    }
}

/// What a migration's lock request waited on, as seen from another session while it waited.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Blocked {
    /// `AccessExclusiveLock on qlsched.runs`
    pub waiting_for: Option<String>,
    /// `qlsched.runs AccessShareLock by pid 4242 (postgres)`, one per blocking session.
    pub holders: Vec<String>,
}

impl fmt::Display for Blocked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.waiting_for {
            Some(w) => write!(f, "waited for {w}")?,
            None => write!(f, "waited for a lock")?,
        }
        if !self.holders.is_empty() {
            write!(f, ", held by: {}", self.holders.join("; "))?;
        }
        Ok(())
    }
}

/// One lock time-out that will be retried.
#[derive(Clone, Debug)]
pub struct Wait {
    pub file: String,
    pub attempt: u32,
    pub blocked: Blocked,
    pub retry_in: Duration,
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "migration {} could not take its locks within lock_timeout (attempt {}); {}; \
             retrying in {:.1} s",
            self.file,
            self.attempt,
            self.blocked,
            self.retry_in.as_secs_f64()
        )
    }
}

/// Why `db migrate` gave up waiting.
#[derive(Clone, Debug)]
pub struct GaveUp {
    pub file: String,
    pub attempts: u32,
    pub waited: Duration,
    /// What the last attempt waited on (migrations only).
    pub blocked: Option<Blocked>,
    /// A concurrent index build (left INVALID; the next `db migrate` rebuilds it).
    pub index: Option<String>,
}

impl std::error::Error for GaveUp {}

impl fmt::Display for GaveUp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.index {
            Some(index) => write!(
                f,
                "gave up building index {SCHEMA}.{index} (migration {}) after {:.1} s: it waited for \
                 locks (sessions with older transactions) for all of --max-wait; it is left INVALID \
                 and unused, and the next `qlsched db migrate` drops and rebuilds it",
                self.file,
                self.waited.as_secs_f64()
            )?,
            None => write!(
                f,
                "gave up on migration {} after {} attempt(s) over {:.1} s (--max-wait): its locks \
                 were never free within lock_timeout; nothing of it was applied (the migrations \
                 before it are); end or wait out the long transaction and run `qlsched db migrate` \
                 again",
                self.file,
                self.attempts,
                self.waited.as_secs_f64()
            )?,
        }
        if let Some(b) = &self.blocked {
            write!(f, " (the last attempt {b})")?;
        }
        Ok(())
    }
}

/// An index a migration declares to be built `CONCURRENTLY` after its transaction (a
/// migration file runs in a transaction, where `CREATE INDEX CONCURRENTLY` cannot).
#[derive(Clone, Copy, Debug)]
pub struct ConcurrentIndex {
    /// The migration it belongs to: built once that migration is applied.
    pub version: i32,
    /// The index name, in the scheduler schema.
    pub name: &'static str,
    pub unique: bool,
    /// What follows `ON`: `qlsched.runs (status) WHERE …`.
    pub on: &'static str,
}

/// The concurrent index builds of the embedded migrations.
pub const CONCURRENT_INDEXES: &[ConcurrentIndex] = &[
    // V16: `qlsched.dispatch_take` walks queued runs in admission order across replicas.
    ConcurrentIndex {
        version: 16,
        name: "runs_queued_order_idx",
        unique: false,
        on: "qlsched.runs (queued_at_ms) WHERE status = 'queued'",
    },
    // V16: `qlsched.dispatch_expire` finds ended leases; an admission never writes it (its
    // attempt is `claimed`, outside the predicate).
    ConcurrentIndex {
        version: 16,
        name: "attempts_lease_expiry_idx",
        unique: false,
        on: "qlsched.attempts (lease_expires_at_ms) WHERE state IN ('dispatching', 'running') AND lease_id IS NOT NULL",
    },
    // V18: `qlsched.dispatch_take_batch` walks each pool's queued runs that name an executor
    // in admission order; a run leaves the predicate when it is taken.
    ConcurrentIndex {
        version: 18,
        name: "runs_take_idx",
        unique: false,
        on: "qlsched.runs (pool, queued_at_ms) WHERE status = 'queued' AND NOT cancelled AND executor IS NOT NULL",
    },
    // V18: its fallback, the queued runs admitted without the copied pool and executor (by a
    // binary older than V18, or before it); no run a V18 binary admits enters it.
    ConcurrentIndex {
        version: 18,
        name: "runs_queued_legacy_idx",
        unique: false,
        on: "qlsched.runs (queued_at_ms) WHERE status = 'queued' AND pool IS NULL",
    },
    // V19: the overdue gauge and `trigger list --state overdue` read only the triggers with a
    // success deadline, in deadline order (an index-only scan up to now).
    ConcurrentIndex {
        version: 19,
        name: "trigger_outcomes_due_idx",
        unique: false,
        on: "qlsched.trigger_outcomes (success_due_at_ms, project_id) WHERE success_due_at_ms IS NOT NULL",
    },
    // V19: the system-paused gauge reads only the paused triggers.
    ConcurrentIndex {
        version: 19,
        name: "trigger_outcomes_paused_idx",
        unique: false,
        on: "qlsched.trigger_outcomes (project_id) WHERE system_paused_at_ms IS NOT NULL",
    },
];

/// The refinery history table, as refinery creates it.
const HISTORY_DDL: &str = "CREATE TABLE IF NOT EXISTS qlsched.schema_migrations(
             version int4 PRIMARY KEY,
             name VARCHAR(255),
             applied_on VARCHAR(255),
             checksum VARCHAR(255))";

/// The advisory lock key `db migrate` holds for its session ("qlsmigr" in ASCII).
const MIGRATE_LOCK: i64 = 0x0071_6c73_6d69_6772;

/// Longest pause between two attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Applies the pending migrations of `set` in order, installs its grants and manifest,
/// then builds its concurrent indexes. Returns the applied migrations (`V13__name`).
/// `on_wait` hears of every lock time-out that will be retried.
pub async fn migrate_set(
    owner: impl Into<crate::db::Target>,
    roles: &Roles,
    set: &MigrationSet,
    opts: &MigrateOptions,
    on_wait: &mut (dyn FnMut(&Wait) + Send),
) -> Result<Vec<String>, StoreError> {
    run(owner.into(), roles, set, opts, on_wait, None).await
}

/// A `db migrate` of `set` killed right after migration `last` committed (fault injection,
/// for the tests of an interrupted migrate): it applies the pending migrations exactly as
/// [`migrate_set`] does, up to `last`, and stops there, before any later migration and
/// before the concurrent index builds.
#[cfg(feature = "fault-injection")]
pub async fn migrate_set_killed_after(
    owner: impl Into<crate::db::Target>,
    roles: &Roles,
    set: &MigrationSet,
    opts: &MigrateOptions,
    last: i32,
) -> Result<Vec<String>, StoreError> {
    run(owner.into(), roles, set, opts, &mut |_| {}, Some(last)).await
}

async fn run(
    owner: crate::db::Target,
    roles: &Roles,
    set: &MigrationSet,
    opts: &MigrateOptions,
    on_wait: &mut (dyn FnMut(&Wait) + Send),
    killed_after: Option<i32>,
) -> Result<Vec<String>, StoreError> {
    let mut client = crate::db::connect(&owner).await?;
    let pending = pending(&client, roles, set).await?;
    client
        .batch_execute(&format!(
            "SET lock_timeout = {}; SET statement_timeout = 0",
            opts.lock_timeout.as_millis().max(1)
        ))
        .await?;
    let started = Instant::now();
    let mut applied = Vec::new();
    if pending.is_empty() {
        let record = has_table(&client, "grant_manifest").await?;
        let tx = client.transaction().await?;
        tx.batch_execute(&manifest::install_sql(&set.grants, roles, record))
            .await?;
        tx.commit().await?;
    } else {
        // A second session watches what a waiting migration waits on (the waiting one
        // cannot).
        let monitor = crate::db::connect(&owner).await?;
        for m in &pending {
            let step = Step {
                set,
                migration: m,
                roles,
            };
            step.apply_retrying(&mut client, &monitor, opts, started, on_wait)
                .await?;
            applied.push(m.to_string());
            if killed_after == Some(m.version()) {
                return Ok(applied);
            }
        }
    }
    let left = opts.max_wait.saturating_sub(started.elapsed());
    build_indexes(&client, set, left).await?;
    Ok(applied)
}

/// The migrations of `set` not applied yet, in order, after the refusals: a missing role, a
/// `db migrate` already running (a session advisory lock, held until this connection
/// ends), drift or a newer migration unknown to `set`, or a hole below what is applied.
async fn pending<'s>(
    client: &tokio_postgres::Client,
    roles: &Roles,
    set: &'s MigrationSet,
) -> Result<Vec<&'s refinery::Migration>, StoreError> {
    client
        .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {SCHEMA}"))
        .await?;
    // Every role must exist before anything is applied: a missing role would leave the
    // schema migrated without its grants.
    for role in roles.all() {
        if !super::roles::role_exists(client, role).await? {
            return Err(StoreError::MissingRole(role.to_string()));
        }
    }
    let got: bool = client
        .query_one("SELECT pg_try_advisory_lock($1)", &[&MIGRATE_LOCK])
        .await?
        .get(0);
    if !got {
        // Any role may hold it (advisory locks take no privilege): name who does.
        let holders = crate::db::locks::holders(client, MIGRATE_LOCK).await?;
        return Err(StoreError::MigrateRunning(Box::new(holders)));
    }
    let drift = super::drift_of(client, set).await?;
    if let Some(changed) = drift
        .iter()
        .find(|d| !matches!(d, Drift::NotApplied { .. }))
    {
        return Err(StoreError::MigrationDrift(Box::new(changed.clone())));
    }
    client.batch_execute(HISTORY_DDL).await?;
    let applied_max: Option<i32> = client
        .query_one(&format!("SELECT max(version) FROM {HISTORY_TABLE}"), &[])
        .await?
        .get(0);
    let pending: Vec<&refinery::Migration> = set
        .migrations
        .iter()
        .filter(|m| {
            let file = file_name(m.version(), m.name());
            drift
                .iter()
                .any(|d| matches!(d, Drift::NotApplied { file: f } if *f == file))
        })
        .collect();
    if let (Some(first), Some(max)) = (pending.first(), applied_max) {
        if first.version() < max {
            // A hole below what is applied: refinery refuses this too.
            return Err(StoreError::MigrationDrift(Box::new(Drift::NotApplied {
                file: file_name(first.version(), first.name()),
            })));
        }
    }
    Ok(pending)
}

/// One pending migration of a `db migrate` run.
struct Step<'a> {
    set: &'a MigrationSet,
    migration: &'a refinery::Migration,
    roles: &'a Roles,
}

impl Step<'_> {
    /// Applies it, retrying a lock time-out (or a deadlock) with a doubling back-off until
    /// `opts.max_wait` (counted from `started`, the start of the run) is spent.
    async fn apply_retrying(
        &self,
        client: &mut tokio_postgres::Client,
        monitor: &tokio_postgres::Client,
        opts: &MigrateOptions,
        started: Instant,
        on_wait: &mut (dyn FnMut(&Wait) + Send),
    ) -> Result<(), StoreError> {
        let m = self.migration;
        let file = file_name(m.version(), m.name());
        let pid: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await?
            .get(0);
        let mut backoff = opts.lock_timeout.max(Duration::from_millis(100));
        for attempt in 1.. {
            let mut blocked = Blocked::default();
            let res = {
                let apply = apply_one(client, self.set, m, self.roles);
                tokio::pin!(apply);
                // Looked at from three quarters into the lock timeout on, until the lock
                // wait shows: a migration that takes its locks at once is never looked at.
                let watch = async {
                    tokio::time::sleep(opts.lock_timeout * 3 / 4).await;
                    loop {
                        let seen = blocked_on(monitor, pid).await?;
                        if seen.waiting_for.is_some() {
                            return Ok::<_, StoreError>(seen);
                        }
                        tokio::time::sleep(opts.lock_timeout / 8).await;
                    }
                };
                tokio::select! {
                    r = &mut apply => r,
                    seen = watch => {
                        blocked = seen?;
                        apply.await
                    }
                }
            };
            match res {
                Ok(()) => return Ok(()),
                Err(e) if is_lock_wait(&e) => {
                    let left = opts.max_wait.saturating_sub(started.elapsed());
                    if left < backoff {
                        return Err(StoreError::MigrationGaveUp(Box::new(GaveUp {
                            file,
                            attempts: attempt,
                            waited: started.elapsed(),
                            blocked: Some(blocked),
                            index: None,
                        })));
                    }
                    on_wait(&Wait {
                        file: file.clone(),
                        attempt,
                        blocked,
                        retry_in: backoff,
                    });
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => return Err(e.into()),
            }
        }
        unreachable!("the attempts are unbounded; max_wait ends them")
    }
}

/// One migration in one transaction: its SQL, refinery's history row, its kind, and the
/// grants with their manifest. So a `db migrate` that stops after any migration (killed, or
/// giving up on the next one) leaves a database both the binary of that migration and the
/// binary before it accept (when it is an expand). The grants are those of `set` on what
/// exists once it is applied — the grants of the binary that carries it — plus those of the
/// recorded manifest whose object still exists (what the binary before it needs); `set`'s
/// newest migration installs exactly `set`'s grants, and a grant on a missing object fails it.
async fn apply_one(
    client: &mut tokio_postgres::Client,
    set: &MigrationSet,
    m: &refinery::Migration,
    roles: &Roles,
) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await?;
    tx.batch_execute(m.sql().unwrap_or("")).await?;
    tx.execute(
        &format!(
            "INSERT INTO {HISTORY_TABLE} (version, name, applied_on, checksum)
             VALUES ($1, $2,
                     to_char(clock_timestamp() AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'),
                     $3)"
        ),
        &[&m.version(), &m.name(), &m.checksum().to_string()],
    )
    .await?;
    let compat: bool = tx
        .query_one(
            "SELECT to_regclass('qlsched.schema_compat') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if compat {
        // Every migration of the set up to this one (V13 back-fills the earlier ones).
        let (versions, kinds): (Vec<i32>, Vec<&str>) = set
            .migrations
            .iter()
            .filter(|k| k.version() <= m.version())
            .map(|k| (k.version(), set.kind(k.version()).as_str()))
            .unzip();
        tx.execute(
            "INSERT INTO qlsched.schema_compat (version, kind, recorded_by)
             SELECT v, k, $3 FROM unnest($1::int4[], $2::text[]) AS u(v, k)
             ON CONFLICT (version) DO NOTHING",
            &[&versions, &kinds, &super::BINARY_VERSION],
        )
        .await?;
    }
    let recorded = manifest::read(&tx).await?;
    let grants = if m.version() == set.newest() {
        set.grants.clone()
    } else {
        // Before the last migration, what the manifest held stays granted too (where its
        // object still exists): a grant the newer binary no longer makes goes with the last.
        let mut wanted = set.grants.clone();
        for g in recorded.iter().flatten() {
            if !wanted.contains(g) {
                wanted.push(g.clone());
            }
        }
        manifest::existing(&tx, &wanted).await?
    };
    tx.batch_execute(&manifest::install_sql(&grants, roles, recorded.is_some()))
        .await?;
    tx.commit().await
}

fn is_lock_wait(e: &tokio_postgres::Error) -> bool {
    matches!(
        e.code(),
        Some(c) if *c == SqlState::LOCK_NOT_AVAILABLE || *c == SqlState::T_R_DEADLOCK_DETECTED
    )
}

async fn has_table(client: &tokio_postgres::Client, table: &str) -> Result<bool, StoreError> {
    Ok(client
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("{SCHEMA}.{table}")],
        )
        .await?
        .get(0))
}

/// What session `pid` is waiting for (a relation lock) and who holds what blocks it, from
/// the lock table (readable by every role; the holders' queries are not shown).
async fn blocked_on(monitor: &tokio_postgres::Client, pid: i32) -> Result<Blocked, StoreError> {
    let waiting_for: Option<String> = monitor
        .query_opt(
            "SELECT format('%s on %s', w.mode, w.relation::regclass)
               FROM pg_locks w
              WHERE w.pid = $1 AND NOT w.granted AND w.locktype = 'relation'
              LIMIT 1",
            &[&pid],
        )
        .await?
        .map(|r| r.get(0));
    let holders = monitor
        .query(
            "SELECT DISTINCT format('%s %s by pid %s (%s)', b.relation::regclass, b.mode, b.pid,
                                    coalesce(a.usename::text, '?'))
               FROM pg_locks w
               JOIN pg_locks b ON b.locktype = 'relation' AND b.granted
                              AND b.database = w.database AND b.relation = w.relation
               LEFT JOIN pg_stat_activity a ON a.pid = b.pid
              WHERE w.pid = $1 AND NOT w.granted AND w.locktype = 'relation'
                AND b.pid = ANY (pg_blocking_pids($1))
              ORDER BY 1",
            &[&pid],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    Ok(Blocked {
        waiting_for,
        holders,
    })
}

/// Builds the declared concurrent indexes of the applied migrations: a valid one is kept,
/// an INVALID one (an interrupted build) is dropped `CONCURRENTLY` and built again. Each
/// build waits for older transactions (it blocks no admission or claim while it waits: its
/// SHARE UPDATE EXCLUSIVE lock conflicts only with DDL and VACUUM), at most `budget`.
pub async fn build_indexes(
    client: &tokio_postgres::Client,
    set: &MigrationSet,
    budget: Duration,
) -> Result<Vec<String>, StoreError> {
    let mut built = Vec::new();
    if set.indexes.is_empty() {
        return Ok(built);
    }
    let started = Instant::now();
    let applied: Vec<i32> = client
        .query(&format!("SELECT version FROM {HISTORY_TABLE}"), &[])
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for idx in set.indexes.iter().filter(|i| applied.contains(&i.version)) {
        let valid = index_valid(client, idx.name).await?;
        if valid == Some(true) {
            continue;
        }
        let file = set
            .get(idx.version)
            .map(|m| file_name(m.version(), m.name()))
            .unwrap_or_else(|| format!("V{}", idx.version));
        let left = budget
            .saturating_sub(started.elapsed())
            .max(Duration::from_secs(1));
        client
            .batch_execute(&format!("SET lock_timeout = {}", left.as_millis()))
            .await?;
        let res = build_one(client, idx, valid == Some(false)).await;
        client.batch_execute("RESET lock_timeout").await?;
        match res {
            Ok(()) => built.push(idx.name.to_string()),
            Err(e) if is_lock_wait(&e) => {
                return Err(StoreError::MigrationGaveUp(Box::new(GaveUp {
                    file,
                    attempts: 1,
                    waited: started.elapsed(),
                    blocked: None,
                    index: Some(idx.name.to_string()),
                })))
            }
            Err(e) => {
                return Err(StoreError::IndexBuild {
                    index: format!("{SCHEMA}.{}", idx.name),
                    file,
                    source: e,
                })
            }
        }
    }
    Ok(built)
}

/// Whether the index exists and is valid (`None`: it does not exist).
async fn index_valid(
    client: &tokio_postgres::Client,
    name: &str,
) -> Result<Option<bool>, StoreError> {
    Ok(client
        .query_opt(
            "SELECT i.indisvalid FROM pg_index i
               JOIN pg_class c ON c.oid = i.indexrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $1
              WHERE c.relname = $2",
            &[&SCHEMA, &name],
        )
        .await?
        .map(|r| r.get(0)))
}

/// One concurrent build, after dropping the INVALID index an interrupted build left.
async fn build_one(
    client: &tokio_postgres::Client,
    idx: &ConcurrentIndex,
    drop_invalid: bool,
) -> Result<(), tokio_postgres::Error> {
    if drop_invalid {
        client
            .batch_execute(&format!(
                "DROP INDEX CONCURRENTLY IF EXISTS {SCHEMA}.{};",
                idx.name
            ))
            .await?;
    }
    client
        .batch_execute(&format!(
            "CREATE {}INDEX CONCURRENTLY {} ON {}",
            if idx.unique { "UNIQUE " } else { "" },
            idx.name,
            idx.on
        ))
        .await
}

/// Applies this binary's pending migrations (as the owner role) and installs the exact
/// grants, with the default lock time-out and bound ([`MigrateOptions`]); waits are not
/// reported. Refuses a database whose applied stream diverges from the binary's.
pub async fn migrate(
    owner: impl Into<crate::db::Target>,
    roles: &Roles,
) -> Result<Vec<String>, StoreError> {
    migrate_set(
        owner,
        roles,
        &MigrationSet::embedded(),
        &MigrateOptions::default(),
        &mut |_| {},
    )
    .await
}
