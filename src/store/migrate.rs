//! Roles, database, migrations and the readiness gate (`db bootstrap`, `db migrate`,
//! `db check`). Migrations are embedded with refinery (checksummed); grants are installed
//! by code because role names carry an install-specific prefix.

use std::fmt;

use super::{StoreError, SCHEMA};

mod embedded {
    refinery::embed_migrations!("migrations");
}
mod apply;
pub mod compat;
pub mod lint;
mod manifest;
pub mod report;

#[cfg(feature = "fault-injection")]
pub use apply::migrate_set_killed_after;
pub use apply::{
    build_indexes, migrate_set, Blocked, ConcurrentIndex, GaveUp, MigrateOptions, Wait,
    CONCURRENT_INDEXES,
};
pub use compat::{file_name, Kind, MigrationSet, Range, BASELINE};
pub use manifest::{Grant, Object};

/// This binary's version as `db status` and the replica guard row show it: the package
/// version and the commit it was built from.
pub const BINARY_VERSION: &str =
    concat!(env!("CARGO_PKG_VERSION"), "+", env!("QLSCHED_GIT_COMMIT"));

/// The newest migration this binary carries.
pub fn newest_known() -> i32 {
    embedded::migrations::runner()
        .get_migrations()
        .iter()
        .map(|m| m.version())
        .max()
        .unwrap_or(0)
}

/// The capability this binary was built for.
pub const CAPABILITY: (&str, i32) = ("cluster_scheduler_admission", 1);
/// Where refinery records the applied stream.
pub const HISTORY_TABLE: &str = "qlsched.schema_migrations";

/// The five LOGIN roles of one install, named `<prefix>_owner` etc.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Roles {
    pub owner: String,
    pub admin: String,
    pub runtime: String,
    pub worker_ingress: String,
    /// What a dispatcher logs in as (docs/dispatcher.md).
    pub dispatcher: String,
}

impl Roles {
    pub fn with_prefix(prefix: &str) -> Result<Roles, StoreError> {
        let ok = !prefix.is_empty()
            && prefix.len() <= 40
            && prefix.starts_with(|c: char| c.is_ascii_lowercase())
            && prefix
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !ok {
            return Err(StoreError::BadRolePrefix(prefix.to_string()));
        }
        Ok(Roles {
            owner: format!("{prefix}_owner"),
            admin: format!("{prefix}_admin"),
            runtime: format!("{prefix}_runtime"),
            worker_ingress: format!("{prefix}_worker_ingress"),
            dispatcher: format!("{prefix}_dispatcher"),
        })
    }
    /// The role of a kind ("admin" | "runtime" | "worker_ingress" | "dispatcher").
    pub fn of_kind(&self, kind: &str) -> Option<&str> {
        match kind {
            "admin" => Some(&self.admin),
            "runtime" => Some(&self.runtime),
            "worker_ingress" => Some(&self.worker_ingress),
            "dispatcher" => Some(&self.dispatcher),
            _ => None,
        }
    }
    pub(crate) fn all(&self) -> [&str; 5] {
        [
            &self.owner,
            &self.admin,
            &self.runtime,
            &self.worker_ingress,
            &self.dispatcher,
        ]
    }

    /// Every role but the owner, with the kind [`check`] verifies it as.
    pub fn checked(&self) -> [(&str, &str); 4] {
        [
            (&self.admin, "admin"),
            (&self.runtime, "runtime"),
            (&self.worker_ingress, "worker_ingress"),
            (&self.dispatcher, "dispatcher"),
        ]
    }
}

/// Table privileges that exist in PostgreSQL 15 (MAINTAIN is 17+ and is not used).
pub const PRIVILEGES: [&str; 7] = [
    "SELECT",
    "INSERT",
    "UPDATE",
    "DELETE",
    "TRUNCATE",
    "REFERENCES",
    "TRIGGER",
];

/// The exact grants (docs/design.md, "Roles and grants"): (table, admin, runtime). worker_ingress has none at all.
/// Definition rows are permanent (migration V7): no role may delete them.
pub const GRANTS: [(&str, &[&str], &[&str]); 15] = [
    ("projects", &["SELECT", "INSERT", "UPDATE"], &["SELECT"]),
    (
        "execution_revisions",
        &["SELECT", "INSERT", "UPDATE"],
        &["SELECT"],
    ),
    ("tasks", &["SELECT", "INSERT", "UPDATE"], &["SELECT"]),
    ("triggers", &["SELECT", "INSERT", "UPDATE"], &["SELECT"]),
    (
        "trigger_schedules",
        &["SELECT", "INSERT", "UPDATE", "DELETE"],
        &["SELECT", "UPDATE"],
    ),
    // The admin role inserts the runs an operator admits (`trigger fire`, `trigger
    // backfill`): a run, its claimed attempt and its two events, never an update or delete.
    ("runs", &["SELECT", "INSERT"], &["SELECT", "INSERT"]),
    ("attempts", &["SELECT", "INSERT"], &["SELECT", "INSERT"]),
    ("run_events", &["SELECT", "INSERT"], &["SELECT", "INSERT"]),
    ("capability", &["SELECT"], &["SELECT"]),
    ("replicas", &["SELECT"], &["SELECT", "INSERT", "UPDATE"]),
    ("schema_migrations", &["SELECT"], &["SELECT"]),
    // Retention (V11): replicas claim the 'prune' lease; `trigger backfill` reads the horizon.
    // The recorded horizon and the floor (V15) are guarded by a row trigger until a later
    // contract narrows the runtime's UPDATE to the lease columns (docs/design.md, "Retention").
    ("maintenance", &["SELECT"], &["SELECT", "UPDATE"]),
    // Tombstones of pruned occurrences (V15): the cron admission reads them.
    ("pruned_occurrences", &["SELECT"], &["SELECT"]),
    // Compatible ranges and the grant manifest (V13): `db check` and the readiness gate read them.
    ("schema_compat", &["SELECT"], &["SELECT"]),
    ("grant_manifest", &["SELECT"], &["SELECT"]),
];

/// The dispatcher's table grants (docs/dispatcher.md): it reads admitted work and the
/// execution revision a run pins, and appends events; its updates are the column-level
/// ones in [`COLUMN_GRANTS`]. It never inserts a run or an attempt, never deletes, and
/// never reads or writes definitions' schedules.
pub const DISPATCHER_GRANTS: [(&str, &[&str]); 4] = [
    ("runs", &["SELECT"]),
    ("attempts", &["SELECT"]),
    ("run_events", &["SELECT", "INSERT"]),
    ("execution_revisions", &["SELECT"]),
];

/// Column-level grants: (role kind, table, privilege, columns). The only UPDATEs of
/// admitted work: a dispatcher moves a run and its attempt forward (docs/dispatcher.md), an
/// admin cancels an untouched queued run (`runs cancel`). Migration V10's triggers allow
/// only forward moves of `status` and `state`. The floor of retention on the maintenance row
/// (V15) is the admin's; the recorded horizon only the prune functions move (V15's row
/// trigger holds the runtime, whose table UPDATE claims the 'prune' lease, to that).
pub const COLUMN_GRANTS: [(&str, &str, &str, &[&str]); 5] = [
    ("dispatcher", "runs", "UPDATE", &["status"]),
    (
        "dispatcher",
        "attempts",
        "UPDATE",
        &[
            "state",
            "started_at_ms",
            "finished_at_ms",
            "result",
            "error",
        ],
    ),
    ("admin", "runs", "UPDATE", &["status", "cancelled"]),
    ("admin", "attempts", "UPDATE", &["state", "finished_at_ms"]),
    (
        "admin",
        "maintenance",
        "UPDATE",
        &["finished_after_floor_ms"],
    ),
];

/// The column-level grants a role kind must hold, as (table, column, privilege), sorted.
pub fn expected_column_privileges(kind: &str) -> Vec<(String, String, String)> {
    let mut out: Vec<(String, String, String)> = COLUMN_GRANTS
        .iter()
        .filter(|(k, ..)| *k == kind)
        .flat_map(|(_, table, privilege, cols)| {
            cols.iter()
                .map(move |c| (table.to_string(), c.to_string(), privilege.to_string()))
        })
        .collect();
    out.sort();
    out
}

/// The only functions EXECUTE any role holds (docs/design.md, "Retention"): (signature, role
/// kind). `db migrate` grants them, `db check` expects exactly them. `prune_queued` (V12) is
/// `qlsched runs prune`'s, an operator command run as the admin role like `runs cancel`.
///
/// The `dispatch_*` functions (V16) are the dispatcher protocol (docs/dispatcher.md): the
/// dispatcher role's only; no replica calls them. `request_cancel` (V16) asks the holders of
/// taken runs to stop them, an operator's (admin role). `dispatch_take_executable` (V17) is
/// the take of `qlsched worker` (docs/worker.md).
pub const EXECUTE_GRANTS: [(&str, &str); 10] = [
    (
        "qlsched.prune_finished(bigint,integer,text,uuid)",
        "runtime",
    ),
    ("qlsched.prune_queued(bigint,uuid[])", "admin"),
    (
        "qlsched.dispatch_take(text,text[],integer,bigint)",
        "dispatcher",
    ),
    ("qlsched.dispatch_start(uuid,uuid,bigint)", "dispatcher"),
    ("qlsched.dispatch_heartbeat(uuid,uuid,bigint)", "dispatcher"),
    (
        "qlsched.dispatch_finish(uuid,uuid,text,integer,text,text,jsonb)",
        "dispatcher",
    ),
    ("qlsched.dispatch_release(uuid,uuid)", "dispatcher"),
    ("qlsched.dispatch_expire(integer)", "dispatcher"),
    (
        "qlsched.dispatch_take_executable(text,text[],text[],integer,bigint)",
        "dispatcher",
    ),
    ("qlsched.request_cancel(uuid[])", "admin"),
];

/// Every grant of [`GRANTS`], [`DISPATCHER_GRANTS`], [`COLUMN_GRANTS`] and
/// [`EXECUTE_GRANTS`]: this binary's manifest, sorted.
pub fn manifest() -> Vec<Grant> {
    let mut out = Vec::new();
    for (table, admin, runtime) in GRANTS {
        out.extend(admin.iter().map(|p| Grant::table("admin", table, p)));
        out.extend(runtime.iter().map(|p| Grant::table("runtime", table, p)));
    }
    for (table, privs) in DISPATCHER_GRANTS {
        out.extend(privs.iter().map(|p| Grant::table("dispatcher", table, p)));
    }
    for (kind, table, privilege, cols) in COLUMN_GRANTS {
        out.extend(
            cols.iter()
                .map(|c| Grant::column(kind, table, c, privilege)),
        );
    }
    for (function, kind) in EXECUTE_GRANTS {
        out.push(Grant::function(kind, function));
    }
    out.sort();
    out
}

fn ident(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

/// Creates the LOGIN roles (if missing), the database owned by the owner role (if missing),
/// and the schema; runs as a superuser. Idempotent.
pub async fn bootstrap(
    superuser: impl Into<super::Target>,
    roles: &Roles,
    database: &str,
) -> Result<(), StoreError> {
    let superuser: super::Target = superuser.into();
    let client = super::connect(&superuser).await?;
    for role in roles.all() {
        let exists = client
            .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
            .await?
            .is_some();
        if !exists {
            client
                .batch_execute(&format!("CREATE ROLE {} LOGIN", ident(role)))
                .await?;
        }
    }
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&database])
        .await?
        .is_some();
    if !exists {
        client
            .batch_execute(&format!(
                "CREATE DATABASE {} OWNER {} ENCODING 'UTF8'",
                ident(database),
                ident(&roles.owner)
            ))
            .await?;
    }
    drop(client);
    let mut in_db = superuser.clone();
    in_db.dbname(database);
    let client = super::connect(&in_db).await?;
    let connect_roles = roles.all().map(ident).join(", ");
    // PUBLIC keeps nothing on the database: PostgreSQL gives it CONNECT and TEMPORARY on
    // every new one, and no qlsched role may create temporary tables (`db check` refuses
    // TEMPORARY). Run again on an existing install, this revokes them there too.
    client
        .batch_execute(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema} AUTHORIZATION {owner};
             REVOKE ALL ON DATABASE {db} FROM PUBLIC;
             GRANT CONNECT ON DATABASE {db} TO {connect_roles};
             REVOKE ALL ON SCHEMA public FROM PUBLIC;",
            schema = SCHEMA,
            owner = ident(&roles.owner),
            db = ident(database),
        ))
        .await?;
    Ok(())
}

/// Applies this binary's pending migrations (as the owner role) and installs the exact
/// grants, with the default lock time-out and bound ([`MigrateOptions`]); waits are not
/// reported. Refuses a database whose applied stream diverges from the binary's.
pub async fn migrate(
    owner: impl Into<super::Target>,
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

/// One difference between the database's applied stream and the binary's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Drift {
    /// In the binary, not yet applied.
    NotApplied { file: String },
    /// Applied with a different checksum (the file was edited after release).
    Changed { file: String },
    /// Applied in the database, unknown to this binary (a newer or foreign migration).
    Extra { file: String, version: i32 },
}

impl fmt::Display for Drift {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Drift::NotApplied { file } => write!(
                f,
                "migration {file} is not applied (run `qlsched db migrate`)"
            ),
            Drift::Changed { file } => write!(
                f,
                "migration {file} was changed after it was applied (checksum differs)"
            ),
            Drift::Extra { file, .. } => write!(
                f,
                "migration {file} is applied in the database but unknown to this binary"
            ),
        }
    }
}

/// Compares the applied stream with the embedded one. Reads only (works as the runtime role).
pub async fn stream_drift(client: &tokio_postgres::Client) -> Result<Vec<Drift>, StoreError> {
    drift_of(client, &MigrationSet::embedded()).await
}

/// Compares the applied stream with `set`'s.
pub async fn drift_of(
    client: &tokio_postgres::Client,
    set: &MigrationSet,
) -> Result<Vec<Drift>, StoreError> {
    let exists: bool = client
        .query_one("SELECT to_regclass($1) IS NOT NULL", &[&HISTORY_TABLE])
        .await?
        .get(0);
    let applied: Vec<(i32, String, String)> = if exists {
        client
            .query(
                &format!("SELECT version, name, checksum FROM {HISTORY_TABLE} ORDER BY version"),
                &[],
            )
            .await?
            .iter()
            .map(|r| {
                (
                    r.get::<_, i32>(0),
                    r.get::<_, String>(1),
                    r.get::<_, String>(2),
                )
            })
            .collect()
    } else {
        Vec::new()
    };
    let local = &set.migrations;
    let mut drift = Vec::new();
    for m in local {
        match applied.iter().find(|(v, _, _)| *v == m.version()) {
            None => drift.push(Drift::NotApplied {
                file: file_name(m.version(), m.name()),
            }),
            Some((_, name, sum)) if name != m.name() || *sum != m.checksum().to_string() => drift
                .push(Drift::Changed {
                    file: file_name(m.version(), m.name()),
                }),
            Some(_) => {}
        }
    }
    for (v, name, _) in &applied {
        if !local.iter().any(|m| m.version() == *v) {
            drift.push(Drift::Extra {
                version: *v,
                file: file_name(*v, name),
            });
        }
    }
    Ok(drift)
}

/// Privileges a role holds on each scheduler table, as the catalog says.
pub async fn table_privileges(
    client: &tokio_postgres::Client,
    role: &str,
) -> Result<Vec<(String, String)>, StoreError> {
    let rows = client
        .query(
            "SELECT c.relname::text, p.privilege
               FROM pg_class c
               JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $1
               CROSS JOIN unnest($3::text[]) AS p(privilege)
              WHERE c.relkind = 'r' AND has_table_privilege($2, c.oid, p.privilege)
              ORDER BY 1, 2",
            &[&SCHEMA, &role, &PRIVILEGES.to_vec()],
        )
        .await?;
    Ok(rows.iter().map(|r| (r.get(0), r.get(1))).collect())
}

/// The table privileges docs/design.md ("Roles and grants") gives a role kind ("admin" |
/// "runtime" | "worker_ingress" | "dispatcher"); column-level ones are in
/// [`expected_column_privileges`].
pub fn expected_privileges(kind: &str) -> Vec<(String, String)> {
    table_grants_of(&manifest(), kind)
}

/// A manifest's table privileges of a role kind, as (table, privilege), sorted.
fn table_grants_of(grants: &[Grant], kind: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = grants
        .iter()
        .filter(|g| g.kind == kind)
        .filter_map(|g| match &g.object {
            Object::Table(t) => Some((t.clone(), g.privilege.clone())),
            _ => None,
        })
        .collect();
    out.sort();
    out
}

/// How many migrations this binary carries.
pub fn embedded_count() -> usize {
    embedded::migrations::runner().get_migrations().len()
}

/// The role this connection is logged in as.
pub async fn current_role(client: &tokio_postgres::Client) -> Result<String, StoreError> {
    Ok(client
        .query_one("SELECT current_user::text", &[])
        .await?
        .get(0))
}

/// The readiness gate of this binary: see [`check_with`].
pub async fn check(
    client: &tokio_postgres::Client,
    roles_to_check: &[(&str, &str)],
) -> Result<Vec<String>, StoreError> {
    check_with(client, roles_to_check, &MigrationSet::embedded()).await
}

/// The readiness gate (docs/design.md, "Schema changes and rolling upgrades"): every
/// migration of `set` applied unchanged, any newer ones applied by a newer binary within the
/// range the database serves (no contract this set does not know), the capability, and the
/// given roles holding exactly the grants of the database's manifest, which must include
/// every grant `set` needs. Returns every problem found (empty = ready). Read in one
/// snapshot: a migration writes its history row, its kind and the manifest together.
pub async fn check_with(
    client: &tokio_postgres::Client,
    roles_to_check: &[(&str, &str)],
    set: &MigrationSet,
) -> Result<Vec<String>, StoreError> {
    client
        .batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .await?;
    let res = check_in_snapshot(client, roles_to_check, set).await;
    let end = if res.is_ok() { "COMMIT" } else { "ROLLBACK" };
    client.batch_execute(end).await?;
    res
}

async fn check_in_snapshot(
    client: &tokio_postgres::Client,
    roles_to_check: &[(&str, &str)],
    set: &MigrationSet,
) -> Result<Vec<String>, StoreError> {
    let known = set.newest();
    let range = compat::range(client).await?;
    let drift = drift_of(client, set).await?;
    let missing = drift.iter().any(|d| matches!(d, Drift::NotApplied { .. }));
    let mut problems: Vec<String> = drift
        .iter()
        .filter(|d| !matches!(d, Drift::Extra { version, .. } if *version > known))
        .map(|d| d.to_string())
        .collect();
    if !range.serves(known) {
        problems.push(format!(
            "the database is at {newest}, migrated past this binary (which knows up to V{known}) \
             by the contract migration {floor}: it serves only binaries that know V{f} or later; \
             run a binary that knows {floor} (docs/operations.md, upgrades)",
            newest = range.newest_file.as_deref().unwrap_or("?"),
            floor = range.floor_file.as_deref().unwrap_or("?"),
            f = range.floor,
        ));
    } else if missing {
        problems.push(format!(
            "this binary knows migrations up to V{known}; the database's newest is {}",
            range.newest_file.as_deref().unwrap_or("none")
        ));
    }
    if !problems.is_empty() {
        return Ok(problems);
    }
    let cap = client
        .query_opt("SELECT name, version FROM qlsched.capability", &[])
        .await?;
    match cap {
        Some(r) if r.get::<_, String>(0) == CAPABILITY.0 && r.get::<_, i32>(1) == CAPABILITY.1 => {}
        Some(r) => problems.push(format!(
            "capability is {} v{}, this binary needs {} v{}",
            r.get::<_, String>(0),
            r.get::<_, i32>(1),
            CAPABILITY.0,
            CAPABILITY.1
        )),
        None => problems.push("capability row is missing".into()),
    }
    // The manifest the database holds is what the roles must hold exactly; before V13 there
    // is none and this binary's own stands in.
    let recorded = manifest::read(client).await?;
    let db_manifest = recorded.clone().unwrap_or_else(|| set.grants.clone());
    for (role, kind) in roles_to_check {
        let have = table_privileges(client, role).await?;
        let want = table_grants_of(&db_manifest, kind);
        for extra in have.iter().filter(|p| !want.contains(p)) {
            problems.push(format!(
                "role {role} has {} on {SCHEMA}.{}, which it must not",
                extra.1, extra.0
            ));
        }
        for missing in want.iter().filter(|p| !have.contains(p)) {
            problems.push(format!(
                "role {role} lacks {} on {SCHEMA}.{}",
                missing.1, missing.0
            ));
        }
        problems.extend(other_privileges(client, role, kind, &db_manifest).await?);
        if recorded.is_some() {
            for g in set
                .grants
                .iter()
                .filter(|g| g.kind == *kind && !db_manifest.contains(g))
            {
                problems.push(format!(
                    "the database's grant manifest lacks {g} for the {kind} role, which this \
                     binary needs (run `qlsched db migrate` with this binary)"
                ));
            }
        }
    }
    Ok(problems)
}

/// Every privilege a role holds outside the table grants, each as a problem: column-level
/// grants other than its [`COLUMN_GRANTS`] (and each of those it lacks), grants on other relations (sequences, views) in the schema; schema `CREATE`
/// anywhere and `USAGE` on the scheduler schema where the role has no tables; database
/// `CREATE`/`TEMPORARY`; default privileges that would hand it future objects; `EXECUTE` on
/// any function or procedure in the schema (PostgreSQL grants that to PUBLIC by default).
/// Beyond [`COLUMN_GRANTS`], none of these is ever granted by `db migrate`, so any one is
/// drift to refuse.
///
/// Catalog reads only (the runtime role runs it at start). PUBLIC's grants count: they reach
/// every role.
async fn other_privileges(
    client: &tokio_postgres::Client,
    role: &str,
    kind: &str,
    grants: &[Grant],
) -> Result<Vec<String>, StoreError> {
    const SQL: &str = "
        WITH r AS (SELECT oid FROM pg_roles WHERE rolname = $1)
        SELECT format('role %s has column-level %s on %I.%I(%I), which it must not',
                      $1, acl.privilege_type, n.nspname, c.relname, a.attname)
          FROM pg_attribute a
          JOIN pg_class c ON c.oid = a.attrelid
          JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $2
          CROSS JOIN LATERAL aclexplode(a.attacl) acl
         WHERE acl.grantee IN (0, (SELECT oid FROM r))
           AND NOT (acl.grantee = (SELECT oid FROM r)
                    AND format('%s.%s.%s', c.relname, a.attname, acl.privilege_type) = ANY ($4))
        UNION ALL
        SELECT format('role %s has %s on %s %I.%I, which it must not', $1, acl.privilege_type,
                      CASE c.relkind WHEN 'S' THEN 'sequence' WHEN 'v' THEN 'view'
                                     WHEN 'm' THEN 'materialized view' ELSE 'relation' END,
                      n.nspname, c.relname)
          FROM pg_class c
          JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $2
          CROSS JOIN LATERAL aclexplode(c.relacl) acl
         WHERE c.relkind NOT IN ('r', 'p', 'i', 'I', 't', 'c')
           AND acl.grantee IN (0, (SELECT oid FROM r))
        UNION ALL
        SELECT format('role %s has CREATE on schema %I, which it must not', $1, n.nspname)
          FROM pg_namespace n
         WHERE n.nspname NOT IN ('pg_catalog', 'information_schema')
           AND left(n.nspname, 3) <> 'pg_'
           AND has_schema_privilege($1, n.oid, 'CREATE')
           AND n.nspowner <> (SELECT oid FROM r)
        UNION ALL
        SELECT format('role %s has USAGE on schema %I, which it must not', $1, $2::text)
          FROM pg_namespace n
         WHERE n.nspname = $2 AND NOT $3 AND has_schema_privilege($1, n.oid, 'USAGE')
        UNION ALL
        SELECT format('role %s has CREATE on database %I, which it must not', $1, current_database())
         WHERE has_database_privilege($1, current_database(), 'CREATE')
        UNION ALL
        SELECT format('role %s has TEMPORARY on database %I, which it must not (PostgreSQL grants it '
                      'to PUBLIC on every new database; `qlsched db bootstrap` revokes it, or run '
                      'REVOKE TEMPORARY ON DATABASE %I FROM PUBLIC)',
                      $1, current_database(), current_database())
         WHERE has_database_privilege($1, current_database(), 'TEMPORARY')
        UNION ALL
        SELECT format('role %s gets %s on future %s created by %s%s (default privileges), which it must not',
                      $1, acl.privilege_type,
                      CASE d.defaclobjtype WHEN 'r' THEN 'tables' WHEN 'S' THEN 'sequences'
                           WHEN 'f' THEN 'functions' WHEN 'T' THEN 'types'
                           WHEN 'n' THEN 'schemas' ELSE d.defaclobjtype::text END,
                      pg_get_userbyid(d.defaclrole),
                      CASE WHEN d.defaclnamespace = 0 THEN ''
                           ELSE ' in schema ' || d.defaclnamespace::regnamespace::text END)
          FROM pg_default_acl d
          CROSS JOIN LATERAL aclexplode(d.defaclacl) acl
         WHERE acl.grantee IN (0, (SELECT oid FROM r))
        UNION ALL
        SELECT format('role %s may EXECUTE %s %s, which it must not', $1,
                      CASE p.prokind WHEN 'p' THEN 'procedure' ELSE 'function' END,
                      p.oid::regprocedure::text)
          FROM pg_proc p
          JOIN pg_namespace n ON n.oid = p.pronamespace AND n.nspname = $2
         WHERE has_function_privilege($1, p.oid, 'EXECUTE')
           AND p.oid <> ALL (SELECT coalesce(to_regprocedure(f)::oid, 0)
                               FROM unnest($5::text[]) AS f)
        UNION ALL
        SELECT format('role %s lacks EXECUTE on function %s', $1, f)
          FROM unnest($5::text[]) AS f
         WHERE to_regprocedure(f) IS NULL
            OR NOT has_function_privilege($1, to_regprocedure(f)::oid, 'EXECUTE')
         ORDER BY 1";
    let uses_schema = matches!(kind, "admin" | "runtime" | "dispatcher");
    let mut want: Vec<(String, String, String)> = grants
        .iter()
        .filter(|g| g.kind == kind)
        .filter_map(|g| match &g.object {
            Object::Column(t, c) => Some((t.clone(), c.clone(), g.privilege.clone())),
            _ => None,
        })
        .collect();
    want.sort();
    let granted: Vec<String> = want
        .iter()
        .map(|(t, c, p)| format!("{t}.{c}.{p}"))
        .collect();
    let functions: Vec<String> = grants
        .iter()
        .filter(|g| g.kind == kind)
        .filter_map(|g| match &g.object {
            Object::Function(f) => Some(f.clone()),
            _ => None,
        })
        .collect();
    let rows = client
        .query(SQL, &[&role, &SCHEMA, &uses_schema, &granted, &functions])
        .await?;
    let mut problems: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    // Each expected column grant, held by the role itself (not only through PUBLIC).
    let held: Vec<String> = client
        .query(
            "SELECT format('%s.%s.%s', c.relname, a.attname, acl.privilege_type)
               FROM pg_attribute a
               JOIN pg_class c ON c.oid = a.attrelid
               JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = $2
               CROSS JOIN LATERAL aclexplode(a.attacl) acl
              WHERE acl.grantee = (SELECT oid FROM pg_roles WHERE rolname = $1)",
            &[&role, &SCHEMA],
        )
        .await?
        .iter()
        .map(|r| r.get(0))
        .collect();
    for ((t, c, p), key) in want.iter().zip(&granted) {
        if !held.contains(key) {
            problems.push(format!(
                "role {role} lacks column-level {p} on {SCHEMA}.{t}({c})"
            ));
        }
    }
    Ok(problems)
}

/// Quotes for callers that build DDL (tests, bootstrap passwords).
pub fn quote_ident(s: &str) -> String {
    ident(s)
}
pub fn quote_literal(s: &str) -> String {
    literal(s)
}

#[cfg(test)]
mod tests {
    /// The checksums databases already hold for V1–V4 (written by refinery 0.8). `db check`
    /// compares them with the binary's, so a refinery upgrade that changed its checksum
    /// format would make every existing install look drifted.
    const RELEASED: [(i32, &str, u64); 4] = [
        (1, "definitions", 14791040587439287459),
        (2, "trigger_schedules", 9068370986614859968),
        (3, "admitted_work", 14139397345312043001),
        (4, "capability", 1188957103559766989),
    ];

    #[test]
    fn released_migrations_keep_the_checksums_existing_databases_recorded() {
        let runner = super::embedded::migrations::runner();
        for (version, name, checksum) in RELEASED {
            let m = runner
                .get_migrations()
                .iter()
                .find(|m| m.version() == version)
                .unwrap_or_else(|| panic!("migration V{version} is missing"));
            assert_eq!(m.name(), name, "name of V{version}");
            assert_eq!(
                m.checksum(),
                checksum,
                "checksum of V{version}__{name}.sql changed: a migration file was edited, or \
                 refinery changed its checksum format (existing databases would fail db check)"
            );
        }
    }
}
