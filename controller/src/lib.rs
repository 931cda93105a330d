//! haptic-controller: gets each render onto every HAProxy pod with the least disruption HAProxy
//! allows, and keeps every pod's real state visible.
//!
//! Components (each with a pure core): [`gate`] (the controller's own `haproxy -c` and the
//! optimistic/pessimistic latch), [`diff`] (runtime / file_only / reload), [`deployer`] (fenced
//! applies per pod) with [`attempt`] (what follows each answer: exact retries, 409 handling), [`followup`] (background follow-ups of paced reloads), [`scheduler`] (one deployment in flight, a
//! latest-wins pending slot, deployment timeout, drift), [`status`] and [`metrics`]. The three
//! things Kubernetes mode swaps are traits in [`seams`]: where renders come from, where
//! endpoints come from, and who holds the fence. This crate must never know which mode runs
//! outside [`standalone`] and `main.rs`.
#![forbid(unsafe_code)]

pub mod attempt;
pub mod bundle;
pub mod deployer;
pub mod diff;
pub mod error;
pub mod followup;
pub mod gate;
pub mod kubernetes;
pub mod manifests;

pub use error::Error;
pub mod admin;
pub mod agent_tls;
pub mod app;
pub mod blob;
pub mod client;
pub mod metrics;
pub mod scheduler;
pub mod seams;
pub mod standalone;
pub mod status;
