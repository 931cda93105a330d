//! The `/v1` messages: state, apply, ACK, 409 conflict, 422 NACK, error bodies, versions.
//!
//! Owns the JSON shapes of `/v1/state` and `/v1/apply` with exactly their field names, and the
//! request checks any peer can do without a tree (plan id, duplicates, part digests, blob size). It must never
//! look at a disk or decide fences (see [`crate::fence`]).

use std::collections::BTreeMap;
use std::fmt;

use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::fence::Fence;
use crate::ops::{Op, OpKind};
use crate::path::RelPath;
use crate::plan::{plan_id, FileEntry, PlanError, PlanId};

/// The most bytes the opaque `blob` may take once serialized.
pub const MAX_BLOB_BYTES: usize = 1024 * 1024;

/// An API version: peers are compatible when the majors match; a newer minor only adds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApiVersion {
    /// Breaking changes bump this.
    pub major: u32,
    /// Additions bump this.
    pub minor: u32,
}

/// The API version this crate speaks.
pub const API_VERSION: ApiVersion = ApiVersion { major: 1, minor: 3 };

impl ApiVersion {
    /// Whether a peer speaking `other` can be driven with this version's messages.
    pub fn compatible_with(&self, other: &ApiVersion) -> bool {
        self.major == other.major
    }
}

/// The agent's own build.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentInfo {
    /// The agent's version, e.g. `0.1.0`.
    pub version: String,
}

/// What the agent knows of the HAProxy it drives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HaproxyInfo {
    /// HAProxy's version text, e.g. `3.0.11`.
    pub version: String,
    /// Whether the master answered.
    pub running: bool,
    /// The master's pid.
    pub master_pid: Option<u32>,
    /// The current worker's pid.
    pub worker_pid: Option<u32>,
    /// The master's reload counter.
    pub reloads: u64,
}

/// What an agent can do against its HAProxy.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Capabilities {
    /// Whether it runs op batches over the runtime API at all.
    pub runtime_batches: bool,
    /// The op kinds it runs, by wire name (unknown names from newer agents are kept).
    pub ops: Vec<String>,
}

impl Capabilities {
    /// Whether this agent runs ops of `kind`.
    pub fn supports(&self, kind: OpKind) -> bool {
        self.runtime_batches && self.ops.iter().any(|o| o == kind.as_str())
    }
}

/// How an apply lands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    /// Swap the tree and run op batches; no reload.
    Runtime,
    /// Swap the tree only: the running config loads none of the changed files.
    FileOnly,
    /// Swap the tree and reload HAProxy.
    Reload,
    /// A mode from a newer minor version; an agent lands it as a checked `reload`.
    #[serde(other)]
    Unknown,
}

impl Mode {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Runtime => "runtime",
            Mode::FileOnly => "file_only",
            Mode::Reload => "reload",
            Mode::Unknown => "unknown",
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The plan on disk and what the controller stored with it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AppliedInfo {
    /// The applied plan.
    pub plan_id: PlanId,
    /// The controller's opaque blob for this plan.
    #[serde(default)]
    pub blob: serde_json::Value,
    /// The mode it landed with.
    pub mode: Mode,
    /// When it landed (RFC 3339).
    pub at: String,
}

/// The plan HAProxy's current worker runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunningInfo {
    /// The running plan.
    pub plan_id: PlanId,
}

/// A paced reload that has not run yet.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PendingReload {
    /// The plan the reload will load.
    pub plan_id: PlanId,
    /// How long until it runs.
    pub due_in_ms: u64,
}

/// `GET /v1/state`: the exact state of one pod.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StateResponse {
    /// The API version the agent speaks.
    pub api: ApiVersion,
    /// The agent's build.
    pub agent: AgentInfo,
    /// The HAProxy it drives.
    pub haproxy: HaproxyInfo,
    /// What it can do.
    pub capabilities: Capabilities,
    /// The fence high-water mark, if any apply was ever accepted.
    pub fence: Option<Fence>,
    /// The plan on disk.
    pub applied: Option<AppliedInfo>,
    /// The plan the worker runs.
    pub running: Option<RunningInfo>,
    /// A scheduled reload.
    pub pending_reload: Option<PendingReload>,
    /// Every file of the live tree.
    pub files: Vec<FileEntry>,
    /// Whether `files` was re-hashed from disk (`verify=1`) rather than read from the index.
    pub verified: bool,
    /// The last failure, in HAProxy's words where it had any.
    pub last_error: Option<String>,
    /// HAProxy's warnings about the applied config (a config can load with warnings).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub last_warnings: Vec<String>,
}

/// The bytes of one file sent in an apply.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
pub enum Part {
    /// UTF-8 text.
    Utf8(String),
    /// Any bytes, standard base64.
    Base64(String),
}

impl Part {
    /// Picks `utf8` for valid UTF-8 and `base64` otherwise.
    pub fn from_bytes(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(s) => Part::Utf8(s.to_string()),
            Err(_) => Part::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }

    /// Decodes the part into bytes, reusing a `utf8` part's buffer.
    pub fn into_bytes(self) -> Result<Vec<u8>, ApplyError> {
        match self {
            Part::Utf8(s) => Ok(s.into_bytes()),
            base64 => base64.decode(),
        }
    }

    /// Decodes the part to bytes.
    pub fn decode(&self) -> Result<Vec<u8>, ApplyError> {
        match self {
            Part::Utf8(s) => Ok(s.as_bytes().to_vec()),
            Part::Base64(b) => {
                base64::engine::general_purpose::STANDARD.decode(b).map_err(|e| ApplyError::BadBase64(e.to_string()))
            }
        }
    }
}

/// `POST /v1/apply`: the complete desired file set, the parts the agent lacks and op batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApplyRequest {
    /// The writer's fence.
    pub fence: Fence,
    /// The applied plan this was composed against; `None` means complete state.
    pub baseline: Option<PlanId>,
    /// The plan id of `files`.
    pub plan_id: PlanId,
    /// The mode the writer asks for.
    pub mode: Mode,
    /// Why this mode, in human words.
    #[serde(default)]
    pub reasons: Vec<String>,
    /// The complete desired file set.
    pub files: Vec<FileEntry>,
    /// Bytes of the files the agent lacks.
    #[serde(default)]
    pub parts: BTreeMap<RelPath, Part>,
    /// Runtime op batches, run in order.
    #[serde(default)]
    pub batches: Vec<Vec<Op>>,
    /// Opaque data the agent stores with the plan.
    #[serde(default)]
    pub blob: serde_json::Value,
}

/// Why an apply request is malformed (answered with 400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyError {
    /// The file set has no plan id.
    #[error(transparent)]
    Plan(#[from] PlanError),
    /// `plan_id` is not the id of `files`.
    #[error("plan_id {declared} does not match the files (computed {computed})")]
    PlanIdMismatch {
        /// What the request said.
        declared: PlanId,
        /// What the files give.
        computed: PlanId,
    },
    /// A part is not listed in `files`.
    #[error("part {0} is not in files")]
    UnlistedPart(RelPath),
    /// A part's bytes do not hash to its declared digest.
    #[error("part {path}: digest {actual} does not match declared {declared}")]
    PartDigest {
        /// The file.
        path: RelPath,
        /// What `files` declares.
        declared: Digest,
        /// What the bytes hash to.
        actual: Digest,
    },
    /// A part's size differs from its declared size.
    #[error("part {path}: {actual} bytes, declared {declared}")]
    PartSize {
        /// The file.
        path: RelPath,
        /// What `files` declares.
        declared: u64,
        /// The decoded length.
        actual: u64,
    },
    /// A base64 part does not decode.
    #[error("bad base64 part: {0}")]
    BadBase64(String),
    /// The fence's holder is longer than [`crate::fence::MAX_HOLDER_BYTES`].
    #[error("fence holder is {0} bytes; the limit is 253")]
    HolderTooLong(usize),
    /// The blob is over 1 MiB.
    #[error("blob is {0} bytes; the limit is 1 MiB")]
    BlobTooLarge(usize),
}

impl ApplyRequest {
    /// Checks everything that needs no tree: plan id, parts listed and hashing to their digests,
    /// blob size. Returns the decoded parts (a copy; see [`Self::take_checked_parts`]).
    pub fn check(&self) -> Result<BTreeMap<RelPath, Vec<u8>>, ApplyError> {
        self.check_manifest()?;
        let index = self.file_index();
        self.parts.iter().map(|(path, part)| checked_part(&index, path, part.decode()?)).collect()
    }

    /// Like [`Self::check`], but moves the parts out of the request instead of copying them, so a
    /// large apply holds its bytes once. On error the request keeps no parts.
    pub fn take_checked_parts(&mut self) -> Result<BTreeMap<RelPath, Vec<u8>>, ApplyError> {
        self.check_manifest()?;
        let parts = std::mem::take(&mut self.parts);
        let index = self.file_index();
        parts.into_iter().map(|(path, part)| checked_part(&index, &path, part.into_bytes()?)).collect()
    }

    fn file_index(&self) -> BTreeMap<&RelPath, &FileEntry> {
        self.files.iter().map(|f| (&f.path, f)).collect()
    }

    fn check_manifest(&self) -> Result<(), ApplyError> {
        if self.fence.holder.len() > crate::fence::MAX_HOLDER_BYTES {
            return Err(ApplyError::HolderTooLong(self.fence.holder.len()));
        }
        let computed = plan_id(&self.files)?;
        if computed != self.plan_id {
            return Err(ApplyError::PlanIdMismatch { declared: self.plan_id, computed });
        }
        let blob_len = serde_json::to_vec(&self.blob).map(|v| v.len()).unwrap_or(usize::MAX);
        if blob_len > MAX_BLOB_BYTES {
            return Err(ApplyError::BlobTooLarge(blob_len));
        }
        Ok(())
    }

    /// Every op of every batch, in order.
    pub fn ops(&self) -> impl Iterator<Item = &Op> {
        self.batches.iter().flatten()
    }
}

/// An [`ApplyRequest`] encoded once for every agent a writer sends it to: the JSON of every member
/// but the fence, to which [`Self::with_fence`] adds each copy's own fence. A copy decodes to the
/// request with that fence; only the order of the object's members differs from encoding it whole.
#[derive(Debug, Clone)]
pub struct EncodedApply {
    /// The request's JSON after its fence member: `"baseline":…}`.
    rest: std::sync::Arc<[u8]>,
}

impl EncodedApply {
    /// Encodes `req` without its fence.
    pub fn new(req: &ApplyRequest) -> Result<Self, serde_json::Error> {
        let whole = serde_json::to_vec(req)?;
        let head = [&b"{\"fence\":"[..], &serde_json::to_vec(&req.fence)?, b","].concat();
        // serde writes a struct's members in declaration order, the fence first.
        let rest = whole.strip_prefix(head.as_slice()).ok_or_else(|| {
            <serde_json::Error as serde::ser::Error>::custom("an apply request's JSON does not start with its fence")
        })?;
        Ok(Self { rest: rest.into() })
    }

    /// The body of one copy: `fence` first, then the shared members.
    pub fn with_fence(&self, fence: &Fence) -> Result<Vec<u8>, serde_json::Error> {
        let fence = serde_json::to_vec(fence)?;
        let mut body = Vec::with_capacity(11 + fence.len() + self.rest.len());
        body.extend_from_slice(b"{\"fence\":");
        body.extend_from_slice(&fence);
        body.push(b',');
        body.extend_from_slice(&self.rest);
        Ok(body)
    }
}

fn checked_part(
    index: &BTreeMap<&RelPath, &FileEntry>,
    path: &RelPath,
    bytes: Vec<u8>,
) -> Result<(RelPath, Vec<u8>), ApplyError> {
    let entry = index.get(path).ok_or_else(|| ApplyError::UnlistedPart(path.clone()))?;
    if bytes.len() as u64 != entry.size {
        return Err(ApplyError::PartSize { path: path.clone(), declared: entry.size, actual: bytes.len() as u64 });
    }
    let actual = Digest::of(&bytes);
    if actual != entry.digest {
        return Err(ApplyError::PartDigest { path: path.clone(), declared: entry.digest, actual });
    }
    Ok((path.clone(), bytes))
}

/// Whether a reload ran or waits for the pacing interval.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReloadState {
    /// The reload ran and was verified.
    Done,
    /// The reload is scheduled for the end of the pacing interval.
    Scheduled,
    /// A state from a newer minor version: not known to be done (follow it up like `scheduled`).
    #[serde(other)]
    Unknown,
}

/// The reload part of an ACK.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadStatus {
    /// Done or scheduled.
    pub state: ReloadState,
    /// For a scheduled reload, how long until it runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub due_in_ms: Option<u64>,
}

/// 200: the apply landed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The plan now on disk.
    pub applied: PlanId,
    /// The plan the worker runs now.
    pub running: Option<PlanId>,
    /// The mode it actually landed with.
    pub mode: Mode,
    /// Why, including any fallback.
    pub reasons: Vec<String>,
    /// The reload, if one ran or is scheduled.
    pub reload: Option<ReloadStatus>,
}

/// The kind of a 409 conflict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConflictKind {
    /// The fence is not newer than the agent's high-water mark.
    StaleEpoch,
    /// The baseline is not the applied plan.
    PrevMismatch,
    /// The agent has no applied plan to compare with.
    UnknownBaseline,
    /// A desired file is neither present with its digest nor sent.
    MissingParts,
    /// A kind from a newer minor version (a writer re-reads the state and sends complete state).
    #[serde(other)]
    Unknown,
}

impl ConflictKind {
    /// The wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            ConflictKind::StaleEpoch => "stale_epoch",
            ConflictKind::PrevMismatch => "prev_mismatch",
            ConflictKind::UnknownBaseline => "unknown_baseline",
            ConflictKind::MissingParts => "missing_parts",
            ConflictKind::Unknown => "unknown",
        }
    }
}

/// 409: the apply conflicts with the agent's state; nothing changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Conflict {
    /// One line for humans.
    pub error: String,
    /// The kind.
    pub conflict: ConflictKind,
    /// The agent's fence high-water mark.
    pub fence: Option<Fence>,
    /// The agent's applied plan.
    pub actual_baseline: Option<PlanId>,
    /// For `missing_parts`, exactly the paths to send.
    #[serde(default)]
    pub missing: Vec<RelPath>,
}

/// 422: HAProxy refused the config; nothing stays changed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Nack {
    /// One line for humans.
    pub error: String,
    /// Always true.
    pub rejected: bool,
    /// HAProxy's own words.
    pub haproxy_output: String,
    /// Which step refused it (check or reload) and why.
    pub reason: String,
}

/// The `error` of a 503 answered while HAProxy is not running.
pub const HAPROXY_UNAVAILABLE: &str = "haproxy_unavailable";

/// 503: HAProxy is not running (its master is gone). The tree was written, so HAProxy starts on
/// `applied` when its container restarts; nothing was refused.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unavailable {
    /// Always [`HAPROXY_UNAVAILABLE`].
    pub error: String,
    /// What the agent saw, e.g. `HAProxy not running: master pid 12 is gone`.
    pub reason: String,
    /// The plan now on disk.
    pub applied: PlanId,
}

/// Any other error: `{"error": "..."}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorBody {
    /// One line for humans.
    pub error: String,
}
