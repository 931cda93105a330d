//! Kubernetes mode end to end: a real kube-apiserver + etcd (`ControlPlane`), HAProxy pods run
//! for real by the kubelet stand-in (`LocalPods`, HAProxy 2.6, 3.0, 3.2 and 3.4), and the controller
//! binary in `run --kubernetes` as a separate process. Needs `scripts/install-k8s.sh`.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;

use haptic_controller::kubernetes::crd::HAProxyConfig;
use haptic_e2e::k8s::{Container, LocalPods, LocalPodsOpts};
use haptic_e2e::pod::AgentClient;
use haptic_e2e::{free_port, http_get, on_each_version, HaproxyBin};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

mod common;

use common::kube::*;

fn cfg_text(fe: u16, body: &str, server_port: u16, broken: bool) -> String {
    format!(
        "global\n    default-path config\n\n\
         defaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n\
         frontend fe_main\n    bind \"${{POD_IP}}:{fe}\"\n\
         \x20   http-request return status 200 content-type text/plain string \"{body}\" if {{ path /hello }}\n\
         \x20   http-request return status 200 content-type text/plain lf-string \"%[req.hdr(host),lower,map(maps/hosts.map,none)]\" if {{ path /route }}\n\
         {}\
         \x20   default_backend be_app\n\n\
         backend be_app\n    balance roundrobin\n    server s1 127.0.0.1:{server_port} weight 10\n",
        if broken { "    bogus-directive here\n" } else { "" }
    )
}

async fn put_configmap(client: &Client, ns: &str, name: &str, data: BTreeMap<&str, String>) {
    let api: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data});
    api.patch(name, &PatchParams::apply("haptic-test").force(), &Patch::Apply(&cm)).await.unwrap();
}

/// The ConfigMap `edge-cfg` with `haproxy.cfg` and a one-entry `hosts.map`.
async fn put_cfg(client: &Client, ns: &str, cfg: String) {
    put_configmap(
        client,
        ns,
        "edge-cfg",
        BTreeMap::from([("haproxy.cfg", cfg), ("hosts.map", "a.example be_a\n".into())]),
    )
    .await;
}

/// `spec.files` with the map from `edge-cfg`.
fn map_file() -> serde_json::Value {
    json!([{"path": "maps/hosts.map", "configMapKeyRef": {"name": "edge-cfg", "key": "hosts.map"}}])
}

async fn pod_state(pods: &LocalPods, name: &str) -> serde_json::Value {
    let addr: SocketAddr = pods.agent_url(name).unwrap().trim_start_matches("http://").parse().unwrap();
    let (code, body) = AgentClient { addr, auth: Some((USER.into(), PASSWORD.into())) }.get("/v1/state").await.unwrap();
    assert_eq!(code, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

async fn create_config(client: &Client, ns: &str, agent_port: u16, files: serde_json::Value) -> Api<HAProxyConfig> {
    let api: Api<HAProxyConfig> = Api::namespaced(client.clone(), ns);
    let obj: HAProxyConfig = serde_json::from_value(json!({
        "apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig",
        "metadata": {"name": "edge"},
        "spec": {
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "configFrom": {"configMapKeyRef": {"name": "edge-cfg", "key": "haproxy.cfg"}},
            "agent": {"port": agent_port},
            "files": files,
            "controller": {"maxParallel": 16},
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &obj).await.unwrap();
    api
}

on_each_version!(deploys_a_haproxyconfig_to_local_pods);

/// Render, deploy, runtime change, map change, a refused config and a missing reference, on
/// 3 local pods per HAProxy version, through the real apiserver.
async fn deploys_a_haproxyconfig_to_local_pods(bin: HaproxyBin) {
    let e = env().await;
    let ns = format!("edge-{}{}", bin.version.0, bin.version.1);
    println!("--- {} in namespace {ns}", bin.label());
    namespace(&e.client, &ns).await;
    put_secret(&e.client, &ns, PASSWORD).await;
    let mut pods = LocalPods::new(e.client.clone(), local_opts(&ns, &bin));
    pods.create(3).await.unwrap();
    let fe = free_port();
    put_configmap(
        &e.client,
        &ns,
        "edge-cfg",
        BTreeMap::from([("haproxy.cfg", cfg_text(fe, "v1", 9001, false)), ("hosts.map", "a.example be_a\n".into())]),
    )
    .await;
    let api = create_config(
        &e.client,
        &ns,
        pods.agent_port(),
        json!([{"path": "maps/hosts.map", "configMapKeyRef": {"name": "edge-cfg", "key": "hosts.map"}}]),
    )
    .await;
    let ctl = Controller::start(&e.cp, &ns, &bin, "ctl-a", e.dir.path());
    let st = Story { e: &e, ns: &ns, pods: &pods, api: &api, fe };
    let s = first_deploy(&st).await;
    let s = runtime_changes(&st, &s).await;
    let good_plan = refused_config(&st, &s).await;
    missing_reference(&st, &good_plan, &ctl).await;
    tuning_reaches_the_running_loop(&st, &ctl).await;
    drop(ctl);
}

/// One run of the deploy story: the control plane, the namespace, its pods, the
/// HAProxyConfig and the frontend port.
#[derive(Clone, Copy)]
struct Story<'a> {
    e: &'a Env,
    ns: &'a str,
    pods: &'a LocalPods,
    api: &'a Api<HAProxyConfig>,
    fe: u16,
}

/// First deploy: every pod converges and serves the render on its own IP; the status.
async fn first_deploy(st: &Story<'_>) -> serde_json::Value {
    let Story { e, ns, pods, api, fe } = *st;
    let s = converged(api, 3, None).await;
    let deployed = s["deployedToPods"].as_array().unwrap();
    assert_eq!(deployed.len(), 3, "{s:#}");
    for p in deployed {
        assert_eq!(p["appliedPlan"], p["runningPlan"], "{p}");
        assert_eq!(p["appliedPlan"], s["planId"]);
        assert!(!p["uid"].as_str().unwrap().is_empty() && p["ip"].as_str().unwrap().starts_with("127."));
    }
    assert_eq!(condition(&s, "Validated").unwrap()["status"], "True");
    assert_eq!(s["convergedText"], "3/3");
    assert_eq!(s["leader"]["identity"], "ctl-a");
    // The status is written with server-side apply, as the field manager haptic-controller.
    let obj = api.get("edge").await.unwrap();
    assert_status_applied(&obj.metadata);
    for n in pods.names() {
        let addr = SocketAddr::from((pods.ip(&n).unwrap(), fe));
        assert_eq!(http_get(addr, "/hello").await.unwrap(), (200, "v1".to_string()));
        assert_eq!(pod_state(pods, &n).await["fence"]["holder"], "ctl-a");
    }
    // `status --kubernetes` prints the same table as standalone mode, from the resource.
    let out = Command::new(env!("CARGO_BIN_EXE_haptic-controller"))
        .args(["status", "--kubernetes", "--namespace", ns, "--config", "edge"])
        .env("KUBECONFIG", e.cp.kubeconfig())
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(table.contains("3/3 converged"), "{table}");
    for n in pods.names() {
        assert!(table.lines().any(|l| l.starts_with(&n) && l.contains("converged")), "{n} in {table}");
    }
    s
}

/// An endpoint change and a map change land as runtime: no new worker; the last status.
async fn runtime_changes(st: &Story<'_>, s: &serde_json::Value) -> serde_json::Value {
    let Story { e, ns, pods, api, fe } = *st;
    let before = worker_pids(pods).await;
    let plan1 = s["planId"].as_str().unwrap().to_string();
    put_configmap(
        &e.client,
        ns,
        "edge-cfg",
        BTreeMap::from([("haproxy.cfg", cfg_text(fe, "v1", 9002, false)), ("hosts.map", "a.example be_a\n".into())]),
    )
    .await;
    let s = converged(api, 3, Some(&plan1)).await;
    for p in s["deployedToPods"].as_array().unwrap() {
        assert_eq!(p["mode"], "runtime", "{p}");
    }
    assert_eq!(worker_pids(pods).await, before, "an endpoint change must not reload");

    // A map change is runtime too, and the new entry answers.
    let plan2 = s["planId"].as_str().unwrap().to_string();
    put_configmap(
        &e.client,
        ns,
        "edge-cfg",
        BTreeMap::from([
            ("haproxy.cfg", cfg_text(fe, "v1", 9002, false)),
            ("hosts.map", "a.example be_a\nb.example be_b\n".into()),
        ]),
    )
    .await;
    let s = converged(api, 3, Some(&plan2)).await;
    assert!(s["deployedToPods"].as_array().unwrap().iter().all(|p| p["mode"] == "runtime"), "{s:#}");
    assert_eq!(worker_pids(pods).await, before);
    s
}

/// A config HAProxy refuses: Validated=False with HAProxy's words; the pods keep serving.
/// Returns the last good plan.
async fn refused_config(st: &Story<'_>, s: &serde_json::Value) -> serde_json::Value {
    let Story { e, ns, pods, api, fe } = *st;
    let good_plan = s["planId"].clone();
    put_configmap(
        &e.client,
        ns,
        "edge-cfg",
        BTreeMap::from([
            ("haproxy.cfg", cfg_text(fe, "v2", 9002, true)),
            ("hosts.map", "a.example be_a\nb.example be_b\n".into()),
        ]),
    )
    .await;
    let s = eventually("Validated=False after a refused render", || async {
        let s = status_of(api).await;
        condition(&s, "Validated").is_some_and(|c| c["status"] == "False").then_some(s)
    })
    .await;
    let v = condition(&s, "Validated").unwrap();
    assert_eq!(v["reason"], "GateRefused", "{v}");
    assert!(v["message"].as_str().unwrap().contains("[ALERT]"), "{v}");
    assert!(s["gate"]["message"].as_str().unwrap().contains("bogus-directive"), "{s:#}");
    assert_eq!(s["lastGoodPlanId"], good_plan);
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::namespaced(e.client.clone(), ns);
    let refused = eventually("a GateRefused Event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|ev| ev.reason.as_deref() == Some("GateRefused"))
    })
    .await;
    assert!(refused.note.unwrap_or_default().contains("[ALERT]"));
    assert_eq!(refused.regarding.unwrap().name.as_deref(), Some("edge"));
    // The history of what reached the fleet: Normal `Deployed` Events.
    let deployed = eventually("a Deployed Event", || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|ev| ev.reason.as_deref() == Some("Deployed"))
    })
    .await;
    assert_eq!(deployed.type_.as_deref(), Some("Normal"));
    let note = deployed.note.unwrap_or_default();
    assert!(note.starts_with("deployed plan ") && note.contains(" to 3/3 pods: "), "{note}");
    // Ready follows Validated: False while the latest render is refused.
    let ready = condition(&s, "Ready").unwrap();
    assert_eq!((ready["status"].as_str(), ready["reason"].as_str()), (Some("False"), Some("GateRefused")), "{ready}");
    for n in pods.names() {
        let addr = SocketAddr::from((pods.ip(&n).unwrap(), fe));
        assert_eq!(http_get(addr, "/hello").await.unwrap(), (200, "v1".to_string()));
    }
    good_plan
}

/// A missing reference: a render error, nothing deployed; fixed when it is created.
async fn missing_reference(st: &Story<'_>, good_plan: &serde_json::Value, ctl: &Controller) {
    let Story { e, ns, pods, api, fe } = *st;
    let configs: Api<HAProxyConfig> = Api::namespaced(e.client.clone(), ns);
    let patch = json!({"spec": {"configFrom": {"configMapKeyRef": {"name": "edge-cfg-v2", "key": "haproxy.cfg"}}}});
    configs.patch("edge", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let s = eventually("MissingReference", || async {
        let s = status_of(api).await;
        condition(&s, "Validated").is_some_and(|c| c["reason"] == "MissingReference").then_some(s)
    })
    .await;
    assert!(condition(&s, "Validated").unwrap()["message"].as_str().unwrap().contains("edge-cfg-v2"));
    for n in pods.names() {
        assert_eq!(pod_state(pods, &n).await["applied"]["plan_id"], *good_plan);
    }
    put_configmap(&e.client, ns, "edge-cfg-v2", BTreeMap::from([("haproxy.cfg", cfg_text(fe, "v3", 9002, false))]))
        .await;
    let s = eventually("the fixed reference to converge", || async {
        let s = status_of(api).await;
        let ok = condition(&s, "Validated").is_some_and(|c| c["status"] == "True")
            && condition(&s, "Converged").is_some_and(|c| c["status"] == "True")
            && s["planId"] != *good_plan;
        ok.then_some(s)
    })
    .await;
    assert_eq!(s["converged"], 3);
    assert_eq!(condition(&s, "Ready").unwrap()["status"], "True", "{s:#}");
    for n in pods.names() {
        let addr = SocketAddr::from((pods.ip(&n).unwrap(), fe));
        assert_eq!(http_get(addr, "/hello").await.unwrap(), (200, "v3".to_string()), "{}", ctl.log());
    }
}

/// A `spec.controller` change reaches the running deployment loop: the status shows the
/// new gate mode, and the loop was never torn down (one term started, none restarted).
async fn tuning_reaches_the_running_loop(st: &Story<'_>, ctl: &Controller) {
    let Story { e, ns, api, .. } = *st;
    let configs: Api<HAProxyConfig> = Api::namespaced(e.client.clone(), ns);
    let patch = json!({"spec": {"controller": {"gate": "pessimistic"}}});
    configs.patch("edge", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    eventually("the running loop to take the pessimistic gate", || async {
        (status_of(api).await["gate"]["state"] == "pessimistic").then_some(())
    })
    .await;
    assert_eq!(ctl.log().matches("starting a deployment term").count(), 1, "{}", ctl.log());
}

/// Namespace `ns` with the credentials Secret, 3 local pods of `bin`, and the ConfigMap with a
/// `v1` config on a free frontend port; returns the pods' options, the pods and the port.
async fn fleet(e: &Env, bin: &HaproxyBin, ns: &str) -> (LocalPodsOpts, LocalPods, u16) {
    namespace(&e.client, ns).await;
    put_secret(&e.client, ns, PASSWORD).await;
    let opts = local_opts(ns, bin);
    let mut pods = LocalPods::new(e.client.clone(), opts.clone());
    pods.create(3).await.unwrap();
    let fe = free_port();
    put_cfg(&e.client, ns, cfg_text(fe, "v1", 9001, false)).await;
    (opts, pods, fe)
}

on_each_version!(discovery_admits_only_reachable_agents_and_follows_pod_changes);

/// Admission: a pod whose agent container is not running and a pod with the wrong credential
/// are not targets (counted by reason); a deleted pod leaves the status; a replaced pod is
/// probed again and converges; a rotated Secret is used without a restart of the controller or
/// any agent, and no pod leaves the targets while the agents catch up.
async fn discovery_admits_only_reachable_agents_and_follows_pod_changes(bin: HaproxyBin) {
    let e = env().await;
    let ns = format!("disco-{}{}", bin.version.0, bin.version.1);
    println!("--- {} in namespace {ns}", bin.label());
    discovery_on(&e, bin, &ns).await;
}

async fn discovery_on(e: &Env, bin: HaproxyBin, ns: &str) {
    let (opts, mut pods, _fe) = fleet(e, &bin, ns).await;
    let names = pods.names();
    // A fourth pod matching the selector whose agent has another password.
    let mut wrong = opts.clone();
    wrong.prefix = "stranger".into();
    wrong.pod.credentials = Some((USER.into(), "not-the-secret".into()));
    let mut strangers = LocalPods::new(e.client.clone(), wrong);
    strangers.create(1).await.unwrap();
    let api = create_config(&e.client, ns, pods.agent_port(), map_file()).await;
    let ctl = Controller::start(&e.cp, ns, &bin, "ctl-d", e.dir.path());
    let s = converged(&api, 3, None).await;
    let in_status: Vec<String> =
        s["deployedToPods"].as_array().unwrap().iter().map(|p| p["pod"].as_str().unwrap().to_string()).collect();
    assert_eq!(in_status, names, "the stranger is not admitted");
    let unreachable = r#"haptic_haproxy_pods_rejected_total{reason="agent_unreachable"}"#;
    assert!(ctl.metric(unreachable).await >= 1.0, "{}", ctl.log());

    // The agent container stops: the pod leaves the targets.
    pods.kill_container(&names[0], Container::Agent).await.unwrap();
    eventually("the pod with a dead agent to leave the status", || async {
        let s = status_of(&api).await;
        (s["total"] == 2 && s["deployedToPods"].as_array()?.iter().all(|p| p["pod"] != names[0])).then_some(())
    })
    .await;
    let not_running = r#"haptic_haproxy_pods_rejected_total{reason="agent_container_not_running"}"#;
    assert_eq!(ctl.metric(not_running).await, 1.0, "{}", ctl.log());
    pods.restart_container(&names[0], Container::Agent).await.unwrap();
    converged(&api, 3, None).await;

    // Deleted: it leaves the status. Replaced (new UID, same name): probed again, converges.
    pods.delete(&names[1]).await.unwrap();
    eventually("the deleted pod to leave the status", || async {
        let s = status_of(&api).await;
        (s["total"] == 2).then_some(())
    })
    .await;
    let old_uid = pods.uid(&names[2]).unwrap().to_string();
    pods.replace(&names[2]).await.unwrap();
    let s = eventually("the replaced pod to converge", || async {
        let s = status_of(&api).await;
        let p = s["deployedToPods"].as_array()?.iter().find(|p| p["pod"] == names[2].as_str())?.clone();
        (p["uid"] != old_uid.as_str() && p["phase"] == "converged").then_some(s)
    })
    .await;
    assert_eq!(s["total"], 2);

    // Rotate the Secret, then the agents' files (the kubelet updates a mounted Secret up to a
    // minute or two later), with neither the controller nor any agent restarted. While the
    // agents still hold the old credential the controller falls back to it: every pod stays a
    // target and a new plan reaches all of them. Once the files change (the agents run with no
    // grace window here, so the old credential stops working at once), the new one is used.
    let unreachable_before = ctl.metric(unreachable).await;
    let agent_pids = |pods: &LocalPods| -> Vec<Option<u32>> {
        pods.names().iter().map(|n| pods.pod(n).and_then(|p| p.agent_pid())).collect()
    };
    let pids_before = agent_pids(&pods);
    put_secret(&e.client, ns, "rotated-pw").await;
    eventually("the controller to load the rotated Secret", || async {
        (ctl.log().matches("agent credentials loaded").count() >= 2).then_some(())
    })
    .await;
    let plan_before = status_of(&api).await["planId"].as_str().map(str::to_string);
    put_cfg(&e.client, ns, cfg_text(free_port(), "rotating", 9001, false)).await;
    let s = converged(&api, 2, plan_before.as_deref()).await;
    pods.rotate_credentials("rotated-pw").unwrap();
    put_cfg(&e.client, ns, cfg_text(free_port(), "rotated", 9001, false)).await;
    converged(&api, 2, s["planId"].as_str()).await;
    assert!(ctl.log().contains("agent still on the previous credential"), "{}", ctl.log());
    assert_eq!(ctl.metric(unreachable).await, unreachable_before, "no pod was refused during the rotation");
    assert_eq!(agent_pids(&pods), pids_before, "no agent restarted");
    drop(ctl);
}

on_each_version!(leader_failover_reloads_nothing_and_fences_the_old_leader);

/// Leadership and fencing with two controller processes.
async fn leader_failover_reloads_nothing_and_fences_the_old_leader(bin: HaproxyBin) {
    let e = env().await;
    let ns = format!("lead-{}{}", bin.version.0, bin.version.1);
    println!("--- {} in namespace {ns}", bin.label());
    leadership_on(&e, bin, &ns).await;
}

async fn leadership_on(e: &Env, bin: HaproxyBin, ns: &str) {
    let (_, mut pods, fe) = fleet(e, &bin, ns).await;
    let api = create_config(&e.client, ns, pods.agent_port(), map_file()).await;
    let leases: Api<Lease> = Api::namespaced(e.client.clone(), ns);

    let mut a = Controller::start(&e.cp, ns, &bin, "ctl-a", e.dir.path());
    let s = converged(&api, 3, None).await;
    assert_eq!(s["leader"]["identity"], "ctl-a");
    let b = Controller::start(&e.cp, ns, &bin, "ctl-b", e.dir.path());
    let epoch_a = s["leader"]["epoch"].as_u64().unwrap();
    // Only the holder applies: every pod's fence names ctl-a.
    for n in pods.names() {
        assert_eq!(pod_state(&pods, &n).await["fence"]["holder"], "ctl-a");
    }
    let lease = leases.get("haptic-edge").await.unwrap();
    assert_eq!(lease.spec.as_ref().unwrap().holder_identity.as_deref(), Some("ctl-a"));
    // `haptic_leader`: 1 on the holder only (ctl-b's exposition is up once it has build info).
    assert_eq!(a.metric("haptic_leader ").await, 1.0, "{}", a.log());
    eventually("ctl-b's /metrics", || async {
        let build = format!(r#"haptic_build_info{{component="controller",version="{}"}}"#, env!("CARGO_PKG_VERSION"));
        (b.metric(&build).await > 0.0).then_some(())
    })
    .await;
    assert_eq!(b.metric("haptic_leader ").await, 0.0, "a follower is not the leader");

    // kill -9 the leader: ctl-b takes over with a higher epoch and reloads no pod.
    let before = worker_pids(&pods).await;
    a.kill9();
    let s = eventually("ctl-b to lead", || async {
        let s = status_of(&api).await;
        (s["leader"]["identity"] == "ctl-b" && s["converged"] == 3).then_some(s)
    })
    .await;
    assert!(s["leader"]["epoch"].as_u64().unwrap() > epoch_a, "{s:#}");
    assert_eq!(b.metric("haptic_leader ").await, 1.0, "the new holder deploys");
    // The new leader's first deployment reloaded nothing.
    assert_eq!(worker_pids(&pods).await, before, "{}", b.log());
    // Its first change (an endpoint) lands as runtime under its own, higher fence.
    let plan = s["planId"].as_str().unwrap().to_string();
    put_cfg(&e.client, ns, cfg_text(fe, "v1", 9002, false)).await;
    converged(&api, 3, Some(&plan)).await;
    assert_eq!(worker_pids(&pods).await, before, "{}", b.log());
    for n in pods.names() {
        let st = pod_state(&pods, &n).await;
        assert_eq!(st["fence"]["holder"], "ctl-b", "{}", b.log());
        assert!(st["fence"]["epoch"].as_u64().unwrap() > epoch_a);
    }
    // An apply still stamped with the old leader's term is refused by the agents.
    let name = pods.names()[0].clone();
    let addr: SocketAddr = pods.agent_url(&name).unwrap().trim_start_matches("http://").parse().unwrap();
    let st = pod_state(&pods, &name).await;
    let fence_b = st["fence"].clone();
    let stale = json!({
        "fence": {"epoch": epoch_a, "seq": 999, "holder": "ctl-a"},
        "baseline": st["applied"]["plan_id"], "plan_id": st["applied"]["plan_id"], "mode": "file_only",
        "reasons": [], "files": st["files"], "parts": {}, "batches": [], "blob": {},
    });
    let agent = AgentClient { addr, auth: Some((USER.into(), PASSWORD.into())) };
    let (code, body) = agent.post_json("/v1/apply", &stale.to_string()).await.unwrap();
    assert_eq!(code, 409, "{body}");
    assert!(body.contains("stale_epoch"), "{body}");
    assert_eq!(pod_state(&pods, &name).await["fence"], fence_b);

    // Deleting the Lease resets the epoch; the new holder raises its epoch above the pods'.
    let pods_epoch = pod_state(&pods, &pods.names()[0]).await["fence"]["epoch"].as_u64().unwrap();
    leases.delete("haptic-edge", &DeleteParams::default()).await.unwrap();
    eventually("ctl-b to hold a new Lease", || async {
        let l = leases.get_opt("haptic-edge").await.ok()??;
        let spec = l.spec?;
        (spec.holder_identity.as_deref() == Some("ctl-b") && (spec.lease_transitions? as u64) < pods_epoch)
            .then_some(())
    })
    .await;
    put_cfg(&e.client, ns, cfg_text(fe, "after-delete", 9001, false)).await;
    eventually("a new render to land after the Lease was deleted", || async {
        for n in pods.names() {
            let addr = SocketAddr::from((pods.ip(&n).unwrap(), fe));
            if http_get(addr, "/hello").await.ok()? != (200, "after-delete".to_string()) {
                return None;
            }
        }
        Some(())
    })
    .await;
    let st = pod_state(&pods, &pods.names()[0]).await;
    assert!(st["fence"]["epoch"].as_u64().unwrap() > pods_epoch, "{st} {}", b.log());

    // The old leader restarted does not deploy while it does not hold the Lease.
    let a2 = Controller::start(&e.cp, ns, &bin, "ctl-a", e.dir.path());
    eventually("ctl-a to be following", || async { a2.log().contains("kubernetes mode started").then_some(()) }).await;
    for n in pods.names() {
        assert_eq!(pod_state(&pods, &n).await["fence"]["holder"], "ctl-b");
    }
    drop(b);
    drop(a2);
    let _ = &mut pods;
}

/// The real apiserver refuses, with the CRD rule's message, a HAProxyConfig the controller could
/// not serve; the defaults it fills in are the chart's.
#[tokio::test]
async fn the_api_refuses_a_haproxyconfig_it_cannot_serve() {
    use haptic_controller::kubernetes::crd::{ONE_CONFIG_SOURCE, ONE_FILE_SOURCE};
    use kube::api::DynamicObject;
    use kube::core::{ApiResource, GroupVersionKind};
    let e = env().await;
    let ns = "cel";
    namespace(&e.client, ns).await;
    let ar = ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("haptic.dev", "v1alpha1", "HAProxyConfig"),
        "haproxyconfigs",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(e.client.clone(), ns, &ar);
    let obj = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({"apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig",
            "metadata": {"name": name}, "spec": spec}))
        .unwrap()
    };
    let selector = json!({"matchLabels": {"app.kubernetes.io/name": "haproxy"}});
    let refused = |r: Result<DynamicObject, kube::Error>| -> String {
        match r {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 422, "{s:?}");
                s.message.clone()
            }
            other => panic!("wanted a 422 refusal, got {other:?}"),
        }
    };
    let pp = PostParams::default();
    let cfg_from = json!({"configMapKeyRef": {"name": "c", "key": "haproxy.cfg"}});

    let both = obj("both", json!({"podSelector": selector, "config": "global\n", "configFrom": cfg_from}));
    let msg = refused(api.create(&pp, &both).await);
    assert!(msg.contains(ONE_CONFIG_SOURCE), "{msg}");
    let neither = obj("neither", json!({"podSelector": selector}));
    assert!(refused(api.create(&pp, &neither).await).contains(ONE_CONFIG_SOURCE));

    let two_sources = obj(
        "two",
        json!({"podSelector": selector, "config": "global\n",
        "files": [{"path": "maps/a.map", "content": "x", "configMapKeyRef": {"name": "c", "key": "k"}}]}),
    );
    let msg = refused(api.create(&pp, &two_sources).await);
    assert!(msg.contains(ONE_FILE_SOURCE), "{msg}");
    let no_source = obj("none", json!({"podSelector": selector, "config": "global\n", "files": [{"path": "a.map"}]}));
    assert!(refused(api.create(&pp, &no_source).await).contains(ONE_FILE_SOURCE));

    let bad_duration =
        obj("dur", json!({"podSelector": selector, "config": "global\n", "controller": {"syncTimeout": "soon"}}));
    let msg = refused(api.create(&pp, &bad_duration).await);
    assert!(msg.contains("spec.controller.syncTimeout") && msg.contains("should match"), "{msg}");

    let huge = obj("huge", json!({"podSelector": selector, "config": "#".repeat((1 << 20) + 1)}));
    let msg = refused(api.create(&pp, &huge).await);
    assert!(msg.contains("spec.config") && msg.contains("Too long"), "{msg}");

    // A good one is accepted, with the chart's defaults filled in.
    let ok = api.create(&pp, &obj("ok", json!({"podSelector": selector, "config": "global\n"}))).await.unwrap();
    assert_eq!(ok.data["spec"]["agent"]["port"], 9080, "{:#}", ok.data);
    assert_eq!(ok.data["spec"]["agent"]["credentialsSecretRef"]["name"], "haptic-agent-credentials");
    assert_eq!(ok.data["spec"]["controller"]["syncTimeout"], "30s");
}
