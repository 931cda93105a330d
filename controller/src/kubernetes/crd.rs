//! The `HAProxyConfig` custom resource (`haptic.dev/v1alpha1`, short name `hapc`).
//!
//! Owns the Rust types of the resource's spec and status, the CRD generated from
//! them (`haptic-controller crd`, committed as `charts/haptic/crds/haproxyconfig.yaml`), and the
//! small pure helpers that turn durations and the status roll-up into the resource's fields. It
//! must never talk to the apiserver: the watchers and the status writer do.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube::core::Selector;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A duration as the controller reads it (`30s`, `1m30s`, `500ms`, `1h`): the API refuses any
/// other text, so a bad duration never gets as far as the controller.
pub const DURATION_PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

/// The largest inline `haproxy.cfg` (`spec.config`) and inline file (`files[].content`), in
/// characters; bigger texts belong in a ConfigMap (and an object is limited to about 1.5 MiB
/// by etcd anyway).
pub const MAX_INLINE: u32 = 1 << 20;

/// The message of the rule that exactly one of `config`, `configFrom` and `render` is set.
pub const ONE_CONFIG_SOURCE: &str = "exactly one of spec.config, spec.configFrom and spec.render must be set";

/// The message of the rule that `render` names what to render.
pub const RENDER_NAMES_A_CLASS: &str = "spec.render needs exactly one of ingressClassName and gatewayClassName";

/// The message of the rule that a file entry names exactly one source.
pub const ONE_FILE_SOURCE: &str = "each file needs exactly one of configMapKeyRef, secretRef and content";

/// The desired HAProxy configuration of one fleet of HAProxy pods in this namespace.
#[derive(CustomResource, Debug, Clone, Default, Serialize, Deserialize, KubeSchema, PartialEq)]
#[kube(
    group = "haptic.dev",
    version = "v1alpha1",
    kind = "HAProxyConfig",
    plural = "haproxyconfigs",
    singular = "haproxyconfig",
    shortname = "hapc",
    category = "haptic",
    namespaced,
    status = "HAProxyConfigStatus",
    printcolumn = r#"{"name":"Plan","type":"string","jsonPath":".status.planShort","description":"the latest render that passed the gate (12 hex digits of its plan id)"}"#,
    printcolumn = r#"{"name":"Gate","type":"string","jsonPath":".status.gate.state"}"#,
    printcolumn = r#"{"name":"Converged","type":"string","jsonPath":".status.convergedText","description":"pods running the plan / pods"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Leader","type":"string","priority":1,"jsonPath":".status.leader.identity","description":"the controller replica that holds the Lease and deploys"}"#,
    printcolumn = r#"{"name":"Gate-Message","type":"string","priority":1,"jsonPath":".status.gate.message","description":"HAProxy's words when the gate refused the latest render"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "(has(self.config) ? 1 : 0) + (has(self.configFrom) ? 1 : 0) + (has(self.render) ? 1 : 0) == 1"
).message(ONE_CONFIG_SOURCE))]
pub struct HAProxyConfigSpec {
    /// The HAProxy pods (same namespace) this configuration is deployed to.
    pub pod_selector: LabelSelector,
    /// How to reach each pod's agent.
    #[serde(default)]
    pub agent: AgentSpec,
    /// The `haproxy.cfg` text (exactly one of `config` and `configFrom`; at most 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_INLINE))]
    pub config: Option<String>,
    /// Where the `haproxy.cfg` text comes from instead of `config`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_from: Option<ConfigFrom>,
    /// Render `haproxy.cfg` and its maps and certificates from the cluster's objects instead of
    /// `config` or `configFrom`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub render: Option<RenderSpec>,
    /// Auxiliary files (maps, certificates, error pages), by path relative to the config.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 1024))]
    pub files: Vec<FileSpec>,
    /// Controller behaviour.
    #[serde(default)]
    pub controller: ControllerSpec,
}

/// How the controller reaches an agent.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct AgentSpec {
    /// The agent's port on the pod IP.
    #[serde(default = "default_agent_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: u16,
    /// The name of the agent container (its state decides admission).
    #[serde(default = "default_agent_container")]
    pub container: String,
    /// The Secret with keys `username` and `password` (default: the chart's generated Secret of
    /// a release named `haptic`).
    #[serde(default = "default_credentials_ref")]
    pub credentials_secret_ref: LocalObjectRef,
}

/// The chart's `agent.port` (HAProxy's own ports in the chart are 8080 and 8443).
fn default_agent_port() -> u16 {
    9080
}
fn default_agent_container() -> String {
    "agent".into()
}
fn default_credentials_ref() -> LocalObjectRef {
    LocalObjectRef { name: "haptic-agent-credentials".into() }
}

impl Default for AgentSpec {
    fn default() -> Self {
        Self {
            port: default_agent_port(),
            container: default_agent_container(),
            credentials_secret_ref: default_credentials_ref(),
        }
    }
}

/// A reference to an object in the resource's namespace.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
pub struct LocalObjectRef {
    /// The object's name.
    pub name: String,
}

/// A key of a ConfigMap in the resource's namespace.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyRef {
    /// The ConfigMap's name.
    pub name: String,
    /// The key.
    pub key: String,
}

/// Where `haproxy.cfg` comes from.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ConfigFrom {
    /// A ConfigMap key holding the text.
    pub config_map_key_ref: KeyRef,
}

/// What to render from the cluster's objects, and how.
#[derive(Debug, Clone, Serialize, Deserialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.ingressClassName) != has(self.gatewayClassName)").message(RENDER_NAMES_A_CLASS))]
pub struct RenderSpec {
    /// Serve the Ingresses (all namespaces) of this IngressClass; the class must name the
    /// controller `haptic.dev/ingress-controller`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub ingress_class_name: Option<String>,
    /// Serve the Gateways (all namespaces) of this GatewayClass and the HTTPRoutes attached to
    /// them; the class must name the controller `haptic.dev/gateway-controller`. Each Gateway
    /// gets a Service of its own in this namespace, selecting the fleet's pods.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub gateway_class_name: Option<String>,
    /// Serve only the objects of these namespaces (and of this one, where the publish Service
    /// and the default certificate live): Ingresses, Gateways and their routes, ReferenceGrants,
    /// Services and EndpointSlices are then listed and watched in each of them, and the Secrets
    /// and ConfigMaps they name read there, never cluster-wide; so the controller needs read
    /// access only there (the chart's `render.namespaces` gives it a Role in each instead of a
    /// ClusterRole). A backend, certificate or route in any other namespace is not found.
    /// Empty (the default): every namespace.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 256),
        inner(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))
    )]
    pub namespaces: Vec<String>,
    /// The Service in front of the fleet (this namespace): its address goes into the
    /// `status.loadBalancer` of every served Ingress.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub publish_service: Option<LocalObjectRef>,
    /// Replaces the built-in template (minijinja) with a ConfigMap key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template: Option<ConfigFrom>,
    /// Config text added at the end of sections (trusted: written by the admin).
    #[serde(default)]
    pub snippets: SnippetsSpec,
    /// Let Ingresses bring HAProxy directives for their backends through the
    /// `configuration-snippet` / `server-snippet` annotations. Off by default: anyone who may
    /// create an Ingress could then add config. Even when on, only lines of an allow-list pass
    /// (header, path, status, deny/allow/return/redirect and variable actions, timeouts, a few
    /// options), read word by word as HAProxy reads them; anything else is refused in that
    /// Ingress's Events.
    #[serde(default)]
    pub allow_snippet_annotations: bool,
    /// The IP address the frontends bind.
    #[serde(default = "default_bind_address")]
    #[schemars(length(min = 2, max = 45))]
    pub bind_address: String,
    /// The plain HTTP port the fleet listens on.
    #[serde(default = "default_http_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub http_port: u16,
    /// The HTTPS port (used once an Ingress has a valid TLS Secret).
    #[serde(default = "default_https_port")]
    #[schemars(range(min = 1, max = 65535))]
    pub https_port: u16,
    /// A `health` frontend on this port answering `/healthz` and `/ready` with 200 (the chart's
    /// probes use 8404); none when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub health_port: Option<u16>,
    /// Server slots every backend has at least: endpoints up to this many change at runtime.
    #[serde(default = "default_server_slots")]
    #[schemars(range(min = 1, max = 4096))]
    pub server_slots: u16,
    /// What HAProxy does to a request's path before routing it: `Normalize` (the default, as
    /// ingress-nginx) decodes percent-escapes of unreserved characters, merges repeated slashes
    /// and resolves `.` and `..` segments, so `//admin`, `/%61dmin` and `/./admin` are routed and
    /// served as `/admin` and cannot miss a protected `/admin` route; `Off` routes the path as
    /// the client sent it.
    #[serde(default)]
    pub path_normalization: PathNormalizationSpec,
    /// What namespaces may do to each other's Ingress hosts.
    #[serde(default)]
    pub ingress: IngressRenderSpec,
    /// What Gateways may bring to the objects the controller creates for them.
    #[serde(default)]
    pub gateway: GatewayRenderSpec,
    /// The access log on HAProxy's standard output: `Http` (the default: HAProxy's HTTP log
    /// format), `Json` (one JSON object per request) or `Off`.
    #[serde(default)]
    pub access_log: AccessLogSpec,
    /// The `X-Forwarded-For`, `-Proto`, `-Host` and `-Port` headers the backends get.
    #[serde(default)]
    pub forwarded_headers: ForwardedHeadersSpec,
    /// Every client-facing bind expects the PROXY protocol (v1 or v2): for a load balancer in
    /// front that speaks it; the client address it gives is the one logged and forwarded.
    /// Connections without it are closed.
    #[serde(default)]
    pub proxy_protocol: bool,
    /// Timeouts (ingress-nginx's defaults).
    #[serde(default)]
    pub timeouts: TimeoutsSpec,
    /// `Strict-Transport-Security` on every response over TLS; none when unset (the default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hsts: Option<HstsSpec>,
    /// A `stats` frontend on this port: HAProxy's Prometheus exporter on `/metrics` and its
    /// stats page on `/stats` (the chart sets `haproxy.metricsPort`); none when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub stats_port: Option<u16>,
    /// A `kubernetes.io/tls` Secret (this namespace) served first on the Ingresses' TLS bind:
    /// to a client whose SNI names no Ingress's certificate, or that sends none, so it never
    /// sees a tenant's; and for an Ingress TLS entry without `secretName`. Unset: a self-signed one the
    /// controller generates when it starts (the chart names one it generates once).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_certificate: Option<LocalObjectRef>,
    /// How long a stopping HAProxy worker (after a reload, or when its pod stops) may keep
    /// serving its open connections before they are closed (`hard-stop-after`); the chart sets
    /// `haproxy.drainSeconds`. Unbounded when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub drain_seconds: Option<u32>,
}

/// `spec.render.accessLog`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum AccessLogSpec {
    /// HAProxy's HTTP log format.
    #[default]
    Http,
    /// One JSON object per request.
    Json,
    /// No access log.
    Off,
}

/// `spec.render.forwardedHeaders`.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ForwardedHeadersSpec {
    /// Set the headers (the default).
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Clients (CIDRs or addresses) whose own `X-Forwarded-*` headers are kept, the client
    /// address appended to their `X-Forwarded-For`: the load balancers in front. Any other
    /// client's headers are replaced, so no client can pass for another address or scheme.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 2, max = 49)))]
    pub trusted_proxies: Vec<String>,
}

fn yes() -> bool {
    true
}

impl Default for ForwardedHeadersSpec {
    fn default() -> Self {
        ForwardedHeadersSpec { enabled: true, trusted_proxies: Vec::new() }
    }
}

/// `spec.render.timeouts`, in seconds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase", default)]
pub struct TimeoutsSpec {
    /// To connect to a server (5).
    #[schemars(range(min = 1, max = 3600))]
    pub connect_seconds: u32,
    /// Of a client that sends nothing (60).
    #[schemars(range(min = 1, max = 86400))]
    pub client_seconds: u32,
    /// Of a server that answers nothing (60).
    #[schemars(range(min = 1, max = 86400))]
    pub server_seconds: u32,
    /// Of an idle websocket or other tunnel (3600).
    #[schemars(range(min = 1, max = 604800))]
    pub tunnel_seconds: u32,
    /// For a client to send a whole request's headers (10).
    #[schemars(range(min = 1, max = 3600))]
    pub http_request_seconds: u32,
}

impl Default for TimeoutsSpec {
    fn default() -> Self {
        let t = haptic_render::edge::Timeouts::default();
        TimeoutsSpec {
            connect_seconds: t.connect,
            client_seconds: t.client,
            server_seconds: t.server,
            tunnel_seconds: t.tunnel,
            http_request_seconds: t.http_request,
        }
    }
}

/// `spec.render.hsts`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct HstsSpec {
    /// `max-age`, in seconds (a year by default).
    #[serde(default = "a_year")]
    pub max_age_seconds: u32,
    /// `includeSubDomains`.
    #[serde(default)]
    pub include_sub_domains: bool,
    /// `preload`.
    #[serde(default)]
    pub preload: bool,
}

fn a_year() -> u32 {
    31_536_000
}

/// `spec.render.pathNormalization`.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum PathNormalizationSpec {
    /// Normalise the path before routing.
    #[default]
    Normalize,
    /// Route the path as sent.
    Off,
}

impl From<PathNormalizationSpec> for haptic_render::model::PathNormalization {
    fn from(s: PathNormalizationSpec) -> Self {
        match s {
            PathNormalizationSpec::Normalize => Self::Normalize,
            PathNormalizationSpec::Off => Self::Off,
        }
    }
}

/// Ingress rendering across namespaces.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct IngressRenderSpec {
    /// `Namespace` (the default): a host (and the catch-all of rules without host and
    /// `defaultBackend`) belongs to the namespace of the oldest Ingress claiming it
    /// (creationTimestamp, then namespace/name); an Ingress of another namespace claiming any
    /// path on it is refused in its own Events. `Shared`: every namespace may route any host and
    /// each host/path goes to its oldest Ingress, as ingress-nginx merges. In both, a canary
    /// joins only a route of its own namespace and `ssl-passthrough` needs a host its namespace
    /// owns.
    #[serde(default)]
    pub host_sharing: HostSharing,
}

/// Whether namespaces may share an Ingress host.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum HostSharing {
    /// A host belongs to the namespace of its oldest Ingress.
    #[default]
    Namespace,
    /// Every namespace may route any host; the oldest Ingress wins each host/path.
    Shared,
}

impl From<HostSharing> for haptic_render::ownership::HostSharing {
    fn from(s: HostSharing) -> Self {
        match s {
            HostSharing::Namespace => haptic_render::ownership::HostSharing::Namespace,
            HostSharing::Shared => haptic_render::ownership::HostSharing::Shared,
        }
    }
}

/// Gateway rendering: what passes from a Gateway to its Service.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRenderSpec {
    /// The `spec.infrastructure` label and annotation keys a Gateway may put on the Service
    /// the controller creates for it in this namespace: exact keys (`team`) or prefixes ending
    /// in `*` (`example.com/*`). Empty (the default): none pass. A Gateway bringing other keys
    /// keeps its listeners; its `Accepted` condition says which keys were left out.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256), inner(length(min = 1, max = 317), regex(pattern = r"^[^*]*\*?$")))]
    pub infrastructure_keys: Vec<String>,
    /// `Shared` (the default): HTTPRoutes attach as the Gateway API says (`allowedRoutes`,
    /// ReferenceGrants, its precedence between routes). `Namespace`: on each listener port, a
    /// hostname belongs to the namespace of the oldest HTTPRoute attached with it
    /// (creationTimestamp, then namespace/name); a route of another namespace is refused that
    /// hostname there (its Events say whose it is).
    #[serde(default = "shared")]
    pub host_sharing: HostSharing,
    /// The kind of Service each Gateway gets (the chart: `LoadBalancer`).
    #[serde(default)]
    pub service: GatewayServiceSpec,
}

fn shared() -> HostSharing {
    HostSharing::Shared
}

impl Default for GatewayRenderSpec {
    fn default() -> Self {
        GatewayRenderSpec {
            infrastructure_keys: Vec::new(),
            host_sharing: HostSharing::Shared,
            service: GatewayServiceSpec::default(),
        }
    }
}

/// `spec.render.gateway.service`: the Service of every Gateway. Its address (a LoadBalancer's
/// once its provider assigned one, else the cluster IP) is the Gateway's `status.addresses`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct GatewayServiceSpec {
    /// `ClusterIP` (the default), `NodePort` or `LoadBalancer`.
    #[serde(default, rename = "type")]
    pub type_: GatewayServiceType,
    /// `Cluster` or `Local` (NodePort and LoadBalancer Services).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub external_traffic_policy: Option<TrafficPolicy>,
    /// The load-balancer implementation (LoadBalancer Services).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub load_balancer_class: Option<String>,
    /// Annotations on every Gateway's Service (a provider's load-balancer settings); a
    /// Gateway's own `spec.infrastructure` annotations, within the keys allowed, win.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// A Gateway Service's type.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum GatewayServiceType {
    /// Reached inside the cluster only.
    #[default]
    ClusterIP,
    /// On a port of every node.
    NodePort,
    /// Through the cluster's load-balancer provider.
    LoadBalancer,
}

impl GatewayServiceType {
    /// The Service `spec.type` value.
    pub fn name(self) -> &'static str {
        match self {
            GatewayServiceType::ClusterIP => "ClusterIP",
            GatewayServiceType::NodePort => "NodePort",
            GatewayServiceType::LoadBalancer => "LoadBalancer",
        }
    }
}

/// `externalTrafficPolicy`.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
pub enum TrafficPolicy {
    /// Any node forwards (the client address is lost).
    Cluster,
    /// Only nodes with a pod answer (the client address is kept).
    Local,
}

fn default_bind_address() -> String {
    "0.0.0.0".into()
}
fn default_http_port() -> u16 {
    8080
}
fn default_https_port() -> u16 {
    8443
}
fn default_server_slots() -> u16 {
    8
}

/// Admin snippets by section, inserted verbatim.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SnippetsSpec {
    /// End of `global`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub global: Option<String>,
    /// End of `defaults`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub defaults: Option<String>,
    /// End of every frontend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub frontend: Option<String>,
    /// End of every backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 65536))]
    pub backend: Option<String>,
}

/// One auxiliary file: a path and exactly one source.
#[derive(Debug, Clone, Serialize, Deserialize, KubeSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new(
    "(has(self.configMapKeyRef) ? 1 : 0) + (has(self.secretRef) ? 1 : 0) + (has(self.content) ? 1 : 0) == 1"
).message(ONE_FILE_SOURCE))]
pub struct FileSpec {
    /// The file's path relative to `haproxy.cfg` (`[A-Za-z0-9._-]` components, no `..`).
    #[schemars(length(min = 1, max = 1024))]
    pub path: String,
    /// A ConfigMap key (text or binary data).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_map_key_ref: Option<KeyRef>,
    /// A Secret: a `kubernetes.io/tls` Secret becomes one PEM (certificate, then key); another
    /// Secret needs `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub secret_ref: Option<SecretFileRef>,
    /// Inline content (at most 1 MiB).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = MAX_INLINE))]
    pub content: Option<String>,
}

/// A Secret as a file source.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct SecretFileRef {
    /// The Secret's name.
    pub name: String,
    /// The key to use; unset for a `kubernetes.io/tls` Secret (`tls.crt` + `tls.key`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// Controller settings of this resource.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ControllerSpec {
    /// Safety net of one deployment (e.g. `30s`).
    #[serde(default = "d30")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub deployment_timeout: String,
    /// Idle time before the fleet is re-applied from verified state.
    #[serde(default = "d60")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub drift_prevention_interval: String,
    /// Bound of one pod's apply.
    #[serde(default = "d30")]
    #[schemars(regex(pattern = DURATION_PATTERN))]
    pub sync_timeout: String,
    /// Pods applied to at once.
    #[serde(default = "default_max_parallel")]
    #[schemars(range(min = 1, max = 1024))]
    pub max_parallel: u16,
    /// The gate latch's resting mode.
    #[serde(default)]
    pub gate: GateSpec,
}

fn d30() -> String {
    "30s".into()
}
fn d60() -> String {
    "60s".into()
}
fn default_max_parallel() -> u16 {
    16
}

impl Default for ControllerSpec {
    fn default() -> Self {
        Self {
            deployment_timeout: d30(),
            drift_prevention_interval: d60(),
            sync_timeout: d30(),
            max_parallel: default_max_parallel(),
            gate: GateSpec::Optimistic,
        }
    }
}

/// The gate latch's resting mode.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum GateSpec {
    /// Renders dispatch at once; a refusal reverts and pins.
    #[default]
    Optimistic,
    /// Renders wait for the gate.
    Pessimistic,
}

/// What the leader reports.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct HAProxyConfigStatus {
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// The latest render that passed the gate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_id: Option<String>,
    /// Its first 12 hex digits (the `Plan` column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan_short: Option<String>,
    /// The last render every pod ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_good_plan_id: Option<String>,
    /// The gate latch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gate: Option<GateStatusField>,
    /// Pods running the target plan.
    #[serde(default)]
    pub converged: u32,
    /// Admitted pods.
    #[serde(default)]
    pub total: u32,
    /// `converged/total` (the `Converged` column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub converged_text: Option<String>,
    /// The leader that wrote this status, and its fence epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader: Option<LeaderField>,
    /// `Validated`, `Converged` and `Ready` (both of the others).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// One entry per admitted pod.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deployed_to_pods: Vec<PodStatusField>,
}

/// The gate latch in the status.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct GateStatusField {
    /// `optimistic`, `pessimistic` or `pinned`.
    pub state: String,
    /// HAProxy's words when the gate refused the latest render.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The writer of the status.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
pub struct LeaderField {
    /// The Lease holder identity.
    pub identity: String,
    /// The fence epoch of its term.
    pub epoch: u64,
}

/// One pod in `status.deployedToPods`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, JsonSchema, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PodStatusField {
    /// The pod's name.
    pub pod: String,
    /// Its UID.
    #[serde(default)]
    pub uid: String,
    /// Its IP.
    #[serde(default)]
    pub ip: String,
    /// `converged`, `reload-pending`, `deploying`, `rejected`, `failed`, `unknown`, …
    pub phase: String,
    /// The plan on disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub applied_plan: Option<String>,
    /// The plan HAProxy's worker runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running_plan: Option<String>,
    /// How the last apply landed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
    /// Why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reasons: Vec<String>,
    /// A paced reload is scheduled.
    #[serde(default)]
    pub pending_reload: bool,
    /// The last error, in HAProxy's words where it has some.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// When the last apply was answered (RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_applied_at: Option<String>,
    /// The pod's HAProxy version.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub haproxy_version: Option<String>,
    /// The node the pod runs on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// The pod's `Ready` condition as Kubernetes sees it (whether its Services send it traffic):
    /// `False` for a pod on a node that stopped reporting, whatever its agent answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready: Option<bool>,
    /// Why the pod is not Ready (the condition's reason and message).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub not_ready_reason: Option<String>,
    /// Container restarts in the pod, as the kubelet reports them (HAProxy and agent together).
    #[serde(default)]
    pub restarts: i32,
}

/// The CRD as YAML, exactly what `haptic-controller crd` prints and the chart commits.
pub fn crd_yaml() -> String {
    use kube::CustomResourceExt;
    let crd = HAProxyConfig::crd();
    let body = serde_saphyr::to_string(&crd).expect("the CRD serializes");
    format!("# Generated by `haptic-controller crd`; do not edit (a test checks it).\n{body}")
}

/// `Ready` from `Validated` and `Converged` (pure): `True` when both are, else `False` with the
/// reason and message of the first that is not. What Argo CD, Flux and kstatus look for.
pub fn ready_condition(validated: &Condition, converged: &Condition) -> Condition {
    let not_ok = [validated, converged].into_iter().find(|c| c.status != "True");
    let (status, reason, message) = match not_ok {
        // The API bounds a condition's message at 32768 characters.
        Some(c) => ("False", c.reason.clone(), format!("{}: {}", c.type_, c.message).chars().take(32 * 1024).collect()),
        None => ("True", "Ready".to_string(), converged.message.clone()),
    };
    Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason,
        message,
        observed_generation: validated.observed_generation,
        last_transition_time: validated.last_transition_time.clone(),
    }
}

/// A spec duration (`30s`, `1m30s`, `500ms`), with the field named in the error.
pub fn parse_duration(field: &str, text: &str) -> Result<Duration, String> {
    humantime::parse_duration(text.trim()).map_err(|e| format!("spec.{field}: {text:?} is not a duration ({e})"))
}

/// `spec.podSelector` as kube's [`Selector`]: what the pod watch sends as its `labelSelector`
/// and what admission matches pods with. An operator Kubernetes does not know, or `In`/`NotIn`
/// without values, is an error naming the field.
pub fn pod_selector(sel: &LabelSelector) -> Result<Selector, String> {
    Selector::try_from(sel.clone()).map_err(|e| format!("spec.podSelector: {}", e.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_committed_crd_matches_the_generator() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../charts/haptic/crds/haproxyconfig.yaml");
        let committed = std::fs::read_to_string(path).unwrap_or_default();
        assert!(
            committed == crd_yaml(),
            "{path} is stale: regenerate it with `cargo run -p haptic-controller -- crd > charts/haptic/crds/haproxyconfig.yaml`"
        );
    }

    #[test]
    fn crd_has_the_names_and_printer_columns_of_the_brief() {
        let y = crd_yaml();
        for needle in [
            "name: haproxyconfigs.haptic.dev",
            "- hapc",
            "kind: HAProxyConfig",
            "name: v1alpha1",
            "name: Plan",
            "name: Gate",
            "name: Converged",
            "name: Age",
            "name: Ready",
            "name: Leader",
            "priority: 1",
            "- haptic",
            "x-kubernetes-validations",
            ONE_CONFIG_SOURCE,
            ONE_FILE_SOURCE,
            RENDER_NAMES_A_CLASS,
            "status: {}",
        ] {
            assert!(y.contains(needle), "missing {needle:?} in:\n{y}");
        }
    }

    #[test]
    fn ready_follows_validated_and_converged() {
        let c = |t: &str, ok: bool, reason: &str| Condition {
            type_: t.into(),
            status: if ok { "True" } else { "False" }.into(),
            reason: reason.into(),
            message: format!("{reason} words"),
            observed_generation: Some(3),
            last_transition_time: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ),
        };
        let r = ready_condition(&c("Validated", true, "GatePassed"), &c("Converged", true, "AllPodsConverged"));
        assert_eq!((r.type_.as_str(), r.status.as_str(), r.reason.as_str()), ("Ready", "True", "Ready"));
        assert_eq!(r.observed_generation, Some(3));
        let r = ready_condition(&c("Validated", false, "GateRefused"), &c("Converged", false, "Deploying"));
        assert_eq!((r.status.as_str(), r.reason.as_str()), ("False", "GateRefused"));
        assert_eq!(r.message, "Validated: GateRefused words");
        let r = ready_condition(&c("Validated", true, "GatePassed"), &c("Converged", false, "NoPods"));
        assert_eq!((r.status.as_str(), r.reason.as_str()), ("False", "NoPods"));
    }

    #[test]
    fn hosts_belong_to_namespaces_and_no_infrastructure_key_passes_by_default() {
        let r: RenderSpec = serde_json::from_value(serde_json::json!({"ingressClassName": "haptic"})).unwrap();
        assert_eq!(r.ingress.host_sharing, HostSharing::Namespace);
        assert!(r.gateway.infrastructure_keys.is_empty());
        assert_eq!(r.gateway.host_sharing, HostSharing::Shared, "Gateway attachment as the spec says");
        let r: RenderSpec = serde_json::from_value(serde_json::json!({
            "gatewayClassName": "haptic",
            "ingress": {"hostSharing": "Shared"},
            "gateway": {"infrastructureKeys": ["team", "example.com/*"]},
        }))
        .unwrap();
        assert_eq!(
            haptic_render::ownership::HostSharing::from(r.ingress.host_sharing),
            haptic_render::ownership::HostSharing::Shared
        );
        assert_eq!(r.gateway.infrastructure_keys, ["team", "example.com/*"]);
        let bad = serde_json::from_value::<RenderSpec>(serde_json::json!({"ingress": {"hostSharing": "Everyone"}}));
        assert!(bad.is_err());
        let y = crd_yaml();
        assert!(y.contains("hostSharing") && y.contains("infrastructureKeys"), "{y}");
    }

    #[test]
    fn spec_defaults_fill_in() {
        let spec: HAProxyConfigSpec = serde_json::from_value(serde_json::json!({
            "podSelector": {"matchLabels": {"app.kubernetes.io/name": "haproxy"}},
            "config": "global\n",
        }))
        .unwrap();
        assert_eq!(spec.agent.port, 9080, "the chart's agent.port");
        assert_eq!(spec.agent.credentials_secret_ref.name, "haptic-agent-credentials");
        assert_eq!(spec.controller.max_parallel, 16);
        assert_eq!(parse_duration("x", &spec.controller.deployment_timeout).unwrap(), Duration::from_secs(30));
        assert_eq!(pod_selector(&spec.pod_selector).unwrap().to_string(), "app.kubernetes.io/name=haproxy");
        let bad: LabelSelector =
            serde_json::from_value(serde_json::json!({"matchExpressions": [{"key": "tier", "operator": "Near"}]}))
                .unwrap();
        assert!(pod_selector(&bad).is_err(), "an operator Kubernetes does not know");
        assert!(parse_duration("syncTimeout", "soon").is_err());
        assert_eq!(parse_duration("syncTimeout", " 1m30s ").unwrap(), Duration::from_secs(90));
    }
}
