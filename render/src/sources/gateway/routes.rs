//! The routes' side of a render (HTTPRoutes, and GRPCRoutes, TLSRoutes and TCPRoutes as
//! [`super::grpc_route`] and [`super::l4_routes`] lower them), one route at a time: its own content checked once
//! (hostnames, matches, filters, timeouts, backend references resolved), its parentRefs
//! attached to the listeners that allow it, then its rules into the [`Attached`] the render
//! gathers (rule backends, actions, weighted splits) and its matches into the host tables of
//! the listeners it attached to.
//!
//! Owns a route's status and verdict: a parentRef not attached says why in its conditions and
//! the verdict, backend references that do not resolve say so in ResolvedRefs. It must never
//! change a listener other than by counting the routes attached to it.

use std::collections::BTreeMap;

use haptic_haproxy::names::is_section_name;

use super::api::*;
use super::backend_tls::Applied;
use super::{
    claimed_by, compile_filters, compile_match, cond, duration_ms, granted, header_ops, intersect, labels_match,
    merge_ops, mirror_share, port_key, retry_of, rule_backend, stable_id, Attached, Candidate, GatewayOutput, Gateways,
    Parent, ParentStatus, Resolved, RouteOutcome, Speaks,
};
use crate::model::{
    Cause, HeaderOps, HostMatch, Mirror, ObjectRef, PathKind, PathRewrite, Policy, Protocol, Redirect, Refusal, Retry,
    RuleId, Split, Verdict, ERROR_500,
};
use crate::ownership::{claim_in_age_order, shown, Claimant, HostSharing};
use crate::slots::Endpoint;
use crate::sources::common::{endpoints, obj};

/// Why a reference does not resolve or a parent does not accept the route: the Gateway API
/// reason of its condition, the cause of the route's refusal, and the message.
struct Unresolved {
    reason: &'static str,
    cause: Cause,
    message: String,
}

/// An [`Unresolved`].
fn unresolved(reason: &'static str, cause: Cause, message: impl Into<String>) -> Unresolved {
    Unresolved { reason, cause, message: message.into() }
}

/// A route's own content, checked once for all its parents.
struct Content {
    /// Its hostnames (the catch-all when it has none).
    hostnames: Vec<HostMatch>,
    /// The last problem found (a route with one is attached to no parent).
    bad: Option<String>,
    /// Per rule: its candidates, actions and resolved backends.
    compiled: Vec<(Vec<Candidate>, Policy, Resolved)>,
    /// The first backend reference that does not resolve.
    resolved_refs: Result<(), Unresolved>,
}

/// The route being translated.
#[derive(Clone, Copy)]
struct One<'r> {
    r: &'r HttpRoute,
    /// Its kind (a GRPCRoute comes lowered to the HTTPRoute it means).
    kind: RouteKind,
    me: &'r ObjectRef,
    /// Its namespace.
    rns: &'r str,
    /// The client certificate its backends spoken to over TLS present (the file of the
    /// Gateways it is translated for), and what ends the names of its rules' ids and
    /// backends then (empty without one).
    client_cert: Option<&'r str>,
    variant: &'r str,
}

/// A route to translate: its kind, the route (lowered when a GRPCRoute) and what its lowering
/// could not express.
pub(super) struct RouteIn<'r> {
    pub kind: RouteKind,
    pub route: &'r HttpRoute,
    pub lowering: Option<String>,
}

/// Translates route `r` (of age rank `rank`) into `acc`, its outcome and verdict into `out`
/// when a parent is a Gateway of the class or a ListenerSet of one.
pub(super) fn route(gw: &Gateways<'_>, rank: usize, input: RouteIn<'_>, acc: &mut Attached, out: &mut GatewayOutput) {
    let r = input.route;
    let me = obj(input.kind.name(), &r.metadata);
    let rns = me.namespace.clone();
    let one = One { r, kind: input.kind, me: &me, rns: &rns, client_cert: None, variant: "" };
    let mut v = Verdict::of(me.clone());
    let mut content = content(gw, &one, rank);
    if let Some(why) = input.lowering {
        content.bad = Some(why);
    }
    let (parents, attachments, attached_any) = parents(gw, &one, &content, &mut v);
    if parents.is_empty() {
        return;
    }
    if let Err(u) = &content.resolved_refs {
        v.warnings.push(Refusal::new(u.cause, "spec.rules", u.message.clone()));
    }
    // Attached routes per listener (once per route).
    for (p, li) in &attachments {
        match *p {
            Parent::Gateway(gi) => out.gateways[gi].listeners[*li].attached_routes += 1,
            Parent::Set(si) => out.listener_sets[si].listeners[*li].attached_routes += 1,
        }
    }
    // The Services it sends HTTP to, for their BackendTLSPolicies' status.
    for br in r.spec.rules.iter().filter(|_| !input.kind.is_l4()).flat_map(|rule| &rule.backend_refs) {
        if br.group.as_deref().unwrap_or("").is_empty() && br.kind.as_deref().unwrap_or("Service") == "Service" {
            let key = (br.namespace.clone().unwrap_or_else(|| rns.clone()), br.name.clone());
            acc.reached.entry(key).or_default().extend(attachments.iter().map(|(p, _)| gw.gateway_of(*p)));
        }
    }
    if attached_any {
        // A backend spoken to over TLS presents the client certificate of the Gateway the
        // request came through: the attachments are grouped by it, each group translated with
        // its own rules and backends.
        let mut groups: BTreeMap<Option<&str>, Vec<(Parent, usize)>> = BTreeMap::new();
        for a in &attachments {
            groups.entry(gw.client_certs[gw.gateway_of(a.0)].as_deref()).or_default().push(*a);
        }
        let mut plain = Some(content.compiled);
        for (cert, atts) in groups {
            let variant = cert.map(|c| format!(".{}", stable_id("c", &[c]))).unwrap_or_default();
            let one = One { client_cert: cert, variant: &variant, ..one };
            let compiled = match cert {
                None => plain.take().unwrap_or_default(),
                Some(_) => self::content(gw, &one, rank).compiled,
            };
            for (ri, (cands, acts, res)) in compiled.into_iter().enumerate() {
                rule_into(&one, ri, (&cands, acts, res), acc);
                for (p, li) in &atts {
                    hosts_into(gw, &one, (*p, *li), (&content.hostnames, &cands), acc, &mut v);
                }
            }
        }
    }
    out.routes.push(RouteOutcome { object: me.clone(), uid: r.metadata.uid.clone(), parents });
    out.verdicts.push(v);
}

/// The route's content: hostnames, and per rule its matches, actions and backends.
fn content(gw: &Gateways<'_>, one: &One<'_>, rank: usize) -> Content {
    let r = one.r;
    let mut hostnames = Vec::new();
    let mut bad: Option<String> = None;
    for (i, h) in r.spec.hostnames.iter().enumerate() {
        match super::gateway_host(h) {
            Ok(h) => hostnames.push(h),
            Err(e) => bad = Some(format!("spec.hostnames[{i}]: {e}")),
        }
    }
    if hostnames.is_empty() {
        hostnames.push(HostMatch::Any);
    }
    let default_rule = [HttpRouteRule::default()];
    let rules_in: &[HttpRouteRule] = if r.spec.rules.is_empty() { &default_rule } else { &r.spec.rules };
    let mut compiled = Vec::new();
    let mut resolved_refs: Result<(), Unresolved> = Ok(());
    for (ri, rule) in rules_in.iter().enumerate() {
        let (cands, mut acts) = matches_and_actions(one, (rank, ri), rule, &mut bad);
        let field = format!("spec.rules[{ri}]");
        let mut res = backends(gw, one, (&field, rule), &mut bad, &mut resolved_refs);
        mirrors(gw, one, (&field, rule), (&mut acts, &mut res), (&mut bad, &mut resolved_refs));
        compiled.push((cands, acts, res));
    }
    Content { hostnames, bad, compiled, resolved_refs }
}

/// Rule `ri`'s candidates (one per match, ordered by the route's `rank`) and actions (its
/// filters and timeouts); a problem goes to `bad`.
fn matches_and_actions(
    one: &One<'_>,
    (rank, ri): (usize, usize),
    rule: &HttpRouteRule,
    bad: &mut Option<String>,
) -> (Vec<Candidate>, Policy) {
    let field = format!("spec.rules[{ri}]");
    let default_match = [HttpRouteMatch::default()];
    let ms: &[HttpRouteMatch] = if rule.matches.is_empty() { &default_match } else { &rule.matches };
    let mut cands = Vec::new();
    let mut prefix_len = None;
    for (mi, m) in ms.iter().enumerate() {
        let (ri_s, mi_s) = (ri.to_string(), mi.to_string());
        let mut parts = vec![one.rns, &one.me.name, &ri_s, &mi_s];
        if !one.variant.is_empty() {
            parts.push(one.variant);
        }
        let id = stable_id("g", &parts);
        match compile_match(m) {
            Ok(mut c) => {
                if c.path.0 == PathKind::Prefix {
                    prefix_len = Some(if c.path.1 == "/" { 0 } else { c.path.1.len() });
                }
                c.order = (rank, ri, mi);
                c.rule = id.into();
                cands.push(c);
            }
            Err(e) => *bad = Some(format!("{field}.matches[{mi}]: {e}")),
        }
    }
    let mut acts = match compile_filters(&rule.filters, prefix_len) {
        Ok(a) => a,
        Err(e) => {
            *bad = Some(format!("{field}.filters: {e}"));
            Policy::default()
        }
    };
    if let Some(t) = &rule.timeouts {
        let mut ms = Vec::new();
        for (f, v) in [("request", &t.request), ("backendRequest", &t.backend_request)] {
            match v.as_deref().map(duration_ms) {
                None | Some(Ok(0)) => {}
                Some(Ok(n)) => ms.push(n),
                Some(Err(e)) => *bad = Some(format!("{field}.timeouts.{f}: {e}")),
            }
        }
        acts.timeout_ms = ms.into_iter().min();
    }
    (cands, acts)
}

/// The backends of rule `rule` (at `field`) of route `one`, resolved: a backend filter problem
/// goes to `bad`, the first reference that does not resolve to `resolved_refs`.
fn backends(
    gw: &Gateways<'_>,
    one: &One<'_>,
    (field, rule): (&str, &HttpRouteRule),
    bad: &mut Option<String>,
    resolved_refs: &mut Result<(), Unresolved>,
) -> Resolved {
    let mut res = Resolved { refs: vec![], invalid_weight: 0, each: vec![], mirrors: vec![] };
    let retry = match rule.retry.as_ref().map(retry_of).transpose() {
        Ok(r) => r,
        Err(e) => {
            *bad = Some(format!("{field}.retry: {e}"));
            None
        }
    };
    for (bi, br) in rule.backend_refs.iter().enumerate() {
        let at = format!("{field}.backendRefs[{bi}]");
        let weight = u32::try_from(br.weight.unwrap_or(1)).unwrap_or(0);
        let mut ops = HeaderOps::default();
        for f in &br.filters {
            match (&f.type_, &f.request_header_modifier) {
                (FilterType::RequestHeaderModifier, Some(m)) => match header_ops(m) {
                    Ok(o) => ops = o,
                    Err(e) => *bad = Some(format!("{at}.filters: {e}")),
                },
                (other, _) => *bad = Some(format!("{at}.filters: {other} is not supported on a backend")),
            }
        }
        if weight > 0 {
            res.each.push((None, weight, ops));
        }
        match backend_ref(gw, one, &at, br).and_then(|b| with_retry(b, retry.as_ref(), &at)) {
            Err(unresolved) => {
                res.invalid_weight += weight;
                if resolved_refs.is_ok() {
                    *resolved_refs = Err(unresolved);
                }
            }
            Ok((name, eps, speaks)) => {
                if weight > 0 {
                    if let Some(last) = res.each.last_mut() {
                        last.0 = Some(name.clone());
                    }
                    res.refs.push((name, weight, eps, speaks));
                }
            }
        }
    }
    res
}

/// A resolved backend (at `at`) as a rule with `retry` sends to it: a backend of its own per
/// retry, named after the Service port's with the retry's id.
fn with_retry(
    (name, eps, mut speaks): (String, Vec<Endpoint>, Speaks),
    retry: Option<&Retry>,
    at: &str,
) -> Result<(String, Vec<Endpoint>, Speaks), Unresolved> {
    let Some(r) = retry else { return Ok((name, eps, speaks)) };
    let mut parts: Vec<String> = r.codes.iter().map(u16::to_string).collect();
    parts.push(format!("x{}", r.attempts));
    let parts: Vec<&str> = parts.iter().map(String::as_str).collect();
    let name = format!("{name}.{}", stable_id("r", &parts));
    if !is_section_name(&name) {
        return Err(unresolved("BackendNotFound", Cause::Missing, format!("{at}: {name:?} is not a backend name")));
    }
    speaks.retry = Some(r.clone());
    Ok((name, eps, speaks))
}

/// The RequestMirror filters of rule `rule` (at `field`) of route `one`, their backends
/// resolved as the rule's own are: each one's backend into `res` (so it is written) and a copy
/// of the rule's requests to it into `acts`. A share that is not a fraction goes to `bad`, the
/// first reference that does not resolve to `resolved_refs` (that copy is not made).
fn mirrors(
    gw: &Gateways<'_>,
    one: &One<'_>,
    (field, rule): (&str, &HttpRouteRule),
    (acts, res): (&mut Policy, &mut Resolved),
    (bad, resolved_refs): (&mut Option<String>, &mut Result<(), Unresolved>),
) {
    for (fi, f) in rule.filters.iter().enumerate() {
        if f.type_ != FilterType::RequestMirror {
            continue;
        }
        let at = format!("{field}.filters[{fi}].requestMirror");
        let Some(m) = &f.request_mirror else {
            *bad = Some(format!("{at}: missing"));
            continue;
        };
        let share = match mirror_share(m) {
            Ok(s) => s,
            Err(e) => {
                *bad = Some(format!("{at}: {e}"));
                continue;
            }
        };
        match backend_ref(gw, one, &format!("{at}.backendRef"), &m.backend_ref) {
            Err(unresolved) => {
                if resolved_refs.is_ok() {
                    *resolved_refs = Err(unresolved);
                }
            }
            Ok((name, eps, speaks)) => {
                acts.mirrors.push(Mirror { backend: name.clone(), share });
                res.mirrors.push((name, eps, speaks));
            }
        }
    }
}

/// What ends the name of a backend TLS or TCP connections pass through to (`mode tcp`).
const TCP_SUFFIX: &str = ".tcp";

/// Backend reference `br` (at `at`) of route `one`: its backend name, endpoints and how it is
/// spoken to, or why it does not resolve. A GRPCRoute speaks HTTP/2 to a Service port that does
/// not say otherwise, through a backend of its own (`.grpc`), so an HTTPRoute's HTTP/1 backend of
/// the same port stays as it is; a TLSRoute or TCPRoute passes connections to one of their own
/// (`.tcp`). A port a BackendTLSPolicy names is spoken to over TLS as it asks (whatever its
/// `appProtocol` says of HTTP), or not at all (no endpoints) when the policy cannot apply.
fn backend_ref(
    gw: &Gateways<'_>,
    one: &One<'_>,
    at: &str,
    br: &HttpBackendRef,
) -> Result<(String, Vec<Endpoint>, Speaks), Unresolved> {
    let (rns, kind) = (one.rns, one.kind.name());
    let bns = br.namespace.clone().unwrap_or_else(|| rns.to_string());
    if !br.group.as_deref().unwrap_or("").is_empty() || br.kind.as_deref().unwrap_or("Service") != "Service" {
        return Err(unresolved("InvalidKind", Cause::Invalid, format!("{at}: only Services are supported")));
    }
    if bns != rns && !granted(&gw.input.grants, kind, rns, "Service", &bns, &br.name) {
        return Err(unresolved(
            "RefNotPermitted",
            Cause::NotAllowed,
            format!("{at}: no ReferenceGrant in {bns} lets {kind}s of {rns} use Service {}", br.name),
        ));
    }
    let Some(svc) = gw.services.get(&(bns.as_str(), br.name.as_str())) else {
        return Err(unresolved(
            "BackendNotFound",
            Cause::Missing,
            format!("{at}: Service {bns}/{} not found", br.name),
        ));
    };
    let Some(port) = br.port else {
        return Err(unresolved("BackendNotFound", Cause::Missing, format!("{at}: no port")));
    };
    let sp = svc.spec.as_ref().and_then(|s| s.ports.as_ref()).and_then(|ps| ps.iter().find(|p| p.port == port));
    let Some(sp) = sp else {
        return Err(unresolved(
            "BackendNotFound",
            Cause::Missing,
            format!("{at}: Service {bns}/{} has no port {port}", br.name),
        ));
    };
    let policy = if one.kind.is_l4() { None } else { gw.tls.for_port(&bns, &br.name, sp.name.as_deref()) };
    let protocol = match sp.app_protocol.as_deref() {
        // TLS and TCP connections pass through as they are, whatever the port speaks.
        _ if one.kind.is_l4() => Protocol::Http,
        // Over TLS by the policy: HTTPS is what the port speaks.
        Some("https" | "HTTPS") if policy.is_some() => Protocol::Http,
        None | Some("http") | Some("kubernetes.io/ws") | Some("kubernetes.io/http") => Protocol::Http,
        Some("kubernetes.io/h2c") => Protocol::H2c,
        Some(other) => {
            return Err(unresolved(
                "UnsupportedProtocol",
                Cause::Invalid,
                format!("{at}: appProtocol {other} is not supported"),
            ));
        }
    };
    let (protocol, suffix) = match (one.kind, protocol) {
        (RouteKind::Grpc, Protocol::Http) => (Protocol::H2c, ".grpc"),
        (RouteKind::Tls | RouteKind::Tcp, p) => (p, TCP_SUFFIX),
        (_, p) => (p, ""),
    };
    let canonical = sp.name.clone().filter(|n| !n.is_empty()).unwrap_or_else(|| sp.port.to_string());
    let mut name = format!("{bns}_{}_{canonical}{suffix}", br.name);
    let sl = gw.slices.get(&(bns.as_str(), br.name.as_str())).map_or(&[][..], Vec::as_slice);
    let mut eps = endpoints(sl, sp.name.as_deref().unwrap_or(""));
    let speaks = match policy {
        None => Speaks { protocol, tls: None, retry: None },
        Some(Applied::Tls(t)) => {
            let mut t = t.clone();
            // The Gateway's client certificate: a backend of its own for these Gateways.
            if let Some(c) = one.client_cert {
                t.client_cert = Some(c.to_string());
                name.push_str(one.variant);
            }
            Speaks { protocol: over_tls(protocol), tls: Some(t), retry: None }
        }
        Some(Applied::Broken) => {
            eps.clear();
            Speaks { protocol, tls: None, retry: None }
        }
    };
    if !is_section_name(&name) {
        return Err(unresolved("BackendNotFound", Cause::Missing, format!("{at}: {name:?} is not a backend name")));
    }
    Ok((name, eps, speaks))
}

/// `p` over TLS.
fn over_tls(p: Protocol) -> Protocol {
    match p {
        Protocol::H2c | Protocol::H2s => Protocol::H2s,
        _ => Protocol::Https,
    }
}

/// The Gateway or ListenerSet of the class that parentRef `pr` of a route of namespace `rns`
/// names, if it names one.
fn parent_of(gw: &Gateways<'_>, rns: &str, pr: &ParentReference) -> Option<Parent> {
    if pr.group.as_deref().unwrap_or(GROUP) != GROUP {
        return None;
    }
    let pns = pr.namespace.as_deref().unwrap_or(rns);
    let named = |m: &k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta| {
        m.namespace.as_deref() == Some(pns) && m.name.as_deref() == Some(pr.name.as_str())
    };
    match pr.kind.as_deref().unwrap_or("Gateway") {
        "Gateway" => gw.gws.iter().position(|g| named(&g.metadata)).map(Parent::Gateway),
        "ListenerSet" => gw.sets.iter().position(|s| named(&s.ls.metadata)).map(Parent::Set),
        _ => None,
    }
}

/// The route's parent statuses (for parents that are Gateways of the class or their
/// ListenerSets, one per parentRef), the (parent, listener) pairs it attaches to, and whether
/// any parent accepted it.
fn parents(
    gw: &Gateways<'_>,
    one: &One<'_>,
    content: &Content,
    v: &mut Verdict,
) -> (Vec<ParentStatus>, Vec<(Parent, usize)>, bool) {
    let gen = one.r.metadata.generation.unwrap_or(0);
    let mut parents = Vec::new();
    let mut attached_any = false;
    let mut attachments: Vec<(Parent, usize)> = Vec::new(); // (parent, listener index)
    for pr in &one.r.spec.parent_refs {
        let Some(p) = parent_of(gw, one.rns, pr) else { continue };
        let mut conds = Vec::new();
        match &parent_listeners(gw, one, content, (p, pr)) {
            Ok(idx) => {
                conds.push(cond("Accepted", true, "Accepted", "accepted", gen));
                attached_any = true;
                for i in idx {
                    if !attachments.contains(&(p, *i)) {
                        attachments.push((p, *i));
                    }
                }
            }
            Err(u) => {
                conds.push(cond("Accepted", false, u.reason, u.message.clone(), gen));
                v.refusals.push(Refusal::new(u.cause, "spec.parentRefs", format!("{}: {}", pr.name, u.message)));
            }
        }
        match &content.resolved_refs {
            Ok(()) => conds.push(cond("ResolvedRefs", true, "ResolvedRefs", "resolved", gen)),
            Err(u) => conds.push(cond("ResolvedRefs", false, u.reason, u.message.clone(), gen)),
        }
        parents.push(ParentStatus { parent_ref: pr.clone(), conditions: conds });
    }
    (parents, attachments, attached_any)
}

/// The listeners of parent `p` (a Gateway's own, or a ListenerSet's) that parentRef `pr` names
/// and that take the route (by namespace, relative to the parent's, kind and hostname), or why
/// none does.
fn parent_listeners(
    gw: &Gateways<'_>,
    one: &One<'_>,
    content: &Content,
    (p, pr): (Parent, &ParentReference),
) -> Result<Vec<usize>, Unresolved> {
    let meta = match p {
        Parent::Gateway(gi) => &gw.gws[gi].metadata,
        Parent::Set(si) => &gw.sets[si].ls.metadata,
    };
    let gns = meta.namespace.clone().unwrap_or_default();
    let ls = gw.listeners_of(p);
    if let Parent::Set(si) = p {
        if ls.is_empty() && !gw.sets[si].ls.spec.listeners.is_empty() {
            return Err(unresolved(
                "NotAllowedByListeners",
                Cause::NotAllowed,
                format!("ListenerSet {}/{} is not accepted", gns, pr.name),
            ));
        }
    }
    let named: Vec<usize> = (0..ls.len())
        .filter(|i| pr.section_name.as_deref().is_none_or(|s| s == ls[*i].name))
        .filter(|i| pr.port.is_none_or(|p| i32::from(ls[*i].port) == p))
        .collect();
    if named.is_empty() {
        return Err(unresolved("NoMatchingParent", Cause::Invalid, "no listener matches the sectionName and port"));
    }
    if let Some(why) = gw.input.excluded.get(one.me) {
        return Err(unresolved("UnsupportedValue", Cause::LeftOut, why.to_string()));
    }
    if let Some(b) = &content.bad {
        return Err(unresolved("UnsupportedValue", Cause::Invalid, b.clone()));
    }
    let allowed: Vec<usize> = named
        .iter()
        .copied()
        .filter(|i| {
            let l = &ls[*i];
            l.usable
                && l.kinds.contains(&one.kind)
                && match l.from {
                    FromNamespaces::All => true,
                    FromNamespaces::Selector => l
                        .selector
                        .as_ref()
                        .is_some_and(|s| gw.ns_labels.get(one.rns).is_some_and(|labels| labels_match(s, labels))),
                    FromNamespaces::NoNamespace => false,
                    _ => one.rns == gns,
                }
        })
        .collect();
    if allowed.is_empty() {
        return Err(unresolved("NotAllowedByListeners", Cause::NotAllowed, "no listener allows this route"));
    }
    let hosted: Vec<usize> = allowed
        .into_iter()
        .filter(|i| content.hostnames.iter().any(|h| intersect(&ls[*i].hostname, h).is_some()))
        .collect();
    if hosted.is_empty() {
        Err(unresolved(
            "NoMatchingListenerHostname",
            Cause::Invalid,
            "no listener hostname intersects the route's hostnames",
        ))
    } else {
        Ok(hosted)
    }
}

/// Rule `ri` of an attached route into `acc`: its backend (the 500 backend for a split, whose
/// backends are planned as they are), each candidate's rule and actions, and the sub-rules of a
/// split (backends that differ in filters, or invalid ones beside valid ones).
fn rule_into(one: &One<'_>, ri: usize, (cands, acts, mut res): (&[Candidate], Policy, Resolved), acc: &mut Attached) {
    let me = one.me;
    // A TLS or TCP connection has no request to answer 500 or to modify: never split.
    let split = !one.kind.is_l4()
        && acts.redirect.is_none()
        && res.each.len() > 1
        && (res.each.iter().any(|e| !e.2.is_empty()) || (res.invalid_weight > 0 && !res.refs.is_empty()));
    let each = std::mem::take(&mut res.each);
    for (name, eps, speaks) in std::mem::take(&mut res.mirrors) {
        acc.backends.entry(name).or_insert((eps, BTreeMap::new(), speaks));
    }
    let single_ops = match each.as_slice() {
        [(_, _, ops)] => ops.clone(),
        _ => HeaderOps::default(),
    };
    let backend = if split {
        for (name, _, eps, speaks) in std::mem::take(&mut res.refs) {
            acc.backends.entry(name).or_insert((eps, BTreeMap::new(), speaks));
        }
        ERROR_500.to_string()
    } else {
        // A rule's own weighted backend is named after its route, of this kind only.
        let name = match one.kind {
            RouteKind::Http => me.name.clone(),
            RouteKind::Grpc => format!("{}.grpc", me.name),
            RouteKind::Tls => format!("{}.tls", me.name),
            RouteKind::Tcp => format!("{}{TCP_SUFFIX}", me.name),
        } + one.variant;
        rule_backend(one.rns, &name, ri, res, &mut acc.backends)
    };
    if one.kind.is_l4() && backend != ERROR_500 {
        acc.tcp_backends.insert(backend.clone());
    }
    for c in cands {
        // A redirect answers the request: nothing else of the rule applies.
        let mut a = match &acts.redirect {
            Some(r) => Policy { redirect: Some(r.clone()), ..Policy::default() },
            None => acts.clone(),
        };
        // A prefix rewrite replaces this match's own prefix.
        let plen = if c.path.0 == PathKind::Prefix && c.path.1 != "/" { c.path.1.len() } else { 0 };
        if let Some(PathRewrite::Prefix { matched, .. }) = &mut a.path_rewrite {
            *matched = plen;
        }
        if let Some(Redirect::Rewrite { path: Some(PathRewrite::Prefix { matched, .. }), .. }) = &mut a.redirect {
            *matched = plen;
        }
        if split {
            let mut picks = Vec::new();
            let mut upto = 0u32;
            for (bi, (be, w, ops)) in each.iter().enumerate() {
                let sub = RuleId::new(format!("{}b{bi}", c.rule));
                upto = upto.saturating_add(*w);
                picks.push((sub.clone(), upto));
                acc.rules.insert(sub.clone(), (be.clone().unwrap_or_else(|| ERROR_500.into()), me.clone()));
                let mut sa = a.clone();
                sa.request_headers = merge_ops(&a.request_headers, ops);
                if !sa.is_empty() {
                    acc.policies.entry(sub).or_insert(sa);
                }
            }
            acc.splits.push(Split { rule: c.rule.clone(), picks, total: upto });
            acc.rules.insert(c.rule.clone(), (backend.clone(), me.clone()));
            continue;
        }
        a.request_headers = merge_ops(&a.request_headers, &single_ops);
        acc.rules.insert(c.rule.clone(), (backend.clone(), me.clone()));
        if !a.is_empty() {
            acc.policies.entry(c.rule.clone()).or_insert(a);
        }
    }
}

/// A rule's candidates into the host tables of listener `li` of parent `p`: one per route
/// hostname as it intersects the listener's, unless a more specific listener of the port (the
/// Gateway's or a ListenerSet's) takes it or (hostnames owned by namespace) another namespace's
/// older route holds it.
fn hosts_into(
    gw: &Gateways<'_>,
    one: &One<'_>,
    (p, li): (Parent, usize),
    (hostnames, cands): (&[HostMatch], &[Candidate]),
    acc: &mut Attached,
    v: &mut Verdict,
) {
    let gi = gw.gateway_of(p);
    let l = &gw.listeners_of(p)[li];
    let b = gw.bind_ports[&port_key(gw.gws[gi], l.port)];
    let others: Vec<&Option<HostMatch>> = gw.on_port(gi, l.port).filter(|o| o.usable).map(|o| &o.hostname).collect();
    for h in hostnames {
        let Some(eff) = intersect(&l.hostname, h) else { continue };
        if others.iter().any(|o| claimed_by(&eff, o, &l.hostname)) {
            continue;
        }
        if gw.input.settings.host_sharing == HostSharing::Namespace {
            let by = Claimant {
                created: one.r.metadata.creation_timestamp.as_ref().map(|t| t.0),
                namespace: one.rns.to_string(),
                name: one.me.name.clone(),
            };
            if let Err(owner) = claim_in_age_order(&mut acc.owned, (b, eff.clone()), &by) {
                v.refusals.push(Refusal {
                    cause: Cause::NotAllowed,
                    field: "spec.hostnames".into(),
                    message: format!(
                        "{} on listener {} of Gateway {} belongs to namespace {} (route {}/{})",
                        shown(&eff),
                        l.name,
                        gw.gws[gi].metadata.name.as_deref().unwrap_or_default(),
                        owner.namespace,
                        owner.namespace,
                        owner.name
                    ),
                });
                continue;
            }
        }
        if l.terminate {
            acc.terminated.insert((b, eff.clone()));
        }
        acc.tables.entry((b, eff)).or_default().extend(cands.iter().cloned());
    }
}
