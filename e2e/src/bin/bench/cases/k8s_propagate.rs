//! `propagate_routes`: HTTPRoutes added one at a time on the local control plane, in the setup
//! of `gateway_route` (etcd + kube-apiserver on loopback with the Gateway API CRDs, HAProxy pods
//! run by the kubelet stand-in), with a real `haptic-controller run --kubernetes` at the
//! product's default settle windows (what a user gets, unlike the other cases' 2 ms). Each route
//! (its own hostname, to Service `web`) is first asked on every pod and must answer 404, then
//! created and timed until every pod answers it with the upstream's 200. Every
//! [`CHECK_EVERY`] routes, [`CHECK_SAMPLE`] routes made before are asked again on every pod (an
//! error on a route already serving is a wrong answer) and the pods' worker pids are compared
//! with the first (a changed pid is a reload). The floor is the apiserver's own: each create's
//! round trip. The controller's resident memory is read at the start and at the end.
//!
//! It runs on any route fleet (`route_fleet`: the local control plane, or the real
//! cluster through `real_routes`), and must never send traffic anywhere but the fleet's HAProxy
//! pods nor leave a process behind.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::Instant;

use haptic_e2e::net::http_request;

use super::k8s_endpoints::apply;
use super::k8s_gateway::{route, wait_answering};
use super::route_fleet::{settled_workers, LocalRouteFleet, RouteFleet, Settle};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::proc_mem::{mib, rss};
use crate::report::Row;
use crate::stats::Samples;

const CASE: &str = "propagate_routes";
/// Routes added one at a time (100 with `--quick`; `HAPTIC_BENCH_PROPAGATE_ROUTES` sets it).
const ROUTES: usize = 3000;
/// Every this many routes, earlier routes are asked again and the worker pids compared.
const CHECK_EVERY: usize = 50;
/// How many earlier routes each check asks (spread evenly over those made so far).
const CHECK_SAMPLE: usize = 10;

fn host(i: usize) -> String {
    format!("p{i}.propagate.bench")
}

/// `GET /` with `Host: host` on `ip:port`: the status (0 when nothing answered) and the body.
async fn get(ip: Ipv4Addr, port: u16, host: &str) -> (u16, String) {
    let req = format!("GET / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    http_request(SocketAddr::from((ip, port)), &req).await.unwrap_or((0, String::new()))
}

/// How many routes the run adds.
fn count(ctx: &Ctx) -> Result<usize> {
    match std::env::var("HAPTIC_BENCH_PROPAGATE_ROUTES") {
        Ok(v) => v.parse().map_err(|_| BenchError::Unexpected(format!("HAPTIC_BENCH_PROPAGATE_ROUTES={v:?}"))),
        Err(_) if ctx.quick => Ok(100),
        Err(_) => Ok(ROUTES),
    }
}

/// Asks [`CHECK_SAMPLE`] of the first `made` routes on every pod; each answer but the upstream's
/// 200 goes into `wrong`.
async fn check_earlier(ips: &[Ipv4Addr], port: u16, made: usize, wrong: &mut Vec<String>) {
    let step = (made / CHECK_SAMPLE).max(1);
    for i in (0..made).step_by(step).take(CHECK_SAMPLE) {
        for ip in ips {
            let a = get(*ip, port, &host(i)).await;
            if !(a.0 == 200 && a.1 == "ok") {
                wrong.push(format!("route {i} (serving since before route {made}): {ip} answered {a:?}"));
            }
        }
    }
}

/// Runs `propagate_routes` on the local control plane.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let fleet = LocalRouteFleet::start(ctx, Settle::Product).await?;
    run_on(ctx, &fleet).await
}

/// Runs `propagate_routes` on `fleet`.
pub(super) async fn run_on(ctx: &Ctx, fleet: &impl RouteFleet) -> Result<Vec<Row>> {
    let n = count(ctx)?;
    let (client, ips, bind) = (fleet.client(), fleet.ips(), fleet.bind());
    let ctl = fleet.controller_pid().await?;
    let start_pids = settled_workers(fleet).await?;
    let rss_start = rss(ctl);

    let (mut took, mut creates, mut wrong, mut reloads) = (Samples::new(), Samples::new(), Vec::new(), 0);
    let t_run = Instant::now();
    for i in 0..n {
        for ip in ips {
            let a = get(*ip, bind, &host(i)).await;
            if a.0 != 404 {
                wrong.push(format!("route {i} before its create: {ip} answered {a:?}, not 404"));
            }
        }
        let t = Instant::now();
        apply(client, route(&format!("p{i}"), &host(i), "/", "web")).await?;
        creates.push_ms(t.elapsed());
        took.push_ms(wait_answering(ips, bind, &host(i), "/").await? - t);
        if (i + 1) % CHECK_EVERY == 0 || i + 1 == n {
            check_earlier(ips, bind, i, &mut wrong).await;
            let pids = settled_workers(fleet).await?;
            if pids != start_pids {
                reloads += 1;
                wrong.push(format!("by route {i}: worker pids {start_pids:?} -> {pids:?} (a reload)"));
            }
        }
    }
    let run_s = t_run.elapsed().as_secs_f64();
    let rss_end = rss(ctl);

    let mem = |b: Option<u64>| b.map_or_else(|| "?".into(), |b| format!("{:.0} MiB", mib(b)));
    let mut r = Row::repeated(CASE, "new route -> 200 on every pod", &ctx.label, &took, Some(&creates), "ms");
    r.goal = Some("p50 <= 300 ms, p99 <= 1000 ms, 0 reloads, 0 errors on routes already serving".into());
    r.meets_goal =
        Some(took.p50().is_some_and(|v| v <= 300.0) && took.p99().is_some_and(|v| v <= 1000.0) && wrong.is_empty());
    r.add_note(format!(
        "{n} HTTPRoutes added one at a time (each its own hostname to Service web); {}; each route 404 on every pod \
         before its create; floor: the create's \
         round trip; worker pids checked every {CHECK_EVERY} routes ({reloads} checks saw a reload), {CHECK_SAMPLE} earlier \
         routes asked on every pod at each check; the run took {run_s:.0} s; controller RSS {} at the start, {} at the end",
        fleet.describe(),
        mem(rss_start),
        mem(rss_end)
    ));
    Ok(vec![r.verified(&wrong)])
}
