//! The blob the controller stores with every applied plan, and reading it back.
//!
//! Owns the blob's JSON schema: `{"schema": 1, "plan_id", "files": manifest, "cfg": text|null}`.
//! Any controller (a restarted one, a new leader) can rebuild a [`Baseline`] from it without a
//! reload. It must never trust a blob that does not check out: wrong schema, a plan id that is
//! not the pod's applied plan or not the id of the manifest, or a config text whose digest is
//! not the manifest's `haproxy.cfg` digest all mean "no baseline".

use std::sync::Arc;

use haptic_protocol::api::MAX_BLOB_BYTES;
use haptic_protocol::{plan_id, Digest, FileEntry, PlanId, RelPath};
use serde::{Deserialize, Serialize};

use crate::bundle::Bundle;
use crate::diff::Baseline;

/// The blob schema this controller writes and reads.
pub const SCHEMA: u32 = 1;

/// The largest config text kept in a blob; a larger one is left out (the next config change
/// against this baseline then reloads).
pub const MAX_CFG_IN_BLOB: usize = 512 * 1024;

#[derive(Debug, Serialize, Deserialize)]
struct BlobV1 {
    schema: u32,
    plan_id: PlanId,
    files: Vec<FileEntry>,
    #[serde(default)]
    cfg: Option<String>,
}

/// Encodes the blob for a render, bounded to the agent's 1 MiB limit.
pub fn encode(r: &Bundle) -> serde_json::Value {
    let cfg = (r.cfg_text().len() <= MAX_CFG_IN_BLOB).then(|| r.cfg_text().to_string());
    let mut b = BlobV1 { schema: SCHEMA, plan_id: r.plan_id(), files: r.manifest().to_vec(), cfg };
    let fits = |b: &BlobV1| serde_json::to_vec(b).map(|v| v.len() <= MAX_BLOB_BYTES).unwrap_or(false);
    if !fits(&b) {
        b.cfg = None;
    }
    if !fits(&b) {
        // A manifest this large cannot travel: the blob then names the plan only and will not
        // decode to a baseline, which costs one complete-state reload after a controller restart.
        b.files.clear();
    }
    serde_json::to_value(&b).unwrap_or(serde_json::Value::Null)
}

/// Why a blob is not a baseline.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BlobError {
    /// Not a blob this controller understands.
    #[error("blob is not schema {SCHEMA}: {0}")]
    Schema(String),
    /// The blob names another plan than the pod's applied one.
    #[error("blob names plan {blob}, the pod applied {applied}")]
    OtherPlan {
        /// In the blob.
        blob: PlanId,
        /// On the pod.
        applied: PlanId,
    },
    /// The manifest does not hash to the plan id.
    #[error("blob manifest does not match its plan id")]
    Manifest,
    /// The config text is not the manifest's `haproxy.cfg`.
    #[error("blob config text does not match the manifest")]
    CfgText,
}

/// Decodes a pod's blob into a baseline for its applied plan `applied`.
pub fn decode(blob: &serde_json::Value, applied: PlanId) -> Result<Baseline, BlobError> {
    let schema = blob.get("schema").and_then(serde_json::Value::as_u64);
    if schema != Some(u64::from(SCHEMA)) {
        return Err(BlobError::Schema(format!("schema {schema:?}")));
    }
    let b: BlobV1 = serde_json::from_value(blob.clone()).map_err(|e| BlobError::Schema(e.to_string()))?;
    if b.plan_id != applied {
        return Err(BlobError::OtherPlan { blob: b.plan_id, applied });
    }
    if plan_id(&b.files).ok() != Some(applied) {
        return Err(BlobError::Manifest);
    }
    if let Some(text) = &b.cfg {
        let cfg = b.files.iter().find(|e| e.path == RelPath::haproxy_cfg()).map(|e| e.digest);
        if cfg != Some(Digest::of(text.as_bytes())) {
            return Err(BlobError::CfgText);
        }
    }
    Ok(Baseline { plan_id: applied, manifest: b.files, cfg_text: b.cfg.map(Arc::from), cfg_index: Default::default() })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r() -> Bundle {
        Bundle::from_texts([("haproxy.cfg", "global\n"), ("maps/a.map", "k v\n")]).unwrap()
    }

    #[test]
    fn round_trip() {
        let r = r();
        let b = decode(&encode(&r), r.plan_id()).unwrap();
        assert_eq!(b, Baseline::of_render(&r));
    }

    #[test]
    fn refuses_what_does_not_check_out() {
        let r = r();
        let other = Bundle::from_texts([("haproxy.cfg", "global\n  x\n")]).unwrap();
        assert!(matches!(decode(&encode(&r), other.plan_id()), Err(BlobError::OtherPlan { .. })));
        assert!(matches!(decode(&serde_json::json!({}), r.plan_id()), Err(BlobError::Schema(_))));
        assert!(matches!(decode(&serde_json::json!({"schema": 2}), r.plan_id()), Err(BlobError::Schema(_))));
        let mut v = encode(&r);
        v["cfg"] = "global\n  tampered\n".into();
        assert_eq!(decode(&v, r.plan_id()), Err(BlobError::CfgText));
        let mut v = encode(&r);
        v["files"].as_array_mut().unwrap().pop();
        assert_eq!(decode(&v, r.plan_id()), Err(BlobError::Manifest));
    }

    #[test]
    fn large_configs_are_left_out_and_still_decode() {
        let big = format!("global\n{}", "  # padding\n".repeat(MAX_CFG_IN_BLOB / 10));
        let r = Bundle::from_texts([("haproxy.cfg", big.as_str())]).unwrap();
        let v = encode(&r);
        assert!(serde_json::to_vec(&v).unwrap().len() <= MAX_BLOB_BYTES);
        let b = decode(&v, r.plan_id()).unwrap();
        assert_eq!(b.cfg_text, None);
        assert_eq!(b.manifest, r.manifest());
    }
}
