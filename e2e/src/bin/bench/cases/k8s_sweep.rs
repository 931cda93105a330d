//! `sweep`: HTTPRoutes swept 10 → 50 → 100 → 300 → 500 → 1,000 and back down to 10 (Envoy
//! Gateway's steps, its routes/5 routes on each of [`HOSTS`] hostnames, each route its own path
//! prefix) under steady load, on the local control plane in the setup of `gateway_route` (etcd +
//! kube-apiserver on loopback with the Gateway API CRDs, HAProxy pods run by the kubelet
//! stand-in) with a real `haptic-controller run --kubernetes` at the product's default settle
//! windows. Each step creates the routes it adds ([`PARALLEL`] at a time) or deletes the ones it
//! removes (newest first), waits until every pod answers the last one as it must (the upstream's
//! 200, or 404 once deleted), then times [`STEP_REQUESTS`] of the load's requests and reads the
//! controller's and each pod's HAProxy (master + worker) resident memory. [`CLIENTS`] clients
//! send the load throughout (each request a new connection, to the routes that exist for the
//! whole of the current change, the pods in turn; bounded by [`MAX_REQUESTS`] and [`MAX_LOAD`]).
//!
//! Every response must be the upstream's 200 and no pod may reload (worker pids). The steps go
//! to `--sweep-json` for `sweep-plot`. It runs on any route fleet (`route_fleet`: the local control plane, or the real
//! cluster through `real_routes`), and must never send traffic anywhere but the fleet's HAProxy
//! pods nor leave a process behind.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use haptic_e2e::net::http_request;
use haptic_e2e::sweep::{Direction, Step};
use haptic_render::gateway_api::HttpRoute;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject};
use kube::Client;

use super::k8s::{kerr, rounded, NS};
use super::k8s_endpoints::apply;
use super::k8s_gateway::{route, wait_answering, wait_status};
use super::route_fleet::{settled_workers, LocalRouteFleet, RouteFleet, Settle};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::proc_mem::{mib, rss};
use crate::report::Row;
use crate::stats::Samples;

const CASE: &str = "sweep";
/// The route counts, in order.
const STEPS: &[usize] = &[10, 50, 100, 300, 500, 1000, 500, 300, 100, 50, 10];
/// The route counts with `--quick`.
const QUICK_STEPS: &[usize] = &[10, 50, 100, 50, 10];
/// Hostnames the routes share (route `i` is on hostname `i % HOSTS`).
const HOSTS: usize = 5;
/// Creates or deletes in flight at once.
const PARALLEL: usize = 8;
/// Clients sending the load at once.
const CLIENTS: usize = 4;
/// Requests timed at each step.
const STEP_REQUESTS: usize = 10_000;
/// The load's bounds: requests in all, and how long it may run.
const MAX_REQUESTS: u64 = 1_000_000;
const MAX_LOAD: Duration = Duration::from_secs(900);
/// How long one step may take to reach every pod, or to time its requests.
const DEADLINE: Duration = Duration::from_secs(120);

fn name(i: usize) -> String {
    format!("s{i}")
}

fn host(i: usize) -> String {
    format!("h{}.sweep.bench", i % HOSTS)
}

fn path(i: usize) -> String {
    format!("/r{i}")
}

/// `GET /r<i>` with route `i`'s host on `ip:port`: the status (0 when nothing answered) and body.
async fn get(ip: Ipv4Addr, port: u16, i: usize) -> (u16, String) {
    let req = format!("GET {} HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n", path(i), host(i));
    http_request(SocketAddr::from((ip, port)), &req).await.unwrap_or((0, String::new()))
}

/// The steady load: requests to routes `0..present`, the pods in turn; every answer counted by
/// status and body, and timed into `timed[k]` while `timing` is `k + 1`.
struct Load {
    stop: Arc<AtomicBool>,
    present: Arc<AtomicUsize>,
    timing: Arc<AtomicUsize>,
    timed: Arc<Mutex<Vec<Samples>>>,
    counts: Arc<Mutex<BTreeMap<(u16, String), u64>>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Locks a mutex the load shares, even one a panicking client left poisoned.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Load {
    fn start(ips: &[Ipv4Addr], port: u16, present: usize, steps: usize) -> Self {
        let mut load = Load {
            stop: Arc::new(AtomicBool::new(false)),
            present: Arc::new(AtomicUsize::new(present)),
            timing: Arc::new(AtomicUsize::new(0)),
            timed: Arc::new(Mutex::new(vec![Samples::new(); steps])),
            counts: Arc::new(Mutex::new(BTreeMap::new())),
            tasks: Vec::new(),
        };
        let sent = Arc::new(AtomicU64::new(0));
        let until = Instant::now() + MAX_LOAD;
        for c in 0..CLIENTS {
            let (stop, present, timing) = (load.stop.clone(), load.present.clone(), load.timing.clone());
            let (timed, counts, sent, ips) = (load.timed.clone(), load.counts.clone(), sent.clone(), ips.to_vec());
            load.tasks.push(tokio::spawn(async move {
                let mut k = c;
                while !stop.load(Ordering::Relaxed) && Instant::now() < until {
                    let (step, n) = (timing.load(Ordering::Relaxed), present.load(Ordering::Relaxed));
                    if n == 0 {
                        // No route exists for the whole change yet (the first step).
                        tokio::time::sleep(Duration::from_millis(5)).await;
                        continue;
                    }
                    if sent.fetch_add(1, Ordering::Relaxed) >= MAX_REQUESTS {
                        break;
                    }
                    let (i, t) = (k % n, Instant::now());
                    let answer = get(ips[k % ips.len()], port, i).await;
                    if step > 0 && answer.0 == 200 {
                        if let Some(s) = lock(&timed).get_mut(step - 1) {
                            s.push_ms(t.elapsed());
                        }
                    }
                    *lock(&counts).entry(answer).or_insert(0) += 1;
                    k += 1;
                }
            }));
        }
        load
    }

    /// Times [`STEP_REQUESTS`] requests as step `k`'s; returns their samples.
    async fn time_step(&self, k: usize) -> Result<Samples> {
        self.timing.store(k + 1, Ordering::Relaxed);
        let deadline = Instant::now() + DEADLINE;
        loop {
            let n = lock(&self.timed).get(k).map_or(0, Samples::len);
            if n >= STEP_REQUESTS {
                break;
            }
            if Instant::now() > deadline || self.tasks.iter().all(|t| t.is_finished()) {
                self.timing.store(0, Ordering::Relaxed);
                return Err(BenchError::Timeout(format!("step {k}: {n} of {STEP_REQUESTS} requests timed")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.timing.store(0, Ordering::Relaxed);
        Ok(lock(&self.timed).get(k).cloned().unwrap_or_default())
    }

    /// Stops the clients and returns the counts.
    async fn finish(mut self) -> BTreeMap<(u16, String), u64> {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks.drain(..) {
            let _ = t.await;
        }
        std::mem::take(&mut *lock(&self.counts))
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

/// Waits until every pod answers route `i` with `status` (200 only from the upstream); returns
/// when the last one did.
async fn wait_route(ips: &[Ipv4Addr], port: u16, i: usize, status: u16) -> Result<Instant> {
    if status == 200 {
        return wait_answering(ips, port, &host(i), &path(i)).await;
    }
    wait_status(ips, port, &host(i), &path(i), status, DEADLINE).await
}

/// Creates routes `from..to` or deletes `to..from` (newest first), [`PARALLEL`] at a time;
/// returns when the last request returned.
async fn change(client: &Client, from: usize, to: usize) -> Result<Instant> {
    if to > from {
        let made: Vec<Result<String>> = futures::stream::iter(from..to)
            .map(|i| apply(client, route(&name(i), &host(i), &path(i), "web")))
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        made.into_iter().collect::<Result<Vec<_>>>()?;
    } else {
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ApiResource::erase::<HttpRoute>(&()));
        let gone: Vec<Result<()>> = futures::stream::iter((to..from).rev())
            .map(|i| {
                let api = api.clone();
                async move {
                    api.delete(&name(i), &DeleteParams::default()).await.map_err(kerr("delete HTTPRoute"))?;
                    Ok(())
                }
            })
            .buffer_unordered(PARALLEL)
            .collect()
            .await;
        gone.into_iter().collect::<Result<Vec<_>>>()?;
    }
    Ok(Instant::now())
}

/// Goes from `from` routes to `to`, with the load kept on routes that exist throughout; returns
/// how long, from the last create or delete, until every pod answered every changed route as it
/// must (the routes checked one after another).
async fn step(client: &Client, ips: &[Ipv4Addr], port: u16, load: &Load, from: usize, to: usize) -> Result<f64> {
    load.present.store(from.min(to), Ordering::Relaxed);
    let changed = change(client, from, to).await?;
    let (range, status) = if to > from { (from..to, 200) } else { (to..from, 404) };
    let mut done = changed;
    for i in range.rev() {
        done = wait_route(ips, port, i, status).await?;
    }
    load.present.store(to, Ordering::Relaxed);
    Ok((done - changed).as_secs_f64() * 1000.0)
}

/// Writes the steps where `--sweep-json` says.
fn write_steps(ctx: &Ctx, steps: &[Step]) -> Result<()> {
    let Some(path) = &ctx.sweep_json else { return Ok(()) };
    let text = serde_json::to_string_pretty(steps).map_err(|e| BenchError::Unexpected(e.to_string()))?;
    std::fs::write(path, text).map_err(BenchError::io("write --sweep-json"))
}

/// The case's rows: one per step (its latency), then the goals at the top and on the way back.
fn rows(ctx: &Ctx, steps: &[Step], timed: &[Samples], wrong: &[String], note: &str) -> Vec<Row> {
    let mut out: Vec<Row> = steps
        .iter()
        .zip(timed)
        .map(|(s, t)| {
            let mut r = Row::repeated(CASE, &format!("{} routes: latency", s.label()), &ctx.label, t, None, "ms");
            r.add_note(format!(
                "propagated in {:.0} ms; controller {:.1} MiB, HAProxy per pod {:?} MiB",
                s.propagate_ms,
                s.controller_mib,
                rounded(&s.haproxy_mib)
            ));
            r
        })
        .collect();
    let (Some(first), Some(last)) = (steps.first(), steps.last()) else { return out };
    let top = steps.iter().max_by_key(|s| s.routes).unwrap_or(first);
    let at = |metric: &str, v: f64, base: f64, unit: &str| Row::single(CASE, metric, &ctx.label, v, Some(base), unit);
    let (hap_first, hap_top, hap_last) = (first.haproxy_max_mib(), top.haproxy_max_mib(), last.haproxy_max_mib());
    let ctl =
        at("controller RSS at the top (floor: at the first step)", top.controller_mib, first.controller_mib, "MiB")
            .goal_max(100.0);
    let hap = at("HAProxy RSS per pod at the top (floor: first step)", hap_top, hap_first, "MiB").goal_max(100.0);
    let p99 = at("p99 at the top (floor: p99 at the first step)", top.p99_ms, first.p99_ms, "ms").goal_ratio(2.0);
    let released = at(
        "controller RSS back at the last step (floor: first step)",
        last.controller_mib,
        first.controller_mib,
        "MiB",
    )
    .goal_ratio(1.1);
    let hap_back =
        at("HAProxy RSS per pod back at the last step (floor: first step)", hap_last, hap_first, "MiB").goal_ratio(1.1);
    for mut r in [ctl, hap, p99, released, hap_back] {
        r.add_note(note);
        out.push(r);
    }
    out.into_iter().map(|r| r.verified(wrong)).collect()
}

/// Runs `sweep` on the local control plane.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let fleet = LocalRouteFleet::start(ctx, Settle::Product).await?;
    run_on(ctx, &fleet).await
}

/// Runs `sweep` on `fleet`.
pub(super) async fn run_on(ctx: &Ctx, fleet: &impl RouteFleet) -> Result<Vec<Row>> {
    let counts = if ctx.quick { QUICK_STEPS } else { STEPS };
    let (client, ips, bind) = (fleet.client(), fleet.ips(), fleet.bind());
    let ctl = fleet.controller_pid().await?;
    let start_pids = settled_workers(fleet).await?;

    let load = Load::start(ips, bind, 0, counts.len());
    let (mut steps, mut timed, mut now) = (Vec::new(), Vec::new(), 0);
    let t_run = Instant::now();
    for (k, &to) in counts.iter().enumerate() {
        let propagate_ms = step(client, ips, bind, &load, now, to).await?;
        let direction = if to < now { Direction::Down } else { Direction::Up };
        now = to;
        let t = load.time_step(k).await?;
        let controller_mib = rss(ctl).map_or(f64::NAN, mib);
        let haproxy_mib = fleet.haproxy_mib().await?;
        let (p50_ms, p99_ms) = (t.p50().unwrap_or(f64::NAN), t.p99().unwrap_or(f64::NAN));
        steps.push(Step {
            direction,
            routes: to,
            propagate_ms,
            p50_ms,
            p99_ms,
            requests: t.len(),
            controller_mib,
            haproxy_mib,
        });
        timed.push(t);
    }
    let run_s = t_run.elapsed().as_secs_f64();
    let answers = load.finish().await;
    let pids = settled_workers(fleet).await?;
    write_steps(ctx, &steps)?;

    let total: u64 = answers.values().sum();
    let mut wrong: Vec<String> = answers
        .iter()
        .filter(|((code, body), _)| !(*code == 200 && body == "ok"))
        .map(|((code, body), k)| format!("{k} responses {code} {body:?}"))
        .collect();
    if pids != start_pids {
        wrong.push(format!("worker pids {start_pids:?} -> {pids:?} (a reload)"));
    }
    let note = format!(
        "{} steps over {HOSTS} hostnames; {}; {CLIENTS} clients (each request a new connection) sending {total} requests \
         in {run_s:.0} s, {STEP_REQUESTS} timed per step",
        counts.len(),
        fleet.describe()
    );
    Ok(rows(ctx, &steps, &timed, &wrong, &note))
}
