//! What the sources share: host and path parsing, a Service port's endpoints, TLS Secrets.
//!
//! Owns the checks every source applies the same way: a host is a DNS name (or `*.` and one),
//! a path fits a map line (and a regex path passes `haptic_haproxy::regex::check`), endpoints
//! come from EndpointSlices only (ready, or serving and terminating as draining), a TLS Secret
//! is parsed and re-encoded by [`crate::pem`]. It must never hold a source's semantics (which
//! objects are served, how they attach): those stay in the source's own module.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::net::{IpAddr, SocketAddr};

use haptic_haproxy::quote;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::model::{Cause, HostMatch, ObjectRef, Origin, PathKind, Why};
use crate::slots::Endpoint;

/// The label linking an EndpointSlice to its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The reference of the object `meta` describes, of `kind`.
pub(crate) fn obj(kind: &str, meta: &ObjectMeta) -> ObjectRef {
    ObjectRef {
        kind: kind.to_string(),
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
    }
}

/// A validated host.
pub(crate) fn parse_host(h: &str) -> Result<HostMatch, String> {
    let h = h.to_ascii_lowercase();
    let (wild, rest) = match h.strip_prefix("*.") {
        Some(rest) => (true, rest),
        None => (false, h.as_str()),
    };
    let label_ok =
        |l: &str| !l.is_empty() && l.len() <= 63 && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    if rest.is_empty() || rest.len() > 253 || !rest.split('.').all(label_ok) {
        return Err(format!("{h:?} is not a DNS name (or `*.` and one)"));
    }
    Ok(if wild { HostMatch::Wildcard(format!(".{rest}")) } else { HostMatch::Exact(rest.to_string()) })
}

/// Hex digits of SHA-256 an id keeps: 64 bits, so no object can be written to collide with
/// another namespace's id (that takes a second preimage of SHA-256 cut to 64 bits).
pub(crate) const STABLE_ID_HEX: usize = 16;
// Whole bytes of the digest are hex-encoded.
const _: () = assert!(STABLE_ID_HEX.is_multiple_of(2));

/// A stable short id from parts: `prefix`, then [`STABLE_ID_HEX`] hex digits of SHA-256 over the
/// parts (each ended by a 0xff byte, which no UTF-8 text holds). It depends on the parts alone,
/// so objects coming and going never move another's id: a runtime map change, applied one map
/// file after another, can never send one object's requests through another's entries between
/// two files.
pub(crate) fn stable_id(prefix: &str, parts: &[&str]) -> String {
    let mut h = haptic_protocol::Hasher::new();
    for p in parts {
        h.update(p.as_bytes());
        h.update(&[0xff]);
    }
    let mut hex = [0u8; STABLE_ID_HEX];
    let digest = h.finish();
    hex::encode_to_slice(&digest.as_bytes()[..STABLE_ID_HEX / 2], &mut hex)
        .expect("the digits are twice the bytes encoded");
    let mut id = String::with_capacity(prefix.len() + STABLE_ID_HEX + 1);
    id.push_str(prefix);
    id.extend(hex.iter().map(|&b| char::from(b)));
    id
}

/// [`stable_id`], told apart from the ids already `taken` by a counter after the digits (two
/// contents of one id are never seen in practice; the counter keeps the maps right if they are).
/// `taken` is only asked whether it holds an id, so it is a hash set (a render asks it once per
/// rule).
pub(crate) fn unique_id(prefix: &str, parts: &[&str], taken: &HashSet<String>) -> String {
    let base = stable_id(prefix, parts);
    if !taken.contains(&base) {
        return base;
    }
    (1u32..).map(|n| format!("{base}{n}")).find(|id| !taken.contains(id)).unwrap_or(base)
}

/// The longest id [`unique_id`] gives in practice (`prefix`, the digits, a one-digit counter).
pub(crate) fn longest_id(prefix: &str) -> String {
    format!("{prefix}{}9", "f".repeat(STABLE_ID_HEX))
}

/// Each distinct item of `items` and its id: `prefix` and the [`unique_id`] of the item's derived
/// `Debug` text (which shows every field), so an id stands for one content whatever else this
/// render holds.
pub(crate) fn content_ids<T: Ord + std::fmt::Debug>(
    prefix: &str,
    items: impl Iterator<Item = T>,
) -> BTreeMap<T, String> {
    let mut taken = HashSet::new();
    let distinct: BTreeSet<T> = items.collect();
    distinct
        .into_iter()
        .map(|item| {
            let id = unique_id(prefix, &[&format!("{item:?}")], &taken);
            taken.insert(id.clone());
            (item, id)
        })
        .collect()
}

/// A validated, normalised path.
pub(crate) fn parse_path(kind: PathKind, p: Option<&str>) -> Result<String, String> {
    let p = p.unwrap_or("/");
    if !p.starts_with('/') {
        return Err(format!("{p:?} does not start with '/'"));
    }
    // The longest key and value a path makes (a prefix path's key, under the longest host id
    // and rule id) must fit a map line.
    static LONGEST: std::sync::LazyLock<(String, String)> =
        std::sync::LazyLock::new(|| (longest_id("h"), longest_id("r")));
    let (hid, id) = (&LONGEST.0, &LONGEST.1);
    // The path starts with `/`, so the characters of the key are what can be refused in it.
    if let Err(e) = quote::map_key(p).and_then(|_| quote::map_line_fits(hid.len() + p.len() + 1, id.len())) {
        return Err(format!("{:?} cannot be a map key: {e}", p.chars().take(64).collect::<String>()));
    }
    if kind == PathKind::Regex {
        if let Err(e) = haptic_haproxy::regex::check(p) {
            return Err(format!(
                "{:?} is not an accepted regular expression: {e}",
                p.chars().take(64).collect::<String>()
            ));
        }
    }
    Ok(match kind {
        PathKind::Prefix if p.len() > 1 => p.trim_end_matches('/').to_string().max("/".to_string()),
        _ => p.to_string(),
    })
}

/// The endpoints of one Service port from its EndpointSlices (`slices`, the Service's own):
/// ready ones, and serving terminating ones as draining. `port_name` is the Service port's name
/// (`""` when unnamed).
pub(crate) fn endpoints(slices: &[&EndpointSlice], port_name: &str) -> Vec<Endpoint> {
    let mut out = BTreeMap::new();
    for s in slices {
        if !matches!(s.address_type.as_str(), "IPv4" | "IPv6") {
            continue;
        }
        let Some(port) = s
            .ports
            .as_deref()
            .unwrap_or_default()
            .iter()
            .find(|p| p.name.as_deref().unwrap_or("") == port_name)
            .and_then(|p| p.port)
            .and_then(|p| u16::try_from(p).ok())
        else {
            continue;
        };
        for e in &s.endpoints {
            let c = e.conditions.clone().unwrap_or_default();
            // An unset `ready` means ready; `serving` defaults to `ready`.
            let ready = c.ready.unwrap_or(true) && !c.terminating.unwrap_or(false);
            let draining = !ready && c.serving.unwrap_or(false) && c.terminating.unwrap_or(false);
            if !ready && !draining {
                continue;
            }
            for a in &e.addresses {
                if let Ok(ip) = a.parse::<IpAddr>() {
                    let addr = SocketAddr::new(ip, port);
                    let d: &mut bool = out.entry(addr).or_insert(draining);
                    *d = *d && draining;
                }
            }
        }
    }
    out.into_iter().map(|(addr, draining)| Endpoint { addr, draining }).collect()
}

/// The certificate file (chain, then key, parsed, checked and re-encoded by [`crate::pem`]) of
/// the `kubernetes.io/tls` Secret `ns/name` among `secrets`, or why not.
pub(crate) fn secret_pem<S: std::borrow::Borrow<Secret>>(
    secrets: &[S],
    ns: &str,
    name: &str,
) -> Result<crate::pem::CertFile, Why> {
    let Some(s) = secrets
        .iter()
        .map(std::borrow::Borrow::borrow)
        .find(|s: &&Secret| s.metadata.namespace.as_deref() == Some(ns) && s.metadata.name.as_deref() == Some(name))
    else {
        return Err(Why::new(Cause::Missing, format!("Secret {ns}/{name} does not exist")));
    };
    let data = s.data.clone().unwrap_or_default();
    let get = |k: &str| {
        data.get(k).map(|b| b.0.as_slice()).ok_or_else(|| Why::invalid(format!("Secret {ns}/{name} has no {k}")))
    };
    crate::pem::certified(get("tls.crt")?, get("tls.key")?)
        .map_err(|e| Why::invalid(format!("Secret {ns}/{name}: {e}")))
}

/// CORS origins (an Ingress's comma-separated `cors-allow-origin`, a CORS filter's
/// `allowOrigins`): each `*`, or `scheme://host[:port]` where the host may start with `*.` (one or
/// more labels, as ingress-nginx and the Gateway API match it).
pub(crate) fn origins<'a>(list: impl IntoIterator<Item = &'a str>) -> Result<Vec<Origin>, String> {
    let mut out = Vec::new();
    for o in list {
        if o == "*" {
            out.push(Origin::Any);
            continue;
        }
        let err = || format!("{o:?} is not `*` or an origin (http(s)://host[:port], the host may start with `*.`)");
        let (scheme, rest) = o.split_once("://").ok_or_else(err)?;
        if !matches!(scheme, "http" | "https") {
            return Err(err());
        }
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) if !p.is_empty() && p.len() <= 5 && p.bytes().all(|b| b.is_ascii_digit()) => (h, Some(p)),
            _ => (rest, None),
        };
        let port = port.map(|p| format!(":{p}")).unwrap_or_default();
        match parse_host(host).map_err(|_| err())? {
            crate::model::HostMatch::Exact(h) => out.push(Origin::Exact(format!("{scheme}://{h}{port}"))),
            crate::model::HostMatch::Wildcard(suffix) => {
                let lit = |s: &str| haptic_haproxy::quote::regex_literal(s).map_err(|_| err());
                out.push(Origin::Pattern(format!("^{}://[^/]+{}{}$", lit(scheme)?, lit(&suffix)?, lit(&port)?)));
            }
            crate::model::HostMatch::Suffix(_) | crate::model::HostMatch::Any => return Err(err()),
        }
    }
    if out.is_empty() {
        return Err("no origin given".into());
    }
    out.sort();
    out.dedup();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_haproxy::quote::{push_map_line, MAX_MAP_LINE};

    /// The longest path whose prefix line (`<longest host id><path>/ <longest rule id>`) fits.
    fn longest_path() -> String {
        let room = MAX_MAP_LINE - 2 - longest_id("h").len() - 1 - longest_id("r").len();
        format!("/{}", "a".repeat(room - 1))
    }

    #[test]
    fn a_path_is_accepted_exactly_when_its_longest_map_line_fits() {
        let p = longest_path();
        assert_eq!(parse_path(PathKind::Prefix, Some(&p)).as_deref(), Ok(p.as_str()));
        let mut line = String::new();
        push_map_line(&mut line, &format!("{}{p}/", longest_id("h")), &longest_id("r")).unwrap();
        assert_eq!(line.len(), MAX_MAP_LINE);
        for kind in [PathKind::Exact, PathKind::Prefix] {
            assert!(parse_path(kind, Some(&format!("{p}a"))).is_err());
        }
    }

    #[test]
    fn a_path_that_cannot_be_a_map_key_is_refused() {
        for bad in ["/a b", "/a\tb", "/a\u{b}b", "/a\nb", "/a\0b", "relative"] {
            assert!(parse_path(PathKind::Exact, Some(bad)).is_err(), "{bad:?}");
        }
        for good in ["/", "/#frag-like", "/a%20b", "/ü"] {
            assert!(parse_path(PathKind::Exact, Some(good)).is_ok(), "{good:?}");
        }
    }

    #[test]
    fn stable_ids_are_the_prefix_and_sixteen_hex_digits_and_unique_ids_step_aside() {
        let id = stable_id("r", &["=a.example", "/x", "Prefix"]);
        // Ids live on in running HAProxy's maps: they never change from one version to the next.
        assert_eq!(id, "r644debd019aa5c9f");
        assert!(id[1..].bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase()), "{id}");
        assert_ne!(id, stable_id("r", &["=a.example/x", "Prefix"]), "parts are delimited");
        let taken: HashSet<String> = [id.clone(), format!("{id}1")].into();
        assert_eq!(unique_id("r", &["=a.example", "/x", "Prefix"], &taken), format!("{id}2"));
        assert_eq!(unique_id("r", &["=a.example", "/x", "Prefix"], &HashSet::new()), id);
    }
}
