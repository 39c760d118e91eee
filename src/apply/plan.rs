//! The plan of `qlsched apply`: what the files would change in the database, object by
//! object — create, update (each changed field before → after), unchanged, delete (`--prune`:
//! a trigger of the files' own source that no file defines any more), absent (stored, not in
//! the files: reported, left as it is), refused — computed from the files' [`Definitions`]
//! and the [`Stored`] definitions, with no I/O.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;
use serde_json::Value;

use super::file::Definitions;
use super::options;
use crate::store::definitions::Stored;

/// What applying would do to one object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    Create,
    Update,
    Unchanged,
    /// `--prune`: a live trigger labelled with one of the files' sources that no file
    /// defines any more.
    Delete,
    /// Stored but in no file: left as it is (tasks and projects are permanent; triggers
    /// unlabelled, of another source, or without `--prune`).
    Absent,
    /// The files ask for something the database cannot take (a deleted trigger's id, a task
    /// or project defined nowhere, another source's trigger without `--adopt`).
    Refused,
}

/// How the plan treats ownership (docs/apply.md, "Ownership and --prune").
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Delete the live triggers labelled with the files' sources that no file defines.
    pub prune: bool,
    /// Label the triggers the files define that are unlabelled or another source's.
    pub adopt: bool,
}

/// One object of the plan.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Item {
    pub kind: &'static str,
    pub id: String,
    pub op: Op,
    /// Changed fields: (before, after).
    pub changes: BTreeMap<&'static str, (Value, Value)>,
    pub note: Option<String>,
}

/// The whole plan, projects first, then tasks, then triggers, each in id order.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    pub items: Vec<Item>,
}

impl Plan {
    /// Whether the database differs from the files (`--check`'s question).
    pub fn differs(&self) -> bool {
        self.items
            .iter()
            .any(|i| matches!(i.op, Op::Create | Op::Update | Op::Delete | Op::Refused))
    }
    pub fn count(&self, op: Op) -> usize {
        self.items.iter().filter(|i| i.op == op).count()
    }
}

fn item(
    kind: &'static str,
    id: &str,
    changes: BTreeMap<&'static str, (Value, Value)>,
    existed: bool,
) -> Item {
    let op = match (existed, changes.is_empty()) {
        (false, _) => Op::Create,
        (true, true) => Op::Unchanged,
        (true, false) => Op::Update,
    };
    Item {
        kind,
        id: id.to_string(),
        op,
        changes,
        note: None,
    }
}

/// Adds `(field, before, after)` to `changes` when they differ (`before` None: created).
fn field<T: Into<Value> + PartialEq>(
    changes: &mut BTreeMap<&'static str, (Value, Value)>,
    name: &'static str,
    before: Option<T>,
    after: T,
) {
    match before {
        Some(b) if b == after => {}
        b => {
            changes.insert(name, (b.map_or(Value::Null, Into::into), after.into()));
        }
    }
}

/// A refused item.
fn refused(kind: &'static str, id: &str, note: String) -> Item {
    Item {
        kind,
        id: id.to_string(),
        op: Op::Refused,
        changes: BTreeMap::new(),
        note: Some(note),
    }
}

/// The plan of `files` against `stored` (every stored definition: the whole database).
pub fn plan(files: &Definitions, stored: &Stored, opts: Options) -> Plan {
    let mut items = Vec::new();
    // By id (the stored lists are in the database's collation order, not Rust's).
    let projects: HashMap<&str, _> = stored.projects.iter().map(|p| (p.id.as_str(), p)).collect();
    let tasks: HashMap<&str, _> = stored.tasks.iter().map(|k| (k.id.as_str(), k)).collect();
    let triggers: HashMap<&str, _> = stored.triggers.iter().map(|t| (t.id.as_str(), t)).collect();
    for p in files.projects.values() {
        let s = projects.get(p.id.as_str()).copied();
        let mut c = BTreeMap::new();
        field(
            &mut c,
            "status",
            s.map(|s| s.status.clone()),
            p.status.as_str().to_string(),
        );
        items.push(item("project", &p.id, c, s.is_some()));
    }
    for s in stored
        .projects
        .iter()
        .filter(|s| !files.projects.contains_key(&s.id))
    {
        items.push(absent("project", &s.id));
    }
    let project_known = |id: &str| files.projects.contains_key(id) || projects.contains_key(id);
    for t in files.tasks.values() {
        if !project_known(&t.project) {
            items.push(refused(
                "task",
                &t.id,
                format!(
                    "its project {} is defined in no file and not in the database ({})",
                    t.project, t.place
                ),
            ));
            continue;
        }
        let s = tasks.get(t.id.as_str()).copied();
        let mut c = BTreeMap::new();
        field(
            &mut c,
            "project",
            s.map(|s| s.project.clone()),
            t.project.clone(),
        );
        // Specs compare as JSON values: the same spec written with other spacing or key
        // order is the same spec.
        let want: Value = serde_json::from_str(&t.spec).unwrap_or(Value::Null);
        let had = s.map(|s| serde_json::from_str(&s.spec).unwrap_or(Value::String(s.spec.clone())));
        field(&mut c, "spec", had, want);
        items.push(item("task", &t.id, c, s.is_some()));
    }
    for s in stored
        .tasks
        .iter()
        .filter(|s| !files.tasks.contains_key(&s.id))
    {
        items.push(absent("task", &s.id));
    }
    for t in files.triggers.values() {
        let d = &t.spec;
        let s = triggers.get(d.trigger_id.as_str()).copied();
        if let Some(s) = s.filter(|s| s.deleted) {
            let by = s
                .deleted_by
                .as_deref()
                .map_or(String::new(), |b| format!(" by {b}"));
            items.push(refused(
                "trigger",
                &s.id,
                format!(
                    "trigger {} was deleted{by} and a deleted trigger id is never reused (its runs keep it): give the trigger another id in {} (a rename is a delete plus a create)",
                    s.id, t.place
                ),
            ));
            continue;
        }
        if !project_known(&d.project_id) {
            items.push(refused(
                "trigger",
                &d.trigger_id,
                format!(
                    "its project {} is defined in no file and not in the database ({})",
                    d.project_id, t.place
                ),
            ));
            continue;
        }
        if !files.tasks.contains_key(&d.task_id) && !tasks.contains_key(d.task_id.as_str()) {
            items.push(refused(
                "trigger",
                &d.trigger_id,
                format!(
                    "its task {} is defined in no file and not in the database ({})",
                    d.task_id, t.place
                ),
            ));
            continue;
        }
        let owner = s.and_then(|s| s.source.as_deref());
        if let Some(owner) = owner.filter(|o| *o != t.source && !opts.adopt) {
            items.push(refused(
                "trigger",
                &d.trigger_id,
                format!(
                    "owned by source `{owner}`, not `{}` ({}): change it in that source's files, or give --adopt to take it over",
                    t.source, t.place
                ),
            ));
            continue;
        }
        let mut c = BTreeMap::new();
        field(
            &mut c,
            "project",
            s.map(|s| s.project.clone()),
            d.project_id.clone(),
        );
        field(&mut c, "task", s.map(|s| s.task.clone()), d.task_id.clone());
        field(
            &mut c,
            "cron",
            s.map(|s| s.cron.clone()),
            d.cron_expr.clone(),
        );
        field(&mut c, "tz", s.map(|s| s.tz.clone()), d.timezone.clone());
        field(
            &mut c,
            "misfire",
            s.map(|s| s.misfire.clone()),
            d.misfire_policy.as_str().to_string(),
        );
        field(
            &mut c,
            "grace_ms",
            s.map(|s| s.grace_ms),
            d.misfire_grace_ms,
        );
        field(
            &mut c,
            "disabled",
            s.map(|s| !s.published_enabled),
            !d.enabled,
        );
        // The options compare as their file spellings (`None` for unset), so a default
        // equals an unset option and a change reads as the file writes it.
        field(
            &mut c,
            "jitter",
            s.map(|s| jitter_value(s.jitter_ms)),
            jitter_value(d.jitter_ms),
        );
        field(
            &mut c,
            "start_at",
            s.map(|s| instant_value(s.start_at_ms)),
            instant_value(d.start_at_ms),
        );
        field(
            &mut c,
            "end_at",
            s.map(|s| instant_value(s.end_at_ms)),
            instant_value(d.end_at_ms),
        );
        field(
            &mut c,
            "pause_after_failures",
            s.map(|s| s.pause_after_failures.map_or(Value::Null, Value::from)),
            d.outcome_policy
                .pause_after_failures
                .map_or(Value::Null, Value::from),
        );
        field(
            &mut c,
            "expect_success_within",
            s.map(|s| duration_value(s.expect_success_within_ms)),
            duration_value(d.outcome_policy.expect_success_within_ms),
        );
        field(
            &mut c,
            "overlap",
            s.map(|s| s.overlap.clone()),
            d.overlap_policy.as_str().to_string(),
        );
        if s.is_some() && owner != Some(t.source.as_str()) && opts.adopt {
            // Adopted: only the label changes (no new revision).
            field(
                &mut c,
                "source",
                Some(owner.map_or(Value::Null, Value::from)),
                Value::from(t.source.as_str()),
            );
        }
        let mut i = item("trigger", &d.trigger_id, c, s.is_some());
        i.note = match s {
            Some(s) if s.operator_disabled && s.disabled_by.as_deref() == Some("qlsched") => Some(
                "paused by qlsched after failures: apply leaves it paused (`trigger enable` ends it)"
                    .into(),
            ),
            Some(s) if s.operator_disabled => Some(
                "disabled by an operator: apply leaves it disabled (`trigger enable` ends it)"
                    .into(),
            ),
            _ => None,
        };
        items.push(i);
    }
    for s in stored
        .triggers
        .iter()
        .filter(|s| !s.deleted && !files.triggers.contains_key(&s.id))
    {
        let ours = s.source.as_ref().is_some_and(|l| files.sources.contains(l));
        let mut i = absent("trigger", &s.id);
        if ours && opts.prune {
            i.op = Op::Delete;
        } else if ours {
            i.note = Some(format!(
                "source `{}`: --prune deletes it",
                s.source.as_deref().unwrap_or_default()
            ));
        }
        items.push(i);
    }
    Plan { items }
}

/// A jitter as the files write it; none (0) is null, as an unset option.
fn jitter_value(ms: i64) -> Value {
    duration_value(Some(ms).filter(|&ms| ms != 0))
}

fn duration_value(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| options::duration_text(ms).into())
}

fn instant_value(ms: Option<i64>) -> Value {
    ms.map_or(Value::Null, |ms| options::instant_text(ms).into())
}

fn absent(kind: &'static str, id: &str) -> Item {
    Item {
        kind,
        id: id.to_string(),
        op: Op::Absent,
        changes: BTreeMap::new(),
        note: None,
    }
}
