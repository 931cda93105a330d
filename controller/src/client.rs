//! The HTTP client for agents' `/v1` API.
//!
//! Owns credentials loading, Basic auth, timeouts (the sync timeout) and turning answers into
//! typed outcomes (ACK, 409 conflict, 422 NACK, other errors). It must never decide what to do
//! about an answer — that is the deployer's job.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use axum::body::Bytes;
use haptic_protocol::{Ack, ApplyRequest, Conflict, Nack, StateResponse};

use crate::agent_tls::AgentTrust;
use crate::error::Error;
use crate::seams::Endpoint;

/// Basic-auth credentials for the agents (`user:password`, one line).
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The user.
    pub user: String,
    /// The password.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials").field("user", &self.user).field("password", &"<redacted>").finish()
    }
}

impl Credentials {
    /// Reads a credentials file.
    pub fn load(path: &Path) -> Result<Self, Error> {
        let text = std::fs::read_to_string(path).map_err(|e| Error::io(path, e))?;
        let bad = |why: &str| Error::Credentials { path: path.to_path_buf(), why: why.into() };
        let line = text.lines().next().ok_or_else(|| bad("empty file"))?.trim_end_matches('\r');
        let (user, password) = line.split_once(':').ok_or_else(|| bad("expected one line user:password"))?;
        if user.is_empty() || password.is_empty() {
            return Err(bad("user and password must not be empty"));
        }
        Ok(Credentials { user: user.into(), password: password.into() })
    }
}

/// How an apply was answered.
#[derive(Debug, Clone)]
pub enum ApplyAnswer {
    /// 200.
    Ack(Ack),
    /// 409.
    Conflict(Conflict),
    /// 422.
    Nack(Nack),
    /// 503 `haproxy_unavailable`: HAProxy is not running on the pod (a failure of the pod, never
    /// a rejected render), with the agent's words, which start with "HAProxy not running".
    HaproxyDown(String),
    /// Any other status: 4xx (the agent refused the request itself: malformed, credentials,
    /// too large) or 5xx, with the agent's `error`.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The agent's words.
        error: String,
    },
}

/// A transport or protocol failure talking to one agent. Every variant names the request
/// (`GET <url>` / `POST <url>`) first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No answer: the connection could not be made, or broke before the answer was read.
    #[error("{request}: {cause}")]
    Connect {
        /// The request.
        request: String,
        /// Why, with its cause chain.
        cause: String,
        /// Why TLS refused the agent, when that is why.
        tls: Option<TlsRefusal>,
    },
    /// No answer within the client's timeout.
    #[error("{request}: {cause}")]
    Timeout {
        /// The request.
        request: String,
        /// Why, with its cause chain.
        cause: String,
    },
    /// An answer with a status this call does not accept.
    #[error("{request}: {status}: {error}")]
    Status {
        /// The request.
        request: String,
        /// The HTTP status.
        status: reqwest::StatusCode,
        /// The agent's `error` (or the start of its body).
        error: String,
    },
    /// The request could not be encoded (nothing was sent).
    #[error("{request}: encoding the request: {cause}")]
    Encode {
        /// The request.
        request: String,
        /// The encoder's words.
        cause: String,
    },
    /// An answer whose body does not decode.
    #[error("{request}: {}: {cause}", match .status { Some(s) => format!("{s} with undecodable body"), None => "undecodable state".to_string() })]
    Decode {
        /// The request.
        request: String,
        /// The status, for an answer other than a state read.
        status: Option<u16>,
        /// The decoder's words.
        cause: String,
    },
}

/// Why the controller's TLS refused an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsRefusal {
    /// Its certificate is not signed by an agent CA the controller trusts.
    UnknownIssuer,
    /// Its certificate is not for the name the controller expects.
    WrongName,
    /// The controller has no agent CA yet, so it trusts no agent.
    NoCa,
    /// Another certificate or handshake problem.
    Other,
}

impl TlsRefusal {
    /// What rustls said, as a refusal.
    fn of(e: &rustls::Error) -> Self {
        use rustls::CertificateError as C;
        match e {
            rustls::Error::InvalidCertificate(C::UnknownIssuer) => TlsRefusal::UnknownIssuer,
            rustls::Error::InvalidCertificate(C::NotValidForName | C::NotValidForNameContext { .. }) => {
                TlsRefusal::WrongName
            }
            rustls::Error::InvalidCertificate(C::Other(o))
                if o.0.downcast_ref::<crate::agent_tls::NoAgentCa>().is_some() =>
            {
                TlsRefusal::NoCa
            }
            _ => TlsRefusal::Other,
        }
    }

    /// The refusal in an error's cause chain, if TLS refused: rustls' error is found as itself or
    /// inside an I/O error (whose `source` skips what it wraps).
    fn in_chain(e: &(dyn std::error::Error + 'static)) -> Option<Self> {
        let mut cur = Some(e);
        while let Some(c) = cur {
            if let Some(r) = c.downcast_ref::<rustls::Error>() {
                return Some(TlsRefusal::of(r));
            }
            let wrapped = c.downcast_ref::<std::io::Error>().and_then(std::io::Error::get_ref);
            cur = match wrapped {
                Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
                None => c.source(),
            };
        }
        None
    }
}

impl CallError {
    fn transport(request: String, e: reqwest::Error) -> Self {
        let timeout = e.is_timeout();
        let e = e.without_url();
        let cause = error_chain(&e);
        if timeout {
            CallError::Timeout { request, cause }
        } else {
            CallError::Connect { request, cause, tls: TlsRefusal::in_chain(&e) }
        }
    }
}

/// The agents' HTTP client. Clones share the connection pool and the credentials, so a
/// rotated credential ([`AgentClient::set_credentials`]) reaches every clone at once.
///
/// After a rotation an agent may still hold the previous credential (a mounted Secret reaches
/// the pod up to a minute or two later): a request the agent refuses with 401 is sent once more
/// with the previous credential, so no pod is locked out while the agents catch up.
#[derive(Debug, Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    creds: Arc<RwLock<Rotation>>,
    trust: Option<Arc<AgentTrust>>,
}

/// The current credential and the one it replaced.
#[derive(Debug, Clone)]
struct Rotation {
    current: Credentials,
    previous: Option<Credentials>,
    /// Whether a fallback to `previous` was logged since the last rotation.
    fallback_logged: bool,
}

impl AgentClient {
    /// A client whose every request is bounded by `timeout`.
    pub fn new(creds: Credentials, timeout: Duration) -> Result<Self, Error> {
        Self::with_ca(creds, timeout, None)
    }

    /// [`Self::new`], trusting the PEM CA bundle `ca` for `https://` agents (rustls; no other
    /// roots are trusted), each verified for the host its URL names.
    pub fn with_ca(creds: Credentials, timeout: Duration, ca: Option<&[u8]>) -> Result<Self, Error> {
        let trust = match ca {
            Some(pem) => {
                let t = AgentTrust::new(None)?;
                t.set_ca(pem)?;
                Some(t)
            }
            None => None,
        };
        Self::with_trust(creds, timeout, trust)
    }

    /// [`Self::new`], verifying `https://` agents through `trust` (whose CA can be replaced while
    /// the client runs); without it no root is trusted at all.
    pub fn with_trust(creds: Credentials, timeout: Duration, trust: Option<Arc<AgentTrust>>) -> Result<Self, Error> {
        let builder = match &trust {
            Some(t) => reqwest::Client::builder().tls_backend_preconfigured(t.client_config()?),
            // Only these roots (none): never the system's.
            None => reqwest::Client::builder().tls_backend_rustls().tls_certs_only(Vec::new()),
        };
        let http = builder
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            // Below the agents' idle bound (`--header-timeout`, default 10 s), so a pooled connection is
            // never reused just as the agent closes it.
            .pool_idle_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        let rotation = Rotation { current: creds, previous: None, fallback_logged: false };
        Ok(AgentClient { http, creds: Arc::new(RwLock::new(rotation)), trust })
    }

    /// The trust towards `https://` agents, if this client has one.
    pub fn trust(&self) -> Option<&Arc<AgentTrust>> {
        self.trust.as_ref()
    }

    /// Replaces the credentials of this client and every clone (a rotated Secret); the replaced
    /// ones stay the fallback for agents that still refuse the new ones (until the next rotation).
    pub fn set_credentials(&self, creds: Credentials) {
        let mut r = self.creds.write().unwrap_or_else(|e| e.into_inner());
        if r.current != creds {
            let old = std::mem::replace(&mut r.current, creds);
            r.previous = Some(old);
            r.fallback_logged = false;
        }
    }

    /// The current credentials.
    pub fn credentials(&self) -> Credentials {
        self.creds.read().unwrap_or_else(|e| e.into_inner()).current.clone()
    }

    /// The credentials replaced by the last rotation.
    fn previous_credentials(&self) -> Option<Credentials> {
        self.creds.read().unwrap_or_else(|e| e.into_inner()).previous.clone()
    }

    /// Sends the request `build` makes with the current credentials; on a 401, once more with the
    /// previous ones (if a rotation left any).
    async fn send(
        &self,
        ep: &Endpoint,
        build: impl Fn(&Credentials) -> reqwest::RequestBuilder,
    ) -> reqwest::Result<reqwest::Response> {
        let creds = self.credentials();
        let resp = build(&creds).send().await?;
        if resp.status() != reqwest::StatusCode::UNAUTHORIZED {
            return Ok(resp);
        }
        let Some(prev) = self.previous_credentials() else { return Ok(resp) };
        let again = build(&prev).send().await?;
        if again.status() != reqwest::StatusCode::UNAUTHORIZED {
            let mut r = self.creds.write().unwrap_or_else(|e| e.into_inner());
            if !std::mem::replace(&mut r.fallback_logged, true) {
                tracing::info!(pod = %ep.name, "agent still on the previous credential; using it until it catches up");
            }
        }
        Ok(again)
    }

    /// `GET /v1/state[?verify=1]`.
    pub async fn state(&self, ep: &Endpoint, verify: bool) -> Result<StateResponse, CallError> {
        let url = format!("{}/v1/state{}", ep.url, if verify { "?verify=1" } else { "" });
        let request = format!("GET {url}");
        let resp = self
            .send(ep, |c| self.http.get(&url).basic_auth(&c.user, Some(&c.password)))
            .await
            .map_err(|e| CallError::transport(request.clone(), e))?;
        let status = resp.status();
        let body = resp.bytes().await.map_err(|e| CallError::transport(request.clone(), e))?;
        if !status.is_success() {
            return Err(CallError::Status { request, status, error: error_text(&body) });
        }
        serde_json::from_slice(&body).map_err(|e| CallError::Decode { request, status: None, cause: e.to_string() })
    }

    /// `POST /v1/apply`.
    pub async fn apply(&self, ep: &Endpoint, req: &ApplyRequest) -> Result<ApplyAnswer, CallError> {
        let body = serde_json::to_vec(req)
            .map_err(|e| CallError::Encode { request: format!("POST {}/v1/apply", ep.url), cause: e.to_string() })?;
        self.apply_body(ep, Bytes::from(body)).await
    }

    /// `POST /v1/apply` with a request already encoded (see [`haptic_protocol::api::EncodedApply`]).
    pub async fn apply_body(&self, ep: &Endpoint, body: Bytes) -> Result<ApplyAnswer, CallError> {
        let url = format!("{}/v1/apply", ep.url);
        let request = format!("POST {url}");
        let resp = self
            .send(ep, |c| {
                self.http
                    .post(&url)
                    .basic_auth(&c.user, Some(&c.password))
                    .header(reqwest::header::CONTENT_TYPE, "application/json")
                    .body(body.clone())
            })
            .await
            .map_err(|e| CallError::transport(request.clone(), e))?;
        let status = resp.status().as_u16();
        let body = resp.bytes().await.map_err(|e| CallError::transport(request.clone(), e))?;
        let decode_err = |e: serde_json::Error| CallError::Decode {
            request: request.clone(),
            status: Some(status),
            cause: e.to_string(),
        };
        match status {
            200 => Ok(ApplyAnswer::Ack(serde_json::from_slice(&body).map_err(decode_err)?)),
            409 => Ok(ApplyAnswer::Conflict(serde_json::from_slice(&body).map_err(decode_err)?)),
            422 => Ok(ApplyAnswer::Nack(serde_json::from_slice(&body).map_err(decode_err)?)),
            // HAProxy is not running on the pod: a failure of the pod, never a rejected render.
            503 if haproxy_unavailable(&body).is_some() => {
                let why = haproxy_unavailable(&body).unwrap_or_default();
                let error =
                    if why.starts_with("HAProxy not running") { why } else { format!("HAProxy not running: {why}") };
                Ok(ApplyAnswer::HaproxyDown(error))
            }
            _ => Ok(ApplyAnswer::Refused { status, error: format!("POST {url}: {status}: {}", error_text(&body)) }),
        }
    }
}

/// The reason of a 503 `haproxy_unavailable` answer, if `body` is one.
fn haproxy_unavailable(body: &[u8]) -> Option<String> {
    let u: haptic_protocol::api::Unavailable = serde_json::from_slice(body).ok()?;
    (u.error == haptic_protocol::api::HAPROXY_UNAVAILABLE).then_some(u.reason)
}

fn error_text(body: &[u8]) -> String {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
        .unwrap_or_else(|| String::from_utf8_lossy(&body[..body.len().min(512)]).into_owned())
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        s.push_str(": ");
        s.push_str(&c.to_string());
        cur = c.source();
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A real HTTP exchange on 127.0.0.1: an agent answering 503 `haproxy_unavailable` is a
    /// failed call saying "HAProxy not running", not a NACK.
    #[tokio::test]
    async fn haproxy_unavailable_is_a_failure_not_a_rejection() {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let body =
            serde_json::json!({"error": "haproxy_unavailable", "reason": "HAProxy not running (master pid 7 is gone)",
            "applied": haptic_protocol::PlanId(haptic_protocol::Digest::of(b"x"))})
            .to_string();
        let server = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.unwrap();
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = s.read(&mut buf).await.unwrap();
                got.extend_from_slice(&buf[..n]);
            }
            let resp = format!(
                "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            s.write_all(resp.as_bytes()).await.unwrap();
        });
        let client =
            AgentClient::new(Credentials { user: "u".into(), password: "p".into() }, Duration::from_secs(10)).unwrap();
        let ep = Endpoint { name: addr.to_string(), url: format!("http://{addr}") };
        let req: ApplyRequest = serde_json::from_value(serde_json::json!({
            "fence": {"epoch": 1, "seq": 1, "holder": "t"}, "baseline": null,
            "plan_id": haptic_protocol::plan_id(&[haptic_protocol::FileEntry {
                path: haptic_protocol::RelPath::haproxy_cfg(), digest: haptic_protocol::Digest::of(b""), size: 0 }]).unwrap(),
            "mode": "reload", "files": [{"path": "haproxy.cfg", "digest": haptic_protocol::Digest::of(b""), "size": 0}],
        }))
        .unwrap();
        match client.apply(&ep, &req).await {
            Ok(ApplyAnswer::HaproxyDown(error)) => assert_eq!(error, "HAProxy not running (master pid 7 is gone)"),
            other => panic!("wanted a 503 failure, got {other:?}"),
        }
        server.await.unwrap();
        assert_eq!(haproxy_unavailable(br#"{"error": "other", "reason": "x", "applied": null}"#), None);
    }

    /// `https://` agents: trusted through `--agent-ca-file` (a real TLS server on 127.0.0.1 with a
    /// certificate from a generated CA); without the CA the call fails on the certificate.
    #[tokio::test]
    async fn https_agents_are_trusted_through_the_agent_ca() {
        let d = tempfile::tempdir().unwrap();
        haptic_e2e::tls::make_ca(d.path(), "srv");
        let body = serde_json::json!({"error": "haproxy_unavailable", "reason": "over TLS",
            "applied": haptic_protocol::PlanId(haptic_protocol::Digest::of(b"x"))})
        .to_string();
        let resp = format!(
            "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        let read = |f: &str| std::fs::read(d.path().join(f)).unwrap();
        let (addr, server) = haptic_e2e::tls::answering_server(&read("srv.pem"), &read("srv.key"), resp).await;
        let creds = Credentials { user: "u".into(), password: "p".into() };
        let ep = Endpoint { name: addr.to_string(), url: format!("https://{addr}") };
        let req: ApplyRequest = serde_json::from_value(serde_json::json!({
            "fence": {"epoch": 1, "seq": 1, "holder": "t"}, "baseline": null,
            "plan_id": haptic_protocol::plan_id(&[haptic_protocol::FileEntry {
                path: haptic_protocol::RelPath::haproxy_cfg(), digest: haptic_protocol::Digest::of(b""), size: 0 }]).unwrap(),
            "mode": "reload", "files": [{"path": "haproxy.cfg", "digest": haptic_protocol::Digest::of(b""), "size": 0}],
        }))
        .unwrap();
        let ca = std::fs::read(d.path().join("ca.pem")).unwrap();
        let trusting = AgentClient::with_ca(creds.clone(), Duration::from_secs(10), Some(&ca)).unwrap();
        match trusting.apply(&ep, &req).await {
            Ok(ApplyAnswer::HaproxyDown(error)) => {
                assert_eq!(error, "HAProxy not running: over TLS", "the exchange went through TLS")
            }
            other => panic!("wanted the TLS server's 503, got {other:?}"),
        }
        let untrusting = AgentClient::new(creds, Duration::from_secs(10)).unwrap();
        let err = untrusting.apply(&ep, &req).await.unwrap_err();
        assert!(matches!(err, CallError::Connect { tls: Some(TlsRefusal::UnknownIssuer), .. }), "{err}");
        assert!(AgentClient::with_ca(
            Credentials { user: "u".into(), password: "p".into() },
            Duration::from_secs(1),
            Some(b"junk")
        )
        .is_err());
        server.abort();
    }

    #[test]
    fn credentials_file() {
        let d = tempfile::tempdir().unwrap();
        let p = d.path().join("c");
        std::fs::write(&p, "admin:s3:cret\n").unwrap();
        let c = Credentials::load(&p).unwrap();
        assert_eq!((c.user.as_str(), c.password.as_str()), ("admin", "s3:cret"));
        assert!(!format!("{c:?}").contains("s3"));
        std::fs::write(&p, "nocolon\n").unwrap();
        assert!(Credentials::load(&p).is_err());
        std::fs::write(&p, "").unwrap();
        assert!(Credentials::load(&p).is_err());
    }
}
