//! The web console and its JSON (`/api/v1/…`), served on the replica's HTTP port
//! (docs/console.md). Pages only read; an operator's actions are POSTs handled in
//! actions.rs (roles, same-origin and token checks in auth.rs, the forms in forms.rs), each
//! one call of a V24 function the runtime role may execute (docs/design.md, "Acting from
//! the console").
//!
//! - Pages: `/` (overview), `/triggers`, `/triggers/{id}`, `/runs`, `/runs/{id}` (a run with
//!   its attempts, each one's error and output tail), `/audit` (the audit log, docs/audit.md):
//!   server-rendered HTML (maud, escaping
//!   every value), working without JavaScript; `/static/console.js` only adds auto-refresh and
//!   sorting of the rows shown.
//! - The same data as JSON: `/api/v1/overview`, `/api/v1/triggers`, `/api/v1/triggers/{id}`,
//!   `/api/v1/runs`, `/api/v1/runs/{id}`, `/api/v1/audit`, with the fields `qlsched status|trigger list|trigger
//!   show|runs list|runs show --json` print (src/store/browse.rs is the one query layer of
//!   both).
//! - Cheap and safe: the console's own small pool (never the claim or admission
//!   connections), each request one READ ONLY transaction with a short `statement_timeout`,
//!   keyset pages of at most 100 rows; credentials from `[http] console_auth_file` when set
//!   (always set unless HTTP is bound to loopback); CSP without inline script.
//! - A request with wrong credentials is logged with the client's address (never what it
//!   sent), counted in `qlsched_console_login_failures_total`, and past
//!   `[http] console_login_failures_per_minute` failures its address gets 429 (throttle.rs).

mod actions;
mod auth;
mod charts;
mod forms;
mod pages;
mod throttle;

use std::time::Duration;

use actix_web::http::header;
use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use crate::config::ConsoleConfig;
use crate::db;
use crate::db::{Pool, StoreError};
use crate::metrics::Metrics;
use crate::store::browse::{self, RunFilter, TriggerFilter, PAGE_MAX};
use crate::store::manage::ManageError;
use crate::store::triggers::StateFilter;

/// The version this replica runs (shown on the overview).
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("QLSCHED_GIT_COMMIT"),
    ")"
);

/// Content-Security-Policy of every console response: nothing inline runs, nothing is
/// fetched from elsewhere, no framing.
pub const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self'; \
     connect-src 'self'; object-src 'none'; base-uri 'none'; form-action 'self'; \
     frame-ancestors 'none'";

const CSS: &str = include_str!("static/console.css");
const JS: &str = include_str!("static/console.js");
const ICON: &str = include_str!("static/icon.svg");

/// The overview's per-kind lag covers each kind's last 1000 runs among this many newest
/// admissions (`qlsched status` reads without the bound).
pub const STATUS_SCAN: i64 = 20_000;

/// What the console's handlers share.
#[derive(Clone)]
pub struct Console {
    pool: Pool,
    cfg: ConsoleConfig,
    metrics: Metrics,
    replica_id: String,
    history: std::sync::Arc<std::sync::Mutex<Option<ClosedMinutes>>>,
    throttle: std::sync::Arc<throttle::Throttle>,
    /// The key of the action forms' tokens, drawn when the console starts.
    tokens: std::sync::Arc<auth::TokenKey>,
    log: slog::Logger,
}

/// The overview's cron history of minutes that ended more than a minute ago (by the
/// database clock): what they hold no longer changes, so each overview reads only the runs
/// admitted since `until_ms` instead of the whole hour. (A run's `queued_at_ms` is taken
/// when its admission statement starts and it is visible at commit, milliseconds later; a
/// minute is closed a full minute after its end.)
struct ClosedMinutes {
    minutes: Vec<browse::MinuteBucket>,
    until_ms: i64,
}

/// Minutes that ended at least this long ago are kept by the console.
const CLOSED_AFTER_MS: i64 = 60_000;

impl Console {
    /// The console with its own pool of `cfg.pool_size` connections to `target` (through
    /// the same connect path as every connection of the replica). Connects on demand.
    pub fn new(
        target: crate::db::Target,
        connect_timeout: Duration,
        cfg: ConsoleConfig,
        metrics: Metrics,
        replica_id: String,
        log: &slog::Logger,
    ) -> Console {
        let pool = db::build_pool(target, cfg.pool_size, connect_timeout, log);
        Console {
            pool,
            throttle: std::sync::Arc::new(throttle::Throttle::new(cfg.login_failures_per_minute)),
            cfg,
            metrics,
            replica_id,
            history: Default::default(),
            tokens: std::sync::Arc::new(auth::TokenKey::random()),
            log: log.new(slog::o!("component" => "console")),
        }
    }

    /// The last hour of cron admissions: the closed minutes this console read before, and
    /// a read of the runs admitted since.
    async fn cron_history(
        &self,
        client: &impl tokio_postgres::GenericClient,
    ) -> Result<browse::AdmissionHistory, StoreError> {
        let since = self.closed().as_ref().map(|c| c.until_ms);
        let mut h = browse::admission_history(client, "cron", since).await?;
        let mut closed = self.closed();
        let (start, from) = (h.window_start_ms, h.read_from_ms);
        let mut minutes: Vec<browse::MinuteBucket> = closed
            .iter()
            .flat_map(|c| &c.minutes)
            .filter(|m| m.minute_start_ms >= start && m.minute_start_ms < from)
            .cloned()
            .collect();
        minutes.append(&mut h.minutes);
        h.minutes = minutes;
        // A capped read saw only the newest part of what it read: keep nothing of it.
        *closed = (!h.capped).then(|| {
            let until_ms = (h.now_ms - CLOSED_AFTER_MS).div_euclid(60_000) * 60_000;
            ClosedMinutes {
                minutes: h
                    .minutes
                    .iter()
                    .filter(|m| m.minute_start_ms < until_ms)
                    .cloned()
                    .collect(),
                until_ms,
            }
        });
        Ok(h)
    }

    fn closed(&self) -> std::sync::MutexGuard<'_, Option<ClosedMinutes>> {
        self.history.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The credentials check of one request, throttled per client address: `Ok` lets the
    /// request through, with the user its credentials name (`None`: the console has no
    /// credentials file, pages are open and nobody may act); otherwise the 401 or 429 to
    /// send. A request that carried wrong credentials is logged (address and path only),
    /// counted and remembered.
    fn admit(&self, req: &HttpRequest) -> Result<Option<auth::Who>, Box<HttpResponse>> {
        let Some(file) = self.cfg.auth.as_ref() else {
            return Ok(None);
        };
        let ip = req.peer_addr().map(|a| a.ip());
        let now = std::time::Instant::now();
        if let Some(wait) = ip.and_then(|ip| self.throttle.blocked(ip, now)) {
            return Err(Box::new(self.throttled(wait)));
        }
        if let Some(who) = auth::identify(file, req) {
            return Ok(Some(who));
        }
        if req.headers().contains_key(header::AUTHORIZATION) {
            self.metrics.console_login_failures.inc();
            if let Some(ip) = ip {
                self.throttle.failed(ip, now);
            }
            slog::warn!(self.log, "console login failed: wrong credentials";
                "client" => ip.map(|i| i.to_string()).unwrap_or_default(),
                "path" => req.path());
        }
        Err(Box::new(self.unauthorised()))
    }

    fn throttled(&self, wait: Duration) -> HttpResponse {
        let secs = (wait.as_secs() + u64::from(wait.subsec_nanos() > 0)).max(1);
        let mut r = HttpResponse::TooManyRequests();
        secure(&mut r);
        r.insert_header((header::RETRY_AFTER, secs.to_string()))
            .content_type("text/plain; charset=utf-8")
            .body(format!(
                "429 Too Many Requests: too many failed logins from this address; try again in {secs} s\n"
            ))
    }

    fn unauthorised(&self) -> HttpResponse {
        let challenge = match &self.cfg.auth {
            Some(a) if auth::wants_basic(a) => "Basic realm=\"qlsched console\", charset=\"UTF-8\"",
            _ => "Bearer realm=\"qlsched console\"",
        };
        let mut r = HttpResponse::Unauthorized();
        secure(&mut r);
        r.insert_header((header::WWW_AUTHENTICATE, challenge))
            .content_type("text/plain; charset=utf-8")
            .body("401 Unauthorized: this console needs the credentials of [http] console_auth_file\n")
    }

    /// Begins one READ ONLY transaction on a connection of the console's pool, with the
    /// console's statement and lock timeouts ([`read_only`]).
    async fn begin<'c>(
        &self,
        conn: &'c mut db::Conn<'_>,
    ) -> Result<tokio_postgres::Transaction<'c>, StoreError> {
        read_only(conn, self.cfg.statement_timeout).await
    }
}

/// Begins the console's transaction on `client`: READ ONLY, `statement_timeout` and
/// `lock_timeout` of `timeout`, and no JIT compilation. The console's range reads compare
/// with the database clock, a value the planner does not know, so it estimates a third of
/// `runs` and a cost far above `jit_above_cost` on a large table: compiling (and optimising)
/// took hundreds of milliseconds per overview query for a read of a few thousand rows
/// (docs/benchmark.md, the console row).
pub async fn read_only(
    client: &mut tokio_postgres::Client,
    timeout: Duration,
) -> Result<tokio_postgres::Transaction<'_>, StoreError> {
    let tx = client.build_transaction().read_only(true).start().await?;
    let ms = timeout.as_millis();
    tx.batch_execute(&format!(
        "SET LOCAL statement_timeout = {ms}; SET LOCAL lock_timeout = {ms}; SET LOCAL jit = off"
    ))
    .await?;
    Ok(tx)
}

/// Runs `$body` in one read-only transaction of the console (`$tx` names it) and commits.
macro_rules! read {
    ($c:expr, $tx:ident => $body:expr) => {
        async {
            let mut conn = db::conn(&$c.pool).await?;
            let $tx = $c.begin(&mut conn).await?;
            let out = $body;
            $tx.commit().await.map_err(StoreError::from)?;
            Ok::<_, Failure>(out)
        }
        .await
    };
}

/// The headers of every console response.
fn secure(r: &mut actix_web::HttpResponseBuilder) {
    r.insert_header((header::CONTENT_SECURITY_POLICY, CSP))
        .insert_header((header::X_CONTENT_TYPE_OPTIONS, "nosniff"))
        .insert_header((header::REFERRER_POLICY, "no-referrer"))
        .insert_header((header::X_FRAME_OPTIONS, "DENY"))
        .insert_header((header::CACHE_CONTROL, "no-store"));
}

/// Why a request failed.
#[derive(Debug)]
pub(crate) enum Failure {
    /// A parameter out of its bounds (named).
    BadRequest(String),
    NotFound(String),
    /// The object's state forbids the action (disabled, deleted, republished meanwhile).
    Conflict(String),
    Store(StoreError),
}

impl From<StoreError> for Failure {
    fn from(e: StoreError) -> Self {
        Failure::Store(e)
    }
}

impl From<ManageError> for Failure {
    fn from(e: ManageError) -> Self {
        match e {
            ManageError::UnknownTrigger { id } => {
                Failure::NotFound(format!("unknown trigger `{id}`"))
            }
            ManageError::Store(s) => Failure::Store(s),
            other => Failure::BadRequest(other.to_string()),
        }
    }
}

impl Failure {
    fn status(&self) -> actix_web::http::StatusCode {
        use actix_web::http::StatusCode;
        match self {
            Failure::BadRequest(_) => StatusCode::BAD_REQUEST,
            Failure::NotFound(_) => StatusCode::NOT_FOUND,
            Failure::Conflict(_) => StatusCode::CONFLICT,
            Failure::Store(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn message(&self) -> String {
        match self {
            Failure::BadRequest(m) | Failure::NotFound(m) | Failure::Conflict(m) => m.clone(),
            Failure::Store(e) => format!("the database did not answer: {e}"),
        }
    }
}

/// HTML or JSON of one view.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Format {
    Html,
    Json,
}

fn respond(format: Format, r: Result<(String, serde_json::Value), Failure>) -> HttpResponse {
    let (status, body, json) = match r {
        Ok((html, json)) => (actix_web::http::StatusCode::OK, html, json),
        Err(f) => {
            let msg = f.message();
            let json = serde_json::json!({ "error": msg });
            (
                f.status(),
                pages::error_page(f.status().as_u16(), &msg),
                json,
            )
        }
    };
    let mut b = HttpResponse::build(status);
    secure(&mut b);
    match format {
        Format::Html => b.content_type("text/html; charset=utf-8").body(body),
        Format::Json => b
            .content_type("application/json")
            .body(serde_json::to_string_pretty(&json).unwrap_or_default()),
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> Result<serde_json::Value, Failure> {
    serde_json::to_value(v).map_err(|e| Failure::BadRequest(e.to_string()))
}

/// `limit` within 1..=100 (default 50).
fn page_limit(limit: Option<i64>) -> Result<i64, Failure> {
    match limit.unwrap_or(50) {
        l if (1..=PAGE_MAX).contains(&l) => Ok(l),
        l => Err(Failure::BadRequest(format!(
            "limit {l}: must be within 1..={PAGE_MAX}"
        ))),
    }
}

/// An empty form field is no filter.
fn given(s: &Option<String>) -> Option<&str> {
    s.as_deref().map(str::trim).filter(|s| !s.is_empty())
}

/// The overview: `status --json`'s fields plus this replica's identity, the last hour of
/// admissions and lag per minute, and this replica's refusal and back-off counters.
#[derive(serde::Serialize)]
pub(crate) struct Overview {
    #[serde(flatten)]
    pub status: crate::store::status::Status,
    pub served_by: ServedBy,
    pub admissions: browse::AdmissionHistory,
    pub refusals: Vec<Refusal>,
}

#[derive(serde::Serialize)]
pub(crate) struct ServedBy {
    pub replica_id: String,
    pub version: &'static str,
}

/// One cause of a refusal or back-off, as counted by this replica since it started
/// (its Prometheus counters).
#[derive(serde::Serialize)]
pub(crate) struct Refusal {
    pub cause: &'static str,
    pub metric: &'static str,
    pub count: u64,
    pub meaning: &'static str,
}

fn refusals(m: &Metrics) -> Vec<Refusal> {
    let r = |cause, metric, c: &prometheus_client::metrics::counter::Counter, meaning| Refusal {
        cause,
        metric,
        count: c.get(),
        meaning,
    };
    vec![
        r("rejected", "qlsched_rejects_total", &m.rejects, "definition cannot be evaluated, or a corrupt execution revision: released with the reject back-off"),
        r("error back-off", "qlsched_error_backoffs_total", &m.error_backoffs, "admission error: released with an exponential back-off"),
        r("fence lost", "qlsched_fence_losses_total", &m.fence_losses, "write refused: the lease was no longer ours"),
        r("re-decided", "qlsched_redecides_total", &m.redecides, "definition moved on during the admission: decided again at once"),
        r("duplicate key", "qlsched_duplicate_keys_total", &m.duplicate_keys, "occurrence admitted before (e.g. by a backfill): cursor advanced"),
        r("overlap", "qlsched_overlap_skips_total", &m.overlap_skips, "a run of the trigger unfinished: skipped or kept by its overlap policy"),
        r("serialization retry", "qlsched_serialization_retries_total", &m.serialization_retries, "admission retried after 40001/40P01"),
        r("misfire skipped", "qlsched_skips_total", &m.skips, "occurrence past its grace: skipped by misfire = skip"),
        r("orphan release", "qlsched_orphan_releases_total", &m.orphan_releases, "a claim round's reply never came: its rows released"),
    ]
}

async fn overview(console: web::Data<Console>, format: Format) -> HttpResponse {
    let c = console.get_ref();
    let r = read!(c, tx => Overview {
        status: crate::store::status::read_bounded(&tx, 1000, Some(STATUS_SCAN)).await?,
        admissions: c.cron_history(&tx).await?,
        served_by: ServedBy {
            replica_id: c.replica_id.clone(),
            version: VERSION,
        },
        refusals: refusals(&c.metrics),
    })
    .and_then(|o| Ok((pages::overview(&o), to_json(&o)?)));
    respond(format, r)
}

#[derive(Deserialize)]
pub(crate) struct TriggersQuery {
    pub project: Option<String>,
    pub state: Option<String>,
    /// Id prefix.
    pub q: Option<String>,
    pub after: Option<String>,
    pub limit: Option<i64>,
}

async fn triggers(
    console: web::Data<Console>,
    query: web::Query<TriggersQuery>,
    format: Format,
) -> HttpResponse {
    let q = query.into_inner();
    let r = async {
        let state = match given(&q.state).unwrap_or("all") {
            "all" => StateFilter::All,
            "enabled" => StateFilter::Enabled,
            "disabled" => StateFilter::Disabled,
            "overdue" => StateFilter::Overdue,
            other => {
                return Err(Failure::BadRequest(format!(
                    "state `{other}`: must be one of all, enabled, disabled, overdue"
                )))
            }
        };
        let f = TriggerFilter {
            project: given(&q.project),
            state,
            prefix: given(&q.q),
            after: given(&q.after),
            limit: page_limit(q.limit)?,
        };
        let page =
            read!(console, tx => crate::present::triggers::trigger_page(&tx, &f, true).await?)?;
        Ok((pages::triggers(&q, f.limit, &page), to_json(&page)?))
    }
    .await;
    respond(format, r)
}

async fn trigger(
    console: web::Data<Console>,
    id: String,
    format: Format,
    who: Option<&auth::Who>,
) -> HttpResponse {
    let r = async {
        let d = read!(console, tx => crate::present::triggers::trigger_detail(&tx, &id, 10, 50).await?)?;
        let actions = forms::trigger_actions(&console.tokens, who, &d.item.view);
        Ok((pages::trigger(&d, actions), to_json(&d)?))
    }
    .await;
    respond(format, r)
}

#[derive(Deserialize)]
pub(crate) struct RunsQuery {
    pub trigger: Option<String>,
    pub kind: Option<String>,
    pub status: Option<String>,
    pub before: Option<String>,
    pub limit: Option<i64>,
}

async fn runs(
    console: web::Data<Console>,
    query: web::Query<RunsQuery>,
    format: Format,
) -> HttpResponse {
    let q = query.into_inner();
    let r = async {
        let kind = given(&q.kind);
        if let Some(k) = kind.filter(|k| !browse::is_run_kind(k)) {
            return Err(Failure::BadRequest(format!(
                "kind `{k}`: must be one of cron, manual, backfill"
            )));
        }
        let status = given(&q.status);
        if let Some(s) = status.filter(|s| !browse::RUN_STATUSES.contains(s)) {
            return Err(Failure::BadRequest(format!(
                "status `{s}`: must be one of {}",
                browse::RUN_STATUSES.join(", ")
            )));
        }
        let before = match given(&q.before) {
            None => None,
            Some(b) => Some(browse::parse_run_cursor(b).ok_or_else(|| {
                Failure::BadRequest(format!("before `{b}`: not a cursor QUEUED_AT_MS:RUN_ID"))
            })?),
        };
        let f = RunFilter {
            trigger: given(&q.trigger),
            kind,
            status,
            before,
            limit: page_limit(q.limit)?,
        };
        let page = read!(console, tx => browse::run_page(&tx, &f).await?)?;
        Ok((pages::runs(&q, f.limit, &page), to_json(&page)?))
    }
    .await;
    respond(format, r)
}

#[derive(Deserialize)]
pub(crate) struct AuditQuery {
    pub trigger: Option<String>,
    pub project: Option<String>,
    pub before: Option<String>,
    pub limit: Option<i64>,
}

/// The audit log, newest first, in keyset pages (`before` = `AT_MS:AUDIT_ID`).
async fn audit(
    console: web::Data<Console>,
    query: web::Query<AuditQuery>,
    format: Format,
) -> HttpResponse {
    let q = query.into_inner();
    let r = async {
        let before = match given(&q.before) {
            None => None,
            Some(b) => Some(crate::store::audit::parse_cursor(b).ok_or_else(|| {
                Failure::BadRequest(format!("before `{b}`: not a cursor AT_MS:AUDIT_ID"))
            })?),
        };
        let f = crate::store::audit::AuditFilter {
            trigger: given(&q.trigger),
            project: given(&q.project),
            since_ms: None,
            before,
            limit: page_limit(q.limit)?,
        };
        let page = read!(console, tx => crate::store::audit::page(&tx, &f).await?)?;
        Ok((pages::audit(&q, f.limit, &page), to_json(&page)?))
    }
    .await;
    respond(format, r)
}

async fn run(
    console: web::Data<Console>,
    id: String,
    format: Format,
    who: Option<&auth::Who>,
) -> HttpResponse {
    let r = async {
        let run_id = uuid::Uuid::parse_str(&id)
            .map_err(|_| Failure::BadRequest(format!("run `{id}`: not a run id (a UUID)")))?;
        let d = read!(console, tx => browse::run_detail_in(&tx, run_id).await?)?
            .ok_or_else(|| Failure::NotFound(format!("unknown run `{id}`")))?;
        let actions = forms::run_actions(&console.tokens, who, &d);
        Ok((pages::run(&d, actions), to_json(&d)?))
    }
    .await;
    respond(format, r)
}

/// Every console route, each behind the credentials check.
async fn dispatch(req: HttpRequest, console: web::Data<Console>) -> HttpResponse {
    let who = match console.admit(&req) {
        Ok(who) => who,
        Err(refused) => return *refused,
    };
    let who = who.as_ref();
    let path = req.path().to_owned();
    let query = |req: &HttpRequest| req.query_string().to_owned();
    macro_rules! q {
        ($t:ty) => {
            match web::Query::<$t>::from_query(&query(&req)) {
                Ok(q) => q,
                Err(e) => {
                    return respond(Format::Html, Err(Failure::BadRequest(e.to_string())));
                }
            }
        };
    }
    let stat = |ct: &str, body: &'static str| {
        let mut b = HttpResponse::Ok();
        secure(&mut b);
        b.insert_header((header::CACHE_CONTROL, "max-age=300"))
            .content_type(ct.to_owned())
            .body(body)
    };
    match path.as_str() {
        "/" => overview(console, Format::Html).await,
        "/api/v1/overview" => overview(console, Format::Json).await,
        "/triggers" => triggers(console, q!(TriggersQuery), Format::Html).await,
        "/api/v1/triggers" => triggers(console, q!(TriggersQuery), Format::Json).await,
        "/runs" => runs(console, q!(RunsQuery), Format::Html).await,
        "/api/v1/runs" => runs(console, q!(RunsQuery), Format::Json).await,
        "/audit" => audit(console, q!(AuditQuery), Format::Html).await,
        "/api/v1/audit" => audit(console, q!(AuditQuery), Format::Json).await,
        "/static/console.css" => stat("text/css; charset=utf-8", CSS),
        "/static/console.js" => stat("text/javascript; charset=utf-8", JS),
        "/static/icon.svg" | "/favicon.ico" => stat("image/svg+xml", ICON),
        p => {
            let id = req.match_info().get("id").map(str::to_owned);
            match id {
                Some(id) if p.starts_with("/api/v1/triggers/") => {
                    trigger(console, id, Format::Json, who).await
                }
                Some(id) if p.starts_with("/triggers/") => {
                    trigger(console, id, Format::Html, who).await
                }
                Some(id) if p.starts_with("/api/v1/runs/") => {
                    run(console, id, Format::Json, who).await
                }
                Some(id) if p.starts_with("/runs/") => run(console, id, Format::Html, who).await,
                _ => respond(
                    Format::Html,
                    Err(Failure::NotFound(format!("no page at {p}"))),
                ),
            }
        }
    }
}

/// Adds the console's routes to an HTTP app.
pub fn configure(cfg: &mut web::ServiceConfig, console: Console) {
    cfg.app_data(web::Data::new(console));
    for path in [
        "/",
        "/api/v1/overview",
        "/triggers",
        "/api/v1/triggers",
        "/triggers/{id}",
        "/api/v1/triggers/{id}",
        "/runs",
        "/api/v1/runs",
        "/runs/{id}",
        "/api/v1/runs/{id}",
        "/audit",
        "/api/v1/audit",
        "/static/console.css",
        "/static/console.js",
        "/static/icon.svg",
        "/favicon.ico",
    ] {
        cfg.route(path, web::get().to(dispatch));
    }
    // The operator actions: POST only (a GET of these paths is a 404 of the page router).
    for path in ["/triggers/{id}/{action}", "/runs/{id}/{action}"] {
        cfg.route(path, web::post().to(actions::handle));
    }
}
