//! The agent's Prometheus metrics (`GET /metrics`).
//!
//! Owns the metric names (`haptic_agent_*`, and `haptic_build_info{component="agent",version}`)
//! and their text encoding. It must never decide
//! anything: callers record what happened.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `{mode, result}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ModeResult {
    /// The mode the apply landed with (or was asked for, when refused).
    pub mode: String,
    /// `ack`, `conflict`, `nack`, `bad_request` or `error`.
    pub result: String,
}

/// `{result}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// `ok`, `failed` or `timeout`.
    pub result: String,
}

/// The `result` values of `haptic_agent_reloads_total`.
pub const RELOAD_RESULTS: [&str; 3] = ["ok", "failed", "timeout"];

/// `{conflict}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConflictLabel {
    /// The conflict kind.
    pub conflict: String,
}

/// `{op, result}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct OpResult {
    /// The op kind.
    pub op: String,
    /// `ok` or `failed`.
    pub result: String,
}

/// `{component,version}` of `haptic_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// `agent`.
    pub component: String,
    /// The crate version.
    pub version: String,
}

/// Every metric the agent exports.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `haptic_agent_applies_total{mode,result}`.
    pub applies: Family<ModeResult, Counter>,
    /// `haptic_agent_apply_duration_seconds`.
    pub apply_duration: Histogram,
    /// `haptic_agent_reloads_total{result}`.
    pub reloads: Family<ResultLabel, Counter>,
    /// `haptic_agent_reload_duration_seconds`.
    pub reload_duration: Histogram,
    /// `haptic_agent_fence_rejections_total{conflict}`.
    pub fence_rejections: Family<ConflictLabel, Counter>,
    /// `haptic_agent_tree_files`.
    pub tree_files: Gauge,
    /// `haptic_agent_tree_bytes`.
    pub tree_bytes: Gauge,
    /// `haptic_agent_runtime_ops_total{op,result}`.
    pub runtime_ops: Family<OpResult, Counter>,
    /// `haptic_agent_reloads_avoided_total`.
    pub reloads_avoided: Counter,
    /// `haptic_agent_pending_reload`.
    pub pending_reload: Gauge,
    /// `haptic_agent_reload_coalesced_total`.
    pub reload_coalesced: Counter,
    /// `haptic_agent_haproxy_old_workers`: HAProxy workers still draining connections after a
    /// reload (the master's `# old workers`), read at each scrape; -1 when the master did not answer.
    pub old_workers: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::default();
        let applies = Family::<ModeResult, Counter>::default();
        let apply_duration = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        let reloads = Family::<ResultLabel, Counter>::default();
        // Every result from 0: a first failure is then an increase Prometheus sees.
        for result in RELOAD_RESULTS {
            drop(reloads.get_or_create(&ResultLabel { result: result.into() }));
        }
        let reload_duration = Histogram::new(exponential_buckets(0.01, 2.0, 12));
        let fence_rejections = Family::<ConflictLabel, Counter>::default();
        let tree_files = Gauge::default();
        let tree_bytes = Gauge::default();
        let runtime_ops = Family::<OpResult, Counter>::default();
        let reloads_avoided = Counter::default();
        let pending_reload = Gauge::default();
        let reload_coalesced = Counter::default();
        let old_workers = Gauge::default();
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels { component: "agent".into(), version: env!("CARGO_PKG_VERSION").into() })
            .set(1);
        registry.register("haptic_build_info", "The running build (always 1)", build_info);
        registry.register("haptic_agent_applies", "Applies by landed mode and result", applies.clone());
        registry.register(
            "haptic_agent_apply_duration_seconds",
            "Duration of accepted applies",
            apply_duration.clone(),
        );
        registry.register("haptic_agent_reloads", "Verified reloads by result", reloads.clone());
        registry.register("haptic_agent_reload_duration_seconds", "Duration of reloads", reload_duration.clone());
        registry.register(
            "haptic_agent_fence_rejections",
            "Applies refused with a 409, by conflict",
            fence_rejections.clone(),
        );
        registry.register("haptic_agent_tree_files", "Files in the live tree", tree_files.clone());
        registry.register("haptic_agent_tree_bytes", "Bytes in the live tree", tree_bytes.clone());
        registry.register("haptic_agent_runtime_ops", "Runtime API ops by kind and result", runtime_ops.clone());
        registry.register(
            "haptic_agent_reloads_avoided",
            "Applies that landed without a reload",
            reloads_avoided.clone(),
        );
        registry.register("haptic_agent_pending_reload", "1 while a paced reload is scheduled", pending_reload.clone());
        registry.register(
            "haptic_agent_reload_coalesced",
            "Scheduled reloads replaced by a later plan",
            reload_coalesced.clone(),
        );
        registry.register(
            "haptic_agent_haproxy_old_workers",
            "HAProxy workers still draining after a reload (-1: the master did not answer)",
            old_workers.clone(),
        );
        Self {
            registry,
            applies,
            apply_duration,
            reloads,
            reload_duration,
            fence_rejections,
            tree_files,
            tree_bytes,
            runtime_ops,
            reloads_avoided,
            pending_reload,
            reload_coalesced,
            old_workers,
        }
    }

    /// Counts an apply outcome.
    pub fn apply(&self, mode: &str, result: &str) {
        self.applies.get_or_create(&ModeResult { mode: mode.into(), result: result.into() }).inc();
    }

    /// Counts a reload outcome.
    pub fn reload(&self, result: &str, secs: f64) {
        self.reloads.get_or_create(&ResultLabel { result: result.into() }).inc();
        self.reload_duration.observe(secs);
    }

    /// Counts a runtime op.
    pub fn op(&self, op: &str, result: &str) {
        self.runtime_ops.get_or_create(&OpResult { op: op.into(), result: result.into() }).inc();
    }

    /// Counts a 409.
    pub fn conflict(&self, conflict: &str) {
        self.fence_rejections.get_or_create(&ConflictLabel { conflict: conflict.into() }).inc();
    }

    /// Sets the tree gauges.
    pub fn tree(&self, files: usize, bytes: u64) {
        self.tree_files.set(i64::try_from(files).unwrap_or(i64::MAX));
        self.tree_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// The OpenMetrics text.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_exported() {
        let m = Metrics::new();
        m.apply("reload", "ack");
        m.reload("ok", 0.1);
        m.op("server.set", "ok");
        m.conflict("stale_epoch");
        m.tree(3, 100);
        m.reloads_avoided.inc();
        m.reload_coalesced.inc();
        m.pending_reload.set(1);
        m.apply_duration.observe(0.2);
        let text = m.encode();
        for name in [
            "haptic_agent_applies_total{mode=\"reload\",result=\"ack\"} 1",
            "haptic_agent_apply_duration_seconds",
            "haptic_agent_reloads_total{result=\"ok\"} 1",
            "haptic_agent_reloads_total{result=\"failed\"} 0",
            "haptic_agent_reloads_total{result=\"timeout\"} 0",
            "haptic_agent_reload_duration_seconds",
            "haptic_agent_fence_rejections_total{conflict=\"stale_epoch\"} 1",
            "haptic_agent_tree_files 3",
            "haptic_agent_tree_bytes 100",
            "haptic_agent_runtime_ops_total{op=\"server.set\",result=\"ok\"} 1",
            "haptic_agent_reloads_avoided_total 1",
            "haptic_agent_pending_reload 1",
            "haptic_agent_reload_coalesced_total 1",
            concat!("haptic_build_info{component=\"agent\",version=\"", env!("CARGO_PKG_VERSION"), "\"} 1"),
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }
}
