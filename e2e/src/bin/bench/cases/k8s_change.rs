//! `change_under_load`: an HTTPRoute retargeted [`RETARGETS`] times between two Services under
//! steady load, on a route fleet (the local control plane with a real `haptic-controller run
//! --kubernetes`, or the real cluster of `real_routes`) at the product's default settle windows.
//! Service `web`'s upstream answers [`WEB_BODY`], Service [`ALT`]'s answers [`ALT_BODY`], so every
//! response says which side served it. [`CLIENTS`] clients send requests for the route's host
//! to the pods in turn (each a new connection, bounded by [`MAX_REQUESTS`] and [`MAX_LOAD`]) and
//! count every response by status and body; each retarget is timed until every pod answers from
//! the new side. The floor is the apiserver's own: each patch's round trip.
//!
//! Every response must be a 200 from one of the two sides, and no pod may reload (worker pids).
//! It must never send traffic anywhere but the fleet's pods nor leave a process behind.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use haptic_e2e::net::http_request;

use super::k8s_endpoints::apply;
use super::k8s_gateway::{route, BASE_HOST};
use super::route_fleet::{settled_workers, LocalRouteFleet, RouteFleet, Settle, ALT, ALT_BODY, WEB_BODY};
use super::Ctx;
use crate::error::{BenchError, Result};
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

/// Runs `change_under_load` on the local control plane.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let mut fleet = LocalRouteFleet::start(ctx, Settle::Product).await?;
    run_on(ctx, &mut fleet).await
}

/// Runs `change_under_load` on `fleet`: route `base` retargeted between Service `web` (answering
/// [`WEB_BODY`]) and Service [`ALT`] (answering [`ALT_BODY`]).
pub(super) async fn run_on(ctx: &Ctx, fleet: &mut impl RouteFleet) -> Result<Vec<Row>> {
    let n = if ctx.quick { 6 } else { RETARGETS };
    fleet.start_alt().await?;
    let (client, ips, bind) = (fleet.client(), fleet.ips(), fleet.bind());
    wait_body(ips, bind, WEB_BODY).await?;
    let start_pids = settled_workers(&*fleet).await?;

    let load = Load::start(ips, bind);
    let (mut took, mut patches) = (Samples::new(), Samples::new());
    for r in 0..n {
        let (to, body) = if r % 2 == 0 { (ALT, ALT_BODY) } else { ("web", WEB_BODY) };
        let t = Instant::now();
        apply(client, route("base", BASE_HOST, "/", to)).await?;
        patches.push_ms(t.elapsed());
        took.push_ms(wait_body(ips, bind, body).await? - t);
    }
    let counts = load.finish().await;
    let pids = settled_workers(&*fleet).await?;

    let total: u64 = counts.values().sum();
    let served = |b: &str| counts.get(&(200, b.to_string())).copied().unwrap_or(0);
    let mut wrong: Vec<String> = counts
        .iter()
        .filter(|((code, body), _)| !(*code == 200 && (body == WEB_BODY || body == ALT_BODY)))
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
        "route base retargeted {n} times between Service web and Service {ALT} under {CLIENTS} clients sending to {} pods in \
         turn (each request a new connection); {}; {total} responses: {} from web, {} from {ALT}, {} other; floor: the \
         patch's round trip",
        ips.len(),
        fleet.describe(),
        served(WEB_BODY),
        served(ALT_BODY),
        total - served(WEB_BODY) - served(ALT_BODY)
    ));
    Ok(vec![r.verified(&wrong)])
}
