//! The exact grants of each role kind (docs/design.md, "Roles and grants"), as tables, and
//! what the catalog says a role holds.

use super::manifest::{Grant, Object};
use crate::db::{StoreError, SCHEMA};

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
pub const GRANTS: [(&str, &[&str], &[&str]); 18] = [
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
    // Trigger outcomes (V19): `trigger show/list` and the console read them, the replicas'
    // gauges count overdue and system-paused triggers. Only the owner writes them, through
    // the triggers of V19 (docs/policies-outcome.md): no role updates a summary by hand.
    ("trigger_outcomes", &["SELECT"], &["SELECT"]),
    // Overlap state (V21): `trigger show` and the console read it; only the owner's
    // functions write it (row triggers on runs, and overlap_adopt below).
    ("trigger_overlap", &["SELECT"], &["SELECT"]),
    // The audit log (V22, docs/audit.md): read by `qlsched audit` (admin) and the console
    // (runtime); appended through the column-level INSERT of [`COLUMN_GRANTS`]; never updated
    // or deleted by either (retention removes old rows through `prune_audit`).
    ("audit_log", &["SELECT"], &["SELECT"]),
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
pub const COLUMN_GRANTS: [(&str, &str, &str, &[&str]); 7] = [
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
    // The audit log (V22): a row names who and what; the database fills in its id, its time
    // (at_ms) and its session_user (db_user), which no role may set. The admin role appends
    // for every operator command; the runtime role for the replicas' own actions (a system
    // pause) and the console's.
    ("admin", "audit_log", "INSERT", AUDIT_COLUMNS),
    ("runtime", "audit_log", "INSERT", AUDIT_COLUMNS),
];

/// The columns of `qlsched.audit_log` a role may give when it appends (V22).
pub const AUDIT_COLUMNS: &[&str] = &[
    "actor",
    "host",
    "source",
    "source_label",
    "object_kind",
    "object_id",
    "project_id",
    "action",
    "changes",
    "note",
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
/// the take of `qlsched worker` (docs/worker.md) before V18; `dispatch_take_batch` (V18) is
/// its take from V18 on. `dispatch_take_start` and `dispatch_finish_batch` (V25) are its take,
/// which starts the runs it takes, and its finish of several attempts in one call, from V25 on.
/// `spec_pool` and `spec_executor` (V16, V17) compute V18's generated
/// columns of `execution_revisions`, evaluated as the role that inserts a revision: the admin
/// role's (`task publish`); they only read the text they are given.
///
/// Not here, because no role may call them: the trigger functions of V19,
/// `qlsched.trigger_outcome_of_run()` (a deferred trigger on runs reaching succeeded, failed or
/// cancelled: reached by the dispatcher role finishing or expiring a run, and by the admin role
/// cancelling one) and `qlsched.trigger_outcome_follows_trigger()` (on triggers: reached by the
/// admin role's publish, disable, enable and delete). Both are SECURITY DEFINER, so they write
/// `trigger_outcomes` (and, for a pause, the trigger and its schedule row) as the owner;
/// PostgreSQL checks EXECUTE on a trigger function only when the trigger is created.
///
/// `overlap_adopt` (V21) is `trigger
/// publish`'s (admin role) when a trigger's overlap policy becomes other than allow: it
/// marks the trigger's unfinished runs counted. `overlap_prune_skips` (V21) is the
/// pruning replica's (runtime role): recorded skip instants older than its horizon go. The overlap decision (`overlap_admit`) and
/// a run end's count and buffered admission (`overlap_run_ended`) are SECURITY DEFINER row
/// triggers on runs: no role executes them, they run as the owner inside whichever role's
/// insert or status change fires them (the runtime's admission, the admin's fire, backfill
/// and `runs cancel`, the dispatcher's protocol calls); docs/design.md, "Overlap".
/// `overlap_decide` and `overlap_undo` (V26) are the admission's (runtime role): the
/// statement decides forbid and buffer_one itself, reading and writing the overlap rows
/// through the first in one UPDATE per batch, and the second lowers a count raised for a run
/// whose key turned out taken. `overlap_decide_with` and `overlap_release` (V28) are the
/// same for a count kept partly on the schedule row: the decision given that part, and the
/// undo of a run counted there.
pub const EXECUTE_GRANTS: [(&str, &str); 28] = [
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
    (
        "qlsched.dispatch_take_batch(text,text[],text[],integer,bigint)",
        "dispatcher",
    ),
    (
        "qlsched.dispatch_take_start(text,text[],text[],integer,bigint)",
        "dispatcher",
    ),
    (
        "qlsched.dispatch_finish_batch(uuid[],uuid[],text[],integer[],text[],text[],jsonb[])",
        "dispatcher",
    ),
    ("qlsched.request_cancel(uuid[])", "admin"),
    ("qlsched.spec_pool(text)", "admin"),
    ("qlsched.spec_executor(text)", "admin"),
    ("qlsched.overlap_adopt(text)", "admin"),
    ("qlsched.overlap_prune_skips(bigint)", "runtime"),
    // The admission's overlap decision and write (V26), once per batch, and its undo.
    (
        "qlsched.overlap_decide(tid[],text[],text[],text[],boolean[],bigint[])",
        "runtime",
    ),
    ("qlsched.overlap_undo(text[])", "runtime"),
    // V28: the decision on the count kept partly on the schedule row, and the undo of a run
    // counted there.
    (
        "qlsched.overlap_decide_with(tid[],text[],text[],text[],boolean[],bigint[],bigint[])",
        "runtime",
    ),
    ("qlsched.overlap_release(text[])", "runtime"),
    // Retention of the audit log (V22), under the replicas' 'prune' lease.
    ("qlsched.prune_audit(bigint,integer,text,uuid)", "runtime"),
    // The console's operator actions (V24, docs/console.md "Actions"): a replica serves the
    // console as the runtime role and holds no admin credentials; each action is one of
    // these narrow functions, with its CLI command's checks and one audit row.
    ("qlsched.console_disable(text,text,text,text)", "runtime"),
    (
        "qlsched.console_enable(text,bigint,bigint,text,text)",
        "runtime",
    ),
    (
        "qlsched.console_fire(text,text,uuid,uuid,uuid,text,text,text)",
        "runtime",
    ),
    (
        "qlsched.console_backfill(text,bigint,bigint[],uuid[],uuid[],text,text,text)",
        "runtime",
    ),
    (
        "qlsched.console_cancel_queued(text,bigint,bigint,text,text,text)",
        "runtime",
    ),
    (
        "qlsched.console_request_cancel(uuid,text,text,text)",
        "runtime",
    ),
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
pub(super) fn table_grants_of(grants: &[Grant], kind: &str) -> Vec<(String, String)> {
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
