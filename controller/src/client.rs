//! The HTTP client for agents' `/v1` API.
//!
//! Owns credentials loading, Basic auth, timeouts (the sync timeout) and turning answers into
//! typed outcomes (ACK, 409 conflict, 422 NACK, other errors). It must never decide what to do
//! about an answer — that is the deployer's job.

use std::path::Path;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use haptic_protocol::{Ack, ApplyRequest, Conflict, Nack, StateResponse};

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
    /// Any other status: 4xx (the agent refused the request itself: malformed, credentials,
    /// too large) or 5xx, with the agent's `error`.
    Refused {
        /// The HTTP status.
        status: u16,
        /// The agent's words.
        error: String,
    },
}

/// A transport or protocol failure talking to one agent.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{0}")]
pub struct CallError(pub String);

/// The agents' HTTP client. Clones share the connection pool and the credentials, so a
/// rotated credential ([`AgentClient::set_credentials`]) reaches every clone at once.
#[derive(Debug, Clone)]
pub struct AgentClient {
    http: reqwest::Client,
    creds: Arc<RwLock<Credentials>>,
}

impl AgentClient {
    /// A client whose every request is bounded by `timeout`.
    pub fn new(creds: Credentials, timeout: Duration) -> Result<Self, Error> {
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout.min(Duration::from_secs(5)))
            .pool_idle_timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        Ok(AgentClient { http, creds: Arc::new(RwLock::new(creds)) })
    }

    /// Replaces the credentials of this client and every clone (a rotated Secret).
    pub fn set_credentials(&self, creds: Credentials) {
        *self.creds.write().unwrap_or_else(|e| e.into_inner()) = creds;
    }

    /// The current credentials.
    pub fn credentials(&self) -> Credentials {
        self.creds.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// `GET /v1/state[?verify=1]`.
    pub async fn state(&self, ep: &Endpoint, verify: bool) -> Result<StateResponse, CallError> {
        let url = format!("{}/v1/state{}", ep.url, if verify { "?verify=1" } else { "" });
        let creds = self.credentials();
        let resp = self
            .http
            .get(&url)
            .basic_auth(&creds.user, Some(&creds.password))
            .send()
            .await
            .map_err(|e| CallError(format!("GET {url}: {}", error_chain(&e.without_url()))))?;
        let status = resp.status();
        let body =
            resp.bytes().await.map_err(|e| CallError(format!("GET {url}: {}", error_chain(&e.without_url()))))?;
        if !status.is_success() {
            return Err(CallError(format!("GET {url}: {status}: {}", error_text(&body))));
        }
        serde_json::from_slice(&body).map_err(|e| CallError(format!("GET {url}: undecodable state: {e}")))
    }

    /// `POST /v1/apply`.
    pub async fn apply(&self, ep: &Endpoint, req: &ApplyRequest) -> Result<ApplyAnswer, CallError> {
        let url = format!("{}/v1/apply", ep.url);
        let creds = self.credentials();
        let resp = self
            .http
            .post(&url)
            .basic_auth(&creds.user, Some(&creds.password))
            .json(req)
            .send()
            .await
            .map_err(|e| CallError(format!("POST {url}: {}", error_chain(&e.without_url()))))?;
        let status = resp.status().as_u16();
        let body =
            resp.bytes().await.map_err(|e| CallError(format!("POST {url}: {}", error_chain(&e.without_url()))))?;
        let decode_err = |e: serde_json::Error| CallError(format!("POST {url}: {status} with undecodable body: {e}"));
        match status {
            200 => Ok(ApplyAnswer::Ack(serde_json::from_slice(&body).map_err(decode_err)?)),
            409 => Ok(ApplyAnswer::Conflict(serde_json::from_slice(&body).map_err(decode_err)?)),
            422 => Ok(ApplyAnswer::Nack(serde_json::from_slice(&body).map_err(decode_err)?)),
            _ => Ok(ApplyAnswer::Refused { status, error: format!("POST {url}: {status}: {}", error_text(&body)) }),
        }
    }
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
