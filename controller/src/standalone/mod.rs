//! Standalone mode: the seams' implementations without Kubernetes.
//!
//! Owns the directory render source, the static `--agent` endpoint list, the local epoch
//! file and the start-up that wires them ([`start`]). Nothing outside this module and
//! `main.rs` may depend on these types by name.

pub mod dir;
pub mod endpoints;
pub mod epoch;
pub mod start;

pub use dir::ConfigDir;
pub use endpoints::StaticEndpoints;
pub use epoch::EpochFile;
pub use start::{start_standalone, StandaloneSettings};
