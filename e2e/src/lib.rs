//! `haptic-e2e`: the real-HAProxy test harness.
//!
//! This crate starts real HAProxy master-worker processes (every installed version, see
//! [`haproxy_bins`]), talks to their master CLI, verifies reloads on 2.6 and ≥ 2.7, sends tiny HTTP
//! requests through them, and guarantees that no HAProxy process outlives a test, even one that
//! panics. It must never depend on the agent or controller crates: it tests them from outside.
//! HAProxy's reply texts are interpreted by [`haptic_haproxy::cli`], shared with the agent.
#![forbid(unsafe_code)]

pub mod bins;
pub mod cluster;
pub mod config;
pub mod k8s;
pub mod monitoring;
pub mod net;
pub mod pids;
pub mod pod;
pub mod process;
pub mod readme;
pub mod sweep;
pub mod tls;
pub mod tools;
pub mod wait;

pub use bins::{haproxy_bin, haproxy_bins, workspace_root, HaproxyBin};
pub use config::basic_config;
pub use net::{free_port, http_get, wait_http_body};
pub use pids::{assert_no_stray, group_members, pid_alive};
pub use process::{Haproxy, HaproxyOpts, HarnessError, ReloadOutcome};
