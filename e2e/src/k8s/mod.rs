//! Kubernetes for tests: a real control plane ([`ControlPlane`]: etcd + kube-apiserver on
//! loopback) and a kubelet stand-in ([`LocalPods`]: HAProxy pods run as local processes whose
//! `Pod` objects are kept up to date), and the Gateway API CRDs ([`install_gateway_crds`]).
//! Nothing here is used by the product binaries.

pub mod control_plane;
pub mod gateway_api;
pub mod local_pods;

pub use control_plane::{apiserver_bin, etcd_bin, k8s_version, AuditEntry, ControlPlane, ControlPlaneError};
pub use gateway_api::{install_gateway_crds, GatewayCrdsError};
pub use local_pods::{Container, LocalPods, LocalPodsError, LocalPodsOpts, AGENT_CONTAINER, HAPROXY_CONTAINER};
