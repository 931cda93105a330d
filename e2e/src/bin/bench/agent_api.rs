//! A reqwest client of one agent's `/v1` API (Basic auth, keep-alive), as a controller would
//! hold it. It must never build requests itself (see [`crate::workload`]) nor judge answers.

use std::time::Duration;

use haptic_protocol::{Ack, ApplyRequest, StateResponse};

use crate::error::{BenchError, Result};

/// One agent's API.
#[derive(Debug, Clone)]
pub struct AgentApi {
    http: reqwest::Client,
    base: String,
    user: String,
    password: String,
}

/// The answer to an apply: status, raw body and the request's size.
#[derive(Debug, Clone)]
pub struct ApplyAnswer {
    /// The HTTP status.
    pub status: u16,
    /// The body.
    pub body: String,
}

impl ApplyAnswer {
    /// The ACK, or an error naming the status and body.
    pub fn ack(&self) -> Result<Ack> {
        if self.status != 200 {
            return Err(BenchError::Unexpected(format!("apply answered {}: {}", self.status, short(&self.body))));
        }
        serde_json::from_str(&self.body)
            .map_err(|e| BenchError::Unexpected(format!("undecodable ACK ({e}): {}", short(&self.body))))
    }
}

/// The first 600 characters of a text, for errors.
pub fn short(s: &str) -> String {
    let mut t: String = s.chars().take(600).collect();
    if t.len() < s.len() {
        t.push('…');
    }
    t
}

impl AgentApi {
    /// A client of `base` (`http://127.0.0.1:port`).
    pub fn new(base: &str, user: &str, password: &str) -> Result<Self> {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .pool_max_idle_per_host(4)
            .build()
            .map_err(BenchError::http("build client"))?;
        Ok(Self { http, base: base.trim_end_matches('/').into(), user: user.into(), password: password.into() })
    }

    /// Serializes an apply request (done before timing: the controller holds it ready).
    pub fn body(req: &ApplyRequest) -> Vec<u8> {
        serde_json::to_vec(req).expect("apply requests serialize")
    }

    /// `POST /v1/apply` with a pre-serialized body.
    pub async fn apply_raw(&self, body: Vec<u8>) -> Result<ApplyAnswer> {
        let resp = self
            .http
            .post(format!("{}/v1/apply", self.base))
            .basic_auth(&self.user, Some(&self.password))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .map_err(BenchError::http("POST /v1/apply"))?;
        let status = resp.status().as_u16();
        let body = resp.text().await.map_err(BenchError::http("read apply answer"))?;
        Ok(ApplyAnswer { status, body })
    }

    /// `GET /v1/state[?verify=1]`.
    pub async fn state(&self, verify: bool) -> Result<StateResponse> {
        let url = format!("{}/v1/state{}", self.base, if verify { "?verify=1" } else { "" });
        let resp = self
            .http
            .get(&url)
            .basic_auth(&self.user, Some(&self.password))
            .send()
            .await
            .map_err(BenchError::http("GET /v1/state"))?;
        let status = resp.status().as_u16();
        let text = resp.text().await.map_err(BenchError::http("read state"))?;
        if status != 200 {
            return Err(BenchError::Unexpected(format!("GET /v1/state answered {status}: {}", short(&text))));
        }
        serde_json::from_str(&text)
            .map_err(|e| BenchError::Unexpected(format!("undecodable state ({e}): {}", short(&text))))
    }
}
