//! GRPCRoutes as the route translator reads them: each one lowered to the HTTPRoute it means on
//! the wire (a gRPC call is an HTTP/2 `POST` to `/<service>/<method>`), so one translator
//! attaches, resolves and reports both kinds, and a GRPCRoute lands in the same neutral Model.
//!
//! Owns the lowering: an exact service and method to an exact path, a service alone to its path
//! prefix, header matches as written, the header modifier filters (request and response) as
//! written, backends as written (their Services are spoken to in HTTP/2, [`super::routes`]
//! decides that by the route's kind). What it cannot lower yet (a method without its service,
//! regular expressions, mirrors and extension filters) is the route's problem, refused in its
//! own status. It must never attach, resolve or write status.

use super::api::{
    FilterType, GrpcMethodMatch, GrpcRoute, GrpcRouteRule, HttpPathMatch, HttpRoute, HttpRouteFilter, HttpRouteMatch,
    HttpRouteRule, HttpRouteSpec, MatchType, PathMatchType,
};

/// A GRPCRoute lowered: the HTTPRoute it means, and the last problem found (a route with one is
/// attached to no parent).
pub(super) struct Lowered {
    /// The HTTPRoute, with the GRPCRoute's metadata.
    pub route: HttpRoute,
    /// What could not be lowered, at its field.
    pub bad: Option<String>,
}

/// `r` as an HTTPRoute.
pub(super) fn lower(r: &GrpcRoute) -> Lowered {
    let mut bad = None;
    let rules = r.spec.rules.iter().enumerate().map(|(ri, rule)| lower_rule(ri, rule, &mut bad)).collect();
    let spec = HttpRouteSpec { parent_refs: r.spec.parent_refs.clone(), hostnames: r.spec.hostnames.clone(), rules };
    Lowered { route: HttpRoute { metadata: r.metadata.clone(), spec, status: None }, bad }
}

fn lower_rule(ri: usize, rule: &GrpcRouteRule, bad: &mut Option<String>) -> HttpRouteRule {
    let field = format!("spec.rules[{ri}]");
    let filters: Vec<HttpRouteFilter> = rule
        .filters
        .iter()
        .enumerate()
        .filter_map(|(fi, f)| match f.type_ {
            FilterType::RequestHeaderModifier | FilterType::ResponseHeaderModifier => Some(f.clone()),
            ref other => {
                *bad = Some(format!("{field}.filters[{fi}]: {other} is not supported on a GRPCRoute"));
                None
            }
        })
        .collect();
    let matches = rule
        .matches
        .iter()
        .enumerate()
        .map(|(mi, m)| {
            let path = match m.method.as_ref().map(method_path).transpose() {
                Ok(p) => p,
                Err(e) => {
                    *bad = Some(format!("{field}.matches[{mi}].method: {e}"));
                    None
                }
            };
            HttpRouteMatch { path, headers: m.headers.clone(), ..HttpRouteMatch::default() }
        })
        .collect();
    HttpRouteRule {
        name: rule.name.clone(),
        matches,
        filters,
        backend_refs: rule.backend_refs.clone(),
        timeouts: None,
        retry: None,
    }
}

/// The path match of a method match: `/<service>/<method>` exactly, or `/<service>` as a prefix.
fn method_path(m: &GrpcMethodMatch) -> Result<HttpPathMatch, String> {
    if m.type_.clone().unwrap_or_default() != MatchType::Exact {
        return Err("only Exact method matches are supported yet".into());
    }
    let (type_, value) = match (m.service.as_deref(), m.method.as_deref()) {
        (Some(s), _) if !is_service(s) => return Err(format!("service {s:?} is not a gRPC service name")),
        (_, Some(x)) if !is_name(x) => return Err(format!("method {x:?} is not a gRPC method name")),
        (Some(s), Some(x)) => (PathMatchType::Exact, format!("/{s}/{x}")),
        (Some(s), None) => (PathMatchType::PathPrefix, format!("/{s}")),
        (None, Some(_)) => return Err("a method without its service is not supported yet".into()),
        (None, None) => return Err("set service, method or both".into()),
    };
    Ok(HttpPathMatch { type_: Some(type_), value: Some(value) })
}

/// A protobuf identifier: a letter or `_`, then letters, digits and `_`. Hand-written: the two
/// character classes are all the CRD's patterns ask, and the render crate links no regex engine.
fn is_name(s: &str) -> bool {
    let mut b = s.bytes();
    b.next().is_some_and(|c| c.is_ascii_alphabetic() || c == b'_') && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// A fully qualified service: identifiers joined by dots.
fn is_service(s: &str) -> bool {
    s.len() <= 1024 && s.split('.').all(is_name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exact(service: Option<&str>, method: Option<&str>) -> GrpcMethodMatch {
        GrpcMethodMatch { type_: None, service: service.map(Into::into), method: method.map(Into::into) }
    }

    #[test]
    fn a_method_match_is_the_path_of_the_call() {
        let p = method_path(&exact(Some("pkg.v1.Echo"), Some("Say"))).unwrap();
        assert_eq!((p.type_, p.value.as_deref()), (Some(PathMatchType::Exact), Some("/pkg.v1.Echo/Say")));
        let p = method_path(&exact(Some("Echo"), None)).unwrap();
        assert_eq!((p.type_, p.value.as_deref()), (Some(PathMatchType::PathPrefix), Some("/Echo")));
    }

    #[test]
    fn header_filters_lower_as_written_and_others_are_refused() {
        let rule: GrpcRouteRule = serde_json::from_value(serde_json::json!({
            "filters": [
                {"type": "RequestHeaderModifier", "requestHeaderModifier": {"set": [{"name": "x-a", "value": "1"}]}},
                {"type": "ResponseHeaderModifier", "responseHeaderModifier": {"remove": ["x-b"]}},
            ]
        }))
        .unwrap();
        let mut bad = None;
        let lowered = lower_rule(0, &rule, &mut bad);
        assert_eq!((lowered.filters.len(), bad), (2, None));
        let mirror: GrpcRouteRule = serde_json::from_value(serde_json::json!({
            "filters": [{"type": "RequestMirror", "requestMirror": {"backendRef": {"name": "m", "port": 80}}}]
        }))
        .unwrap();
        let mut bad = None;
        assert!(lower_rule(0, &mirror, &mut bad).filters.is_empty());
        assert_eq!(bad.as_deref(), Some("spec.rules[0].filters[0]: RequestMirror is not supported on a GRPCRoute"));
    }

    #[test]
    fn what_is_no_grpc_name_or_not_lowered_yet_is_refused() {
        for (service, method) in [
            (Some("pkg./x"), Some("Say")),
            (Some("pkg..Echo"), None),
            (Some("Echo"), Some("Say/../x")),
            (Some("1Echo"), None),
            (Some("Echo"), Some("Say\n")),
            (None, Some("Say")),
            (None, None),
        ] {
            assert!(method_path(&exact(service, method)).is_err(), "{service:?} {method:?}");
        }
        let re = GrpcMethodMatch { type_: Some(MatchType::RegularExpression), ..exact(Some("Echo"), None) };
        assert!(method_path(&re).is_err());
    }
}
