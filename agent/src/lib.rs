//! `haptic-agent`: the sidecar that owns one HAProxy pod's config tree.
//!
//! It applies fenced plans atomically (crash-safe tree swap), checks configs with the pod's own
//! `haproxy -c`, runs runtime-API op batches, paces and verifies reloads, rolls back to the last
//! good tree, and reports exact state over `/v1`. It must never write outside its root, never
//! signal HAProxy while the master CLI answers, and never leave a half-applied plan visible.
#![forbid(unsafe_code)]

pub mod api;
pub mod apply;
pub mod body;
pub mod check;
pub mod config;
pub mod credentials;
pub mod error;
pub mod init;
pub mod master;
pub mod metrics;
pub mod pacer;
pub mod poll;
pub mod reload;
pub mod runtime;
pub mod store;
pub mod tls;
pub mod tree;

pub use api::{router, serve, AppState};
pub use apply::{Agent, AgentConfig, Refusal};
pub use credentials::Credentials;
pub use error::AgentError;
