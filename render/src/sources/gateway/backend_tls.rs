//! BackendTLSPolicy: which Service ports the Gateway speaks TLS to, checked against which CAs
//! and for which name, and each policy's conditions on the Gateways whose routes reach them.
//!
//! Owns the policy semantics: targets are Services of the policy's namespace, whole or one
//! named port (`sectionName`); on one target the oldest policy wins and the others are
//! Conflicted (a port-named policy and a whole-Service one do not conflict: the port-named one
//! applies to its port); CAs come from ConfigMaps of the policy's namespace (`ca.crt`, PEM) or
//! from the system's store (`System`); the name is sent as SNI and checked against the
//! certificate (`hostname`, or the one DNS `subjectAltNames` entry). It must never let a port a
//! policy names be spoken to in plain text or unverified: a policy that cannot be applied as
//! written leaves its ports without servers (503), it does not fall back.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::ConfigMap;

use super::api::{BackendTlsPolicy, ParentReference, GROUP};
use super::ca_refs::{self, CaRef, Referrer};
use super::{cond, Cond, ParentStatus};
use crate::model::{Cert, HostMatch, UpstreamTls};
use crate::sources::common::{obj, parse_host};
use crate::ObjectRef;

/// HAProxy's name for the system's CA store as a `ca-file`.
const SYSTEM_CA: &str = "@system-ca";

/// What a Service port's policy asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Applied {
    /// TLS, verified as the policy says.
    Tls(UpstreamTls),
    /// The policy cannot be applied as written: no servers.
    Broken,
}

/// One policy's decision.
#[derive(Debug)]
struct Judged {
    object: ObjectRef,
    uid: Option<String>,
    /// The Services it names, as (namespace, name).
    services: BTreeSet<(String, String)>,
    conditions: Vec<Cond>,
}

/// Every policy of the render, decided.
#[derive(Debug, Default)]
pub(crate) struct Policies {
    /// (namespace, Service, port name; `None` for the whole Service) → what applies.
    applied: BTreeMap<(String, String, Option<String>), Applied>,
    /// Each policy, oldest first.
    judged: Vec<Judged>,
    /// The CA files the applied policies name, by path.
    pub files: BTreeMap<String, Cert>,
}

/// Why a policy's CA references do not all resolve.
struct RefProblem {
    reason: &'static str,
    message: String,
}

impl Policies {
    /// Decides every policy of `input`: those left out (`excluded`) apply as broken, so their
    /// ports get no servers rather than plain text.
    pub(crate) fn decide(input: &super::GatewayInput) -> Self {
        let (policies, config_maps) = (&input.backend_tls_policies, &input.config_maps);
        let mut sorted: Vec<&BackendTlsPolicy> = policies.iter().map(|p| &**p).collect();
        sorted.sort_by_key(|p| {
            (p.metadata.creation_timestamp.as_ref().map(|t| t.0), obj("BackendTLSPolicy", &p.metadata))
        });
        let mut out = Policies::default();
        for p in sorted {
            let left_out = input.excluded.get(&obj("BackendTLSPolicy", &p.metadata));
            out.decide_one(p, config_maps, left_out);
        }
        out
    }

    fn decide_one(
        &mut self,
        p: &BackendTlsPolicy,
        config_maps: &[std::sync::Arc<ConfigMap>],
        left_out: Option<&crate::narrow::Exclusion>,
    ) {
        let me = obj("BackendTLSPolicy", &p.metadata);
        let gen = p.metadata.generation.unwrap_or(0);
        let ns = me.namespace.clone();
        let keys: Vec<(String, String, Option<String>)> = p
            .spec
            .target_refs
            .iter()
            .filter(|t| t.group.is_empty() && t.kind == "Service")
            .map(|t| (ns.clone(), t.name.clone(), t.section_name.clone().filter(|s| !s.is_empty())))
            .collect();
        let services = keys.iter().map(|(n, s, _)| (n.clone(), s.clone())).collect();
        let (mut file, mut refs) = (None, Ok(()));
        // A target an older policy holds: this one applies nowhere.
        let conflict = keys.iter().find(|k| self.applied.contains_key(*k));
        let accepted = if keys.is_empty() {
            Err(("Invalid", "no target is a Service".to_string()))
        } else if let Some(k) = conflict {
            Err(("Conflicted", format!("an older BackendTLSPolicy applies to Service {}{}", k.1, port_words(&k.2))))
        } else if let Some(why) = left_out {
            Err(("Invalid", why.to_string()))
        } else {
            let checked = check(p, &me, config_maps);
            refs = checked.refs;
            file = checked.file;
            checked.accepted
        };
        if conflict.is_none() {
            let applied = match &accepted {
                Ok(t) => Applied::Tls(t.clone()),
                Err(_) => Applied::Broken,
            };
            for k in keys {
                self.applied.insert(k, applied.clone());
            }
        }
        if let (Ok(_), Some(f)) = (&accepted, file) {
            self.files.insert(f.path.clone(), f);
        }
        let mut conditions = vec![match accepted {
            Ok(_) => cond("Accepted", true, "Accepted", "applied to the Services it names", gen),
            Err((reason, message)) => cond("Accepted", false, reason, message, gen),
        }];
        conditions.push(match refs {
            Ok(()) => cond("ResolvedRefs", true, "ResolvedRefs", "every CA certificate reference resolves", gen),
            Err(p) => cond("ResolvedRefs", false, p.reason, p.message, gen),
        });
        self.judged.push(Judged { object: me, uid: p.metadata.uid.clone(), services, conditions });
    }

    /// What applies to port `port` (its name; `None` when it has none) of Service `ns/svc`.
    pub(crate) fn for_port(&self, ns: &str, svc: &str, port: Option<&str>) -> Option<&Applied> {
        let key = |p: Option<&str>| (ns.to_string(), svc.to_string(), p.map(str::to_string));
        port.and_then(|p| self.applied.get(&key(Some(p)))).or_else(|| self.applied.get(&key(None)))
    }

    /// Each policy's status: one ancestor per Gateway (of `gateways`, by index) that an
    /// attached route sends to one of its Services through (`reached`).
    pub(crate) fn outcomes(
        &self,
        reached: &BTreeMap<(String, String), BTreeSet<usize>>,
        gateways: &[ObjectRef],
    ) -> Vec<PolicyOutcome> {
        self.judged
            .iter()
            .map(|j| {
                let ancestors: BTreeSet<usize> =
                    j.services.iter().filter_map(|s| reached.get(s)).flatten().copied().collect();
                let ancestors = ancestors
                    .into_iter()
                    .filter_map(|gi| gateways.get(gi))
                    .take(16)
                    .map(|g| ParentStatus {
                        parent_ref: ParentReference {
                            group: Some(GROUP.to_string()),
                            kind: Some("Gateway".to_string()),
                            namespace: Some(g.namespace.clone()),
                            name: g.name.clone(),
                            ..Default::default()
                        },
                        conditions: j.conditions.clone(),
                    })
                    .collect();
                PolicyOutcome { object: j.object.clone(), uid: j.uid.clone(), ancestors }
            })
            .collect()
    }
}

/// One BackendTLSPolicy's status entries (`status.ancestors`): one per Gateway of the class
/// whose routes reach a Service it names.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PolicyOutcome {
    /// The policy.
    pub object: ObjectRef,
    /// Its UID.
    pub uid: Option<String>,
    /// Its entries, with the Gateway as `ancestorRef`.
    pub ancestors: Vec<ParentStatus>,
}

fn port_words(port: &Option<String>) -> String {
    port.as_ref().map(|p| format!(" port {p}")).unwrap_or_default()
}

/// What checking a policy's validation found.
struct Checked {
    accepted: Result<UpstreamTls, (&'static str, String)>,
    refs: Result<(), RefProblem>,
    file: Option<Cert>,
}

/// Checks policy `p`'s validation: its name and CAs.
fn check(p: &BackendTlsPolicy, me: &ObjectRef, config_maps: &[std::sync::Arc<ConfigMap>]) -> Checked {
    let v = &p.spec.validation;
    let name = match verified_name(p) {
        Ok(n) => n,
        Err(m) => return Checked { accepted: Err(("Invalid", m)), refs: Ok(()), file: None },
    };
    let sni_name = (name != v.hostname).then(|| v.hostname.clone());
    let mut t = UpstreamTls { verify: true, name: Some(name), sni: true, sni_name, ..Default::default() };
    if let Some(w) = &v.well_known_ca_certificates {
        let accepted = if w != "System" {
            Err(("Invalid", format!("wellKnownCACertificates {w:?} is not supported (System is)")))
        } else if !v.ca_certificate_refs.is_empty() {
            Err(("Invalid", "wellKnownCACertificates and caCertificateRefs exclude each other".to_string()))
        } else {
            t.ca_file = Some(SYSTEM_CA.to_string());
            Ok(t)
        };
        return Checked { accepted, refs: Ok(()), file: None };
    }
    let refs =
        v.ca_certificate_refs.iter().map(|r| CaRef { group: &r.group, kind: &r.kind, namespace: None, name: &r.name });
    let from = Referrer { kind: "BackendTLSPolicy", namespace: &me.namespace, kind_reason: "InvalidKind" };
    let found = ca_refs::resolve(refs, "spec.validation.caCertificateRefs", &from, (config_maps, &[]));
    let refs = found.problem.map_or(Ok(()), |(reason, message)| Err(RefProblem { reason, message }));
    if found.pems.is_empty() {
        let why = refs.as_ref().err().map_or("no CA certificate", |e| e.reason);
        let accepted = Err(("NoValidCACertificate", format!("no CA certificate reference resolves ({why})")));
        return Checked { accepted, refs, file: None };
    }
    let path = format!("certs/backendtls_{}_{}_ca.pem", me.namespace, me.name);
    t.ca_file = Some(path.clone());
    Checked { accepted: Ok(t), refs, file: Some(ca_refs::bundle(found.pems, path, me.clone())) }
}

/// The name the backends' certificates must carry: `hostname`, or the one DNS name of
/// `subjectAltNames` (HAProxy checks one DNS name: `verifyhost`); or why not.
fn verified_name(p: &BackendTlsPolicy) -> Result<String, String> {
    let v = &p.spec.validation;
    let dns = |h: &str, field: &str| match parse_host(h) {
        Ok(HostMatch::Exact(h)) => Ok(h),
        _ => Err(format!("{field} {h:?} is not a DNS name")),
    };
    dns(&v.hostname, "hostname")?;
    match v.subject_alt_names.as_slice() {
        [] => dns(&v.hostname, "hostname"),
        [one] if one.type_ == "Hostname" => dns(one.hostname.as_deref().unwrap_or(""), "subjectAltNames[0].hostname"),
        _ => Err("subjectAltNames: HAProxy checks one DNS name of a backend's certificate; a URI name or a list \
                  of names is not supported"
            .to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::gateway::fixture::input;

    /// The policies of `yaml` decided beside a ConfigMap `a/ca` (which a reference of another
    /// kind or group must not read).
    fn policies(yaml: &str) -> Policies {
        let mut i = input(yaml);
        let mut cm = ConfigMap::default();
        cm.metadata.namespace = Some("a".into());
        cm.metadata.name = Some("ca".into());
        cm.data = Some([("ca.crt".to_string(), "not read".to_string())].into());
        i.config_maps.push(cm.into());
        Policies::decide(&i)
    }

    fn policy(name: &str, age: &str, target: &str) -> String {
        format!(
            "  - metadata: {{name: {name}, namespace: a, creationTimestamp: \"{age}\"}}\n    spec:\n      targetRefs: [{target}]\n      validation: {{hostname: h.example.com, wellKnownCACertificates: System}}\n"
        )
    }

    /// A port-named policy and a whole-Service one both apply (the named one on its port); two
    /// on one port: the older applies, the newer is Conflicted and applies nowhere.
    #[test]
    fn the_oldest_policy_on_a_port_applies() {
        let yaml = "backendTlsPolicies:\n".to_string()
            + &policy("whole", "2026-01-02T00:00:00Z", "{kind: Service, name: s}")
            + &policy("named", "2026-01-03T00:00:00Z", "{kind: Service, name: s, sectionName: https}")
            + &policy("late", "2026-01-04T00:00:00Z", "{kind: Service, name: s, sectionName: https}")
            + &policy("old", "2026-01-01T00:00:00Z", "{kind: Service, name: t}")
            + &policy("new", "2026-01-05T00:00:00Z", "{kind: Service, name: t}");
        let p = policies(&yaml);
        let accepted = |name: &str| {
            let j = p.judged.iter().find(|j| j.object.name == name).unwrap();
            (j.conditions[0].status, j.conditions[0].reason)
        };
        for name in ["whole", "named", "old"] {
            assert_eq!(accepted(name), (true, "Accepted"), "{name}");
        }
        for name in ["late", "new"] {
            assert_eq!(accepted(name), (false, "Conflicted"), "{name}");
        }
        let Some(Applied::Tls(t)) = p.for_port("a", "s", Some("https")) else { panic!() };
        assert_eq!(t.ca_file.as_deref(), Some(SYSTEM_CA));
        assert!(p.for_port("a", "s", Some("other")).is_some() && p.for_port("a", "s", None).is_some());
        assert!(p.for_port("b", "s", None).is_none(), "a policy names Services of its own namespace only");
    }

    /// A CA reference of another kind, or to a ConfigMap that does not exist or holds no
    /// certificate: ResolvedRefs False with the spec's reason; with none left, Accepted False
    /// (NoValidCACertificate) and the Service broken, not plain.
    #[test]
    fn ca_references_that_do_not_resolve_break_the_policy() {
        let refs = |r: &str| {
            format!(
                "backendTlsPolicies:\n  - metadata: {{name: p, namespace: a}}\n    spec:\n      targetRefs: [{{kind: Service, name: s}}]\n      validation: {{hostname: h.example.com, caCertificateRefs: [{r}]}}\n"
            )
        };
        for (r, reason) in [
            ("{kind: Secret, name: ca}", "InvalidKind"),
            ("{group: example.com, kind: ConfigMap, name: ca}", "InvalidKind"),
            ("{kind: ConfigMap, name: missing}", "InvalidCACertificateRef"),
        ] {
            let p = policies(&refs(r));
            let c: Vec<(bool, &str)> = p.judged[0].conditions.iter().map(|c| (c.status, c.reason)).collect();
            assert_eq!(c, [(false, "NoValidCACertificate"), (false, reason)], "{r}");
            assert_eq!(p.for_port("a", "s", None), Some(&Applied::Broken), "{r}");
            assert!(p.files.is_empty());
        }
    }
}
