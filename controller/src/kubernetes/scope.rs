//! Which namespaces render mode reads: every namespace, or those `spec.render.namespaces` lists
//! plus the controller's own (where its publish Service and default certificate live).
//!
//! Owns that decision. It must never start a watch or read an object: [`super::cluster`] asks
//! it which namespaces to watch and which named Secrets and ConfigMaps it may.

use std::collections::BTreeSet;

use super::crd::RenderSpec;

/// The namespaces render mode lists and watches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Every namespace (cluster-wide watches).
    All,
    /// Exactly these (one watch per namespace and kind; never a cluster-wide list of a
    /// namespaced kind).
    Only(BTreeSet<String>),
}

impl Scope {
    /// The scope of `render` for a controller in namespace `own`.
    pub fn of(render: &RenderSpec, own: &str) -> Scope {
        if render.namespaces.is_empty() {
            return Scope::All;
        }
        let mut ns: BTreeSet<String> = render.namespaces.iter().cloned().collect();
        ns.insert(own.to_string());
        Scope::Only(ns)
    }

    /// Whether objects of `namespace` are read.
    pub fn admits(&self, namespace: &str) -> bool {
        match self {
            Scope::All => true,
            Scope::Only(ns) => ns.contains(namespace),
        }
    }

    /// The `(namespace, name)` references of `refs` that the scope admits.
    pub fn admitted(&self, refs: &BTreeSet<(String, String)>) -> BTreeSet<(String, String)> {
        refs.iter().filter(|(ns, _)| self.admits(ns)).cloned().collect()
    }

    /// A phrase for logs: `all namespaces` or `namespaces a, b`.
    pub fn describe(&self) -> String {
        match self {
            Scope::All => "all namespaces".into(),
            Scope::Only(ns) => format!("namespaces {}", ns.iter().cloned().collect::<Vec<_>>().join(", ")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn render(namespaces: &[&str]) -> RenderSpec {
        let mut v = serde_json::json!({"ingressClassName": "haptic"});
        v["namespaces"] = serde_json::json!(namespaces);
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn no_list_is_every_namespace() {
        let s = Scope::of(&render(&[]), "edge");
        assert_eq!(s, Scope::All);
        assert!(s.admits("anything"));
        assert_eq!(s.describe(), "all namespaces");
    }

    #[test]
    fn a_list_adds_the_controllers_own_namespace_and_nothing_else() {
        let s = Scope::of(&render(&["team-b", "team-a"]), "edge");
        assert!(s.admits("team-a") && s.admits("team-b") && s.admits("edge"));
        assert!(!s.admits("team-c") && !s.admits("") && !s.admits("team-a "));
        assert_eq!(s.describe(), "namespaces edge, team-a, team-b");
        let refs: BTreeSet<(String, String)> =
            [("team-a", "tls"), ("team-c", "tls"), ("edge", "default-cert")].map(|(a, b)| (a.into(), b.into())).into();
        let kept: Vec<_> = s.admitted(&refs).into_iter().map(|(ns, _)| ns).collect();
        assert_eq!(kept, ["edge", "team-a"]);
    }

    proptest! {
        /// A namespace is admitted exactly when it is listed or the controller's own, and a
        /// reference exactly when its namespace is.
        #[test]
        fn admits_exactly_the_listed_and_own(
            listed in proptest::collection::btree_set("[a-c]{1,2}", 1..4),
            own in "[a-c]{1,2}",
            probe in "[a-c]{1,2}",
        ) {
            let names: Vec<&str> = listed.iter().map(String::as_str).collect();
            let s = Scope::of(&render(&names), &own);
            prop_assert_eq!(s.admits(&probe), listed.contains(&probe) || probe == own);
            let refs: BTreeSet<(String, String)> = [(probe.clone(), "x".to_string())].into();
            prop_assert_eq!(s.admitted(&refs).len() == 1, s.admits(&probe));
        }
    }
}
