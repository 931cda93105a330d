//! `gateway_route`: Gateway API on the local control plane (`haptic_e2e::k8s`: etcd +
//! kube-apiserver on loopback with the Gateway API standard CRDs, pods run by the kubelet
//! stand-in): a GatewayClass of haptic's, a Gateway with one HTTP listener, headless Services
//! whose EndpointSlices stand for the bench's upstreams on 127.0.0.x, and a real
//! `haptic-controller run --kubernetes` rendering them. The apiserver refuses loopback endpoint
//! addresses, so a slice holds TEST-NET-1 `192.0.2.k` and the bench's template (the built-in one
//! with two words changed: each pod binds its own `${POD_IP}`, and a server address `192.0.2.k`
//! is written `127.0.0.k`) sends the traffic to upstream `127.0.0.k`; the controller diffs and
//! deploys those rendered addresses as it does any other. Two figures, each against the same change
//! made directly on every pod's master socket in the same run, plus one watch event's delay (the
//! bench's own watch), as `endpoint_churn` defines its floor:
//! - an HTTPRoute created (a new hostname and path to Service `web`, whose backend exists) →
//!   every pod answering it with the upstream's 200; the floor adds the map entries haptic's
//!   change added (read from the first pod's maps, with the host, host id and rule id renamed)
//!   with `add map` on every pod and sees every pod answer the renamed host with 200;
//! - Service `scale` behind an HTTPRoute grown by [`GROW`] ready endpoints (one EndpointSlice
//!   patch) → every pod serving them (`show servers state`), then requests through every pod
//!   reaching each new endpoint; the floor is `set server … addr` and `set server … state ready`
//!   for each new endpoint's server on every pod.
//!
//! Every change must land without a reload (the worker pid of every pod is checked). It must
//! never send traffic anywhere but 127.0.0.0/8, never leave a process behind (every part stops on
//! drop), and it spawns the controller binary (never links it).

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use haptic_e2e::k8s::gateway_api::POD_IP_BINDS;
use haptic_e2e::k8s::{install_gateway_crds, LocalPods};
use haptic_e2e::net::http_request;
use haptic_render::gateway::GATEWAY_CONTROLLER;
use haptic_render::gateway_api::HttpRoute;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::Client;
use serde_json::{json, Value};

use super::k8s::{kerr, local_fleet, VersionWatch, NS};
use super::k8s_endpoints::{apply, pod_template, serving, wait_serving};
use super::Ctx;
use crate::error::{BenchError, Result};
use crate::fleet_kit::{Controller, Upstream, SETTLE};
use crate::report::Row;
use crate::stats::Samples;

const CASE: &str = "gateway_route";
/// The GatewayClass and the Gateway (in [`NS`], the fleet's namespace too).
const CLASS: &str = "haptic";
pub(super) const GATEWAY: &str = "gw";
/// The host of the route made at start (every pod answering it: the first render is deployed).
pub(super) const BASE_HOST: &str = "base.gw.bench";
/// The host of the route to Service `scale`.
pub(super) const SCALE_HOST: &str = "scale.gw.bench";
/// Ready endpoints of Service `scale` between scale events.
const BASE_EPS: usize = 2;
/// Ready endpoints each scale event adds.
const GROW: usize = 4;
/// Server slots per backend: room for `BASE_EPS + GROW`, so no event needs a reload.
const SLOTS: usize = 16;
/// Requests through a pod after a scale event, per endpoint, to see each new endpoint answer:
/// HAProxy's `roundrobin` can pass a server that has just come back for a few rounds.
const TRAFFIC_ROUNDS: usize = 20;
/// How long any one wait may take.
const DEADLINE: Duration = Duration::from_secs(60);

/// The backend the render names for Service `svc`, port `http` (80), in [`NS`].
pub(super) fn backend(svc: &str) -> String {
    format!("{NS}_{svc}_http")
}

/// Where endpoint `k` of Service `scale` is served (127.0.0.3 onwards; `web`'s is 127.0.0.2,
/// the template's parked slots are 127.0.0.1:1, local pods live on 127.A.B.N with A.B ≥ 1.1).
pub(super) fn scale_addr(k: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 0, 3 + u8::try_from(k).unwrap_or(u8::MAX - 3))
}

/// The address an EndpointSlice holds for upstream `a` (127.0.0.k → 192.0.2.k).
fn published(a: Ipv4Addr) -> Ipv4Addr {
    Ipv4Addr::new(192, 0, 2, a.octets()[3])
}

/// The bench's template: the built-in one binding each pod's `${POD_IP}` and writing a server
/// address 192.0.2.k as 127.0.0.k.
fn template() -> Result<String> {
    let addr = "{{ s.addr }}";
    let t = pod_template(POD_IP_BINDS)?;
    if !t.contains(addr) {
        return Err(BenchError::Unexpected("the built-in template writes no {{ s.addr }}".into()));
    }
    Ok(t.replace(addr, "{{ s.addr | replace(\"192.0.2.\", \"127.0.0.\") }}"))
}

fn service(name: &str) -> Value {
    service_in(NS, name)
}

/// Headless Service `name` in `ns`, port `http` 80.
pub(super) fn service_in(ns: &str, name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": ns},
           "spec": {"clusterIP": "None", "ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
}

/// The EndpointSlice of `svc` standing for the upstreams on `addrs` (loopback) and `port`.
fn slice(svc: &str, addrs: &[Ipv4Addr], port: u16) -> Value {
    slice_in(NS, svc, addrs, port)
}

/// The EndpointSlice of `svc` in `ns` standing for the upstreams on `addrs` (loopback) and `port`.
pub(super) fn slice_in(ns: &str, svc: &str, addrs: &[Ipv4Addr], port: u16) -> Value {
    let published: Vec<Ipv4Addr> = addrs.iter().map(|a| published(*a)).collect();
    slice_of(ns, svc, &published, port)
}

/// The EndpointSlice of `svc` in `ns`: ready endpoints `addrs` as they are, on `port`.
pub(super) fn slice_of(ns: &str, svc: &str, addrs: &[Ipv4Addr], port: u16) -> Value {
    let eps: Vec<Value> =
        addrs.iter().map(|a| json!({"addresses": [a.to_string()], "conditions": {"ready": true}})).collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{svc}-1"), "namespace": ns, "labels": {"kubernetes.io/service-name": svc}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": port}], "endpoints": eps})
}

/// HTTPRoute `name`: `host`, prefix `path` → Service `svc` port 80, on [`GATEWAY`].
pub(super) fn route(name: &str, host: &str, path: &str, svc: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"parentRefs": [{"name": GATEWAY}], "hostnames": [host],
                    "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": path}}],
                               "backendRefs": [{"name": svc, "port": 80}]}]}})
}

/// Gateway [`GATEWAY`] of class [`CLASS`] in [`NS`], one HTTP listener on port 80.
pub(super) fn gateway() -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
           "metadata": {"name": GATEWAY, "namespace": NS},
           "spec": {"gatewayClassName": CLASS, "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}})
}

/// The class, the Gateway, Services `web` and `scale` with their slices and routes, and the
/// HAProxyConfig rendering the class with the built-in template bound on each pod's `${POD_IP}`.
pub(super) async fn objects(client: &Client, agent_port: u16, web: SocketAddr, scale_port: u16) -> Result<()> {
    let base: Vec<Ipv4Addr> = (0..BASE_EPS).map(scale_addr).collect();
    let SocketAddr::V4(web) = web else {
        return Err(BenchError::Unexpected(format!("upstream {web} is not IPv4")));
    };
    for obj in [
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "edge-template", "namespace": NS},
               "data": {"haproxy.cfg.j2": template()?}}),
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": CLASS},
               "spec": {"controllerName": GATEWAY_CONTROLLER}}),
        gateway(),
        service("web"),
        slice("web", &[*web.ip()], web.port()),
        service("scale"),
        slice("scale", &base, scale_port),
        route("base", BASE_HOST, "/", "web"),
        route("scale", SCALE_HOST, "/", "scale"),
        json!({"apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig", "metadata": {"name": "edge", "namespace": NS},
               "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
                        "agent": {"port": agent_port}, "controller": {"maxParallel": 16},
                        "render": {"gatewayClassName": CLASS, "serverSlots": SLOTS,
                                   "template": {"configMapKeyRef": {"name": "edge-template", "key": "haproxy.cfg.j2"}}}}}),
    ] {
        apply(client, obj).await?;
    }
    Ok(())
}

/// The setup the route-scale cases share: the local fleet with the Gateway API CRDs, upstream
/// `web` on 127.0.0.2 and `scale` on 127.0.0.3 answering `ok`, and the objects of [`objects`].
/// Fields drop in order: the upstreams, the pods, then the control plane.
pub(super) struct GatewayFleet {
    pub web: crate::fleet_kit::Upstream,
    /// Serves Service `scale` until dropped.
    pub _scale: crate::fleet_kit::Upstream,
    pub pods: LocalPods,
    pub client: Client,
    pub cp: haptic_e2e::k8s::ControlPlane,
    /// The pods' addresses.
    pub ips: Vec<Ipv4Addr>,
}

/// Starts a [`GatewayFleet`].
pub(super) async fn gateway_fleet(ctx: &super::Ctx) -> Result<GatewayFleet> {
    let (cp, client, pods) = local_fleet(ctx).await?;
    install_gateway_crds(&client).await.map_err(|e| BenchError::Kubernetes(e.to_string()))?;
    let ips: Vec<Ipv4Addr> = pods.names().iter().filter_map(|p| pods.ip(p)).collect();
    let web = crate::fleet_kit::Upstream::start_on(SocketAddr::from(([127, 0, 0, 2], 0))).await?;
    let scale = crate::fleet_kit::Upstream::start_on(SocketAddr::from(([127, 0, 0, 3], 0))).await?;
    objects(&client, pods.agent_port(), SocketAddr::from(([127, 0, 0, 2], web.port)), scale.port).await?;
    Ok(GatewayFleet { web, _scale: scale, pods, client, cp, ips })
}

/// The port every pod binds for the Gateway's listener: the target port of the Service the
/// controller makes for the Gateway in the fleet's namespace `fleet_ns`.
pub(super) async fn bind_port(client: &Client, fleet_ns: &str) -> Result<u16> {
    let services: Api<Service> = Api::namespaced(client.clone(), fleet_ns);
    let name = haptic_render::gateway::service_name(NS, GATEWAY);
    let deadline = Instant::now() + DEADLINE;
    loop {
        let port = services.get(&name).await.ok().and_then(|s| s.spec?.ports?.first()?.target_port.clone());
        if let Some(IntOrString::Int(p)) = port {
            return u16::try_from(p).map_err(|_| BenchError::Unexpected(format!("target port {p}")));
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(format!("the Gateway's Service {name} with a target port")));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET path` with `Host: host` on `ip:port`: the status (0 when nothing answered) and body.
async fn get(ip: Ipv4Addr, port: u16, host: &str, path: &str) -> (u16, String) {
    let req = format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n");
    http_request(SocketAddr::from((ip, port)), &req).await.unwrap_or((0, String::new()))
}

/// Whether an answer is the upstream's.
fn upstream_ok(answer: &(u16, String)) -> bool {
    answer.0 == 200 && answer.1 == "ok"
}

/// Waits (each pod asked every 2 ms until it answers, at most [`DEADLINE`]) until every pod in
/// `ips` has answered `host` `path` with the upstream's 200; returns when the last one did.
pub(super) async fn wait_answering(ips: &[Ipv4Addr], port: u16, host: &str, path: &str) -> Result<Instant> {
    wait_until(ips, port, host, path, DEADLINE, upstream_ok).await
}

/// Waits (each pod asked every 2 ms, at most `deadline`) until every pod in `ips` has answered
/// `host` `path` with status `want`; returns when the last one did.
pub(super) async fn wait_status(
    ips: &[Ipv4Addr],
    port: u16,
    host: &str,
    path: &str,
    want: u16,
    deadline: Duration,
) -> Result<Instant> {
    wait_until(ips, port, host, path, deadline, |a| a.0 == want).await
}

/// Waits (each pod asked every 2 ms, at most `deadline`) until every pod in `ips` has given an
/// answer to `host` `path` that `ok` accepts; returns when the last one did.
async fn wait_until(
    ips: &[Ipv4Addr],
    port: u16,
    host: &str,
    path: &str,
    deadline: Duration,
    ok: impl Fn(&(u16, String)) -> bool,
) -> Result<Instant> {
    let deadline = Instant::now() + deadline;
    let mut left = ips.to_vec();
    loop {
        let mut still = Vec::new();
        let mut last = (0, String::new());
        for ip in left {
            let a = get(ip, port, host, path).await;
            if !ok(&a) {
                still.push(ip);
                last = a;
            }
        }
        left = still;
        if left.is_empty() {
            return Ok(Instant::now());
        }
        if Instant::now() > deadline {
            return Err(BenchError::Timeout(format!("{host}{path} answered {last:?} by {left:?}")));
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// One map entry: (file, key, value).
type Entry = (String, String, String);

/// Every map the first pod has loaded: file → its (key, value) entries.
type Maps = BTreeMap<String, BTreeSet<(String, String)>>;

async fn maps(pods: &LocalPods) -> Result<Maps> {
    let name = pods.names().into_iter().next().ok_or_else(|| BenchError::Unexpected("no pod".into()))?;
    let h = pods.pod(&name).ok_or_else(|| BenchError::Unexpected(format!("no pod {name}")))?.haproxy();
    // `show map`: `<id> (<file>) pattern loaded from file …`, one line per reference.
    let files: BTreeSet<String> = h
        .worker_cmd("show map")
        .await?
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| Some(l.split_once('(')?.1.split_once(')')?.0.to_string()))
        .collect();
    let mut out = Maps::new();
    for f in files {
        // `show map <file>`: `<ptr> <key> <value>`.
        let entries = h
            .worker_cmd(&format!("show map {f}"))
            .await?
            .lines()
            .filter_map(|l| {
                let mut w = l.split_whitespace();
                let (_, k, v) = (w.next()?, w.next()?, w.next()?);
                Some((k.to_string(), v.to_string()))
            })
            .collect();
        out.insert(f, entries);
    }
    Ok(out)
}

/// The entries `after` has and `before` has not, and how many `before` had that `after` lost.
fn added(before: &Maps, after: &Maps) -> (Vec<Entry>, usize) {
    let empty = BTreeSet::new();
    let mut out = Vec::new();
    let mut lost = 0;
    for (f, entries) in after {
        let was = before.get(f).unwrap_or(&empty);
        out.extend(entries.difference(was).map(|(k, v)| (f.clone(), k.clone(), v.clone())));
        lost += was.difference(entries).count();
    }
    (out, lost)
}

/// Route `i`'s map additions renamed for the floor: its host to `f<i>.gw.bench`, its host id
/// and rule id (read from the additions) to new ones; entries nothing renames are left out
/// (adding them again would duplicate a live key). Returns the entries and the floor's host.
fn renamed(i: usize, adds: &[Entry]) -> Result<(Vec<Entry>, String)> {
    let (host, fhost) = (route_host(i), format!("f{i}.gw.bench"));
    let hid = adds
        .iter()
        .find(|(f, k, _)| f.ends_with("hosts.map") && k.starts_with(&format!("{host}@")))
        .map(|(_, _, v)| v.clone())
        .ok_or_else(|| BenchError::Unexpected(format!("no hosts.map entry for {host} among {adds:?}")))?;
    let rule = adds
        .iter()
        .find(|(f, k, _)| f.ends_with("paths_exact.map") && *k == format!("{hid}/r{i}"))
        .map(|(_, _, v)| v.clone())
        .ok_or_else(|| BenchError::Unexpected(format!("no paths_exact.map entry for {hid}/r{i} among {adds:?}")))?;
    let rename =
        |s: &str| s.replace(&host, &fhost).replace(&hid, &format!("{hid}f")).replace(&rule, &format!("{rule}f"));
    let out = adds
        .iter()
        .map(|(f, k, v)| (f.clone(), rename(k), rename(v)))
        .filter(|(_, k, _)| adds.iter().all(|(_, old, _)| old != k))
        .collect();
    Ok((out, fhost))
}

fn route_host(i: usize) -> String {
    format!("r{i}.gw.bench")
}

/// The floor of one route: `entries` added with `add map` on every pod's master socket, then
/// every pod answering `host` `/r<i>` with the upstream's 200 (asked once each). The entries are
/// deleted again afterwards (not timed).
async fn direct_route(
    pods: &LocalPods,
    ips: &[Ipv4Addr],
    port: u16,
    entries: &[Entry],
    host: &str,
    path: &str,
) -> Result<Duration> {
    let t = Instant::now();
    for n in pods.names() {
        let Some(pod) = pods.pod(&n) else { continue };
        for (f, k, v) in entries {
            let reply = pod.haproxy().worker_cmd(&format!("add map {f} {k} {v}")).await?;
            if !reply.trim().is_empty() {
                return Err(BenchError::Unexpected(format!("add map {f} {k} {v}: {reply}")));
            }
        }
    }
    for ip in ips {
        let a = get(*ip, port, host, path).await;
        if !upstream_ok(&a) {
            return Err(BenchError::Unexpected(format!("floor: {ip} answered {host}{path} with {a:?}")));
        }
    }
    let took = t.elapsed();
    for n in pods.names() {
        let Some(pod) = pods.pod(&n) else { continue };
        for (f, k, _) in entries {
            pod.haproxy().worker_cmd(&format!("del map {f} {k}")).await?;
        }
    }
    Ok(took)
}

/// The floor of a scale event: for each address of `new`, `set server … addr` (to the address
/// its server has) and `set server … state ready` on every pod's master socket (the same
/// commands; nothing changes).
async fn direct_scale(pods: &LocalPods, backend: &str, new: &[Ipv4Addr], port: u16) -> Result<Duration> {
    let mut work = Vec::new();
    for n in pods.names() {
        let Some(pod) = pods.pod(&n) else { continue };
        let text = pod.haproxy().worker_cmd(&format!("show servers state {backend}")).await?;
        // Field 4 is the server name, 5 its address.
        let by_addr: BTreeMap<String, String> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(1) == Some(&backend)).then(|| Some((f.get(4)?.to_string(), f.get(3)?.to_string())))?
            })
            .collect();
        for a in new {
            let srv = by_addr
                .get(&a.to_string())
                .ok_or_else(|| BenchError::Unexpected(format!("{n}: no server of {backend} on {a}: {text:.300}")))?;
            work.push((n.clone(), srv.clone(), *a));
        }
    }
    let t = Instant::now();
    for (n, srv, a) in &work {
        let Some(pod) = pods.pod(n) else { continue };
        let h = pod.haproxy();
        let reply = h.worker_cmd(&format!("set server {backend}/{srv} addr {a} port {port}")).await?;
        // 2.6: "no need to change the addr…"; 3.0: "nothing changed"; a change: "… changed from …".
        if !reply.contains("change") {
            return Err(BenchError::Unexpected(format!("set server addr: {reply}")));
        }
        let reply = h.worker_cmd(&format!("set server {backend}/{srv} state ready")).await?;
        if !reply.trim().is_empty() {
            return Err(BenchError::Unexpected(format!("set server state ready: {reply}")));
        }
    }
    Ok(t.elapsed())
}

/// The `show servers state` line of `backend`'s server on `addr` in the pod on `ip`, for a
/// failure's message.
async fn server_state(pods: &LocalPods, ip: Ipv4Addr, backend: &str, addr: &str) -> String {
    let Some(pod) = pods.names().into_iter().find(|n| pods.ip(n) == Some(ip)).and_then(|n| pods.pod(&n)) else {
        return format!("no pod on {ip}");
    };
    let text = pod.haproxy().worker_cmd(&format!("show servers state {backend}")).await.unwrap_or_default();
    let line = text.lines().find(|l| l.split_whitespace().nth(4) == Some(addr));
    let stat = pod.haproxy().worker_cmd("show stat").await.unwrap_or_default();
    let stats: Vec<String> = stat
        .lines()
        .filter(|l| l.starts_with(&format!("{backend},")))
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            format!(
                "{}:stot={}:status={}:weight={}",
                f[1],
                f.get(7).unwrap_or(&""),
                f.get(17).unwrap_or(&""),
                f.get(18).unwrap_or(&"")
            )
        })
        .collect();
    line.map_or_else(|| format!("no server on {addr}"), |l| format!("show servers state: {l}; show stat: {stats:?}"))
}

/// The pods' worker pids (through `show servers state` of `web`'s backend, which every render has).
pub(super) async fn workers(pods: &LocalPods) -> Result<Vec<Option<u32>>> {
    Ok(serving(pods, &backend("web")).await?.into_iter().map(|(_, p)| p).collect())
}

/// Runs `gateway_route`.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let (cp, client, pods) = local_fleet(ctx).await?;
    install_gateway_crds(&client).await.map_err(|e| BenchError::Kubernetes(e.to_string()))?;
    let ips: Vec<Ipv4Addr> = pods.names().iter().filter_map(|p| pods.ip(p)).collect();
    let web = Upstream::start_on(SocketAddr::from(([127, 0, 0, 2], 0))).await?;
    let first = Upstream::start_on(SocketAddr::from((scale_addr(0), 0))).await?;
    let scale_port = first.port;
    let mut scale_ups = vec![first];
    for k in 1..BASE_EPS + GROW {
        scale_ups.push(Upstream::start_on(SocketAddr::from((scale_addr(k), scale_port))).await?);
    }
    objects(&client, pods.agent_port(), SocketAddr::from(([127, 0, 0, 2], web.port)), scale_port).await?;
    let tmp = tempfile::Builder::new().prefix("haptic-bench-gw-").tempdir().map_err(BenchError::io("tempdir"))?;
    let ctl = Controller::start_kubernetes(&ctx.bin, tmp.path(), cp.kubeconfig(), NS, "edge")?;
    let bind = bind_port(&client, NS).await?;
    wait_answering(&ips, bind, BASE_HOST, "/").await?;
    let base: BTreeSet<String> = (0..BASE_EPS).map(|k| scale_addr(k).to_string()).collect();
    let pids = match wait_serving(&pods, &backend("scale"), &base).await {
        Ok((_, pids)) => pids,
        Err(e) => {
            let name = pods.names().into_iter().next().unwrap_or_default();
            let state = match pods.pod(&name) {
                Some(p) => p.haproxy().worker_cmd("show servers state").await.unwrap_or_default(),
                None => String::new(),
            };
            return Err(BenchError::Unexpected(format!("{e}; {name}'s show servers state:\n{state:.4000}")));
        }
    };
    let fleet = Fleet { client: &client, pods: &pods, ips, bind, start_pids: pids };
    let mut wrong = Vec::new();
    let route_row = routes(ctx, &fleet, &mut wrong).await?;
    let mut scale_wrong = Vec::new();
    let scale_row = scale(ctx, &fleet, scale_port, &scale_ups, &mut scale_wrong).await?;
    drop(fleet);
    drop(ctl);
    drop(scale_ups);
    drop(web);
    drop(pods);
    drop(cp);
    let mut rows = vec![route_row.verified(&wrong)];
    rows.push(scale_row.verified(&scale_wrong));
    for r in &mut rows {
        r.add_note(format!(
            "controller --settle {SETTLE}, which also caps --endpoint-settle; slices hold 192.0.2.k (the apiserver refuses \
             loopback endpoints), which the bench's template writes as 127.0.0.k"
        ));
    }
    Ok(rows)
}

/// What both phases work on.
struct Fleet<'a> {
    client: &'a Client,
    pods: &'a LocalPods,
    /// The pods' addresses.
    ips: Vec<Ipv4Addr>,
    /// The Gateway listener's bind port on every pod.
    bind: u16,
    /// The pods' worker pids once the first render was deployed.
    start_pids: Vec<Option<u32>>,
}

/// A note on what p99 is for `n` samples.
fn p99_note(n: usize) -> String {
    if n < 100 {
        format!("p99 of {n} samples is their maximum")
    } else {
        String::new()
    }
}

/// One timed change per iteration and its floor: haptic's time, the same change made directly on
/// the pods, the bench's own watch delay for the change, and the floor (direct + delay).
#[derive(Default)]
struct Paired {
    haptic: Samples,
    direct: Samples,
    delay: Samples,
    floor: Samples,
}

impl Paired {
    /// Records one measured iteration: the change sent at `sent`, seen by the bench's watch at
    /// `seen` (never: `what` goes into `wrong`, no floor sample).
    fn push(
        &mut self,
        took: Duration,
        direct: Duration,
        sent: Instant,
        seen: Option<Instant>,
        what: String,
        wrong: &mut Vec<String>,
    ) {
        self.haptic.push_ms(took);
        self.direct.push_ms(direct);
        match seen {
            Some(at) => {
                let w = at.saturating_duration_since(sent);
                self.delay.push_ms(w);
                self.floor.push_ms(direct + w);
            }
            None => wrong.push(format!("{what}: the bench's watch never saw it")),
        }
    }
}

/// The route phase: routes created one by one, each timed to every pod's first 200 and its floor
/// measured right after; then every route's status and answers checked.
async fn routes(ctx: &Ctx, fleet: &Fleet<'_>, wrong: &mut Vec<String>) -> Result<Row> {
    let (client, pods, ips, bind, start_pids) =
        (fleet.client, fleet.pods, &fleet.ips, fleet.bind, &fleet.start_pids[..]);
    let count = if ctx.quick { 20 } else { 50 };
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), NS, &ApiResource::erase::<HttpRoute>(&()));
    let from = api.list(&ListParams::default().limit(1)).await.map_err(kerr("list HTTPRoutes"))?;
    let mut watch = VersionWatch::start(&api, "", &from.metadata.resource_version.unwrap_or_default()).await?;
    let mut p = Paired::default();
    let (mut entries, mut lost, mut reloads) = (0, 0, 0);
    for i in 0..ctx.warmup() + count {
        let (host, path) = (route_host(i), format!("/r{i}"));
        let before = maps(pods).await?;
        let t = Instant::now();
        let rv = apply(client, route(&format!("r{i}"), &host, &path, "web")).await?;
        let done = wait_answering(ips, bind, &host, &path).await?;
        let took = done - t;
        let pids = workers(pods).await?;
        if pids != start_pids {
            reloads += 1;
            wrong.push(format!("route {i}: worker pids {start_pids:?} -> {pids:?} (a reload)"));
        }
        let seen = watch.seen(&rv).await;
        let (adds, gone) = added(&before, &maps(pods).await?);
        let (floor_entries, fhost) = renamed(i, &adds)?;
        let d = direct_route(pods, ips, bind, &floor_entries, &fhost, &path).await?;
        if i >= ctx.warmup() {
            entries = adds.len();
            lost += gone;
            p.push(took, d, t, seen, format!("route {i}: resourceVersion {rv}"), wrong);
        }
    }
    drop(watch);
    // Every route: Accepted and ResolvedRefs by us, and answering on every pod.
    let total = ctx.warmup() + count;
    let deadline = Instant::now() + DEADLINE;
    for i in 0..total {
        loop {
            let r = api.get(&format!("r{i}")).await.map_err(kerr("get HTTPRoute"))?;
            let gen = r.metadata.generation;
            let ours = r.data["status"]["parents"].as_array().and_then(|ps| {
                ps.iter().find(|p| p["controllerName"] == GATEWAY_CONTROLLER).map(|p| p["conditions"].clone())
            });
            let ok = |t: &str| {
                ours.as_ref().and_then(Value::as_array).is_some_and(|cs| {
                    cs.iter()
                        .any(|c| c["type"] == t && c["status"] == "True" && c["observedGeneration"].as_i64() == gen)
                })
            };
            if ok("Accepted") && ok("ResolvedRefs") {
                break;
            }
            if Instant::now() > deadline {
                wrong.push(format!("HTTPRoute r{i}: no Accepted and ResolvedRefs True from us: {ours:?}"));
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for ip in ips {
            let a = get(*ip, bind, &route_host(i), &format!("/r{i}")).await;
            if !upstream_ok(&a) {
                wrong.push(format!("route {i}: {ip} answers {a:?} at the end"));
            }
        }
    }
    let pids = workers(pods).await?;
    if pids != start_pids {
        wrong.push(format!("routes: worker pids {start_pids:?} -> {pids:?} (a reload)"));
    }
    let n = pods.names().len();
    let mut r = Row::repeated(CASE, &format!("new route, {n} pods"), &ctx.label, &p.haptic, Some(&p.floor), "ms");
    r.add_note(format!(
        "{count} HTTPRoutes created one by one (after {} warm-up), each a new hostname and prefix to Service web (1 endpoint, \
         a 127.0.0.2 upstream) -> every pod answering it with the upstream's 200; {reloads} routes with a reload (worker pids of every pod \
         checked); \
         floor per route: its {entries} map additions (host, host id and rule renamed) by `add map` on every pod + one 200 from \
         every pod (p50 {:.2} ms) + the bench's watch delay (create sent -> Added event, p50 {:.2} ms){}; {}",
        ctx.warmup(),
        p.direct.p50().unwrap_or(f64::NAN),
        p.delay.p50().unwrap_or(f64::NAN),
        if lost > 0 { format!("; {lost} map entries went away during the routes") } else { String::new() },
        p99_note(p.haptic.len()),
    ));
    Ok(r)
}

/// The scale phase: Service `scale` grown from [`BASE_EPS`] by [`GROW`] ready endpoints, timed
/// to every pod serving them, its floor right after, traffic through every pod to each new
/// endpoint checked, then shrunk back (not timed).
async fn scale(ctx: &Ctx, fleet: &Fleet<'_>, port: u16, ups: &[Upstream], wrong: &mut Vec<String>) -> Result<Row> {
    let (client, pods, ips, bind, start_pids) =
        (fleet.client, fleet.pods, &fleet.ips, fleet.bind, &fleet.start_pids[..]);
    let be = backend("scale");
    let all: Vec<Ipv4Addr> = (0..BASE_EPS + GROW).map(scale_addr).collect();
    let want_all: BTreeSet<String> = all.iter().map(ToString::to_string).collect();
    let want_base: BTreeSet<String> = all[..BASE_EPS].iter().map(ToString::to_string).collect();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let current = slices.get("scale-1").await.map_err(kerr("get the slice"))?.metadata.resource_version;
    let mut watch = VersionWatch::start(&slices, "metadata.name=scale-1", &current.unwrap_or_default()).await?;
    let mut p = Paired::default();
    let (mut reloads, mut most) = (0, 0);
    for i in 0..ctx.warmup() + ctx.reps() {
        let t = Instant::now();
        let rv = apply(client, slice("scale", &all, port)).await?;
        let (done, pids) = wait_serving(pods, &be, &want_all).await?;
        let took = done - t;
        if pids != start_pids {
            reloads += 1;
            wrong.push(format!("scale {i}: worker pids {start_pids:?} -> {pids:?} (a reload)"));
        }
        let seen = watch.seen(&rv).await;
        let d = direct_scale(pods, &be, &all[BASE_EPS..], port).await?;
        // Traffic: through each pod, requests one after another until every new endpoint has
        // answered one (at most TRAFFIC_ROUNDS rounds of one request per endpoint).
        for ip in ips {
            let hits: Vec<u64> = ups.iter().map(Upstream::hits).collect();
            let reached = |ups: &[Upstream]| ups.iter().enumerate().skip(BASE_EPS).all(|(k, u)| u.hits() > hits[k]);
            let mut sent = 0;
            while !reached(ups) && sent < TRAFFIC_ROUNDS * all.len() {
                let a = get(*ip, bind, SCALE_HOST, "/").await;
                sent += 1;
                if !upstream_ok(&a) {
                    wrong.push(format!("scale {i}: {ip} answered {a:?}"));
                }
            }
            most = most.max(sent);
            for (k, u) in ups.iter().enumerate().skip(BASE_EPS) {
                if u.hits() == hits[k] {
                    let a = scale_addr(k).to_string();
                    let state = server_state(pods, *ip, &be, &a).await;
                    wrong.push(format!(
                        "scale {i}: none of {sent} requests through {ip} reached new endpoint {a} ({state})"
                    ));
                }
            }
        }
        apply(client, slice("scale", &all[..BASE_EPS], port)).await?;
        let (_, pids) = wait_serving(pods, &be, &want_base).await?;
        if pids != start_pids {
            reloads += 1;
            wrong.push(format!("scale {i} back: worker pids {start_pids:?} -> {pids:?} (a reload)"));
        }
        if i >= ctx.warmup() {
            p.push(took, d, t, seen, format!("scale {i}: resourceVersion {rv}"), wrong);
        }
    }
    drop(watch);
    let n = pods.names().len();
    let mut r =
        Row::repeated(CASE, &format!("scale +{GROW} ep, {n} pods"), &ctx.label, &p.haptic, Some(&p.floor), "ms");
    r.add_note(format!(
        "{} scale events (after {} warm-up): Service scale's EndpointSlice grown {BASE_EPS} -> {} ready endpoints (upstreams on \
         127.0.0.x) -> every pod serving them (show servers state), then requests one by one through every pod until each new endpoint \
         answered one (at most {most} requests needed through one pod; bound {}), \
         then shrunk back (not timed); {reloads} events with a reload (worker pids of every pod checked); floor per event: `set server addr` + `set \
         server state ready` for each new endpoint's server on every pod (p50 {:.2} ms) + the bench's watch delay (patch sent -> \
         Modified event, p50 {:.2} ms); {}",
        ctx.reps(),
        ctx.warmup(),
        BASE_EPS + GROW,
        TRAFFIC_ROUNDS * all.len(),
        p.direct.p50().unwrap_or(f64::NAN),
        p.delay.p50().unwrap_or(f64::NAN),
        p99_note(p.haptic.len()),
    ));
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(f: &str, k: &str, v: &str) -> Entry {
        (f.into(), k.into(), v.into())
    }

    #[test]
    fn added_entries_and_renamed_floor() {
        let mut before = Maps::new();
        before.insert("maps/hosts.map".into(), [("base.gw.bench@20000".into(), "h1".into())].into());
        let mut after = before.clone();
        after.get_mut("maps/hosts.map").unwrap().insert(("r7.gw.bench@20000".into(), "habc".into()));
        after.insert(
            "maps/paths_exact.map".into(),
            [("habc/r7".into(), "rxyz".into())].into_iter().collect::<BTreeSet<(String, String)>>(),
        );
        after.insert(
            "maps/rules.map".into(),
            [("rxyz".into(), "bench_web_http".into())].into_iter().collect::<BTreeSet<(String, String)>>(),
        );
        let (adds, lost) = added(&before, &after);
        assert_eq!(lost, 0);
        assert_eq!(adds.len(), 3);
        let (floor, host) = renamed(7, &adds).unwrap();
        assert_eq!(host, "f7.gw.bench");
        assert_eq!(
            floor,
            [
                e("maps/hosts.map", "f7.gw.bench@20000", "habcf"),
                e("maps/paths_exact.map", "habcf/r7", "rxyzf"),
                e("maps/rules.map", "rxyzf", "bench_web_http"),
            ]
        );
        // Without the route's host among the additions there is nothing to repeat.
        assert!(renamed(8, &adds).is_err());
    }

    #[test]
    fn endpoints_are_published_on_test_net() {
        assert_eq!(scale_addr(0), Ipv4Addr::new(127, 0, 0, 3));
        assert_eq!(published(scale_addr(2)), Ipv4Addr::new(192, 0, 2, 5));
        let t = template().unwrap();
        assert!(t.contains("replace(\"192.0.2.\", \"127.0.0.\")"), "{t}");
        assert!(t.contains("${POD_IP}"), "{t}");
    }
}
