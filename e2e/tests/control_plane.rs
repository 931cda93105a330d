//! The local Kubernetes control plane (real etcd + kube-apiserver) and the kubelet stand-in
//! (`LocalPods`, real HAProxy + agent processes), tested against the real apiserver.
//!
//! Needs `scripts/install-k8s.sh` (and `scripts/install-haproxy.sh`) to have run.

use std::net::SocketAddr;
use std::time::Duration;

use haptic_e2e::k8s::{k8s_version, Container, ControlPlane, LocalPods, LocalPodsOpts};
use haptic_e2e::pod::AgentClient;
use haptic_e2e::{assert_no_stray, http_get, on_each_version, HaproxyBin};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::Client;
use serde_json::json;

const DEADLINE: Duration = Duration::from_secs(30);

async fn start() -> ControlPlane {
    match ControlPlane::start().await {
        Ok(cp) => cp,
        Err(e) => panic!("control plane did not start: {e}"),
    }
}

async fn create_namespace(client: &Client, name: &str) {
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

/// Polls `check` until it returns `Some`, panicking with `what` after [`DEADLINE`].
async fn eventually<T, F, Fut>(what: &str, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    haptic_e2e::cluster::eventually(what, DEADLINE, check).await.unwrap_or_else(|e| panic!("{e}"))
}

fn api_error_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

#[tokio::test]
async fn starts_reports_its_version_and_round_trips_a_configmap() {
    let mut cp = start().await;
    println!("control plane {} ready in {:?} (etcd + kube-apiserver, /readyz 200)", cp.version(), cp.startup());
    let want = format!("v{}", k8s_version().expect("e2e/k8s-tools/go.mod names k8s.io/kubernetes"));
    assert_eq!(cp.version(), want);
    assert!(cp.kubeconfig().is_file());

    let client = cp.client().await.unwrap();
    create_namespace(&client, "round-trip").await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "round-trip");
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"name": "cfg"},
        "data": {"haproxy.cfg": "global\n  default-path config\n"},
    }))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let back = cms.get("cfg").await.unwrap();
    assert_eq!(back.data.unwrap()["haproxy.cfg"], "global\n  default-path config\n");
    assert!(back.metadata.resource_version.is_some());

    let pids = cp.pids();
    assert_eq!(pids.len(), 2);
    cp.stop();
    assert_no_stray(&pids);
}

#[tokio::test]
async fn a_crd_from_yaml_is_established_and_its_schema_enforced() {
    let cp = start().await;
    let client = cp.client().await.unwrap();
    let yaml = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures/widget-crd.yaml")).unwrap();
    let crd: CustomResourceDefinition = serde_saphyr::from_str(&yaml).unwrap();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.create(&PostParams::default(), &crd).await.unwrap();
    eventually("the CRD to be Established", || {
        let crds = crds.clone();
        async move {
            let c = crds.get("widgets.test.haptic.dev").await.ok()?;
            let conds = c.status?.conditions?;
            conds.iter().any(|c| c.type_ == "Established" && c.status == "True").then_some(())
        }
    })
    .await;

    create_namespace(&client, "widgets").await;
    let gvk = GroupVersionKind::gvk("test.haptic.dev", "v1", "Widget");
    let api: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "widgets", &ApiResource::from_gvk_with_plural(&gvk, "widgets"));
    let object = |name: &str, spec: serde_json::Value| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "test.haptic.dev/v1", "kind": "Widget",
            "metadata": {"name": name}, "spec": spec,
        }))
        .unwrap()
    };
    // Discovery of a new CRD can lag behind Established for a moment: retry the valid create.
    eventually("a valid Widget to be accepted", || {
        let api = api.clone();
        let ok = object("good", json!({"config": "global\n", "replicas": 2}));
        async move { api.create(&PostParams::default(), &ok).await.ok().map(|_| ()) }
    })
    .await;
    let err = api.create(&PostParams::default(), &object("bad", json!({"config": 42}))).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(422), "{err}");
    let msg = err.to_string();
    assert!(msg.contains("spec.config") && msg.contains("must be of type string"), "apiserver said: {msg}");
    let err = api.create(&PostParams::default(), &object("zero", json!({"config": "", "replicas": 0}))).await;
    assert!(err.unwrap_err().to_string().contains("spec.replicas"));
    assert!(api.get_opt("bad").await.unwrap().is_none());
}

#[tokio::test]
async fn a_lease_update_with_a_stale_resource_version_conflicts() {
    let cp = start().await;
    let client = cp.client().await.unwrap();
    let leases: Api<Lease> = Api::namespaced(client, "default");
    let lease: Lease = serde_json::from_value(json!({
        "metadata": {"name": "haptic-test"},
        "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15, "leaseTransitions": 0},
    }))
    .unwrap();
    leases.create(&PostParams::default(), &lease).await.unwrap();
    let seen = leases.get("haptic-test").await.unwrap();

    let mut by_b = seen.clone();
    by_b.spec.as_mut().unwrap().holder_identity = Some("b".into());
    by_b.spec.as_mut().unwrap().lease_transitions = Some(1);
    let won = leases.replace("haptic-test", &PostParams::default(), &by_b).await.unwrap();
    assert_ne!(won.metadata.resource_version, seen.metadata.resource_version);

    // A writer still holding the old resourceVersion must lose.
    let mut by_c = seen.clone();
    by_c.spec.as_mut().unwrap().holder_identity = Some("c".into());
    let err = leases.replace("haptic-test", &PostParams::default(), &by_c).await.unwrap_err();
    assert_eq!(api_error_code(&err), Some(409), "{err}");
    let now = leases.get("haptic-test").await.unwrap();
    assert_eq!(now.spec.unwrap().holder_identity.as_deref(), Some("b"));
}

fn container_status(pod: &Pod, name: &str) -> k8s_openapi::api::core::v1::ContainerStatus {
    let statuses = pod.status.as_ref().and_then(|s| s.container_statuses.clone()).unwrap_or_default();
    statuses.into_iter().find(|c| c.name == name).unwrap_or_else(|| panic!("no status of container {name}"))
}

on_each_version!(local_pods_run_haproxy_pods_like_a_kubelet);

async fn local_pods_run_haproxy_pods_like_a_kubelet(bin: HaproxyBin) {
    let cp = start().await;
    let client = cp.client().await.unwrap();
    create_namespace(&client, "fleet").await;
    let pods_api: Api<Pod> = Api::namespaced(client.clone(), "fleet");
    let mut all_pids = cp.pids();

    println!("--- {}", bin.label());
    let mut opts = LocalPodsOpts::new("fleet", bin.clone(), "haptic", "s3cret-pw");
    opts.prefix = format!("haproxy-{}{}", bin.version.0, bin.version.1);
    let mut pods = LocalPods::new(client.clone(), opts);
    let names = pods.create(3).await.unwrap();

    // Running, with three distinct IPs, as the apiserver reports them.
    let mut ips = Vec::new();
    for n in &names {
        let p = pods_api.get(n).await.unwrap();
        let st = p.status.clone().unwrap();
        assert_eq!(st.phase.as_deref(), Some("Running"));
        let ip = st.pod_ip.clone().unwrap();
        assert_eq!(Some(ip.parse().unwrap()), pods.ip(n));
        assert!(container_status(&p, "agent").state.unwrap().running.is_some());
        assert!(container_status(&p, "haproxy").state.unwrap().running.is_some());
        ips.push(ip);
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3, "distinct pod IPs: {ips:?}");

    // Each agent answers on http://<pod ip>:<agent port> with the credentials, and only with them.
    for n in &names {
        let url = pods.agent_url(n).unwrap();
        let addr: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
        let agent = AgentClient { addr, auth: Some(("haptic".into(), "s3cret-pw".into())) };
        let (code, body) = agent.get("/v1/state").await.unwrap();
        assert_eq!(code, 200, "{body}");
        let state: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(state["api"]["major"], 1);
        let wrong = AgentClient { addr, auth: Some(("haptic".into(), "wrong".into())) };
        assert_eq!(wrong.get("/v1/state").await.unwrap().0, 401);
        // HAProxy serves the bootstrap tree: /healthz 200 on the pod's own address.
        let health: SocketAddr = pods.pod(n).unwrap().health_bind().parse().unwrap();
        assert_eq!(health.ip(), pods.ip(n).unwrap());
        assert_eq!(http_get(health, "/healthz").await.unwrap().0, 200);
    }

    // Killing the agent flips its container to terminated; a restart counts and answers again.
    let first = names[0].clone();
    let addr: SocketAddr = pods.agent_url(&first).unwrap().trim_start_matches("http://").parse().unwrap();
    let agent = AgentClient { addr, auth: Some(("haptic".into(), "s3cret-pw".into())) };
    let before = container_status(&pods_api.get(&first).await.unwrap(), "agent");
    pods.kill_container(&first, Container::Agent).await.unwrap();
    let dead = container_status(&pods_api.get(&first).await.unwrap(), "agent");
    assert!(dead.state.unwrap().terminated.is_some());
    assert!(!dead.ready);
    assert!(agent.get("/v1/state").await.is_err(), "a killed agent must not answer");
    pods.restart_container(&first, Container::Agent).await.unwrap();
    let again = container_status(&pods_api.get(&first).await.unwrap(), "agent");
    assert!(again.state.unwrap().running.is_some());
    assert_eq!(again.restart_count, before.restart_count + 1);
    assert_ne!(again.container_id, before.container_id);
    assert_eq!(agent.get("/v1/state").await.unwrap().0, 200);

    // The same for HAProxy: a new master, the bootstrap /healthz back.
    let old_master = pods.pod(&first).unwrap().haproxy().master_pid();
    pods.kill_container(&first, Container::Haproxy).await.unwrap();
    assert!(!pods.pod(&first).unwrap().haproxy_running());
    let hs = container_status(&pods_api.get(&first).await.unwrap(), "haproxy");
    assert!(hs.state.unwrap().terminated.is_some());
    pods.restart_container(&first, Container::Haproxy).await.unwrap();
    assert_ne!(pods.pod(&first).unwrap().haproxy().master_pid(), old_master);
    assert_eq!(pods.restart_count(&first, Container::Haproxy), Some(1));
    let health: SocketAddr = pods.pod(&first).unwrap().health_bind().parse().unwrap();
    assert_eq!(http_get(health, "/healthz").await.unwrap().0, 200);

    // Deleting a pod stops its processes and removes its object.
    let victim = names[1].clone();
    let victim_pids: Vec<u32> = {
        let p = pods.pod(&victim).unwrap();
        p.agent_pid().into_iter().chain(p.haproxy().known_pids()).collect()
    };
    pods.delete(&victim).await.unwrap();
    assert_no_stray(&victim_pids);
    assert!(pods_api.get_opt(&victim).await.unwrap().is_none());

    // Replacing a pod gives a new UID under the same name.
    let last = names[2].clone();
    let old_uid = pods.uid(&last).unwrap().to_string();
    pods.replace(&last).await.unwrap();
    let now = pods_api.get(&last).await.unwrap();
    assert_ne!(now.metadata.uid.as_deref(), Some(old_uid.as_str()));
    assert_eq!(now.metadata.uid.as_deref(), pods.uid(&last));

    all_pids.extend(pods.pids());
    drop(pods);
    drop(cp);
    assert_no_stray(&all_pids);
}
