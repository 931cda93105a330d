//! The fleet the route-scale cases (`attach_routes`, `propagate_routes`, `change_under_load`,
//! `sweep`, `churn_routes`) run on, as one trait: the local control plane with HAProxy pods run
//! by the kubelet stand-in and the bench's own controller process ([`LocalRouteFleet`]), or the
//! real cluster of `scripts/cluster.sh` with the chart installed by helm (`real_routes`). Either
//! holds the Gateway [`GATEWAY`] in [`NS`] with its HTTP listener, Services `web` and `scale`
//! (each an upstream answering `ok`) and the routes `base` and `scale`; on request a second
//! upstream behind Service `alt`.
//!
//! Owns what a case asks of a fleet: the apiserver, the pods' addresses and bind port, worker
//! pids, the deploying controller's process and HAProxy's memory, and the objects that make a
//! new Service reach the upstream, and the second upstream. It must never send traffic, nor
//! start or stop anything a case owns.

use kube::Client;
use serde_json::Value;
use std::net::{Ipv4Addr, SocketAddr};

use super::k8s::{haproxy_mib, NS};
use super::k8s_endpoints::apply;
use super::k8s_gateway::{
    bind_port, gateway_fleet, service_in, slice_in, wait_answering, workers, GatewayFleet, BASE_HOST,
};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::fleet_kit::{Controller, Upstream, SETTLE};

/// The routes every fleet starts with (`base`, `scale`).
pub(super) const SETUP_ROUTES: u64 = 2;
/// What the upstream of Services `web` and `scale` answers.
pub(super) const WEB_BODY: &str = "ok";
/// The Service of [`NS`] that [`RouteFleet::start_alt`] makes.
pub(super) const ALT: &str = "alt";
/// What the upstream of Service [`ALT`] answers.
pub(super) const ALT_BODY: &str = "alt";
/// Where the local fleet's [`ALT`] upstream listens (the template writes 192.0.2.k as 127.0.0.k).
const ALT_ADDR: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 250);

/// What a route-scale case asks of the fleet it runs on.
pub(super) trait RouteFleet {
    /// The apiserver.
    fn client(&self) -> &Client;
    /// The HAProxy pods' addresses, reachable from this machine.
    fn ips(&self) -> &[Ipv4Addr];
    /// The port every pod binds for the Gateway's listener.
    fn bind(&self) -> u16;
    /// The namespace of the HAProxyConfig (and of the Gateway's Service).
    fn fleet_ns(&self) -> &str;
    /// The fleet as a note says it: pods, where they run, the controller's settle windows.
    fn describe(&self) -> String;
    /// The deploying controller's pid on this machine.
    async fn controller_pid(&self) -> Result<u32>;
    /// Each pod's HAProxy worker pid, in pod order (`None` while a pod cannot tell).
    async fn workers(&self) -> Result<Vec<Option<u32>>>;
    /// Each pod's HAProxy resident memory (master and workers), MiB, in pod order.
    async fn haproxy_mib(&self) -> Result<Vec<f64>>;
    /// The objects that make headless Service `svc` of `ns` (port 80) reach the upstream.
    fn backend(&self, ns: &str, svc: &str) -> Vec<Value>;
    /// Starts a second upstream answering [`ALT_BODY`] and makes Service [`ALT`] of [`NS`] reach
    /// it; it serves until the fleet is dropped.
    async fn start_alt(&mut self) -> Result<()>;
}

/// The product's settle windows, or the bench's short one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Settle {
    /// `--settle 300ms --endpoint-settle 50ms`, what a user gets.
    Product,
    /// [`SETTLE`].
    Bench,
}

/// The local control plane's fleet (the setup of `gateway_route`) with a real
/// `haptic-controller run --kubernetes`. Fields drop in order: the controller, then the fleet.
pub(super) struct LocalRouteFleet {
    ctl: Controller,
    fleet: GatewayFleet,
    bind: u16,
    settle: Settle,
    alt: Option<Upstream>,
    _dir: tempfile::TempDir,
}

impl LocalRouteFleet {
    /// Starts the fleet and the controller, and waits until every pod answers route `base`.
    pub(super) async fn start(ctx: &Ctx, settle: Settle) -> Result<Self> {
        let fleet = gateway_fleet(ctx).await?;
        let dir =
            tempfile::Builder::new().prefix("haptic-bench-routes-").tempdir().map_err(BenchError::io("tempdir"))?;
        let kubeconfig = fleet.cp.kubeconfig();
        let ctl = match settle {
            Settle::Product => Controller::start_kubernetes_with_default_settle(&ctx.bin, dir.path(), kubeconfig, NS)?,
            Settle::Bench => Controller::start_kubernetes(&ctx.bin, dir.path(), kubeconfig, NS, "edge")?,
        };
        let bind = bind_port(&fleet.client, NS).await?;
        wait_answering(&fleet.ips, bind, BASE_HOST, "/").await?;
        Ok(Self { ctl, fleet, bind, settle, alt: None, _dir: dir })
    }
}

impl RouteFleet for LocalRouteFleet {
    fn client(&self) -> &Client {
        &self.fleet.client
    }

    fn ips(&self) -> &[Ipv4Addr] {
        &self.fleet.ips
    }

    fn bind(&self) -> u16 {
        self.bind
    }

    fn fleet_ns(&self) -> &str {
        NS
    }

    fn describe(&self) -> String {
        let settle = match self.settle {
            Settle::Product => {
                "the controller's default settle windows (--settle 300ms, --endpoint-settle 50ms)".into()
            }
            Settle::Bench => format!("controller --settle {SETTLE}"),
        };
        format!(
            "{} HAProxy pods run by the kubelet stand-in on the local control plane (etcd + kube-apiserver on loopback), {settle}",
            self.fleet.ips.len()
        )
    }

    async fn controller_pid(&self) -> Result<u32> {
        Ok(self.ctl.pid())
    }

    async fn workers(&self) -> Result<Vec<Option<u32>>> {
        workers(&self.fleet.pods).await
    }

    async fn haproxy_mib(&self) -> Result<Vec<f64>> {
        haproxy_mib(&self.fleet.pods).await
    }

    fn backend(&self, ns: &str, svc: &str) -> Vec<Value> {
        vec![service_in(ns, svc), slice_in(ns, svc, &[Ipv4Addr::new(127, 0, 0, 2)], self.fleet.web.port)]
    }

    async fn start_alt(&mut self) -> Result<()> {
        let up = Upstream::start_answering(SocketAddr::from((ALT_ADDR, 0)), ALT_BODY).await?;
        for obj in [service_in(NS, ALT), slice_in(NS, ALT, &[ALT_ADDR], up.port)] {
            apply(&self.fleet.client, obj).await?;
        }
        self.alt = Some(up);
        Ok(())
    }
}

/// The pods' worker pids, asked again while a pod cannot tell (2.6 and 3.0 re-execute the
/// master on a reload), at most 10 s.
pub(super) async fn settled_workers(f: &impl RouteFleet) -> Result<Vec<Option<u32>>> {
    let mut got = f.workers().await;
    for _ in 0..50 {
        if got.as_ref().is_ok_and(|w| w.iter().all(Option::is_some)) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        got = f.workers().await;
    }
    got
}
