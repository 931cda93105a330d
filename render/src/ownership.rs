//! Host ownership: which namespace may route a host.
//!
//! Owns the decision, from the claims the objects make (a host and the object claiming it), of
//! each host's owner: the oldest claiming object by creationTimestamp, then namespace/name.
//! Under [`HostSharing::Namespace`] (the default) only the owner's namespace may route the host;
//! under [`HostSharing::Shared`] every namespace may (the translator then gives each host/path
//! to its oldest object, as ingress-nginx merges), except on a host whose owner passes it
//! through (`ssl-passthrough` takes the whole host at layer 4, so nobody else may claim it).
//! `*.suffix` and `a.suffix` are different hosts with their own owners: a wildcard never
//! claims a more specific host. The catch-all ([`HostMatch::Any`]) is a host like any other.
//! It must never depend on the order claims arrive in, nor on anything but the claims.

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::jiff::Timestamp;
use serde::Serialize;

use crate::model::HostMatch;

/// Whether namespaces may share a host.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
pub enum HostSharing {
    /// A host belongs to the namespace of its oldest claiming object; others are refused.
    #[default]
    Namespace,
    /// Every namespace may route any host; each host/path goes to its oldest object.
    Shared,
}

/// An object claiming hosts, ordered by age: creationTimestamp (unset first), then
/// namespace, then name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Claimant {
    /// `metadata.creationTimestamp`.
    pub created: Option<Timestamp>,
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
}

/// One claim: an object wants to route a host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    /// The host.
    pub host: HostMatch,
    /// Who claims it.
    pub by: Claimant,
    /// Whether it takes the whole host (`ssl-passthrough`).
    pub exclusive: bool,
}

/// Why a namespace may not route a host.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostRefused {
    /// Another namespace owns the host.
    #[error("{host} belongs to namespace {} (its oldest claim is {}/{}); another namespace cannot route it", .owner.namespace, .owner.namespace, .owner.name)]
    OwnedBy {
        /// The host, as written for people.
        host: String,
        /// Its owner.
        owner: Claimant,
    },
    /// The owner passes the host through (layer 4): nobody else may route it.
    #[error("{host} passes through (ssl-passthrough) for {}/{}; another namespace cannot route it", .owner.namespace, .owner.name)]
    PassedThrough {
        /// The host, as written for people.
        host: String,
        /// Its owner.
        owner: Claimant,
    },
}

/// Each claimed host's owner and claiming namespaces.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Owners {
    sharing: HostSharing,
    /// Host → (oldest claimant, namespaces claiming it, passed through by its owner).
    hosts: BTreeMap<HostMatch, (Claimant, BTreeSet<String>, bool)>,
}

/// A host as people write it.
pub fn shown(h: &HostMatch) -> String {
    match h {
        HostMatch::Exact(h) => h.clone(),
        HostMatch::Wildcard(s) | HostMatch::Suffix(s) => format!("*{s}"),
        HostMatch::Any => "the catch-all (no host)".into(),
    }
}

impl Owners {
    /// The owners of the hosts `claims` name.
    pub fn new(claims: impl IntoIterator<Item = Claim>, sharing: HostSharing) -> Self {
        let mut hosts: BTreeMap<HostMatch, (Claimant, BTreeSet<String>, bool)> = BTreeMap::new();
        let mut exclusive: Vec<Claim> = Vec::new();
        for c in claims {
            let e = hosts.entry(c.host.clone()).or_insert_with(|| (c.by.clone(), BTreeSet::new(), false));
            if c.by < e.0 {
                e.0 = c.by.clone();
            }
            e.1.insert(c.by.namespace.clone());
            if c.exclusive {
                exclusive.push(c);
            }
        }
        for c in exclusive {
            if let Some(e) = hosts.get_mut(&c.host) {
                e.2 |= e.0.namespace == c.by.namespace;
            }
        }
        Owners { sharing, hosts }
    }

    /// The oldest claimant of `host`.
    pub fn owner(&self, host: &HostMatch) -> Option<&Claimant> {
        self.hosts.get(host).map(|e| &e.0)
    }

    /// The hosts claimed, each with its owner.
    pub fn hosts(&self) -> impl Iterator<Item = (&HostMatch, &Claimant)> {
        self.hosts.iter().map(|(h, e)| (h, &e.0))
    }

    /// The namespaces whose objects may route `host`: its owner's, or, when shared and not
    /// passed through, every claiming one.
    pub fn namespaces(&self, host: &HostMatch) -> BTreeSet<&str> {
        match self.hosts.get(host) {
            None => BTreeSet::new(),
            Some((_, all, pt)) if self.sharing == HostSharing::Shared && !pt => {
                all.iter().map(String::as_str).collect()
            }
            Some((o, _, _)) => [o.namespace.as_str()].into(),
        }
    }

    /// Whether an object of `namespace` may route `host` (an unclaimed host: yes).
    pub fn admits(&self, host: &HostMatch, namespace: &str) -> Result<(), HostRefused> {
        let Some((owner, _, pt)) = self.hosts.get(host) else { return Ok(()) };
        if owner.namespace == namespace {
            return Ok(());
        }
        let (host, owner) = (shown(host), owner.clone());
        match (self.sharing, pt) {
            (_, true) => Err(HostRefused::PassedThrough { host, owner }),
            (HostSharing::Shared, false) => Ok(()),
            (HostSharing::Namespace, false) => Err(HostRefused::OwnedBy { host, owner }),
        }
    }

    /// Whether an object of `namespace` may pass `host` through: only its owner's namespace,
    /// whatever the sharing.
    pub fn admits_passthrough(&self, host: &HostMatch, namespace: &str) -> Result<(), HostRefused> {
        match self.hosts.get(host) {
            Some((owner, _, _)) if owner.namespace != namespace => {
                Err(HostRefused::OwnedBy { host: shown(host), owner: owner.clone() })
            }
            _ => Ok(()),
        }
    }
}

/// The same rule for claims that arrive oldest first (a translator walking its objects in age
/// order): the first claimant of `key` owns it. Whether `by` may route `key`, else its owner.
pub fn claim_in_age_order<K: Ord>(owned: &mut BTreeMap<K, Claimant>, key: K, by: &Claimant) -> Result<(), Claimant> {
    let owner = owned.entry(key).or_insert_with(|| by.clone());
    if owner.namespace == by.namespace {
        Ok(())
    } else {
        Err(owner.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn claimant(t: i64, ns: &str, name: &str) -> Claimant {
        Claimant { created: Some(Timestamp::from_second(t).unwrap()), namespace: ns.into(), name: name.into() }
    }

    fn claim(host: &str, t: i64, ns: &str) -> Claim {
        let host = crate::sources::common::parse_host(host).unwrap();
        Claim { host, by: claimant(t, ns, "x"), exclusive: false }
    }

    #[test]
    fn the_oldest_object_owns_then_namespace_and_name() {
        let o = Owners::new(
            [claim("a.test", 20, "a"), claim("a.test", 10, "b"), claim("b.test", 10, "b")],
            Default::default(),
        );
        let a = HostMatch::Exact("a.test".into());
        assert_eq!(o.owner(&a).unwrap().namespace, "b");
        assert!(o.admits(&a, "b").is_ok());
        assert!(matches!(o.admits(&a, "a"), Err(HostRefused::OwnedBy { .. })));
        // Same second: namespace order decides.
        let o = Owners::new([claim("a.test", 10, "z"), claim("a.test", 10, "m")], Default::default());
        assert_eq!(o.owner(&a).unwrap().namespace, "m");
        // An unset timestamp is oldest.
        let mut c = claim("a.test", 10, "z");
        c.by.created = None;
        assert_eq!(Owners::new([claim("a.test", 1, "a"), c], Default::default()).owner(&a).unwrap().namespace, "z");
    }

    #[test]
    fn a_wildcard_and_a_host_under_it_have_their_own_owners() {
        let o = Owners::new([claim("*.test", 1, "a"), claim("b.test", 2, "b")], Default::default());
        assert!(o.admits(&HostMatch::Exact("b.test".into()), "b").is_ok());
        assert!(o.admits(&HostMatch::Wildcard(".test".into()), "b").is_err());
        assert_eq!(o.namespaces(&HostMatch::Exact("b.test".into())), ["b"].into());
    }

    #[test]
    fn shared_hosts_admit_everyone_unless_passed_through() {
        let h = HostMatch::Exact("a.test".into());
        let o = Owners::new([claim("a.test", 1, "a"), claim("a.test", 2, "b")], HostSharing::Shared);
        assert!(o.admits(&h, "b").is_ok());
        assert_eq!(o.namespaces(&h), ["a", "b"].into());
        assert!(o.admits_passthrough(&h, "b").is_err(), "passthrough only for the owner");
        let mut pt = claim("a.test", 1, "a");
        pt.exclusive = true;
        let o = Owners::new([pt, claim("a.test", 2, "b")], HostSharing::Shared);
        assert!(matches!(o.admits(&h, "b"), Err(HostRefused::PassedThrough { .. })));
        assert!(o.admits_passthrough(&h, "a").is_ok());
        assert_eq!(o.namespaces(&h), ["a"].into());
        // A younger namespace's passthrough makes nothing exclusive.
        let mut pt = claim("a.test", 3, "b");
        pt.exclusive = true;
        let o = Owners::new([claim("a.test", 1, "a"), pt], HostSharing::Shared);
        assert!(o.admits(&h, "b").is_ok() && o.admits_passthrough(&h, "b").is_err());
    }

    fn claims() -> impl Strategy<Value = Vec<Claim>> {
        let host = prop::sample::select(vec!["a.test", "b.test", "*.test", "*.b.test"]);
        let ns = prop::sample::select(vec!["a", "b", "c"]);
        prop::collection::vec((host, 0i64..5, ns, "[a-c]", any::<bool>()), 0..12).prop_map(|v| {
            v.into_iter()
                .map(|(h, t, ns, name, exclusive)| Claim {
                    host: crate::sources::common::parse_host(h).unwrap(),
                    by: claimant(t, ns, &name),
                    exclusive,
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn each_host_has_one_owner_namespace(cs in claims(), shuffle in any::<u64>()) {
            let o = Owners::new(cs.clone(), HostSharing::Namespace);
            for c in &cs {
                let admitted: BTreeSet<&str> =
                    ["a", "b", "c"].into_iter().filter(|ns| o.admits(&c.host, ns).is_ok()).collect();
                prop_assert_eq!(admitted.len(), 1);
                let oldest = cs.iter().filter(|d| d.host == c.host).map(|d| &d.by).min().unwrap();
                prop_assert!(admitted.contains(oldest.namespace.as_str()));
                prop_assert_eq!(o.namespaces(&c.host), admitted);
            }
            // The order claims arrive in changes nothing.
            let mut rev = cs.clone();
            let n = rev.len().max(1);
            rev.rotate_left((shuffle as usize) % n);
            rev.reverse();
            prop_assert_eq!(Owners::new(rev, HostSharing::Namespace), o);
        }

        #[test]
        fn claims_in_age_order_find_the_same_owners(cs in claims()) {
            let o = Owners::new(cs.clone(), HostSharing::Namespace);
            let mut sorted = cs.clone();
            sorted.sort_by(|a, b| a.by.cmp(&b.by));
            let mut owned = BTreeMap::new();
            for c in &sorted {
                let r = claim_in_age_order(&mut owned, c.host.clone(), &c.by);
                prop_assert_eq!(r.is_ok(), o.admits(&c.host, &c.by.namespace).is_ok());
            }
            for (h, owner) in o.hosts() {
                prop_assert_eq!(&owned[h].namespace, &owner.namespace);
            }
        }

        #[test]
        fn a_younger_claim_never_changes_an_owner(cs in claims(), host in 0usize..4, ns in 0usize..3, exclusive in any::<bool>()) {
            for sharing in [HostSharing::Namespace, HostSharing::Shared] {
                let before = Owners::new(cs.clone(), sharing);
                let mut more = cs.clone();
                let host = crate::sources::common::parse_host(["a.test", "b.test", "*.test", "*.b.test"][host]).unwrap();
                more.push(Claim { host: host.clone(), by: claimant(100, ["a", "b", "c"][ns], "new"), exclusive });
                let after = Owners::new(more, sharing);
                for (h, owner) in before.hosts() {
                    prop_assert_eq!(after.owner(h), Some(owner));
                    // Who else may route it changes only when shared and not passed through.
                    for other in ["a", "b", "c"] {
                        if before.admits(h, other).is_err() {
                            prop_assert!(after.admits(h, other).is_err());
                        }
                    }
                    prop_assert_eq!(after.admits_passthrough(h, &owner.namespace), Ok(()));
                }
            }
        }
    }
}
