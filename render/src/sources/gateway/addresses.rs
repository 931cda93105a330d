//! A Gateway's `spec.addresses`: which of them its Service is asked to carry, and which the
//! Service does carry, as the Gateway's `status.addresses` and its address conditions.
//!
//! Owns the rule that a Gateway's static address is its Service's address (a ClusterIP or
//! NodePort Service's cluster IP, a LoadBalancer's requested IP). It must never decide that an
//! address is usable by itself: only the Service the API server accepted says so.

use std::net::IpAddr;

use super::api::GatewaySpecAddress;

/// What a Gateway's `spec.addresses` ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Requested {
    /// No address with a value: the Service's own addresses serve.
    Any,
    /// An address of a type the Service cannot carry (the reason).
    Unsupported(String),
    /// IP addresses, in spec order; the Service is asked for the first.
    Ips(Vec<IpAddr>),
}

impl Requested {
    /// The address the Gateway's Service is asked to carry.
    pub(super) fn for_service(&self) -> Option<IpAddr> {
        match self {
            Requested::Ips(ips) => ips.first().copied(),
            _ => None,
        }
    }
}

/// Reads `spec.addresses`: entries without a value ask for nothing (the Service's address is
/// assigned as usual); `IPAddress` entries (the default type) must parse as IP addresses; a
/// `Hostname` or any other type is not something a Service carries.
pub(super) fn requested(addresses: &[GatewaySpecAddress]) -> Requested {
    let mut ips = Vec::new();
    for a in addresses {
        let Some(value) = a.value.as_deref().filter(|v| !v.is_empty()) else { continue };
        let kind = a.type_.as_deref().unwrap_or("IPAddress");
        if kind != "IPAddress" {
            return Requested::Unsupported(format!(
                "address type {kind:?} is not supported: a Gateway's addresses are IP addresses its Service carries"
            ));
        }
        match value.parse::<IpAddr>() {
            Ok(ip) => ips.push(ip),
            Err(_) => return Requested::Unsupported(format!("{value:?} is not an IP address")),
        }
    }
    if ips.is_empty() {
        Requested::Any
    } else {
        Requested::Ips(ips)
    }
}

/// Of the requested IPs, those the Service carries (the Gateway's `status.addresses`) and
/// those it does not (each not usable: a Service carries one requested address, and the API
/// server refuses one outside the cluster's Service range or already taken).
pub(super) fn carried(ips: &[IpAddr], service: &[String]) -> (Vec<String>, Vec<String>) {
    let on_service = |ip: &IpAddr| service.iter().any(|s| s.parse::<IpAddr>().ok() == Some(*ip));
    let (yes, no): (Vec<&IpAddr>, Vec<&IpAddr>) = ips.iter().partition(|ip| on_service(ip));
    (yes.iter().map(|i| i.to_string()).collect(), no.iter().map(|i| i.to_string()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(t: Option<&str>, v: &str) -> GatewaySpecAddress {
        GatewaySpecAddress { type_: t.map(str::to_string), value: Some(v.to_string()) }
    }

    #[test]
    fn empty_values_ask_for_nothing_and_ips_are_kept_in_order() {
        assert_eq!(requested(&[]), Requested::Any);
        assert_eq!(requested(&[addr(None, "")]), Requested::Any);
        let r = requested(&[addr(Some("IPAddress"), "10.96.0.200"), addr(None, "fd00::1")]);
        assert_eq!(r, Requested::Ips(vec!["10.96.0.200".parse().unwrap(), "fd00::1".parse().unwrap()]));
        assert_eq!(r.for_service(), Some("10.96.0.200".parse().unwrap()));
    }

    #[test]
    fn a_hostname_another_type_or_a_bad_ip_is_unsupported() {
        for a in [addr(Some("Hostname"), "gw.example.com"), addr(Some("test/fake"), "x"), addr(None, "10.0.0.300")] {
            let r = requested(&[addr(None, "10.96.0.200"), a]);
            assert!(matches!(r, Requested::Unsupported(_)), "{r:?}");
            assert_eq!(r.for_service(), None);
        }
    }

    #[test]
    fn only_addresses_on_the_service_are_carried() {
        let ips: Vec<IpAddr> = vec!["192.0.2.1".parse().unwrap(), "10.96.0.200".parse().unwrap()];
        let (yes, no) = carried(&ips, &["10.96.0.200".to_string()]);
        assert_eq!((yes, no), (vec!["10.96.0.200".to_string()], vec!["192.0.2.1".to_string()]));
        let (yes, no) = carried(&ips, &[]);
        assert!(yes.is_empty());
        assert_eq!(no.len(), 2);
    }
}
