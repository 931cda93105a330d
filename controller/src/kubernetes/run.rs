//! Running one `HAProxyConfig` in Kubernetes mode.
//!
//! Owns the wiring: every replica builds the [`Context`], watches the resource (renders),
//! discovers and admits pods, runs the Lease elector and serves `/healthz`, `/metrics` and
//! `/status`; only while the Lease is held does a deployment loop (gate, diff, deployer,
//! scheduler, drift) run over the shared feeds, with the status writer beside it. A change of
//! `spec.controller` reaches the running loop as new [`Tuning`] (plan cache, known pods and
//! follow-ups stay). Losing the Lease cancels both at once; winning it again starts a new term
//! with a higher epoch. In render mode the term also writes the served Ingresses' status. It must never hold deployment logic itself.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::agent_tls;
use super::config_source::Stores;
use super::context::{Context, Names};
use super::crd::{parse_duration, GateSpec, HAProxyConfig};
use super::discovery::{discover, FeedEndpoints};
use super::feed::{watch_config, FeedBundles};
use super::fence::LeaseFence;
use super::lease::{Elector, LeaseTiming};
use super::published::{Discovered, Snapshot};
use super::status;
use crate::admin::{self, AdminState};
use crate::app::{Running, Settings, Shared};
use crate::client::Credentials;
use crate::error::Error;
use crate::gate::GateMode;
use crate::scheduler::Tuning;

/// Kubernetes-mode settings.
#[derive(Debug, Clone)]
pub struct KubernetesSettings {
    /// Common settings; `credentials` is unused (they come from the resource's Secret), and the
    /// resource's `spec.controller` overrides the timing, parallelism and gate fields.
    pub common: Settings,
    /// The namespace of the resource, its ConfigMaps, Secrets, pods and Lease.
    pub namespace: String,
    /// The `HAProxyConfig` name.
    pub config: String,
    /// The Lease name (default `haptic-<config>`).
    pub lease_name: String,
    /// This replica's identity (Lease holder and fence holder).
    pub identity: String,
    /// Lease timing.
    pub timing: LeaseTiming,
    /// Quiet windows after a change before rendering.
    pub settle: super::settle::Settle,
    /// TLS towards the agents (`None`: plain HTTP).
    pub agent_tls: Option<AgentTlsSettings>,
}

/// Where the agents' CA comes from in Kubernetes mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentTlsSettings {
    /// The agents' serving Secret in the namespace; its `ca.crt` is the trusted bundle.
    pub secret: String,
    /// Whether this controller issues and rotates that Secret itself (else cert-manager or the
    /// admin writes it).
    pub issue: bool,
}

/// The common settings with the resource's `spec.controller` applied (bad values keep the flag's
/// value and are logged).
pub fn term_settings(base: &Settings, cfg: Option<&HAProxyConfig>) -> Settings {
    let mut s = base.clone();
    let Some(c) = cfg.map(|c| &c.spec.controller) else { return s };
    let set = |field: &str, text: &str, slot: &mut Duration| match parse_duration(field, text) {
        Ok(d) => *slot = d,
        Err(e) => warn!("{e}; keeping {slot:?}"),
    };
    set("controller.deploymentTimeout", &c.deployment_timeout, &mut s.deployment_timeout);
    set("controller.driftPreventionInterval", &c.drift_prevention_interval, &mut s.drift_interval);
    set("controller.syncTimeout", &c.sync_timeout, &mut s.sync_timeout);
    s.max_parallel = usize::from(c.max_parallel.max(1));
    s.gate = match c.gate {
        GateSpec::Optimistic => GateMode::Optimistic,
        GateSpec::Pessimistic => GateMode::Pessimistic,
    };
    s
}

/// An owner reference to the served `HAProxyConfig`, once it is known.
fn config_owner(snap: &Snapshot) -> Option<OwnerReference> {
    let c = snap.config.as_ref()?;
    Some(OwnerReference {
        api_version: "haptic.dev/v1alpha1".into(),
        kind: "HAProxyConfig".into(),
        name: c.metadata.name.clone()?,
        uid: c.metadata.uid.clone()?,
        ..OwnerReference::default()
    })
}

/// Starts Kubernetes mode; the returned [`Running`] stops everything (releasing the Lease).
pub async fn start_kubernetes(s: KubernetesSettings, client: Client) -> Result<Running, Error> {
    let shutdown = CancellationToken::new();
    let mut common = s.common.clone();
    common.credentials = Credentials { user: String::new(), password: String::new() };
    let shared = Shared::new(&common, s.identity.clone(), 0)?;
    shared.board.controller(|c| c.stood_down = Some("waiting for the Lease".into()));

    let (stores, config_writer) = Stores::new(&s.namespace);
    let (snap_tx, snapshots) = watch::channel(Snapshot::default());
    let (disc_tx, discovered) = watch::channel(Discovered::default());
    let ctx = Context {
        recorder: status::recorder(client.clone(), &s.identity),
        client,
        namespace: s.namespace.clone(),
        names: Arc::new(Names { config: s.config.clone(), lease: s.lease_name.clone(), identity: s.identity.clone() }),
        stores,
        snapshots,
        discovered,
        board: shared.board.clone(),
        haproxy_bin: s.common.haproxy_bin.clone(),
    };
    let mut tasks = Vec::new();
    if let (Some(t), Some(trust), Some(name)) =
        (&s.agent_tls, shared.client.trust(), common.agent_tls_server_name.clone())
    {
        let snaps = ctx.snapshots.clone();
        tasks.push(tokio::spawn(agent_tls::run(
            ctx.api(),
            t.secret.clone(),
            name,
            t.issue,
            move || config_owner(&snaps.borrow()),
            trust.clone(),
            shutdown.clone(),
        )));
    }
    tasks.push(tokio::spawn(watch_config(ctx.clone(), config_writer, snap_tx, s.settle, shutdown.clone())));
    tasks.push(tokio::spawn(discover(
        ctx.clone(),
        shared.client.clone(),
        shared.metrics.clone(),
        disc_tx,
        shutdown.clone(),
    )));
    let health = (ctx.snapshots.clone(), ctx.names.config.clone());
    tasks.push(tokio::spawn(follow_render_health(health, shared.metrics.clone(), shutdown.clone())));
    // `spec.controller` as the running loop's tuning: a change reaches it without a restart.
    let (tuning_tx, tuning) = watch::channel(term_settings(&common, None).tuning());
    tasks.push(tokio::spawn(follow_tuning(ctx.snapshots.clone(), common.clone(), tuning_tx, shutdown.clone())));

    let (elector, leadership, raise) = Elector::new(ctx.api(), &ctx.names.lease, &ctx.names.identity, s.timing);
    // The Lease belongs to the HAProxyConfig: deleting it (or `helm uninstall`) removes the Lease.
    let owner_snaps = ctx.snapshots.clone();
    let elector = elector.owned_by(move || config_owner(&owner_snaps.borrow()));

    let listener = tokio::net::TcpListener::bind(common.admin_listen)
        .await
        .map_err(|e| Error::io(format!("admin listen {}", common.admin_listen), e))?;
    let admin_addr: SocketAddr = listener.local_addr().map_err(|e| Error::io("admin listener", e))?;
    let state = AdminState { board: shared.board.clone(), metrics: shared.metrics.clone() };
    let sd = shutdown.clone();
    tasks.push(tokio::spawn(async move {
        if let Err(e) = admin::serve(listener, state, async move { sd.cancelled().await }).await {
            tracing::error!("admin server failed: {e}");
        }
    }));
    let elector_stop = CancellationToken::new();
    let es = elector_stop.clone();
    let elector_task = tokio::spawn(async move { elector.run(es).await });

    let fence = Arc::new(LeaseFence::new(&s.identity, leadership.clone(), raise, s.timing.renew_deadline));
    let sd = shutdown.clone();
    let board = shared.board.clone();
    let metrics = shared.metrics.clone();
    let terms = Terms { ctx, common, shared, fence, tuning, retry: s.timing.retry_period };
    tasks.push(tokio::spawn(async move {
        terms.run(leadership, sd).await;
        elector_stop.cancel();
        let _ = elector_task.await;
    }));
    info!(admin = %admin_addr, "kubernetes mode started");
    Ok(Running::from_parts(admin_addr, board, metrics, shutdown, tasks))
}

/// Sets `haptic_render_valid`, `haptic_render_refusals` and the certificates' expiry from each
/// published render.
async fn follow_render_health(
    (mut snapshots, config): (watch::Receiver<Snapshot>, String),
    metrics: Arc<crate::metrics::Metrics>,
    shutdown: CancellationToken,
) {
    loop {
        let (valid, refusals, expiry) = {
            let snap = snapshots.borrow_and_update();
            let (valid, refusals) = render_health(&snap);
            (valid, refusals, certificate_expiry(&snap))
        };
        metrics.render.set(&config, valid, &refusals);
        metrics.render.set_expiry(&expiry);
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = snapshots.changed() => if r.is_err() { return },
        }
    }
}

/// Whether a render-mode snapshot renders (none outside render mode), and its refusals by
/// (object kind, cause).
fn render_health(s: &Snapshot) -> (Option<bool>, BTreeMap<(String, String), i64>) {
    let render_mode = s.config.as_ref().is_some_and(|c| c.spec.render.is_some());
    let valid = render_mode.then_some(matches!(s.bundle, Some(Ok(_))));
    let mut refusals = BTreeMap::new();
    let ingress = s.ingress.iter().flat_map(|o| o.served.iter().map(|v| &v.verdict));
    let gateway = s.gateway.iter().flat_map(|o| o.verdicts.iter());
    for v in ingress.chain(gateway) {
        for r in &v.refusals {
            *refusals.entry((v.object.kind.clone(), format!("{:?}", r.cause))).or_insert(0) += 1;
        }
    }
    (valid, refusals)
}

/// When each certificate a snapshot's render serves expires, by its Secret (namespace, name).
fn certificate_expiry(s: &Snapshot) -> BTreeMap<(String, String), i64> {
    s.ingress
        .iter()
        .flat_map(|o| o.certificates.iter())
        .map(|c| ((c.source.namespace.clone(), c.source.name.clone()), c.not_after))
        .collect()
}

/// Publishes the tuning of each published resource's `spec.controller` (only on a change).
async fn follow_tuning(
    mut snapshots: watch::Receiver<Snapshot>,
    common: Settings,
    tx: watch::Sender<Tuning>,
    shutdown: CancellationToken,
) {
    loop {
        let cfg = snapshots.borrow_and_update().config.clone();
        let t = term_settings(&common, cfg.as_deref()).tuning();
        let changed = tx.send_if_modified(|cur| {
            let changed = *cur != t;
            *cur = t;
            changed
        });
        if changed {
            info!("spec.controller changed: the deployment loop takes the new settings");
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = snapshots.changed() => if r.is_err() { return },
        }
    }
}

/// Why a deployment term ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum TermEnd {
    /// The controller is stopping (or the leadership feed ended).
    Shutdown,
    /// This replica stops deploying, with why.
    StandDown(String),
}

/// The leadership terms of this replica, and what each runs over.
struct Terms {
    ctx: Context,
    common: Settings,
    shared: Shared,
    fence: Arc<LeaseFence>,
    tuning: watch::Receiver<Tuning>,
    retry: Duration,
}

impl Terms {
    /// One deployment loop per leadership term, until `shutdown`.
    async fn run(self, mut leadership: watch::Receiver<Option<super::lease::Term>>, shutdown: CancellationToken) {
        let ctx = &self.ctx;
        loop {
            // Follow until this replica holds the Lease.
            loop {
                if leadership.borrow_and_update().is_some() {
                    break;
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = leadership.changed() => if r.is_err() { return },
                }
            }
            let epoch = leadership.borrow().as_ref().map_or(0, |t| t.epoch);
            self.shared.board.controller(|c| c.stood_down = None);
            info!(identity = %ctx.names.identity, epoch, config = %ctx.names.config, "leading: starting a deployment term");
            let running = match crate::app::start_with(
                self.common.clone(),
                Box::new(FeedBundles::new(ctx.snapshots.clone())),
                Box::new(FeedEndpoints::new(ctx.discovered.clone())),
                self.fence.clone(),
                self.shared.clone(),
                None,
                self.tuning.clone(),
            )
            .await
            {
                Ok(r) => r,
                Err(e) => {
                    warn!("cannot start a deployment term: {e}");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(self.retry) => continue,
                    }
                }
            };
            let term = CancellationToken::new();
            let writer = tokio::spawn(status::write_loop(ctx.clone(), self.shared.board.clone(), term.clone()));
            let ingress_writer = tokio::spawn(super::ingress_status::write_loop(ctx.clone(), term.clone()));
            let gateway_writer = tokio::spawn(super::gateway_status::write_loop(ctx.clone(), term.clone()));
            // Run until the Lease is lost, or shutdown.
            let end = loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break TermEnd::Shutdown,
                    r = leadership.changed() => {
                        if r.is_err() {
                            break TermEnd::Shutdown;
                        }
                        if leadership.borrow().is_none() {
                            break TermEnd::StandDown("lost the Lease".to_string());
                        }
                    }
                }
            };
            term.cancel();
            let _ = writer.await;
            let _ = ingress_writer.await;
            let _ = gateway_writer.await;
            running.stop().await;
            match end {
                TermEnd::Shutdown => return,
                TermEnd::StandDown(w) => {
                    warn!(identity = %ctx.names.identity, "STANDING DOWN: {w}; deployments stopped");
                    self.shared.board.controller(|c| c.stood_down = Some(w.clone()));
                    let obj = ctx.snapshots.borrow().config.clone();
                    if let Some(obj) = obj {
                        let ev =
                            status::EventSpec::warning("StoodDown", format!("{} stood down: {w}", ctx.names.identity));
                        status::publish(&ctx.recorder, &obj, ev).await;
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_render::{Cause, CertExpiry, ObjectRef, Refusal, Verdict};

    #[test]
    fn a_render_mode_snapshot_gives_validity_refusals_and_expiry() {
        let secret = ObjectRef { kind: "Secret".into(), namespace: "shop".into(), name: "tls".into() };
        let mut refused =
            Verdict::of(ObjectRef { kind: "Ingress".into(), namespace: "shop".into(), name: "bad".into() });
        refused.refusals.push(Refusal::new(Cause::Invalid, "spec", "why"));
        let outcome = super::super::routes::IngressOutcome {
            served: vec![super::super::routes::Served { verdict: refused, uid: None }],
            certificates: vec![CertExpiry { source: secret, not_after: 1_900_000_000 }],
            ..Default::default()
        };
        let mut config: HAProxyConfig = serde_json::from_value(serde_json::json!({
            "apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig", "metadata": {"name": "edge"},
            "spec": {"podSelector": {}, "agent": {"port": 9080}, "render": {"ingressClassName": "haptic"}}
        }))
        .unwrap();
        let snap = Snapshot {
            config: Some(Arc::new(config.clone())),
            bundle: Some(Err(crate::kubernetes::config_source::SpecError::invalid("spec.render", "no".into()))),
            ingress: Some(Arc::new(outcome)),
            gateway: None,
        };
        let (valid, refusals) = render_health(&snap);
        assert_eq!(valid, Some(false));
        assert_eq!(refusals, BTreeMap::from([(("Ingress".to_string(), "Invalid".to_string()), 1)]));
        assert_eq!(
            certificate_expiry(&snap),
            BTreeMap::from([(("shop".to_string(), "tls".to_string()), 1_900_000_000)])
        );
        config.spec.render = None;
        let plain = Snapshot { config: Some(Arc::new(config)), ..snap };
        assert_eq!(render_health(&plain).0, None, "no series outside render mode");
    }
}
