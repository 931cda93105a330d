//! The haptic wire contract shared by the agent and the controller.
//!
//! This crate owns the types of `GET /v1/state` and `POST /v1/apply`, file digests, plan ids,
//! the path rules, op kinds, fences and API versioning. HAProxy knowledge (config parsing, the
//! runtime claim, CLI replies) lives in `haptic-haproxy`. It is pure: it must never do I/O beyond
//! hashing a `std::io::Read`, and never depend on an async runtime or an HTTP stack.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod api;
pub mod digest;
pub mod fence;
pub mod ops;
pub mod path;
pub mod plan;

pub use api::{
    Ack, AgentInfo, ApiVersion, AppliedInfo, ApplyRequest, Capabilities, Conflict, ConflictKind, ErrorBody,
    HaproxyInfo, Mode, Nack, Part, PendingReload, ReloadState, ReloadStatus, RunningInfo, StateResponse, API_VERSION,
};
pub use digest::{Digest, DigestError, Hasher};
pub use fence::{decide as decide_fence, Fence, FenceDecision};
pub use ops::{BackendAdd, Op, OpKind, ServerAdd, ServerDel, ServerSet, ServerState};
pub use path::{PathError, RelPath};
pub use plan::{changed_paths, plan_id, FileEntry, PlanError, PlanId};
