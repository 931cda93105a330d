//! `churn_routes`: [`NAMESPACES`] namespaces × [`ROUTES_PER_NS`] HTTPRoutes, each with its own
//! Service (reaching the fleet's upstream), then [`CHURN`] of churn at [`OPS_PER_S`]
//! changes a second, on the local control plane in the setup of `gateway_route` (etcd +
//! kube-apiserver on loopback with the Gateway API CRDs, HAProxy pods run by the kubelet
//! stand-in, the Gateway's listener taking routes from every namespace) with a real
//! `haptic-controller run --kubernetes` at the product's default settle windows. The churn
//! cycles three changes: a route's path moved between `/a` and `/b`, a route deleted, the route
//! deleted before created again, so the count stays within one of the full size. The controller's
//! resident memory and CPU and each pod's HAProxy (master + worker) memory are read every
//! second of the churn; the controller's memory also before the routes, at the full size, after
//! the churn and after every route and Service is deleted again.
//!
//! Every route must answer through every pod at the full size and after the churn, and a deleted
//! one must answer 404. It runs on any route fleet (`route_fleet`: the local control plane, or the real
//! cluster through `real_routes`), and must never send traffic anywhere but the fleet's HAProxy
//! pods nor leave a process behind.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use futures::StreamExt;
use haptic_e2e::net::http_request;
use haptic_render::gateway_api::{Gateway, HttpRoute};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

use super::k8s::{kerr, rounded, NS};
use super::k8s_endpoints::apply;
use super::k8s_gateway::{wait_status, GATEWAY};
use super::route_fleet::{settled_workers, LocalRouteFleet, RouteFleet, Settle};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::proc_mem::{cpu_seconds, mib, rss, rss_parts_note};
use crate::report::Row;

const CASE: &str = "churn_routes";
/// Namespaces, and routes (each with its Service) in each.
const NAMESPACES: usize = 50;
const ROUTES_PER_NS: usize = 100;
/// The churn's length (30 s with `--quick`; `HAPTIC_BENCH_CHURN_SECS` sets it).
const CHURN: Duration = Duration::from_secs(15 * 60);
/// Changes a second during the churn.
const OPS_PER_S: u32 = 5;
/// Creates or deletes in flight at once.
const PARALLEL: usize = 8;
/// Server slots per backend: every Service has one endpoint.
const SLOTS: u32 = 2;
/// How long the controller is left alone before a memory reading "at rest".
const REST: Duration = Duration::from_secs(15);
/// How long a change may take to reach every pod.
const DEADLINE: Duration = Duration::from_secs(300);

/// The size of a run: namespaces × routes per namespace.
#[derive(Debug, Clone, Copy)]
struct Shape {
    namespaces: usize,
    per_ns: usize,
}

impl Shape {
    fn total(self) -> usize {
        self.namespaces * self.per_ns
    }

    /// Route `i`'s namespace and index in it.
    fn at(self, i: usize) -> (String, usize) {
        (format!("churn{}", i / self.per_ns), i % self.per_ns)
    }
}

fn host(ns: &str, j: usize) -> String {
    format!("r{j}.{ns}.churn.bench")
}

/// HTTPRoute `r<j>` in `ns`: its host, prefix `path` → Service `s<j>`, on the Gateway in [`NS`].
fn route(ns: &str, j: usize, path: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
           "metadata": {"name": format!("r{j}"), "namespace": ns},
           "spec": {"parentRefs": [{"name": GATEWAY, "namespace": NS}], "hostnames": [host(ns, j)],
                    "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],
                               "backendRefs": [{"name": format!("s{j}"), "port": 80}]}]}})
}

/// `GET path` for route `j` of `ns` on `ip:port`: the status (0 when nothing answered).
async fn status(ip: Ipv4Addr, port: u16, ns: &str, j: usize, path: &str) -> u16 {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", host(ns, j));
    http_request(SocketAddr::from((ip, port)), &req).await.map_or(0, |a| a.0)
}

/// Runs `apply` for every object `make(i)` of `0..n`, [`PARALLEL`] at a time.
async fn apply_all(client: &Client, n: usize, make: impl Fn(usize) -> Value) -> Result<()> {
    let done: Vec<Result<String>> =
        futures::stream::iter((0..n).map(make)).map(|o| apply(client, o)).buffer_unordered(PARALLEL).collect().await;
    done.into_iter().collect::<Result<Vec<_>>>().map(drop)
}

/// The Gateway's listener takes routes from every namespace; every backend gets [`SLOTS`] slots.
async fn open_gateway(client: &Client, fleet_ns: &str) -> Result<()> {
    let gateways: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ApiResource::erase::<Gateway>(&()));
    let listeners = json!({"spec": {"listeners": [{"name": "http", "port": 80, "protocol": "HTTP",
                                                     "allowedRoutes": {"namespaces": {"from": "All"}}}]}});
    gateways.patch(GATEWAY, &PatchParams::default(), &Patch::Merge(&listeners)).await.map_err(kerr("patch Gateway"))?;
    let ar = ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk("haptic.dev", "v1alpha1", "HAProxyConfig"));
    let configs: Api<DynamicObject> = Api::namespaced_with(client.clone(), fleet_ns, &ar);
    let slots = json!({"spec": {"render": {"serverSlots": SLOTS}}});
    configs.patch("edge", &PatchParams::default(), &Patch::Merge(&slots)).await.map_err(kerr("patch HAProxyConfig"))?;
    Ok(())
}

/// The run's size and churn length.
fn shape(ctx: &Ctx) -> Result<(Shape, Duration)> {
    let churn = match std::env::var("HAPTIC_BENCH_CHURN_SECS") {
        Ok(v) => Duration::from_secs(
            v.parse().map_err(|_| BenchError::Unexpected(format!("HAPTIC_BENCH_CHURN_SECS={v:?}")))?,
        ),
        Err(_) if ctx.quick => Duration::from_secs(30),
        Err(_) => CHURN,
    };
    let shape = if ctx.quick {
        Shape { namespaces: 5, per_ns: 20 }
    } else {
        Shape { namespaces: NAMESPACES, per_ns: ROUTES_PER_NS }
    };
    Ok((shape, churn))
}

/// Every namespace, and every route with its Service and the objects that make the Service
/// reach the fleet's upstream; returns how long the creates took.
async fn create(fleet: &impl RouteFleet, s: Shape) -> Result<Duration> {
    let client = fleet.client();
    let t = Instant::now();
    apply_all(
        client,
        s.namespaces,
        |k| json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("churn{k}")}}),
    )
    .await?;
    let backends: Vec<Value> = (0..s.total())
        .flat_map(|i| {
            let (ns, j) = s.at(i);
            fleet.backend(&ns, &format!("s{j}"))
        })
        .collect();
    apply_all(client, backends.len(), |k| backends[k].clone()).await?;
    apply_all(client, s.total(), |i| {
        let (ns, j) = s.at(i);
        route(&ns, j, "/a")
    })
    .await?;
    Ok(t.elapsed())
}

/// Asks every route on every pod at its path; each answer but 200 goes into `wrong`.
async fn check_all(ips: &[Ipv4Addr], port: u16, s: Shape, moved: &[bool], wrong: &mut Vec<String>) {
    for (i, m) in moved.iter().enumerate() {
        let (ns, j) = s.at(i);
        let path = if *m { "/b" } else { "/a" };
        for ip in ips {
            let got = status(*ip, port, &ns, j, path).await;
            if got != 200 {
                wrong.push(format!("route {ns}/r{j} {path} on {ip}: {got}"));
            }
        }
    }
}

/// Waits until every pod answers route `i` at `path` with `want`.
async fn wait_route(ips: &[Ipv4Addr], port: u16, s: Shape, i: usize, path: &str, want: u16) -> Result<()> {
    let (ns, j) = s.at(i);
    wait_status(ips, port, &host(&ns, j), path, want, DEADLINE).await.map(drop)
}

/// One reading during the churn.
#[derive(Debug, Clone)]
struct Sample {
    controller_mib: f64,
    controller_cpu_s: f64,
    haproxy_mib: Vec<f64>,
}

/// The churn: for `length`, [`OPS_PER_S`] changes a second cycling update, delete, create again
/// (route `i` picked by a prime stride over every route), a [`Sample`] every second. Returns the
/// samples and the last route changed.
async fn churn(
    fleet: &impl RouteFleet,
    ctl: u32,
    s: Shape,
    moved: &mut [bool],
    length: Duration,
) -> Result<(Vec<Sample>, usize)> {
    let every = Duration::from_secs(1) / OPS_PER_S;
    let (start, mut next, mut samples, mut last) = (Instant::now(), Instant::now(), Vec::new(), 0);
    let (mut op, client) = (0usize, fleet.client());
    while start.elapsed() < length {
        let i = (op / 3 * 7919) % s.total();
        let (ns, j) = s.at(i);
        match op % 3 {
            0 => {
                moved[i] = !moved[i];
                apply(client, route(&ns, j, if moved[i] { "/b" } else { "/a" })).await?;
            }
            1 => {
                let api: Api<DynamicObject> =
                    Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<HttpRoute>(&()));
                api.delete(&format!("r{j}"), &DeleteParams::default()).await.map_err(kerr("delete HTTPRoute"))?;
            }
            _ => {
                apply(client, route(&ns, j, if moved[i] { "/b" } else { "/a" })).await?;
            }
        }
        last = i;
        op += 1;
        if op.is_multiple_of(OPS_PER_S as usize) {
            samples.push(Sample {
                controller_mib: rss(ctl).map_or(f64::NAN, mib),
                controller_cpu_s: cpu_seconds(ctl).unwrap_or(f64::NAN),
                haproxy_mib: fleet.haproxy_mib().await?,
            });
        }
        next += every;
        tokio::time::sleep_until(next.into()).await;
    }
    Ok((samples, last))
}

/// Deletes every route, Service and EndpointSlice, one collection call per namespace and kind.
async fn delete_all(client: &Client, s: Shape) -> Result<()> {
    for k in 0..s.namespaces {
        let ns = format!("churn{k}");
        let (dp, lp) = (DeleteParams::default(), ListParams::default());
        let routes: Api<DynamicObject> =
            Api::namespaced_with(client.clone(), &ns, &ApiResource::erase::<HttpRoute>(&()));
        routes.delete_collection(&dp, &lp).await.map_err(kerr("delete HTTPRoutes"))?;
        // A Service cannot be deleted by collection; the slices can.
        let services: Api<Service> = Api::namespaced(client.clone(), &ns);
        for j in 0..s.per_ns {
            services.delete(&format!("s{j}"), &dp).await.map_err(kerr("delete Service"))?;
        }
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), &ns);
        slices.delete_collection(&dp, &lp).await.map_err(kerr("delete EndpointSlices"))?;
    }
    Ok(())
}

/// The mean of `v` (NaN when empty).
fn mean(v: impl Iterator<Item = f64>) -> f64 {
    let (sum, n) = v.fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

/// The largest of `v` (0 when empty).
fn max(v: impl Iterator<Item = f64>) -> f64 {
    v.fold(0.0, f64::max)
}

/// Runs `churn_routes` on the local control plane.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let fleet = LocalRouteFleet::start(ctx, Settle::Product).await?;
    run_on(ctx, &fleet).await
}

/// Runs `churn_routes` on `fleet`.
pub(super) async fn run_on(ctx: &Ctx, fleet: &impl RouteFleet) -> Result<Vec<Row>> {
    let (s, length) = shape(ctx)?;
    let (client, ips, bind) = (fleet.client(), fleet.ips(), fleet.bind());
    open_gateway(client, fleet.fleet_ns()).await?;
    let ctl = fleet.controller_pid().await?;
    tokio::time::sleep(REST).await;
    let rss_mib = || rss(ctl).map_or(f64::NAN, mib);
    let (start_mib, start_hap) = (rss_mib(), fleet.haproxy_mib().await?);
    let start_parts = rss_parts_note(ctl);

    let creates = create(fleet, s).await?;
    let t = Instant::now();
    wait_route(ips, bind, s, s.total() - 1, "/a", 200).await?;
    let mut moved = vec![false; s.total()];
    let mut wrong = Vec::new();
    check_all(ips, bind, s, &moved, &mut wrong).await;
    let serving = t.elapsed();
    let (full_mib, full_hap) = (rss_mib(), fleet.haproxy_mib().await?);
    let full_pids = settled_workers(fleet).await?;

    let (samples, last) = churn(fleet, ctl, s, &mut moved, length).await?;
    wait_route(ips, bind, s, last, if moved[last] { "/b" } else { "/a" }, 200).await?;
    check_all(ips, bind, s, &moved, &mut wrong).await;
    tokio::time::sleep(REST).await;
    let after_churn = rss_mib();
    let pids = settled_workers(fleet).await?;
    let reloads = pids.iter().zip(&full_pids).filter(|(a, b)| a != b).count();

    delete_all(client, s).await?;
    for k in 0..s.namespaces {
        wait_route(ips, bind, s, k * s.per_ns, if moved[k * s.per_ns] { "/b" } else { "/a" }, 404).await?;
    }
    tokio::time::sleep(REST).await;
    let (deleted_mib, deleted_hap) = (rss_mib(), fleet.haproxy_mib().await?);
    let deleted_parts = rss_parts_note(ctl);

    let minute = samples.len().min(60);
    let first = mean(samples.iter().take(minute).map(|x| x.controller_mib));
    let last_min = mean(samples.iter().rev().take(minute).map(|x| x.controller_mib));
    let peak = max(samples.iter().map(|x| x.controller_mib).chain([full_mib]));
    let cpu = match (samples.first(), samples.last()) {
        (Some(a), Some(b)) if samples.len() > 1 => {
            (b.controller_cpu_s - a.controller_cpu_s) / (samples.len() - 1) as f64 * 100.0
        }
        _ => f64::NAN,
    };
    let hap_peak = max(samples.iter().flat_map(|x| x.haproxy_mib.iter().copied()).chain(full_hap.iter().copied()));
    let note = format!(
        "{} namespaces x {} HTTPRoutes, each with its own Service = {} routes and backends; {}; \
         {SLOTS} server slots per backend; creates took {:.0} s, every route answering on every pod {:.1} s after the last; \
         churn {} s at {OPS_PER_S} changes/s (update, delete, create again), {reloads} pod(s) reloaded during it; controller RSS {start_mib:.1} MiB before the routes, \
         {full_mib:.1} at the full size, {after_churn:.1} at rest after the churn, {deleted_mib:.1} at rest after every route and \
         Service was deleted (before: {start_parts}; after deletion: {deleted_parts}); controller CPU {cpu:.0} % of one core during the churn; HAProxy RSS per pod (MiB) before {:?}, \
         at the full size {:?}, after deletion {:?}",
        s.namespaces,
        s.per_ns,
        s.total(),
        fleet.describe(),
        creates.as_secs_f64(),
        serving.as_secs_f64(),
        length.as_secs(),
        rounded(&start_hap),
        rounded(&full_hap),
        rounded(&deleted_hap),
    );
    let row = |metric: &str, v: f64, floor: Option<f64>| {
        let mut r = Row::single(CASE, metric, &ctx.label, v, floor, "MiB");
        r.add_note(&note);
        r.verified(&wrong)
    };
    Ok(vec![
        row("controller RSS, largest reading at the full size and over the churn", peak, None).goal_max(300.0),
        row("controller RSS, last minute of churn (floor: its first minute)", last_min, Some(first)).goal_ratio(1.1),
        row("controller RSS after every route deleted (floor: before the routes)", deleted_mib, Some(start_mib))
            .goal_ratio(1.1),
        row("HAProxy RSS, largest pod at the full size and over the churn", hap_peak, None),
    ])
}
