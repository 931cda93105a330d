//! `endpoint_churn`: render mode on the local control plane (`haptic_e2e::k8s`: etcd +
//! kube-apiserver on loopback, pods run by the kubelet stand-in) with an IngressClass, an
//! Ingress, a Service and its EndpointSlice; a real `haptic-controller run --kubernetes`
//! renders them. Two figures, each against the same change made directly on every pod's master
//! socket in the same run:
//! - one endpoint moved (EndpointSlice patch) → every pod serving the new address, against one
//!   `set server … addr` per pod plus one watch event's delay (the bench's own watch on the slice);
//! - a burst of endpoint moves sent back to back → every pod serving the last state, against
//!   sending the same patches plus the same number of `set server … addr` on every pod.
//!
//! Then the controller's resident memory with 100, 1,000 and 10,000 Ingress paths over up to
//! 1,000 Services of ten endpoints each, every pod serving them.
//!
//! Endpoints are TEST-NET and private addresses no request is sent to: what a pod serves is read from
//! HAProxy's `show servers state`. Every change must land without a reload (the worker pid of
//! every pod is checked). It must never talk to anything but 127.0.0.1, and it spawns the
//! controller binary (never links it).

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use haptic_e2e::free_port;
use haptic_e2e::k8s::LocalPods;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};

use super::k8s::{kerr, local_fleet, VersionWatch, NS};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::fleet_kit::{Controller, SETTLE};
use crate::report::Row;
use crate::stats::Samples;

/// Endpoints of the Service.
const ENDPOINTS: usize = 10;
/// The backend the render names for Service `web`, port `http`, in [`NS`].
const BACKEND: &str = "bench_web_http";

/// Endpoint `k`'s address in one of two places: TEST-NET-1 or TEST-NET-2.
fn addr(k: usize, moved: bool) -> String {
    if moved {
        format!("198.51.100.{}", k + 1)
    } else {
        format!("192.0.2.{}", k + 1)
    }
}

fn slice(moved: &[bool]) -> Value {
    let eps: Vec<Value> = moved
        .iter()
        .enumerate()
        .map(|(k, m)| json!({"addresses": [addr(k, *m)], "conditions": {"ready": true}}))
        .collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "web-1", "namespace": NS, "labels": {"kubernetes.io/service-name": "web"}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps})
}

/// Applies `obj` (any kind, its plural as kube derives it from the kind) by server-side apply as
/// `haptic-bench`; returns the resourceVersion it got.
pub(super) async fn apply(client: &Client, obj: Value) -> Result<String> {
    let ar = kube::api::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        obj["apiVersion"].as_str().unwrap_or_default().split_once('/').map_or("", |(g, _)| g),
        obj["apiVersion"].as_str().unwrap_or_default().rsplit('/').next().unwrap_or_default(),
        obj["kind"].as_str().unwrap_or_default(),
    ));
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let ns = obj["metadata"]["namespace"].as_str();
    let api: Api<DynamicObject> = match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    };
    let got = api
        .patch(&name, &PatchParams::apply("haptic-bench").force(), &Patch::Apply(&obj))
        .await
        .map_err(kerr("apply"))?;
    Ok(got.metadata.resource_version.unwrap_or_default())
}

/// The render-mode objects: the IngressClass, Service `web`, its slice, an Ingress for it, and
/// the HAProxyConfig rendering them with the built-in template bound on each pod's `${POD_IP}`.
async fn objects(client: &Client, fe: u16, agent_port: u16) -> Result<()> {
    let template = pod_template(&format!("    bind \"${{POD_IP}}:{fe}\"\n"))?;
    for obj in [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "edge-template", "namespace": NS},
               "data": {"haproxy.cfg.j2": template}}),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "haptic"},
               "spec": {"controller": haptic_render::ingress::INGRESS_CONTROLLER}}),
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "web", "namespace": NS},
               "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}}),
        slice(&[false; ENDPOINTS]),
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": "web", "namespace": NS},
               "spec": {"ingressClassName": "haptic", "rules": [{"host": "bench.example", "http": {"paths": [
                   {"path": "/", "pathType": "Prefix", "backend": {"service": {"name": "web", "port": {"name": "http"}}}}]}}]}}),
        json!({"apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig", "metadata": {"name": "edge", "namespace": NS},
               "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
                        "agent": {"port": agent_port}, "controller": {"maxParallel": 16},
                        "render": {"ingressClassName": "haptic", "serverSlots": 16,
                                   "template": {"configMapKeyRef": {"name": "edge-template", "key": "haproxy.cfg.j2"}}}}}),
    ] {
        apply(client, obj).await?;
    }
    Ok(())
}

/// The built-in template with its frontend bind loop replaced by `binds`, so that each local
/// pod binds its own `${POD_IP}` (local pods share one host).
pub(super) fn pod_template(binds: &str) -> Result<String> {
    let builtin = haptic_render::template::BUILTIN;
    let pattern = "{% for b in f.binds %}    bind {{ b }}\n{% endfor %}";
    if !builtin.contains(pattern) {
        return Err(BenchError::Unexpected("the built-in template has no bind loop to replace".into()));
    }
    Ok(builtin.replace(pattern, binds))
}

/// The addresses `backend` serves (servers not in maintenance) and the worker pid, per pod.
pub(super) async fn serving(pods: &LocalPods, backend: &str) -> Result<Vec<(BTreeSet<String>, Option<u32>)>> {
    let mut out = Vec::new();
    for n in pods.names() {
        let Some(pod) = pods.pod(&n) else { continue };
        let h = pod.haproxy();
        let text = h.worker_cmd(&format!("show servers state {backend}")).await?;
        // Field 5 is the address, 7 the admin state (maintenance bits 0x01, 0x02, 0x20).
        let live = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let admin: u32 = f.get(6)?.parse().ok()?;
                (f.get(1) == Some(&backend) && admin & 0x23 == 0).then(|| f[4].to_string())
            })
            .collect();
        out.push((live, h.show_info().await?.pid()));
    }
    Ok(out)
}

fn want(moved: &[bool]) -> BTreeSet<String> {
    moved.iter().enumerate().map(|(k, m)| addr(k, *m)).collect()
}

/// Waits (polling every 2 ms, at most 60 s) until every pod's `backend` serves exactly the
/// addresses `want`; returns when, and the pods' worker pids.
pub(super) async fn wait_serving(
    pods: &LocalPods,
    backend: &str,
    want: &BTreeSet<String>,
) -> Result<(Instant, Vec<Option<u32>>)> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        // Before the first plan, a pod has no HAProxy to ask.
        let now = serving(pods, backend).await.map_err(|e| e.to_string());
        if let Ok(now) = &now {
            if now.iter().all(|(s, _)| s == want) {
                return Ok((Instant::now(), now.iter().map(|(_, p)| *p).collect()));
            }
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(format!("{backend} serving {want:?}: {now:?}")));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// The floor of `n` endpoint moves: `n` `set server … addr` on every pod's master socket, each
/// setting a server's address to the one it has (the same work, and nothing changes).
async fn direct(pods: &LocalPods, n: usize) -> Result<Duration> {
    let mut servers = Vec::new();
    for name in pods.names() {
        let Some(pod) = pods.pod(&name) else { continue };
        let text = pod.haproxy().worker_cmd(&format!("show servers state {BACKEND}")).await?;
        let first = text.lines().filter(|l| !l.starts_with('#')).find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&BACKEND)).then(|| Some((f.get(3)?.to_string(), f.get(4)?.to_string())))?
        });
        let (srv, a) = first.ok_or_else(|| BenchError::Unexpected(format!("no server in {BACKEND}: {text:.300}")))?;
        servers.push((name, srv, a));
    }
    let t = Instant::now();
    for (name, srv, a) in &servers {
        let Some(pod) = pods.pod(name) else { continue };
        for _ in 0..n {
            let reply = pod.haproxy().worker_cmd(&format!("set server {BACKEND}/{srv} addr {a} port 8080")).await?;
            // 2.6: "no need to change the addr…"; 3.0: "nothing changed"; a change: "… changed from …".
            if !reply.contains("change") {
                return Err(BenchError::Unexpected(format!("set server: {reply}")));
            }
        }
    }
    Ok(t.elapsed())
}

/// Runs `endpoint_churn`.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let (cp, client, pods) = local_fleet(ctx).await?;
    let n = ctx.pods;
    objects(&client, free_port(), pods.agent_port()).await?;
    let tmp = tempfile::Builder::new().prefix("haptic-bench-ep-").tempdir().map_err(BenchError::io("tempdir"))?;
    let ctl = Controller::start_kubernetes(&ctx.bin, tmp.path(), cp.kubeconfig(), NS, "edge")?;
    let mut moved = vec![false; ENDPOINTS];
    let (_, workers) = wait_serving(&pods, BACKEND, &want(&moved)).await?;

    // The bench's own watch on the slice: when each new resourceVersion arrives.
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let current = slices.get("web-1").await.map_err(kerr("get the slice"))?.metadata.resource_version;
    let mut watcher = VersionWatch::start(&slices, "metadata.name=web-1", &current.unwrap_or_default()).await?;

    let mut wrong = Vec::new();
    let (mut one, mut watch, mut floor) = (Samples::new(), Samples::new(), Samples::new());
    for i in 0..ctx.warmup() + ctx.reps() {
        let k = i % ENDPOINTS;
        moved[k] = !moved[k];
        let t = Instant::now();
        let rv = apply(&client, slice(&moved)).await?;
        let (done, pids) = wait_serving(&pods, BACKEND, &want(&moved)).await?;
        if pids != workers {
            wrong.push(format!("move {i}: worker pids {workers:?} -> {pids:?} (a reload)"));
        }
        let seen = watcher.seen(&rv).await;
        let direct_one = direct(&pods, 1).await?;
        if i >= ctx.warmup() {
            one.push_ms(done - t);
            floor.push_ms(direct_one);
            match seen {
                Some(at) => watch.push_ms(at.saturating_duration_since(t)),
                None => wrong.push(format!("move {i}: the bench's watch never saw resourceVersion {rv}")),
            }
        }
    }
    drop(watcher);

    // A burst: endpoint moves sent back to back, then every pod serving the last state.
    let burst = if ctx.quick { 50 } else { 200 };
    let t = Instant::now();
    for i in 0..burst {
        let k = (i * 3) % ENDPOINTS;
        moved[k] = !moved[k];
        apply(&client, slice(&moved)).await?;
    }
    let sent = t.elapsed();
    let (done, pids) = wait_serving(&pods, BACKEND, &want(&moved)).await?;
    let took = done - t;
    if pids != workers {
        wrong.push(format!("burst: worker pids {workers:?} -> {pids:?} (a reload)"));
    }
    let direct_burst = direct(&pods, burst).await?;
    let scale = scale_rows(ctx, &client, &pods, &ctl).await?;
    drop(ctl);
    drop(pods);
    drop(cp);

    let mut rows = Vec::new();
    let floor_one = floor.p50().unwrap_or(0.0) + watch.p50().unwrap_or(0.0);
    let mut r = Row::repeated("endpoint_churn", &format!("one move, {n} pods"), &ctx.label, &one, None, "ms")
        .verified(&wrong)
        .with_floor(floor_one);
    r.add_note(format!(
        "EndpointSlice patch -> every pod serving the new address (controller --settle {SETTLE}, which also caps --endpoint-settle); floor: `set server addr` on every pod p50 {:.2} ms + watch delay p50 {:.2} ms",
        floor.p50().unwrap_or(0.0),
        watch.p50().unwrap_or(0.0)
    ));
    rows.push(r);
    let mut r = Row::single(
        "endpoint_churn",
        &format!("burst of {burst} moves, {n} pods"),
        &ctx.label,
        took.as_secs_f64() * 1000.0,
        Some((sent + direct_burst).as_secs_f64() * 1000.0),
        "ms",
    )
    .verified(&wrong);
    r.add_note(format!(
        "{burst} EndpointSlice patches back to back (sent in {:.0} ms) -> every pod serving the last state: {:.0} endpoints/s, 0 reloads; floor: sending the patches + {burst} `set server addr` on every pod ({:.0} ms)",
        sent.as_secs_f64() * 1000.0,
        burst as f64 / took.as_secs_f64().max(1e-9),
        direct_burst.as_secs_f64() * 1000.0
    ));
    rows.push(r);
    rows.extend(scale);
    Ok(rows)
}

/// Paths per Ingress (one host each) in the scale phase.
const PATHS_PER_INGRESS: usize = 10;

/// The scale phase: Ingress paths over Services with [`ENDPOINTS`] endpoints each, grown to 100,
/// 1,000 and 10,000 paths (1,000 Services at most; 100 and 1,000 in quick mode), every pod
/// serving each size before the controller's resident memory is read.
async fn scale_rows(ctx: &Ctx, client: &Client, pods: &LocalPods, ctl: &Controller) -> Result<Vec<Row>> {
    let sizes: &[usize] = if ctx.quick { &[100, 1_000] } else { &[100, 1_000, 10_000] };
    let (mut have_services, mut have_ingresses) = (0, 0);
    let mut rows = Vec::new();
    for &paths in sizes {
        let services = paths.min(1_000);
        let t = Instant::now();
        for s in have_services..services {
            let name = format!("svc-{s}");
            apply(
                client,
                json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": NS},
                                 "spec": {"clusterIP": "None", "ports": [{"port": 80, "targetPort": 8080}]}}),
            )
            .await?;
            let eps: Vec<Value> = (0..ENDPOINTS)
                .map(|e| json!({"addresses": [format!("10.{}.{}.{}", s / 250, s % 250, e + 1)], "conditions": {"ready": true}}))
                .collect();
            apply(
                client,
                json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                                 "metadata": {"name": format!("{name}-1"), "namespace": NS,
                                              "labels": {"kubernetes.io/service-name": name}},
                                 "addressType": "IPv4", "ports": [{"port": 8080}], "endpoints": eps}),
            )
            .await?;
        }
        have_services = services;
        let ingresses = paths.div_ceil(PATHS_PER_INGRESS);
        for i in have_ingresses..ingresses {
            let paths: Vec<Value> = (0..PATHS_PER_INGRESS)
                .map(|p| i * PATHS_PER_INGRESS + p)
                .map(|n| json!({"path": format!("/p{n}"), "pathType": "Prefix",
                                "backend": {"service": {"name": format!("svc-{}", n % services), "port": {"number": 80}}}}))
                .collect();
            apply(
                client,
                json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress",
                                 "metadata": {"name": format!("ing-{i}"), "namespace": NS},
                                 "spec": {"ingressClassName": "haptic",
                                          "rules": [{"host": format!("h{i}.example.com"), "http": {"paths": paths}}]}}),
            )
            .await?;
        }
        have_ingresses = ingresses;
        let sent = t.elapsed();
        // Every pod serves the last Ingress's host and the last Service's endpoints.
        let last_host = format!("h{}.example.com", ingresses - 1);
        let last_backend = format!("{NS}_svc-{}_80", services - 1);
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let mut all = true;
            for name in pods.names() {
                let Some(pod) = pods.pod(&name) else { continue };
                let h = pod.haproxy();
                let hosts = h.worker_cmd("show map maps/hosts.map").await.unwrap_or_default();
                let servers = h.worker_cmd(&format!("show servers state {last_backend}")).await.unwrap_or_default();
                all &= hosts.contains(&last_host) && servers.contains("10.");
            }
            if all {
                break;
            }
            if Instant::now() > deadline {
                return Err(BenchError::Timeout(format!("{paths} paths: the pods never served {last_host}")));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let served = t.elapsed();
        let pid = ctl.pid();
        let (rss, peak) = (crate::proc_mem::rss(pid).unwrap_or(0), crate::proc_mem::peak(pid).unwrap_or(0));
        let parts = crate::proc_mem::rss_parts_note(pid);
        let metric = format!("controller RSS, {paths} paths / {services} svc / {} ep", services * ENDPOINTS);
        let mut r = Row::single("endpoint_churn", &metric, &ctx.label, crate::proc_mem::mib(rss), None, "MiB");
        r.add_note(format!(
            "{parts} (the binary); peak {:.1} MiB; objects sent in {:.1} s, every pod serving them {:.1} s after the first was sent",
            crate::proc_mem::mib(peak),
            sent.as_secs_f64(),
            served.as_secs_f64()
        ));
        rows.push(r);
        if paths == sizes[sizes.len() - 1] {
            rows.push(at_rest(ctx, pid, &metric).await);
        }
    }
    Ok(rows)
}

/// How long the controller is left alone before its memory at rest is read: longer than tokio's
/// keep-alive of an idle blocking thread (10 s), the threads the renders run on, so those have
/// ended and the allocator has had the chance to return what they freed.
const REST: Duration = Duration::from_secs(15);

/// The controller's resident memory after [`REST`] with nothing sent to it: what a controller
/// of that size holds between changes.
async fn at_rest(ctx: &Ctx, pid: u32, metric: &str) -> Row {
    tokio::time::sleep(REST).await;
    let rss = crate::proc_mem::rss(pid).unwrap_or(0);
    let mut r = Row::single(
        "endpoint_churn",
        &format!("{metric}, at rest"),
        &ctx.label,
        crate::proc_mem::mib(rss),
        None,
        "MiB",
    );
    r.add_note(format!(
        "read {} s after every pod served the last change, nothing sent meanwhile: {}",
        REST.as_secs(),
        crate::proc_mem::rss_parts_note(pid)
    ));
    r
}
