//! TLSRoutes as the route translator reads them: each one lowered to the HTTPRoute that
//! attaches, resolves and reports the same way (its parentRefs, hostnames and backends, one rule
//! without matches), so a TLSRoute lands in the same neutral Model: a host table per SNI host
//! on its Passthrough listener's bind port, whose one entry names the rule, whose backend is a
//! `mode tcp` one ([`super::routes`] decides that by the route's kind).
//!
//! Owns the lowering. It must never attach, resolve or write status.

use super::api::{HttpRoute, HttpRouteRule, HttpRouteSpec, TlsRoute};

/// `r` as an HTTPRoute: a rule per TLSRoute rule, each taking every connection.
pub(super) fn lower(r: &TlsRoute) -> HttpRoute {
    let rules = r
        .spec
        .rules
        .iter()
        .map(|rule| HttpRouteRule {
            name: rule.name.clone(),
            matches: Vec::new(),
            filters: Vec::new(),
            backend_refs: rule.backend_refs.clone(),
            timeouts: None,
        })
        .collect();
    let spec = HttpRouteSpec { parent_refs: r.spec.parent_refs.clone(), hostnames: r.spec.hostnames.clone(), rules };
    HttpRoute { metadata: r.metadata.clone(), spec, status: None }
}
