//! `attach_routes`: many HTTPRoutes at once on the local control plane, in the setup of
//! `gateway_route` (etcd + kube-apiserver on loopback with the Gateway API CRDs, a real
//! `haptic-controller run --kubernetes`, HAProxy pods run by the kubelet stand-in). [`ROUTES`]
//! HTTPRoutes (each its own hostname, to Service `web`) are created as fast as the apiserver
//! takes them ([`PARALLEL`] at a time), then timed from the last create until every one's status
//! says Accepted and ResolvedRefs from haptic for its generation and the Gateway's listener
//! counts them all in `attachedRoutes`, and until the last one answers 200 through every pod.
//! The floor is the apiserver's own: how long the creates took. The bench's watch counts the
//! status writes (each MODIFIED event of a created route).
//!
//! Every route must attach and the last must answer; reloads are counted by the pods' worker
//! pids. It runs on any route fleet (`route_fleet`: the local control plane, or the real
//! cluster through `real_routes`), and must never send traffic anywhere but the fleet's HAProxy
//! pods nor leave a process behind.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use haptic_render::gateway::GATEWAY_CONTROLLER;
use haptic_render::gateway_api::{Gateway, HttpRoute};
use kube::api::{Api, ApiResource, DynamicObject, ListParams, WatchEvent, WatchParams};
use serde_json::Value;

use super::k8s::{kerr, NS};
use super::k8s_endpoints::apply;
use super::k8s_gateway::{route, wait_answering};
use super::route_fleet::{settled_workers, LocalRouteFleet, RouteFleet, Settle, SETUP_ROUTES};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::report::Row;

const CASE: &str = "attach_routes";
/// HTTPRoutes created at once (a fifth with `--quick`).
const ROUTES: usize = 1000;
/// Creates in flight at once.
const PARALLEL: usize = 8;
/// How long the routes may take to attach.
const DEADLINE: Duration = Duration::from_secs(300);

fn name(i: usize) -> String {
    format!("a{i}")
}

fn host(i: usize) -> String {
    format!("a{i}.attach.bench")
}

/// Whether HTTPRoute `r` has haptic's Accepted and ResolvedRefs True for its generation.
fn attached(r: &DynamicObject) -> bool {
    let g = r.metadata.generation;
    let Some(parents) = r.data["status"]["parents"].as_array() else { return false };
    parents.iter().filter(|p| p["controllerName"] == GATEWAY_CONTROLLER).any(|p| {
        ["Accepted", "ResolvedRefs"].iter().all(|t| {
            p["conditions"].as_array().is_some_and(|cs| {
                cs.iter().any(|c| c["type"] == *t && c["status"] == "True" && c["observedGeneration"].as_i64() == g)
            })
        })
    })
}

/// Counts the MODIFIED events of the created routes (their status writes) until dropped.
struct StatusWrites {
    count: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl StatusWrites {
    async fn start(api: &Api<DynamicObject>) -> Result<Self> {
        let from = api.list(&ListParams::default().limit(1)).await.map_err(kerr("list HTTPRoutes"))?;
        let rv = from.metadata.resource_version.unwrap_or_default();
        let stream = api.watch(&WatchParams::default().timeout(290), &rv).await.map_err(kerr("watch HTTPRoutes"))?;
        let count = Arc::new(AtomicUsize::new(0));
        let c = count.clone();
        let task = tokio::spawn(async move {
            let mut stream = stream.boxed();
            while let Ok(Some(ev)) = stream.try_next().await {
                if let WatchEvent::Modified(o) = ev {
                    if o.metadata.name.as_deref().is_some_and(|n| n.starts_with('a')) {
                        c.fetch_add(1, Ordering::Relaxed);
                    }
                }
            }
        });
        Ok(Self { count, task })
    }
}

impl Drop for StatusWrites {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Waits until all `n` created routes are attached and the Gateway's listener counts them;
/// returns when it saw that.
async fn wait_attached(routes: &Api<DynamicObject>, gateways: &Api<DynamicObject>, n: usize) -> Result<Instant> {
    let deadline = Instant::now() + DEADLINE;
    let mut last = (0, Value::Null);
    loop {
        let list = routes.list(&ListParams::default()).await.map_err(kerr("list HTTPRoutes"))?;
        let done = list
            .items
            .iter()
            .filter(|r| r.metadata.name.as_deref().is_some_and(|n| n.starts_with('a')))
            .filter(|r| attached(r))
            .count();
        if done == n {
            let g = gateways.get("gw").await.map_err(kerr("get Gateway gw"))?;
            let counted = g.data["status"]["listeners"][0]["attachedRoutes"].clone();
            if counted.as_u64() == Some(n as u64 + SETUP_ROUTES) {
                return Ok(Instant::now());
            }
            last = (done, counted);
        } else {
            last = (done, last.1);
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(format!(
                "{n} routes attached: {} were, the listener counted {}",
                last.0, last.1
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Runs `attach_routes` on the local control plane.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let fleet = LocalRouteFleet::start(ctx, Settle::Bench).await?;
    run_on(ctx, &fleet).await
}

/// Runs `attach_routes` on `fleet`.
pub(super) async fn run_on(ctx: &Ctx, fleet: &impl RouteFleet) -> Result<Vec<Row>> {
    let n = if ctx.quick { ROUTES / 5 } else { ROUTES };
    let (client, ips, bind) = (fleet.client(), fleet.ips(), fleet.bind());
    let start_pids = settled_workers(fleet).await?;
    let routes: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ApiResource::erase::<HttpRoute>(&()));
    let gateways: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ApiResource::erase::<Gateway>(&()));
    let writes = StatusWrites::start(&routes).await?;

    let t0 = Instant::now();
    let created: Vec<Result<String>> = futures::stream::iter(0..n)
        .map(|i| apply(client, route(&name(i), &host(i), "/", "web")))
        .buffer_unordered(PARALLEL)
        .collect()
        .await;
    let last_create = Instant::now();
    created.into_iter().collect::<Result<Vec<_>>>()?;
    let done = wait_attached(&routes, &gateways, n).await?;
    let answering = wait_answering(ips, bind, &host(n - 1), "/").await?;
    // The last status writes may land after the check saw them all.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let status_writes = writes.count.load(Ordering::Relaxed);
    drop(writes);
    let reloads = settled_workers(fleet).await?.iter().zip(&start_pids).filter(|(a, b)| a != b).count();

    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let creates = ms(last_create - t0);
    let note = format!(
        "{n} HTTPRoutes, {PARALLEL} creates in flight; {}; floor: the creates themselves \
         ({:.0} routes/s through the apiserver); {reloads} pod(s) reloaded",
        fleet.describe(),
        n as f64 / (creates / 1000.0)
    );
    let mut attach =
        Row::single(CASE, "attached_after_last_create", &ctx.label, ms(done - last_create), Some(creates), "ms");
    attach.goal = Some("<= 2000 ms after the last create (1 s the best published)".into());
    attach.meets_goal = Some(ms(done - last_create) <= 2000.0);
    attach.add_note(note.clone());
    let mut answer = Row::single(
        CASE,
        "last_answering_after_last_create",
        &ctx.label,
        ms(answering - last_create),
        Some(creates),
        "ms",
    );
    answer.add_note(note);
    let mut w = Row::single(CASE, "status_writes", &ctx.label, status_writes as f64, Some(n as f64), "writes");
    w.add_note("floor: one status write per route");
    Ok(vec![attach, answer, w])
}
