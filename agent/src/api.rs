//! The agent's HTTP surface: `GET /v1/state[?verify=1]`, `POST /v1/apply`, `/healthz`,
//! `/readyz`, `/metrics`.
//!
//! Owns routing, HTTP Basic auth on `/v1/*` (against `crate::credentials`), the body limit, JSON
//! decoding and the mapping of outcomes to 200/400/401/409/413/422/500 JSON bodies, and logging
//! each refusal once. It must never change the tree or talk to HAProxy itself: everything goes
//! through [`crate::apply::Agent`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::rejection::QueryRejection;
use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use haptic_protocol::api::{Unavailable, HAPROXY_UNAVAILABLE};
use haptic_protocol::ErrorBody;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tracing::warn;

use crate::apply::{Agent, Refusal};
use crate::body::BodyError;
use crate::credentials::CredentialSet;
use crate::tree::Drift;

/// The HTTP server's resource bounds (flags of `haptic-agent run`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest accepted request body (`--max-body`).
    pub max_body: usize,
    /// How long a request's headers may take, counted from when the connection waits for it.
    pub header_timeout: Duration,
    /// How long a kept-alive connection may wait for its next request.
    pub idle_timeout: Duration,
    /// How long a whole request body may take to arrive.
    pub body_timeout: Duration,
    /// How long a request body may go without a new byte (then the connection is closed).
    pub body_stall_timeout: Duration,
    /// The most connections served at once; more are closed at once.
    pub max_connections: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            max_body: 256 << 20,
            header_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(60),
            body_timeout: Duration::from_secs(120),
            body_stall_timeout: Duration::from_secs(15),
            max_connections: 64,
        }
    }
}

/// How many applies may be admitted at once: one running, one waiting for the apply lock.
/// Admission comes before the body is read, so at most two bodies are ever held.
pub const APPLY_SLOTS: usize = 2;

/// What the HTTP handlers share.
#[derive(Debug, Clone)]
pub struct AppState {
    /// The agent.
    pub agent: Arc<Agent>,
    /// The `/v1/*` credentials (rotated while running, see [`crate::credentials`]).
    pub credentials: CredentialSet,
    /// Resource bounds.
    pub limits: Limits,
    /// Admission of applies (see [`APPLY_SLOTS`]).
    pub apply_slots: Arc<Semaphore>,
}

impl AppState {
    /// The handlers' state.
    pub fn new(agent: Arc<Agent>, credentials: impl Into<CredentialSet>, limits: Limits) -> Self {
        Self { agent, credentials: credentials.into(), limits, apply_slots: Arc::new(Semaphore::new(APPLY_SLOTS)) }
    }
}

fn error(status: StatusCode, msg: impl Into<String>) -> Response {
    (status, Json(ErrorBody { error: msg.into() })).into_response()
}

/// The router.
pub fn router(state: AppState) -> Router {
    let v1 = Router::new()
        .route("/v1/state", get(get_state))
        .route("/v1/apply", post(post_apply))
        // The apply handler reads its body itself, bounded (see `read_body`).
        .layer(DefaultBodyLimit::disable());
    Router::new()
        .merge(v1)
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .fallback(|| async { error(StatusCode::NOT_FOUND, "no such endpoint") })
        .method_not_allowed_fallback(method_not_allowed)
        // Outermost: every `/v1` path, known or not, needs credentials before anything is said
        // about it (so an unknown `/v1/x` is a 401 without them and a JSON 404 with them).
        .layer(middleware::from_fn_with_state(state.clone(), auth))
        .with_state(state)
}

/// Serves `router` on `listener` until `shutdown` resolves; in-flight requests finish first.
///
/// HTTP/1 only, with a header read timeout that also bounds how long a connection may wait for
/// its next request (`min(header, idle)`), and at most `max_connections` connections: more are
/// closed as soon as they are accepted, so a flood of idle connections never exhausts the
/// agent's file descriptors.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_tls(listener, state, None, shutdown).await
}

/// [`serve`], over TLS when `tls` is given (the handshake is bounded by the header timeout).
pub async fn serve_tls(
    listener: TcpListener,
    state: AppState,
    tls: Option<tokio_rustls::TlsAcceptor>,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let limits = state.limits;
    let app = router(state);
    let conns = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(hyper_util::rt::TokioTimer::new())
        .header_read_timeout(limits.header_timeout.min(limits.idle_timeout))
        .keep_alive(true);
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                let stream = match accepted {
                    Ok((s, _)) => s,
                    Err(e) => {
                        // EMFILE and friends: back off instead of spinning.
                        warn!("accept failed: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let Ok(permit) = conns.clone().try_acquire_owned() else {
                    warn!(max = limits.max_connections, "connection refused: too many connections");
                    drop(stream);
                    continue;
                };
                let svc = hyper_util::service::TowerToHyperService::new(app.clone());
                match &tls {
                    None => {
                        let conn = graceful.watch(http.serve_connection(hyper_util::rt::TokioIo::new(stream), svc));
                        tokio::spawn(async move {
                            let _ = conn.await;
                            drop(permit);
                        });
                    }
                    Some(acceptor) => {
                        let (acceptor, http, watcher) = (acceptor.clone(), http.clone(), graceful.watcher());
                        let handshake = limits.header_timeout.min(limits.idle_timeout);
                        tokio::spawn(async move {
                            match tokio::time::timeout(handshake, acceptor.accept(stream)).await {
                                Ok(Ok(tls)) => {
                                    let conn = http.serve_connection(hyper_util::rt::TokioIo::new(tls), svc);
                                    let _ = watcher.watch(conn).await;
                                }
                                Ok(Err(e)) => tracing::debug!("TLS handshake failed: {e}"),
                                Err(_) => tracing::debug!("TLS handshake timed out"),
                            }
                            drop(permit);
                        });
                    }
                }
            }
            () = &mut shutdown => break,
        }
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

async fn method_not_allowed(req: Request) -> Response {
    error(StatusCode::METHOD_NOT_ALLOWED, format!("method {} is not allowed on {}", req.method(), req.uri().path()))
}

/// Whether `path` is under `/v1` (and so needs credentials).
fn is_v1(path: &str) -> bool {
    path == "/v1" || path.starts_with("/v1/")
}

async fn auth(State(st): State<AppState>, req: Request, next: Next) -> Response {
    if !is_v1(req.uri().path()) {
        return next.run(req).await;
    }
    let h = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if !st.credentials.accepts(h) {
        let what = if h.is_some() { "wrong credentials" } else { "no credentials" };
        warn!(root = %st.agent.config().root.display(), path = %req.uri().path(), "refused: {what}");
        let mut resp = error(StatusCode::UNAUTHORIZED, what);
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, header::HeaderValue::from_static("Basic realm=\"haptic\""));
        return resp;
    }
    next.run(req).await
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StateQuery {
    #[serde(default)]
    verify: Option<String>,
}

/// `verify=` values: `1|true|yes` and `0|false|no`; anything else is a bad query. Pure.
fn parse_verify(v: Option<&str>) -> Result<bool, String> {
    match v {
        None | Some("0" | "false" | "no") => Ok(false),
        Some("1" | "true" | "yes") => Ok(true),
        Some(other) => Err(format!("bad query: verify={other:?} (expected 1 or 0)")),
    }
}

async fn get_state(State(st): State<AppState>, q: Result<Query<StateQuery>, QueryRejection>) -> Response {
    let q = match q {
        Ok(Query(q)) => q,
        Err(rej) => return error(StatusCode::BAD_REQUEST, format!("bad query: {}", rej.body_text())),
    };
    let verify = match parse_verify(q.verify.as_deref()) {
        Ok(v) => v,
        Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
    };
    match st.agent.state_marked(verify).await {
        Ok((s, drift)) => Json(mark_drift(s, &drift)).into_response(),
        Err(e) => error(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
    }
}

fn too_large(max: usize) -> Response {
    error(StatusCode::PAYLOAD_TOO_LARGE, format!("body is over the limit of {max} bytes"))
}

/// The declared `Content-Length`, if any and readable.
fn content_length(h: &HeaderMap) -> Option<u64> {
    h.get(header::CONTENT_LENGTH)?.to_str().ok()?.trim().parse().ok()
}

/// The state as JSON, with each drifted file of `files` marked `"missing": true` or
/// `"not_regular": true` (peers that do not know the markers still see its changed digest).
fn mark_drift(s: haptic_protocol::StateResponse, drift: &[(haptic_protocol::RelPath, Drift)]) -> serde_json::Value {
    let mut v = serde_json::to_value(&s).unwrap_or_default();
    if drift.is_empty() {
        return v;
    }
    if let Some(files) = v.get_mut("files").and_then(|f| f.as_array_mut()) {
        for f in files {
            let Some(path) = f.get("path").and_then(|p| p.as_str()) else { continue };
            if let Some((_, how)) = drift.iter().find(|(p, _)| p.as_str() == path) {
                let key = match how {
                    Drift::Missing => "missing",
                    Drift::NotRegular => "not_regular",
                };
                f[key] = serde_json::Value::Bool(true);
            }
        }
    }
    v
}

async fn post_apply(State(st): State<AppState>, req: Request) -> Response {
    let root = st.agent.config().root.display().to_string();
    let max = st.limits.max_body;
    // Refused before a byte of the body is read.
    if content_length(req.headers()).is_some_and(|n| n > max as u64) {
        warn!(%root, "apply refused (413): declared body over {max} bytes");
        return too_large(max);
    }
    // One apply running, one waiting; the rest are told to come back.
    let Ok(_slot) = st.apply_slots.clone().try_acquire_owned() else {
        warn!(%root, "apply refused (429): an apply is running and another is waiting");
        let mut resp =
            error(StatusCode::TOO_MANY_REQUESTS, "busy: one apply is running and another is waiting; retry later");
        resp.headers_mut().insert(header::RETRY_AFTER, header::HeaderValue::from_static("1"));
        return resp;
    };
    // The body is decoded as it arrives, each part straight into a spool file: the apply never
    // holds the whole body, nor its decoded parts, in memory.
    let root_dir = st.agent.config().root.clone();
    let times = crate::body::BodyTimes { whole: st.limits.body_timeout, stall: st.limits.body_stall_timeout };
    let (req, spool) = match crate::body::decode_apply(&root_dir, req.into_body(), max, times).await {
        Ok(r) => r,
        Err(e) => {
            let status = match &e {
                BodyError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
                BodyError::TimedOut(_) | BodyError::Stalled(_) => StatusCode::REQUEST_TIMEOUT,
                BodyError::Read(_) | BodyError::Malformed(_) => StatusCode::BAD_REQUEST,
                BodyError::Local(_) => StatusCode::INTERNAL_SERVER_ERROR,
            };
            warn!(%root, "apply refused ({}): {e}", status.as_u16());
            return error(status, e.to_string());
        }
    };
    let (plan, fence) = (req.plan_id, req.fence.clone());
    let res = st.agent.apply_spooled(req, spool).await;
    match res {
        Ok(ack) => Json(ack).into_response(),
        Err(r) => {
            warn!(
                %root,
                plan = %plan.short(),
                fence = %fence,
                "apply refused: {}",
                r.message()
            );
            match r {
                Refusal::Stopping => error(StatusCode::SERVICE_UNAVAILABLE, Refusal::Stopping.message()),
                Refusal::BadRequest(m) => error(StatusCode::BAD_REQUEST, m),
                Refusal::Conflict(c) => (StatusCode::CONFLICT, Json(c)).into_response(),
                Refusal::Nack(n) => (StatusCode::UNPROCESSABLE_ENTITY, Json(n)).into_response(),
                Refusal::Internal(m) => error(StatusCode::INTERNAL_SERVER_ERROR, m),
                Refusal::Unavailable(reason) => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    Json(Unavailable { error: HAPROXY_UNAVAILABLE.into(), reason, applied: plan }),
                )
                    .into_response(),
            }
        }
    }
}

async fn readyz(State(st): State<AppState>) -> Response {
    if st.agent.ready().await {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        error(StatusCode::SERVICE_UNAVAILABLE, "HAProxy master CLI unreachable")
    }
}

async fn metrics(State(st): State<AppState>) -> Response {
    st.agent.count_old_workers().await;
    (
        [(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")],
        st.agent.metrics().encode(),
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verify_values() {
        assert_eq!(parse_verify(None), Ok(false));
        assert_eq!(parse_verify(Some("1")), Ok(true));
        assert_eq!(parse_verify(Some("0")), Ok(false));
        assert!(parse_verify(Some("maybe")).is_err());
        assert!(is_v1("/v1") && is_v1("/v1/x") && !is_v1("/v10") && !is_v1("/healthz"));
    }
}
