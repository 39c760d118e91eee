//! Drift: how the database's applied migration stream differs from the binary's.

use std::fmt;

use super::{file_name, MigrationSet, HISTORY_TABLE};
use crate::db::StoreError;

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

impl std::error::Error for Drift {}

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
