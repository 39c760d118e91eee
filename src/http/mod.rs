//! Health, readiness and metrics over HTTP (actix-web).
//!
//! - `GET /healthz`: 200 while the process runs.
//! - `GET /readyz`: 200 only after `db check`, recovery and the lifecycle have started, and
//!   while the database answers; 503 from the first moment of a stop, while the supervisor is
//!   gone, and while claim rounds have failed for longer than one lease.
//! - `GET /metrics`: Prometheus text.
//! - The read-only web console and `/api/v1/…` when `[http] console` turns it on
//!   (src/console, docs/console.md).
//!
//! Every path but `/healthz`, `/readyz` and `/metrics` (probes and Prometheus reach those by
//! address) answers only to its own names: the `Host` must be a loopback name (`localhost`,
//! `127.0.0.1`, `[::1]`) or one of `[http] public_names`, else 421. A page of another site
//! that a browser reaches through the operator's SSH tunnel by DNS rebinding carries its own
//! name. With `[http] tls_cert_file` and `tls_key_file` the port speaks HTTPS only (tls.rs).

pub mod tls;

use std::net::SocketAddr;

use actix_web::body::{BoxBody, MessageBody};
use actix_web::dev::{Service, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::http::header;
use actix_web::{web, App, HttpResponse, HttpServer};
use futures::future::LocalBoxFuture;

use crate::health::Health;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct State {
    pub health: Health,
    pub metrics: Metrics,
    /// `None`: the console is off (its paths answer 404).
    pub console: Option<crate::console::Console>,
    /// `[http] public_names`: names besides the loopback names that `Host` may carry.
    pub public_names: Vec<String>,
}

/// Names every replica answers to.
const LOOPBACK_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// Paths that answer whatever the `Host` (scraped and probed by address).
fn by_address(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/metrics")
}

/// The host of a `Host` header or a URI authority: without port and brackets, lower case,
/// without a trailing dot.
fn host_name(value: &str) -> String {
    let host = match value.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(""),
        None if value.matches(':').count() == 1 => value.split(':').next().unwrap_or(""),
        None => value,
    };
    host.trim_end_matches('.').to_ascii_lowercase()
}

/// Whether a request names this replica: its `Host` (required) and the authority of an
/// absolute request URI (if any) are each a loopback name or one of `public`.
fn own_host(req: &ServiceRequest, public: &[String]) -> bool {
    let ok = |v: &str| {
        let h = host_name(v);
        LOOPBACK_NAMES.contains(&h.as_str()) || public.contains(&h)
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok());
    host.is_some_and(ok) && req.uri().authority().map_or(true, |a| ok(a.as_str()))
}

/// Passes a request on when it may answer it (by address, or named by its own `Host`);
/// answers 421 otherwise.
fn host_guard<S, B>(
    req: ServiceRequest,
    srv: &S,
    public: &[String],
) -> LocalBoxFuture<'static, Result<ServiceResponse<BoxBody>, actix_web::Error>>
where
    S: Service<ServiceRequest, Response = ServiceResponse<B>, Error = actix_web::Error>,
    S::Future: 'static,
    B: MessageBody + 'static,
{
    if by_address(req.path()) || own_host(&req, public) {
        let fut = srv.call(req);
        Box::pin(async move { Ok(fut.await?.map_into_boxed_body()) })
    } else {
        let res = req.into_response(misdirected());
        Box::pin(async move { Ok(res) })
    }
}

fn misdirected() -> HttpResponse {
    HttpResponse::MisdirectedRequest()
        .content_type("text/plain; charset=utf-8")
        .body(
            "421 Misdirected Request: this replica's console answers to localhost, 127.0.0.1, \
             [::1] and the names in [http] public_names\n",
        )
}

/// `/healthz`: 200 while the process runs (a replica's and a worker's).
pub(crate) async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

/// What `/readyz` answers: 200 when `ready`, else 503.
pub(crate) fn readiness(ready: bool) -> HttpResponse {
    if ready {
        HttpResponse::Ok()
            .content_type("text/plain")
            .body("ready\n")
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body("not ready\n")
    }
}

/// What `/metrics` answers: `text`, Prometheus (OpenMetrics) exposition.
pub(crate) fn metrics_text(text: String) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(text)
}

async fn readyz(state: web::Data<State>) -> HttpResponse {
    readiness(state.health.is_ready())
}

async fn metrics(state: web::Data<State>) -> HttpResponse {
    metrics_text(state.metrics.render())
}

/// Binds and starts the server on the current actix system, speaking HTTPS when `tls` is
/// given; returns its handle.
pub fn serve(
    bind: SocketAddr,
    state: State,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<actix_web::dev::ServerHandle> {
    let app = move || {
        let console = state.console.clone();
        let public = state.public_names.clone();
        App::new()
            .app_data(web::Data::new(state.clone()))
            .wrap_fn(move |req, srv| host_guard(req, srv, &public))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(metrics))
            .configure(move |cfg| {
                if let Some(c) = console {
                    crate::console::configure(cfg, c);
                }
            })
    };
    start(app, bind, tls)
}

/// Binds `app` on `bind` (HTTPS when `tls` is given), one worker thread, no signal handling
/// of its own, and starts it on the current actix system; returns its handle. A replica's
/// server and a worker's start this way.
pub(crate) fn start<F, T, B>(
    app: F,
    bind: SocketAddr,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<actix_web::dev::ServerHandle>
where
    F: Fn() -> App<T> + Send + Clone + 'static,
    T: ServiceFactory<
            ServiceRequest,
            Config = (),
            Response = ServiceResponse<B>,
            Error = actix_web::Error,
            InitError = (),
        > + 'static,
    B: MessageBody + 'static,
{
    let server = HttpServer::new(app)
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1);
    let server = match tls {
        Some(cfg) => server.bind_rustls_0_23(bind, cfg)?,
        None => server.bind(bind)?,
    }
    .run();
    let handle = server.handle();
    actix::spawn(async move {
        let _ = server.await;
    });
    Ok(handle)
}

#[cfg(test)]
mod tests {
    use super::host_name;

    #[test]
    fn host_names_lose_port_brackets_case_and_trailing_dot() {
        assert_eq!(host_name("LocalHost:9187"), "localhost");
        assert_eq!(host_name("[::1]:9187"), "::1");
        assert_eq!(host_name("[::1]"), "::1");
        assert_eq!(host_name("sched.example.org."), "sched.example.org");
        assert_eq!(host_name("127.0.0.1"), "127.0.0.1");
    }
}
