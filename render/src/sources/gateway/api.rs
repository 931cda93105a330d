//! Gateway API types (`gateway.networking.k8s.io/v1`, standard channel, v1.6.3): GatewayClass,
//! Gateway, ListenerSet, HTTPRoute, GRPCRoute, TLSRoute, TCPRoute, ReferenceGrant and BackendTLSPolicy, written by hand for the fields haptic reads
//! and writes.
//!
//! Owns the serde shapes of those kinds and their `k8s_openapi::Resource` / `Metadata` impls
//! (which give them kube's `Resource` in the controller, so a kube client can list, watch and
//! patch them without this crate depending on kube). Fields not listed here are ignored when
//! read; status is written by the controller as JSON, so the status types here are read-only
//! views. It must never hold logic: [`crate::sources::gateway`] decides what the objects mean.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, ObjectMeta};
use serde::{Deserialize, Serialize};

/// The API group.
pub const GROUP: &str = "gateway.networking.k8s.io";

macro_rules! resource {
    ($ty:ident, $kind:literal, $version:literal, $plural:literal, $scope:ty) => {
        impl k8s_openapi::Resource for $ty {
            const API_VERSION: &'static str = concat!("gateway.networking.k8s.io/", $version);
            const GROUP: &'static str = GROUP;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }
        impl k8s_openapi::ListableResource for $ty {
            const LIST_KIND: &'static str = concat!($kind, "List");
        }
        impl k8s_openapi::Metadata for $ty {
            type Ty = ObjectMeta;
            fn metadata(&self) -> &ObjectMeta {
                &self.metadata
            }
            fn metadata_mut(&mut self) -> &mut ObjectMeta {
                &mut self.metadata
            }
        }
    };
}

/// Declares a Gateway API discriminator: its values this version knows, the first the default,
/// and any other as written, so reading an object never fails on a value from a newer API (the
/// translator refuses it by name).
macro_rules! discriminator {
    ($(#[$doc:meta])* $ty:ident { $($(#[$vdoc:meta])* $v:ident => $s:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum $ty {
            $($(#[$vdoc])* $v,)+
            /// A value this version does not know, as written.
            Other(String),
        }

        impl $ty {
            /// As the API spells it.
            pub fn as_str(&self) -> &str {
                match self {
                    $($ty::$v => $s,)+
                    $ty::Other(s) => s,
                }
            }
        }

        impl Default for $ty {
            fn default() -> Self {
                discriminator!(@first $ty $($v)+)
            }
        }

        impl From<String> for $ty {
            fn from(s: String) -> Self {
                match s.as_str() {
                    $($s => $ty::$v,)+
                    _ => $ty::Other(s),
                }
            }
        }

        impl From<$ty> for String {
            fn from(t: $ty) -> String {
                t.as_str().to_string()
            }
        }

        impl std::fmt::Display for $ty {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
    (@first $ty:ident $first:ident $($rest:ident)*) => {
        $ty::$first
    };
}

discriminator! {
    /// `listeners[].protocol`.
    ProtocolType {
        /// Plain HTTP.
        Http => "HTTP",
        /// HTTP over TLS the Gateway terminates.
        Https => "HTTPS",
        /// TLS (TLSRoute).
        Tls => "TLS",
        /// TCP (TCPRoute).
        Tcp => "TCP",
        /// UDP (UDPRoute).
        Udp => "UDP",
    }
}

discriminator! {
    /// `listeners[].tls.mode`.
    TlsMode {
        /// The Gateway terminates TLS (the default).
        Terminate => "Terminate",
        /// The connection passes through by SNI.
        Passthrough => "Passthrough",
    }
}

discriminator! {
    /// `allowedRoutes.namespaces.from`.
    FromNamespaces {
        /// The Gateway's namespace (the default).
        Same => "Same",
        /// Every namespace.
        All => "All",
        /// The namespaces the selector selects.
        Selector => "Selector",
        /// No namespace (`allowedListeners` only, where it is the default).
        NoNamespace => "None",
    }
}

discriminator! {
    /// `matches[].path.type`.
    PathMatchType {
        /// A path prefix by segments (the default).
        PathPrefix => "PathPrefix",
        /// The whole path.
        Exact => "Exact",
        /// A regular expression.
        RegularExpression => "RegularExpression",
    }
}

discriminator! {
    /// `matches[].headers[].type` and `matches[].queryParams[].type`.
    MatchType {
        /// The whole value (the default).
        Exact => "Exact",
        /// A regular expression.
        RegularExpression => "RegularExpression",
    }
}

discriminator! {
    /// `filters[].type`.
    FilterType {
        /// Request header changes.
        RequestHeaderModifier => "RequestHeaderModifier",
        /// Response header changes.
        ResponseHeaderModifier => "ResponseHeaderModifier",
        /// A redirect.
        RequestRedirect => "RequestRedirect",
        /// Host and path rewrites.
        UrlRewrite => "URLRewrite",
        /// Mirroring.
        RequestMirror => "RequestMirror",
        /// CORS.
        Cors => "CORS",
        /// An implementation's own filter.
        ExtensionRef => "ExtensionRef",
    }
}

discriminator! {
    /// `urlRewrite.path.type` and `requestRedirect.path.type`.
    PathModifierType {
        /// The whole path.
        ReplaceFullPath => "ReplaceFullPath",
        /// The matched prefix.
        ReplacePrefixMatch => "ReplacePrefixMatch",
    }
}

resource!(GatewayClass, "GatewayClass", "v1", "gatewayclasses", k8s_openapi::ClusterResourceScope);
resource!(Gateway, "Gateway", "v1", "gateways", k8s_openapi::NamespaceResourceScope);
resource!(HttpRoute, "HTTPRoute", "v1", "httproutes", k8s_openapi::NamespaceResourceScope);
resource!(GrpcRoute, "GRPCRoute", "v1", "grpcroutes", k8s_openapi::NamespaceResourceScope);
resource!(TlsRoute, "TLSRoute", "v1", "tlsroutes", k8s_openapi::NamespaceResourceScope);
resource!(TcpRoute, "TCPRoute", "v1", "tcproutes", k8s_openapi::NamespaceResourceScope);
resource!(ReferenceGrant, "ReferenceGrant", "v1", "referencegrants", k8s_openapi::NamespaceResourceScope);
resource!(ListenerSet, "ListenerSet", "v1", "listenersets", k8s_openapi::NamespaceResourceScope);
resource!(BackendTlsPolicy, "BackendTLSPolicy", "v1", "backendtlspolicies", k8s_openapi::NamespaceResourceScope);

/// A GatewayClass.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClass {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: GatewayClassSpec,
    /// Status (read only here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<GatewayClassStatus>,
}

/// `GatewayClass.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassSpec {
    /// The controller that manages Gateways of this class.
    #[serde(default)]
    pub controller_name: String,
    /// Implementation-specific parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters_ref: Option<ParametersReference>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
}

/// `GatewayClass.spec.parametersRef`, and a Gateway's `spec.infrastructure.parametersRef`
/// (without a namespace).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParametersReference {
    /// Group.
    #[serde(default)]
    pub group: String,
    /// Kind.
    #[serde(default)]
    pub kind: String,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `GatewayClass.status`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayClassStatus {
    /// Conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// A Gateway.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Gateway {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: GatewaySpec,
    /// Status (read only here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<GatewayStatus>,
}

/// `Gateway.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpec {
    /// The class.
    #[serde(default)]
    pub gateway_class_name: String,
    /// Listeners.
    #[serde(default)]
    pub listeners: Vec<Listener>,
    /// Requested addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub addresses: Vec<GatewaySpecAddress>,
    /// Labels and annotations for the infrastructure (the Gateway's Service).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub infrastructure: Option<GatewayInfrastructure>,
    /// TLS settings of the Gateway as a whole (client certificate validation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<GatewayTlsConfig>,
    /// Which ListenerSets may attach (none when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_listeners: Option<AllowedListeners>,
}

/// `Gateway.spec.allowedListeners`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedListeners {
    /// From which namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<ListenerNamespaces>,
}

/// `allowedListeners.namespaces`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerNamespaces {
    /// `None` (the default), `Same`, `All` or `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<FromNamespaces>,
    /// The namespaces' label selector for `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// A ListenerSet: listeners another namespace (or the Gateway's) adds to a Gateway that allows it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSet {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: ListenerSetSpec,
}

/// `ListenerSet.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerSetSpec {
    /// The Gateway its listeners join.
    #[serde(default)]
    pub parent_ref: ParentGatewayReference,
    /// Its listeners (the shape of a Gateway's; names unique within the ListenerSet).
    #[serde(default)]
    pub listeners: Vec<Listener>,
}

/// `ListenerSet.spec.parentRef`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentGatewayReference {
    /// Group (default `gateway.networking.k8s.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (default `Gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    #[serde(default)]
    pub name: String,
    /// Namespace (default: the ListenerSet's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `Gateway.spec.tls.backend`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayBackendTls {
    /// The certificate (and key) the Gateway presents to backends that ask for one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_certificate_ref: Option<SecretObjectReference>,
}

/// `Gateway.spec.tls`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayTlsConfig {
    /// What applies to the TLS connections clients open.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend: Option<FrontendTlsConfig>,
    /// What applies to the TLS connections the Gateway opens to backends.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend: Option<GatewayBackendTls>,
}

/// `spec.tls.frontend`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendTlsConfig {
    /// For every port without its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<TlsConfig>,
    /// Per listener port.
    #[serde(default)]
    pub per_port: Vec<TlsPortConfig>,
}

/// `spec.tls.frontend.perPort[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsPortConfig {
    /// The listener port.
    pub port: i32,
    /// Its settings.
    #[serde(default)]
    pub tls: TlsConfig,
}

/// One port's (or the default) frontend TLS settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsConfig {
    /// Client certificate validation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub validation: Option<FrontendTlsValidation>,
}

/// `validation`: the CAs clients' certificates must chain to.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendTlsValidation {
    /// ConfigMaps (`ca.crt`); another namespace's needs a ReferenceGrant.
    #[serde(default)]
    pub ca_certificate_refs: Vec<ObjectReference>,
    /// `AllowValidOnly` (the default) or `AllowInsecureFallback`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<String>,
}

/// A reference to an object of any kind, maybe in another namespace.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectReference {
    /// Group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
    /// Namespace (default: the referrer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `Gateway.spec.addresses[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewaySpecAddress {
    /// `IPAddress`, `Hostname` or an implementation type.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<String>,
    /// The address (may be empty: "assign one").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `Gateway.spec.infrastructure`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayInfrastructure {
    /// Labels for the generated resources.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations for the generated resources.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// Implementation parameters (haptic reads none).
    #[serde(default, rename = "parametersRef", skip_serializing_if = "Option::is_none")]
    pub parameters_ref: Option<ParametersReference>,
}

/// `Gateway.spec.listeners[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listener {
    /// Unique within the Gateway.
    pub name: String,
    /// Host the listener serves (exact or `*.` wildcard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Port.
    pub port: i32,
    /// `HTTP`, `HTTPS`, `TLS`, `TCP`, `UDP` or a domain-prefixed protocol.
    pub protocol: ProtocolType,
    /// TLS settings (HTTPS, TLS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<ListenerTls>,
    /// Which routes may attach.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allowed_routes: Option<AllowedRoutes>,
}

/// `listeners[].tls`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerTls {
    /// `Terminate` (default) or `Passthrough`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<TlsMode>,
    /// Certificates (Secrets).
    #[serde(default)]
    pub certificate_refs: Vec<SecretObjectReference>,
}

/// A reference to a Secret (or another kind named by group and kind).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretObjectReference {
    /// Group (`""`: core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (default `Secret`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace (default: the Gateway's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
}

/// `listeners[].allowedRoutes`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AllowedRoutes {
    /// Which namespaces.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespaces: Option<RouteNamespaces>,
    /// Which kinds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kinds: Option<Vec<RouteGroupKind>>,
}

/// `allowedRoutes.namespaces`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteNamespaces {
    /// `Same` (default), `All` or `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<FromNamespaces>,
    /// The namespaces' label selector for `Selector`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<LabelSelector>,
}

/// A route kind.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteGroupKind {
    /// Group (default `gateway.networking.k8s.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind.
    pub kind: String,
}

/// `Gateway.status` (read only here).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GatewayStatus {
    /// Conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Listeners' conditions.
    #[serde(default)]
    pub listeners: Vec<ListenerStatusView>,
}

/// `Gateway.status.listeners[]` as far as it is read here.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListenerStatusView {
    /// The listener.
    pub name: String,
    /// Conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// An HTTPRoute.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRoute {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: HttpRouteSpec,
    /// Status (read only here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<HttpRouteStatus>,
}

/// `HTTPRoute.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// Where it attaches.
    #[serde(default)]
    pub parent_refs: Vec<ParentReference>,
    /// Hosts it serves.
    #[serde(default)]
    pub hostnames: Vec<String>,
    /// Rules (the API defaults one rule matching `/` when none is given).
    #[serde(default)]
    pub rules: Vec<HttpRouteRule>,
}

/// `parentRefs[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentReference {
    /// Group (default `gateway.networking.k8s.io`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (default `Gateway`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Namespace (default: the route's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
    /// A listener name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
    /// A listener port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
}

/// `rules[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRule {
    /// Optional rule name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Matches (the API defaults one: PathPrefix `/`).
    #[serde(default)]
    pub matches: Vec<HttpRouteMatch>,
    /// Filters applied to every request the rule takes.
    #[serde(default)]
    pub filters: Vec<HttpRouteFilter>,
    /// Backends.
    #[serde(default)]
    pub backend_refs: Vec<HttpBackendRef>,
    /// Timeouts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeouts: Option<HttpRouteTimeouts>,
    /// Retries (the experimental channel's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<HttpRouteRetry>,
}

/// `rules[].retry`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteRetry {
    /// Statuses retried.
    #[serde(default)]
    pub codes: Vec<i32>,
    /// The most tries after the first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attempts: Option<i32>,
    /// The least wait between tries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<String>,
}

/// `rules[].timeouts`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteTimeouts {
    /// The whole request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
    /// One request to a backend.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_request: Option<String>,
}

/// `matches[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteMatch {
    /// Path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathMatch>,
    /// Headers (all must match).
    #[serde(default)]
    pub headers: Vec<HttpHeaderMatch>,
    /// Query parameters (all must match).
    #[serde(default)]
    pub query_params: Vec<HttpQueryParamMatch>,
    /// Method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// `matches[].path`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathMatch {
    /// `Exact`, `PathPrefix` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<PathMatchType>,
    /// The value (default `/`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub value: Option<String>,
}

/// `matches[].headers[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeaderMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<MatchType>,
    /// Header name (case-insensitive).
    pub name: String,
    /// Value.
    pub value: String,
}

/// `matches[].queryParams[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpQueryParamMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<MatchType>,
    /// Parameter name (case-sensitive).
    pub name: String,
    /// Value.
    pub value: String,
}

/// A filter.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteFilter {
    /// Which one.
    #[serde(rename = "type")]
    pub type_: FilterType,
    /// `RequestHeaderModifier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_header_modifier: Option<HttpHeaderFilter>,
    /// `ResponseHeaderModifier`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub response_header_modifier: Option<HttpHeaderFilter>,
    /// `RequestRedirect`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_redirect: Option<HttpRequestRedirectFilter>,
    /// `URLRewrite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url_rewrite: Option<HttpUrlRewriteFilter>,
    /// `CORS`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cors: Option<HttpCorsFilter>,
    /// `RequestMirror`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_mirror: Option<HttpRequestMirrorFilter>,
}

/// A RequestMirror filter: where copies of the requests go, and how many of them.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestMirrorFilter {
    /// The Service port the copies go to (its weight and filters are not read).
    pub backend_ref: HttpBackendRef,
    /// The percentage of requests copied (0–100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percent: Option<i32>,
    /// The fraction of requests copied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<Fraction>,
}

/// `requestMirror.fraction`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Fraction {
    /// Numerator.
    pub numerator: i32,
    /// Denominator (the API's default: 100).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub denominator: Option<i32>,
}

/// A CORS filter.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpCorsFilter {
    /// Origins (`*`, `scheme://host[:port]`, the host may start with `*.`).
    #[serde(default)]
    pub allow_origins: Vec<String>,
    /// Methods (`*`: any).
    #[serde(default)]
    pub allow_methods: Vec<String>,
    /// Request headers (`*`: any).
    #[serde(default)]
    pub allow_headers: Vec<String>,
    /// Response headers a client may read.
    #[serde(default)]
    pub expose_headers: Vec<String>,
    /// Whether credentials may go with the request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_credentials: Option<bool>,
    /// How long a preflight's answer may be cached, seconds (the API's default: 5).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_age: Option<i32>,
}

/// A header modifier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeaderFilter {
    /// Replace (or add) these.
    #[serde(default)]
    pub set: Vec<HttpHeader>,
    /// Append these.
    #[serde(default)]
    pub add: Vec<HttpHeader>,
    /// Remove these names.
    #[serde(default)]
    pub remove: Vec<String>,
}

/// A header name and value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpHeader {
    /// Name.
    pub name: String,
    /// Value.
    pub value: String,
}

/// `RequestRedirect`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRequestRedirectFilter {
    /// `http` or `https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scheme: Option<String>,
    /// Host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
    /// Port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// 301 (default), 302, 303, 307 or 308.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status_code: Option<i32>,
}

/// `URLRewrite`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpUrlRewriteFilter {
    /// Host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// Path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path: Option<HttpPathModifier>,
}

/// A path modifier.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpPathModifier {
    /// `ReplaceFullPath` or `ReplacePrefixMatch`.
    #[serde(rename = "type")]
    pub type_: PathModifierType,
    /// For `ReplaceFullPath`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_full_path: Option<String>,
    /// For `ReplacePrefixMatch`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replace_prefix_match: Option<String>,
}

/// `backendRefs[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpBackendRef {
    /// Group (`""`: core).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group: Option<String>,
    /// Kind (default `Service`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// Name.
    pub name: String,
    /// Namespace (default: the route's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Service port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// Weight (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<i32>,
    /// Filters for this backend only.
    #[serde(default)]
    pub filters: Vec<HttpRouteFilter>,
}

/// `HTTPRoute.status` (read only here).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteStatus {
    /// One entry per parent and controller.
    #[serde(default)]
    pub parents: Vec<RouteParentStatus>,
}

/// `status.parents[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteParentStatus {
    /// The parent.
    pub parent_ref: ParentReference,
    /// Who wrote this entry.
    pub controller_name: String,
    /// Conditions.
    #[serde(default)]
    pub conditions: Vec<Condition>,
}

/// The route kinds a listener can take.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RouteKind {
    /// `HTTPRoute`.
    Http,
    /// `GRPCRoute`.
    Grpc,
    /// `TLSRoute`.
    Tls,
    /// `TCPRoute`.
    Tcp,
}

impl RouteKind {
    /// Every kind, in the order a listener lists them.
    pub const ALL: [RouteKind; 4] = [RouteKind::Http, RouteKind::Grpc, RouteKind::Tls, RouteKind::Tcp];

    /// The kind's name (`kind` of the object and of `allowedRoutes.kinds[]`).
    pub fn name(self) -> &'static str {
        match self {
            RouteKind::Http => "HTTPRoute",
            RouteKind::Grpc => "GRPCRoute",
            RouteKind::Tls => "TLSRoute",
            RouteKind::Tcp => "TCPRoute",
        }
    }

    /// Whether its connections pass through as they are (`mode tcp`): TLSRoute and TCPRoute.
    pub fn is_l4(self) -> bool {
        matches!(self, RouteKind::Tls | RouteKind::Tcp)
    }

    /// The kind called `name` in the Gateway API group, if a listener can take it.
    pub fn of(name: &str) -> Option<RouteKind> {
        Self::ALL.into_iter().find(|k| k.name() == name)
    }
}

/// A GRPCRoute.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRoute {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: GrpcRouteSpec,
    /// Status (read only here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<HttpRouteStatus>,
}

/// `GRPCRoute.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteSpec {
    /// Where it attaches.
    #[serde(default)]
    pub parent_refs: Vec<ParentReference>,
    /// Hosts it serves.
    #[serde(default)]
    pub hostnames: Vec<String>,
    /// Rules (none: every request to its hostnames goes nowhere but is matched).
    #[serde(default)]
    pub rules: Vec<GrpcRouteRule>,
}

/// GRPCRoute `rules[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteRule {
    /// Optional rule name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Matches (none: every gRPC request).
    #[serde(default)]
    pub matches: Vec<GrpcRouteMatch>,
    /// Filters applied to every request the rule takes (header modifiers, mirrors).
    #[serde(default)]
    pub filters: Vec<HttpRouteFilter>,
    /// Backends (gRPC `backendRefs[]` take the HTTPRoute fields).
    #[serde(default)]
    pub backend_refs: Vec<HttpBackendRef>,
}

/// GRPCRoute `matches[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcRouteMatch {
    /// The gRPC service and method.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<GrpcMethodMatch>,
    /// Headers (all must match).
    #[serde(default)]
    pub headers: Vec<HttpHeaderMatch>,
}

/// GRPCRoute `matches[].method`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct GrpcMethodMatch {
    /// `Exact` (default) or `RegularExpression`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub type_: Option<MatchType>,
    /// The service, fully qualified (`package.Service`); any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<String>,
    /// The method; any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub method: Option<String>,
}

/// A TLSRoute.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRoute {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: TlsRouteSpec,
    /// Status (read only here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<HttpRouteStatus>,
}

/// `TLSRoute.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRouteSpec {
    /// Where it attaches.
    #[serde(default)]
    pub parent_refs: Vec<ParentReference>,
    /// The SNI host names it takes (at least one in `v1`).
    #[serde(default)]
    pub hostnames: Vec<String>,
    /// Rules (exactly one in `v1`).
    #[serde(default)]
    pub rules: Vec<TlsRouteRule>,
}

/// TLSRoute `rules[]`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TlsRouteRule {
    /// Optional rule name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// Backends (the connection goes, undecrypted, to one of them by weight).
    #[serde(default)]
    pub backend_refs: Vec<HttpBackendRef>,
}

/// A TCPRoute.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpRoute {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: TcpRouteSpec,
    /// Status (read only here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<HttpRouteStatus>,
}

/// `TCPRoute.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TcpRouteSpec {
    /// Where it attaches.
    #[serde(default)]
    pub parent_refs: Vec<ParentReference>,
    /// Rules (exactly one in `v1`), with the fields of a TLSRoute rule.
    #[serde(default)]
    pub rules: Vec<TlsRouteRule>,
}

/// A ReferenceGrant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrant {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: ReferenceGrantSpec,
}

/// `ReferenceGrant.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantSpec {
    /// Who may refer.
    #[serde(default)]
    pub from: Vec<ReferenceGrantFrom>,
    /// To what (in the grant's namespace).
    #[serde(default)]
    pub to: Vec<ReferenceGrantTo>,
}

/// `spec.from[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantFrom {
    /// Group.
    #[serde(default)]
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Namespace.
    pub namespace: String,
}

/// `spec.to[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReferenceGrantTo {
    /// Group.
    #[serde(default)]
    pub group: String,
    /// Kind.
    pub kind: String,
    /// One name, or every object of the kind when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A BackendTLSPolicy: how the Gateway speaks TLS to the Services it names.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendTlsPolicy {
    /// Metadata.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// Spec.
    #[serde(default)]
    pub spec: BackendTlsPolicySpec,
}

/// `BackendTLSPolicy.spec`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendTlsPolicySpec {
    /// The Services (of the policy's namespace) it applies to, each whole or one named port.
    #[serde(default)]
    pub target_refs: Vec<PolicyTargetReference>,
    /// How the backends' certificates are checked.
    #[serde(default)]
    pub validation: BackendTlsValidation,
    /// Implementation-specific options (none is read).
    #[serde(default)]
    pub options: BTreeMap<String, String>,
}

/// `spec.targetRefs[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PolicyTargetReference {
    /// Group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
    /// A port name of the Service, when only that port is meant.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub section_name: Option<String>,
}

/// `spec.validation`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendTlsValidation {
    /// ConfigMaps (of the policy's namespace) whose `ca.crt` the certificates must chain to.
    #[serde(default)]
    pub ca_certificate_refs: Vec<LocalObjectReference>,
    /// `System`: the system's trusted CAs instead.
    #[serde(rename = "wellKnownCACertificates", default, skip_serializing_if = "Option::is_none")]
    pub well_known_ca_certificates: Option<String>,
    /// The name sent as SNI and, without `subjectAltNames`, the one the certificate must carry.
    #[serde(default)]
    pub hostname: String,
    /// Names one of which the certificate must carry instead of `hostname`.
    #[serde(default)]
    pub subject_alt_names: Vec<SubjectAltName>,
}

/// `caCertificateRefs[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LocalObjectReference {
    /// Group (`""` for core).
    #[serde(default)]
    pub group: String,
    /// Kind.
    pub kind: String,
    /// Name.
    pub name: String,
}

/// `subjectAltNames[]`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubjectAltName {
    /// `Hostname` or `URI`.
    #[serde(rename = "type", default)]
    pub type_: String,
    /// The DNS name, for `Hostname`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hostname: Option<String>,
    /// The URI, for `URI`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub uri: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A BackendTLSPolicy as the API writes it reads field by field (the API spells `CA` in
    /// capitals, which camelCase would not).
    #[test]
    fn a_backend_tls_policy_reads_as_the_api_writes_it() {
        let p: BackendTlsPolicy = serde_json::from_value(json!({
            "metadata": {"name": "p", "namespace": "a"},
            "spec": {
                "targetRefs": [{"group": "", "kind": "Service", "name": "s", "sectionName": "https"}],
                "validation": {
                    "caCertificateRefs": [{"group": "", "kind": "ConfigMap", "name": "ca"}],
                    "wellKnownCACertificates": "System",
                    "hostname": "a.example.com",
                    "subjectAltNames": [{"type": "URI", "uri": "spiffe://a/b"}],
                },
            },
        }))
        .unwrap();
        assert_eq!(p.spec.target_refs[0].section_name.as_deref(), Some("https"));
        assert_eq!(p.spec.validation.ca_certificate_refs[0].name, "ca");
        assert_eq!(p.spec.validation.well_known_ca_certificates.as_deref(), Some("System"));
        assert_eq!(p.spec.validation.hostname, "a.example.com");
        assert_eq!(p.spec.validation.subject_alt_names[0].type_, "URI");
        assert_eq!(p.spec.validation.subject_alt_names[0].uri.as_deref(), Some("spiffe://a/b"));
    }

    /// A value from a newer API reads (the object is not lost to a watch) and writes back as
    /// written; the known ones read as their variants and write as the API spells them.
    #[test]
    fn a_discriminator_this_version_does_not_know_reads_and_writes_as_written() {
        let f: HttpRouteFilter = serde_json::from_value(json!({"type": "example.com/Retry"})).unwrap();
        assert_eq!(f.type_, FilterType::Other("example.com/Retry".into()));
        assert_eq!(serde_json::to_value(&f).unwrap()["type"], "example.com/Retry");
        let f: HttpRouteFilter = serde_json::from_value(json!({"type": "URLRewrite"})).unwrap();
        assert_eq!((f.type_.clone(), f.type_.to_string()), (FilterType::UrlRewrite, "URLRewrite".into()));
        let l: Listener =
            serde_json::from_value(json!({"name": "q", "port": 443, "protocol": "example.com/QUIC"})).unwrap();
        assert_eq!(l.protocol, ProtocolType::Other("example.com/QUIC".into()));
        let m: HttpPathMatch = serde_json::from_value(json!({"value": "/"})).unwrap();
        assert_eq!(m.type_.unwrap_or_default(), PathMatchType::PathPrefix, "the API's default");
        assert_eq!(TlsMode::default(), TlsMode::Terminate);
        assert_eq!(FromNamespaces::default(), FromNamespaces::Same);
    }
}
