//! One served Ingress at a time into the [`Routes`] the render gathers: its admission (left out,
//! annotations, refused snippets, the Secrets its annotations name), its default backend, its
//! rules' hosts and paths (or its passthrough hosts), its `server-alias` hosts and its TLS
//! Secrets, each problem in its own verdict.
//!
//! Owns the per-Ingress order: a refused Ingress adds nothing, an accepted one adds its routes in
//! rule and path order, a host/path claimed already stays with the Ingress that claimed it. It
//! must never look at the Model being built nor at another Ingress's verdict.

use std::collections::btree_map::Entry;
use std::collections::BTreeMap;
use std::fmt::Display;
use std::sync::Arc;

use haptic_haproxy::names::is_section_name;
use k8s_openapi::api::networking::v1::{HTTPIngressPath, HTTPIngressRuleValue, Ingress, IngressRule, IngressSpec};

use super::annotations::{self, BackendOptions, Meaning};
use super::{auth_users, join_canary, rewrite_of, tls_pem, upstream_files, IngressInput, Route, Routes};
use crate::model::{Cause, Cert, HostMatch, ObjectRef, PathKind, Policy, Refusal, Verdict, Why};
use crate::ownership::Owners;
use crate::sources::common::{obj, parse_host, parse_path};

/// A path of this Ingress on a named host: (path, kind, route), for its `server-alias` hosts.
type Own = (String, PathKind, Route);

/// What every step reads of the Ingress being admitted.
struct One<'i> {
    input: &'i IngressInput,
    owners: &'i Owners,
    ing: &'i Ingress,
    me: &'i ObjectRef,
    ns: &'i str,
    meaning: &'i Meaning,
    /// `meaning.policy`, shared by every route of the Ingress.
    policy: Arc<Policy>,
}

impl One<'_> {
    /// What the Ingress's annotations set for its backends, and the Ingress.
    fn opts(&self) -> (&BackendOptions, &ObjectRef) {
        (&self.meaning.backend, self.me)
    }
}

/// Admits `ing` into `acc` as far as it goes, and its verdict.
pub(super) fn ingress(input: &IngressInput, owners: &Owners, ing: &Ingress, acc: &mut Routes<'_>) -> Verdict {
    parts(input, owners, ing, acc)
}

/// Each part of `ing` into `acc` as far as it goes, and its verdict.
fn parts(input: &IngressInput, owners: &Owners, ing: &Ingress, acc: &mut Routes<'_>) -> Verdict {
    let me = obj("Ingress", &ing.metadata);
    let ns = me.namespace.clone();
    let mut v = Verdict::of(me.clone());
    let spec = ing.spec.clone().unwrap_or_default();
    let Some(meaning) = meaning(input, ing, &spec, &mut v) else { return v };
    let Some(meaning) = secrets(input, ing, &ns, meaning, acc, &mut v) else { return v };
    let policy = Arc::new(meaning.policy.clone());
    let one = One { input, owners, ing, me: &me, ns: &ns, meaning: &meaning, policy };
    default_backend(&one, &spec, acc, &mut v);
    let mut own: Vec<Own> = Vec::new();
    for (ri, rule) in spec.rules.as_deref().unwrap_or_default().iter().enumerate() {
        rule_routes(&one, ri, rule, acc, &mut v, &mut own);
    }
    aliases(&one, &own, acc, &mut v);
    tls(&one, &spec, acc, &mut v);
    v
}

/// What the Ingress's annotations mean, or `None` with its refusal: an Ingress left out of this
/// render, one whose annotations are refused, one bringing a snippet `haproxy -c` refused.
fn meaning(input: &IngressInput, ing: &Ingress, spec: &IngressSpec, v: &mut Verdict) -> Option<Meaning> {
    let has_tls = !spec.tls.as_deref().unwrap_or_default().is_empty();
    if let Some(why) = input.excluded.get(&v.object) {
        v.refusals.push(Refusal::new(Cause::LeftOut, "metadata", why.to_string()));
        return None;
    }
    let meaning = match annotations::read(
        ing.metadata.annotations.as_ref().unwrap_or(&BTreeMap::new()),
        has_tls,
        input.allowed,
    ) {
        Ok((m, warnings)) => {
            v.warnings.extend(warnings);
            m
        }
        Err(refusals) => {
            // Served without what its annotations ask (a source range, a redirect), the
            // Ingress would do what its author did not mean: none of it is served.
            v.refusals.extend(refusals);
            return None;
        }
    };
    if let Some(why) = meaning.backend.snippet.as_ref().and_then(|s| input.refused_snippets.get(s)) {
        let key = ["configuration-snippet", "server-snippet"]
            .into_iter()
            .find_map(|k| annotations::set_field(&ing.metadata, k))
            .unwrap_or_else(|| "metadata.annotations".into());
        v.refusals.push(Refusal::new(
            Cause::GateRefused,
            key,
            format!("haproxy -c refuses the snippet in its own backend: {why}"),
        ));
        return None;
    }
    Some(meaning)
}

/// The Secrets the annotations name, read into `acc` (upstream TLS files, basic authentication
/// userlists, the latter then named by the policy), or `None` with the refusal of the first
/// that cannot be read.
fn secrets(
    input: &IngressInput,
    ing: &Ingress,
    ns: &str,
    mut meaning: Meaning,
    acc: &mut Routes<'_>,
    v: &mut Verdict,
) -> Option<Meaning> {
    if let Some(t) = meaning.backend.upstream_tls.as_mut() {
        let f = annotations::field_of(&ing.metadata, "proxy-ssl-secret");
        let tls = matches!(meaning.backend.protocol, annotations::Protocol::Https | annotations::Protocol::H2s);
        let files = if tls {
            upstream_files(input, ns, t)
        } else {
            Err(Why::invalid("proxy-ssl-* needs backend-protocol HTTPS or GRPCS"))
        };
        match files {
            Ok(files) => {
                for c in files {
                    acc.upstream_certs.insert(c.path.clone(), c);
                }
            }
            Err(why) => {
                // Served without what it asks of TLS, it would talk to backends unverified.
                v.refusals.push(Refusal::at(f, why));
                return None;
            }
        }
    }
    if let Some(a) = &meaning.auth {
        match auth_users(input, ns, a) {
            Ok(list) => {
                let name = list.name.clone();
                acc.userlists.insert(name.clone(), list);
                meaning.policy.auth = Some(annotations::BasicAuth { userlist: name, realm: a.realm.clone() });
            }
            Err(why) => {
                // Served without its authentication, the Ingress would be open: none of it is.
                v.refusals.push(Refusal::at(a.field.clone(), why));
                return None;
            }
        }
    }
    Some(meaning)
}

/// The Ingress's `defaultBackend`, when its namespace may set the catch-all and no Ingress
/// set it before; a canary's is ignored.
fn default_backend(one: &One<'_>, spec: &IngressSpec, acc: &mut Routes<'_>, v: &mut Verdict) {
    if let (Some(_), Some(_)) = (&one.meaning.canary, &spec.default_backend) {
        v.warnings.push(Refusal {
            cause: Cause::Ignored,
            field: "spec.defaultBackend".into(),
            message: "ignored: a canary Ingress joins the paths of others, not the default backend".into(),
        });
    } else if let (Some(_), Err(e)) = (&spec.default_backend, one.owners.admits(&HostMatch::Any, one.ns)) {
        v.refusals.push(Refusal::new(Cause::NotAllowed, "spec.defaultBackend", e.to_string()));
    } else if let Some(b) = &spec.default_backend {
        match acc.ctx.backend(one.ns, b, &"spec.defaultBackend", one.opts(), v) {
            Ok(be) => match &acc.default {
                Some(Route { source: by, .. }) => v.refusals.push(Refusal {
                    cause: Cause::Conflict,
                    field: "spec.defaultBackend".into(),
                    message: format!("the default backend is already set by {by}"),
                }),
                None => {
                    acc.default = Some(Route {
                        backend: be,
                        policy: Arc::clone(&one.policy),
                        rewrite: None,
                        source: one.me.clone(),
                        canary: None,
                    })
                }
            },
            Err(r) => v.refusals.push(r),
        }
    }
}

/// The routes of rule `ri`: its host admitted for the Ingress's namespace, then its
/// passthrough host or each of its paths.
fn rule_routes(
    one: &One<'_>,
    ri: usize,
    rule: &IngressRule,
    acc: &mut Routes<'_>,
    v: &mut Verdict,
    own: &mut Vec<Own>,
) {
    let host = match rule.host.as_deref() {
        None | Some("") => HostMatch::Any,
        Some(h) => match parse_host(h) {
            Ok(h) => h,
            Err(reason) => {
                v.refusals.push(Refusal {
                    cause: Cause::Invalid,
                    field: format!("spec.rules[{ri}].host"),
                    message: reason,
                });
                return;
            }
        },
    };
    let Some(http) = &rule.http else { return };
    let admitted = match (&one.meaning.canary, one.meaning.backend.passthrough) {
        // A canary joins a route of its own namespace only (see `join_canary`).
        (Some(_), _) => Ok(()),
        (None, true) => one.owners.admits_passthrough(&host, one.ns),
        (None, false) => one.owners.admits(&host, one.ns),
    };
    if let Err(e) = admitted {
        v.refusals.push(Refusal {
            cause: Cause::NotAllowed,
            field: format!("spec.rules[{ri}].host"),
            message: e.to_string(),
        });
        return;
    }
    if one.meaning.backend.passthrough {
        passthrough(one, (ri, &host, http), acc, v);
        return;
    }
    for (pi, p) in http.paths.iter().enumerate() {
        // Formatted only into a refusal or warning.
        let field = format_args!("spec.rules[{ri}].http.paths[{pi}]");
        path_route(one, (&host, &field, p), acc, v, own);
    }
}

/// Rule `ri` of an `ssl-passthrough` Ingress: its exact host's connections to its first path's
/// backend, unless another Ingress passes that host through already.
fn passthrough(
    one: &One<'_>,
    (ri, host, http): (usize, &HostMatch, &HTTPIngressRuleValue),
    acc: &mut Routes<'_>,
    v: &mut Verdict,
) {
    let field = format!("spec.rules[{ri}]");
    let HostMatch::Exact(h) = host else {
        v.refusals.push(Refusal {
            cause: Cause::Invalid,
            field: format!("{field}.host"),
            message: "ssl-passthrough routes exact hosts only (by SNI)".into(),
        });
        return;
    };
    let Some(p) = http.paths.first() else { return };
    if http.paths.len() > 1 {
        v.warnings.push(Refusal {
            cause: Cause::Differs,
            field: format!("{field}.http.paths"),
            message: "ssl-passthrough sends the whole connection to the first path's Service; the others are ignored"
                .into(),
        });
    }
    if let Some(by) = acc.passthrough.get(h).map(|(_, by): &(String, ObjectRef)| by.clone()) {
        if by != *one.me {
            v.refusals.push(Refusal {
                cause: Cause::Conflict,
                field: format!("{field}.host"),
                message: format!("TLS to {h} already passes through for {by}"),
            });
        }
        return;
    }
    match acc.ctx.backend(one.ns, &p.backend, &format_args!("{field}.http.paths[0].backend"), one.opts(), v) {
        Ok(be) => {
            acc.passthrough.insert(h.clone(), (be, one.me.clone()));
        }
        Err(r) => v.refusals.push(r),
    }
}

/// One path (at `field`) on `host`: its kind, path and rewrite read, then joined as a canary or
/// routed to its backend, unless another Ingress routes it already.
fn path_route(
    one: &One<'_>,
    (host, field, p): (&HostMatch, &dyn Display, &HTTPIngressPath),
    acc: &mut Routes<'_>,
    v: &mut Verdict,
    own: &mut Vec<Own>,
) {
    let kind = match p.path_type.as_str() {
        "Exact" => PathKind::Exact,
        "Prefix" | "ImplementationSpecific" if one.meaning.paths.regex => PathKind::Regex,
        "Prefix" | "ImplementationSpecific" => PathKind::Prefix,
        other => {
            v.refusals.push(Refusal {
                cause: Cause::Invalid,
                field: format!("{field}.pathType"),
                message: format!("{other:?} is not Exact, Prefix or ImplementationSpecific"),
            });
            return;
        }
    };
    let path = match parse_path(kind, p.path.as_deref()) {
        Ok(p) => p,
        Err(reason) => {
            v.refusals.push(Refusal { cause: Cause::Invalid, field: format!("{field}.path"), message: reason });
            return;
        }
    };
    let rewrite = match rewrite_of(kind, &path, &one.meaning.paths.rewrite) {
        Ok(r) => r,
        Err(reason) => {
            v.refusals.push(Refusal { cause: Cause::Invalid, field: format!("{field}.path"), message: reason });
            return;
        }
    };
    let key = (host.clone(), path, kind);
    if let Some(c) = &one.meaning.canary {
        let at = (one.ns, &p.backend, field);
        if let Err(r) = join_canary(&mut acc.ctx, &mut acc.routes, &key, c, at, one.opts(), v) {
            v.refusals.push(r);
        }
        return;
    }
    let slot = match acc.routes.entry(key) {
        Entry::Occupied(e) => {
            let (by, (_, path, _)) = (&e.get().source, e.key());
            if by != one.me {
                v.refusals.push(Refusal {
                    cause: Cause::Conflict,
                    field: format!("{field}.path"),
                    message: format!("{kind:?} {path} on this host is already routed by {by}"),
                });
            }
            return;
        }
        Entry::Vacant(slot) => slot,
    };
    match acc.ctx.backend(one.ns, &p.backend, &format_args!("{field}.backend"), one.opts(), v) {
        Ok(be) => {
            let route =
                Route { backend: be, policy: Arc::clone(&one.policy), rewrite, source: one.me.clone(), canary: None };
            if *host != HostMatch::Any && !one.meaning.paths.aliases.is_empty() {
                own.push((slot.key().1.clone(), kind, route.clone()));
            }
            slot.insert(route);
        }
        Err(r) => v.refusals.push(r),
    }
}

/// The Ingress's paths on a named host (`own`) on each of its `server-alias` hosts its namespace
/// may route, but for those another Ingress routes already.
fn aliases(one: &One<'_>, own: &[Own], acc: &mut Routes<'_>, v: &mut Verdict) {
    for alias in &one.meaning.paths.aliases {
        if let Err(e) = one.owners.admits(alias, one.ns) {
            v.refusals.push(Refusal {
                cause: Cause::NotAllowed,
                field: annotations::field_of(&one.ing.metadata, "server-alias"),
                message: e.to_string(),
            });
            continue;
        }
        for (path, kind, route) in own {
            let key = (alias.clone(), path.clone(), *kind);
            match acc.routes.get(&key) {
                Some(Route { source: by, .. }) if by != one.me => v.warnings.push(Refusal {
                    cause: Cause::Conflict,
                    field: annotations::field_of(&one.ing.metadata, "server-alias"),
                    message: format!("{kind:?} {path} on alias {alias:?} is already routed by {by}: not aliased"),
                }),
                Some(_) => {}
                None => {
                    acc.routes.insert(key, route.clone());
                }
            }
        }
    }
}

/// The Ingress's TLS Secrets into `acc.certs`, one file per Secret with the hosts of every
/// Ingress naming it.
fn tls(one: &One<'_>, spec: &IngressSpec, acc: &mut Routes<'_>, v: &mut Verdict) {
    let ns = one.ns;
    for (ti, tls) in spec.tls.as_deref().unwrap_or_default().iter().enumerate() {
        let field = format!("spec.tls[{ti}].secretName");
        let Some(name) = tls.secret_name.as_deref().filter(|n| !n.is_empty()) else {
            let message = if one.input.settings.edge.default_certificate.is_some() {
                acc.default_tls = true;
                "no secretName: its hosts are served the default certificate".to_string()
            } else {
                "no secretName, and no default certificate: its hosts have no certificate of their own".to_string()
            };
            v.warnings.push(Refusal { cause: Cause::Missing, field, message });
            continue;
        };
        // The name becomes a file name under certs/: a Secret's name (a DNS subdomain) only.
        if !is_section_name(name) || name.len() > 253 || !is_section_name(ns) {
            let shown: String = name.chars().take(64).collect();
            v.refusals.push(Refusal {
                cause: Cause::Invalid,
                field,
                message: format!("{shown:?} is not a Secret name"),
            });
            continue;
        }
        match tls_pem(one.input, ns, name) {
            Ok(file) => {
                let path = format!("certs/{ns}_{name}.pem");
                let c = acc.certs.entry(path.clone()).or_insert_with(|| Cert {
                    path,
                    hosts: vec![],
                    source: ObjectRef { kind: "Secret".into(), namespace: ns.into(), name: name.into() },
                    pem: file.pem,
                    not_after: file.not_after,
                });
                c.hosts.extend(tls.hosts.clone().unwrap_or_default());
                c.hosts.sort();
                c.hosts.dedup();
            }
            Err(why) => v.refusals.push(Refusal::at(field, why)),
        }
    }
}
