//! The action forms an operator sees (a viewer none): plain HTML forms that POST to the
//! console's action routes (src/console/actions.rs) with the page's token, working without
//! JavaScript. Every value is escaped by maud.

use maud::{html, Markup};

use super::auth::{now_s, TokenKey, Who};
use crate::store::browse::RunDetail;
use crate::store::triggers::TriggerView;

fn token(tokens: &TokenKey, who: &Who) -> Markup {
    html! { input type="hidden" name="csrf" value=(tokens.token(&who.user, now_s())); }
}

/// A form that repeats `hidden` with `confirm=yes`: the second step of backfill and cancel.
pub fn confirm(
    tokens: &TokenKey,
    who: &Who,
    action: &str,
    hidden: &[(&str, String)],
    label: &str,
) -> Markup {
    html! {
        form.action method="post" action=(action) id="confirm-form" {
            (token(tokens, who))
            @for (k, v) in hidden { input type="hidden" name=(k) value=(v); }
            input type="hidden" name="confirm" value="yes";
            label { "Note (optional) " input type="text" name="note" maxlength="1000"; }
            button type="submit" id="confirm" { (label) }
        }
    }
}

/// The actions on a trigger's page: disable (a note required) or enable, fire now (a request
/// id minted with the page, so a second click is the same request), backfill a window and
/// cancel queued runs (each shows what it will do first). None for a deleted trigger.
pub fn trigger_actions(tokens: &TokenKey, who: Option<&Who>, v: &TriggerView) -> Markup {
    let Some(who) = who.filter(|w| w.may_act()) else {
        return html! {};
    };
    if v.deleted_at_ms.is_some() {
        return html! {};
    }
    let id = &v.trigger_id;
    let request_id = format!("console-{}", uuid::Uuid::new_v4());
    html! {
        section aria-labelledby="actions-h" id="actions" {
            h2 id="actions-h" { "Actions" }
            @if v.operator_disabled || !v.enabled {
                form.action method="post" action=(format!("/triggers/{id}/enable")) id="enable-form" {
                    (token(tokens, who))
                    button type="submit" id="enable" { "Enable" }
                    span.hint { " The next occurrence after now is admitted; the disabled span is not replayed." }
                }
            } @else {
                form.action method="post" action=(format!("/triggers/{id}/disable")) id="disable-form" {
                    (token(tokens, who))
                    label { "Note (required) " input type="text" name="note" id="disable-note-input" required maxlength="1000"; }
                    button type="submit" id="disable" { "Disable" }
                }
            }
            form.action method="post" action=(format!("/triggers/{id}/fire")) id="fire-form" {
                (token(tokens, who))
                input type="hidden" name="request_id" value=(request_id);
                label { "Note " input type="text" name="note" maxlength="1000"; }
                button type="submit" id="fire" { "Fire now" }
            }
            form.action method="post" action=(format!("/triggers/{id}/backfill")) id="backfill-form" {
                (token(tokens, who))
                label { "From (UTC) " input type="datetime-local" name="from" id="backfill-from" required; }
                label { " to " input type="datetime-local" name="to" id="backfill-to" required; }
                button type="submit" id="backfill" { "Backfill…" }
            }
            form.action method="post" action=(format!("/triggers/{id}/cancel")) id="cancel-form" {
                (token(tokens, who))
                label { "Queued runs scheduled from (UTC, optional) " input type="datetime-local" name="from"; }
                label { " to " input type="datetime-local" name="to"; }
                button type="submit" id="cancel-queued" { "Cancel queued runs…" }
            }
        }
    }
}

/// The actions on a run's page: retry a failed run as a manual fire (once, whatever the
/// clicks: the request id is the run's), or ask the worker holding a running one to stop it.
pub fn run_actions(tokens: &TokenKey, who: Option<&Who>, d: &RunDetail) -> Markup {
    let Some(who) = who.filter(|w| w.may_act()) else {
        return html! {};
    };
    let r = &d.run;
    let held = matches!(r.status.as_str(), "dispatching" | "running");
    if r.status != "failed" && !held {
        return html! {};
    }
    html! {
        section aria-labelledby="actions-h" id="actions" {
            h2 id="actions-h" { "Actions" }
            @if r.status == "failed" {
                form.action method="post" action=(format!("/runs/{}/retry", r.run_id)) id="retry-form" {
                    (token(tokens, who))
                    label { "Note " input type="text" name="note" maxlength="1000"; }
                    button type="submit" id="retry" { "Retry as a manual fire" }
                }
            }
            @if held {
                form.action method="post" action=(format!("/runs/{}/cancel-request", r.run_id)) id="cancel-request-form" {
                    (token(tokens, who))
                    label { "Note " input type="text" name="note" maxlength="1000"; }
                    button type="submit" id="cancel-request" { "Ask its worker to stop it" }
                }
            }
        }
    }
}
