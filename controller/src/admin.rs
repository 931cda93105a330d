//! The admin HTTP server: `GET /healthz`, `/readyz`, `/metrics` for anyone; `GET /status` only
//! for a peer on the loopback interface (the controller's own pod, or a port-forward, which needs
//! the right to port-forward to the pod).
//!
//! Owns the routes, who may read each ([`peer_may_read`]) and their bodies (`/status` can wait
//! for the next change of the board). It only reads the status board and the metrics registry;
//! it must never change controller state, and never answer `/status` (which carries HAProxy's
//! words about every namespace's objects) to a peer off the loopback interface.

use std::future::Future;
use std::sync::Arc;

use std::time::Duration;

use std::net::SocketAddr;

use axum::extract::{ConnectInfo, Query, Request, State};
use axum::http::{header, HeaderName, StatusCode};
use axum::middleware::{self, Next};
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
        .route("/readyz", get(|| async { "ok\n" }))
        .fallback(|| async { (StatusCode::NOT_FOUND, Json(serde_json::json!({"error": "no such route"}))) })
        .layer(middleware::from_fn(guard))
        .with_state(state)
}

/// The paths anyone may read: probes and metrics.
pub const OPEN_PATHS: [&str; 3] = ["/healthz", "/readyz", "/metrics"];

/// Whether `peer` may read `path`: an [`OPEN_PATHS`] entry from anywhere, anything else only
/// from a loopback address (an unknown peer is not loopback). Pure.
pub fn peer_may_read(path: &str, peer: Option<SocketAddr>) -> bool {
    OPEN_PATHS.contains(&path) || peer.is_some_and(|p| p.ip().is_loopback() || loopback_mapped(p))
}

/// `::ffff:127.x.y.z`, as a dual-stack listener sees an IPv4 loopback peer.
fn loopback_mapped(p: SocketAddr) -> bool {
    match p.ip() {
        std::net::IpAddr::V6(v6) => v6.to_ipv4_mapped().is_some_and(|v4| v4.is_loopback()),
        std::net::IpAddr::V4(_) => false,
    }
}

/// Refuses (403) what [`peer_may_read`] refuses, before the route runs.
async fn guard(req: Request, next: Next) -> Response {
    let peer = req.extensions().get::<ConnectInfo<SocketAddr>>().map(|c| c.0);
    if peer_may_read(req.uri().path(), peer) {
        return next.run(req).await;
    }
    let error = "forbidden: only /healthz, /readyz and /metrics answer off the loopback interface";
    (StatusCode::FORBIDDEN, Json(serde_json::json!({ "error": error }))).into_response()
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
    axum::serve(listener, router(state).into_make_service_with_connect_info::<SocketAddr>())
        .with_graceful_shutdown(shutdown)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use tower::ServiceExt as _;

    #[test]
    fn only_probes_and_metrics_are_open() {
        let (lo, lo6, far) =
            ("127.0.0.1:1".parse().ok(), "[::ffff:127.0.0.2]:1".parse().ok(), "10.0.0.1:1".parse().ok());
        for p in OPEN_PATHS {
            assert!(peer_may_read(p, far) && peer_may_read(p, None), "{p}");
        }
        for p in ["/status", "/status/", "/debug", "/", "//status", "/STATUS", "/metrics/x"] {
            assert!(!peer_may_read(p, far) && !peer_may_read(p, None), "{p}");
            assert!(peer_may_read(p, lo) && peer_may_read(p, lo6), "{p}");
        }
        assert!(!peer_may_read("/status", "[::ffff:10.0.0.1]:1".parse().ok()));
    }

    /// Through the router: a peer off the loopback interface reads probes and metrics, and is
    /// refused `/status` and every other path; a loopback peer reads `/status`.
    #[tokio::test]
    async fn the_router_refuses_status_off_loopback() {
        let gate =
            crate::status::GateStatus::from_latch(&crate::gate::Latch::new(crate::gate::GateMode::Optimistic), None);
        let board = Arc::new(StatusBoard::new(gate, crate::status::ControllerStatus::default()));
        let state = AdminState { board, metrics: Arc::new(Metrics::new()) };
        let get = |path: &str, peer: &str| {
            let mut req = axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap();
            req.extensions_mut().insert(ConnectInfo::<SocketAddr>(peer.parse().unwrap()));
            router(state.clone()).oneshot(req)
        };
        for p in OPEN_PATHS {
            assert_eq!(get(p, "10.1.2.3:5").await.unwrap().status(), StatusCode::OK, "{p}");
        }
        for p in ["/status", "/status?after=1&wait_ms=1", "/nope"] {
            assert_eq!(get(p, "10.1.2.3:5").await.unwrap().status(), StatusCode::FORBIDDEN, "{p}");
        }
        assert_eq!(get("/status", "127.0.0.1:5").await.unwrap().status(), StatusCode::OK);
        assert_eq!(get("/nope", "127.0.0.1:5").await.unwrap().status(), StatusCode::NOT_FOUND);
    }
}
