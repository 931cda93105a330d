//! Gateway API on a real cluster: the chart installed with `gateway.enabled=true` on a cluster
//! that has the Gateway API standard CRDs (`scripts/conformance.sh` applies them), a Gateway of
//! the chart's class with one HTTP listener, HTTPRoutes and busybox backends made here, traffic
//! through the Gateway's own Service (its `status.addresses`).
//!
//! Owns the Gateway steps: a backend scaled 2 → 10 → 2 under bounded load behind an HTTPRoute (0
//! failed requests, 0 reloads), a weight shift 90/10 → 10/90 between two backends (a runtime
//! change, the split measured over a bounded count of requests), an HTTPRoute refused in its own
//! status while the others keep serving (nothing deployed), and new HTTPRoutes timed from
//! creation to their first 200 (printed, with what they cost), TCP listeners whose
//! TCPRoute, retargeted to a Service another TCPRoute already uses, costs no reload, and the
//! Gateway's Service as a LoadBalancer (no address published until a provider gives one). It must never assert on timing,
//! send traffic anywhere but the Gateway's Service, nor leave its objects or the release behind
//! on success.

use std::time::{Duration, Instant};

use haptic_render::gateway_api::{Gateway, HttpRoute, TcpRoute};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch};
use serde_json::{json, Value};

use super::real::{RealCluster, NAMESPACE};
use super::real_ingress::{answered, changes_under_load, counters, current_plan, web, Cost};
use super::real_steps::{apply_params, ensure};
use super::{eventually, wait_converged, Cluster, ClusterError, Result};

/// The chart's GatewayClass (`gateway.className`).
const CLASS: &str = "haptic";
/// The Gateway the steps attach to: one HTTP listener on port 80.
const GATEWAY: &str = "gw";
/// The backend scaled under load, and the first of the weighted pair.
const APP_A: &str = "web-a";
/// The second of the weighted pair.
const APP_B: &str = "web-b";
const SCALE_HOST: &str = "scale.gw.example";
const SPLIT_HOST: &str = "split.gw.example";
/// Requests counted per weight split (sequential, each a new connection).
const SPLIT_REQUESTS: usize = 1000;
/// The TCP listeners' ports: `tcp` and `tcp2`.
const TCP_PORTS: [u16; 2] = [9000, 9001];
/// HTTPRoutes created one after another, each timed to its first 200.
const TIMED_ROUTES: usize = 20;
/// The controller name HTTPRoute parents carry for us.
const CONTROLLER_NAME: &str = haptic_render::gateway::GATEWAY_CONTROLLER;

fn ok(step: &str) {
    println!("ok real gateway: {step}");
}

fn gateways(c: &RealCluster) -> Api<DynamicObject> {
    Api::namespaced_with(c.client(), NAMESPACE, &ApiResource::erase::<Gateway>(&()))
}

fn routes(c: &RealCluster) -> Api<DynamicObject> {
    Api::namespaced_with(c.client(), NAMESPACE, &ApiResource::erase::<HttpRoute>(&()))
}

fn tcp_routes(c: &RealCluster) -> Api<DynamicObject> {
    Api::namespaced_with(c.client(), NAMESPACE, &ApiResource::erase::<TcpRoute>(&()))
}

/// [`GATEWAY`]: its HTTP listener, and the TCP ones when `tcp`.
fn gateway(tcp: bool) -> Value {
    let mut listeners = vec![json!({"name": "http", "protocol": "HTTP", "port": 80})];
    if tcp {
        listeners.push(json!({"name": "tcp", "protocol": "TCP", "port": TCP_PORTS[0]}));
        listeners.push(json!({"name": "tcp2", "protocol": "TCP", "port": TCP_PORTS[1]}));
    }
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway", "metadata": {"name": GATEWAY},
           "spec": {"gatewayClassName": CLASS, "listeners": listeners}})
}

/// TCPRoute `listener` on [`GATEWAY`]'s TCP listener of that name, to Service `to` port 80.
fn tcp_route_to(listener: &str, to: &str) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "TCPRoute", "metadata": {"name": listener},
           "spec": {"parentRefs": [{"name": GATEWAY, "sectionName": listener}],
                    "rules": [{"backendRefs": [{"name": to, "port": 80}]}]}})
}

async fn put(api: &Api<DynamicObject>, obj: Value) -> Result<()> {
    let name = obj["metadata"]["name"].as_str().unwrap_or_default().to_string();
    let kind = obj["kind"].as_str().unwrap_or_default().to_string();
    let obj: DynamicObject = serde_json::from_value(obj).map_err(|e| ClusterError::of(&format!("{kind} {name}"), e))?;
    api.patch(&name, &apply_params(), &Patch::Apply(&obj))
        .await
        .map_err(|e| ClusterError::of(&format!("apply {kind} {name}"), e))?;
    Ok(())
}

/// An HTTPRoute `name` for `host` on [`GATEWAY`] with one rule forwarding to `backends`
/// (Service, weight), port 80.
fn route(name: &str, host: &str, backends: &[(&str, u32)]) -> Value {
    let refs: Vec<Value> = backends.iter().map(|(svc, w)| json!({"name": svc, "port": 80, "weight": w})).collect();
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute", "metadata": {"name": name},
           "spec": {"parentRefs": [{"name": GATEWAY}], "hostnames": [host],
                    "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}], "backendRefs": refs}]}})
}

/// The condition `type_` of our parent in HTTPRoute `name`'s status, once it is there for the
/// route's current generation.
async fn route_condition(c: &RealCluster, name: &str, type_: &str) -> Result<Value> {
    let api = routes(c);
    eventually(
        &format!("HTTPRoute {name}'s {type_} condition from {CONTROLLER_NAME}"),
        Duration::from_secs(60),
        || async {
            let r = api.get(name).await.ok()?;
            let generation = r.metadata.generation?;
            let parents = r.data["status"]["parents"].as_array()?.clone();
            parents.into_iter().find(|p| p["controllerName"] == CONTROLLER_NAME).and_then(|p| {
                p["conditions"]
                    .as_array()?
                    .iter()
                    .find(|c| c["type"] == type_ && c["observedGeneration"] == generation)
                    .cloned()
            })
        },
    )
    .await
}

/// Runs the Gateway steps on `c`: installs the release with `gateway.enabled=true`, makes the
/// Gateway and backends, runs every step, and removes it all (the release too).
pub async fn run_gateway(c: &mut RealCluster) -> Result<()> {
    // No load-balancer provider on these clusters: the Gateways' Services are ClusterIP.
    c.install(&["gateway.enabled=true", "gateway.service.type=ClusterIP"])?;
    let client = c.client();
    let pods = c.haproxy_pods().await?.len();
    wait_converged(&client, NAMESPACE, pods, None).await?;
    web(c, APP_A, 2, &[APP_A]).await?;
    put(&gateways(c), gateway(false)).await?;
    let api = gateways(c);
    let ip = eventually("the Gateway's address and Programmed condition", Duration::from_secs(120), || async {
        let g = api.get(GATEWAY).await.ok()?;
        let programmed = g.data["status"]["conditions"]
            .as_array()?
            .iter()
            .any(|c| c["type"] == "Programmed" && c["status"] == "True");
        let ip = g.data["status"]["addresses"].as_array()?.first()?["value"].as_str()?.to_string();
        programmed.then_some(ip)
    })
    .await?;
    put(&routes(c), route("scale", SCALE_HOST, &[(APP_A, 1)])).await?;
    answered(c, &ip, SCALE_HOST, "/", |b| b.starts_with(APP_A)).await?;
    ok(&format!("chart with gateway.enabled=true; Gateway {GATEWAY} Programmed at {ip}; an HTTPRoute answers 200"));

    if let Err(e) = steps(c, &ip).await {
        return Err(ClusterError(format!("{e}\n{}", c.diagnostics().await)));
    }

    for r in ["scale", "split", "regex"] {
        let _ = routes(c).delete(r, &DeleteParams::default()).await;
    }
    for i in 0..TIMED_ROUTES {
        let _ = routes(c).delete(&format!("timed-{i}"), &DeleteParams::default()).await;
    }
    for r in ["tcp", "tcp2"] {
        let _ = tcp_routes(c).delete(r, &DeleteParams::default()).await;
    }
    let _ = gateways(c).delete(GATEWAY, &DeleteParams::default()).await;
    for app in [APP_A, APP_B] {
        let _ = Api::<Service>::namespaced(client.clone(), NAMESPACE).delete(app, &DeleteParams::default()).await;
        let _ = Api::<Deployment>::namespaced(client.clone(), NAMESPACE).delete(app, &DeleteParams::default()).await;
    }
    c.uninstall()?;
    ok("objects deleted, release uninstalled");
    Ok(())
}

/// The steps after the first route answers; a failure leaves the objects for the diagnostics.
async fn steps(c: &RealCluster, ip: &str) -> Result<()> {
    scale_behind_route(c, ip).await?;
    weight_shift(c, ip).await?;
    refused_route(c, ip).await?;
    timed_routes(c, ip).await?;
    // Through a node only (kind): the TCP listener is not reached from the host there.
    if c.is_routed() {
        tcp_route(c, ip).await?;
    }
    load_balancer_service(c).await?;
    Ok(())
}

/// The address a load-balancer provider publishes in this step (TEST-NET-1: nothing is sent to
/// it).
const LB_ADDRESS: &str = "192.0.2.10";

/// The Gateway's status: its first address and whether it is Programmed (with the reason).
async fn gateway_status(c: &RealCluster) -> Option<(Option<String>, bool, String)> {
    let g = gateways(c).get(GATEWAY).await.ok()?;
    let address = g.data["status"]["addresses"].as_array().and_then(|a| a.first()).and_then(|a| a["value"].as_str());
    let programmed = g.data["status"]["conditions"].as_array()?.iter().find(|c| c["type"] == "Programmed")?.clone();
    let reason = programmed["reason"].as_str().unwrap_or_default().to_string();
    Some((address.map(str::to_string), programmed["status"] == "True", reason))
}

/// `gateway.service.type=LoadBalancer` (the chart's default) on a cluster without a
/// load-balancer provider: the Gateway's Service becomes a LoadBalancer, and while no provider
/// has given it an address the Gateway publishes none (never the cluster IP) and is not
/// Programmed; once one does (this step writes the Service's `status.loadBalancer` as a provider
/// would), the Gateway publishes that address and is Programmed. Then back to ClusterIP.
async fn load_balancer_service(c: &RealCluster) -> Result<()> {
    c.install(&["gateway.enabled=true", "gateway.service.type=LoadBalancer"])?;
    let services: Api<Service> = Api::namespaced(c.client(), NAMESPACE);
    let owner = format!("{NAMESPACE}/{GATEWAY}");
    let name = eventually("the Gateway's Service of type LoadBalancer", Duration::from_secs(120), || async {
        let list =
            services.list(&kube::api::ListParams::default().labels("haptic.dev/gateway-service=true")).await.ok()?;
        list.items.into_iter().find_map(|s| {
            let ours = s.metadata.annotations.as_ref()?.values().any(|v| *v == owner);
            let lb = s.spec.as_ref()?.type_.as_deref() == Some("LoadBalancer");
            (ours && lb).then(|| s.metadata.name.clone().unwrap_or_default())
        })
    })
    .await?;
    eventually(
        "no address and Programmed False while the load balancer has none",
        Duration::from_secs(120),
        || async {
            match gateway_status(c).await? {
                (None, false, reason) if reason == "AddressNotAssigned" => Some(()),
                _ => None,
            }
        },
    )
    .await?;
    let provider = json!({"status": {"loadBalancer": {"ingress": [{"ip": LB_ADDRESS}]}}});
    services
        .patch_status(&name, &kube::api::PatchParams::default(), &Patch::Merge(&provider))
        .await
        .map_err(|e| ClusterError::of("write the Service's status.loadBalancer", e))?;
    eventually("the provider's address published and Programmed", Duration::from_secs(120), || async {
        match gateway_status(c).await? {
            (Some(a), true, _) if a == LB_ADDRESS => Some(()),
            _ => None,
        }
    })
    .await?;
    c.install(&["gateway.enabled=true", "gateway.service.type=ClusterIP"])?;
    ok(&format!(
        "gateway.service.type=LoadBalancer: Service {name} is a LoadBalancer; with no address from a provider the Gateway publishes none and is not Programmed (AddressNotAssigned); with {LB_ADDRESS} in the Service's status.loadBalancer it publishes {LB_ADDRESS} and is Programmed"
    ));
    Ok(())
}

/// Scale 2 → 10 → 2 under load behind an HTTPRoute: 0 failed requests, 0 reloads.
async fn scale_behind_route(c: &RealCluster, ip: &str) -> Result<()> {
    let changes = [("scale 2 -> 10", 10), ("scale 10 -> 2", 2)];
    let run = changes_under_load(c, ip, SCALE_HOST, APP_A, &changes).await?;
    run.cost.expect_reloads("scale 2 -> 10 -> 2 behind an HTTPRoute", 0.0)?;
    ok(&format!(
        "{APP_A} scaled 2 -> 10 -> 2 under load behind an HTTPRoute: {} requests, 0 failed, 0 reloads, worker pids unchanged",
        run.ok
    ));
    Ok(())
}

/// Of [`SPLIT_REQUESTS`] sequential requests for [`SPLIT_HOST`], how many [`APP_B`] answered.
async fn share_of_b(c: &RealCluster, ip: &str) -> Result<usize> {
    let mut b = 0;
    for _ in 0..SPLIT_REQUESTS {
        match c.service_get(ip, SPLIT_HOST, "/").await? {
            (200, body) if body.trim().starts_with(APP_B) => b += 1,
            (200, body) if body.trim().starts_with(APP_A) => {}
            other => return Err(ClusterError(format!("{SPLIT_HOST}: {other:?}"))),
        }
    }
    Ok(b)
}

/// Two backends behind one route at 90/10, then 10/90: the second split is a runtime change (0
/// reloads), and each split shows in [`SPLIT_REQUESTS`] requests within 5 points.
async fn weight_shift(c: &RealCluster, ip: &str) -> Result<()> {
    web(c, APP_B, 2, &[APP_B]).await?;
    let without = current_plan(c).await?;
    put(&routes(c), route("split", SPLIT_HOST, &[(APP_A, 90), (APP_B, 10)])).await?;
    answered(c, ip, SPLIT_HOST, "/", |b| b.starts_with(APP_A) || b.starts_with(APP_B)).await?;
    // One pod answering is not every pod serving: wait for the fleet on a plan after the one
    // without the route (a status still naming that one can say 2/2 converged).
    let pods = c.haproxy_pods().await?.len();
    wait_converged(&c.client(), NAMESPACE, pods, Some(&without)).await?;
    let before_b = share_of_b(c, ip).await?;
    let plan = current_plan(c).await?;
    let at = counters(c).await?;
    put(&routes(c), route("split", SPLIT_HOST, &[(APP_A, 10), (APP_B, 90)])).await?;
    wait_converged(&c.client(), NAMESPACE, pods, Some(&plan)).await?;
    let cost = Cost::of(&at, &counters(c).await?)?;
    let after_b = share_of_b(c, ip).await?;
    let pct = |n: usize| n as f64 * 100.0 / SPLIT_REQUESTS as f64;
    println!(
        "   {APP_B}'s share at 90/10: {:.1} %; at 10/90: {:.1} %; the shift: {}",
        pct(before_b),
        pct(after_b),
        cost.line()
    );
    ensure((5.0..=15.0).contains(&pct(before_b)) && (85.0..=95.0).contains(&pct(after_b)), || {
        format!("{APP_B} took {:.1} % at weight 10 and {:.1} % at weight 90", pct(before_b), pct(after_b))
    })?;
    cost.expect_reloads("a weight shift 90/10 -> 10/90", 0.0)?;
    ok(&format!(
        "weights 90/10 -> 10/90: {APP_B} took {:.1} % then {:.1} % of {SPLIT_REQUESTS} requests; the shift was runtime (0 reloads)",
        pct(before_b),
        pct(after_b)
    ));
    Ok(())
}

/// An HTTPRoute haptic cannot express (a RegularExpression path) is refused in its own status
/// (Accepted False, UnsupportedValue); the others keep serving and nothing is deployed.
async fn refused_route(c: &RealCluster, ip: &str) -> Result<()> {
    let plan = current_plan(c).await?;
    let at = counters(c).await?;
    let mut bad = route("regex", "regex.gw.example", &[(APP_A, 1)]);
    bad["spec"]["rules"][0]["matches"][0]["path"] = json!({"type": "RegularExpression", "value": "/r.*"});
    put(&routes(c), bad).await?;
    let accepted = route_condition(c, "regex", "Accepted").await?;
    ensure(accepted["status"] == "False" && accepted["reason"] == "UnsupportedValue", || {
        format!("the RegularExpression route's Accepted condition: {accepted}")
    })?;
    answered(c, ip, SCALE_HOST, "/", |b| b.starts_with(APP_A)).await?;
    ensure(current_plan(c).await? == plan, || "a refused HTTPRoute changed the plan".into())?;
    let cost = Cost::of(&at, &counters(c).await?)?;
    cost.expect_reloads("a refused HTTPRoute", 0.0)?;
    ok(&format!(
        "an HTTPRoute with a RegularExpression path is refused in its status (Accepted False, UnsupportedValue: {}); the others serve; nothing deployed",
        accepted["message"].as_str().unwrap_or_default()
    ));
    Ok(())
}

/// Waits until `expect` answers an HTTP request sent through the TCP listener on `port` (the
/// bytes pass as they are).
async fn through_tcp(ip: &str, port: u16, expect: &str) -> Result<()> {
    let addr: std::net::SocketAddr =
        format!("{ip}:{port}").parse().map_err(|e| ClusterError::of("the TCP listener's address", e))?;
    let req = "GET / HTTP/1.1\r\nHost: tcp.gw.example\r\nConnection: close\r\n\r\n";
    eventually(&format!("{expect} through the TCP listener on {port}"), Duration::from_secs(120), || async {
        let (code, body) = crate::net::http_request_within(addr, req, Duration::from_secs(5)).await.ok()?;
        (code == 200 && body.trim().starts_with(expect)).then_some(())
    })
    .await
}

/// Two TCP listeners (new bind ports: a reload) with a TCPRoute each, to [`APP_A`] and
/// [`APP_B`]; the first retargeted to [`APP_B`], whose `mode tcp` backend the second route
/// already brought, changes maps only: 0 reloads. (A Service no TLS or TCP route used yet brings
/// a new `mode tcp` backend, which HAProxy cannot add at runtime: a reload.)
async fn tcp_route(c: &RealCluster, ip: &str) -> Result<()> {
    put(&gateways(c), gateway(true)).await?;
    put(&tcp_routes(c), tcp_route_to("tcp", APP_A)).await?;
    put(&tcp_routes(c), tcp_route_to("tcp2", APP_B)).await?;
    through_tcp(ip, TCP_PORTS[0], APP_A).await?;
    through_tcp(ip, TCP_PORTS[1], APP_B).await?;
    let pods = c.haproxy_pods().await?.len();
    wait_converged(&c.client(), NAMESPACE, pods, None).await?;
    let plan = current_plan(c).await?;
    let at = counters(c).await?;
    put(&tcp_routes(c), tcp_route_to("tcp", APP_B)).await?;
    wait_converged(&c.client(), NAMESPACE, pods, Some(&plan)).await?;
    through_tcp(ip, TCP_PORTS[0], APP_B).await?;
    let cost = Cost::of(&at, &counters(c).await?)?;
    cost.expect_reloads("a TCPRoute retargeted", 0.0)?;
    ok(&format!("TCP listeners and TCPRoutes: {APP_A} answers; retargeted to {APP_B}: {}", cost.line()));
    Ok(())
}

/// [`TIMED_ROUTES`] new HTTPRoutes over an existing backend, one at a time, each timed from its
/// creation to its first 200 through the Gateway (polled every 10 ms for at most 60 s); prints
/// the median and the largest, and what they cost.
async fn timed_routes(c: &RealCluster, ip: &str) -> Result<()> {
    let at = counters(c).await?;
    let mut took = Vec::new();
    for i in 0..TIMED_ROUTES {
        let name = format!("timed-{i}");
        let host = format!("t{i}.gw.example");
        let t0 = Instant::now();
        put(&routes(c), route(&name, &host, &[(APP_A, 1)])).await?;
        loop {
            if let Ok((200, _)) = c.service_get(ip, &host, "/").await {
                break;
            }
            ensure(t0.elapsed() < Duration::from_secs(60), || format!("HTTPRoute {name}: no 200 within 60 s"))?;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        took.push(t0.elapsed().as_secs_f64() * 1000.0);
    }
    took.sort_by(f64::total_cmp);
    let cost = Cost::of(&at, &counters(c).await?)?;
    println!(
        "   HTTPRoute created -> first 200, {TIMED_ROUTES} routes: median {:.0} ms, largest {:.0} ms; {}",
        took[took.len() / 2],
        took[took.len() - 1],
        cost.line()
    );
    cost.expect_reloads("new HTTPRoutes over an existing backend", 0.0)?;
    ok(&format!(
        "{TIMED_ROUTES} new HTTPRoutes each answered 200 (median {:.0} ms, largest {:.0} ms after creation), 0 reloads",
        took[took.len() / 2],
        took[took.len() - 1]
    ));
    Ok(())
}
