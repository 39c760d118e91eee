//! `qlsched apply` writing its plan: one transaction for the whole input. It takes the apply
//! lock (two applies exclude each other; the wait is bounded and names the holder), reads
//! the stored definitions, plans against them and writes every create, update and delete
//! through the same store functions as `project set`, `task publish`, `trigger publish` and
//! `trigger delete`, each appending its audit row (source `apply`, the file's label) in the
//! same transaction. Nothing is written unless all of it commits: a refused item, too many
//! deletions or any failure rolls everything back.

use std::time::Duration;

use super::file::Definitions;
use super::plan::{self, Op, Plan};
use crate::db::StoreError;
use crate::store::audit::{self, Origin, Source};
use crate::store::definitions;
use crate::store::manage::{self, ManageError};
use crate::store::triggers;

/// How `qlsched apply` writes (its flags).
#[derive(Clone, Debug)]
pub struct Options {
    pub plan: plan::Options,
    /// Refuse, before writing, a plan that deletes more triggers than this.
    pub max_delete: usize,
    /// The bound on the wait for another apply's lock (and every lock wait after it).
    pub lock_wait: Duration,
    /// Who applies (the person, if known) and from where, for the audit rows.
    pub actor: Option<String>,
    pub host: Option<String>,
    /// `by` of a pruned trigger's deletion.
    pub by: String,
}

/// What an apply did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Applied {
    pub created: usize,
    pub updated: usize,
    pub deleted: usize,
}

/// Why an apply wrote nothing.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error(transparent)]
    Manage(#[from] ManageError),
    /// The plan refuses items (printed with the plan).
    #[error("{} item(s) refused (see the plan); nothing was written", .0)]
    Refused(usize),
    #[error("the plan deletes {count} triggers, more than --max-delete {max}; nothing was written (check the files and their source label, or raise --max-delete)")]
    TooManyDeletes { count: usize, max: usize },
}

impl From<tokio_postgres::Error> for ApplyError {
    fn from(e: tokio_postgres::Error) -> Self {
        ApplyError::Store(StoreError::Db(e))
    }
}

/// The advisory lock every apply holds for its transaction.
pub const LOCK: (&str, i64) = ("apply lock (`qlsched apply`)", definitions::APPLY_LOCK);

/// Plans `defs` against the database and writes the plan, in one transaction. The plan is
/// returned with the outcome, or with the error when nothing was written (`None` when the
/// error came before there was one: the lock, the connection).
pub async fn apply(
    client: &mut tokio_postgres::Client,
    defs: &Definitions,
    opts: &Options,
) -> (Option<Plan>, Result<Applied, ApplyError>) {
    let tx = match client.transaction().await {
        Ok(tx) => tx,
        Err(e) => return (None, Err(e.into())),
    };
    let bound = match definitions::lock_apply(&tx, opts.lock_wait).await {
        Ok(()) => None,
        Err((bound, e)) => Some((bound, e)),
    };
    if let Some((bound, e)) = bound {
        let _ = tx.rollback().await;
        let e = crate::db::locks::wait_error(client, e, "qlsched apply", LOCK, bound).await;
        return (None, Err(e.into()));
    }
    let stored = match definitions::read_in(&tx, None).await {
        Ok(s) => s,
        Err(e) => return (None, Err(e.into())),
    };
    let p = plan::plan(defs, &stored, opts.plan);
    let refused = p.count(Op::Refused);
    if refused > 0 {
        return (Some(p), Err(ApplyError::Refused(refused)));
    }
    let deletes = p.count(Op::Delete);
    if deletes > opts.max_delete {
        return (
            Some(p),
            Err(ApplyError::TooManyDeletes {
                count: deletes,
                max: opts.max_delete,
            }),
        );
    }
    let r = write(&tx, defs, &stored, &p, opts).await;
    let r = match r {
        Ok(applied) => tx.commit().await.map(|()| applied).map_err(Into::into),
        Err(e) => Err(e),
    };
    (Some(p), r)
}

/// Writes each item of `p` in the caller's transaction, declaring the audit origin (source
/// `apply`, the defining file's label) whenever the label changes.
async fn write(
    tx: &tokio_postgres::Transaction<'_>,
    defs: &Definitions,
    stored: &definitions::Stored,
    p: &Plan,
    opts: &Options,
) -> Result<Applied, ApplyError> {
    let mut declared: Option<String> = None;
    let mut applied = Applied::default();
    let labels: std::collections::HashMap<&str, Option<&String>> = stored
        .triggers
        .iter()
        .map(|t| (t.id.as_str(), t.source.as_ref()))
        .collect();
    for i in p
        .items
        .iter()
        .filter(|i| matches!(i.op, Op::Create | Op::Update | Op::Delete))
    {
        let label = match (i.kind, i.op) {
            ("project", _) => &defs.projects[&i.id].source,
            ("task", _) => &defs.tasks[&i.id].source,
            (_, Op::Delete) => labels
                .get(i.id.as_str())
                .copied()
                .flatten()
                .expect("only labelled triggers are pruned"),
            _ => &defs.triggers[&i.id].source,
        };
        if declared.as_ref() != Some(label) {
            let origin = Origin {
                actor: opts.actor.clone(),
                host: opts.host.clone(),
                source: Source::Apply,
                label: Some(label.clone()),
            };
            audit::declare(tx, &origin).await?;
            declared = Some(label.clone());
        }
        match (i.kind, i.op) {
            ("project", _) => {
                let d = &defs.projects[&i.id];
                manage::set_project_in(tx, &d.id, d.status.as_str()).await?;
            }
            ("task", _) => {
                let d = &defs.tasks[&i.id];
                manage::publish_task_in(tx, &d.project, &d.id, &d.spec).await?;
            }
            (_, Op::Delete) => {
                triggers::delete_in(tx, &i.id, &opts.by).await?;
            }
            _ => {
                let d = &defs.triggers[&i.id];
                let unlabelled = matches!(labels.get(i.id.as_str()), Some(None));
                // An unlabelled trigger stays unlabelled unless --adopt (the plan refused
                // another source's without it).
                let label = Some(d.source.as_str()).filter(|_| !unlabelled || opts.plan.adopt);
                manage::publish_trigger_in(tx, &d.spec, label).await?;
            }
        }
        match i.op {
            Op::Create => applied.created += 1,
            Op::Update => applied.updated += 1,
            _ => applied.deleted += 1,
        }
    }
    Ok(applied)
}
