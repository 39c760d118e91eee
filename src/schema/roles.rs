//! The five LOGIN roles of an install and `db bootstrap`: roles, database and schema.

use super::ident;
use crate::db::{StoreError, SCHEMA};

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

/// Whether a role named `role` exists.
pub(super) async fn role_exists(
    client: &tokio_postgres::Client,
    role: &str,
) -> Result<bool, StoreError> {
    Ok(client
        .query_opt("SELECT 1 FROM pg_roles WHERE rolname = $1", &[&role])
        .await?
        .is_some())
}

/// Creates the LOGIN roles (if missing), the database owned by the owner role (if missing),
/// and the schema; runs as a superuser. Idempotent.
pub async fn bootstrap(
    superuser: impl Into<crate::db::Target>,
    roles: &Roles,
    database: &str,
) -> Result<(), StoreError> {
    let superuser: crate::db::Target = superuser.into();
    let client = crate::db::connect(&superuser).await?;
    for role in roles.all() {
        if !role_exists(&client, role).await? {
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
    let client = crate::db::connect(&in_db).await?;
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
