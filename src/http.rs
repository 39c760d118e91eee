//! Health, readiness and metrics over HTTP (actix-web).
//!
//! - `GET /healthz`: 200 while the process runs.
//! - `GET /readyz`: 200 only after `db check`, recovery and the lifecycle have started, and
//!   while the database answers; 503 from the first moment of a stop, while the supervisor is
//!   gone, and while claim rounds have failed for longer than one lease.
//! - `GET /metrics`: Prometheus text.
//! - The read-only web console and `/api/v1/…` when `[http] console` turns it on
//!   (src/console, docs/console.md).

use std::net::SocketAddr;

use actix_web::{web, App, HttpResponse, HttpServer};

use crate::health::Health;
use crate::metrics::Metrics;

#[derive(Clone)]
pub struct State {
    pub health: Health,
    pub metrics: Metrics,
    /// `None`: the console is off (its paths answer 404).
    pub console: Option<crate::console::Console>,
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().content_type("text/plain").body("ok\n")
}

async fn readyz(state: web::Data<State>) -> HttpResponse {
    if state.health.is_ready() {
        HttpResponse::Ok()
            .content_type("text/plain")
            .body("ready\n")
    } else {
        HttpResponse::ServiceUnavailable()
            .content_type("text/plain")
            .body("not ready\n")
    }
}

async fn metrics(state: web::Data<State>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/openmetrics-text; version=1.0.0; charset=utf-8")
        .body(state.metrics.render())
}

/// Binds and starts the server on the current actix system; returns its handle.
pub fn serve(bind: SocketAddr, state: State) -> std::io::Result<actix_web::dev::ServerHandle> {
    let server = HttpServer::new(move || {
        let console = state.console.clone();
        App::new()
            .app_data(web::Data::new(state.clone()))
            .route("/healthz", web::get().to(healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(metrics))
            .configure(move |cfg| {
                if let Some(c) = console {
                    crate::console::configure(cfg, c);
                }
            })
    })
    .workers(1)
    .disable_signals()
    .shutdown_timeout(1)
    .bind(bind)?
    .run();
    let handle = server.handle();
    actix::spawn(async move {
        let _ = server.await;
    });
    Ok(handle)
}
