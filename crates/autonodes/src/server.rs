//! The HTTP server of `autonodes run`: `/metrics`, `/healthz`, `/readyz` (axum). With
//! `--metrics-auth`, `/metrics` answers only callers the management cluster authorizes
//! ([`crate::metrics_auth`]) and the server speaks HTTPS ([`crate::metrics_tls`]); the
//! probes stay open.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;

use crate::metrics::Metrics;
use crate::metrics_auth::{MetricsAuth, Verdict};

/// What the handlers read.
#[derive(Clone)]
pub(crate) struct ServerState {
    /// The metrics to serve.
    pub metrics: Arc<Metrics>,
    /// True once every watch has synced.
    pub ready: Arc<AtomicBool>,
    /// True while the controller loops run.
    pub alive: Arc<AtomicBool>,
    /// Who may read `/metrics` (`None`: anybody).
    pub auth: Option<Arc<MetricsAuth>>,
}

/// The router with all endpoints.
pub(crate) fn router(state: ServerState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(state)
}

async fn metrics(
    State(s): State<ServerState>,
    headers: HeaderMap,
) -> (StatusCode, [(&'static str, &'static str); 2], String) {
    if let Some(auth) = &s.auth {
        let header = headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok());
        let refused = match auth.check(header).await {
            Verdict::Allowed => None,
            Verdict::Unauthenticated => Some((StatusCode::UNAUTHORIZED, "Unauthorized\n")),
            Verdict::Forbidden => Some((StatusCode::FORBIDDEN, "Forbidden\n")),
            Verdict::Unavailable => Some((
                StatusCode::SERVICE_UNAVAILABLE,
                "cannot review the caller now\n",
            )),
            Verdict::Throttled => Some((
                StatusCode::TOO_MANY_REQUESTS,
                "too many callers to review; try again in a second\n",
            )),
        };
        if let Some((status, text)) = refused {
            // A throttled caller may come back in a second; no answer here is cached.
            let again = if status == StatusCode::TOO_MANY_REQUESTS {
                ("retry-after", "1")
            } else {
                ("cache-control", "no-store")
            };
            return (
                status,
                [("content-type", "text/plain"), again],
                text.to_string(),
            );
        }
    }
    (
        StatusCode::OK,
        [
            ("content-type", "text/plain; version=0.0.4"),
            ("cache-control", "no-store"),
        ],
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
