//! `real_routes`: the route-scale cases (`attach_routes`, `propagate_routes`,
//! `change_under_load`, `sweep`, `churn_routes`) on the real cluster of `scripts/cluster.sh`: one
//! node (kubelet + containerd), our images loaded (this build's profile), the Gateway API
//! standard CRDs, and the chart installed by helm with `gateway.enabled` (2 HAProxy pods, 2
//! controller replicas of which the Lease holder deploys, the product's settle windows, 2 server
//! slots per backend). The upstream is a Deployment of 2 busybox `httpd` pods in namespace
//! [`NS`] answering `ok` on every path the cases ask (`change_under_load` adds one answering
//! `alt`); each Service is headless with an EndpointSlice the case writes naming those pods, so
//! 5,000 Services need no more pods. Traffic goes to the HAProxy pods' own addresses on the
//! Gateway's bind port, every pod asked. Memory is read from `/proc` of this machine (the
//! containers are its processes): the Lease holder's controller process and each HAProxy pod's
//! `haproxy` processes, found by their cgroup.
//!
//! `HAPTIC_BENCH_REAL_ROUTES` (comma-separated: `attach`, `propagate`, `change`, `sweep`,
//! `churn`; default all) picks the cases; `HAPTIC_BENCH_PROPAGATE_ROUTES` and
//! `HAPTIC_BENCH_CHURN_SECS` size them as on the local control plane. Needs root; runs only when
//! named (`--only real_routes`); takes the machine's one cluster down before and after, and must
//! never touch a cluster it did not start nor send traffic outside this machine and the cluster's
//! pods.

use std::net::Ipv4Addr;
use std::time::Duration;

use haptic_e2e::cluster::real::{RealCluster, LEASE, NAMESPACE};
use haptic_e2e::cluster::{worker_pids, Cluster};
use haptic_render::gateway_api::HttpRoute;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams};
use kube::Client;
use serde_json::{json, Value};

use super::k8s::{kerr, NS};
use super::k8s_endpoints::apply;
use super::k8s_gateway::{bind_port, gateway, route, service_in, slice_of, wait_answering, BASE_HOST, SCALE_HOST};
use super::real_cluster::{connect, require_root, script};
use super::route_fleet::{RouteFleet, ALT, ALT_BODY, WEB_BODY};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::proc_mem::{mib, pod_processes, rss};
use crate::report::Row;

const CASE: &str = "real_routes";
/// The upstream Deployment in [`NS`], its replicas and port.
const WEB: &str = "web-ok";
const WEB_REPLICAS: usize = 2;
const WEB_PORT: u16 = 8000;
/// The Deployment (1 pod, on [`WEB_PORT`]) behind Service [`ALT`].
const ALT_WEB: &str = "web-alt";
/// The sweep's paths are `/r0` … `/r<SWEEP_PATHS - 1>`.
const SWEEP_PATHS: usize = 1000;
/// How long the upstream pods may take to be ready.
const READY: Duration = Duration::from_secs(180);

fn cluster_err(e: impl std::fmt::Display) -> BenchError {
    BenchError::Kubernetes(e.to_string())
}

/// The real cluster's fleet, as [`RouteFleet`] asks.
pub(super) struct RealRouteFleet {
    cluster: RealCluster,
    client: Client,
    ips: Vec<Ipv4Addr>,
    bind: u16,
    web: Vec<Ipv4Addr>,
}

/// Deployment `name` of `replicas` busybox `httpd` pods answering `body` on `/`, `/a`, `/b` and
/// every sweep path.
fn web_deployment(name: &str, body: &str, replicas: usize) -> Value {
    let labels = json!({"app.kubernetes.io/name": name});
    let script = format!(
        "mkdir -p /www; for f in index.html a b; do printf {body} > /www/$f; done; i=0; \
         while [ $i -lt {SWEEP_PATHS} ]; do printf {body} > /www/r$i; i=$((i+1)); done; exec httpd -f -p {WEB_PORT} -h /www"
    );
    json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": name, "namespace": NS},
           "spec": {"replicas": replicas, "selector": {"matchLabels": labels}, "template": {
               "metadata": {"labels": labels},
               "spec": {"containers": [{"name": "httpd", "image": "localhost/haptic-e2e-web:1", "imagePullPolicy": "Never",
                                        "command": ["/bin/sh", "-c", script],
                                        "readinessProbe": {"tcpSocket": {"port": WEB_PORT}, "periodSeconds": 1}}]}}}})
}

/// Applies [`web_deployment`] and waits until its `replicas` pods are ready; their addresses.
async fn start_web(client: &Client, name: &str, body: &str, replicas: usize) -> Result<Vec<Ipv4Addr>> {
    apply(client, web_deployment(name, body, replicas)).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), NS);
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/name={name}"));
    let deadline = std::time::Instant::now() + READY;
    loop {
        let ready: Vec<Ipv4Addr> = pods
            .list(&lp)
            .await
            .map_err(kerr("list the upstream pods"))?
            .items
            .iter()
            .filter(|p| haptic_e2e::cluster::real::pod_ready(p))
            .filter_map(|p| p.status.as_ref()?.pod_ip.as_ref()?.parse().ok())
            .collect();
        if ready.len() == replicas {
            return Ok(ready);
        }
        if std::time::Instant::now() > deadline {
            return Err(BenchError::Timeout(format!("{name}: {} of {replicas} pods ready", ready.len())));
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

impl RealRouteFleet {
    /// Installs the chart, the upstream, the Gateway and its Services; the routes every case
    /// starts from are [`RealRouteFleet::reset`]'s.
    async fn start() -> Result<Self> {
        let cluster = connect().await?;
        cluster
            .install(&["gateway.enabled=true", "gateway.service.type=ClusterIP", "gateway.serverSlots=2"])
            .map_err(cluster_err)?;
        let client = cluster.client();
        apply(&client, json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})).await?;
        let web = start_web(&client, WEB, WEB_BODY, WEB_REPLICAS).await?;
        let mut fleet = Self { cluster, client, ips: Vec::new(), bind: 0, web };
        apply(&fleet.client, gateway()).await?;
        for svc in ["web", "scale"] {
            for obj in fleet.backend(NS, svc) {
                apply(&fleet.client, obj).await?;
            }
        }
        fleet.ips =
            fleet.cluster.haproxy_pod_ips().await.map_err(cluster_err)?.iter().filter_map(|i| i.parse().ok()).collect();
        fleet.bind = bind_port(&fleet.client, NAMESPACE).await?;
        Ok(fleet)
    }

    /// Deletes every HTTPRoute of [`NS`] and makes `base` and `scale` again; waits until every
    /// pod answers `base`.
    async fn reset(&self) -> Result<()> {
        let routes: Api<DynamicObject> =
            Api::namespaced_with(self.client.clone(), NS, &ApiResource::erase::<HttpRoute>(&()));
        routes
            .delete_collection(&DeleteParams::default(), &ListParams::default())
            .await
            .map_err(kerr("delete HTTPRoutes"))?;
        apply(&self.client, route("base", BASE_HOST, "/", "web")).await?;
        apply(&self.client, route("scale", SCALE_HOST, "/", "scale")).await?;
        wait_answering(&self.ips, self.bind, BASE_HOST, "/").await?;
        Ok(())
    }

    /// The HAProxy pods, sorted by name.
    async fn haproxy_pods(&self) -> Result<Vec<Pod>> {
        self.cluster
            .pods("app.kubernetes.io/name=haptic,app.kubernetes.io/component=haproxy")
            .await
            .map_err(cluster_err)
    }

    /// The HAProxy version the pods run, from the first agent's state.
    async fn haproxy_version(&self) -> Result<String> {
        let first = self.cluster.haproxy_pods().await.map_err(cluster_err)?.into_iter().next();
        let name = first.ok_or_else(|| BenchError::Unexpected("no HAProxy pod".into()))?;
        let st = self.cluster.agent_state(&name).await.map_err(cluster_err)?;
        Ok(st["haproxy"]["version"].as_str().unwrap_or("?").to_string())
    }
}

impl RouteFleet for RealRouteFleet {
    fn client(&self) -> &Client {
        &self.client
    }

    fn ips(&self) -> &[Ipv4Addr] {
        &self.ips
    }

    fn bind(&self) -> u16 {
        self.bind
    }

    fn fleet_ns(&self) -> &str {
        NAMESPACE
    }

    fn describe(&self) -> String {
        format!(
            "the real cluster of scripts/cluster.sh (1 node: kubelet + containerd), the chart installed by helm: {} HAProxy \
             pods, the Lease holder of 2 controller replicas deploying at the product's settle windows; upstream: \
             {WEB_REPLICAS} busybox httpd pods",
            self.ips.len()
        )
    }

    async fn controller_pid(&self) -> Result<u32> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), NAMESPACE);
        let lease = leases.get(LEASE).await.map_err(kerr("get the Lease"))?;
        let holder = lease.spec.and_then(|s| s.holder_identity).unwrap_or_default();
        let pods = self.cluster.pods("app.kubernetes.io/component=controller").await.map_err(cluster_err)?;
        // The identity is `<pod name>-<random>`.
        let leader = pods
            .iter()
            .find(|p| p.metadata.name.as_ref().is_some_and(|n| holder.starts_with(&format!("{n}-"))))
            .ok_or_else(|| BenchError::Unexpected(format!("no controller pod holds the Lease ({holder:?})")))?;
        let uid = leader.metadata.uid.clone().unwrap_or_default();
        pod_processes(&uid, "haptic-controller")
            .first()
            .copied()
            .ok_or_else(|| BenchError::Unexpected(format!("no haptic-controller process of pod uid {uid} here")))
    }

    async fn workers(&self) -> Result<Vec<Option<u32>>> {
        let pids = worker_pids(&self.cluster).await.map_err(cluster_err)?;
        Ok(pids.values().map(|p| u32::try_from(*p).ok().filter(|p| *p != 0)).collect())
    }

    async fn haproxy_mib(&self) -> Result<Vec<f64>> {
        Ok(self
            .haproxy_pods()
            .await?
            .iter()
            .map(|p| {
                let uid = p.metadata.uid.clone().unwrap_or_default();
                mib(pod_processes(&uid, "haproxy").into_iter().filter_map(rss).sum())
            })
            .collect())
    }

    fn backend(&self, ns: &str, svc: &str) -> Vec<Value> {
        vec![service_in(ns, svc), slice_of(ns, svc, &self.web, WEB_PORT)]
    }

    async fn start_alt(&mut self) -> Result<()> {
        let alt = start_web(&self.client, ALT_WEB, ALT_BODY, 1).await?;
        for obj in [service_in(NS, ALT), slice_of(NS, ALT, &alt, WEB_PORT)] {
            apply(&self.client, obj).await?;
        }
        Ok(())
    }
}

/// Which of the cases run (`HAPTIC_BENCH_REAL_ROUTES`).
fn wanted() -> Result<Vec<String>> {
    let all = ["attach", "propagate", "change", "sweep", "churn"];
    let Ok(v) = std::env::var("HAPTIC_BENCH_REAL_ROUTES") else { return Ok(all.map(String::from).to_vec()) };
    let picked: Vec<String> = v.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect();
    match picked.iter().find(|p| !all.contains(&p.as_str())) {
        Some(bad) => Err(BenchError::Unexpected(format!("HAPTIC_BENCH_REAL_ROUTES: no case {bad:?} (of {all:?})"))),
        None => Ok(picked),
    }
}

/// The cases on the running cluster, each from a fleet with only routes `base` and `scale`.
async fn on_cluster(ctx: &Ctx, which: &[String]) -> Result<Vec<Row>> {
    let mut fleet = RealRouteFleet::start().await?;
    let mut ctx = ctx.clone();
    ctx.label = format!("{} (image, real cluster)", fleet.haproxy_version().await?);
    let (mut rows, mut failed) = (Vec::new(), Vec::new());
    for case in which {
        // A case that fails leaves the others to run; its rows so far are on stderr already.
        let got = match fleet.reset().await {
            Err(e) => Err(e),
            Ok(()) => match case.as_str() {
                "attach" => super::k8s_attach::run_on(&ctx, &fleet).await,
                "propagate" => super::k8s_propagate::run_on(&ctx, &fleet).await,
                "change" => super::k8s_change::run_on(&ctx, &mut fleet).await,
                "sweep" => super::k8s_sweep::run_on(&ctx, &fleet).await,
                _ => super::k8s_churn::run_on(&ctx, &fleet).await,
            },
        };
        match got {
            Ok(got) => {
                for mut r in got {
                    r.case = format!("{CASE}/{}", r.case);
                    eprintln!("#   {}", crate::report::line(&r));
                    rows.push(r);
                }
            }
            Err(e) => {
                eprintln!("#   {CASE}/{case}: {e}");
                failed.push(format!("{case}: {e}"));
            }
        }
    }
    fleet.cluster.uninstall().map_err(cluster_err)?;
    if failed.is_empty() {
        Ok(rows)
    } else {
        Err(BenchError::Unexpected(format!("{} of the cases failed: {}", failed.len(), failed.join("; "))))
    }
}

/// Runs `real_routes`.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    require_root(CASE)?;
    let which = wanted()?;
    script(&["down"])?;
    let res = async {
        script(&["up", "1"])?;
        script(&["load"])?;
        script(&["gateway-crds"])?;
        on_cluster(ctx, &which).await
    }
    .await;
    let down = script(&["down"]);
    let rows = res?;
    down?;
    Ok(rows)
}
