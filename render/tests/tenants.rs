//! Namespaces cannot take each other's Ingress hosts: each attack of one namespace on another's
//! host (the same path, a more specific path, a wildcard over its host, a catch-all default
//! backend, a `server-alias`, a canary joining its route, `ssl-passthrough` of its host) next to
//! its benign twin (two Ingresses of one namespace on its host, its own canary, its own
//! passthrough, `Shared` merging), first as verdicts and Model, then run by real HAProxy 2.6 and
//! 3.0 with requests showing which backend answers each host and path; and, as a property, a
//! younger Ingress of another namespace never changes what a host's owner serves. An equal
//! rate limit in two namespaces counts each one's requests apart.

use std::collections::BTreeMap;

use haptic_e2e::net::free_port;
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_e2e::HaproxyBin;
use haptic_render::ingress::{IngressInput, Settings};
use haptic_render::model::{HostMatch, Model, PathKind, NOT_FOUND};
use haptic_render::ownership::HostSharing;
use haptic_render::{translate_ingress, Cause, Verdict};
use proptest::prelude::*;

mod common;

const YAML: &str = include_str!("fixtures/tenants.yaml");

/// The fixture's Ingresses named in `names`, hosts shared as `sharing`.
fn case(names: &[&str], sharing: HostSharing, settings: Settings) -> IngressInput {
    let mut i = common::input(YAML, settings);
    i.ingresses.retain(|ing| names.contains(&ing.metadata.name.as_deref().unwrap_or_default()));
    i.sharing = sharing;
    i
}

fn verdict<'a>(v: &'a [Verdict], name: &str) -> &'a Verdict {
    v.iter().find(|v| v.object.name == name).unwrap_or_else(|| panic!("no verdict for {name}: {v:?}"))
}

/// The refusals of `name` as (field, cause).
fn refused(v: &[Verdict], name: &str) -> Vec<(String, Cause)> {
    verdict(v, name).refusals.iter().map(|r| (r.field.clone(), r.cause)).collect()
}

const VICTIM: &[&str] = &["v-shop", "v-api", "v-shop-more", "v-pt"];
const ATTACKS: &[&str] = &["a-same", "a-deeper", "a-wild", "a-canary", "a-pt", "a-default", "a-alias"];

fn all_of(a: &[&str], b: &[&str]) -> Vec<&'static str> {
    a.iter().chain(b).map(|s| -> &'static str { Box::leak(s.to_string().into_boxed_str()) }).collect()
}

/// host → (path entries as (kind, path, backend), where an unmatched path goes).
type Table = BTreeMap<HostMatch, (Vec<(PathKind, String, String)>, String)>;

fn table(m: &Model) -> Table {
    let backend = |id: &str| m.rules.iter().find(|r| r.id == id).map_or(NOT_FOUND.to_string(), |r| r.backend.clone());
    let default = m.default_rule.as_deref().map_or(NOT_FOUND.to_string(), backend);
    m.hosts
        .iter()
        .map(|t| {
            let paths = t.paths.iter().map(|p| (p.kind, p.path.clone(), backend(&p.rule))).collect();
            let unmatched = if t.unmatched_not_found { NOT_FOUND.to_string() } else { default.clone() };
            (t.host.clone(), (paths, unmatched))
        })
        .collect()
}

#[test]
fn each_attack_is_refused_in_its_own_verdict() {
    let names = all_of(VICTIM, ATTACKS);
    let (model, v, _) = translate_ingress(&case(&names, HostSharing::Namespace, Settings::default()));
    for n in VICTIM {
        assert!(verdict(&v, n).accepted(), "{n}: {v:?}");
    }
    for n in ["a-same", "a-deeper", "a-pt"] {
        let r = refused(&v, n);
        assert_eq!(r, [("spec.rules[0].host".to_string(), Cause::NotAllowed)], "{n}");
    }
    let canary = refused(&v, "a-canary");
    assert_eq!(canary[0], ("spec.rules[0].http.paths[0].path".to_string(), Cause::NotAllowed));
    let alias = refused(&v, "a-alias");
    assert_eq!(
        alias[0],
        ("metadata.annotations[nginx.ingress.kubernetes.io/server-alias]".to_string(), Cause::NotAllowed)
    );
    // Its own hosts: the wildcard, the catch-all (nobody else claims it) and evil.test serve.
    assert!(verdict(&v, "a-wild").accepted() && verdict(&v, "a-default").accepted());
    assert!(verdict(&v, "a-alias").warnings.is_empty());
    // Nothing of the attacker's on the victim's hosts; their unmatched paths answer 404.
    let t = table(&model);
    for h in ["shop.test", "api.test"] {
        let (paths, unmatched) = &t[&HostMatch::Exact(h.into())];
        assert!(paths.iter().all(|(_, _, b)| b.starts_with("victim_")), "{h}: {paths:?}");
        assert_eq!(unmatched, NOT_FOUND, "{h}");
    }
    assert!(model.passthrough.iter().all(|p| p.source.namespace == "victim"), "{:?}", model.passthrough);
    assert_eq!(model.passthrough.len(), 1);
    assert!(model.rules.iter().all(|r| r.canary.is_none()));
}

#[test]
fn a_wildcard_never_takes_a_host_whose_routes_are_all_refused() {
    // The victim's api.test routes a Service port that does not exist: no route of it is
    // accepted, yet api.test keeps a table of its own (404), never the attacker's wildcard.
    let mut i = case(&["v-api", "a-wild", "a-default"], HostSharing::Namespace, Settings::default());
    let ing =
        std::sync::Arc::make_mut(i.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("v-api")).unwrap());
    let rules = ing.spec.as_mut().unwrap().rules.as_mut().unwrap();
    rules[0].http.as_mut().unwrap().paths[0].backend.service.as_mut().unwrap().port.as_mut().unwrap().number = Some(81);
    let (model, v, _) = translate_ingress(&i);
    assert!(!verdict(&v, "v-api").accepted());
    let t = table(&model);
    assert_eq!(t[&HostMatch::Exact("api.test".into())], (vec![], NOT_FOUND.to_string()));
}

#[test]
fn benign_twins_are_served() {
    let (model, v, _) = translate_ingress(&case(
        &["v-shop", "v-shop-more", "v-canary", "v-pt"],
        HostSharing::Namespace,
        Settings::default(),
    ));
    assert!(v.iter().all(|v| v.accepted()), "{v:?}");
    assert_eq!(model.passthrough[0].host, "pt.test");
    assert_eq!(model.rules.iter().filter(|r| r.canary.is_some()).count(), 1);
    let t = table(&model);
    let (paths, _) = &t[&HostMatch::Exact("shop.test".into())];
    assert!(paths.iter().any(|(_, p, b)| p == "/more" && b == "victim_admin_80"), "{paths:?}");
}

#[test]
fn shared_hosts_merge_by_path_but_canaries_and_passthrough_stay_in_their_namespace() {
    let names = all_of(VICTIM, ATTACKS);
    let (model, v, _) = translate_ingress(&case(&names, HostSharing::Shared, Settings::default()));
    // The same path: the oldest Ingress keeps it, as ingress-nginx merges.
    let same = refused(&v, "a-same");
    assert_eq!(same[0], ("spec.rules[0].http.paths[0].path".to_string(), Cause::Conflict));
    // A more specific path and an alias merge: the platform shares its hosts.
    assert!(verdict(&v, "a-deeper").accepted() && verdict(&v, "a-alias").accepted(), "{v:?}");
    let (paths, _) = &table(&model)[&HostMatch::Exact("shop.test".into())];
    assert!(paths.iter().any(|(_, p, b)| p == "/admin/x" && b == "attacker_evil_80"), "{paths:?}");
    // Never a canary on another namespace's route, never another namespace's host passed through.
    assert_eq!(refused(&v, "a-canary")[0].1, Cause::NotAllowed);
    let pt = refused(&v, "a-pt");
    assert_eq!(pt[0], ("spec.rules[0].host".to_string(), Cause::NotAllowed));
    assert!(model.rules.iter().all(|r| r.canary.is_none()));
}

#[test]
fn a_passthrough_host_is_its_namespace_alone_even_when_shared() {
    // The attacker claims the victim's passthrough host with HTTP routes: refused, whatever the sharing.
    let mut i = case(&["v-pt", "a-same"], HostSharing::Shared, Settings::default());
    let ing = std::sync::Arc::make_mut(
        i.ingresses.iter_mut().find(|i| i.metadata.name.as_deref() == Some("a-same")).unwrap(),
    );
    ing.spec.as_mut().unwrap().rules.as_mut().unwrap()[0].host = Some("pt.test".into());
    let (model, v, _) = translate_ingress(&i);
    let r = refused(&v, "a-same");
    assert_eq!(r[0], ("spec.rules[0].host".to_string(), Cause::NotAllowed));
    assert!(model.hosts.is_empty(), "{:?}", model.hosts);
}

/// One generated Ingress: (namespace, age, host, path, Service, has a default backend).
type Gen = (usize, u32, usize, usize, usize, bool);

fn yaml_of(i: usize, (ns, age, host, path, svc, default): Gen) -> String {
    let ns = ["a", "b", "c"][ns];
    let host = ["x.test", "y.test", "\"*.test\"", ""][host];
    let path = ["/", "/p", "/p/q"][path];
    let svc = ["s1", "s2"][svc];
    let host = if host.is_empty() { String::new() } else { format!("host: {host}, ") };
    let default = if default {
        format!("defaultBackend: {{service: {{name: {svc}, port: {{number: 80}}}}}}, ")
    } else {
        String::new()
    };
    format!(
        "  - metadata: {{name: i{i}, namespace: {ns}, creationTimestamp: \"2024-01-01T00:00:{age:02}Z\"}}\n    spec: {{ingressClassName: haptic, {default}rules: [{{{host}http: {{paths: [{{path: {path}, pathType: Prefix, backend: {{service: {{name: {svc}, port: {{number: 80}}}}}}}}]}}}}]}}\n"
    )
}

fn generated(ings: &[Gen], sharing: HostSharing) -> IngressInput {
    let mut y = String::from(if ings.is_empty() { "ingresses: []\n" } else { "ingresses:\n" });
    for (i, g) in ings.iter().enumerate() {
        y.push_str(&yaml_of(i, *g));
    }
    y.push_str("services:\n");
    for ns in ["a", "b", "c"] {
        for s in ["s1", "s2"] {
            y.push_str(&format!("  - metadata: {{name: {s}, namespace: {ns}}}\n    spec: {{ports: [{{port: 80}}]}}\n"));
        }
    }
    let mut i = common::input(&y, Settings::default());
    i.sharing = sharing;
    i
}

fn gen() -> impl Strategy<Value = Gen> {
    (0usize..3, 0u32..5, 0usize..4, 0usize..3, 0usize..2, prop::bool::weighted(0.15))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]

    #[test]
    fn a_host_is_routed_by_one_namespace_and_a_younger_claim_changes_nothing_of_it(
        ings in prop::collection::vec(gen(), 0..8),
        extra in gen(),
    ) {
        let (model, _, _) = translate_ingress(&generated(&ings, HostSharing::Namespace));
        // The owner of each host: the namespace of its oldest Ingress (age, then namespace, then name).
        let hosts = [HostMatch::Exact("x.test".into()), HostMatch::Exact("y.test".into()), HostMatch::Wildcard(".test".into()), HostMatch::Any];
        let owner_of = |ings: &[Gen], h: usize| {
            ings.iter().enumerate().filter(|(_, g)| g.2 == h || (h == 3 && g.5)).map(|(i, g)| (g.1, g.0, format!("i{i}"))).min().map(|o| o.1)
        };
        for t in &model.hosts {
            let h = hosts.iter().position(|x| *x == t.host).unwrap();
            let owner = ["a", "b", "c"][owner_of(&ings, h).unwrap()];
            for p in &t.paths {
                let r = model.rules.iter().find(|r| r.id == p.rule).unwrap();
                prop_assert_eq!(&r.source.namespace, owner, "{:?}", t.host);
            }
        }
        if let Some(d) = model.default_rule.as_deref() {
            let r = model.rules.iter().find(|r| r.id == d).unwrap();
            prop_assert_eq!(r.source.namespace.as_str(), ["a", "b", "c"][owner_of(&ings, 3).unwrap()]);
        }
        // A younger Ingress of a namespace changes nothing on the hosts another namespace owns.
        let mut more = ings.clone();
        more.push((extra.0, 9, extra.2, extra.3, extra.4, extra.5));
        let (after, _, _) = translate_ingress(&generated(&more, HostSharing::Namespace));
        let (before, after) = (table(&model), table(&after));
        for (h, entry) in &before {
            let hi = hosts.iter().position(|x| x == h).unwrap();
            if owner_of(&ings, hi) != Some(extra.0) {
                prop_assert_eq!(after.get(h), Some(entry), "{:?}", h);
            }
        }
    }
}

// Real HAProxy: which backend answers each host and path.

/// The body's first line of `GET path` with `Host: host`, or the status when not 200.
async fn who(addr: std::net::SocketAddr, host: &str, path: &str) -> String {
    let resp = common::raw(addr, &format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")).await;
    match common::status(&resp) {
        200 => resp.split("\r\n\r\n").nth(1).unwrap_or_default().lines().next().unwrap_or_default().to_string(),
        code => code.to_string(),
    }
}

/// Renders `names` (sharing `sharing`), runs it, and checks each (host, path) → answer.
async fn serve(bin: &HaproxyBin, names: &[&str], sharing: HostSharing, expect: &[(&str, &str, &str)]) {
    let http_port = free_port();
    let settings = Settings {
        bind_address: [127, 0, 0, 1].into(),
        http_port,
        https_port: free_port(),
        min_slots: 2,
        ..Settings::default()
    };
    let mut input = case(names, sharing, settings);
    let ports: BTreeMap<&str, u16> = ["web", "admin", "canary", "evil", "tls", "evil-tls"]
        .into_iter()
        .map(|n| (n, common::backend(Box::leak(n.to_string().into_boxed_str()))))
        .collect();
    common::endpoints_on_loopback(&mut input, |svc| ports[svc]);
    let render = haptic_render::render(&input, &Default::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    common::write_tree(&render, dir.path());
    let _h = Haproxy::start(bin, HaproxyOpts::new(dir.path())).await.unwrap();
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], http_port));
    for (host, path, want) in expect {
        assert_eq!(who(addr, host, path).await, *want, "{host}{path} ({sharing:?}, {names:?})");
    }
}

haptic_e2e::on_each_version!(attacks_never_reach_the_victims_hosts);
async fn attacks_never_reach_the_victims_hosts(bin: HaproxyBin) {
    let names = all_of(&["v-shop", "v-api", "v-shop-more"], ATTACKS);
    let expect = [
        ("shop.test", "/", "web"),
        ("shop.test", "/admin/x", "admin"),
        ("shop.test", "/more", "admin"),
        ("api.test", "/v1", "web"),
        // A path the victim does not route: its own 404, never the wildcard, alias or default.
        ("api.test", "/other", "404"),
        // The attacker's own hosts and the catch-all it owns serve it.
        ("other.test", "/", "evil"),
        ("evil.test", "/other", "evil"),
        ("unknown.example", "/", "evil"),
    ];
    serve(&bin, &names, HostSharing::Namespace, &expect).await;
}

haptic_e2e::on_each_version!(benign_twins_and_shared_merging_serve);
async fn benign_twins_and_shared_merging_serve(bin: HaproxyBin) {
    // The victim's own canary at weight 100 takes its route; its second Ingress adds a path.
    let own = [("shop.test", "/", "canary"), ("shop.test", "/more", "admin"), ("shop.test", "/admin", "admin")];
    serve(&bin, &["v-shop", "v-shop-more", "v-canary"], HostSharing::Namespace, &own).await;
    // Shared: a more specific path of another namespace merges; its canary still does not join.
    let shared = [("shop.test", "/", "web"), ("shop.test", "/admin", "admin"), ("shop.test", "/admin/x", "evil")];
    serve(&bin, &["v-shop", "a-same", "a-deeper", "a-canary"], HostSharing::Shared, &shared).await;
}

haptic_e2e::on_each_version!(an_equal_rate_limit_counts_each_namespace_apart);
async fn an_equal_rate_limit_counts_each_namespace_apart(bin: HaproxyBin) {
    // limit-rpm 2 in both namespaces: the attacker's client spends its own two requests, and the
    // victim's host still gives the same client its own two (then refuses the third: the
    // victim's limit holds). All six within a minute.
    let expect = [
        ("evil-limited.test", "/", "evil"),
        ("evil-limited.test", "/", "evil"),
        ("evil-limited.test", "/", "503"),
        ("limited.test", "/", "web"),
        ("limited.test", "/", "web"),
        ("limited.test", "/", "503"),
    ];
    serve(&bin, &["v-limited", "a-limited"], HostSharing::Namespace, &expect).await;
}
