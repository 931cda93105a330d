//! TLSRoutes and TCPRoutes as the route translator reads them: each one lowered to the
//! HTTPRoute that attaches, resolves and reports the same way (its parentRefs, hostnames and
//! backends, rules without matches), so both land in the same neutral Model: a host table per
//! SNI host on a TLS Passthrough listener's bind port (a TCPRoute has no hostnames: the
//! listener's catch-all table), whose `/` entry names the rule, whose backend is a `mode tcp`
//! one ([`super::routes`] decides that by the route's kind).
//!
//! Owns the lowering. It must never attach, resolve or write status.

use super::api::{HttpBackendRef, HttpRoute, HttpRouteRule, HttpRouteSpec, ParentReference, TcpRoute, TlsRoute};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

/// A TLSRoute as an HTTPRoute: a rule per TLSRoute rule, each taking every connection.
pub(super) fn lower_tls(r: &TlsRoute) -> HttpRoute {
    let rules = r.spec.rules.iter().map(|rule| (rule.name.clone(), rule.backend_refs.clone()));
    lower(&r.metadata, (&r.spec.parent_refs, &r.spec.hostnames), rules)
}

/// A TCPRoute as an HTTPRoute: no hostnames, a rule per TCPRoute rule.
pub(super) fn lower_tcp(r: &TcpRoute) -> HttpRoute {
    let rules = r.spec.rules.iter().map(|rule| (rule.name.clone(), rule.backend_refs.clone()));
    lower(&r.metadata, (&r.spec.parent_refs, &[]), rules)
}

fn lower(
    metadata: &ObjectMeta,
    (parent_refs, hostnames): (&[ParentReference], &[String]),
    rules: impl Iterator<Item = (Option<String>, Vec<HttpBackendRef>)>,
) -> HttpRoute {
    let rules = rules
        .map(|(name, backend_refs)| HttpRouteRule {
            name,
            matches: Vec::new(),
            filters: Vec::new(),
            backend_refs,
            timeouts: None,
            retry: None,
        })
        .collect();
    let spec = HttpRouteSpec { parent_refs: parent_refs.to_vec(), hostnames: hostnames.to_vec(), rules };
    HttpRoute { metadata: metadata.clone(), spec, status: None }
}
