//! Serving a GatewayClass end to end: a real kube-apiserver + etcd with the Gateway API v1.6.3
//! standard CRDs (from the Go module conformance/tools pins), HAProxy pods run for real by the
//! kubelet stand-in (`LocalPods`, HAProxy 2.6, 3.0, 3.2 and 3.4 as separate cases), the controller binary,
//! and Gateways, HTTPRoutes, Services and EndpointSlices created by the test.
//!
//! As in `ingress.rs`, endpoints are TEST-NET-1 addresses no request is routed to: HTTP checks
//! use answers that need no connection (503 from a backend without a usable server, 500 for a
//! missing backend, 404 when nothing matches, redirects), and what the pods serve is read from
//! their runtime API. Needs `scripts/install-k8s.sh` and Go (for the CRDs' module).

use haptic_controller::kubernetes::crd::HAProxyConfig;
use haptic_e2e::k8s::LocalPods;
use haptic_e2e::{on_each_version, HaproxyBin};
use haptic_render::gateway::GATEWAY_CONTROLLER;
use haptic_render::gateway_api::Gateway;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use kube::Client;
use serde_json::{json, Value};

mod common;

use common::kube::*;

async fn gateway_crds(c: &Client) {
    haptic_e2e::k8s::install_gateway_crds(c).await.unwrap_or_else(|e| panic!("{e}"));
}

fn service(name: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop"},
           "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
}

fn slice(service: &str, ips: &[&str]) -> Value {
    let eps: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{service}-1"), "namespace": "shop",
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps})
}

fn route(name: &str, rules: Value) -> Value {
    json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
           "metadata": {"name": name, "namespace": "shop"},
           "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["shop.example.com"], "rules": rules}})
}

/// The `status.parents[]` entry of ours on route `name`, once it has one.
async fn our_parent(c: &Client, name: &str) -> Value {
    let api: Api<haptic_render::gateway_api::HttpRoute> = Api::namespaced(c.clone(), "shop");
    eventually(&format!("our status on HTTPRoute {name}"), || async {
        let r = api.get(name).await.ok()?;
        let p = r.status?.parents.into_iter().find(|p| p.controller_name == GATEWAY_CONTROLLER)?;
        let gen = r.metadata.generation?;
        p.conditions.iter().all(|c| c.observed_generation == Some(gen)).then(|| serde_json::to_value(p).unwrap())
    })
    .await
}

fn cond<'a>(conds: &'a Value, type_: &str) -> &'a Value {
    conds.as_array().unwrap().iter().find(|c| c["type"] == type_).unwrap_or(&Value::Null)
}

/// The weights of `backend`'s servers in use, per pod (`show servers state`: field 2 the
/// backend, 5 the address, 8 the current weight).
async fn weights(pods: &LocalPods, backend: &str) -> Vec<Vec<(String, u32)>> {
    let mut out = Vec::new();
    for n in pods.names() {
        let text = pods.pod(&n).unwrap().haproxy().worker_cmd(&format!("show servers state {backend}")).await.unwrap();
        let mut w: Vec<(String, u32)> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(1) == Some(&backend) && f.get(4) != Some(&"127.0.0.1"))
                    .then(|| Some((f[4].to_string(), f.get(7)?.parse().ok()?)))
                    .flatten()
            })
            .collect();
        w.sort();
        out.push(w);
    }
    out
}

/// The route `shop` with the `/split` rule weighted `web` to `canary`, and rules for an empty
/// backend, a missing one and a redirect.
fn split(web: u32, canary: u32) -> Value {
    route(
        "shop",
        json!([
            {"matches": [{"path": {"type": "PathPrefix", "value": "/empty"}}],
             "backendRefs": [{"name": "empty", "port": 80}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/split"}}],
             "backendRefs": [{"name": "web", "port": 80, "weight": web}, {"name": "canary", "port": 80, "weight": canary}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/ghost"}}],
             "backendRefs": [{"name": "ghost", "port": 80}]},
            {"matches": [{"path": {"type": "PathPrefix", "value": "/old"}}],
             "filters": [{"type": "RequestRedirect", "requestRedirect": {"hostname": "new.example.com", "statusCode": 301}}]},
        ]),
    )
}

/// The template override, the GatewayClass, the Gateway, the Services and their slices, the
/// route and the HAProxyConfig serving the class with pods whose agents listen on `agent_port`.
async fn create_objects(c: &Client, agent_port: u16) {
    // Each local pod binds its own IP: the template override binds `${POD_IP}` on the bind
    // ports the translator hands out.
    let builtin = haptic_render::template::BUILTIN;
    let binds = "{% for b in f.binds %}    bind {{ b }}\n{% endfor %}";
    assert!(builtin.contains(binds));
    let own = haptic_e2e::k8s::gateway_api::POD_IP_BINDS;
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "edge-template", "namespace": "fleet"},
               "data": {"haproxy.cfg.j2": builtin.replace(binds, own)}}),
    )
    .await;
    apply(
        c,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "GatewayClass", "metadata": {"name": "haptic"},
               "spec": {"controllerName": GATEWAY_CONTROLLER}}),
    )
    .await;
    apply(
        c,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
               "metadata": {"name": "gw", "namespace": "shop"},
               "spec": {"gatewayClassName": "haptic", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}),
    )
    .await;
    for s in ["web", "canary", "empty"] {
        apply(c, service(s)).await;
    }
    apply(c, slice("web", &["192.0.2.1"])).await;
    apply(c, slice("canary", &["192.0.2.9"])).await;
    apply(c, split(90, 10)).await;
    apply(
        c,
        json!({"apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig",
        "metadata": {"name": "edge", "namespace": "fleet"},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "agent": {"port": agent_port},
            "render": {"gatewayClassName": "haptic", "serverSlots": 4,
                       "template": {"configMapKeyRef": {"name": "edge-template", "key": "haproxy.cfg.j2"}}},
        }}),
    )
    .await;
}

/// The class accepted; the Gateway programmed with its own Service's address; the route
/// accepted with ResolvedRefs False for the missing Service. Returns the listener's bind port.
async fn class_gateway_and_route_status(c: &Client) -> u16 {
    // The class is accepted, with its features.
    let classes: Api<haptic_render::gateway_api::GatewayClass> = Api::all(c.clone());
    let class = eventually("GatewayClass haptic Accepted", || async {
        let g = classes.get("haptic").await.ok()?;
        g.status.as_ref()?.conditions.iter().any(|c| c.type_ == "Accepted" && c.status == "True").then_some(g)
    })
    .await;
    assert_status_applied(&class.metadata);

    // The Gateway gets its own Service in the fleet's namespace, and its cluster IP as address.
    let services: Api<Service> = Api::namespaced(c.clone(), "fleet");
    let svc_name = haptic_render::gateway::service_name("shop", "gw");
    let svc = eventually("the Gateway's Service", || async { services.get(&svc_name).await.ok() }).await;
    let spec = svc.spec.clone().unwrap();
    let port = &spec.ports.as_ref().unwrap()[0];
    assert_eq!(port.port, 80);
    let bind = match port.target_port.clone().unwrap() {
        k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(p) => u16::try_from(p).unwrap(),
        other => panic!("target port {other:?}"),
    };
    assert_eq!(spec.selector.unwrap()["app.kubernetes.io/name"], "haproxy");
    let ip = spec.cluster_ip.unwrap();
    let gws: Api<kube::api::DynamicObject> =
        Api::namespaced_with(c.clone(), "shop", &kube::api::ApiResource::erase::<Gateway>(&()));
    let gw = eventually("Gateway gw Programmed with the Service's address", || async {
        let g = gws.get("gw").await.ok()?;
        let v = g.data;
        let programmed = cond(&v["status"]["conditions"], "Programmed")["status"] == "True";
        (programmed && v["status"]["addresses"][0]["value"] == ip.as_str()).then_some(v)
    })
    .await;
    assert_eq!(gw["status"]["listeners"][0]["attachedRoutes"], 1, "{gw}");
    assert_eq!(gw["status"]["listeners"][0]["supportedKinds"][0]["kind"], "HTTPRoute", "{gw}");

    // The route: Accepted, and ResolvedRefs False for the missing Service.
    let p = our_parent(c, "shop").await;
    assert_eq!(cond(&p["conditions"], "Accepted")["status"], "True", "{p}");
    assert_eq!(cond(&p["conditions"], "ResolvedRefs")["reason"], "BackendNotFound", "{p}");
    bind
}

/// The control plane with the Gateway API CRDs, namespaces `fleet` and `shop`, `pods` local
/// HAProxy pods, the objects of [`create_objects`] and the controller serving them.
async fn serving_fleet(bin: &HaproxyBin, pods: usize) -> (Env, LocalPods, Controller) {
    let e = env().await;
    let c = &e.client;
    gateway_crds(c).await;
    namespace(c, "fleet").await;
    namespace(c, "shop").await;
    put_secret(c, "fleet", PASSWORD).await;
    let mut local = LocalPods::new(c.clone(), local_opts("fleet", bin));
    local.create(pods).await.unwrap();
    create_objects(c, local.agent_port()).await;
    let ctl = Controller::start(&e.cp, "fleet", bin, "ctl-a", e.dir.path());
    (e, local, ctl)
}

on_each_version!(gateways_get_addresses_statuses_and_runtime_routes);

/// A Gateway with its own Service and address, routes with every status, 500 for a missing
/// backend, a weight shift and a path added at runtime, on 2 local pods.
async fn gateways_get_addresses_statuses_and_runtime_routes(bin: HaproxyBin) {
    let (e, pods, ctl) = serving_fleet(&bin, 2).await;
    let c = &e.client;
    let api: Api<HAProxyConfig> = Api::namespaced(c.clone(), "fleet");

    let bind = class_gateway_and_route_status(c).await;

    // Traffic on every pod's bind port.
    converged(&api, 2, None).await;
    answers(&pods, bind, "shop.example.com", "/empty/x", 503).await;
    assert_eq!(codes(&pods, bind, "shop.example.com", "/ghost").await, [500, 500], "a missing backend answers 500");
    assert_eq!(codes(&pods, bind, "shop.example.com", "/nothing").await, [404, 404]);
    assert_eq!(codes(&pods, bind, "shop.example.com", "/old/page").await, [301, 301]);

    // A weight shift is a runtime change of server weights.
    let s = converged(&api, 2, None).await;
    let plan = s["planId"].as_str().unwrap().to_string();
    let backend = "route_shop_shop_1";
    let before = weights(&pods, backend).await;
    assert_eq!(before[0], [("192.0.2.1".to_string(), 256), ("192.0.2.9".to_string(), 28)], "{before:?}");
    apply(c, split(10, 90)).await;
    let plan = runtime_change(&api, &pods, &plan, "a weight shift").await;
    let after = weights(&pods, backend).await;
    assert_eq!(after[0], [("192.0.2.1".to_string(), 28), ("192.0.2.9".to_string(), 256)], "{after:?}");

    // A path-only route added on the same host: maps only.
    apply(
        c,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "more", "namespace": "shop"},
               "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["shop.example.com"],
                        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/more"}}],
                                   "backendRefs": [{"name": "empty", "port": 80}]}]}}),
    )
    .await;
    let plan = runtime_change(&api, &pods, &plan, "a route added").await;
    assert_eq!(codes(&pods, bind, "shop.example.com", "/more").await, [503, 503]);
    let p = our_parent(c, "more").await;
    assert_eq!(cond(&p["conditions"], "ResolvedRefs")["status"], "True", "{p}");

    // A route to a Service the fleet has never served: a new backend section, added at runtime
    // on HAProxy 3.4 (`backend.add`: worker pids unchanged); one reload per pod before 3.4.
    apply(c, service("fresh")).await;
    apply(c, slice("fresh", &["192.0.2.5"])).await;
    apply(
        c,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "fresh", "namespace": "shop"},
               "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["fresh.example.com"],
                        "rules": [{"backendRefs": [{"name": "fresh", "port": 80}]}]}}),
    )
    .await;
    let what = "a route to a Service never served before";
    let plan = new_backend_change(&api, &pods, &plan, what, &bin).await;
    let fresh = weights(&pods, "shop_fresh_http").await;
    assert!(fresh.iter().all(|w| w.iter().any(|(a, _)| a == "192.0.2.5")), "{what}: {fresh:?}");

    // A route haptic cannot express is refused in its own status; the others keep serving.
    apply(
        c,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "HTTPRoute",
               "metadata": {"name": "regex", "namespace": "shop"},
               "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["shop.example.com"],
                        "rules": [{"matches": [{"path": {"type": "RegularExpression", "value": "/r.*"}}],
                                   "backendRefs": [{"name": "web", "port": 80}]}]}}),
    )
    .await;
    let p = our_parent(c, "regex").await;
    assert_eq!(cond(&p["conditions"], "Accepted")["status"], "False", "{p}");
    assert_eq!(cond(&p["conditions"], "Accepted")["reason"], "UnsupportedValue", "{p}");
    assert_eq!(codes(&pods, bind, "shop.example.com", "/more").await, [503, 503]);
    assert_eq!(codes(&pods, bind, "shop.example.com", "/regex").await, [404, 404]);
    assert_eq!(converged(&api, 2, None).await["planId"], plan.as_str(), "a refused route changes nothing");
    drop(ctl);
}

/// Patches Gateway `shop/gw`'s `spec.addresses`.
async fn ask_addresses(c: &Client, addresses: Value) {
    let gws: Api<kube::api::DynamicObject> =
        Api::namespaced_with(c.clone(), "shop", &kube::api::ApiResource::erase::<Gateway>(&()));
    let patch = json!({"spec": {"addresses": addresses}});
    gws.patch("gw", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
}

/// Gateway `shop/gw`'s status once its conditions say `wanted` (type → reason).
async fn gateway_with(c: &Client, what: &str, wanted: &[(&str, &str)]) -> Value {
    let gws: Api<kube::api::DynamicObject> =
        Api::namespaced_with(c.clone(), "shop", &kube::api::ApiResource::erase::<Gateway>(&()));
    eventually(what, || async {
        let o = gws.get("gw").await.ok()?;
        let (gen, v) = (json!(o.metadata.generation), o.data);
        let now = |t: &str| cond(&v["status"]["conditions"], t)["observedGeneration"] == gen;
        wanted.iter().all(|(t, r)| now(t) && cond(&v["status"]["conditions"], t)["reason"] == *r).then_some(v)
    })
    .await
}

/// Gateway `shop/gw`'s alias: an ExternalName Service `gw-gateway` in `shop` naming its Service
/// `svc_name`, with the Gateway's name label, owned by the Gateway. A tenant's own Service with
/// the name another Gateway's alias would take is left as it is.
async fn aliases_stand_for_gateways_but_never_over_a_tenants_service(c: &Client, svc_name: &str) {
    let shop: Api<Service> = Api::namespaced(c.clone(), "shop");
    let a = eventually("the alias of Gateway gw in shop", || async { shop.get("gw-gateway").await.ok() }).await;
    let spec = a.spec.clone().unwrap();
    assert_eq!(spec.type_.as_deref(), Some("ExternalName"));
    let target = spec.external_name.unwrap_or_default();
    assert!(target.starts_with(&format!("{svc_name}.fleet.svc.")), "{target}");
    assert_eq!(a.metadata.labels.clone().unwrap_or_default()["gateway.networking.k8s.io/gateway-name"], "gw");
    let gws: Api<kube::api::DynamicObject> =
        Api::namespaced_with(c.clone(), "shop", &kube::api::ApiResource::erase::<Gateway>(&()));
    let uid = gws.get("gw").await.unwrap().metadata.uid.unwrap();
    assert_eq!(a.metadata.owner_references.unwrap_or_default()[0].uid, uid);

    apply(
        c,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "gw2-gateway", "namespace": "shop"},
               "spec": {"selector": {"app": "mine"}, "ports": [{"port": 8080}]}}),
    )
    .await;
    apply(
        c,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
               "metadata": {"name": "gw2", "namespace": "shop"},
               "spec": {"gatewayClassName": "haptic", "listeners": [{"name": "http", "port": 80, "protocol": "HTTP"}]}}),
    )
    .await;
    // Its status comes after its Services were written.
    eventually("Gateway gw2 accepted", || async {
        let v = gws.get("gw2").await.ok()?.data;
        (cond(&v["status"]["conditions"], "Accepted")["status"] == "True").then_some(())
    })
    .await;
    let mine = shop.get("gw2-gateway").await.unwrap();
    assert!(mine.metadata.labels.unwrap_or_default().is_empty(), "a tenant's Service is left alone");
    let spec = mine.spec.unwrap();
    assert_eq!(spec.selector.unwrap()["app"], "mine");
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_get_aliases_and_static_addresses_that_never_cost_the_old_one_for_nothing() {
    let bin = haptic_e2e::bins::haproxy_bins().into_iter().last().expect("an HAProxy binary");
    let (e, _pods, ctl) = serving_fleet(&bin, 1).await;
    let c = &e.client;
    class_gateway_and_route_status(c).await;
    let services: Api<Service> = Api::namespaced(c.clone(), "fleet");
    let svc_name = haptic_render::gateway::service_name("shop", "gw");
    let cluster_ip = |s: Service| s.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    let before = cluster_ip(services.get(&svc_name).await.unwrap());
    aliases_stand_for_gateways_but_never_over_a_tenants_service(c, &svc_name).await;

    // A type no Service carries: not accepted; the Service keeps serving.
    ask_addresses(c, json!([{"type": "test/fake", "value": "x"}, {"value": "10.0.0.12"}])).await;
    gateway_with(c, "Gateway gw not accepted for its address type", &[("Accepted", "UnsupportedAddress")]).await;
    // An address outside the cluster's Service range first: the API server would refuse it,
    // so the Service is not recreated and keeps its address.
    ask_addresses(c, json!([{"value": "192.0.2.1"}, {"type": "IPAddress", "value": "10.0.0.12"}])).await;
    let g = gateway_with(
        c,
        "Gateway gw accepted, its address not usable",
        &[("Accepted", "Accepted"), ("Programmed", "AddressNotUsable")],
    )
    .await;
    assert_eq!(g["status"]["addresses"], json!([]), "{g}");
    assert_eq!(cluster_ip(services.get(&svc_name).await.unwrap()), before, "the Service is never deleted for nothing");

    // The address the cluster can give: the Service is created again with it.
    ask_addresses(c, json!([{"type": "IPAddress", "value": "10.0.0.12"}])).await;
    let g = gateway_with(c, "Gateway gw programmed with its static address", &[("Programmed", "Programmed")]).await;
    assert_eq!(g["status"]["addresses"], json!([{"type": "IPAddress", "value": "10.0.0.12"}]), "{g}");
    let svc = services.get(&svc_name).await.unwrap();
    assert_eq!(svc.metadata.annotations.clone().unwrap_or_default()["haptic.dev/static-address"], "10.0.0.12");
    assert_eq!(cluster_ip(svc), "10.0.0.12");

    // Asking for nothing again keeps the address the Service has (a cluster IP stays).
    ask_addresses(c, json!([])).await;
    let g = gateway_with(c, "Gateway gw programmed without a static address", &[("Programmed", "Programmed")]).await;
    assert_eq!(g["status"]["addresses"][0]["value"], "10.0.0.12", "{g}");
    drop(ctl);
}

/// `spec.render.namespaces` in Gateway mode: a controller serving `shop`, running as the chart's
/// ServiceAccount with the chart's RBAC for that scope (Roles in `shop` and `fleet`; a
/// ClusterRole for GatewayClasses and Namespaces only), programs `shop`'s Gateway and its route;
/// a Gateway and an HTTPRoute of a third namespace are never served (no Service made for them),
/// and the audit log shows nothing asked of that namespace, no namespaced kind read
/// cluster-wide, no request refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_scoped_to_one_namespace_serves_no_gateway_of_another() {
    let bin = haptic_e2e::bins::haproxy_bins().into_iter().last().expect("an HAProxy binary");
    let e = env_audited().await;
    let c = &e.client;
    gateway_crds(c).await;
    for ns in ["fleet", "shop", "other"] {
        namespace(c, ns).await;
    }
    let (sa, kubeconfig) =
        chart_rbac(&e, &["--set", "gateway.enabled=true", "--set", "render.namespaces={shop}"]).await;
    put_secret(c, "fleet", PASSWORD).await;
    let mut pods = LocalPods::new(c.clone(), local_opts("fleet", &bin));
    pods.create(1).await.unwrap();
    create_objects(c, pods.agent_port()).await;
    let api: Api<HAProxyConfig> = Api::namespaced(c.clone(), "fleet");
    let scoped = json!({"spec": {"render": {"namespaces": ["shop"]}}});
    api.patch("edge", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&scoped)).await.unwrap();
    apply(
        c,
        json!({"apiVersion": "gateway.networking.k8s.io/v1", "kind": "Gateway",
               "metadata": {"name": "intruder", "namespace": "other"},
               "spec": {"gatewayClassName": "haptic", "listeners": [{"name": "http", "port": 8081, "protocol": "HTTP"}]}}),
    )
    .await;
    let mut other_route = route("split", json!([{"backendRefs": [{"name": "web", "port": 80}]}]));
    other_route["metadata"]["namespace"] = json!("other");
    other_route["spec"]["parentRefs"] = json!([{"name": "intruder"}]);
    apply(c, other_route).await;

    let ctl = Controller::start_as(&kubeconfig, "fleet", &bin, "ctl-scoped", e.dir.path(), &[]);
    class_gateway_and_route_status(c).await;
    let services: Api<Service> = Api::namespaced(c.clone(), "fleet");
    let theirs = haptic_render::gateway::service_name("other", "intruder");
    assert!(services.get_opt(&theirs).await.unwrap().is_none(), "no Service for a Gateway outside the scope");
    let gws: Api<kube::api::DynamicObject> =
        Api::namespaced_with(c.clone(), "other", &kube::api::ApiResource::erase::<Gateway>(&()));
    let intruder = gws.get("intruder").await.unwrap().data;
    let conds = intruder["status"]["conditions"].as_array().cloned().unwrap_or_default();
    assert!(conds.iter().all(|c| c["reason"] == "Pending"), "never touched: {intruder}");

    let asked = audited_as(&e, &sa, ("shop", "httproutes"), "other");
    let cluster_kinds = [("gateway.networking.k8s.io", "gatewayclasses"), ("", "namespaces")];
    let wide: Vec<_> =
        asked.iter().filter(|a| a.namespace().is_none() && !cluster_read(&a.uri, &cluster_kinds)).collect();
    assert!(wide.is_empty(), "no namespaced kind read cluster-wide: {wide:#?}");
    drop(ctl);
}
