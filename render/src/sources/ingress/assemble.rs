//! The [`Routes`] the served Ingresses gathered to the [`Model`] and the slot map of this render:
//! policies (per namespace), rewrites and canary selectors with ids by content, rules in host/path
//! order with ids by host and path, host tables (with the hosts kept empty for their owners),
//! weighted canary backends, certificates, userlists, passthrough and frontends; then, apart,
//! what the backends want ([`Wants`]) to their endpoints and slots (retired ones parked).
//!
//! Owns every id and order the Model shows, each depending on content alone, so a route added or
//! removed never renumbers another, and the line between the two steps: the first never reads
//! an EndpointSlice nor the previous slot map, so its result holds for as long as every other
//! input does. It must never refuse or warn: whatever reaches it is served.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::EndpointSlice;

use super::annotations::{CanarySelector, Policy};
use super::{
    canary_weights, host_id, kept_hosts, rule_id, slice_index, slices_of, slots_for, EndpointSource, IngressInput,
    Route, RouteKey, Routes, SliceIndex,
};
use crate::model::{
    Backend, BackendOptions, Bind, Frontend, HostLookup, HostMatch, HostTable, Model, PathEntry, PathRewrite,
    PolicyEntry, PolicyId, RewriteEntry, Rule, RuleCanary, RuleId, DEFAULT_RULE,
};
use crate::ownership::{Claim, Owners};
use crate::slots::{self, Endpoint, PlanMemo, SlotMap};
use crate::sources::common::{content_ids, endpoints};

/// Weighted backends: name → (main, canary, weight, total).
type Weighted = BTreeMap<String, (String, String, u32, u32)>;

/// Each weighted backend's canary servers (those not the main's too).
type CanaryEps = BTreeMap<String, BTreeSet<SocketAddr>>;

/// What the backends of a translation want, before any endpoint: where each one's endpoints
/// come from, its options, where its backup servers' come from, and the weighted backends.
#[derive(Debug, Clone)]
pub(super) struct Wants {
    sources: BTreeMap<String, EndpointSource>,
    /// Each backend's options (a weighted backend's are its main's).
    options: BTreeMap<String, BackendOptions>,
    fallbacks: BTreeMap<String, Option<EndpointSource>>,
    weighted: Weighted,
}

/// The Model (without its backends: see [`Wants::backends`]) of `acc`, with `owners` and
/// `claims` of the served Ingresses, and what its backends want.
pub(super) fn model(input: &IngressInput, owners: &Owners, claims: &[Claim], acc: Routes<'_>) -> (Model, Wants) {
    let Routes { ctx, routes, default, certs, userlists, upstream_certs, passthrough, default_tls } = acc;
    let mut model = Model::default();
    let ids = Ids::of(&routes, default.as_ref());
    let (hosts, weighted) = rules(&mut model, &routes, default.as_ref(), &ids);
    ids.into_model(&mut model);
    host_tables(&mut model, (owners, claims), hosts, default.as_ref());
    let mut options: BTreeMap<String, BackendOptions> = ctx.options.into_iter().map(|(n, (o, _))| (n, o)).collect();
    for (name, (main, _, _, _)) in &weighted {
        if let Some(o) = options.get(main).cloned() {
            options.insert(name.clone(), o);
        }
    }
    let wants = Wants { sources: ctx.backends, options, fallbacks: ctx.fallbacks, weighted };
    model.certs = certs.into_values().collect();
    model.passthrough = passthrough
        .into_iter()
        .map(|(host, (backend, source))| crate::model::Passthrough { host, backend, source })
        .collect();
    // Only the files a backend of this render names (a retired backend has no options).
    let named: BTreeSet<&str> = wants
        .options
        .values()
        .filter_map(|o| o.upstream_tls.as_ref())
        .flat_map(|t| t.ca_file.iter().chain(&t.client_cert).map(String::as_str))
        .collect();
    model.upstream_certs = upstream_certs.into_values().filter(|c| named.contains(c.path.as_str())).collect();
    // Only the userlists a served rule's policy names.
    let named: BTreeSet<&str> =
        model.policies.iter().filter_map(|p| p.policy.auth.as_ref()).map(|a| a.userlist.as_str()).collect();
    model.userlists = userlists.into_values().filter(|u| named.contains(u.name.as_str())).collect();
    frontends(&mut model, input, default_tls);
    (model, wants)
}

/// Policy, rewrite and canary selector ids, by content, so a route added or removed never
/// renumbers one. A policy is one namespace's: its rate-limit tables count only that
/// namespace's requests, never another's with an equal policy.
struct Ids<'r> {
    policies: BTreeMap<(&'r str, &'r Policy), String>,
    rewrites: BTreeMap<&'r PathRewrite, String>,
    canaries: BTreeMap<&'r CanarySelector, String>,
}

impl<'r> Ids<'r> {
    /// The ids of what `routes` and `default` hold.
    fn of(routes: &'r BTreeMap<RouteKey, Route>, default: Option<&'r Route>) -> Self {
        let policies = routes
            .values()
            .chain(default)
            .filter(|r| !r.policy.is_empty())
            .map(|r| (r.source.namespace.as_str(), &*r.policy));
        let rewrites = routes.values().filter_map(|r| r.rewrite.as_ref());
        let canaries =
            routes.values().filter_map(|r| r.canary.as_ref().map(|c| &c.canary.selector)).filter(|s| !s.is_empty());
        Ids {
            policies: content_ids("p", policies),
            rewrites: content_ids("w", rewrites),
            canaries: content_ids("c", canaries),
        }
    }

    /// The id of `r`'s policy, none for the empty policy.
    fn policy(&self, r: &Route) -> Option<PolicyId> {
        self.policies.get(&(r.source.namespace.as_str(), &*r.policy)).map(|id| id.as_str().into())
    }

    /// The Model's policy, canary selector and rewrite tables.
    fn into_model(self, model: &mut Model) {
        model.policies = self
            .policies
            .iter()
            .map(|((_, p), id)| PolicyEntry { id: id.as_str().into(), policy: (*p).clone() })
            .collect();
        model.canaries = self
            .canaries
            .iter()
            .map(|(s, id)| crate::model::CanaryEntry { id: id.clone(), selector: (*s).clone() })
            .collect();
        model.rewrites = self
            .rewrites
            .iter()
            .map(|(rewrite, id)| RewriteEntry { id: id.clone(), rewrite: (*rewrite).clone() })
            .collect();
    }
}

/// The Model's rules, in host/path order then the default one, and each host's paths and the
/// weighted backends the rules name.
fn rules(
    model: &mut Model,
    routes: &BTreeMap<RouteKey, Route>,
    default: Option<&Route>,
    ids: &Ids<'_>,
) -> (BTreeMap<HostMatch, Vec<PathEntry>>, Weighted) {
    let mut weighted = Weighted::new();
    let mut hosts: BTreeMap<HostMatch, Vec<PathEntry>> = BTreeMap::new();
    let mut taken = HashSet::with_capacity(routes.len());
    for ((host, path, kind), r) in routes {
        let id = rule_id(host, path, *kind, &taken);
        taken.insert(id.clone());
        let id = RuleId::new(id);
        let (backend, canary) = match &r.canary {
            None => (r.backend.clone(), None),
            Some(c) => {
                let name = c.weighted.clone();
                weighted.insert(name.clone(), (r.backend.clone(), c.backend.clone(), c.canary.weight, c.canary.total));
                let selector = ids.canaries.get(&c.canary.selector).cloned();
                (name, Some(RuleCanary { main: r.backend.clone(), canary: c.backend.clone(), selector }))
            }
        };
        model.rules.push(Rule {
            id: id.clone(),
            backend,
            policy: ids.policy(r),
            rewrite: r.rewrite.as_ref().and_then(|w| ids.rewrites.get(w).cloned()),
            canary,
            source: r.source.clone(),
        });
        let entry = PathEntry { kind: *kind, path: path.clone(), rule: id };
        // The routes come ordered by host: most join the host the last one made.
        match hosts.last_entry() {
            Some(mut last) if last.key() == host => last.get_mut().push(entry),
            _ => {
                hosts.insert(host.clone(), vec![entry]);
            }
        }
    }
    if let Some(r) = default {
        model.rules.push(Rule {
            id: DEFAULT_RULE.into(),
            backend: r.backend.clone(),
            policy: ids.policy(r),
            rewrite: None,
            canary: None,
            source: r.source.clone(),
        });
        model.default_rule = Some(DEFAULT_RULE.into());
    }
    (hosts, weighted)
}

/// The Model's host tables: the routed hosts and those kept empty for their owners, each with
/// its paths longest first and its id.
fn host_tables(
    model: &mut Model,
    (owners, claims): (&Owners, &[Claim]),
    mut hosts: BTreeMap<HostMatch, Vec<PathEntry>>,
    default: Option<&Route>,
) {
    let mut routed: BTreeSet<HostMatch> = hosts.keys().cloned().collect();
    if default.is_some() {
        routed.insert(HostMatch::Any);
    }
    for h in kept_hosts(owners, claims, &routed) {
        hosts.entry(h).or_default();
    }
    let default_ns = default.map(|r| r.source.namespace.as_str());
    let mut ids: HashSet<String> = HashSet::with_capacity(hosts.len());
    for (host, mut paths) in hosts {
        paths.sort_by(|a, b| b.path.len().cmp(&a.path.len()).then(a.kind.cmp(&b.kind)).then(a.path.cmp(&b.path)));
        // The default backend answers a host's unmatched paths only for its own namespace's hosts.
        let unmatched_not_found = host != HostMatch::Any
            && default_ns.is_some_and(|d| !owners.namespaces(&host).contains(d))
            && owners.owner(&host).is_some();
        let id = host_id(&host, &ids);
        ids.insert(id.clone());
        model.hosts.push(HostTable { host, id, paths, port: None, unmatched_not_found });
    }
}

/// What the last [`Wants::backends`] resolved and planned, reused where its inputs are the same
/// (an endpoint change then redoes the backends of the Services whose slices changed alone).
#[derive(Debug, Default)]
pub(super) struct BackendMemo {
    /// Each endpoint source's EndpointSlices (the very objects, compared by pointer), the
    /// endpoints they gave, and the last call that resolved it.
    endpoints: BTreeMap<EndpointSource, Resolved>,
    plans: PlanMemo,
    /// Counts the calls; what the last one did not resolve is dropped (swept by generation, as
    /// [`PlanMemo`] is, so a hit moves nothing).
    generation: u64,
}

/// An endpoint source resolved.
#[derive(Debug)]
struct Resolved {
    slices: Vec<Arc<EndpointSlice>>,
    endpoints: Vec<Endpoint>,
    generation: u64,
}

impl BackendMemo {
    /// The endpoints `src` names among the indexed EndpointSlices: those resolved last time
    /// while they come of the very same slices.
    fn resolve(&mut self, index: &SliceIndex<'_>, src: &EndpointSource) -> Vec<Endpoint> {
        let slices = slices_of(index, src);
        let same = |kept: &[Arc<EndpointSlice>]| {
            kept.len() == slices.len() && kept.iter().zip(slices).all(|(a, b)| Arc::ptr_eq(a, b))
        };
        let fresh = || {
            let refs: Vec<&EndpointSlice> = slices.iter().map(|s| &***s).collect();
            let endpoints = endpoints(&refs, &src.port);
            Resolved { slices: slices.iter().map(|s| Arc::clone(s)).collect(), endpoints, generation: 0 }
        };
        let r = match self.endpoints.get_mut(src) {
            Some(r) => {
                if !same(&r.slices) {
                    *r = fresh();
                }
                r
            }
            None => self.endpoints.entry(src.clone()).or_insert_with(fresh),
        };
        r.generation = self.generation;
        r.endpoints.clone()
    }
}

impl Wants {
    /// The backends with their endpoints from `input`'s EndpointSlices and their slots planned
    /// against its previous slot map (weighted ones' servers weighed, backup slots for a
    /// `default-backend`, the retired ones with every slot parked), and the slot map. What
    /// `memo` holds of the last call is reused where its inputs are the same.
    pub(super) fn backends(&self, input: &IngressInput, memo: &mut BackendMemo) -> (Vec<Backend>, SlotMap) {
        let index = slice_index(&input.endpoint_slices);
        memo.generation += 1;
        let mut eps: BTreeMap<String, Vec<Endpoint>> =
            self.sources.iter().map(|(name, src)| (name.clone(), memo.resolve(&index, src))).collect();
        let canary_eps = weigh(&mut eps, &self.weighted);
        let prev = &input.previous_slots;
        let mut wanted = BTreeMap::new();
        for (name, endpoints) in eps {
            let options = self.options.get(&name).cloned().unwrap_or_default();
            let min_slots = slots_for(
                &options,
                endpoints.len(),
                prev.backends.get(&name).map_or(0, |p| p.count),
                input.settings.min_slots,
            );
            let mut weights = BTreeMap::new();
            if let (Some((_, _, w, t)), Some(theirs)) = (self.weighted.get(&name), canary_eps.get(&name)) {
                let serving = |canary: bool| {
                    endpoints.iter().filter(|e| !e.draining && theirs.contains(&e.addr) == canary).count()
                };
                let (wm, wc) = canary_weights(serving(false), serving(true), *w, *t);
                weights = endpoints.iter().map(|e| (e.addr, if theirs.contains(&e.addr) { wc } else { wm })).collect();
            }
            let backups =
                self.fallbacks.get(&name).map(|src| src.as_ref().map(|s| memo.resolve(&index, s)).unwrap_or_default());
            wanted.insert(name, slots::Wanted { endpoints, min_slots, options, weights, backups });
        }
        let mut slot_map = SlotMap::default();
        let backends = slots::plan_backends(prev, wanted, input.settings.min_slots, &mut slot_map, &mut memo.plans);
        let generation = memo.generation;
        memo.endpoints.retain(|_, r| r.generation == generation);
        (backends, slot_map)
    }
}

/// The weighted backends into `eps`: each holds its main's endpoints, then those of its canary
/// that are not the main's too. Gives each one's canary servers.
fn weigh(eps: &mut BTreeMap<String, Vec<Endpoint>>, weighted: &Weighted) -> CanaryEps {
    let mut canary_eps = CanaryEps::new();
    for (name, (main, canary, _, _)) in weighted {
        let main_eps = eps.get(main).cloned().unwrap_or_default();
        let mut all = main_eps.clone();
        let mut theirs = BTreeSet::new();
        for e in eps.get(canary).into_iter().flatten() {
            if !main_eps.iter().any(|m| m.addr == e.addr) {
                all.push(*e);
                theirs.insert(e.addr);
            }
        }
        canary_eps.insert(name.clone(), theirs);
        eps.insert(name.clone(), all);
    }
    canary_eps
}

/// The Model's health address, path normalization and frontends: `http` always, `https` when a
/// certificate, a passthrough host or a TLS entry served the default certificate needs it.
fn frontends(model: &mut Model, input: &IngressInput, default_tls: bool) {
    let st = &input.settings;
    model.health = st.health_port.map(|p| SocketAddr::new(st.bind_address, p));
    model.paths = st.paths;
    model.edge = st.edge.clone();
    model.frontends.push(Frontend {
        name: "http".into(),
        binds: vec![Bind { address: st.bind_address, port: st.http_port, tls: false, certs: vec![], clients: None }],
        hosts: HostLookup::Host,
    });
    if !model.certs.is_empty() || !model.passthrough.is_empty() || default_tls {
        model.frontends.push(Frontend {
            name: "https".into(),
            binds: vec![Bind {
                address: st.bind_address,
                port: st.https_port,
                tls: true,
                certs: vec![],
                clients: None,
            }],
            hosts: HostLookup::Host,
        });
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use super::super::fixture::input;
    use super::super::{translate_ingress, IngressInput};
    use crate::model::Model;

    /// What each id of `m` stands for: a host table's host; a rule's paths, backend, policy,
    /// rewrite, canary and source; a policy's content and the namespaces of the rules using it;
    /// a rewrite's and a canary selector's content.
    fn meanings(m: &Model) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = BTreeMap::new();
        for h in &m.hosts {
            out.insert(h.id.clone(), format!("{:?}", h.host));
            for p in &h.paths {
                out.entry(p.rule.to_string()).or_default().push_str(&format!("{:?} {:?} {};", h.host, p.kind, p.path));
            }
        }
        let mut users: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for r in &m.rules {
            let what = format!("{} {:?} {:?} {:?} {:?}", r.backend, r.policy, r.rewrite, r.canary, r.source);
            out.entry(r.id.to_string()).or_default().push_str(&what);
            if let Some(p) = &r.policy {
                users.entry(p).or_default().insert(&r.source.namespace);
            }
        }
        for p in &m.policies {
            out.insert(p.id.to_string(), format!("{:?} {:?}", p.policy, users.get(p.id.as_str())));
        }
        for w in &m.rewrites {
            out.insert(w.id.clone(), format!("{:?}", w.rewrite));
        }
        for c in &m.canaries {
            out.insert(c.id.clone(), format!("{:?}", c.selector));
        }
        out
    }

    /// `i` with a copy of each of its objects in namespace `zz-copy`, made later, every host with
    /// `a-` before it (so the copies' hosts and paths come first in every map).
    fn with_copy(i: &IngressInput) -> IngressInput {
        let mut out = i.clone();
        let ns = Some("zz-copy".to_string());
        let host = |h: &mut String| {
            *h = match h.strip_prefix("*.") {
                Some(rest) => format!("*.a-{rest}"),
                None => format!("a-{h}"),
            }
        };
        for ing in &i.ingresses {
            let mut ing = (**ing).clone();
            ing.metadata.namespace = ns.clone();
            ing.metadata.creation_timestamp =
                Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2030-01-01T00:00:00Z".parse().unwrap()));
            let spec = ing.spec.as_mut().unwrap();
            spec.rules.iter_mut().flatten().filter_map(|r| r.host.as_mut()).for_each(host);
            spec.tls.iter_mut().flatten().flat_map(|t| t.hosts.iter_mut().flatten()).for_each(host);
            out.ingresses.push(ing.into());
        }
        out.services.extend(
            i.services.iter().map(|s| (**s).clone()).map(|mut s| (s.metadata.namespace.clone_from(&ns), s.into()).1),
        );
        out.endpoint_slices.extend(
            i.endpoint_slices
                .iter()
                .map(|s| (**s).clone())
                .map(|mut s| (s.metadata.namespace.clone_from(&ns), s.into()).1),
        );
        out.secrets.extend(
            i.secrets.iter().map(|s| (**s).clone()).map(|mut s| (s.metadata.namespace.clone_from(&ns), s.into()).1),
        );
        out
    }

    /// Another namespace's routes coming (or going) never change what an id of this one's stands
    /// for, even where theirs sort first: a runtime change applied one map file after another
    /// can never send a request through another namespace's entries. An equal policy in two
    /// namespaces is two policies (its rate-limit tables are each one's own).
    #[test]
    fn another_namespace_never_changes_what_an_id_stands_for() {
        for fixture in [
            include_str!("../../../tests/fixtures/basic.yaml"),
            include_str!("../../../tests/fixtures/annotations.yaml"),
            include_str!("../../../tests/fixtures/canary.yaml"),
            include_str!("../../../tests/fixtures/nginx.yaml"),
            include_str!("../../../tests/fixtures/policies.yaml"),
        ] {
            let base = input(fixture);
            let (alone, _, _) = translate_ingress(&base);
            let (both, _, _) = translate_ingress(&with_copy(&base));
            let (alone, both) = (meanings(&alone), meanings(&both));
            assert!(both.len() > alone.len(), "the copies serve: {both:#?}");
            for (id, meaning) in &alone {
                assert_eq!(both.get(id), Some(meaning), "{id}");
            }
        }
    }
}
