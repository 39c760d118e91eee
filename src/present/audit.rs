//! The audit log as `qlsched audit` prints it and the console shows it: who (actor, host,
//! database user, source), what, and each changed field as `before → after`.

use serde_json::Value;

use super::text::utc;
use crate::store::audit::AuditItem;

/// `alice@vm1 as qlsched_admin (cli)`, `qlsched as qlsched_runtime (system)`,
/// `ci as qlsched_admin (apply team-payments/infra)`.
pub fn who(e: &AuditItem) -> String {
    let person = match (&e.actor, &e.host) {
        (Some(a), Some(h)) => format!("{a}@{h} as "),
        (Some(a), None) => format!("{a} as "),
        (None, Some(h)) => format!("@{h} as "),
        (None, None) => String::new(),
    };
    let source = match &e.source_label {
        Some(l) => format!("{} {l}", e.source),
        None => e.source.clone(),
    };
    format!("{person}{} ({source})", e.db_user)
}

/// A JSON value in a line: strings bare, the rest as JSON.
fn value_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The changes as one line: `field: before → after` for a definition's fields, `key=value`
/// for what an action did, separated by `; `.
pub fn changes_text(changes: &Value) -> String {
    let Some(map) = changes.as_object() else {
        return value_text(changes);
    };
    map.iter()
        .map(|(k, v)| match v.as_object() {
            Some(ba) if ba.len() == 2 && ba.contains_key("before") && ba.contains_key("after") => {
                format!(
                    "{k}: {} → {}",
                    value_text(&ba["before"]),
                    value_text(&ba["after"])
                )
            }
            _ => format!("{k}={}", value_text(v)),
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// One row as a line of `qlsched audit`.
pub fn line(e: &AuditItem) -> String {
    let mut s = format!(
        "{}  {} {} {}  {}  {}",
        utc(Some(e.at_ms)),
        e.object_kind,
        e.object_id,
        e.action,
        who(e),
        changes_text(&e.changes)
    );
    if let Some(n) = &e.note {
        s.push_str(&format!("  note: {n}"));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn changes_read_as_before_and_after_or_as_facts() {
        let c = json!({"enabled": {"before": true, "after": false}, "disabled_note": {"before": null, "after": "db upgrade"}});
        assert_eq!(
            changes_text(&c),
            "disabled_note: null → db upgrade; enabled: true → false"
        );
        assert_eq!(changes_text(&json!({"admitted": 3})), "admitted=3");
    }
}
