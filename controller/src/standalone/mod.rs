//! Standalone mode: the seams' implementations without Kubernetes.
//!
//! Owns the directory render source, the static `--agent` endpoint list and the local epoch
//! file. Nothing outside this module and `main.rs` may depend on these types by name.

pub mod dir;
pub mod endpoints;
pub mod epoch;

pub use dir::DirRenderSource;
pub use endpoints::StaticEndpoints;
pub use epoch::EpochFile;
