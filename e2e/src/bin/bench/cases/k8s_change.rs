//! `change_under_load`: an HTTPRoute retargeted [`RETARGETS`] times between two Services under
//! steady load, on the local control plane in the setup of `gateway_route` (etcd +
//! kube-apiserver on loopback with the Gateway API CRDs, HAProxy pods run by the kubelet
//! stand-in) with a real `haptic-controller run --kubernetes` at the product's default settle
//! windows. Service `web`'s upstream answers `web`, Service `scale`'s two answer `scale`, so every
//! response says which side served it. [`CLIENTS`] clients send requests for the route's host
//! to the pods in turn (each a new connection, bounded by [`MAX_REQUESTS`] and [`MAX_LOAD`]) and
//! count every response by status and body; each retarget is timed until every pod answers from
//! the new side. The floor is the apiserver's own: each patch's round trip.
//!
//! Every response must be a 200 from one of the two sides, and no pod may reload (worker pids).
//! It must never send traffic anywhere but 127.0.0.0/8 nor leave a process behind.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haptic_e2e::k8s::install_gateway_crds;
use haptic_e2e::net::http_request;

use super::k8s::{local_fleet, NS};
use super::k8s_endpoints::apply;
use super::k8s_gateway::{bind_port, objects, route, scale_addr, workers, BASE_HOST};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::fleet_kit::{Controller, Upstream};
use crate::report::Row;
use crate::stats::Samples;

const CASE: &str = "change_under_load";
/// Retargets of route `base` (6 with `--quick`).
const RETARGETS: usize = 20;
/// Clients sending at once.
const CLIENTS: usize = 4;
/// The load's bounds: requests in all, and how long it may run.
const MAX_REQUESTS: u64 = 200_000;
const MAX_LOAD: Duration = Duration::from_secs(300);
/// How long one retarget may take to reach every pod.
const DEADLINE: Duration = Duration::from_secs(60);

/// `GET /` for [`BASE_HOST`] on `ip:port`: the status (0 when nothing answered) and the body.
async fn get(ip: Ipv4Addr, port: u16) -> (u16, String) {
    let req = format!("GET / HTTP/1.1\r\nHost: {BASE_HOST}\r\nConnection: close\r\n\r\n");
    http_request(SocketAddr::from((ip, port)), &req).await.unwrap_or((0, String::new()))
}

/// Waits until every pod in `ips` answers with `body`; returns when the last one did.
async fn wait_body(ips: &[Ipv4Addr], port: u16, body: &str) -> Result<Instant> {
    let deadline = Instant::now() + DEADLINE;
    let mut left = ips.to_vec();
    loop {
        let mut still = Vec::new();
        for ip in left {
            if get(ip, port).await != (200, body.to_string()) {
                still.push(ip);
            }
        }
        left = still;
        if left.is_empty() {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(format!("{BASE_HOST} never answered {body:?} on {left:?}")));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The steady load: every response counted by status and body, until stopped or a bound is met.
struct Load {
    stop: Arc<AtomicBool>,
    counts: Arc<Mutex<BTreeMap<(u16, String), u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    fn start(ips: &[Ipv4Addr], port: u16) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let counts = Arc::new(Mutex::new(BTreeMap::new()));
        let sent = Arc::new(AtomicU64::new(0));
        let until = Instant::now() + MAX_LOAD;
        let tasks = (0..CLIENTS)
            .map(|c| {
                let (stop, counts, sent, ips) = (stop.clone(), counts.clone(), sent.clone(), ips.to_vec());
                tokio::spawn(async move {
                    let mut i = c;
                    while !stop.load(Ordering::Relaxed)
                        && sent.fetch_add(1, Ordering::Relaxed) < MAX_REQUESTS
                        && Instant::now() < until
                    {
                        let answer = get(ips[i % ips.len()], port).await;
                        *counts.lock().unwrap_or_else(|p| p.into_inner()).entry(answer).or_insert(0) += 1;
                        i += 1;
                    }
                })
            })
            .collect();
        Load { stop, counts, tasks }
    }

    /// Stops the clients and returns the counts.
    async fn finish(mut self) -> BTreeMap<(u16, String), u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        std::mem::take(&mut *self.counts.lock().unwrap_or_else(|p| p.into_inner()))
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// Runs `change_under_load`.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let n = if ctx.quick { 6 } else { RETARGETS };
    let (cp, client, pods) = local_fleet(ctx).await?;
    install_gateway_crds(&client).await.map_err(|e| BenchError::Kubernetes(e.to_string()))?;
    let ips: Vec<Ipv4Addr> = pods.names().iter().filter_map(|p| pods.ip(p)).collect();
    let web = Upstream::start_answering(SocketAddr::from(([127, 0, 0, 2], 0)), "web").await?;
    let first = Upstream::start_answering(SocketAddr::from((scale_addr(0), 0)), "scale").await?;
    let second = Upstream::start_answering(SocketAddr::from((scale_addr(1), first.port)), "scale").await?;
    objects(&client, pods.agent_port(), SocketAddr::from(([127, 0, 0, 2], web.port)), first.port).await?;
    let tmp = tempfile::Builder::new().prefix("haptic-bench-change-").tempdir().map_err(BenchError::io("tempdir"))?;
    let ctl = Controller::start_kubernetes_with_default_settle(&ctx.bin, tmp.path(), cp.kubeconfig(), NS)?;
    let bind = bind_port(&client, NS).await?;
    wait_body(&ips, bind, "web").await?;
    let start_pids = workers(&pods).await?;

    let load = Load::start(&ips, bind);
    let (mut took, mut patches) = (Samples::new(), Samples::new());
    for r in 0..n {
        let to = if r % 2 == 0 { "scale" } else { "web" };
        let t = Instant::now();
        apply(&client, route("base", BASE_HOST, "/", to)).await?;
        patches.push_ms(t.elapsed());
        took.push_ms(wait_body(&ips, bind, to).await? - t);
    }
    let counts = load.finish().await;
    let pids = workers(&pods).await?;
    drop(ctl);
    drop((web, first, second, pods, cp));

    let total: u64 = counts.values().sum();
    let served = |b: &str| counts.get(&(200, b.to_string())).copied().unwrap_or(0);
    let mut wrong: Vec<String> = counts
        .iter()
        .filter(|((code, body), _)| !(*code == 200 && (body == "web" || body == "scale")))
        .map(|((code, body), k)| format!("{k} responses {code} {body:?}"))
        .collect();
    if pids != start_pids {
        wrong.push(format!("worker pids {start_pids:?} -> {pids:?} (a reload)"));
    }
    let mut r =
        Row::repeated(CASE, "retarget -> every pod answering the new side", &ctx.label, &took, Some(&patches), "ms");
    r.goal = Some("100 % 2xx, 0 reloads".into());
    r.meets_goal = Some(wrong.is_empty());
    r.add_note(format!(
        "route base retargeted {n} times between Service web and Service scale under {CLIENTS} clients sending to {} pods in turn \
         (each request a new connection); the controller's default settle windows; {total} responses: {} from web, {} from scale, \
         {} other; floor: the patch's round trip",
        ips.len(),
        served("web"),
        served("scale"),
        total - served("web") - served("scale")
    ));
    Ok(vec![r.verified(&wrong)])
}
