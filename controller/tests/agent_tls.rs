//! Kubernetes mode with `--agent-tls-issue`, against a real kube-apiserver + etcd: the controller
//! makes the agents' CA Secret and serving Secret, both owned by the `HAProxyConfig`; the serving
//! certificate verifies for the fixed name through the Secret's `ca.crt` (a real TLS handshake on
//! 127.0.0.1); a deleted serving Secret is issued again from the same CA, and a deleted CA makes
//! a new CA that is trusted and chains the new certificate. Needs `scripts/install-k8s.sh`.

use std::time::Duration;

use haptic_controller::agent_tls::{agent_url, AgentTrust};
use haptic_controller::client::{AgentClient, CallError, Credentials};
use haptic_controller::kubernetes::agent_tls::{CA_NOT_AFTER, CERT_NOT_AFTER, SERVER_NAME};
use haptic_controller::seams::Endpoint;
use haptic_e2e::HaproxyBin;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

mod common;

use common::kube::*;

const NAME: &str = "haptic-agent.edge.svc";
const SECRET: &str = "agent-tls";

fn data(s: &Secret, k: &str) -> String {
    String::from_utf8(s.data.as_ref().unwrap()[k].0.clone()).unwrap()
}

/// A TLS handshake with the Secret's certificate, verified for [`NAME`] through its `ca.crt`.
async fn verifies(s: &Secret) -> Result<(), String> {
    let resp = "HTTP/1.1 418 I'm a teapot\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string();
    let (addr, server) =
        haptic_e2e::tls::answering_server(data(s, "tls.crt").as_bytes(), data(s, "tls.key").as_bytes(), resp).await;
    let trust = AgentTrust::new(Some(NAME)).unwrap();
    trust.set_ca(data(s, "ca.crt").as_bytes()).unwrap();
    let creds = Credentials { user: "u".into(), password: "p".into() };
    let client = AgentClient::with_trust(creds, Duration::from_secs(10), Some(trust)).unwrap();
    let ep = Endpoint { name: "p".into(), url: agent_url(true, "127.0.0.1", addr.port()) };
    let r = match client.state(&ep, false).await {
        Err(CallError::Status { status, .. }) if status.as_u16() == 418 => Ok(()),
        other => Err(format!("{other:?}")),
    };
    server.abort();
    r
}

#[tokio::test]
async fn the_controller_issues_and_reissues_the_agents_certificate() {
    let e = env().await;
    let ns = "tls";
    namespace(&e.client, ns).await;
    put_secret(&e.client, ns, PASSWORD).await;
    let cms: Api<ConfigMap> = Api::namespaced(e.client.clone(), ns);
    let cm: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "edge-cfg"},
        "data": {"haproxy.cfg": "global\n\ndefaults\n    mode http\n    timeout connect 1s\n    timeout client 1s\n    timeout server 1s\n"}}))
    .unwrap();
    cms.create(&PostParams::default(), &cm).await.unwrap();
    let configs: Api<haptic_controller::kubernetes::crd::HAProxyConfig> = Api::namespaced(e.client.clone(), ns);
    let obj = serde_json::from_value(json!({
        "apiVersion": "haptic.dev/v1alpha1", "kind": "HAProxyConfig", "metadata": {"name": "edge"},
        "spec": {"podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
                 "configFrom": {"configMapKeyRef": {"name": "edge-cfg", "key": "haproxy.cfg"}}}}))
    .unwrap();
    let uid = configs.create(&PostParams::default(), &obj).await.unwrap().metadata.uid.unwrap();
    let bin: HaproxyBin = haptic_e2e::bins::haproxy_bins().into_iter().next().expect("an HAProxy binary");
    let args = ["--agent-tls-secret", SECRET, "--agent-tls-server-name", NAME, "--agent-tls-issue"];
    let ctl = Controller::start_with(&e.cp, ns, &bin, "ctl-tls", e.dir.path(), &args);

    let secrets: Api<Secret> = Api::namespaced(e.client.clone(), ns);
    let get = |n: &'static str| {
        let secrets = secrets.clone();
        async move { secrets.get_opt(n).await.ok().flatten() }
    };
    let serving = eventually("the serving Secret", || get(SECRET)).await;
    let ca = eventually("the CA Secret", || get("agent-tls-ca")).await;
    for s in [&serving, &ca] {
        let owners = s.metadata.owner_references.clone().unwrap_or_default();
        assert!(owners.iter().any(|o| o.uid == uid && o.kind == "HAProxyConfig"), "{owners:?}");
    }
    assert_eq!(serving.type_.as_deref(), Some("kubernetes.io/tls"));
    let ann = serving.metadata.annotations.clone().unwrap();
    assert_eq!(ann[SERVER_NAME], NAME);
    assert!(ann.contains_key(CERT_NOT_AFTER) && ann.contains_key(CA_NOT_AFTER));
    assert_eq!(data(&serving, "ca.crt"), data(&ca, "ca.crt"), "the bundle is the CA");
    assert!(!serving.data.as_ref().unwrap().contains_key("ca.key"), "the CA key stays out of the agents' Secret");
    verifies(&serving).await.unwrap();
    // Left alone, nothing changes.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let again = get(SECRET).await.unwrap();
    assert_eq!(again.metadata.resource_version, serving.metadata.resource_version, "a valid Secret was rewritten");

    // The serving Secret deleted: issued again from the same CA.
    secrets.delete(SECRET, &DeleteParams::default()).await.unwrap();
    let reissued = eventually("the serving Secret again", || async {
        get(SECRET).await.filter(|s| s.metadata.uid != serving.metadata.uid)
    })
    .await;
    assert_ne!(data(&reissued, "tls.crt"), data(&serving, "tls.crt"));
    assert_eq!(data(&reissued, "ca.crt"), data(&ca, "ca.crt"));
    verifies(&reissued).await.unwrap();

    // The CA deleted: a new CA, and a certificate from it.
    secrets.delete("agent-tls-ca", &DeleteParams::default()).await.unwrap();
    let ca2 =
        eventually("a new CA", || async { get("agent-tls-ca").await.filter(|s| s.metadata.uid != ca.metadata.uid) })
            .await;
    let serving2 = eventually("a certificate of the new CA", || async {
        get(SECRET).await.filter(|s| data(s, "ca.crt").starts_with(&data(&ca2, "ca.crt")))
    })
    .await;
    verifies(&serving2).await.unwrap();
    // The old certificate does not chain to the new CA.
    let mut mixed = serving.clone();
    mixed.data.as_mut().unwrap().insert("ca.crt".into(), k8s_openapi::ByteString(data(&ca2, "ca.crt").into_bytes()));
    let err = verifies(&mixed).await.unwrap_err();
    assert!(err.contains("UnknownIssuer"), "{err}");
    assert!(ctl.log().contains("issued the agents' serving certificate"), "{}", ctl.log());
    drop(ctl);
    let pids = e.cp.pids();
    let mut cp = e.cp;
    cp.stop();
    haptic_e2e::assert_no_stray(&pids);
}
