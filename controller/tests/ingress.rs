//! Render mode end to end: a real kube-apiserver + etcd, HAProxy pods run for real by the kubelet
//! stand-in (`LocalPods`, HAProxy 2.6, 3.0, 3.2 and 3.4 as separate cases), the controller binary, and
//! Services, EndpointSlices and Ingresses created by the test. Needs `scripts/install-k8s.sh`.
//!
//! The apiserver refuses EndpointSlice addresses in 127.0.0.0/8, and traffic here stays on
//! loopback, so endpoints are TEST-NET-1 addresses (192.0.2.0/24) that no request is ever routed
//! to: what the pods serve is read from each HAProxy's runtime API (`show servers state`,
//! `show map`), and HTTP checks use routes that answer without a connection (503 from a backend
//! without a usable server, 404 when nothing matches). A real 200 through a rendered route is
//! `haptic-render`'s `tests/routing.rs` and the real-cluster scenario.

use std::collections::BTreeSet;

use haptic_controller::kubernetes::crd::HAProxyConfig;
use haptic_e2e::k8s::LocalPods;
use haptic_e2e::{free_port, on_each_version, HaproxyBin};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::networking::v1::Ingress;
use kube::api::{Api, ListParams};
use kube::Client;
use serde_json::{json, Value};

mod common;

use common::kube::*;

fn service(name: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": name, "namespace": "shop"},
           "spec": {"ports": [{"name": "http", "port": 80, "targetPort": 8080}]}})
}

fn slice(service: &str, ips: &[&str]) -> serde_json::Value {
    let eps: Vec<_> = ips.iter().map(|ip| json!({"addresses": [ip], "conditions": {"ready": true}})).collect();
    json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": format!("{service}-1"), "namespace": "shop",
                        "labels": {"kubernetes.io/service-name": service}},
           "addressType": "IPv4", "ports": [{"name": "http", "port": 8080}], "endpoints": eps})
}

/// An Ingress `name` on `host` with `(path, service)` Prefix paths to port `http`.
fn ingress(name: &str, host: &str, paths: &[(&str, &str)], port: serde_json::Value) -> serde_json::Value {
    let paths: Vec<_> = paths
        .iter()
        .map(|(p, s)| json!({"path": p, "pathType": "Prefix", "backend": {"service": {"name": s, "port": port}}}))
        .collect();
    json!({"apiVersion": "networking.k8s.io/v1", "kind": "Ingress", "metadata": {"name": name, "namespace": "shop"},
           "spec": {"ingressClassName": "haptic", "rules": [{"host": host, "http": {"paths": paths}}]}})
}

/// The addresses of `backend`'s servers that are not in maintenance, per pod (HAProxy's own
/// `show servers state`: field 2 is the backend, 5 the address, 7 the admin state, whose
/// maintenance bits are 0x01 forced, 0x02 inherited and 0x20 resolution; 0x04 only remembers
/// `disabled` in the config). `None` while a pod's runtime API does not answer (a reload).
async fn live_servers(pods: &LocalPods, backend: &str) -> Option<Vec<BTreeSet<String>>> {
    let mut out = Vec::new();
    for n in pods.names() {
        let text = pods.pod(&n).unwrap().haproxy().worker_cmd(&format!("show servers state {backend}")).await.ok()?;
        let live = text
            .lines()
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                let admin: u32 = f.get(6)?.parse().ok()?;
                (f.get(1) == Some(&backend) && admin & 0x23 == 0).then(|| f[4].to_string())
            })
            .collect();
        out.push(live);
    }
    Some(out)
}

/// Waits until every pod serves exactly `addrs` (`ip:port`) in `backend`.
async fn serving(pods: &LocalPods, backend: &str, addrs: &[&str]) {
    let want: BTreeSet<String> = addrs.iter().map(|a| a.split(':').next().unwrap().to_string()).collect();
    let what = format!("{backend} serving {addrs:?} on every pod");
    let r = haptic_e2e::cluster::eventually(&what, DEADLINE, || async {
        live_servers(pods, backend).await?.iter().all(|s| *s == want).then_some(())
    })
    .await;
    if let Err(e) = r {
        let n = &pods.names()[0];
        let text = pods.pod(n).unwrap().haproxy().worker_cmd(&format!("show servers state {backend}")).await;
        panic!("{e}; {n}: {text:?}");
    }
}

/// The backend HAProxy's maps send the prefix key `key` (`<host id><path>/`) to, per pod.
async fn routed_to(pods: &LocalPods, key: &str) -> Vec<String> {
    // `show map` lines are `<ref> <key> <value>`.
    let find = |text: &str, k: &str| {
        text.lines().find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(1) == Some(&k)).then(|| f.get(2).copied().unwrap_or_default().to_string())
        })
    };
    let mut out = Vec::new();
    for n in pods.names() {
        let h = pods.pod(&n).unwrap().haproxy();
        let rule = find(&h.worker_cmd("show map maps/paths_prefix.map").await.unwrap(), key).unwrap_or_default();
        out.push(find(&h.worker_cmd("show map maps/rules.map").await.unwrap(), &rule).unwrap_or_default());
    }
    out
}

/// One run of the Ingress story: the client, the HAProxyConfig, the pods and the frontend port.
#[derive(Clone, Copy)]
struct Story<'a> {
    c: &'a Client,
    api: &'a Api<HAProxyConfig>,
    pods: &'a LocalPods,
    fe: u16,
}

/// The template override binding each pod's IP on `fe`, the Service in front of the fleet, the
/// IngressClass, the backends, the Ingress `shop` (its ports by `by_name`) and the HAProxyConfig
/// rendering the class for pods whose agents listen on `agent_port`.
async fn create_objects(c: &Client, fe: u16, agent_port: u16, by_name: &Value) {
    // Each local pod binds its own IP: the template override binds `${POD_IP}`.
    let builtin = haptic_render::template::BUILTIN;
    let binds = "{% for b in f.binds %}    bind {{ b }}\n{% endfor %}";
    assert!(builtin.contains(binds));
    let template = builtin.replace(binds, &format!("    bind \"${{POD_IP}}:{fe}\"\n"));
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "edge-template", "namespace": "fleet"},
                    "data": {"haproxy.cfg.j2": template}}),
    )
    .await;
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "edge-haproxy", "namespace": "fleet"},
                    "spec": {"ports": [{"name": "http", "port": 80, "targetPort": fe}]}}),
    )
    .await;
    apply(
        c,
        json!({"apiVersion": "networking.k8s.io/v1", "kind": "IngressClass", "metadata": {"name": "haptic"},
                    "spec": {"controller": "haptic.dev/ingress-controller"}}),
    )
    .await;
    apply(c, service("web")).await;
    apply(c, service("empty")).await;
    apply(c, slice("web", &["192.0.2.1"])).await;
    apply(c, ingress("shop", "shop.example.com", &[("/web", "web"), ("/v1", "empty")], by_name.clone())).await;
    apply(
        c,
        json!({"apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig",
        "metadata": {"name": "edge", "namespace": "fleet"},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "agent": {"port": agent_port},
            "render": {"ingressClassName": "haptic", "publishService": {"name": "edge-haproxy"}, "serverSlots": 4,
                       "template": {"configMapKeyRef": {"name": "edge-template", "key": "haproxy.cfg.j2"}}},
        }}),
    )
    .await;
}

/// The fleet serves the routes, and the Ingress names the Service in front of the fleet.
/// Returns the plan deployed.
async fn serves_and_publishes(st: &Story<'_>) -> String {
    let Story { c, api, pods, fe } = *st;
    let s = converged(api, 2, None).await;
    let plan = s["planId"].as_str().unwrap().to_string();
    serving(pods, "shop_web_http", &["192.0.2.1:8080"]).await;
    answers(pods, fe, "shop.example.com", "/v1/x", 503).await;
    answers(pods, fe, "shop.example.com", "/new", 404).await;
    assert_eq!(routed_to(pods, &format!("{}/v1/", shop_host_id())).await, ["shop_empty_http", "shop_empty_http"]);
    let cluster_ip = Api::<Service>::namespaced(c.clone(), "fleet")
        .get("edge-haproxy")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let ings: Api<Ingress> = Api::namespaced(c.clone(), "shop");
    let ing = eventually("status.loadBalancer on Ingress shop", || async {
        let i = ings.get("shop").await.ok()?;
        let ip = i.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.clone()?;
        (ip == cluster_ip).then_some(i)
    })
    .await;
    assert_status_applied(&ing.metadata);
    plan
}

/// EndpointSlice changes are runtime server changes; a path added, retargeted and removed
/// changes maps only, and a Service's backend stays, parked, while no path leads to it.
async fn runtime_churn(st: &Story<'_>, mut plan: String) -> String {
    let Story { c, api, pods, fe } = *st;
    apply(c, slice("web", &["192.0.2.1", "192.0.2.2"])).await;
    plan = runtime_change(api, pods, &plan, "an endpoint added").await;
    serving(pods, "shop_web_http", &["192.0.2.1:8080", "192.0.2.2:8080"]).await;
    apply(c, slice("web", &["192.0.2.2"])).await;
    plan = runtime_change(api, pods, &plan, "an endpoint removed").await;
    serving(pods, "shop_web_http", &["192.0.2.2:8080"]).await;

    // A path added, retargeted and removed: maps only.
    let paths = |p: &[(&str, &str)]| ingress("shop", "shop.example.com", p, json!({"name": "http"}));
    apply(c, paths(&[("/web", "web"), ("/v1", "empty"), ("/new", "empty")])).await;
    plan = runtime_change(api, pods, &plan, "a path added").await;
    answers(pods, fe, "shop.example.com", "/new/x", 503).await;
    apply(c, paths(&[("/web", "web"), ("/v1", "gone"), ("/new", "empty")])).await;
    plan = runtime_change(api, pods, &plan, "a path retargeted").await;
    assert_eq!(routed_to(pods, &format!("{}/v1/", shop_host_id())).await, ["haptic_unavailable", "haptic_unavailable"]);
    apply(c, paths(&[("/web", "web"), ("/new", "empty")])).await;
    plan = runtime_change(api, pods, &plan, "a path removed").await;
    answers(pods, fe, "shop.example.com", "/v1/x", 404).await;
    answers(pods, fe, "shop.example.com", "/new/x", 503).await;
    // The last path to a Service removed, then added back: its backend stays, parked.
    apply(c, paths(&[("/web", "web")])).await;
    plan = runtime_change(api, pods, &plan, "the last path to a Service removed").await;
    answers(pods, fe, "shop.example.com", "/new/x", 404).await;
    apply(c, paths(&[("/web", "web"), ("/new", "empty")])).await;
    plan = runtime_change(api, pods, &plan, "the last path to a Service added back").await;
    answers(pods, fe, "shop.example.com", "/new/x", 503).await;
    plan
}

/// A path to a Service the fleet has never served: a new backend section. HAProxy 3.4 adds it
/// at runtime (`backend.add`: worker pids unchanged); before 3.4 it costs each pod one reload.
async fn a_new_service(st: &Story<'_>, plan: String, bin: &HaproxyBin) {
    let Story { c, api, pods, fe } = *st;
    apply(c, service("fresh")).await;
    apply(c, slice("fresh", &["192.0.2.5"])).await;
    let paths = [("/web", "web"), ("/new", "empty"), ("/fresh", "fresh")];
    apply(c, ingress("shop", "shop.example.com", &paths, json!({"name": "http"}))).await;
    let what = "a path to a Service never served before";
    new_backend_change(api, pods, &plan, what, bin).await;
    serving(pods, "shop_fresh_http", &["192.0.2.5:8080"]).await;
    let key = format!("{}/fresh/", shop_host_id());
    assert_eq!(routed_to(pods, &key).await, ["shop_fresh_http", "shop_fresh_http"], "{}", bin.label());
    answers(pods, fe, "shop.example.com", "/new/x", 503).await;
}

/// A refused Ingress gets a Warning Event naming the field; one created after it serves.
async fn refused_ingress(st: &Story<'_>, by_name: Value) {
    let Story { c, pods, fe, .. } = *st;
    apply(c, ingress("bad", "bad.example.com", &[("/", "empty")], json!({"number": 81}))).await;
    let events: Api<Event> = Api::namespaced(c.clone(), "shop");
    let ev = eventually("a Warning Event on Ingress bad", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("bad") && e.type_.as_deref() == Some("Warning")
        })
    })
    .await;
    assert_eq!(ev.reason.as_deref(), Some("IngressRefused"));
    let note = ev.note.unwrap_or_default();
    assert!(note.contains("spec.rules[0].http.paths[0].backend.service.port") && note.contains("no port 81"), "{note}");
    assert!(ev.regarding.unwrap().uid.is_some_and(|u| !u.is_empty()), "kubectl describe finds it by UID");
    answers(pods, fe, "other.example.com", "/", 404).await;
    apply(c, ingress("other", "other.example.com", &[("/", "empty")], by_name)).await;
    answers(pods, fe, "other.example.com", "/", 503).await;
    answers(pods, fe, "bad.example.com", "/", 404).await;
}

/// One tenant's certificate whose key is another certificate's, arriving together with an
/// endpoint change: the pair is refused before the render reaches the gate, in its own
/// Ingress's Event, and the endpoint change and another new Ingress deploy.
async fn mismatched_certificate(st: &Story<'_>) {
    let Story { c, api, pods, fe } = *st;
    let events: Api<Event> = Api::namespaced(c.clone(), "shop");
    apply(c, service("secure")).await;
    apply(c, slice("secure", &["192.0.2.3"])).await;
    let (site, other) = (
        rcgen::generate_simple_self_signed(vec!["secure.example.com".into()]).unwrap(),
        rcgen::generate_simple_self_signed(vec!["other.example.com".into()]).unwrap(),
    );
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "mismatched", "namespace": "shop"},
               "stringData": {"tls.crt": site.cert.pem(), "tls.key": other.signing_key.serialize_pem()}}),
    )
    .await;
    let mut tls_site = ingress("tls-site", "secure.example.com", &[("/", "secure")], json!({"name": "http"}));
    tls_site["spec"]["tls"] = json!([{"hosts": ["secure.example.com"], "secretName": "mismatched"}]);
    apply(c, tls_site).await;
    apply(c, slice("web", &["192.0.2.2", "192.0.2.4"])).await;
    apply(c, ingress("after", "after.example.com", &[("/", "empty")], json!({"name": "http"}))).await;
    serving(pods, "shop_web_http", &["192.0.2.2:8080", "192.0.2.4:8080"]).await;
    answers(pods, fe, "after.example.com", "/", 503).await;
    let ev = eventually("an Event on Ingress tls-site saying its Secret's key does not match", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("tls-site")
                && e.reason.as_deref() == Some("IngressRefused")
        })
    })
    .await;
    let note = ev.note.unwrap_or_default();
    assert!(note.contains("spec.tls[0].secretName") && note.contains("does not match"), "{note}");
    converged(api, 2, None).await;
}

/// A TLS Ingress whose certificate expires at a known time: the live controller's
/// `haptic_certificate_expiry_timestamp_seconds` for its Secret says that time.
async fn certificate_expiry_on_metrics(st: &Story<'_>, ctl: &Controller) {
    let Story { c, pods, fe, .. } = *st;
    let mut params = rcgen::CertificateParams::new(vec!["dated.example.com".to_string()]).unwrap();
    params.not_after = rcgen::date_time_ymd(2031, 1, 2);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "dated", "namespace": "shop"},
               "stringData": {"tls.crt": cert.pem(), "tls.key": key.serialize_pem()}}),
    )
    .await;
    let mut dated = ingress("dated", "dated.example.com", &[("/", "empty")], json!({"name": "http"}));
    dated["spec"]["tls"] = json!([{"hosts": ["dated.example.com"], "secretName": "dated"}]);
    apply(c, dated).await;
    // Served: plain HTTP to a TLS host is redirected to HTTPS.
    answers(pods, fe, "dated.example.com", "/", 308).await;
    let line = "haptic_certificate_expiry_timestamp_seconds{secret_namespace=\"shop\",secret=\"dated\"}";
    let want = params.not_after.unix_timestamp() as f64;
    let got = eventually("the certificate's expiry on the controller's /metrics", || async {
        let v = ctl.metric(line).await;
        (v == want).then_some(v)
    })
    .await;
    assert_eq!(got, 1_925_078_400.0, "2031-01-02T00:00:00Z");
}

on_each_version!(ingresses_route_and_change_at_runtime);

/// Routes, endpoint churn, path churn, status, a refused Ingress, and a mismatched certificate
/// refused in its Ingress's status while a concurrent endpoint change deploys, on 2 local pods.
async fn ingresses_route_and_change_at_runtime(bin: HaproxyBin) {
    let e = env().await;
    let c = &e.client;
    namespace(c, "fleet").await;
    namespace(c, "shop").await;
    put_secret(c, "fleet", PASSWORD).await;
    let mut pods = LocalPods::new(c.clone(), local_opts("fleet", &bin));
    pods.create(2).await.unwrap();
    let fe = free_port();
    let by_name = json!({"name": "http"});
    create_objects(c, fe, pods.agent_port(), &by_name).await;
    let api: Api<HAProxyConfig> = Api::namespaced(c.clone(), "fleet");
    let ctl = Controller::start(&e.cp, "fleet", &bin, "ctl-a", e.dir.path());
    let st = Story { c, api: &api, pods: &pods, fe };
    let plan = serves_and_publishes(&st).await;
    let plan = runtime_churn(&st, plan).await;
    a_new_service(&st, plan, &bin).await;
    refused_ingress(&st, by_name).await;
    // The controller's /metrics: the spec renders, with the refused Ingress's refusal counted.
    eventually("haptic_render_valid and haptic_render_refusals", || async {
        let valid = ctl.metric("haptic_render_valid{config=\"edge\"}").await;
        let refused = ctl.metric("haptic_render_refusals{kind=\"Ingress\",cause=\"Invalid\"}").await;
        (valid == 1.0 && refused >= 1.0).then_some(())
    })
    .await;
    mismatched_certificate(&st).await;
    certificate_expiry_on_metrics(&st, &ctl).await;
    drop(ctl);
}

/// The map id of the host `shop.example.com`.
fn shop_host_id() -> String {
    let host = haptic_render::model::HostMatch::Exact("shop.example.com".into());
    haptic_render::ingress::host_id(&host, &Default::default())
}

/// `spec.render.namespaces`: a controller serving `shop` and `team-b`, running as the chart's
/// ServiceAccount with the chart's RBAC for that scope (Roles in `shop`, `team-b` and its own
/// `fleet`; a ClusterRole that reads IngressClasses and nothing else), serves both namespaces'
/// Ingresses and never a third's; the apiserver's audit log shows it never asked anything of the
/// third namespace, never listed or watched a namespaced kind cluster-wide, and was never refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_controller_scoped_to_two_namespaces_reads_nothing_of_a_third() {
    let bin = haptic_e2e::bins::haproxy_bins().into_iter().last().expect("an HAProxy binary");
    let e = env_audited().await;
    let c = &e.client;
    for ns in ["fleet", "shop", "team-b", "other"] {
        namespace(c, ns).await;
    }
    let scope = ["--set", "ingress.enabled=true", "--set", "render.namespaces={shop,team-b}"];
    let (sa, kubeconfig) = chart_rbac(&e, &scope).await;

    put_secret(c, "fleet", PASSWORD).await;
    let mut pods = LocalPods::new(c.clone(), local_opts("fleet", &bin));
    pods.create(2).await.unwrap();
    let fe = free_port();
    create_objects(c, fe, pods.agent_port(), &json!({"name": "http"})).await;
    let api: Api<HAProxyConfig> = Api::namespaced(c.clone(), "fleet");
    let scoped = json!({"spec": {"render": {"namespaces": ["shop", "team-b"]}}});
    api.patch("edge", &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&scoped)).await.unwrap();
    // team-b: an Ingress to a Service without endpoints (503). other: a Service with an
    // endpoint, a TLS Secret and an Ingress naming both, none of which may be read.
    let in_ns = |mut o: Value, ns: &str| {
        o["metadata"]["namespace"] = json!(ns);
        o
    };
    apply(c, in_ns(service("empty"), "team-b")).await;
    apply(c, in_ns(ingress("b", "b.example.com", &[("/", "empty")], json!({"name": "http"})), "team-b")).await;
    let cert = rcgen::generate_simple_self_signed(vec!["other.example.com".into()]).unwrap();
    apply(
        c,
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
               "metadata": {"name": "other-tls", "namespace": "other"},
               "stringData": {"tls.crt": cert.cert.pem(), "tls.key": cert.signing_key.serialize_pem()}}),
    )
    .await;
    apply(c, in_ns(service("web"), "other")).await;
    apply(c, in_ns(slice("web", &["192.0.2.9"]), "other")).await;
    let mut intruder =
        in_ns(ingress("intruder", "other.example.com", &[("/", "web")], json!({"name": "http"})), "other");
    intruder["spec"]["tls"] = json!([{"hosts": ["other.example.com"], "secretName": "other-tls"}]);
    apply(c, intruder).await;

    let ctl = Controller::start_as(&kubeconfig, "fleet", &bin, "ctl-scoped", e.dir.path(), &[]);
    converged(&api, 2, None).await;
    serving(&pods, "shop_web_http", &["192.0.2.1:8080"]).await;
    answers(&pods, fe, "shop.example.com", "/v1/x", 503).await;
    answers(&pods, fe, "b.example.com", "/", 503).await;
    answers(&pods, fe, "other.example.com", "/", 404).await;
    eventually("status.loadBalancer on Ingress b (team-b)", || async {
        let i = Api::<Ingress>::namespaced(c.clone(), "team-b").get("b").await.ok()?;
        i.status?.load_balancer?.ingress?.first()?.ip.clone()
    })
    .await;
    let other = Api::<Ingress>::namespaced(c.clone(), "other").get("intruder").await.unwrap();
    assert!(other.status.and_then(|s| s.load_balancer?.ingress).is_none_or(|i| i.is_empty()), "never touched");

    let asked = audited_as(&e, &sa, ("team-b", "ingresses"), "other");
    let wide: Vec<_> = asked
        .iter()
        .filter(|a| a.namespace().is_none() && !cluster_read(&a.uri, &[("networking.k8s.io", "ingressclasses")]))
        .collect();
    assert!(wide.is_empty(), "no namespaced kind read cluster-wide: {wide:#?}");
    drop(ctl);
}
