//! CA certificate references: the ConfigMaps (their `ca.crt`, PEM) that BackendTLSPolicies and
//! Gateways' frontend client certificate validation name, resolved to one CA bundle.
//!
//! Owns reading them and the reason each kind of failure gets. It must never read a ConfigMap
//! of another namespace than the referrer's without a ReferenceGrant, nor decide what a failure
//! means for its referrer (the callers do).

use k8s_openapi::api::core::v1::ConfigMap;

use super::granted;
use crate::model::{Cert, ObjectRef};
use crate::pem::CertFile;

/// One reference as written.
pub(super) struct CaRef<'a> {
    pub group: &'a str,
    pub kind: &'a str,
    /// Its namespace, when it names one (else the referrer's).
    pub namespace: Option<&'a str>,
    pub name: &'a str,
}

/// Who refers: its kind and namespace, and the reason a reference of a kind other than
/// ConfigMap gets (the API spells it differently per referrer).
pub(super) struct Referrer<'a> {
    pub kind: &'a str,
    pub namespace: &'a str,
    pub kind_reason: &'static str,
}

/// The certificates of the references that resolve, and the first problem of those that do
/// not (reason, message).
pub(super) struct Resolved {
    pub pems: Vec<CertFile>,
    pub problem: Option<(&'static str, String)>,
}

/// Resolves `refs` (at field `at`) of `from` against `config_maps`, with `grants` for
/// references to another namespace.
pub(super) fn resolve<'a>(
    refs: impl Iterator<Item = CaRef<'a>>,
    at: &str,
    from: &Referrer<'_>,
    (config_maps, grants): (&[std::sync::Arc<ConfigMap>], &[std::sync::Arc<super::api::ReferenceGrant>]),
) -> Resolved {
    let mut out = Resolved { pems: Vec::new(), problem: None };
    for (i, r) in refs.enumerate() {
        let at = format!("{at}[{i}]");
        let ns = r.namespace.unwrap_or(from.namespace);
        let found = if !r.group.is_empty() || r.kind != "ConfigMap" {
            Err((from.kind_reason, format!("{at}: only ConfigMaps are supported, not {}", r.kind)))
        } else if ns != from.namespace && !granted(grants, from.kind, from.namespace, "ConfigMap", ns, r.name) {
            let m = format!(
                "{at}: no ReferenceGrant in {ns} lets {}s of {} use ConfigMap {}",
                from.kind, from.namespace, r.name
            );
            Err(("RefNotPermitted", m))
        } else {
            read(config_maps, ns, r.name).map_err(|m| ("InvalidCACertificateRef", format!("{at}: {m}")))
        };
        match found {
            Ok(f) => out.pems.push(f),
            Err(p) => {
                out.problem.get_or_insert(p);
            }
        }
    }
    out
}

/// The CA certificates of ConfigMap `ns/name`'s `ca.crt`, or why not.
fn read(config_maps: &[std::sync::Arc<ConfigMap>], ns: &str, name: &str) -> Result<CertFile, String> {
    let cm = config_maps
        .iter()
        .find(|c| c.metadata.namespace.as_deref() == Some(ns) && c.metadata.name.as_deref() == Some(name))
        .ok_or_else(|| format!("ConfigMap {ns}/{name} not found"))?;
    let data =
        cm.data.as_ref().and_then(|d| d.get("ca.crt")).ok_or_else(|| format!("ConfigMap {ns}/{name} has no ca.crt"))?;
    crate::pem::ca_bundle("ca.crt", data.as_bytes()).map_err(|e| format!("ConfigMap {ns}/{name}: {e}"))
}

/// `pems` as one CA file at `path`, from `source`.
pub(super) fn bundle(pems: Vec<CertFile>, path: String, source: ObjectRef) -> Cert {
    let not_after = pems.iter().map(|c| c.not_after).min().unwrap_or(i64::MAX);
    let pem = pems.into_iter().flat_map(|c| c.pem).collect();
    Cert { path, hosts: vec![], source, pem, not_after }
}
