//! The read-only views of the cluster, as serde structs: one query layer for the CLI's
//! `--json` (`status`, `trigger list`, `trigger show`, `runs list`), the web console's pages
//! and its JSON under `/api/v1/` (src/console). Every query is bounded: keyset pages of at
//! most [`PAGE_MAX`] rows on an index, and windows capped by a `LIMIT`.

use serde::Serialize;

use super::manage::ProjectStatus;
use super::status::{RUN_KINDS, RUN_KIND_SQL};
use super::triggers::{self, ListQuery, StateFilter, TriggerView};
use crate::db::StoreError;
use crate::db_now_ms;
use crate::schedule::Schedule;

/// The largest keyset page the console and the API serve.
pub const PAGE_MAX: i64 = 100;

/// The next occurrence the cron will admit: the cursor, or (not yet decided) the first
/// after now; none while the trigger cannot fire.
pub fn next_fire(v: &TriggerView) -> Option<i64> {
    if !v.enabled || v.project_status != ProjectStatus::Active || v.ended {
        return None;
    }
    v.next_fire_at_ms.or_else(|| {
        Schedule::parse(&v.cron_expr, &v.timezone)
            .ok()?
            .next_after_ms(v.now_ms)
    })
}

/// One page of triggers as stored, and the id to continue after.
#[derive(Clone, Debug)]
pub struct TriggerRows {
    pub triggers: Vec<TriggerView>,
    pub next_after: Option<String>,
}

/// Which triggers a page shows.
#[derive(Clone, Copy, Debug)]
pub struct TriggerFilter<'a> {
    pub project: Option<&'a str>,
    pub state: StateFilter,
    /// Only ids starting with this (the console's search).
    pub prefix: Option<&'a str>,
    pub after: Option<&'a str>,
    pub limit: i64,
}

/// How many ids a filtered page walks at most ([`trigger_rows`] with `walk`).
pub const WALK_CAP: i64 = 10_000;

/// One page of live triggers in id order (keyset on the id). Without `walk` (the CLI) the
/// page walks the index until `limit` rows matched. With `walk` (the console and the API)
/// an id-prefix or state filter searches a stretch of at most [`WALK_CAP`] ids from the
/// cursor: a page may then hold fewer rows than `limit` while `next_after` (the last id
/// looked at) continues the walk, so a filter that matches few triggers never reads the
/// whole table in one request.
pub async fn trigger_rows(
    client: &impl tokio_postgres::GenericClient,
    f: &TriggerFilter<'_>,
    walk: bool,
) -> Result<TriggerRows, StoreError> {
    let q = ListQuery {
        project: f.project,
        state: f.state,
        after: f.after,
        limit: f.limit,
    };
    let filtered = f.prefix.is_some() || f.state != StateFilter::All;
    if walk && filtered {
        let ids = triggers::walk_ids(client, f.project, f.after, f.prefix, WALK_CAP).await?;
        let page = triggers::list_among(client, &q, &ids, f.prefix).await?;
        let next_after = if page.len() as i64 == f.limit && f.limit > 0 {
            Some(page[page.len() - 1].trigger_id.clone())
        } else if ids.len() as i64 == WALK_CAP {
            ids.last().cloned()
        } else {
            None
        };
        return Ok(TriggerRows {
            triggers: page,
            next_after,
        });
    }
    let page = triggers::list_with_prefix(client, &q, f.prefix).await?;
    let next_after = (page.len() as i64 == f.limit && f.limit > 0)
        .then(|| page[page.len() - 1].trigger_id.clone());
    Ok(TriggerRows {
        triggers: page,
        next_after,
    })
}

/// One admitted run.
#[derive(Clone, Debug, Serialize)]
pub struct RunItem {
    pub run_id: String,
    pub trigger_id: String,
    pub idempotency_key: String,
    /// `cron`, `manual` or `backfill`.
    pub kind: String,
    pub status: String,
    pub scheduled_for_ms: i64,
    pub queued_at_ms: Option<i64>,
    /// The jittered instant the occurrence was due at (a trigger with a jitter only,
    /// docs/policies-jitter.md); `scheduled_for_ms` stays the nominal instant.
    pub due_at_ms: Option<i64>,
    /// `queued_at − due_at` (`− scheduled_for` without a jitter).
    pub lag_ms: Option<i64>,
    pub admitted_by: String,
}

/// Which runs a page shows: newest admission first, keyset on `(queued_at_ms, run_id)`.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunFilter<'a> {
    pub trigger: Option<&'a str>,
    /// `cron`, `manual` or `backfill`.
    pub kind: Option<&'a str>,
    pub status: Option<&'a str>,
    /// Continue below this run (the `next_before` of the previous page).
    pub before: Option<(i64, uuid::Uuid)>,
    pub limit: i64,
}

/// `runs list --json`: one page and the cursor of the next (`QUEUED_AT_MS:RUN_ID`).
#[derive(Clone, Debug, Serialize)]
pub struct RunsPage {
    pub runs: Vec<RunItem>,
    pub next_before: Option<String>,
}

/// Parses a `next_before` cursor.
pub fn parse_run_cursor(s: &str) -> Option<(i64, uuid::Uuid)> {
    let (q, id) = s.split_once(':')?;
    Some((q.parse().ok()?, uuid::Uuid::parse_str(id).ok()?))
}

/// The select list of a [`RunItem`] over `qlsched.runs r`, each column named as its field.
fn run_columns() -> String {
    format!(
        "r.run_id::text AS run_id, r.trigger_id, r.idempotency_key, {RUN_KIND_SQL} AS kind,
         r.status, r.scheduled_for_ms, r.queued_at_ms, r.due_at_ms,
         r.queued_at_ms - coalesce(r.due_at_ms, r.scheduled_for_ms) AS lag_ms, r.admitted_by"
    )
}

/// A [`RunItem`] from a row selected with [`run_columns`].
fn run_item(r: &tokio_postgres::Row) -> RunItem {
    RunItem {
        run_id: r.get("run_id"),
        trigger_id: r.get("trigger_id"),
        idempotency_key: r.get("idempotency_key"),
        kind: r.get("kind"),
        status: r.get("status"),
        scheduled_for_ms: r.get("scheduled_for_ms"),
        queued_at_ms: r.get("queued_at_ms"),
        due_at_ms: r.get("due_at_ms"),
        lag_ms: r.get("lag_ms"),
        admitted_by: r.get("admitted_by"),
    }
}

/// One page of runs, newest admission first: `runs_queued_at_idx` read backwards from the
/// cursor (the order is the index's, `DESC` = `DESC NULLS FIRST`, so no sort of the table),
/// or a trigger's runs through `runs_trigger_idx`, stopping after `limit` rows that pass
/// the filters. Every admission sets `queued_at_ms`; a row without one is not listed.
pub async fn run_page(
    client: &impl tokio_postgres::GenericClient,
    f: &RunFilter<'_>,
) -> Result<RunsPage, StoreError> {
    let (bq, bid) = match f.before {
        Some((q, id)) => (Some(q), Some(id)),
        None => (None, None),
    };
    let sql = format!(
        "SELECT {}, r.run_id AS run_uuid
           FROM qlsched.runs r
          WHERE r.queued_at_ms IS NOT NULL
            AND ($1::text IS NULL OR r.trigger_id = $1)
            AND ($2::text IS NULL OR ({RUN_KIND_SQL}) = $2)
            AND ($3::text IS NULL OR r.status = $3)
            AND r.queued_at_ms <= coalesce($4::bigint, 9223372036854775807)
            AND ($4::bigint IS NULL OR r.queued_at_ms < $4 OR r.run_id < $5)
          ORDER BY r.queued_at_ms DESC, r.run_id DESC LIMIT $6",
        run_columns()
    );
    let rows = client
        .query(&sql, &[&f.trigger, &f.kind, &f.status, &bq, &bid, &f.limit])
        .await?;
    let runs: Vec<RunItem> = rows.iter().map(run_item).collect();
    let next_before = match rows.last() {
        Some(last) if rows.len() as i64 == f.limit => last
            .get::<_, Option<i64>>("queued_at_ms")
            .map(|q| format!("{q}:{}", last.get::<_, uuid::Uuid>("run_uuid"))),
        _ => None,
    };
    Ok(RunsPage { runs, next_before })
}

/// One minute of admissions: how many, and their lag percentiles.
#[derive(Clone, Debug, Serialize)]
pub struct MinuteBucket {
    pub minute_start_ms: i64,
    pub admitted: i64,
    pub lag_p50_ms: Option<f64>,
    pub lag_p99_ms: Option<f64>,
}

/// The last hour of admissions per minute, from runs' `queued_at_ms − scheduled_for_ms`.
#[derive(Clone, Debug, Serialize)]
pub struct AdmissionHistory {
    /// Oldest first; minutes without admissions are absent.
    pub minutes: Vec<MinuteBucket>,
    /// The start of the window's first minute: the 60 whole minutes up to the end of the
    /// current one.
    pub window_start_ms: i64,
    pub now_ms: i64,
    /// Of which kind (`cron` unless asked otherwise).
    pub kind: String,
    /// Only the newest [`HISTORY_CAP`] admissions of the hour were read (a busier hour
    /// shows its last part only).
    pub capped: bool,
    /// Where this read started (a minute boundary): the window's start, or the `since` the
    /// caller already knew the minutes before of.
    #[serde(skip)]
    pub read_from_ms: i64,
}

/// Most runs one history reads.
pub const HISTORY_CAP: i64 = 200_000;

/// Admissions per minute and lag p50/p99 over the last hour: a range of
/// `runs_queued_at_idx` read backwards, at most [`HISTORY_CAP`] rows. With `since_ms` (a
/// minute boundary) only the minutes from there on are read: the caller holds the earlier
/// ones (the console keeps the minutes that ended over a minute ago).
pub async fn admission_history(
    client: &impl tokio_postgres::GenericClient,
    kind: &str,
    since_ms: Option<i64>,
) -> Result<AdmissionHistory, StoreError> {
    let sql = format!(
        "WITH n AS MATERIALIZED (SELECT {now} AS ms),
              b AS MATERIALIZED (SELECT (ms / 60000) * 60000 - 3540000 AS start FROM n),
              f AS MATERIALIZED (SELECT greatest(b.start, coalesce($3::bigint, b.start)) AS lo FROM b),
              w AS (SELECT r.queued_at_ms AS q, r.queued_at_ms - r.scheduled_for_ms AS lag
                      FROM qlsched.runs r
                     WHERE r.queued_at_ms >= (SELECT lo FROM f)
                       AND ({RUN_KIND_SQL}) = $1
                     ORDER BY r.queued_at_ms DESC LIMIT $2)
         SELECT (SELECT ms FROM n), (SELECT start FROM b), (SELECT lo FROM f), (SELECT count(*) FROM w),
                x.m, x.c, x.p50, x.p99
           FROM (SELECT (q / 60000) * 60000 AS m, count(*) AS c,
                        percentile_cont(0.5) WITHIN GROUP (ORDER BY lag) AS p50,
                        percentile_cont(0.99) WITHIN GROUP (ORDER BY lag) AS p99
                   FROM w GROUP BY 1) x
          RIGHT JOIN (SELECT 1) one ON true
          ORDER BY x.m",
        now = db_now_ms!()
    );
    let rows = client
        .query(&sql, &[&kind, &HISTORY_CAP, &since_ms])
        .await?;
    // Always one row at least (the right join); its first columns are the clock and bounds.
    let head = |i: usize| rows.first().map(|r| r.get::<_, i64>(i)).unwrap_or_default();
    let (now_ms, window_start_ms, read_from_ms, read) = (head(0), head(1), head(2), head(3));
    let minutes = rows
        .iter()
        .filter_map(|r| {
            Some(MinuteBucket {
                minute_start_ms: r.get::<_, Option<i64>>(4)?,
                admitted: r.get(5),
                lag_p50_ms: r.get(6),
                lag_p99_ms: r.get(7),
            })
        })
        .collect();
    Ok(AdmissionHistory {
        minutes,
        window_start_ms,
        now_ms,
        kind: kind.into(),
        capped: read >= HISTORY_CAP,
        read_from_ms,
    })
}

/// Whether `kind` is one [`RUN_KIND_SQL`] yields.
pub fn is_run_kind(kind: &str) -> bool {
    RUN_KINDS.contains(&kind)
}

/// The statuses a run can have.
pub const RUN_STATUSES: [&str; 6] = [
    "queued",
    "dispatching",
    "running",
    "succeeded",
    "failed",
    "cancelled",
];

/// `runs show RUN`: one run with every attempt and event.
#[derive(Clone, Debug, Serialize)]
pub struct RunDetail {
    #[serde(flatten)]
    pub run: RunItem,
    pub cancelled: bool,
    pub execution_revision_id: String,
    pub attempts: Vec<AttemptItem>,
    pub events: Vec<EventItem>,
}

/// One attempt of a run (attempt_no 1, 2, …: later ones come from the dispatcher protocol's
/// retries of lost attempts).
#[derive(Clone, Debug, Serialize)]
pub struct AttemptItem {
    pub attempt_no: i32,
    pub state: String,
    pub worker_id: Option<String>,
    pub lease_expires_at_ms: Option<i64>,
    pub not_before_ms: Option<i64>,
    pub started_at_ms: Option<i64>,
    pub finished_at_ms: Option<i64>,
    pub exit_status: Option<i32>,
    pub error: Option<String>,
    pub result: Option<serde_json::Value>,
    pub output_tail: Option<String>,
}

/// One event of a run.
#[derive(Clone, Debug, Serialize)]
pub struct EventItem {
    pub seq: i32,
    pub kind: String,
    pub at_ms: i64,
}

/// The run `run_id` with its attempts and events (None: no such run), read in one
/// REPEATABLE READ snapshot so the three agree ([`run_detail_in`]).
pub async fn run_detail(
    client: &mut tokio_postgres::Client,
    run_id: uuid::Uuid,
) -> Result<Option<RunDetail>, StoreError> {
    let tx = super::snapshot(client).await?;
    let d = run_detail_in(&tx, run_id).await?;
    tx.rollback().await?;
    Ok(d)
}

/// The run `run_id` with its attempts and events, read in the caller's transaction (`runs
/// show`'s snapshot, or the console's transaction: each attempt's output tail and error as
/// `dispatch_finish` recorded them). Locking: plain reads, by the primary key of runs and the
/// `(run_id, …)` keys of attempts and events.
pub async fn run_detail_in(
    tx: &impl tokio_postgres::GenericClient,
    run_id: uuid::Uuid,
) -> Result<Option<RunDetail>, StoreError> {
    let sql = format!(
        "SELECT {}, r.cancelled, r.execution_revision_id::text AS execution_revision_id
           FROM qlsched.runs r WHERE r.run_id = $1",
        run_columns()
    );
    let Some(r) = tx.query_opt(&sql, &[&run_id]).await? else {
        return Ok(None);
    };
    let attempts = tx
        .query(
            "SELECT attempt_no, state, worker_id, lease_expires_at_ms, not_before_ms,
                    started_at_ms, finished_at_ms, exit_status, error, result, output_tail
               FROM qlsched.attempts WHERE run_id = $1 ORDER BY attempt_no",
            &[&run_id],
        )
        .await?
        .iter()
        .map(|a| AttemptItem {
            attempt_no: a.get("attempt_no"),
            state: a.get("state"),
            worker_id: a.get("worker_id"),
            lease_expires_at_ms: a.get("lease_expires_at_ms"),
            not_before_ms: a.get("not_before_ms"),
            started_at_ms: a.get("started_at_ms"),
            finished_at_ms: a.get("finished_at_ms"),
            exit_status: a.get("exit_status"),
            error: a.get("error"),
            result: a.get("result"),
            output_tail: a.get("output_tail"),
        })
        .collect();
    let events = tx
        .query(
            "SELECT seq, kind, at_ms FROM qlsched.run_events WHERE run_id = $1 ORDER BY seq",
            &[&run_id],
        )
        .await?
        .iter()
        .map(|e| EventItem {
            seq: e.get("seq"),
            kind: e.get("kind"),
            at_ms: e.get("at_ms"),
        })
        .collect();
    Ok(Some(RunDetail {
        run: run_item(&r),
        cancelled: r.get("cancelled"),
        execution_revision_id: r.get("execution_revision_id"),
        attempts,
        events,
    }))
}
