//! The console's HTML (maud: every `(value)` is escaped). No inline script or style: the
//! stylesheet and the script are static files (`/static/…`).

use maud::{html, Markup, DOCTYPE};

use super::charts::{self, Series};
use super::{AuditQuery, Overview, RunsQuery, TriggersQuery};
use crate::present as render;
use crate::present::triggers::{
    holder, outcome_lines, outcome_mark, overlap_mark, overlap_text, state_text, timing_text,
    TriggerDetail, TriggerItem, TriggerPage,
};
use crate::store::audit::AuditPage;
use crate::store::browse::{self, RunDetail, RunsPage};

#[derive(Clone, Copy, PartialEq, Eq)]
enum Nav {
    Overview,
    Triggers,
    Runs,
    Audit,
    None,
}

fn layout(title: &str, nav: Nav, body: Markup) -> String {
    let item = |n: Nav, href: &str, text: &str| {
        html! {
            li { a href=(href) aria-current=[(n == nav).then_some("page")] { (text) } }
        }
    };
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                meta name="referrer" content="no-referrer";
                title { (title) " · qlsched" }
                link rel="icon" href="/static/icon.svg" type="image/svg+xml";
                link rel="stylesheet" href="/static/console.css";
                script src="/static/console.js" defer {}
            }
            body {
                header {
                    span.brand { "qlsched" }
                    nav aria-label="Main" {
                        ul {
                            (item(Nav::Overview, "/", "Overview"))
                            (item(Nav::Triggers, "/triggers", "Triggers"))
                            (item(Nav::Runs, "/runs", "Runs"))
                            (item(Nav::Audit, "/audit", "Audit"))
                        }
                    }
                }
                main id="main" {
                    h1 { (title) }
                    (body)
                }
                footer {
                    span { "Times in UTC unless marked local. " }
                    span id="refresh-slot" {}
                }
            }
        }
    }
    .into_string()
}

/// What an action did, or the confirmation it asks for (src/console/actions.rs).
pub fn action_page(title: &str, body: Markup) -> String {
    layout(title, Nav::None, body)
}

pub fn error_page(status: u16, message: &str) -> String {
    layout(
        &format!("Error {status}"),
        Nav::None,
        html! { p.error role="alert" { (message) } },
    )
}

fn ms_opt(v: Option<f64>) -> String {
    v.map(|x| format!("{x:.0} ms"))
        .unwrap_or_else(|| "-".into())
}

fn age(ms: Option<i64>) -> String {
    render::span(ms)
}

pub fn overview(o: &Overview) -> String {
    let s = &o.status;
    let h = &o.admissions;
    // The hour up to the end of the current minute, so the last bar fits.
    let end = (h.now_ms / 60_000 + 1) * 60_000;
    let x = ((end - 3_600_000) as f64, end as f64);
    let labels = ("−60 min", "now");
    let admitted: Vec<(f64, f64)> = h
        .minutes
        .iter()
        .map(|m| (m.minute_start_ms as f64, m.admitted as f64))
        .collect();
    let p50: Vec<(f64, f64)> = h
        .minutes
        .iter()
        .filter_map(|m| Some((m.minute_start_ms as f64 + 30_000.0, m.lag_p50_ms?)))
        .collect();
    let p99: Vec<(f64, f64)> = h
        .minutes
        .iter()
        .filter_map(|m| Some((m.minute_start_ms as f64 + 30_000.0, m.lag_p99_ms?)))
        .collect();
    let body = html! {
        p.meta { "Served by replica " strong { (o.served_by.replica_id) } ", version " (o.served_by.version) "." }
        section aria-labelledby="replicas-h" {
            h2 id="replicas-h" { "Replicas" }
            table.sortable {
                thead { tr { th { "Replica" } th { "Version" } th { "Ready" } th { "Host:pid" } th.num { "Last heartbeat" } th.num { "Live leases" } } }
                tbody {
                    @for r in &s.replicas {
                        tr {
                            td { (r.replica_id) }
                            td { (r.binary_version.as_deref().unwrap_or("-")) }
                            td { @if r.live { span.ok { "live" } } @else { span.bad { "gone" } } }
                            td { (r.hostname) ":" (r.pid) }
                            td.num { (age(Some(r.heartbeat_age_ms))) " ago" }
                            td.num { (r.live_claims) }
                        }
                    }
                }
            }
            p.note { "Version: what each replica recorded when it started (\"-\": a binary from before it recorded one); ready = heartbeat not expired and not stopped." }
        }
        section aria-labelledby="backlog-h" {
            h2 id="backlog-h" { "Backlog" }
            dl.facts {
                dt { "Due backlog" } dd id="due-backlog" { (s.due_backlog) }
                dt { "Oldest due" } dd { (age(s.oldest_due_age_ms)) }
                dt { "Live leases" } dd { (s.live_claims) }
            }
        }
        section aria-labelledby="adm-h" {
            h2 id="adm-h" { "Admissions, last hour (cron)" }
            @if h.capped { p.note { "Only the newest " (browse::HISTORY_CAP) " admissions of the hour were read." } }
            figure {
                (charts::bars("Cron admissions per minute", "", &admitted, x, 60_000.0, labels))
                figcaption { "Admissions per minute" }
            }
            figure {
                (charts::lines("Cron lag p50 and p99 per minute", " ms", &[
                    Series { class: "p50", label: "p50", points: p50 },
                    Series { class: "p99", label: "p99", points: p99 },
                ], x, labels))
                figcaption { "Lag (queued − scheduled) p50 / p99 per minute" }
            }
            table {
                caption { "Per kind: admissions in the last minute; lag over the kind's last 1000 runs among the newest " (super::STATUS_SCAN) " admissions" }
                thead { tr { th { "Kind" } th.num { "Admitted last minute" } th.num { "Lag p50" } th.num { "Lag p99" } th.num { "Over runs" } } }
                tbody {
                    @for (kind, k) in [("cron", &s.by_kind.cron), ("manual", &s.by_kind.manual), ("backfill", &s.by_kind.backfill)] {
                        tr { td { (kind) } td.num { (k.admitted_last_minute) } td.num { (ms_opt(k.lag_p50_ms)) } td.num { (ms_opt(k.lag_p99_ms)) } td.num { (k.lag_sample) } }
                    }
                }
            }
        }
        section aria-labelledby="ref-h" {
            h2 id="ref-h" { "Refusals and back-offs by cause" }
            p.note { "Counted by this replica since it started (its Prometheus counters); other replicas: their /metrics." }
            table {
                thead { tr { th { "Cause" } th.num { "Count" } th { "Metric" } th { "Meaning" } } }
                tbody {
                    @for r in &o.refusals {
                        tr { td { (r.cause) } td.num { (r.count) } td { code { (r.metric) } } td.wrap { (r.meaning) } }
                    }
                }
            }
        }
        section aria-labelledby="ret-h" {
            h2 id="ret-h" { "Retention" }
            p id="retention" { (s.retention.render()) }
        }
    };
    layout("Overview", Nav::Overview, body)
}

fn trigger_link(id: &str) -> Markup {
    html! { a href=(format!("/triggers/{id}")) { (id) } }
}

fn qs(pairs: &[(&str, Option<&str>)]) -> String {
    let mut out = String::new();
    for (k, v) in pairs {
        if let Some(v) = v.filter(|v| !v.is_empty()) {
            out.push(if out.is_empty() { '?' } else { '&' });
            out.push_str(k);
            out.push('=');
            out.push_str(&encode(v));
        }
    }
    out
}

/// Percent-encodes a query value.
fn encode(v: &str) -> String {
    v.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

pub fn triggers(q: &TriggersQuery, limit: i64, page: &TriggerPage) -> String {
    let state = q.state.as_deref().unwrap_or("all");
    let limit_s = limit.to_string();
    let body = html! {
        form.filters method="get" action="/triggers" role="search" {
            label { "Id prefix " input type="search" name="q" value=[q.q.as_deref()] autocomplete="off"; }
            label { "Project " input type="text" name="project" value=[q.project.as_deref()] autocomplete="off"; }
            label { "State "
                select name="state" {
                    @for s in ["all", "enabled", "disabled", "overdue"] {
                        option value=(s) selected[s == state] { (s) }
                    }
                }
            }
            input type="hidden" name="limit" value=(limit_s);
            button type="submit" { "Filter" }
        }
        @if page.triggers.is_empty() {
            p.empty { "No triggers match." }
        } @else {
            table.sortable id="triggers" {
                thead { tr {
                    th { "Id" } th { "Project" } th { "Task" } th { "Cron" } th { "Zone" } th { "State" }
                    th { "Next (UTC)" } th { "Next (zone)" } th { "Last admitted" } th.num { "Lag" } th { "Held by" } th { "Outcome" }
                } }
                tbody {
                    @for t in &page.triggers { (trigger_row(t)) }
                }
            }
        }
        @if page.next_after.is_some() && (page.triggers.len() as i64) < limit {
            p.note { "A filtered page searches " (browse::WALK_CAP) " triggers at a time; more may match further on." }
        }
        nav.paging aria-label="Pages" {
            @if q.after.as_deref().is_some_and(|a| !a.is_empty()) {
                a href=(format!("/triggers{}", qs(&[("q", q.q.as_deref()), ("project", q.project.as_deref()), ("state", Some(state)), ("limit", Some(&limit_s))]))) { "First page" }
            }
            @if let Some(next) = &page.next_after {
                a rel="next" href=(format!("/triggers{}", qs(&[("q", q.q.as_deref()), ("project", q.project.as_deref()), ("state", Some(state)), ("limit", Some(&limit_s)), ("after", Some(next))]))) { "Next page →" }
            }
        }
    };
    layout("Triggers", Nav::Triggers, body)
}

fn trigger_row(t: &TriggerItem) -> Markup {
    let v = &t.view;
    html! {
        tr {
            td { (trigger_link(&v.trigger_id)) }
            td { (v.project_id) }
            td { (v.task_id) }
            td { code { (v.cron_expr) } }
            td { (v.timezone) }
            td.wrap { (state_text(v)) (overlap_mark(v)) }
            td { (t.next_fire_utc.as_deref().unwrap_or("-")) }
            td { (t.next_fire_local.as_deref().unwrap_or("-")) }
            td { (render::utc(v.last_scheduled_at_ms)) }
            td.num { (render::span(v.last_lag_ms)) }
            td { (holder(v)) }
            td.outcome { @if v.outcome.overdue { strong.overdue { "overdue " } } (outcome_mark(&v.outcome)) }
        }
    }
}

pub fn trigger(d: &TriggerDetail, actions: Markup) -> String {
    let v = &d.item.view;
    let mut lag: Vec<(f64, f64)> = d
        .runs
        .iter()
        .filter_map(|r| Some((r.scheduled_for_ms as f64, r.lag_ms? as f64)))
        .collect();
    lag.sort_by(|a, b| a.0.total_cmp(&b.0));
    let x = (
        lag.first().map_or(0.0, |p| p.0),
        lag.last().map_or(1.0, |p| p.0),
    );
    let first = render::utc(lag.first().map(|p| p.0 as i64));
    let last = render::utc(lag.last().map(|p| p.0 as i64));
    let body = html! {
        section aria-labelledby="def-h" {
            h2 id="def-h" { "Definition" }
            dl.facts {
                dt { "Revision" } dd { (v.revision) }
                dt { "Project" } dd { (v.project_id) " (" (v.project_status) ")" }
                dt { "Task" } dd { (v.task_id) }
                dt { "Cron" } dd { code { (v.cron_expr) } " in " (v.timezone) }
                dt { "Misfire" } dd { (v.misfire_policy) " (grace " (v.misfire_grace_ms) " ms)" }
                dt { "Overlap" } dd id="overlap" { (overlap_text(v)) }
                dt { "State" } dd id="state" { (state_text(v)) }
                dt { "Jitter, window" } dd id="timing" { (timing_text(v)) }
                @if let (Some(at), Some(by)) = (v.disabled_at_ms, &v.disabled_by) {
                    dt { "Last disable" } dd id="disable-note" {
                        (render::utc(Some(at))) " by " (by)
                        @if let Some(n) = &v.disabled_note { ": " q { (n) } }
                    }
                }
                @if let (Some(at), Some(by)) = (v.enabled_at_ms, &v.enabled_by) {
                    dt { "Last enable" } dd { (render::utc(Some(at))) " by " (by) }
                }
                dt { "Cursor" } dd {
                    @match v.next_fire_at_ms {
                        Some(c) => { (render::utc(Some(c))) " · " (render::local(Some(c), &v.timezone)) }
                        None => { "- (decided at the next claim)" }
                    }
                    @if let Some(due) = &d.item.next_due_utc { " · due " (due) " (jittered)" }
                }
                dt { "Last admitted" } dd { (render::utc(v.last_scheduled_at_ms)) " (lag " (render::span(v.last_lag_ms)) ")" }
                dt { "Lease" } dd { (holder(v)) " (claim version " (v.claim_version) ", state version " (v.state_version) ")" }
            }
        }
        (actions)
        section aria-labelledby="outcome-h" {
            h2 id="outcome-h" { "Outcome" @if v.outcome.overdue { " " strong.overdue id="overdue" { "overdue" } } }
            dl.facts id="outcome" {
                @for (label, text) in outcome_lines(&v.outcome) {
                    dt { (label) } dd { (text) }
                }
            }
        }
        section aria-labelledby="next-h" {
            h2 id="next-h" { "Next " (d.upcoming.len()) " occurrences" }
            @if d.upcoming.is_empty() {
                p.empty { "None while the trigger is disabled." }
            } @else {
                table id="upcoming" {
                    thead { tr { th { "UTC" } th { "In " (v.timezone) } th { "DST" } @if v.jitter_ms > 0 { th { "Due (jittered)" } } } }
                    tbody {
                        @for o in &d.upcoming {
                            tr {
                                td { (o.utc) } td { (o.local) } td { @if let Some(m) = &o.dst { span.dst { "offset " (m) } } }
                                @if v.jitter_ms > 0 { td { (o.due_utc.as_deref().unwrap_or("-")) } }
                            }
                        }
                    }
                }
            }
        }
        section aria-labelledby="runs-h" {
            h2 id="runs-h" { "Last " (d.runs.len()) " runs" }
            @if lag.len() >= 2 {
                figure {
                    (charts::lines("Lag of the last runs", " ms", &[Series { class: "p99", label: "lag", points: lag.clone() }], x, (&first, &last)))
                    figcaption { "Lag (queued − scheduled, or − the jittered due instant) of the runs below, by scheduled time" }
                }
            }
            (runs_table(&d.runs, false))
            p { a href=(format!("/runs{}", qs(&[("trigger", Some(&v.trigger_id))]))) { "All runs of this trigger" } }
        }
    };
    layout(&format!("Trigger {}", v.trigger_id), Nav::Triggers, body)
}

fn runs_table(runs: &[browse::RunItem], with_trigger: bool) -> Markup {
    html! {
        @if runs.is_empty() {
            p.empty { "No runs match." }
        } @else {
            table.sortable id="runs" {
                thead { tr {
                    th { "Run" } @if with_trigger { th { "Trigger" } } th { "Kind" } th { "Status" }
                    th { "Scheduled (UTC)" } th { "Queued (UTC)" } th.num { "Lag" } th { "Admitted by" }
                } }
                tbody {
                    @for r in runs {
                        tr {
                            td { a href=(format!("/runs/{}", r.run_id)) { code.id title=(r.idempotency_key) { (r.run_id) } } }
                            @if with_trigger { td { (trigger_link(&r.trigger_id)) } }
                            td { (r.kind) }
                            td { (r.status) }
                            td { (render::utc(Some(r.scheduled_for_ms))) }
                            td { (render::utc(r.queued_at_ms)) }
                            td.num { (render::span(r.lag_ms)) }
                            td { (r.admitted_by) }
                        }
                    }
                }
            }
        }
    }
}

pub fn runs(q: &RunsQuery, limit: i64, page: &RunsPage) -> String {
    let kind = q.kind.as_deref().unwrap_or("");
    let status = q.status.as_deref().unwrap_or("");
    let limit_s = limit.to_string();
    let base = [
        ("trigger", q.trigger.as_deref()),
        ("kind", q.kind.as_deref()),
        ("status", q.status.as_deref()),
        ("limit", Some(limit_s.as_str())),
    ];
    let body = html! {
        form.filters method="get" action="/runs" role="search" {
            label { "Trigger " input type="text" name="trigger" value=[q.trigger.as_deref()] autocomplete="off"; }
            label { "Kind "
                select name="kind" {
                    option value="" selected[kind.is_empty()] { "any" }
                    @for k in ["cron", "manual", "backfill"] { option value=(k) selected[k == kind] { (k) } }
                }
            }
            label { "Status "
                select name="status" {
                    option value="" selected[status.is_empty()] { "any" }
                    @for s in browse::RUN_STATUSES { option value=(s) selected[s == status] { (s) } }
                }
            }
            input type="hidden" name="limit" value=(limit_s);
            button type="submit" { "Filter" }
        }
        (runs_table(&page.runs, true))
        nav.paging aria-label="Pages" {
            @if q.before.as_deref().is_some_and(|b| !b.is_empty()) {
                a href=(format!("/runs{}", qs(&base))) { "Newest" }
            }
            @if let Some(next) = &page.next_before {
                @let more = [&base[..], &[("before", Some(next.as_str()))]].concat();
                a rel="next" href=(format!("/runs{}", qs(&more))) { "Older →" }
            }
        }
    };
    layout("Runs", Nav::Runs, body)
}

/// The audit log, newest first (what `qlsched audit` prints): when, what, who, each changed
/// field before → after, the note.
pub fn audit(q: &AuditQuery, limit: i64, page: &AuditPage) -> String {
    let limit_s = limit.to_string();
    let base = [
        ("trigger", q.trigger.as_deref()),
        ("project", q.project.as_deref()),
        ("limit", Some(limit_s.as_str())),
    ];
    let body = html! {
        form.filters method="get" action="/audit" role="search" {
            label { "Trigger " input type="text" name="trigger" value=[q.trigger.as_deref()] autocomplete="off"; }
            label { "Project " input type="text" name="project" value=[q.project.as_deref()] autocomplete="off"; }
            input type="hidden" name="limit" value=(limit_s);
            button type="submit" { "Filter" }
        }
        table.audit {
            thead { tr { th { "When" } th { "Object" } th { "Action" } th { "Who" } th { "Changes" } th { "Note" } } }
            tbody {
                @for e in &page.entries {
                    tr {
                        td { (render::utc(Some(e.at_ms))) }
                        td {
                            (e.object_kind) " "
                            @if e.object_kind == "trigger" { (trigger_link(&e.object_id)) } @else { (e.object_id) }
                        }
                        td { (e.action) }
                        td { (render::audit::who(e)) }
                        td { (render::audit::changes_text(&e.changes)) }
                        td { (e.note.as_deref().unwrap_or("")) }
                    }
                }
            }
        }
        nav.paging aria-label="Pages" {
            @if q.before.as_deref().is_some_and(|b| !b.is_empty()) {
                a href=(format!("/audit{}", qs(&base))) { "Newest" }
            }
            @if let Some(next) = &page.next_before {
                @let more = [&base[..], &[("before", Some(next.as_str()))]].concat();
                a rel="next" href=(format!("/audit{}", qs(&more))) { "Older →" }
            }
        }
    };
    layout("Audit", Nav::Audit, body)
}

/// One run: what `runs show` prints, with each attempt's error, result and output tail as
/// recorded by whoever executed it (a worker's stdout and stderr tails, an HTTP body's end).
pub fn run(d: &RunDetail, actions: Markup) -> String {
    let r = &d.run;
    let body = html! {
        section aria-labelledby="run-h" {
            h2 id="run-h" { "Run" }
            dl.facts {
                dt { "Trigger" } dd { (trigger_link(&r.trigger_id)) }
                dt { "Kind" } dd { (r.kind) }
                dt { "Status" } dd id="run-status" { (r.status) @if d.cancelled { " (cancelled)" } }
                dt { "Scheduled" } dd { (render::utc(Some(r.scheduled_for_ms))) }
                dt { "Queued" } dd { (render::utc(r.queued_at_ms)) " (lag " (render::span(r.lag_ms)) ")" }
                dt { "Admitted by" } dd { (r.admitted_by) }
                dt { "Idempotency key" } dd { code { (r.idempotency_key) } }
                dt { "Execution revision" } dd { code { (d.execution_revision_id) } }
            }
        }
        (actions)
        section aria-labelledby="attempts-h" {
            h2 id="attempts-h" { "Attempts" }
            @for a in &d.attempts {
                article.attempt id=(format!("attempt-{}", a.attempt_no)) {
                    h3 { "Attempt " (a.attempt_no) ": " (a.state) }
                    dl.facts {
                        @if let Some(w) = &a.worker_id { dt { "Worker" } dd { (w) } }
                        @if let Some(ms) = a.started_at_ms { dt { "Started" } dd { (render::utc(Some(ms))) } }
                        @if let Some(ms) = a.finished_at_ms { dt { "Finished" } dd { (render::utc(Some(ms))) } }
                        @if let Some(ms) = a.lease_expires_at_ms { dt { "Lease until" } dd { (render::utc(Some(ms))) } }
                        @if let Some(ms) = a.not_before_ms { dt { "Not before" } dd { (render::utc(Some(ms))) } }
                        @if let Some(x) = a.exit_status { dt { "Exit status" } dd.exit { (x) } }
                        @if let Some(e) = &a.error { dt { "Error" } dd.error { (e) } }
                        @if let Some(v) = &a.result { dt { "Result" } dd { code { (v.to_string()) } } }
                    }
                    @if let Some(t) = a.output_tail.as_deref().filter(|t| !t.is_empty()) {
                        figure {
                            pre.output { (t) }
                            figcaption { "Output: its tail, as recorded" }
                        }
                    }
                }
            }
        }
        section aria-labelledby="events-h" {
            h2 id="events-h" { "Events" }
            table id="events" {
                thead { tr { th.num { "Seq" } th { "Kind" } th { "At (UTC)" } } }
                tbody {
                    @for e in &d.events {
                        tr { td.num { (e.seq) } td { (e.kind) } td { (render::utc(Some(e.at_ms))) } }
                    }
                }
            }
        }
    };
    layout(&format!("Run {}", r.run_id), Nav::Runs, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(
            qs(&[("q", Some("a b&<")), ("x", None), ("y", Some(""))]),
            "?q=a%20b%26%3C"
        );
    }

    #[test]
    fn an_error_message_is_escaped() {
        let page = error_page(404, "unknown trigger `<script>alert(1)</script>`");
        assert!(
            page.contains("&lt;script&gt;alert(1)&lt;/script&gt;"),
            "{page}"
        );
        assert!(!page.contains("<script>alert"), "{page}");
    }
}
