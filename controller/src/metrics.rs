//! The controller's Prometheus metrics.
//!
//! Owns the metric names (fixed by the brief: `haptic_deployments_total{result}`,
//! `haptic_deployment_duration_seconds`, `haptic_applies_total{mode,result}`,
//! `haptic_reloads_avoided_total`, `haptic_pods_converged`, `haptic_pods` (a gauge, so no
//! `_total`), `haptic_agent_version_skew_total`, `haptic_gate_rejections_total`,
//! `haptic_gate_pinned`, `haptic_drift_repairs_total`, `haptic_apply_rejected_total{haproxy_pod}`
//! (not `pod`: prometheus-operator renames a target's own `pod` label to `exported_pod`), plus
//! `haptic_apply_conflicts_total{conflict}`, `haptic_apply_retries_total`,
//! `haptic_build_info{component,version}`, `haptic_leader` and `haptic_reload_causes_total{cause}`; in render mode
//! `haptic_render_valid{config}`, `haptic_render_refusals{kind,cause}` and
//! `haptic_certificate_expiry_timestamp_seconds{secret_namespace,secret}`) and their text encoding. It
//! removes a pod's series once the pod has left the fleet. It must never decide anything from a
//! metric value.

use std::collections::BTreeSet;
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::diff::ReloadCause;

/// The `result` values of `haptic_deployments_total` (`DeploymentResult::as_str`).
pub const DEPLOYMENT_RESULTS: [&str; 5] = ["success", "partial", "failed", "timeout", "stood_down"];

/// `{result}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ResultLabel {
    /// e.g. `success`, `partial`, `failed`, `timeout`, `stood_down`.
    pub result: String,
}

/// `{mode,result}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ApplyLabels {
    /// The mode the agent landed with (or asked for, when it did not land).
    pub mode: String,
    /// `ack`, `nack`, `conflict`, `error`.
    pub result: String,
}

/// `{haproxy_pod}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct PodLabel {
    /// The endpoint name.
    pub haproxy_pod: String,
}

/// `{component,version}` of `haptic_build_info`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct BuildLabels {
    /// `controller`.
    pub component: String,
    /// The crate version.
    pub version: String,
}

/// `{conflict}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConflictLabel {
    /// The 409 kind.
    pub conflict: String,
}

/// `{reason}`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// `agent_container_not_running` or `agent_unreachable`.
    pub reason: String,
}

/// `{cause}` of `haptic_reload_causes_total`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct CauseLabel {
    /// [`ReloadCause::as_str`].
    pub cause: String,
}

/// `{kind,cause}` of a refusal in a render's verdicts.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    /// The refused object's kind (`Ingress`, `HTTPRoute`, …).
    pub kind: String,
    /// Why, as the render's typed cause (`Invalid`, `NotAllowed`, `Conflict`, …).
    pub cause: String,
}

/// `{config}`: the HAProxyConfig.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConfigLabel {
    /// Its name.
    pub config: String,
}

/// `{secret_namespace,secret}`: a certificate's Secret (not `namespace`, which a scrape sets
/// to the controller's own).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct SecretLabels {
    /// The Secret's namespace.
    pub secret_namespace: String,
    /// Its name.
    pub secret: String,
}

/// Render mode's health: whether the spec renders, the refusals in its verdicts, and when the
/// certificates it serves expire.
#[derive(Debug, Default)]
pub struct RenderHealth {
    /// `haptic_certificate_expiry_timestamp_seconds{secret_namespace,secret}`: the earliest
    /// notAfter of each certificate the last render serves to clients.
    pub expiry: Family<SecretLabels, Gauge>,
    /// `haptic_render_valid{config}`: 1 while the HAProxyConfig renders, 0 while it cannot (its
    /// status says why); no series outside render mode.
    pub valid: Family<ConfigLabel, Gauge>,
    /// `haptic_render_refusals{kind,cause}`: refusals in the last render's verdicts.
    pub refusals: Family<RefusalLabels, Gauge>,
}

impl RenderHealth {
    fn register(registry: &mut Registry) -> Self {
        let h = RenderHealth::default();
        registry.register(
            "haptic_render_valid",
            "1 while the HAProxyConfig's spec.render renders, 0 while it cannot",
            h.valid.clone(),
        );
        registry.register(
            "haptic_certificate_expiry_timestamp_seconds",
            "When each certificate the last render serves expires (Unix time), by its Secret",
            h.expiry.clone(),
        );
        registry.register(
            "haptic_render_refusals",
            "Refusals in the last render's verdicts, by object kind and cause",
            h.refusals.clone(),
        );
        h
    }

    /// Sets both from one published render of `config`: `valid` (none outside render mode:
    /// no series) and the count of refusals by (kind, cause).
    pub fn set(&self, config: &str, valid: Option<bool>, refusals: &std::collections::BTreeMap<(String, String), i64>) {
        self.valid.clear();
        if let Some(v) = valid {
            self.valid.get_or_create(&ConfigLabel { config: config.to_string() }).set(i64::from(v));
        }
        self.refusals.clear();
        for ((kind, cause), n) in refusals {
            self.refusals.get_or_create(&RefusalLabels { kind: kind.clone(), cause: cause.clone() }).set(*n);
        }
    }

    /// Sets the expiry of every certificate served: `(secret namespace, name) → notAfter`.
    pub fn set_expiry(&self, certs: &std::collections::BTreeMap<(String, String), i64>) {
        self.expiry.clear();
        for ((ns, name), at) in certs {
            self.expiry.get_or_create(&SecretLabels { secret_namespace: ns.clone(), secret: name.clone() }).set(*at);
        }
    }
}

/// Every metric, registered.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `haptic_deployments_total{result}`.
    pub deployments: Family<ResultLabel, Counter>,
    /// `haptic_deployment_duration_seconds`.
    pub deployment_duration: Histogram,
    /// `haptic_applies_total{mode,result}`.
    pub applies: Family<ApplyLabels, Counter>,
    /// `haptic_reloads_avoided_total`.
    pub reloads_avoided: Counter,
    /// `haptic_pods_converged`.
    pub pods_converged: Gauge,
    /// `haptic_pods`: pods in the fleet (deployment targets).
    pub pods: Gauge,
    /// `haptic_agent_version_skew_total`.
    pub version_skew: Counter,
    /// `haptic_gate_rejections_total`.
    pub gate_rejections: Counter,
    /// `haptic_gate_pinned`.
    pub gate_pinned: Gauge,
    /// `haptic_drift_repairs_total`.
    pub drift_repairs: Counter,
    /// `haptic_apply_rejected_total{haproxy_pod}` (through [`Metrics::pod_apply_rejected`]).
    pub apply_rejected: Family<PodLabel, Counter>,
    /// The pods that have a series in a per-pod family.
    pod_series: Mutex<BTreeSet<String>>,
    /// `haptic_leader`: 1 while this replica holds the Lease and deploys.
    pub leader: Gauge,
    /// `haptic_apply_conflicts_total{conflict}`.
    pub conflicts: Family<ConflictLabel, Counter>,
    /// `haptic_haproxy_pods_rejected_total{reason}` (Kubernetes mode's admission).
    pub pods_rejected: Family<ReasonLabel, Counter>,
    /// `haptic_apply_retries_total`: exact retries (same fence and plan) after no answer.
    pub apply_retries: Counter,
    /// `haptic_reload_causes_total{cause}` (through [`Metrics::reload_causes`]).
    pub reload_cause: Family<CauseLabel, Counter>,
    /// Render mode's health.
    pub render: RenderHealth,
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
        let deployments = Family::<ResultLabel, Counter>::default();
        // Every result from 0: the family is exposed from the start and a first failure is an
        // increase Prometheus sees.
        for result in DEPLOYMENT_RESULTS {
            drop(deployments.get_or_create(&ResultLabel { result: result.into() }));
        }
        let deployment_duration = Histogram::new([0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0]);
        let applies = Family::<ApplyLabels, Counter>::default();
        let reloads_avoided = Counter::default();
        let pods_converged = Gauge::default();
        let pods = Gauge::default();
        let leader = Gauge::default();
        let build_info = Family::<BuildLabels, Gauge>::default();
        build_info
            .get_or_create(&BuildLabels { component: "controller".into(), version: env!("CARGO_PKG_VERSION").into() })
            .set(1);
        let version_skew = Counter::default();
        let gate_rejections = Counter::default();
        let gate_pinned = Gauge::default();
        let drift_repairs = Counter::default();
        let apply_rejected = Family::<PodLabel, Counter>::default();
        let conflicts = Family::<ConflictLabel, Counter>::default();
        let apply_retries = Counter::default();
        registry.register("haptic_deployments", "Deployments by result", deployments.clone());
        registry.register(
            "haptic_apply_retries",
            "Applies sent again unchanged (same fence and plan) after no answer",
            apply_retries.clone(),
        );
        registry.register(
            "haptic_deployment_duration_seconds",
            "Time from dispatch to every pod answered",
            deployment_duration.clone(),
        );
        registry.register("haptic_applies", "Applies by landed mode and result", applies.clone());
        registry.register("haptic_reloads_avoided", "Applies that landed without a reload", reloads_avoided.clone());
        registry.register("haptic_pods_converged", "Pods running the target plan", pods_converged.clone());
        registry.register("haptic_pods", "HAProxy pods in the fleet (deployment targets)", pods.clone());
        registry.register("haptic_leader", "1 while this replica holds the Lease and deploys", leader.clone());
        registry.register("haptic_build_info", "The running build (always 1)", build_info);
        registry.register(
            "haptic_agent_version_skew",
            "Applies sent as complete state and a reload because of agent version skew",
            version_skew.clone(),
        );
        registry.register("haptic_gate_rejections", "Renders refused by the gate", gate_rejections.clone());
        registry.register(
            "haptic_gate_pinned",
            "1 while the fleet is pinned on the last good render",
            gate_pinned.clone(),
        );
        registry.register("haptic_drift_repairs", "Pods rewritten by drift repair", drift_repairs.clone());
        registry.register("haptic_apply_rejected", "Applies HAProxy refused (NACK), per pod", apply_rejected.clone());
        registry.register("haptic_apply_conflicts", "409 answers by kind", conflicts.clone());
        let pods_rejected = Family::<ReasonLabel, Counter>::default();
        registry.register(
            "haptic_haproxy_pods_rejected",
            "HAProxy pods not admitted as deployment targets, by reason",
            pods_rejected.clone(),
        );
        let reload_cause = Family::<CauseLabel, Counter>::default();
        registry.register(
            "haptic_reload_causes",
            "Applies that landed with a reload, by what needed it (an apply with several causes counts once under each)",
            reload_cause.clone(),
        );
        let render = RenderHealth::register(&mut registry);
        Metrics {
            reload_cause,
            registry,
            deployments,
            deployment_duration,
            applies,
            reloads_avoided,
            pods_converged,
            pods,
            version_skew,
            gate_rejections,
            gate_pinned,
            drift_repairs,
            apply_rejected,
            pod_series: Mutex::new(BTreeSet::new()),
            leader,
            conflicts,
            pods_rejected,
            apply_retries,
            render,
        }
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }

    /// Counts one apply.
    pub fn apply(&self, mode: &str, result: &str) {
        self.applies.get_or_create(&ApplyLabels { mode: mode.into(), result: result.into() }).inc();
    }

    /// Counts one apply that landed with a reload under each of its causes.
    pub fn reload_causes(&self, causes: &BTreeSet<ReloadCause>) {
        for c in causes {
            self.reload_cause.get_or_create(&CauseLabel { cause: c.as_str().into() }).inc();
        }
    }

    /// Counts one pod not admitted, by reason.
    pub fn pod_rejected(&self, reason: &str) {
        self.pods_rejected.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
    }

    /// Counts one NACK from `pod`.
    pub fn pod_apply_rejected(&self, pod: &str) {
        self.pod_series.lock().unwrap_or_else(|e| e.into_inner()).insert(pod.to_string());
        self.apply_rejected.get_or_create(&PodLabel { haproxy_pod: pod.into() }).inc();
    }

    /// Makes the per-pod series match `fleet`: every pod in it has one (from 0, so its first
    /// NACK is an increase Prometheus sees, and the family is in the exposition while there is a
    /// fleet), and a pod that left (deleted, replaced or no longer a target) loses its own, so the
    /// exposition does not grow with every pod ever seen.
    pub fn retain_pods<'a>(&self, fleet: impl IntoIterator<Item = &'a str>) {
        let fleet: BTreeSet<&str> = fleet.into_iter().collect();
        let mut known = self.pod_series.lock().unwrap_or_else(|e| e.into_inner());
        known.retain(|p| {
            let keep = fleet.contains(p.as_str());
            if !keep {
                self.apply_rejected.remove(&PodLabel { haproxy_pod: p.clone() });
            }
            keep
        });
        for p in fleet {
            if known.insert(p.to_string()) {
                drop(self.apply_rejected.get_or_create(&PodLabel { haproxy_pod: p.into() }));
            }
        }
    }

    /// Counts one deployment.
    pub fn deployment(&self, result: &str) {
        self.deployments.get_or_create(&ResultLabel { result: result.into() }).inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_health_shows_validity_and_only_the_last_renders_refusals() {
        let m = Metrics::new();
        let one = std::collections::BTreeMap::from([(("Ingress".to_string(), "Invalid".to_string()), 2)]);
        assert!(!m.encode().contains("haptic_render_valid{"), "no series outside render mode");
        m.render.set("edge", Some(false), &one);
        let text = m.encode();
        assert!(text.contains("haptic_render_valid{config=\"edge\"} 0"), "{text}");
        assert!(text.contains("haptic_render_refusals{kind=\"Ingress\",cause=\"Invalid\"} 2"), "{text}");
        m.render.set("edge", Some(true), &std::collections::BTreeMap::new());
        let text = m.encode();
        assert!(text.contains("haptic_render_valid{config=\"edge\"} 1"), "{text}");
        assert!(!text.contains("haptic_render_refusals{"), "a refusal gone is a series gone: {text}");
        m.render
            .set_expiry(&std::collections::BTreeMap::from([(("shop".to_string(), "tls".to_string()), 1_900_000_000)]));
        let text = m.encode();
        assert!(
            text.contains(
                "haptic_certificate_expiry_timestamp_seconds{secret_namespace=\"shop\",secret=\"tls\"} 1900000000"
            ),
            "{text}"
        );
    }

    #[test]
    fn names() {
        let m = Metrics::new();
        m.apply("runtime", "ack");
        m.deployment("success");
        m.pod_apply_rejected("p1");
        m.pod_apply_rejected("p2");
        m.gate_pinned.set(1);
        m.reload_causes(&BTreeSet::from([
            ReloadCause::Config(haptic_haproxy::claim::ConfigPart::Frontend),
            ReloadCause::File,
        ]));
        m.reload_causes(&BTreeSet::from([ReloadCause::File]));
        let text = m.encode();
        for name in [
            "haptic_deployments_total{result=\"success\"} 1",
            "haptic_deployments_total{result=\"stood_down\"} 0",
            "haptic_applies_total{mode=\"runtime\",result=\"ack\"} 1",
            "haptic_deployment_duration_seconds_bucket",
            "haptic_reloads_avoided_total 0",
            "haptic_pods_converged 0",
            "haptic_pods 0",
            "haptic_leader 0",
            concat!("haptic_build_info{component=\"controller\",version=\"", env!("CARGO_PKG_VERSION"), "\"} 1"),
            "haptic_agent_version_skew_total 0",
            "haptic_gate_rejections_total 0",
            "haptic_gate_pinned 1",
            "haptic_drift_repairs_total 0",
            "haptic_apply_rejected_total{haproxy_pod=\"p1\"} 1",
            "haptic_apply_rejected_total{haproxy_pod=\"p2\"} 1",
            "haptic_reload_causes_total{cause=\"frontend\"} 1",
            "haptic_reload_causes_total{cause=\"file\"} 2",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
        assert!(!text.contains("haptic_pods_total"), "a gauge has no _total suffix");
        // p2 leaves the fleet: its series goes, p1's stays; p3 joins with a series at 0.
        m.retain_pods(["p1", "p3"]);
        let text = m.encode();
        assert!(text.contains("haptic_apply_rejected_total{haproxy_pod=\"p1\"} 1"), "{text}");
        assert!(text.contains("haptic_apply_rejected_total{haproxy_pod=\"p3\"} 0"), "{text}");
        assert!(!text.contains("p2"), "{text}");
        m.retain_pods([]);
        assert!(!m.encode().contains("haptic_apply_rejected"), "no fleet, no per-pod series");
    }
}
