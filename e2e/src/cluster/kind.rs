//! The real-cluster backend (`HAPTIC_E2E_CLUSTER=kind`): a cluster where `charts/haptic` is
//! installed, reached through the kubeconfig.
//!
//! Owns finding the chart's objects (the `HAProxyConfig`'s own `podSelector` names the HAProxy
//! pods), traffic and agent checks through the API's port-forward, pod deletes and scale through
//! the API, and container kills and file edits through the node (`docker exec <node> crictl` /
//! the kubelet's emptyDir path), as `scripts/e2e-kind.sh` sets it up. It must never change the
//! cluster beyond the test namespace. Settings (env): `HAPTIC_E2E_NAMESPACE` (default `haptic`),
//! `HAPTIC_E2E_HAPROXY_DEPLOYMENT` (default `haptic-haproxy`), `HAPTIC_E2E_CONFIG_VOLUME`
//! (default `haproxy-config`), `HAPTIC_E2E_HTTP_PORT` (default 8080).

use std::collections::BTreeMap;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Pod, Secret};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::Client;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{eventually, Cluster, ClusterError, Result};
use crate::pod::base64;

/// A real cluster with the chart installed.
pub struct KindCluster {
    client: Client,
    ns: String,
    deployment: String,
    volume: String,
    http_port: u16,
}

fn env_or(name: &str, default: &str) -> String {
    std::env::var(name).ok().filter(|v| !v.is_empty()).unwrap_or_else(|| default.to_string())
}

impl std::fmt::Debug for KindCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindCluster").field("namespace", &self.ns).finish_non_exhaustive()
    }
}

impl KindCluster {
    /// Connects through `KUBECONFIG` (or the default kubeconfig) to the namespace the chart is in.
    pub async fn connect() -> Result<Self> {
        let client = Client::try_default().await.map_err(|e| ClusterError::of("kubeconfig", e))?;
        Ok(Self {
            client,
            ns: env_or("HAPTIC_E2E_NAMESPACE", "haptic"),
            deployment: env_or("HAPTIC_E2E_HAPROXY_DEPLOYMENT", "haptic-haproxy"),
            volume: env_or("HAPTIC_E2E_CONFIG_VOLUME", "haproxy-config"),
            http_port: env_or("HAPTIC_E2E_HTTP_PORT", "8080").parse().map_err(|e| ClusterError::of("HTTP port", e))?,
        })
    }

    fn pods_api(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// The `HAProxyConfig`'s spec (the chart's values as the controller sees them).
    async fn spec(&self) -> Result<Value> {
        let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
            self.client.clone(),
            &self.ns,
            &kube::core::ApiResource::from_gvk_with_plural(
                &kube::core::GroupVersionKind::gvk("haptic.dev", "v1alpha1", "HAProxyConfig"),
                "haproxyconfigs",
            ),
        );
        let obj = api.get(super::CONFIG).await.map_err(|e| ClusterError::of("get the HAProxyConfig", e))?;
        Ok(obj.data["spec"].clone())
    }

    async fn selector(&self) -> Result<String> {
        let labels: BTreeMap<String, String> =
            serde_json::from_value(self.spec().await?["podSelector"]["matchLabels"].clone()).unwrap_or_default();
        Ok(labels.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","))
    }

    async fn agent_port(&self) -> Result<u16> {
        let port = self.spec().await?["agent"]["port"].as_u64().unwrap_or(8080);
        u16::try_from(port).map_err(|e| ClusterError::of("spec.agent.port", e))
    }

    async fn pod(&self, name: &str) -> Result<Pod> {
        self.pods_api().get(name).await.map_err(|e| ClusterError::of(&format!("get pod {name}"), e))
    }

    /// One HTTP/1.1 request through the API's port-forward to `port` of `pod`.
    async fn forward(&self, pod: &str, port: u16, req: String) -> Result<(u16, String)> {
        let mut pf =
            self.pods_api().portforward(pod, &[port]).await.map_err(|e| ClusterError::of("port-forward", e))?;
        let mut stream = pf.take_stream(port).ok_or_else(|| ClusterError("port-forward gave no stream".into()))?;
        let io = async {
            stream.write_all(req.as_bytes()).await?;
            let mut buf = Vec::new();
            stream.read_to_end(&mut buf).await?;
            Ok::<_, std::io::Error>(buf)
        };
        let buf = tokio::time::timeout(Duration::from_secs(20), io)
            .await
            .map_err(|_| ClusterError("port-forward request timed out".into()))?
            .map_err(|e| ClusterError::of("port-forward I/O", e))?;
        drop(stream);
        let _ = pf.join().await;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let (head, body) =
            text.split_once("\r\n\r\n").ok_or_else(|| ClusterError(format!("bad response: {text:?}")))?;
        let code = head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
        Ok((code, body.to_string()))
    }

    async fn credentials(&self) -> Result<(String, String)> {
        let s: Secret = Api::namespaced(self.client.clone(), &self.ns)
            .get("haptic-agent-credentials")
            .await
            .map_err(|e| ClusterError::of("get the credentials Secret", e))?;
        let d = s.data.unwrap_or_default();
        let get = |k: &str| d.get(k).map(|v| String::from_utf8_lossy(&v.0).trim().to_string()).unwrap_or_default();
        Ok((get("username"), get("password")))
    }

    /// `docker exec <node> <args>` (kind's nodes are containers).
    fn node_exec(node: &str, args: &[&str]) -> Result<String> {
        let out = Command::new("docker")
            .arg("exec")
            .arg(node)
            .args(args)
            .output()
            .map_err(|e| ClusterError::of("docker exec", e))?;
        if !out.status.success() {
            return Err(ClusterError(format!("docker exec {node} {args:?}: {}", String::from_utf8_lossy(&out.stderr))));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    async fn stop_container(&self, pod: &str, container: &str) -> Result<()> {
        let p = self.pod(pod).await?;
        let node = p.spec.and_then(|s| s.node_name).ok_or_else(|| ClusterError("pod not scheduled".into()))?;
        let before = restarts(&self.pod(pod).await?, container);
        let id = Self::node_exec(&node, &["crictl", "ps", "-q", "--name", container, "--pod", &pod_id(&node, pod)?])?;
        Self::node_exec(&node, &["crictl", "stop", "--timeout", "0", id.trim()])?;
        eventually(&format!("{container} of {pod} to restart"), Duration::from_secs(120), || async {
            let p = self.pod(pod).await.ok()?;
            (restarts(&p, container) > before).then_some(())
        })
        .await
    }
}

fn pod_id(node: &str, pod: &str) -> Result<String> {
    Ok(KindCluster::node_exec(node, &["crictl", "pods", "-q", "--name", pod])?.trim().to_string())
}

fn restarts(p: &Pod, container: &str) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|v| v.iter().find(|c| c.name == container))
        .map_or(0, |c| c.restart_count)
}

impl Cluster for KindCluster {
    fn client(&self) -> Client {
        self.client.clone()
    }

    fn namespace(&self) -> &str {
        &self.ns
    }

    fn bind_line(&self) -> String {
        format!("bind :{}", self.http_port)
    }

    async fn haproxy_pods(&self) -> Result<Vec<String>> {
        let sel = self.selector().await?;
        let list = self
            .pods_api()
            .list(&ListParams::default().labels(&sel))
            .await
            .map_err(|e| ClusterError::of("list HAProxy pods", e))?;
        let mut names: Vec<String> = list
            .items
            .into_iter()
            .filter(|p| p.metadata.deletion_timestamp.is_none())
            .filter_map(|p| p.metadata.name)
            .collect();
        names.sort();
        Ok(names)
    }

    async fn scale_haproxy(&mut self, n: usize) -> Result<()> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &self.ns);
        let patch = json!({"spec": {"replicas": n}});
        api.patch_scale(&self.deployment, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| ClusterError::of("scale the HAProxy Deployment", e))?;
        eventually(&format!("{n} HAProxy pods"), Duration::from_secs(180), || async {
            (self.haproxy_pods().await.ok()?.len() == n).then_some(())
        })
        .await
    }

    async fn replace_all_haproxy(&mut self) -> Result<()> {
        // `kubectl rollout restart`: a changed pod-template annotation.
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &self.ns);
        let at = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let patch =
            json!({"spec": {"template": {"metadata": {"annotations": {"haptic.dev/restartedAt": at.to_string()}}}}});
        api.patch(&self.deployment, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(|e| ClusterError::of("restart the HAProxy Deployment", e))?;
        let old = self.haproxy_pods().await?;
        eventually("the rollout to replace every pod", Duration::from_secs(300), || async {
            let now = self.haproxy_pods().await.ok()?;
            (now.len() == old.len() && now.iter().all(|n| !old.contains(n))).then_some(())
        })
        .await
    }

    async fn get(&self, pod: &str, path: &str) -> Result<(u16, String)> {
        let req = format!("GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        self.forward(pod, self.http_port, req).await
    }

    async fn agent_state(&self, pod: &str) -> Result<Value> {
        let (u, p) = self.credentials().await?;
        let auth = base64(format!("{u}:{p}").as_bytes());
        let req = format!(
            "GET /v1/state HTTP/1.1\r\nHost: localhost\r\nAuthorization: Basic {auth}\r\nConnection: close\r\n\r\n"
        );
        let (code, body) = self.forward(pod, self.agent_port().await?, req).await?;
        if code != 200 {
            return Err(ClusterError(format!("GET /v1/state of {pod}: {code} {body}")));
        }
        serde_json::from_str(&body).map_err(|e| ClusterError::of("decode /v1/state", e))
    }

    async fn restart_agent(&mut self, pod: &str) -> Result<()> {
        self.stop_container(pod, "agent").await
    }

    async fn kill_haproxy_worker(&mut self, pod: &str) -> Result<()> {
        self.stop_container(pod, "haproxy").await
    }

    async fn edit_file_in_pod(&self, pod: &str, path: &str, content: &str) -> Result<()> {
        let p = self.pod(pod).await?;
        let uid = p.metadata.uid.clone().unwrap_or_default();
        let node = p.spec.and_then(|s| s.node_name).ok_or_else(|| ClusterError("pod not scheduled".into()))?;
        let file =
            format!("/var/lib/kubelet/pods/{uid}/volumes/kubernetes.io~empty-dir/{}/current/{path}", self.volume);
        let script = format!("printf '%s' \"$1\" > {file}");
        Self::node_exec(&node, &["sh", "-c", &script, "sh", content]).map(|_| ())
    }

    async fn kill_leader(&mut self) -> Result<String> {
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.ns);
        let lease = leases.get("haptic-edge").await.map_err(|e| ClusterError::of("get the Lease", e))?;
        let holder =
            lease.spec.and_then(|s| s.holder_identity).ok_or_else(|| ClusterError("nobody holds the Lease".into()))?;
        // The identity is `<pod name>-<random>`.
        let pod = holder.rsplit_once('-').map(|(p, _)| p.to_string()).unwrap_or(holder.clone());
        self.pods_api()
            .delete(&pod, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
            .await
            .map_err(|e| ClusterError::of(&format!("delete the leader pod {pod}"), e))?;
        Ok(holder)
    }
}
