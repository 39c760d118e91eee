//! `qlsched export`: the stored definitions in the format of [`super::file`], so that the
//! plan of an export against the database it came from is all unchanged.

use super::options;
use crate::store::definitions::Stored;

/// The label an export writes as its `source` when no live trigger carries one.
pub const EXPORT_SOURCE: &str = "export";

/// Only `source`'s live triggers, and the tasks and projects they use (so the file applies
/// on its own), or everything when `source` is `None`.
pub fn only_source(stored: &Stored, source: &str) -> Stored {
    let triggers: Vec<_> = stored
        .triggers
        .iter()
        .filter(|t| !t.deleted && t.source.as_deref() == Some(source))
        .cloned()
        .collect();
    Stored {
        projects: stored
            .projects
            .iter()
            .filter(|p| triggers.iter().any(|t| t.project == p.id))
            .cloned()
            .collect(),
        tasks: stored
            .tasks
            .iter()
            .filter(|k| triggers.iter().any(|t| t.task == k.id))
            .cloned()
            .collect(),
        triggers,
    }
}

/// The label the export writes: the one its live triggers carry, [`EXPORT_SOURCE`] when
/// none does. `Err`: they carry several (a file has one owner; export them one at a time
/// with `--source`).
pub fn label(stored: &Stored) -> Result<String, String> {
    let mut labels: Vec<&str> = stored
        .triggers
        .iter()
        .filter(|t| !t.deleted)
        .filter_map(|t| t.source.as_deref())
        .collect();
    labels.sort_unstable();
    labels.dedup();
    match labels.as_slice() {
        [] => Ok(EXPORT_SOURCE.to_string()),
        [one] => Ok(one.to_string()),
        many => Err(format!(
            "the triggers belong to {} sources ({}): a file has one source, so export them one at a time with --source",
            many.len(),
            many.join(", ")
        )),
    }
}

/// The stored projects, tasks and live triggers as one definition file with source label
/// `source`. `Err` names a task whose spec TOML cannot hold (a JSON `null`, or not a JSON
/// object).
pub fn to_toml(stored: &Stored, source: &str) -> Result<String, String> {
    let mut doc = toml::Table::new();
    doc.insert("source".into(), source.into());
    let projects: Vec<toml::Value> = stored
        .projects
        .iter()
        .map(|p| {
            let mut t = toml::Table::new();
            t.insert("id".into(), p.id.clone().into());
            t.insert("status".into(), p.status.clone().into());
            t.into()
        })
        .collect();
    let mut tasks = Vec::new();
    for k in &stored.tasks {
        let json: serde_json::Value = serde_json::from_str(&k.spec)
            .map_err(|e| format!("task {}: its spec is not JSON ({e})", k.id))?;
        let spec: toml::Value = toml::Value::try_from(&json)
            .map_err(|e| format!("task {}: its spec cannot be written as TOML ({e})", k.id))?;
        if !spec.is_table() {
            return Err(format!("task {}: its spec is not a JSON object", k.id));
        }
        let mut t = toml::Table::new();
        t.insert("id".into(), k.id.clone().into());
        t.insert("project".into(), k.project.clone().into());
        t.insert("spec".into(), spec);
        tasks.push(toml::Value::from(t));
    }
    let triggers: Vec<toml::Value> = stored
        .triggers
        .iter()
        .filter(|t| !t.deleted)
        .map(|g| {
            let mut t = toml::Table::new();
            t.insert("id".into(), g.id.clone().into());
            t.insert("project".into(), g.project.clone().into());
            t.insert("task".into(), g.task.clone().into());
            t.insert("cron".into(), g.cron.clone().into());
            t.insert("tz".into(), g.tz.clone().into());
            t.insert("misfire".into(), g.misfire.clone().into());
            t.insert("grace_ms".into(), g.grace_ms.into());
            t.insert("disabled".into(), (!g.published_enabled).into());
            // The options only when set, as `trigger publish` was given them.
            if g.jitter_ms != 0 {
                t.insert("jitter".into(), options::duration_text(g.jitter_ms).into());
            }
            if let Some(ms) = g.start_at_ms {
                t.insert("start_at".into(), options::instant_text(ms).into());
            }
            if let Some(ms) = g.end_at_ms {
                t.insert("end_at".into(), options::instant_text(ms).into());
            }
            if let Some(n) = g.pause_after_failures {
                t.insert("pause_after_failures".into(), i64::from(n).into());
            }
            if let Some(ms) = g.expect_success_within_ms {
                t.insert(
                    "expect_success_within".into(),
                    options::duration_text(ms).into(),
                );
            }
            if g.overlap != "allow" {
                t.insert("overlap".into(), g.overlap.clone().into());
            }
            t.into()
        })
        .collect();
    doc.insert("project".into(), projects.into());
    doc.insert("task".into(), tasks.into());
    doc.insert("trigger".into(), triggers.into());
    toml::to_string(&doc).map_err(|e| e.to_string())
}
