//! The grant manifest: every privilege `db migrate` installs, per role kind, recorded in
//! `qlsched.grant_manifest` (V13) in the same transaction as the grants themselves. `db check`
//! compares the roles' actual privileges with the manifest the database holds (exactly), and
//! the binary's own manifest with that one (a subset): so a newer migrator's grants on objects
//! an older binary does not know are not drift to the older binary, while a grant made by
//! hand still is.

use std::fmt;

use super::{ident, Roles};
use crate::db::SCHEMA;

/// What a grant is on.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Object {
    Table(String),
    /// (table, column)
    Column(String, String),
    /// A signature as `regprocedure` prints it, schema-qualified.
    Function(String),
}

/// One privilege of one role kind ("admin" | "runtime" | "worker_ingress" | "dispatcher").
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Grant {
    pub kind: String,
    pub object: Object,
    pub privilege: String,
}

impl Grant {
    pub fn table(kind: &str, table: &str, privilege: &str) -> Grant {
        Grant {
            kind: kind.into(),
            object: Object::Table(table.into()),
            privilege: privilege.into(),
        }
    }
    pub fn column(kind: &str, table: &str, column: &str, privilege: &str) -> Grant {
        Grant {
            kind: kind.into(),
            object: Object::Column(table.into(), column.into()),
            privilege: privilege.into(),
        }
    }
    pub fn function(kind: &str, signature: &str) -> Grant {
        Grant {
            kind: kind.into(),
            object: Object::Function(signature.into()),
            privilege: "EXECUTE".into(),
        }
    }

    /// (object_type, object, column_name) as `qlsched.grant_manifest` stores them.
    fn columns(&self) -> (&'static str, &str, &str) {
        match &self.object {
            Object::Table(t) => ("table", t, ""),
            Object::Column(t, c) => ("column", t, c),
            Object::Function(f) => ("function", f, ""),
        }
    }

    /// The statement that installs it for `role`.
    fn grant_sql(&self, role: &str) -> String {
        let role = ident(role);
        match &self.object {
            Object::Table(t) => format!("GRANT {} ON {SCHEMA}.{t} TO {role};\n", self.privilege),
            Object::Column(t, c) => {
                format!(
                    "GRANT {} ({c}) ON {SCHEMA}.{t} TO {role};\n",
                    self.privilege
                )
            }
            Object::Function(f) => format!("GRANT EXECUTE ON FUNCTION {f} TO {role};\n"),
        }
    }
}

impl fmt::Display for Grant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.object {
            Object::Table(t) => write!(f, "{} on {SCHEMA}.{t}", self.privilege),
            Object::Column(t, c) => {
                write!(f, "column-level {} on {SCHEMA}.{t}({c})", self.privilege)
            }
            Object::Function(s) => write!(f, "EXECUTE on function {s}"),
        }
    }
}

/// The SQL that makes the roles' privileges exactly `grants` (everything revoked first) and
/// records them as the database's manifest when `qlsched.grant_manifest` exists. Runs inside
/// the caller's transaction; takes no lock on a scheduler table (GRANT and REVOKE change the
/// catalog only).
pub(super) fn install_sql(grants: &[Grant], roles: &Roles, record: bool) -> String {
    let others = [
        &roles.admin,
        &roles.runtime,
        &roles.worker_ingress,
        &roles.dispatcher,
    ]
    .map(|r| ident(r))
    .join(", ");
    let mut sql = String::new();
    sql += &format!("REVOKE ALL ON ALL TABLES IN SCHEMA {SCHEMA} FROM PUBLIC, {others};\n");
    sql += &format!("REVOKE ALL ON SCHEMA {SCHEMA} FROM PUBLIC, {others};\n");
    sql += &format!("REVOKE ALL ON ALL SEQUENCES IN SCHEMA {SCHEMA} FROM PUBLIC, {others};\n");
    sql += &format!("REVOKE ALL ON ALL FUNCTIONS IN SCHEMA {SCHEMA} FROM PUBLIC, {others};\n");
    sql += &format!(
        "GRANT USAGE ON SCHEMA {SCHEMA} TO {}, {}, {};\n",
        ident(&roles.admin),
        ident(&roles.runtime),
        ident(&roles.dispatcher)
    );
    for g in grants {
        if let Some(role) = roles.of_kind(&g.kind) {
            sql += &g.grant_sql(role);
        }
    }
    if record {
        sql += "DELETE FROM qlsched.grant_manifest;\n";
        for g in grants {
            let (object_type, object, column) = g.columns();
            sql += &format!(
                "INSERT INTO qlsched.grant_manifest (role_kind, object_type, object, column_name, privilege) \
                 VALUES ({}, {}, {}, {}, {});\n",
                super::literal(&g.kind),
                super::literal(object_type),
                super::literal(object),
                super::literal(column),
                super::literal(&g.privilege)
            );
        }
    }
    sql
}

/// The grants of `grants` whose object exists, in the caller's transaction (a migration's,
/// after its SQL), in their order.
///
/// Locking: catalog reads only (`to_regclass`, `to_regprocedure`, `pg_attribute`), no lock on
/// any scheduler table; the objects the migration created or dropped are seen as its own
/// transaction left them.
pub(super) async fn existing(
    tx: &tokio_postgres::Transaction<'_>,
    grants: &[Grant],
) -> Result<Vec<Grant>, tokio_postgres::Error> {
    const SQL: &str = "
        SELECT g.i::int4
          FROM unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY
               AS g(object_type, object, column_name, i)
         WHERE CASE g.object_type
                 WHEN 'table' THEN to_regclass(format('%I.%I', $4::text, g.object)) IS NOT NULL
                 WHEN 'column' THEN EXISTS (
                     SELECT 1 FROM pg_attribute a
                      WHERE a.attrelid = to_regclass(format('%I.%I', $4::text, g.object))
                        AND a.attname = g.column_name AND a.attnum > 0 AND NOT a.attisdropped)
                 ELSE to_regprocedure(g.object) IS NOT NULL
               END
         ORDER BY g.i";
    let (mut types, mut objects, mut columns) = (Vec::new(), Vec::new(), Vec::new());
    for g in grants {
        let (t, o, c) = g.columns();
        types.push(t);
        objects.push(o);
        columns.push(c);
    }
    let rows = tx
        .query(SQL, &[&types, &objects, &columns, &SCHEMA])
        .await?;
    Ok(rows
        .iter()
        .map(|r| grants[(r.get::<_, i32>(0) - 1) as usize].clone())
        .collect())
}

/// The manifest the database holds (None: before V13, no manifest table).
pub async fn read(
    client: &impl tokio_postgres::GenericClient,
) -> Result<Option<Vec<Grant>>, tokio_postgres::Error> {
    let exists: bool = client
        .query_one(
            "SELECT to_regclass('qlsched.grant_manifest') IS NOT NULL",
            &[],
        )
        .await?
        .get(0);
    if !exists {
        return Ok(None);
    }
    let rows = client
        .query(
            "SELECT role_kind, object_type, object, column_name, privilege
               FROM qlsched.grant_manifest ORDER BY 1, 2, 3, 4, 5",
            &[],
        )
        .await?;
    let mut out = Vec::with_capacity(rows.len());
    for r in rows {
        let (kind, ty, object, column, privilege): (String, String, String, String, String) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        let object = match ty.as_str() {
            "table" => Object::Table(object),
            "column" => Object::Column(object, column),
            _ => Object::Function(object),
        };
        out.push(Grant {
            kind,
            object,
            privilege,
        });
    }
    Ok(Some(out))
}
