//! `LocalPods`: a kubelet stand-in that runs HAProxy pods for real on loopback addresses.
//!
//! Owns a set of `Pod` objects in one namespace of a real apiserver and, for each, a real
//! [`crate::pod::Pod`] (HAProxy master-worker + `haptic-agent`) whose agent listens on the pod's
//! own address `127.A.B.N` and the agent port. It patches each pod's `status` the way a kubelet
//! does (`phase`, `podIP`, `containerStatuses` with `running`/`terminated`, `restartCount`,
//! `containerID`) and can kill, restart, delete and replace pods and containers. It must never
//! touch a pod it did not create, nor bind anything outside 127.0.0.0/8.

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};

use k8s_openapi::api::core::v1::Pod as KubePod;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::bins::HaproxyBin;
use crate::k8s::control_plane::rand_u64;
use crate::net::free_port;
use crate::pod::{Pod, PodOpts};
use crate::process::HarnessError;

/// The name of the agent container in the pod spec (what the controller's discovery looks for).
pub const AGENT_CONTAINER: &str = "agent";
/// The name of the HAProxy container in the pod spec.
pub const HAPROXY_CONTAINER: &str = "haproxy";

/// One of a pod's two containers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Container {
    /// `haptic-agent run`.
    Agent,
    /// The HAProxy master-worker.
    Haproxy,
}

impl Container {
    fn name(self) -> &'static str {
        match self {
            Container::Agent => AGENT_CONTAINER,
            Container::Haproxy => HAPROXY_CONTAINER,
        }
    }
}

/// What went wrong in the kubelet stand-in.
#[derive(Debug, thiserror::Error)]
pub enum LocalPodsError {
    /// The apiserver refused or failed a request.
    #[error("{what}: {source}")]
    Kube {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// Starting HAProxy or the agent failed.
    #[error(transparent)]
    Harness(#[from] HarnessError),
    /// No such pod in this set.
    #[error("no local pod named {0:?}")]
    NoSuchPod(String),
}

/// How [`LocalPods`] makes its pods.
#[derive(Debug, Clone)]
pub struct LocalPodsOpts {
    /// The namespace of the `Pod` objects (must exist).
    pub namespace: String,
    /// The pods are named `<prefix>-<n>`.
    pub prefix: String,
    /// Labels of every pod (what a `podSelector` matches).
    pub labels: BTreeMap<String, String>,
    /// The port every agent listens on (the `agent.port` of the config resource).
    pub agent_port: u16,
    /// The HAProxy build every pod runs.
    pub haproxy: HaproxyBin,
    /// Options for every pod's agent; `credentials` should be the Secret's, `agent_listen` is set
    /// per pod, `env` gains `POD_IP` and `POD_NAME` (the downward API).
    pub pod: PodOpts,
}

impl LocalPodsOpts {
    /// Options with label `app.kubernetes.io/name=haproxy`, a free agent port and the given
    /// credentials.
    pub fn new(namespace: &str, haproxy: HaproxyBin, user: &str, password: &str) -> Self {
        Self {
            namespace: namespace.to_string(),
            prefix: "haproxy".into(),
            labels: BTreeMap::from([("app.kubernetes.io/name".to_string(), "haproxy".to_string())]),
            agent_port: free_port(),
            haproxy,
            pod: PodOpts { credentials: Some((user.into(), password.into())), ..PodOpts::default() },
        }
    }
}

/// One pod: its object's identity, its loopback IP, its processes and container bookkeeping.
#[derive(Debug)]
struct LocalPod {
    ip: Ipv4Addr,
    uid: String,
    proc: Pod,
    agent: ContainerState,
    haproxy: ContainerState,
}

#[derive(Debug, Clone)]
struct ContainerState {
    running: bool,
    restarts: i32,
    id: String,
    exit_code: i32,
}

impl ContainerState {
    fn new() -> Self {
        Self { running: true, restarts: 0, id: container_id(), exit_code: 0 }
    }

    fn status(&self, name: &str) -> serde_json::Value {
        let state = if self.running {
            json!({"running": {"startedAt": now()}})
        } else {
            json!({"terminated": {"exitCode": self.exit_code, "reason": "Error", "finishedAt": now(),
                                  "containerID": self.id}})
        };
        json!({
            "name": name,
            "image": format!("haptic/{name}:local"),
            "imageID": "",
            "containerID": self.id,
            "ready": self.running,
            "started": self.running,
            "restartCount": self.restarts,
            "state": state,
        })
    }
}

fn container_id() -> String {
    format!("local://{:016x}", rand_u64())
}

fn now() -> String {
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let t = time::OffsetDateTime::from_unix_timestamp(secs as i64).unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    t.format(&time::format_description::well_known::Rfc3339).unwrap_or_default()
}

/// A set of pods run for real on 127.A.B.N, with their objects kept up to date like a kubelet.
#[derive(Debug)]
pub struct LocalPods {
    api: Api<KubePod>,
    opts: LocalPodsOpts,
    net: [u8; 2],
    next: u8,
    pods: BTreeMap<String, LocalPod>,
}

impl LocalPods {
    /// An empty set in `opts.namespace`; pods get addresses `127.A.B.2`, `127.A.B.3`, … with
    /// `A.B` chosen at random so that concurrent tests do not collide.
    pub fn new(client: Client, opts: LocalPodsOpts) -> Self {
        let r = rand_u64().to_le_bytes();
        let api = Api::namespaced(client, &opts.namespace);
        Self { api, opts, net: [r[0].clamp(1, 254), r[1].clamp(1, 254)], next: 2, pods: BTreeMap::new() }
    }

    /// Creates and starts `n` more pods; returns their names.
    pub async fn create(&mut self, n: usize) -> Result<Vec<String>, LocalPodsError> {
        let mut names = Vec::new();
        for _ in 0..n {
            let name = format!("{}-{}", self.opts.prefix, self.next);
            self.start_pod(&name).await?;
            names.push(name);
        }
        Ok(names)
    }

    /// Creates the object of `name` (a new UID), runs its processes and marks it Running.
    async fn start_pod(&mut self, name: &str) -> Result<(), LocalPodsError> {
        let ip = Ipv4Addr::new(127, self.net[0], self.net[1], self.next);
        self.next = self.next.checked_add(1).expect("at most 253 local pods per set");
        let obj: KubePod = serde_json::from_value(json!({
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": self.opts.labels},
            "spec": {
                "containers": [
                    {"name": HAPROXY_CONTAINER, "image": "haptic/haproxy:local",
                     "ports": [{"name": "http", "containerPort": 8080}]},
                    {"name": AGENT_CONTAINER, "image": "haptic/agent:local",
                     "ports": [{"name": "agent", "containerPort": self.opts.agent_port}]},
                ],
            },
        }))
        .expect("a valid Pod");
        let created = self
            .api
            .create(&PostParams::default(), &obj)
            .await
            .map_err(|source| LocalPodsError::Kube { what: format!("create pod {name}"), source })?;
        let uid = created.metadata.uid.unwrap_or_default();
        let mut popts = self.opts.pod.clone();
        popts.agent_listen = Some(SocketAddr::from((ip, self.opts.agent_port)));
        popts.health_bind = Some(format!("{ip}:{}", free_port()));
        popts.env.push(("POD_IP".into(), ip.to_string()));
        popts.env.push(("POD_NAME".into(), name.to_string()));
        let proc = Pod::start(&self.opts.haproxy, popts).await?;
        let pod = LocalPod { ip, uid, proc, agent: ContainerState::new(), haproxy: ContainerState::new() };
        self.pods.insert(name.to_string(), pod);
        self.patch_status(name).await
    }

    /// Writes the pod's status as a kubelet would.
    async fn patch_status(&self, name: &str) -> Result<(), LocalPodsError> {
        let p = self.pods.get(name).ok_or_else(|| LocalPodsError::NoSuchPod(name.into()))?;
        let all_running = p.agent.running && p.haproxy.running;
        let ready = if all_running { "True" } else { "False" };
        let status = json!({
            "status": {
                "phase": "Running",
                "podIP": p.ip.to_string(),
                "podIPs": [{"ip": p.ip.to_string()}],
                "hostIP": "127.0.0.1",
                "startTime": now(),
                "conditions": [
                    {"type": "Initialized", "status": "True"},
                    {"type": "ContainersReady", "status": ready},
                    {"type": "Ready", "status": ready},
                ],
                "containerStatuses": [p.haproxy.status(HAPROXY_CONTAINER), p.agent.status(AGENT_CONTAINER)],
            }
        });
        self.api
            .patch_status(name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|source| LocalPodsError::Kube { what: format!("patch status of pod {name}"), source })?;
        Ok(())
    }

    /// The names of the pods, sorted.
    pub fn names(&self) -> Vec<String> {
        self.pods.keys().cloned().collect()
    }

    /// The pod's IP (`127.A.B.N`).
    pub fn ip(&self, name: &str) -> Option<Ipv4Addr> {
        self.pods.get(name).map(|p| p.ip)
    }

    /// Rewrites every running pod's credentials file with `password` (as the kubelet updates a
    /// mounted Secret: no container restarts); pods created later get it too.
    pub fn rotate_credentials(&mut self, password: &str) -> Result<(), LocalPodsError> {
        for p in self.pods.values_mut() {
            p.proc
                .rotate_credentials(password)
                .map_err(|source| HarnessError::Io { what: "rewrite credentials".into(), source })?;
        }
        if let Some((_, pw)) = self.opts.pod.credentials.as_mut() {
            *pw = password.to_string();
        }
        Ok(())
    }

    /// The UID of the pod's current object.
    pub fn uid(&self, name: &str) -> Option<&str> {
        self.pods.get(name).map(|p| p.uid.as_str())
    }

    /// The pod's processes (agent client, HAProxy, tree root).
    pub fn pod(&self, name: &str) -> Option<&Pod> {
        self.pods.get(name).map(|p| &p.proc)
    }

    /// `http://<pod ip>:<agent port>`.
    pub fn agent_url(&self, name: &str) -> Option<String> {
        self.pods.get(name).map(|p| format!("http://{}:{}", p.ip, self.opts.agent_port))
    }

    /// The agent port shared by every pod.
    pub fn agent_port(&self) -> u16 {
        self.opts.agent_port
    }

    /// The namespace of the pods.
    pub fn namespace(&self) -> &str {
        &self.opts.namespace
    }

    /// Kills a container's processes and reports it `terminated` (exit code 137).
    pub async fn kill_container(&mut self, name: &str, c: Container) -> Result<(), LocalPodsError> {
        let p = self.pods.get_mut(name).ok_or_else(|| LocalPodsError::NoSuchPod(name.into()))?;
        match c {
            Container::Agent => {
                p.proc.kill_agent_9();
                p.agent.running = false;
                p.agent.exit_code = 137;
            }
            Container::Haproxy => {
                p.proc.kill_haproxy();
                p.haproxy.running = false;
                p.haproxy.exit_code = 137;
            }
        }
        self.patch_status(name).await
    }

    /// Starts a container again (killing it first if it runs): restart count + 1, a new
    /// container id, state `running`.
    pub async fn restart_container(&mut self, name: &str, c: Container) -> Result<(), LocalPodsError> {
        let p = self.pods.get_mut(name).ok_or_else(|| LocalPodsError::NoSuchPod(name.into()))?;
        let state = match c {
            Container::Agent => {
                p.proc.restart_agent().await?;
                &mut p.agent
            }
            Container::Haproxy => {
                p.proc.restart_haproxy().await?;
                &mut p.haproxy
            }
        };
        state.running = true;
        state.restarts += 1;
        state.id = container_id();
        state.exit_code = 0;
        eprintln!("local-pods: restarted container {} of pod {name}", c.name());
        self.patch_status(name).await
    }

    /// The container's restart count.
    pub fn restart_count(&self, name: &str, c: Container) -> Option<i32> {
        self.pods.get(name).map(|p| match c {
            Container::Agent => p.agent.restarts,
            Container::Haproxy => p.haproxy.restarts,
        })
    }

    /// Stops the pod's processes and deletes its object (grace period 0, as a kubelet
    /// confirming the deletion would).
    pub async fn delete(&mut self, name: &str) -> Result<(), LocalPodsError> {
        let p = self.pods.remove(name).ok_or_else(|| LocalPodsError::NoSuchPod(name.into()))?;
        drop(p);
        self.api
            .delete(name, &DeleteParams { grace_period_seconds: Some(0), ..DeleteParams::default() })
            .await
            .map_err(|source| LocalPodsError::Kube { what: format!("delete pod {name}"), source })?;
        Ok(())
    }

    /// Deletes the pod and creates one with the same name: a new UID, a new IP, fresh processes.
    pub async fn replace(&mut self, name: &str) -> Result<(), LocalPodsError> {
        self.delete(name).await?;
        self.start_pod(name).await
    }

    /// Every process id of every pod (agents and HAProxy), for leak checks.
    pub fn pids(&self) -> Vec<u32> {
        self.pods.values().flat_map(|p| p.proc.agent_pid().into_iter().chain(p.proc.haproxy().known_pids())).collect()
    }
}
