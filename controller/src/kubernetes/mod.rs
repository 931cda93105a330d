//! Kubernetes mode: the `HAProxyConfig` resource, its render source, pod discovery and
//! admission, the Lease that holds the fence, and the status writer, all over one shared
//! [`context::Context`].
//!
//! Everything here plugs into the seams of [`crate::seams`]; the gate, diff, deployer and
//! scheduler never learn that Kubernetes is behind them.

pub mod agent_tls;
pub mod cluster;
pub mod config_source;
pub mod context;
pub mod crd;
pub mod deployed;
pub mod discovery;
pub mod feed;
pub mod fence;
pub mod gateway_status;
pub mod ingress_status;
pub mod lease;
pub mod narrowing;
pub mod published;
pub mod routes;
pub mod run;
pub mod scope;
pub mod settle;
pub mod snippet_check;
pub mod status;
pub mod watch;
