//! The admin HTTP server: `GET /status`, `/metrics`, `/healthz`.
//!
//! Owns the routes and their bodies. It only reads the status board and the metrics registry;
//! it must never change controller state.

use std::future::Future;
use std::sync::Arc;

use axum::extract::State;
use axum::http::{header, StatusCode};
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

async fn status(State(s): State<AdminState>) -> Response {
    Json(s.board.snapshot()).into_response()
}

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
