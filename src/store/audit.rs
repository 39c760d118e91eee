//! The audit log (V22, docs/audit.md): one row per change to a project, task or trigger and
//! per operator action, appended by [`append`] inside the transaction of the change itself,
//! so the row commits with the change or not at all. Nothing here updates or deletes a row:
//! retention removes old ones through `qlsched.prune_audit` ([`super::retention`]).
//!
//! Who asked: the database records its own clock (`at_ms`) and `session_user` (`db_user`),
//! which no role can set; the client adds what it knows of itself (an [`Origin`]: actor,
//! host, source, apply's source label), declared once per connection with [`declare`] or
//! given with the entry ([`Entry::origin`], for a replica's own actions).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use tokio_postgres::types::Type;

use crate::db::StoreError;

/// Where a change came from (`audit_log.source`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Source {
    /// An operator's command (`qlsched trigger disable`, …).
    Cli,
    /// `qlsched apply`, with the files' source label.
    Apply,
    /// The web console.
    Console,
    /// A replica's own decision (a system pause), actor `qlsched`.
    System,
}

/// What a client says about itself: recorded as given, beside the database's `db_user`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Origin {
    pub actor: Option<String>,
    pub host: Option<String>,
    pub source: Source,
    /// `apply`'s source label.
    pub label: Option<String>,
}

impl Origin {
    /// A replica acting on its own (`actor` `qlsched`).
    pub fn system() -> Origin {
        Origin {
            actor: Some("qlsched".into()),
            host: None,
            source: Source::System,
            label: None,
        }
    }
}

/// The session setting that carries a connection's declared [`Origin`] (JSON).
const ORIGIN_SETTING: &str = "qlsched.audit_origin";

/// Declares the origin of every row this connection appends from now on (a session
/// setting; PgBouncer is supported in session mode only, so it stays with the connection).
pub async fn declare(
    client: &impl tokio_postgres::GenericClient,
    origin: &Origin,
) -> Result<(), StoreError> {
    let json = serde_json::to_string(origin).expect("an origin serializes");
    client
        .execute(
            "SELECT set_config($1, $2, false)",
            &[&ORIGIN_SETTING, &json],
        )
        .await?;
    Ok(())
}

/// What an audit row is about (`audit_log.object_kind`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ObjectKind {
    Project,
    Task,
    Trigger,
    /// The 'prune' maintenance row (`runs prune` raises its horizon).
    Maintenance,
}

impl ObjectKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ObjectKind::Project => "project",
            ObjectKind::Task => "task",
            ObjectKind::Trigger => "trigger",
            ObjectKind::Maintenance => "maintenance",
        }
    }

    /// The object's fields as an audit row compares them, by id (one row or none). Columns
    /// that change with every write (`updated_at_ms`) or only mirror others
    /// (`content_digest`) are left out; a column a later migration adds is included as it is.
    fn snapshot_sql(self) -> &'static str {
        match self {
            ObjectKind::Project => {
                "SELECT to_jsonb(p) - 'created_at_ms' - 'updated_at_ms'
                   FROM qlsched.projects p WHERE p.project_id = $1"
            }
            ObjectKind::Task => {
                "SELECT (to_jsonb(k) - 'updated_at_ms' - 'content_digest')
                        || jsonb_build_object('spec', e.spec)
                   FROM qlsched.tasks k
                   JOIN qlsched.execution_revisions e ON e.execution_revision_id = k.execution_revision_id
                  WHERE k.task_id = $1"
            }
            ObjectKind::Trigger => {
                "SELECT to_jsonb(t) - 'updated_at_ms' - 'content_digest'
                   FROM qlsched.triggers t WHERE t.trigger_id = $1"
            }
            ObjectKind::Maintenance => {
                "SELECT jsonb_build_object('pruned_through_ms', m.pruned_through_ms)
                   FROM qlsched.maintenance m WHERE m.task = $1"
            }
        }
    }
}

/// The object's fields now (in the caller's transaction), `None` if it does not exist: read
/// before a change, and given to [`append_change`] after it.
pub async fn snapshot(
    tx: &tokio_postgres::Transaction<'_>,
    kind: ObjectKind,
    id: &str,
) -> Result<Option<Value>, StoreError> {
    // Typed: one round trip instead of a prepare and an execute (an apply snapshots every
    // object it writes twice).
    Ok(tx
        .query_typed_opt(kind.snapshot_sql(), &[(&id, Type::TEXT)])
        .await?
        .map(|r| r.get(0)))
}

/// The fields that differ between two snapshots, as `{"field": {"before": …, "after": …}}`
/// (a field absent on one side is `null` there), in field order.
pub fn diff(before: Option<&Value>, after: Option<&Value>) -> Value {
    let empty = Map::new();
    let b = before.and_then(Value::as_object).unwrap_or(&empty);
    let a = after.and_then(Value::as_object).unwrap_or(&empty);
    let mut keys: Vec<&String> = b.keys().chain(a.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut out = Map::new();
    for k in keys {
        let (x, y) = (
            b.get(k).unwrap_or(&Value::Null),
            a.get(k).unwrap_or(&Value::Null),
        );
        if x != y {
            out.insert(k.clone(), serde_json::json!({"before": x, "after": y}));
        }
    }
    Value::Object(out)
}

/// One audit row, as its writer gives it.
#[derive(Clone, Debug)]
pub struct Entry<'a> {
    pub kind: ObjectKind,
    pub id: &'a str,
    /// The project the object is in (the `--project` filter), if any.
    pub project: Option<&'a str>,
    /// What was done: `publish`, `set`, `disable`, `enable`, `delete`, `fire`, `backfill`,
    /// `runs.cancel`, `runs.prune` (docs/audit.md).
    pub action: &'a str,
    /// A definition's changed fields ([`diff`]), or what an action did.
    pub changes: Value,
    pub note: Option<&'a str>,
    /// `None`: the origin the connection declared ([`declare`]); a connection that declared
    /// none appends as source `cli` with no actor (`db_user` still names its role).
    pub origin: Option<&'a Origin>,
}

/// Appends one audit row in the caller's transaction (its time and `db_user` are the
/// database's). Locking: an INSERT into a table nothing else locks; it takes no row lock the
/// change does not already hold, so it adds no wait to the command around it.
pub async fn append(tx: &tokio_postgres::Transaction<'_>, e: &Entry<'_>) -> Result<(), StoreError> {
    let origin = e
        .origin
        .map(|o| serde_json::to_string(o).expect("an origin serializes"));
    tx.execute(
        "INSERT INTO qlsched.audit_log (actor, host, source, source_label, object_kind, object_id,
                                        project_id, action, changes, note)
         SELECT o->>'actor', o->>'host', coalesce(o->>'source', 'cli'), o->>'label', $2, $3, $4, $5, $6, $7
           FROM (SELECT coalesce($1::text, nullif(current_setting('qlsched.audit_origin', true), ''),
                                 '{}')::jsonb AS o) s",
        &[
            &origin,
            &e.kind.as_str(),
            &e.id,
            &e.project,
            &e.action,
            &e.changes,
            &e.note,
        ],
    )
    .await?;
    Ok(())
}

/// Appends the change of a definition: its fields now (after the caller's writes) compared
/// with `before` (its [`snapshot`] before them), its project read from either. Appends
/// nothing when no field differs (an identical re-publish leaves no row).
pub async fn append_change(
    tx: &tokio_postgres::Transaction<'_>,
    kind: ObjectKind,
    id: &str,
    action: &str,
    before: Option<&Value>,
    note: Option<&str>,
) -> Result<(), StoreError> {
    let after = snapshot(tx, kind, id).await?;
    let changes = diff(before, after.as_ref());
    if changes.as_object().is_some_and(Map::is_empty) {
        return Ok(());
    }
    let project = after
        .as_ref()
        .or(before)
        .and_then(|v| v.get("project_id"))
        .and_then(Value::as_str);
    append(
        tx,
        &Entry {
            kind,
            id,
            project,
            action,
            changes,
            note,
            origin: None,
        },
    )
    .await
}

/// One audit row as `qlsched audit --json`, the console and its API show it.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct AuditItem {
    pub audit_id: i64,
    pub at_ms: i64,
    pub db_user: String,
    pub actor: Option<String>,
    pub host: Option<String>,
    pub source: String,
    pub source_label: Option<String>,
    pub object_kind: String,
    pub object_id: String,
    pub project_id: Option<String>,
    pub action: String,
    pub changes: Value,
    pub note: Option<String>,
}

/// Which rows a page shows, newest first.
#[derive(Clone, Copy, Debug, Default)]
pub struct AuditFilter<'a> {
    /// One trigger's rows (its definition, its runs' actions).
    pub trigger: Option<&'a str>,
    pub project: Option<&'a str>,
    /// Rows at or after this instant (Unix ms, database clock).
    pub since_ms: Option<i64>,
    /// The keyset cursor: rows strictly before this (at_ms, audit_id).
    pub before: Option<(i64, i64)>,
    pub limit: i64,
}

/// One page of the audit log and the cursor of the next (`AT_MS:AUDIT_ID`).
#[derive(Clone, Debug, Serialize)]
pub struct AuditPage {
    pub entries: Vec<AuditItem>,
    pub next_before: Option<String>,
}

/// Parses a `next_before` cursor.
pub fn parse_cursor(s: &str) -> Option<(i64, i64)> {
    let (at, id) = s.split_once(':')?;
    Some((at.parse().ok()?, id.parse().ok()?))
}

/// One page, newest first: `audit_log_at_idx` read backwards from the cursor, or one
/// trigger's rows on `audit_log_object_idx`, one project's on `audit_log_project_idx`,
/// stopping after `limit` rows. Locking: a plain read.
pub async fn page(
    client: &impl tokio_postgres::GenericClient,
    f: &AuditFilter<'_>,
) -> Result<AuditPage, StoreError> {
    let (bat, bid) = match f.before {
        Some((at, id)) => (Some(at), Some(id)),
        None => (None, None),
    };
    let rows = client
        .query(
            "SELECT a.audit_id, a.at_ms, a.db_user, a.actor, a.host, a.source, a.source_label,
                    a.object_kind, a.object_id, a.project_id, a.action, a.changes, a.note
               FROM qlsched.audit_log a
              WHERE ($1::text IS NULL OR (a.object_kind = 'trigger' AND a.object_id = $1))
                AND ($2::text IS NULL OR a.project_id = $2)
                AND a.at_ms >= coalesce($3::bigint, -9223372036854775808)
                AND a.at_ms <= coalesce($4::bigint, 9223372036854775807)
                AND ($4::bigint IS NULL OR a.at_ms < $4 OR a.audit_id < $5)
              ORDER BY a.at_ms DESC, a.audit_id DESC LIMIT $6",
            &[&f.trigger, &f.project, &f.since_ms, &bat, &bid, &f.limit],
        )
        .await?;
    let entries: Vec<AuditItem> = rows
        .iter()
        .map(|r| AuditItem {
            audit_id: r.get("audit_id"),
            at_ms: r.get("at_ms"),
            db_user: r.get("db_user"),
            actor: r.get("actor"),
            host: r.get("host"),
            source: r.get("source"),
            source_label: r.get("source_label"),
            object_kind: r.get("object_kind"),
            object_id: r.get("object_id"),
            project_id: r.get("project_id"),
            action: r.get("action"),
            changes: r.get("changes"),
            note: r.get("note"),
        })
        .collect();
    let next_before = match entries.last() {
        Some(last) if entries.len() as i64 == f.limit => {
            Some(format!("{}:{}", last.at_ms, last.audit_id))
        }
        _ => None,
    };
    Ok(AuditPage {
        entries,
        next_before,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn diff_names_each_changed_field_with_both_sides() {
        let b = json!({"cron_expr": "* * * * *", "revision": 1, "enabled": true});
        let a = json!({"cron_expr": "*/5 * * * *", "revision": 2, "enabled": true, "new": 1});
        assert_eq!(
            diff(Some(&b), Some(&a)),
            json!({
                "cron_expr": {"before": "* * * * *", "after": "*/5 * * * *"},
                "new": {"before": null, "after": 1},
                "revision": {"before": 1, "after": 2},
            })
        );
        assert_eq!(diff(Some(&b), Some(&b)), json!({}));
        assert_eq!(
            diff(None, Some(&json!({"x": 1}))),
            json!({"x": {"before": null, "after": 1}})
        );
    }
}
