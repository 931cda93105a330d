//! The admin HTTP server: `GET /status`, `/metrics`, `/healthz`.
//!
//! Owns the routes and their bodies (`/status` can wait for the next change of the board). It only reads the status board and the metrics registry;
//! it must never change controller state.

use std::future::Future;
use std::sync::Arc;

use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::{header, HeaderName, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};

use crate::metrics::Metrics;
use crate::status::StatusBoard;

/// What the admin routes read.
#[derive(Debug, Clone)]
pub struct AdminState {
    /// The status board.
    pub board: Arc<StatusBoard>,
    /// The metrics.
    pub metrics: Arc<Metrics>,
}

/// The admin routes.
pub fn router(state: AdminState) -> Router {
    Router::new()
        .route("/status", get(status))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok\n" }))
        .fallback(|| async { (StatusCode::NOT_FOUND, Json(serde_json::json!({"error": "no such route"}))) })
        .with_state(state)
}

/// The longest `GET /status?after=N` waits.
const MAX_WAIT: Duration = Duration::from_secs(30);

/// `GET /status` query: `after` = a version seen before (answer once the board moved past it,
/// or after `wait_ms`, default and at most 30 s).
#[derive(Debug, Default, serde::Deserialize)]
struct StatusQuery {
    after: Option<u64>,
    wait_ms: Option<u64>,
}

/// `GET /status[?after=N[&wait_ms=M]]`: the snapshot, with its version in `x-status-version`; with
/// `after`, answered only once the board changed past version `after` (or the wait ended), so a
/// client waiting for convergence need not poll.
async fn status(State(s): State<AdminState>, Query(q): Query<StatusQuery>) -> Response {
    if let Some(after) = q.after {
        let wait = q.wait_ms.map_or(MAX_WAIT, Duration::from_millis).min(MAX_WAIT);
        s.board.wait_change(after, wait).await;
    }
    let (snap, version) = s.board.versioned_snapshot();
    ([(HeaderName::from_static(VERSION_HEADER), version.to_string())], Json(snap)).into_response()
}

/// The header carrying the status board's version.
pub const VERSION_HEADER: &str = "x-status-version";

async fn metrics(State(s): State<AdminState>) -> Response {
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], s.metrics.encode())
        .into_response()
}

/// Serves the admin routes on a bound listener until `shutdown` completes.
pub async fn serve(
    listener: tokio::net::TcpListener,
    state: AdminState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(state)).with_graceful_shutdown(shutdown).await
}
