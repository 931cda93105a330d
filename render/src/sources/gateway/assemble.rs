//! What the Gateways and their routes gathered ([`Attached`]) to the Model and slot map of this
//! render: host tables with their paths and the match rules that need more than a path, rules,
//! backends with their slots (retired ones parked), certificates, the `gateway` frontend and the
//! `mode tcp` ones: `gateway_tls` (TLS passed through by SNI) and `gateway_tcp`.
//!
//! Owns every order the Model shows (host tables by bind port and host, ids by content, so a
//! host table added or removed never renames another). It must never refuse or change a
//! status: whatever reaches it is served.

use std::collections::{BTreeMap, BTreeSet};

use super::{stable_id, Attached, GatewayInput, GatewayOutput};
use crate::model::{
    BackendOptions, Bind, Cert, Frontend, HostLookup, HostTable, Listeners, MatchRule, Model, ObjectRef, PathEntry,
    PathKind, Policy, PolicyEntry, Rule, RuleId, TlsTermination,
};
use crate::slots::{self, SlotMap};
use crate::sources::common::content_ids;

/// `acc` and the listeners' `certs` into `out`'s Model and slot map.
pub(super) fn model(
    input: &GatewayInput,
    acc: Attached,
    (certs, ca_files): (BTreeMap<String, Cert>, BTreeMap<String, Cert>),
    out: &mut GatewayOutput,
) {
    let Attached {
        tables,
        ports,
        https_binds,
        mut tls_listeners,
        http_binds,
        sni_binds,
        tcp_binds,
        tls_terminate,
        terminated,
        tcp_backends,
        rules,
        policies,
        backends,
        mut splits,
        owned: _,
        reached: _,
        mut clients,
        client_cas,
        client_certs,
    } = acc;
    let model = &mut out.model;
    splits.sort_by(|a, b| a.rule.cmp(&b.rule));
    tls_listeners.sort();
    model.splits = splits;
    host_tables(model, tables);
    rules_and_policies(model, rules, &policies);
    plan_backends(model, &mut out.slots, input, (backends, &tcp_backends));
    model.certs = certs.into_values().collect();
    // Only the CA files a backend of this render names (a retired backend has no options).
    let named: BTreeSet<&str> = model
        .backends
        .iter()
        .filter_map(|b| b.options.upstream_tls.as_ref())
        .flat_map(|t| t.ca_file.iter().chain(&t.client_cert).map(String::as_str))
        .collect();
    model.upstream_certs =
        ca_files.into_values().chain(client_certs.into_values()).filter(|c| named.contains(c.path.as_str())).collect();
    model.upstream_certs.extend(client_cas.into_values());
    let st = &input.settings;
    let mut binds: Vec<Bind> = http_binds
        .iter()
        .map(|p| Bind { address: st.bind_address, port: *p, tls: false, certs: vec![], clients: None })
        .collect();
    for (p, mut c) in https_binds {
        c.sort();
        c.dedup();
        binds.push(Bind { address: st.bind_address, port: p, tls: true, certs: c, clients: clients.remove(&p) });
    }
    if !binds.is_empty() {
        let listeners = Listeners { ports: ports.into_iter().collect(), tls: tls_listeners };
        model.frontends.push(Frontend { name: "gateway".into(), binds, hosts: HostLookup::Listener(listeners) });
    }
    let terminations = tls_terminate
        .into_iter()
        .map(|(port, mut certs)| {
            certs.sort();
            certs.dedup();
            let tables = terminated.iter().filter(|(p, _)| *p == port).map(|(p, h)| table_id(*p, h)).collect();
            TlsTermination { port, certs, tables }
        })
        .collect();
    let l4 = [("gateway_tls", sni_binds, HostLookup::Sni(terminations)), ("gateway_tcp", tcp_binds, HostLookup::Port)];
    for (name, ports, hosts) in l4 {
        let binds: Vec<Bind> = ports
            .iter()
            .map(|p| Bind { address: st.bind_address, port: *p, tls: false, certs: vec![], clients: None })
            .collect();
        if !binds.is_empty() {
            model.frontends.push(Frontend { name: name.into(), binds, hosts });
        }
    }
}

/// The rules, each naming its policy: one per namespace and content, with an id by content
/// ([`content_ids`]), so a route added or removed never changes what a policy id stands for.
fn rules_and_policies(
    model: &mut Model,
    rules: BTreeMap<RuleId, (String, ObjectRef)>,
    policies: &BTreeMap<RuleId, Policy>,
) {
    let used = rules.iter().filter_map(|(id, (_, src))| Some((src.namespace.as_str(), policies.get(id)?)));
    let ids = content_ids("p", used);
    model.policies =
        ids.iter().map(|((_, p), id)| PolicyEntry { id: id.as_str().into(), policy: (*p).clone() }).collect();
    let rules: Vec<Rule> = rules
        .iter()
        .map(|(id, (backend, source))| Rule {
            id: id.clone(),
            backend: backend.clone(),
            policy: policies.get(id).and_then(|p| ids.get(&(source.namespace.as_str(), p))).map(|p| p.as_str().into()),
            rewrite: None,
            canary: None,
            source: source.clone(),
        })
        .collect();
    model.rules = rules;
}

/// The id of the host table of `host` on bind port `port`: by content, so a host table added
/// or removed never renames another (the config's match rules name host ids).
fn table_id(port: u16, host: &crate::model::HostMatch) -> String {
    stable_id("h", &[&port.to_string(), &format!("{host:?}")])
}

/// The host tables, in a deterministic order (by bind port and host): each one's candidates in
/// precedence order, those up to the last with a method, header or query match as match rules,
/// the others as paths.
fn host_tables(model: &mut Model, tables: BTreeMap<(u16, crate::model::HostMatch), Vec<super::Candidate>>) {
    for ((port, host), mut cands) in tables {
        let id = table_id(port, &host);
        cands.sort_by(|a, b| a.key.cmp(&b.key).then_with(|| a.order.cmp(&b.order)));
        let last_conditional =
            cands.iter().rposition(|c| c.method.is_some() || !c.headers.is_empty() || !c.query.is_empty());
        if let Some(last) = last_conditional {
            for c in &cands[..=last] {
                model.matches.push(MatchRule {
                    host: id.clone(),
                    path: Some(c.path.clone()).filter(|p| !(p.0 == PathKind::Prefix && p.1 == "/")),
                    method: c.method.clone(),
                    headers: c.headers.clone(),
                    query: c.query.clone(),
                    rule: c.rule.clone(),
                });
            }
        }
        let mut paths: Vec<PathEntry> = Vec::new();
        let mut seen = BTreeSet::new();
        for c in cands.iter().filter(|c| c.method.is_none() && c.headers.is_empty() && c.query.is_empty()) {
            if seen.insert(c.path.clone()) {
                paths.push(PathEntry { kind: c.path.0, path: c.path.1.clone(), rule: c.rule.clone() });
            }
        }
        paths.sort_by(|a, b| b.path.len().cmp(&a.path.len()).then(a.kind.cmp(&b.kind)).then(a.path.cmp(&b.path)));
        model.hosts.push(HostTable { host, id, paths, port: Some(port), unmatched_not_found: false });
    }
}

/// The backends: slots planned per backend, kept across renders; retired ones parked. Those in
/// `tcp` take TLS connections passed through.
fn plan_backends(
    model: &mut Model,
    slot_map: &mut SlotMap,
    input: &GatewayInput,
    (backends, tcp): (BTreeMap<String, super::PlannedBackend>, &BTreeSet<String>),
) {
    let min_slots = input.settings.min_slots;
    let wanted = backends
        .into_iter()
        .map(|(name, (endpoints, weights, speaks))| {
            let weights = weights.into_iter().map(|(a, w)| (a, u16::try_from(w).unwrap_or(256))).collect();
            let passthrough = tcp.contains(&name);
            let options = BackendOptions {
                protocol: speaks.protocol,
                upstream_tls: speaks.tls,
                retry: speaks.retry,
                passthrough,
                ..Default::default()
            };
            (name, slots::Wanted { endpoints, min_slots, options, weights, backups: None })
        })
        .collect();
    model.backends =
        slots::plan_backends(&input.previous_slots, wanted, min_slots, slot_map, &mut slots::PlanMemo::default());
}
