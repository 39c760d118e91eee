//! `/healthz`, `/readyz` and `/metrics` of a worker (actix-web), as a replica serves them
//! (src/http): `/healthz` 200 while the process runs; `/readyz` 200 while it takes runs
//! (the database answered its last take; 503 from the first moment of a stop); `/metrics`
//! Prometheus text. No console. HTTPS with `[http] tls_cert_file` and `tls_key_file`.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use actix_web::{web, App, HttpResponse};

use super::metrics::WorkerMetrics;
use crate::http;

/// What `/readyz` answers.
#[derive(Clone, Default)]
pub struct Ready(Arc<AtomicBool>);

impl Ready {
    pub fn set(&self, ready: bool) {
        self.0.store(ready, Ordering::SeqCst);
    }
    pub fn get(&self) -> bool {
        self.0.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct State {
    ready: Ready,
    metrics: WorkerMetrics,
}

async fn readyz(state: web::Data<State>) -> HttpResponse {
    http::readiness(state.ready.get())
}

async fn metrics_text(state: web::Data<State>) -> HttpResponse {
    http::metrics_text(state.metrics.render())
}

/// Binds and starts the server on the current actix system; returns its handle.
pub fn serve(
    bind: SocketAddr,
    ready: Ready,
    metrics: WorkerMetrics,
    tls: Option<rustls::ServerConfig>,
) -> std::io::Result<actix_web::dev::ServerHandle> {
    let state = State { ready, metrics };
    let app = move || {
        App::new()
            .app_data(web::Data::new(state.clone()))
            .route("/healthz", web::get().to(http::healthz))
            .route("/readyz", web::get().to(readyz))
            .route("/metrics", web::get().to(metrics_text))
    };
    http::start(app, bind, tls)
}
