//! The operator actions (docs/console.md, "Actions"): POST only, each refused unless the
//! request is from this console's pages, carries its page's token and comes from an
//! operator ([`super::auth`]); each one call of a V24 owner function
//! ([`crate::store::console_actions`]) in its own transaction. Backfill and cancel are two
//! steps: the first POST shows what the action will do and writes nothing; the second,
//! with `confirm=yes`, does it.

use actix_web::{web, HttpRequest, HttpResponse};
use maud::{html, Markup};
use serde::Deserialize;
use tokio_postgres::error::SqlState;
use uuid::Uuid;

use super::auth::{self, Refusal, Who};
use super::{forms, pages, secure, Console, Failure};
use crate::db::{self, StoreError};
use crate::present as render;
use crate::schedule::{occurrences_in, Schedule};
use crate::store::console_actions::{self as act, Actor};
use crate::store::retention::BACKFILL_HORIZON_MARGIN as HORIZON_MARGIN;

/// The most occurrences one console backfill admits (the CLI's default `--max`; the V24
/// function refuses more).
pub const BACKFILL_MAX: usize = 1000;

/// The fields an action form may send (each action reads its own).
#[derive(Deserialize, Default)]
pub(crate) struct ActionForm {
    pub csrf: Option<String>,
    pub note: Option<String>,
    pub request_id: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
    pub confirm: Option<String>,
}

/// One POST: checks, then the action.
pub(crate) async fn handle(
    req: HttpRequest,
    console: web::Data<Console>,
    body: web::Bytes,
) -> HttpResponse {
    let who = match console.admit(&req) {
        Err(refused) => return *refused,
        Ok(who) => who,
    };
    let form = std::str::from_utf8(&body)
        .ok()
        .and_then(|b| web::Query::<ActionForm>::from_query(b).ok())
        .map(web::Query::into_inner);
    let checked = check(&req, &console, who.as_ref(), form.as_ref());
    let (who, form) = match (checked, who, form) {
        (Ok(()), Some(who), Some(form)) => (who, form),
        (Err(r), ..) => return forbidden(&r),
        _ => return forbidden(&Refusal::Token),
    };
    let host = req
        .peer_addr()
        .map(|a| a.ip().to_string())
        .unwrap_or_default();
    let by = Actor {
        user: &who.user,
        host: &host,
    };
    let id = req.match_info().get("id").unwrap_or_default().to_owned();
    let what = req
        .match_info()
        .get("action")
        .unwrap_or_default()
        .to_owned();
    let r = match (req.path().starts_with("/runs/"), what.as_str()) {
        (false, "disable") => disable(&console, &id, &form, by).await,
        (false, "enable") => enable(&console, &id, by).await,
        (false, "fire") => fire(&console, &id, &form, None, by).await,
        (false, "backfill") => backfill(&console, &who, &id, &form, by).await,
        (false, "cancel") => cancel(&console, &who, &id, &form, by).await,
        (true, "retry") => retry(&console, &id, &form, by).await,
        (true, "cancel-request") => request_cancel(&console, &id, &form, by).await,
        _ => Err(Failure::NotFound(format!("no action at {}", req.path()))),
    };
    let (status, html) = match r {
        Ok((title, body)) => (
            actix_web::http::StatusCode::OK,
            pages::action_page(&title, body),
        ),
        Err(f) => (
            f.status(),
            pages::error_page(f.status().as_u16(), &f.message()),
        ),
    };
    let mut b = HttpResponse::build(status);
    secure(&mut b);
    b.content_type("text/html; charset=utf-8").body(html)
}

/// Same origin, an operator, the page's token of that operator: in that order.
fn check(
    req: &HttpRequest,
    console: &Console,
    who: Option<&Who>,
    form: Option<&ActionForm>,
) -> Result<(), Refusal> {
    if !auth::same_origin(req) {
        return Err(Refusal::CrossOrigin);
    }
    let who = who.filter(|w| w.may_act()).ok_or(Refusal::Role)?;
    let token = form.and_then(|f| f.csrf.as_deref()).unwrap_or("");
    match console.tokens.verify(&who.user, token, auth::now_s()) {
        true => Ok(()),
        false => Err(Refusal::Token),
    }
}

fn forbidden(r: &Refusal) -> HttpResponse {
    let mut b = HttpResponse::Forbidden();
    secure(&mut b);
    b.content_type("text/plain; charset=utf-8")
        .body(format!("{}\n", r.message()))
}

/// An action's transaction on the console's pool: its statement and lock timeouts as the
/// reads', `$tx` its name; commits what `$body` wrote.
macro_rules! write {
    ($c:expr, $tx:ident => $body:expr) => {
        async {
            let mut conn = db::conn(&$c.pool).await?;
            let $tx = conn.transaction().await.map_err(StoreError::from)?;
            let ms = $c.cfg.statement_timeout.as_millis();
            $tx.batch_execute(&format!(
                "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}"
            ))
            .await
            .map_err(StoreError::from)?;
            let out = $body;
            $tx.commit().await.map_err(StoreError::from)?;
            Ok::<_, Failure>(out)
        }
        .await
    };
}

/// A refusal raised by a V24 function, by its SQLSTATE: the function's message to the
/// operator (409 for a state that forbids it, 400 for a value out of bounds, 404 unknown).
fn refused(e: StoreError) -> Failure {
    let (code, msg) = match &e {
        StoreError::Db(d) => match d.as_db_error() {
            Some(db) => (d.code().cloned(), db.message().to_owned()),
            None => return Failure::Store(e),
        },
        _ => return Failure::Store(e),
    };
    match code {
        Some(c) if c == SqlState::NO_DATA_FOUND => Failure::NotFound(msg),
        Some(c)
            if c == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE
                || c == SqlState::T_R_SERIALIZATION_FAILURE
                || c == SqlState::DATA_CORRUPTED =>
        {
            Failure::Conflict(msg)
        }
        Some(c) if c == SqlState::INVALID_PARAMETER_VALUE => Failure::BadRequest(msg),
        _ => Failure::Store(e),
    }
}

fn note(form: &ActionForm) -> Option<&str> {
    form.note
        .as_deref()
        .map(str::trim)
        .filter(|n| !n.is_empty())
}

type Done = Result<(String, Markup), Failure>;

fn back_to_trigger(id: &str) -> Markup {
    html! { p { a href=(format!("/triggers/{id}")) { "Back to trigger " (id) } } }
}

async fn disable(c: &Console, id: &str, form: &ActionForm, by: Actor<'_>) -> Done {
    let Some(n) = note(form) else {
        return Err(Failure::BadRequest(
            "a disable needs a note: why the trigger stops".into(),
        ));
    };
    let r = write!(c, tx => act::disable(&tx, id, n, by).await.map_err(refused)?)?;
    let text = match r.as_str() {
        "disabled" => "Disabled: nothing more is admitted for it.",
        _ => "It was disabled already: nothing changed.",
    };
    Ok((
        format!("Trigger {id} disabled"),
        html! { p id="outcome" { (text) } (back_to_trigger(id)) },
    ))
}

async fn enable(c: &Console, id: &str, by: Actor<'_>) -> Done {
    // The function answers `stale` when the clock or the floor moved past the cursor read
    // here, or the trigger was republished: read again (bounded).
    for _ in 0..5 {
        let r = write!(c, tx => {
            let b = act::enable_basis(&tx, id)
                .await?
                .ok_or_else(|| Failure::NotFound(format!("unknown trigger `{id}`")))?;
            let first = Schedule::parse(&b.cron_expr, &b.timezone)
                .ok()
                .and_then(|s| b.floor.first(&s, b.now_ms, b.start_at_ms));
            act::enable(&tx, id, b.revision, first, by).await.map_err(refused)?
        })?;
        let text = match r.as_str() {
            "stale" => continue,
            "enabled" => "Enabled: its next occurrence after now is admitted; the disabled span is not replayed.",
            _ => "It was running already: nothing changed.",
        };
        return Ok((
            format!("Trigger {id} enabled"),
            html! { p id="outcome" { (text) } (back_to_trigger(id)) },
        ));
    }
    Err(Failure::Conflict(format!(
        "trigger {id}: its definition kept changing during the enable; try again"
    )))
}

async fn fire(
    c: &Console,
    id: &str,
    form: &ActionForm,
    retry_of: Option<Uuid>,
    by: Actor<'_>,
) -> Done {
    let request_id = match retry_of {
        Some(_) => String::new(),
        None => form.request_id.clone().unwrap_or_default(),
    };
    let f = write!(c, tx => act::fire(&tx, id, &request_id, retry_of, note(form), by)
        .await
        .map_err(refused)?)?;
    let text = match f.outcome.as_str() {
        "admitted" => "Admitted one run now.",
        "existing" => "This request was admitted before (a second click): no other run.",
        "overlap_buffered" => "Kept by the trigger's overlap policy (buffer_one): admitted when its running run ends.",
        _ => "Not admitted: the trigger's overlap policy skips it while a run of the trigger is unfinished.",
    };
    Ok((
        format!("Trigger {id} fired"),
        html! {
            p id="outcome" { (text) }
            @if let Some(r) = f.run_id { p { "Run: " a href=(format!("/runs/{r}")) { (r) } } }
            (back_to_trigger(id))
        },
    ))
}

async fn retry(c: &Console, run: &str, form: &ActionForm, by: Actor<'_>) -> Done {
    let run_id = Uuid::parse_str(run)
        .map_err(|_| Failure::BadRequest(format!("run `{run}`: not a run id (a UUID)")))?;
    let trigger = write!(c, tx => act::run_trigger(&tx, run_id).await?)?
        .ok_or_else(|| Failure::NotFound(format!("unknown run `{run}`")))?;
    fire(c, &trigger, form, Some(run_id), by).await
}

async fn request_cancel(c: &Console, run: &str, form: &ActionForm, by: Actor<'_>) -> Done {
    let run_id = Uuid::parse_str(run)
        .map_err(|_| Failure::BadRequest(format!("run `{run}`: not a run id (a UUID)")))?;
    let n =
        write!(c, tx => act::request_cancel(&tx, run_id, note(form), by).await.map_err(refused)?)?;
    let text = match n {
        1 => "Asked its worker to stop it (at the worker's next heartbeat).",
        _ => "Nothing asked: the run is not held by a worker, or was asked already.",
    };
    Ok((
        format!("Run {run}"),
        html! { p id="outcome" { (text) } p { a href=(format!("/runs/{run}")) { "Back to the run" } } },
    ))
}

/// A form's `from` / `to`: RFC 3339, or a browser's `datetime-local` value read as UTC.
fn instant(field: &str, v: Option<&str>) -> Result<Option<i64>, Failure> {
    let Some(v) = v.map(str::trim).filter(|v| !v.is_empty()) else {
        return Ok(None);
    };
    if let Ok(t) = chrono::DateTime::parse_from_rfc3339(v) {
        return Ok(Some(t.timestamp_millis()));
    }
    for fmt in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M"] {
        if let Ok(t) = chrono::NaiveDateTime::parse_from_str(v, fmt) {
            return Ok(Some(t.and_utc().timestamp_millis()));
        }
    }
    Err(Failure::BadRequest(format!(
        "{field} `{v}`: not a time (RFC 3339, or YYYY-MM-DDTHH:MM in UTC)"
    )))
}

async fn backfill(c: &Console, who: &Who, id: &str, form: &ActionForm, by: Actor<'_>) -> Done {
    let (Some(from), Some(to)) = (
        instant("from", form.from.as_deref())?,
        instant("to", form.to.as_deref())?,
    ) else {
        return Err(Failure::BadRequest(
            "a backfill needs `from` and `to`".into(),
        ));
    };
    if from >= to {
        return Err(Failure::BadRequest(format!(
            "the window's start {} must be before its end {}",
            render::utc(Some(from)),
            render::utc(Some(to))
        )));
    }
    let confirm = form.confirm.as_deref() == Some("yes");
    write!(c, tx => {
        let now = crate::store::manage::db_now(&tx).await?;
        if to > now {
            return Err(Failure::BadRequest(format!(
                "the window's end {} is in the future (the database clock says {})",
                render::utc(Some(to)),
                render::utc(Some(now))
            )));
        }
        if let Some((floor, _)) = crate::store::retention::backfill_floor_ms(&tx, HORIZON_MARGIN).await? {
            if from < floor {
                return Err(Failure::BadRequest(format!(
                    "the window starts before {}: the retention horizon plus {} s margin",
                    render::utc(Some(floor)),
                    HORIZON_MARGIN.as_secs()
                )));
            }
        }
        let def = crate::store::triggers::backfill_definition_in(&tx, id).await?;
        let schedule = Schedule::parse(&def.cron_expr, &def.timezone)
            .map_err(|e| Failure::Conflict(format!("trigger {id}: {e}")))?;
        let instants = occurrences_in(&schedule, from, to, BACKFILL_MAX).ok_or_else(|| {
            Failure::BadRequest(format!(
                "the window holds more than {BACKFILL_MAX} occurrences: a console backfill admits at most {BACKFILL_MAX} (the CLI's `trigger backfill --max` goes further)"
            ))
        })?;
        if instants.is_empty() {
            return Err(Failure::BadRequest("the window holds no occurrence".into()));
        }
        if !confirm {
            let existing = act::backfill_existing(&tx, id, &instants).await?;
            let hidden = [("from", render::utc(Some(from))), ("to", render::utc(Some(to)))];
            return Ok((
                format!("Backfill trigger {id}?"),
                html! {
                    p id="plan" {
                        (instants.len()) " occurrences in [" (render::utc(Some(from))) ", " (render::utc(Some(to))) "), "
                        "the first at " (render::utc(instants.first().copied())) ", the last at "
                        (render::utc(instants.last().copied())) "; " (existing) " of them already have a run and are left alone. "
                        "Each is admitted as a queued run under revision " (def.revision) "."
                    }
                    (forms::confirm(&c.tokens, who, &format!("/triggers/{id}/backfill"), &hidden, "Backfill"))
                    (back_to_trigger(id))
                },
            ));
        }
        let n = act::backfill(&tx, id, def.revision, &instants, note(form), by)
            .await
            .map_err(refused)?;
        (
            format!("Trigger {id} backfilled"),
            html! {
                p id="outcome" { (n) " admitted, " (instants.len() as i64 - n) " already existed." }
                (back_to_trigger(id))
            },
        )
    })
}

async fn cancel(c: &Console, who: &Who, id: &str, form: &ActionForm, by: Actor<'_>) -> Done {
    let from = instant("from", form.from.as_deref())?;
    let to = instant("to", form.to.as_deref())?;
    let confirm = form.confirm.as_deref() == Some("yes");
    write!(c, tx => {
        if !confirm {
            let n = act::queued_count(&tx, id, from, to).await?;
            let window = match (from, to) {
                (None, None) => "at any time".to_owned(),
                _ => format!("scheduled in [{}, {})", render::utc(from), render::utc(to)),
            };
            let hidden: Vec<(&str, String)> = [("from", from), ("to", to)]
                .into_iter()
                .filter_map(|(k, v)| Some((k, render::utc(Some(v?)))))
                .collect();
            return Ok((
                format!("Cancel queued runs of trigger {id}?"),
                html! {
                    p id="plan" {
                        (n) " queued runs " (window) ". Those no worker has touched are cancelled (at most 1000 at a time); "
                        "one a worker has taken meanwhile is left alone."
                    }
                    (forms::confirm(&c.tokens, who, &format!("/triggers/{id}/cancel"), &hidden, "Cancel these runs"))
                    (back_to_trigger(id))
                },
            ));
        }
        let n = act::cancel_queued(&tx, id, from, to, note(form), by).await.map_err(refused)?;
        (
            format!("Queued runs of trigger {id} cancelled"),
            html! { p id="outcome" { (n) " runs cancelled." } (back_to_trigger(id)) },
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_window_past_the_bound_is_refused_and_one_within_is_listed() {
        let s = Schedule::parse("* * * * *", "UTC").unwrap();
        let hour = occurrences_in(&s, 0, 3_600_000, BACKFILL_MAX).unwrap();
        assert_eq!(hour.len(), 60);
        assert_eq!(hour.first(), Some(&0));
        assert!(occurrences_in(&s, 0, 1001 * 60_000, BACKFILL_MAX).is_none());
        assert_eq!(
            occurrences_in(&s, 0, 1000 * 60_000, BACKFILL_MAX).map(|v| v.len()),
            Some(1000)
        );
    }

    #[test]
    fn form_times_are_rfc_3339_or_utc_local() {
        assert_eq!(
            instant("from", Some("1970-01-01T00:01:00Z")).unwrap(),
            Some(60_000)
        );
        assert_eq!(
            instant("from", Some("1970-01-01T00:01")).unwrap(),
            Some(60_000)
        );
        assert_eq!(instant("from", Some(" ")).unwrap(), None);
        assert!(instant("from", Some("yesterday")).is_err());
    }
}
