//! The readiness gate (`db check`, and every replica at start): the applied stream, the
//! range the database serves, the capability, and the exact-grant audit of each role.

use super::drift::{drift_of, Drift};
use super::grants::{table_grants_of, table_privileges};
use super::manifest::{self, Grant, Object};
use super::{compat, MigrationSet, CAPABILITY};
use crate::db::{StoreError, SCHEMA};

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
    let mut problems = stream_problems(client, set).await?;
    if !problems.is_empty() {
        return Ok(problems);
    }
    problems.extend(capability_problem(client).await?);
    // The manifest the database holds is what the roles must hold exactly; before V13 there
    // is none and this binary's own stands in.
    let recorded = manifest::read(client).await?;
    let db_manifest = recorded.clone().unwrap_or_else(|| set.grants.clone());
    for (role, kind) in roles_to_check {
        problems.extend(role_problems(client, role, kind, &db_manifest).await?);
        if recorded.is_some() {
            problems.extend(manifest_gaps(set, kind, &db_manifest));
        }
    }
    Ok(problems)
}

/// The applied stream against `set`: drift (a newer binary's migrations excepted) and a
/// database this binary cannot serve or has not migrated.
async fn stream_problems(
    client: &tokio_postgres::Client,
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
    Ok(problems)
}

/// The capability row, unless it is the one this binary was built for.
async fn capability_problem(client: &tokio_postgres::Client) -> Result<Option<String>, StoreError> {
    let cap = client
        .query_opt("SELECT name, version FROM qlsched.capability", &[])
        .await?;
    Ok(match cap {
        Some(r) if r.get::<_, String>(0) == CAPABILITY.0 && r.get::<_, i32>(1) == CAPABILITY.1 => {
            None
        }
        Some(r) => Some(format!(
            "capability is {} v{}, this binary needs {} v{}",
            r.get::<_, String>(0),
            r.get::<_, i32>(1),
            CAPABILITY.0,
            CAPABILITY.1
        )),
        None => Some("capability row is missing".into()),
    })
}

/// One role against the database's manifest: table privileges exactly, and nothing else.
async fn role_problems(
    client: &tokio_postgres::Client,
    role: &str,
    kind: &str,
    db_manifest: &[Grant],
) -> Result<Vec<String>, StoreError> {
    let mut problems = Vec::new();
    let have = table_privileges(client, role).await?;
    let want = table_grants_of(db_manifest, kind);
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
    problems.extend(other_privileges(client, role, kind, db_manifest).await?);
    Ok(problems)
}

/// The grants of a role kind this binary needs that the database's manifest lacks.
fn manifest_gaps(set: &MigrationSet, kind: &str, db_manifest: &[Grant]) -> Vec<String> {
    set.grants
        .iter()
        .filter(|g| g.kind == kind && !db_manifest.contains(g))
        .map(|g| {
            format!(
                "the database's grant manifest lacks {g} for the {kind} role, which this \
                 binary needs (run `qlsched db migrate` with this binary)"
            )
        })
        .collect()
}

/// What [`other_privileges`] asks the catalog, one problem per row: `$1` role, `$2` schema,
/// `$3` whether the role uses the schema, `$4` its expected column grants as
/// `table.column.privilege`, `$5` its expected functions.
const OTHER_PRIVILEGES_SQL: &str = "
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
    let uses_schema = matches!(kind, "admin" | "runtime" | "dispatcher");
    let want = column_grants_of(grants, kind);
    let granted: Vec<String> = want
        .iter()
        .map(|(t, c, p)| format!("{t}.{c}.{p}"))
        .collect();
    let functions = functions_of(grants, kind);
    let rows = client
        .query(
            OTHER_PRIVILEGES_SQL,
            &[&role, &SCHEMA, &uses_schema, &granted, &functions],
        )
        .await?;
    let mut problems: Vec<String> = rows.iter().map(|r| r.get(0)).collect();
    let held = held_column_grants(client, role).await?;
    for ((t, c, p), key) in want.iter().zip(&granted) {
        if !held.contains(key) {
            problems.push(format!(
                "role {role} lacks column-level {p} on {SCHEMA}.{t}({c})"
            ));
        }
    }
    Ok(problems)
}

/// A manifest's column grants of a role kind, as (table, column, privilege), sorted.
fn column_grants_of(grants: &[Grant], kind: &str) -> Vec<(String, String, String)> {
    let mut want: Vec<(String, String, String)> = grants
        .iter()
        .filter(|g| g.kind == kind)
        .filter_map(|g| match &g.object {
            Object::Column(t, c) => Some((t.clone(), c.clone(), g.privilege.clone())),
            _ => None,
        })
        .collect();
    want.sort();
    want
}

/// A manifest's functions a role kind may EXECUTE.
fn functions_of(grants: &[Grant], kind: &str) -> Vec<String> {
    grants
        .iter()
        .filter(|g| g.kind == kind)
        .filter_map(|g| match &g.object {
            Object::Function(f) => Some(f.clone()),
            _ => None,
        })
        .collect()
}

/// The column grants the role holds itself (not only through PUBLIC), as
/// `table.column.privilege`.
async fn held_column_grants(
    client: &tokio_postgres::Client,
    role: &str,
) -> Result<Vec<String>, StoreError> {
    Ok(client
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
        .collect())
}
