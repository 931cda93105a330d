//! ListenerSets: listeners a ListenerSet adds to a Gateway of the class that allows it
//! (`spec.allowedListeners.namespaces.from`: `None`, the default, `Same`, `All` or `Selector`),
//! merged onto the Gateway's ports and binds.
//!
//! Owns which ListenerSets a Gateway admits, their precedence (the Gateway's own listeners
//! first, then ListenerSets by age, then `namespace/name`), the conflicts of their listeners with
//! those before them on a port (the later listener is the one Conflicted, not Accepted and not
//! Programmed), their status (Accepted, Programmed, per-listener statuses) and the Gateway's
//! `attachedListenerSets` and Service ports they add. A ListenerSet a Gateway does not admit must
//! never change the config: it gets no bind port, no listener and no route; one whose Gateway is
//! not accepted, or with no valid listener, binds nothing. It must never look at routes (they
//! attach in [`super::routes`]).

use std::collections::{BTreeMap, BTreeSet};

use super::api::*;
use super::listeners::{self, Owner};
use super::{
    cond, labels_match, port_key, Cond, Gateway, GatewayInput, GatewayOutput, ListenerSetOutcome, ListenerStatus, Lst,
    Set,
};
use crate::model::Cert;
use crate::sources::common::obj;

/// A ListenerSet whose parent is a Gateway of the class, with why it is refused as a whole
/// (the reason of its conditions and the message), if it is.
pub(super) struct Admission<'a> {
    gi: usize,
    ls: &'a ListenerSet,
    refused: Option<(&'static str, String)>,
}

/// The ListenerSets whose parent is among `gws`, in precedence order (oldest first, then
/// `namespace/name`), each admitted or refused (`NotAllowed`, or left out of the render).
pub(super) fn admit<'a>(
    input: &'a GatewayInput,
    gws: &[&Gateway],
    ns_labels: &BTreeMap<&str, BTreeMap<String, String>>,
) -> Vec<Admission<'a>> {
    let mut out = Vec::new();
    for ls in &input.listener_sets {
        let lns = ls.metadata.namespace.as_deref().unwrap_or_default();
        let p = &ls.spec.parent_ref;
        if p.group.as_deref().unwrap_or(GROUP) != GROUP || p.kind.as_deref().unwrap_or("Gateway") != "Gateway" {
            continue;
        }
        let pns = p.namespace.as_deref().unwrap_or(lns);
        let Some(gi) = gws.iter().position(|g| {
            g.metadata.namespace.as_deref() == Some(pns) && g.metadata.name.as_deref() == Some(p.name.as_str())
        }) else {
            continue;
        };
        let me = obj("ListenerSet", &ls.metadata);
        let refused = if !allows(gws[gi], lns, ns_labels) {
            let why = format!("Gateway {pns}/{} does not allow ListenerSets of namespace {lns}", p.name);
            Some(("NotAllowed", why))
        } else {
            input.excluded.get(&me).map(|why| ("ListenersNotValid", why.to_string()))
        };
        out.push(Admission { gi, ls, refused });
    }
    out.sort_by_key(|a| (a.ls.metadata.creation_timestamp.as_ref().map(|t| t.0), obj("ListenerSet", &a.ls.metadata)));
    out
}

/// Whether Gateway `g` allows ListenerSets of namespace `lns` (`namespaces`: every Namespace,
/// for a selector): the one rule, for the translator and for the Secrets the controller watches.
pub fn admits(g: &Gateway, lns: &str, namespaces: &[std::sync::Arc<k8s_openapi::api::core::v1::Namespace>]) -> bool {
    let labels =
        namespaces.iter().find(|n| n.metadata.name.as_deref() == Some(lns)).and_then(|n| n.metadata.labels.clone());
    let ns_labels = BTreeMap::from([(lns, labels.unwrap_or_default())]);
    allows(g, lns, &ns_labels)
}

/// Whether Gateway `g` allows ListenerSets of namespace `lns`.
fn allows(g: &Gateway, lns: &str, ns_labels: &BTreeMap<&str, BTreeMap<String, String>>) -> bool {
    let Some(n) = g.spec.allowed_listeners.as_ref().and_then(|a| a.namespaces.as_ref()) else { return false };
    match n.from.as_ref().unwrap_or(&FromNamespaces::NoNamespace) {
        FromNamespaces::All => true,
        FromNamespaces::Same => g.metadata.namespace.as_deref() == Some(lns),
        FromNamespaces::Selector => {
            n.selector.as_ref().is_some_and(|s| ns_labels.get(lns).is_some_and(|labels| labels_match(s, labels)))
        }
        _ => false,
    }
}

/// The listener ports of the admitted ListenerSets, by Gateway index.
pub(super) fn ports(admitted: &[Admission<'_>]) -> Vec<(usize, i32)> {
    admitted
        .iter()
        .filter(|a| a.refused.is_none())
        .flat_map(|a| a.ls.spec.listeners.iter().map(move |l| (a.gi, l.port)))
        .collect()
}

/// What the listeners before a ListenerSet's hold on their Gateway's ports: each port's
/// protocols and (port, hostname) pairs.
#[derive(Clone, Default)]
struct Claims {
    protocols: BTreeMap<i32, BTreeSet<String>>,
    hosts: BTreeSet<(i32, Option<String>)>,
}

impl Claims {
    /// The Gateway's own listeners' claims.
    fn of(g: &Gateway) -> Claims {
        let mut c = Claims::default();
        for l in &g.spec.listeners {
            c.claim(l);
        }
        c
    }

    fn claim(&mut self, l: &Listener) {
        self.protocols.entry(l.port).or_default().insert(l.protocol.to_string());
        self.hosts.insert((l.port, l.hostname.clone().filter(|h| !h.is_empty())));
    }

    /// The conflict listener `l` has with the claims before it, if any.
    fn conflict(&self, l: &Listener) -> Option<&'static str> {
        let proto = l.protocol.to_string();
        if self.protocols.get(&l.port).is_some_and(|ps| ps.iter().any(|p| *p != proto)) {
            Some("ProtocolConflict")
        } else if self.hosts.contains(&(l.port, l.hostname.clone().filter(|h| !h.is_empty()))) {
            Some("HostnameConflict")
        } else {
            None
        }
    }
}

/// Decides the ListenerSets `admitted` (in their order): their listeners (certificates into
/// `certs`), their outcomes into `out.listener_sets` (same order as the returned sets), and
/// their Gateways' `attachedListenerSets` and Service ports.
pub(super) fn decide<'a>(
    input: &GatewayInput,
    gws: &[&Gateway],
    admitted: Vec<Admission<'a>>,
    (bind_ports, certs): (&BTreeMap<String, u16>, &mut BTreeMap<String, Cert>),
    out: &mut GatewayOutput,
) -> Vec<Set<'a>> {
    let mut claims: Vec<Claims> = gws.iter().map(|g| Claims::of(g)).collect();
    let mut sets = Vec::new();
    for a in admitted {
        let (gi, ls) = (a.gi, a.ls);
        let gen = ls.metadata.generation.unwrap_or(0);
        let g = gws[gi];
        let parent_accepted = out.gateways[gi].conditions.iter().any(|c| c.type_ == "Accepted" && c.status);
        let refused = a
            .refused
            .or_else(|| (!parent_accepted).then(|| ("ParentNotAccepted", "its Gateway is not accepted".to_string())));
        let (listeners, statuses, conditions) = match refused {
            Some((reason, why)) => {
                let conds = vec![
                    cond("Accepted", false, reason, why.clone(), gen),
                    cond("Programmed", false, reason, why, gen),
                ];
                (Vec::new(), Vec::new(), conds)
            }
            None => set_listeners(input, (g, ls), &mut claims[gi], certs),
        };
        let accepted = conditions.iter().any(|c| c.type_ == "Accepted" && c.status);
        if accepted {
            let gout = &mut out.gateways[gi];
            gout.attached_listener_sets += 1;
            for l in listeners.iter().filter(|l| l.usable) {
                if !gout.service.ports.iter().any(|(p, _)| *p == l.port) {
                    gout.service.ports.push((l.port, bind_ports[&port_key(g, l.port)]));
                }
            }
        }
        out.listener_sets.push(ListenerSetOutcome {
            object: obj("ListenerSet", &ls.metadata),
            uid: ls.metadata.uid.clone(),
            conditions,
            listeners: statuses,
        });
        sets.push(Set { gi, ls, listeners });
    }
    sets
}

/// The listeners of admitted ListenerSet `ls` of Gateway `g` validated against `claims` (which
/// the listeners not conflicted join while the ListenerSet is accepted), their statuses and the
/// ListenerSet's conditions: accepted while one listener is programmed; none usable when none is.
fn set_listeners(
    input: &GatewayInput,
    (g, ls): (&Gateway, &ListenerSet),
    claims: &mut Claims,
    certs: &mut BTreeMap<String, Cert>,
) -> (Vec<Lst>, Vec<ListenerStatus>, Vec<Cond>) {
    let gen = ls.metadata.generation.unwrap_or(0);
    let lns = ls.metadata.namespace.as_deref().unwrap_or_default();
    let owner = Owner {
        kind: "ListenerSet",
        namespace: lns,
        generation: gen,
        name: ls.metadata.name.as_deref().unwrap_or_default(),
    };
    let (mut lsts, mut statuses) = (Vec::new(), Vec::new());
    let before = claims.clone();
    for l in &ls.spec.listeners {
        let conflict = claims.conflict(l);
        if conflict.is_none() {
            claims.claim(l);
        }
        let clients = listeners::client_validation(g, l.port);
        let (lst, mut status) = listeners::listener(input, &owner, l, (conflict, clients), certs);
        if let Some(r) = conflict {
            // A listener that loses its port to an earlier one is neither accepted nor programmed.
            let m = match r {
                "ProtocolConflict" => {
                    "a listener of the Gateway or of an earlier ListenerSet has another protocol on this port"
                }
                _ => "a listener of the Gateway or of an earlier ListenerSet has this hostname on this port",
            };
            for c in status.conditions.iter_mut().filter(|c| c.type_ == "Accepted" || c.type_ == "Programmed") {
                *c = cond(c.type_, false, r, m, gen);
            }
        }
        lsts.push(lst);
        statuses.push(status);
    }
    let programmed = |s: &ListenerStatus| s.conditions.iter().any(|c| c.type_ == "Programmed" && c.status);
    let n = statuses.iter().filter(|s| programmed(s)).count();
    let conds = if n == statuses.len() && n > 0 {
        vec![
            cond("Accepted", true, "Accepted", "accepted", gen),
            cond("Programmed", true, "Programmed", "programmed", gen),
        ]
    } else if n > 0 {
        vec![
            cond("Accepted", true, "ListenersNotValid", "some listeners are not valid", gen),
            cond("Programmed", true, "Programmed", "programmed", gen),
        ]
    } else {
        // Not accepted: it holds nothing.
        *claims = before;
        for l in &mut lsts {
            l.usable = false;
        }
        let m = "no listener is valid";
        vec![
            cond("Accepted", false, "ListenersNotValid", m, gen),
            cond("Programmed", false, "ListenersNotValid", m, gen),
        ]
    };
    (lsts, statuses, conds)
}

#[cfg(test)]
mod tests {
    use super::super::fixture::input;
    use super::super::*;

    const FIXTURE: &str = include_str!("../../../tests/fixtures/listener_sets.yaml");

    fn set<'a>(o: &'a GatewayOutput, ns: &str, name: &str) -> &'a ListenerSetOutcome {
        let found = o.listener_sets.iter().find(|s| s.object.namespace == ns && s.object.name == name);
        found.unwrap_or_else(|| panic!("no status for {ns}/{name}"))
    }

    fn entry<'a>(s: &'a ListenerSetOutcome, name: &str) -> &'a ListenerStatus {
        s.listeners.iter().find(|l| l.name == name).unwrap_or_else(|| panic!("no listener {name}"))
    }

    fn has(conds: &[Cond], type_: &str, status: bool, reason: &str) -> bool {
        conds.iter().any(|c| c.type_ == type_ && c.status == status && c.reason == reason)
    }

    fn attached(o: &GatewayOutput, name: &str) -> i32 {
        o.gateways.iter().find(|g| g.object.name == name).unwrap().attached_listener_sets
    }

    fn route<'a>(o: &'a GatewayOutput, name: &str) -> &'a RouteOutcome {
        o.routes.iter().find(|r| r.object.name == name).unwrap_or_else(|| panic!("no status for {name}"))
    }

    #[test]
    fn gateways_admit_listener_sets_from_the_namespaces_they_allow() {
        let o = translate_gateway(&input(FIXTURE));
        let not_allowed = |s: &ListenerSetOutcome| {
            has(&s.conditions, "Accepted", false, "NotAllowed")
                && has(&s.conditions, "Programmed", false, "NotAllowed")
                && s.listeners.is_empty()
        };
        // None (the default): not even its own namespace.
        assert!(not_allowed(set(&o, "edge", "in-edge")));
        assert_eq!(attached(&o, "none"), 0);
        assert!(not_allowed(set(&o, "edge", "explicit")), "from: None");
        // A Gateway not accepted accepts no ListenerSet.
        let orphan = set(&o, "team-b", "orphan");
        assert!(has(&orphan.conditions, "Accepted", false, "ParentNotAccepted"), "{orphan:?}");
        assert!(has(&orphan.conditions, "Programmed", false, "ParentNotAccepted"));
        assert_eq!(attached(&o, "invalid"), 0);
        // Same.
        let ok = set(&o, "edge", "same-ok");
        assert!(
            has(&ok.conditions, "Accepted", true, "Accepted") && has(&ok.conditions, "Programmed", true, "Programmed")
        );
        assert!(has(&entry(ok, "extra").conditions, "Programmed", true, "Programmed"));
        assert!(not_allowed(set(&o, "team-b", "same-other")));
        assert_eq!(attached(&o, "same"), 1);
        // Selector.
        assert!(has(&set(&o, "team-a", "selected").conditions, "Accepted", true, "Accepted"));
        assert!(not_allowed(set(&o, "team-b", "not-selected")));
        assert_eq!(attached(&o, "selector"), 1);
        // All: first (partly valid) is attached, second (no valid listener) and ungranted are not.
        assert_eq!(attached(&o, "all"), 1);
        // Every accepted listener binds on its Gateway's port: the Service lists 8443 too.
        let all = o.gateways.iter().find(|g| g.object.name == "all").unwrap();
        let ports: Vec<u16> = all.service.ports.iter().map(|(p, _)| *p).collect();
        assert_eq!(ports, [80, 8443]);
        assert!(all.listeners.len() == 1 && has(&all.listeners[0].conditions, "Programmed", true, "Programmed"));
    }

    #[test]
    fn conflicts_go_to_the_later_listener_gateway_first_then_older_listener_sets() {
        let o = translate_gateway(&input(FIXTURE));
        let first = set(&o, "team-b", "first");
        assert!(has(&first.conditions, "Accepted", true, "ListenersNotValid"), "{first:?}");
        assert!(has(&first.conditions, "Programmed", true, "Programmed"));
        assert!(first.conditions.iter().all(|c| c.observed_generation == 4));
        for (name, reason) in [("http", "HostnameConflict"), ("tcp", "ProtocolConflict")] {
            let c = &entry(first, name).conditions;
            assert!(has(c, "Accepted", false, reason), "{name}: {c:?}");
            assert!(has(c, "Programmed", false, reason), "{name}: {c:?}");
            assert!(has(c, "Conflicted", true, reason), "{name}: {c:?}");
        }
        for name in ["mine", "shared", "secure"] {
            let c = &entry(first, name).conditions;
            assert!(has(c, "Accepted", true, "Accepted") && has(c, "Programmed", true, "Programmed"), "{name}: {c:?}");
            assert!(has(c, "ResolvedRefs", true, "ResolvedRefs"), "{name}: {c:?}");
        }
        // `second` is as old as `first` and after it by name: its one listener loses.
        let second = set(&o, "team-b", "second");
        assert!(has(&second.conditions, "Accepted", false, "ListenersNotValid"), "{second:?}");
        assert!(has(&second.conditions, "Programmed", false, "ListenersNotValid"));
        assert!(has(&entry(second, "shared").conditions, "Conflicted", true, "HostnameConflict"));
        // The Gateway's own listener is untouched.
        let all = o.gateways.iter().find(|g| g.object.name == "all").unwrap();
        assert!(has(&all.listeners[0].conditions, "Conflicted", false, "NoConflicts"));
    }

    #[test]
    fn a_listener_set_certificate_needs_a_grant_to_listener_sets_of_its_namespace() {
        let o = translate_gateway(&input(FIXTURE));
        let secure = entry(set(&o, "team-b", "first"), "secure");
        assert!(has(&secure.conditions, "ResolvedRefs", true, "ResolvedRefs"));
        assert!(o.model.certs.iter().any(|c| c.path == "certs/certs_site.pem"));
        let ungranted = set(&o, "team-a", "ungranted");
        assert!(has(&entry(ungranted, "secure").conditions, "ResolvedRefs", false, "RefNotPermitted"));
        assert!(has(&ungranted.conditions, "Accepted", false, "ListenersNotValid"));
        assert!(has(&ungranted.conditions, "Programmed", false, "ListenersNotValid"));
    }

    #[test]
    fn routes_attach_to_listener_sets_by_their_own_parent_refs() {
        let o = translate_gateway(&input(FIXTURE));
        // One entry per parentRef, each judged on its own.
        let both = route(&o, "both");
        assert_eq!(both.parents.len(), 2);
        assert!(both.parents.iter().all(|p| has(&p.conditions, "Accepted", true, "Accepted")), "{both:?}");
        // A ListenerSet's listener is not the Gateway's.
        let via_gw = route(&o, "via-gateway");
        assert!(has(&via_gw.parents[0].conditions, "Accepted", false, "NoMatchingParent"), "{via_gw:?}");
        assert!(has(&route(&o, "via-set").parents[0].conditions, "Accepted", true, "Accepted"));
        // allowedRoutes Same is the ListenerSet's namespace.
        let from_edge = route(&o, "from-edge");
        assert!(has(&from_edge.parents[0].conditions, "Accepted", false, "NotAllowedByListeners"), "{from_edge:?}");
        let first = set(&o, "team-b", "first");
        assert_eq!(entry(first, "mine").attached_routes, 2, "both and via-set");
        assert!(o.model.hosts.iter().any(|h| h.host == HostMatch::Exact("first.example.com".into())));
        assert_eq!(entry(first, "shared").attached_routes, 1, "both");
        assert_eq!(entry(first, "http").attached_routes, 0, "a conflicted listener takes no route");
        let all = o.gateways.iter().find(|g| g.object.name == "all").unwrap();
        assert_eq!(all.listeners[0].attached_routes, 1, "both (through the Gateway)");
    }

    #[test]
    fn a_listener_set_left_out_of_the_render_holds_nothing() {
        let mut i = input(FIXTURE);
        let why = crate::narrow::Exclusion::Suspect;
        let me = ObjectRef { kind: "ListenerSet".into(), namespace: "team-b".into(), name: "first".into() };
        i.excluded.insert(me, why.clone());
        let o = translate_gateway(&i);
        let first = set(&o, "team-b", "first");
        assert!(has(&first.conditions, "Accepted", false, "ListenersNotValid"), "{first:?}");
        assert!(first.conditions.iter().all(|c| c.message == why.to_string()));
        // The next one in precedence now holds the port and hostname.
        assert!(has(&set(&o, "team-b", "second").conditions, "Accepted", true, "Accepted"));
        let both = route(&o, "both");
        assert!(has(&both.parents[1].conditions, "Accepted", false, "NotAllowedByListeners"), "{both:?}");
        assert!(!o.model.hosts.iter().any(|h| h.host == HostMatch::Exact("first.example.com".into())));
    }

    #[test]
    fn a_listener_set_the_gateway_does_not_allow_changes_nothing() {
        let base = r#"
namespaces: [{metadata: {name: edge}}, {metadata: {name: tenant}}]
gateways:
  - metadata: {name: gw, namespace: edge, creationTimestamp: "2026-01-01T00:00:00Z"}
    spec:
      gatewayClassName: haptic
      allowedListeners: {namespaces: {from: Same}}
      listeners: [{name: http, port: 80, protocol: HTTP, hostname: site.example.com, allowedRoutes: {namespaces: {from: All}}}]
routes:
  - metadata: {name: site, namespace: edge, creationTimestamp: "2026-01-02T00:00:00Z"}
    spec:
      parentRefs: [{name: gw}]
      rules: [{backendRefs: [{name: web, port: 80}]}]
services: [{metadata: {name: web, namespace: edge}, spec: {ports: [{port: 80}]}}]
"#;
        let attack = r#"
listenerSets:
  - metadata: {name: grab, namespace: tenant, creationTimestamp: "2025-01-01T00:00:00Z"}
    spec:
      parentRef: {name: gw, namespace: edge}
      listeners:
        - {name: same-host, port: 80, protocol: HTTP, hostname: site.example.com, allowedRoutes: {namespaces: {from: All}}}
        - {name: any, port: 80, protocol: HTTP}
        - {name: new-port, port: 9000, protocol: TCP}
  - metadata: {name: grab, namespace: edge, creationTimestamp: "2025-01-01T00:00:00Z"}
    spec:
      parentRef: {name: elsewhere}
      listeners: [{name: any, port: 80, protocol: HTTP}]
tenantRoutes:
  - metadata: {name: steal, namespace: tenant, creationTimestamp: "2025-01-01T00:00:00Z"}
    spec:
      parentRefs: [{kind: ListenerSet, name: grab}]
      hostnames: [site.example.com]
      rules: [{backendRefs: [{name: evil, port: 80}]}]
"#;
        let before = translate_gateway(&input(base));
        let mut with = input(base);
        #[derive(serde::Deserialize)]
        #[serde(rename_all = "camelCase")]
        struct Attack {
            listener_sets: Vec<ListenerSet>,
            tenant_routes: Vec<HttpRoute>,
        }
        let a: Attack = serde_saphyr::from_str(attack).unwrap();
        with.listener_sets = a.listener_sets.into_iter().map(std::sync::Arc::new).collect();
        let mut with_route = with.clone();
        with_route.routes.extend(a.tenant_routes.into_iter().map(std::sync::Arc::new));
        for i in [with, with_route] {
            let after = translate_gateway(&i);
            assert_eq!(after.model, before.model, "the config is the same");
            assert_eq!(after.slots, before.slots, "no bind port for it");
            assert_eq!(after.gateways, before.gateways, "the Gateway's status and Service are the same");
            let grab = set(&after, "tenant", "grab");
            assert!(has(&grab.conditions, "Accepted", false, "NotAllowed"));
            assert_eq!(after.listener_sets.len(), 1, "a ListenerSet of another parent gets no status");
        }
    }
}
