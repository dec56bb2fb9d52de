//! The HTTP server of `autonodes run`: `/metrics`, `/healthz`, `/readyz` (axum).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;

use crate::metrics::Metrics;

/// What the handlers read.
#[derive(Clone)]
pub struct ServerState {
    /// The metrics to serve.
    pub metrics: Arc<Metrics>,
    /// True once every watch has synced.
    pub ready: Arc<AtomicBool>,
    /// True while the controller loops run.
    pub alive: Arc<AtomicBool>,
}

/// The router with all endpoints.
pub fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(
    State(s): State<ServerState>,
) -> (StatusCode, [(&'static str, &'static str); 1], String) {
    (
        StatusCode::OK,
        [("content-type", "text/plain; version=0.0.4")],
        s.metrics.encode(),
    )
}

async fn healthz(State(s): State<ServerState>) -> (StatusCode, &'static str) {
    if s.alive.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "controller loops stopped")
    }
}

async fn readyz(State(s): State<ServerState>) -> (StatusCode, &'static str) {
    if s.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "caches not synced")
    }
}
