//! The edge: what every request meets at the fleet's door before it is routed, whatever source
//! its route comes from: the access log, the `X-Forwarded-*` headers, PROXY protocol on the
//! binds, timeouts, HSTS, the stats and Prometheus exporter frontend, and how long a stopping
//! worker may drain its connections.
//!
//! Owns these settings, their defaults (ingress-nginx's where it has one) and the config lines
//! they make. It must never look at a route or a cluster object: its values are the operator's
//! (the HAProxyConfig), never a tenant's, and every line is written from typed values.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::names::Var;

/// The edge settings of a render.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Edge {
    /// The access log on HAProxy's standard output.
    pub access_log: AccessLog,
    /// The `X-Forwarded-*` headers the backends get.
    pub forwarded: Forwarded,
    /// Every client-facing bind expects the PROXY protocol (a load balancer in front speaks it).
    pub proxy_protocol: bool,
    /// Timeouts, in seconds.
    pub timeouts: Timeouts,
    /// `Strict-Transport-Security` on every response over TLS; none when unset.
    pub hsts: Option<Hsts>,
    /// A frontend at this address serving HAProxy's Prometheus exporter on `/metrics` and its
    /// stats page on `/stats`; none when unset.
    pub stats: Option<std::net::SocketAddr>,
    /// The certificate served first on the Ingresses' TLS bind: to a client whose SNI names no
    /// tenant's certificate (or that sends none), and for an Ingress TLS entry without
    /// `secretName`. (A Gateway listener serves its own certificates.)
    pub default_certificate: Option<DefaultCertificate>,
    /// How long a stopping worker (after a reload, or when its pod stops) may keep serving the
    /// connections it has before HAProxy closes them (`hard-stop-after`), in seconds; unbounded
    /// when unset.
    pub drain_seconds: Option<u32>,
}

impl Default for Edge {
    fn default() -> Self {
        Edge {
            access_log: AccessLog::Http,
            forwarded: Forwarded::default(),
            proxy_protocol: false,
            timeouts: Timeouts::default(),
            hsts: None,
            stats: None,
            default_certificate: None,
            drain_seconds: None,
        }
    }
}

/// The default certificate: a chain and its key, checked and re-encoded
/// ([`crate::pem::certified`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefaultCertificate {
    /// The PEM file (chain, then key).
    #[serde(skip)]
    pub pem: Vec<u8>,
    /// Its earliest notAfter, in seconds since the Unix epoch.
    pub not_after: i64,
}

/// Where the default certificate is written, relative to `haproxy.cfg` (a tenant's is
/// `certs/<namespace>_<name>.pem`, never this name).
pub const DEFAULT_CERTIFICATE_PATH: &str = "certs/default.pem";

/// The access log's format.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum AccessLog {
    /// No access log.
    Off,
    /// HAProxy's HTTP log format (`option httplog`).
    #[default]
    Http,
    /// One JSON object per request.
    Json,
}

/// The `X-Forwarded-For`, `-Proto`, `-Host` and `-Port` headers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Forwarded {
    /// Whether the headers are set at all.
    pub enabled: bool,
    /// Clients whose own `X-Forwarded-*` headers are kept (the client address is appended to
    /// their `X-Forwarded-For`); any other client's are replaced, so no client can pass for
    /// another address or scheme.
    pub trusted: Vec<IpNet>,
}

impl Default for Forwarded {
    fn default() -> Self {
        Forwarded { enabled: true, trusted: Vec::new() }
    }
}

/// Timeouts, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Timeouts {
    /// To connect to a server.
    pub connect: u32,
    /// Of a client that sends nothing.
    pub client: u32,
    /// Of a server that answers nothing.
    pub server: u32,
    /// Of an idle tunnel (websockets, `CONNECT`).
    pub tunnel: u32,
    /// For a client to send a whole request's headers.
    pub http_request: u32,
}

impl Default for Timeouts {
    /// ingress-nginx's: 60 s to the client and the server, 5 s to connect; an hour for tunnels.
    fn default() -> Self {
        Timeouts { connect: 5, client: 60, server: 60, tunnel: 3600, http_request: 10 }
    }
}

/// `Strict-Transport-Security`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Hsts {
    /// `max-age`, in seconds.
    pub max_age: u32,
    /// `includeSubDomains`.
    pub include_subdomains: bool,
    /// `preload`.
    pub preload: bool,
}

/// The JSON access log line: every string value through HAProxy's JSON escaping (`json`
/// converter) or a number; the host is the one routing used (lower case, without port).
const JSON_LOG: &str = concat!(
    r#"{"time":"%tr","client":"%ci","client_port":%cp,"frontend":"%f","backend":"%b","server":"%s","#,
    r#""method":"%[capture.req.method,json(utf8s)]","host":"%[var(txn.host),json(utf8s)]","#,
    r#""path":"%[capture.req.uri,json(utf8s)]","status":%ST,"bytes":%B,"duration_ms":%Ta,"#,
    r#""termination":"%ts","retries":%rc}"#
);

impl Edge {
    /// Lines for the `global` section.
    pub fn global_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.access_log != AccessLog::Off {
            out.push("log stdout format raw local0".to_string());
        }
        if let Some(s) = self.drain_seconds {
            out.push(format!("hard-stop-after {s}s"));
        }
        out
    }

    /// Lines for the `defaults` section.
    pub fn defaults_lines(&self) -> Vec<String> {
        let mut out = self.tcp_backend_defaults_lines();
        out.push(format!("timeout http-request {}s", self.timeouts.http_request));
        match self.access_log {
            AccessLog::Off => {}
            AccessLog::Http => out.extend(["log global".to_string(), "option httplog".to_string()]),
            AccessLog::Json => {
                out.push("log global".to_string());
                out.push(format!("log-format {}", single_quoted(JSON_LOG)));
            }
        }
        out
    }

    /// Lines for the `defaults` of `mode tcp` backends: the connect, client, server and tunnel
    /// timeouts, without `timeout http-request` and the HTTP log.
    pub fn tcp_backend_defaults_lines(&self) -> Vec<String> {
        let t = &self.timeouts;
        vec![
            format!("timeout connect {}s", t.connect),
            format!("timeout client {}s", t.client),
            format!("timeout server {}s", t.server),
            format!("timeout tunnel {}s", t.tunnel),
        ]
    }

    /// Lines for every HTTP frontend, before its routing: the forwarded headers and HSTS.
    pub fn frontend_lines(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.forwarded.enabled {
            // `unless T H`: unless the client is trusted and sent the header itself.
            let trusted = self.trusted_condition();
            let keep = |header: &str| match &trusted {
                Some(t) => format!(" unless {t} {{ req.hdr({header}) -m found }}"),
                None => String::new(),
            };
            match &trusted {
                Some(t) => out.push(format!("http-request del-header X-Forwarded-For unless {t}")),
                None => out.push("http-request del-header X-Forwarded-For".to_string()),
            }
            out.push("option forwardfor".to_string());
            out.push(format!(
                "http-request set-header X-Forwarded-Proto %[ssl_fc,iif(https,http)]{}",
                keep("x-forwarded-proto")
            ));
            out.push(format!("http-request set-header X-Forwarded-Host %[req.hdr(host)]{}", keep("x-forwarded-host")));
            out.extend(self.client_port_lines());
            out.push(format!(
                "http-request set-header X-Forwarded-Port %[var({})]{}",
                Var::ClientPort,
                keep("x-forwarded-port")
            ));
        }
        if let Some(h) = self.hsts {
            let mut value = format!("max-age={}", h.max_age);
            if h.include_subdomains {
                value.push_str("; includeSubDomains");
            }
            if h.preload {
                value.push_str("; preload");
            }
            out.push(format!(
                "http-response set-header Strict-Transport-Security {} if {{ ssl_fc }}",
                single_quoted(&value)
            ));
        }
        out
    }

    /// The lines that set [`Var::ClientPort`], the port the client used. With the PROXY protocol
    /// that is the destination port the load balancer saw. Without it HAProxy's own port is the
    /// container's (8080 behind a Service port 80), so the port is the Host header's, else the
    /// scheme's default (a client names a port other than its scheme's in Host).
    fn client_port_lines(&self) -> Vec<String> {
        let v = Var::ClientPort;
        if self.proxy_protocol {
            return vec![format!("http-request set-var({v}) dst_port")];
        }
        vec![
            format!("http-request set-var({v}) req.hdr(host),port_only"),
            format!(
                "http-request set-var({v}) ssl_fc,iif(443,80) if !{{ var({v}) -m found }} || {{ var({v}) -m int 0 }}"
            ),
        ]
    }

    /// What every client-facing bind gets after its address: ` accept-proxy` with the PROXY
    /// protocol, else nothing.
    pub fn bind_words(&self) -> &'static str {
        if self.proxy_protocol {
            " accept-proxy"
        } else {
            ""
        }
    }

    /// The trusted clients as an anonymous ACL (`{ src A B }`), none when there are none.
    fn trusted_condition(&self) -> Option<String> {
        let t = &self.forwarded.trusted;
        (!t.is_empty()).then(|| {
            let nets: Vec<String> = t.iter().map(ToString::to_string).collect();
            format!("{{ src {} }}", nets.join(" "))
        })
    }
}

/// `s` in single quotes, where HAProxy interprets nothing. Only for the constant texts of this
/// module, which hold no single quote.
fn single_quoted(s: &str) -> String {
    debug_assert!(!s.contains('\''));
    format!("'{s}'")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_ingress_nginx_timeouts_and_an_http_log() {
        let e = Edge::default();
        let d = e.defaults_lines();
        assert_eq!(&d[..3], ["timeout connect 5s", "timeout client 60s", "timeout server 60s"]);
        assert_eq!(d[3], "timeout tunnel 3600s");
        assert_eq!(d[5..], ["log global".to_string(), "option httplog".to_string()]);
        assert_eq!(e.global_lines(), ["log stdout format raw local0"]);
        assert_eq!(e.bind_words(), "");
    }

    #[test]
    fn no_log_no_log_lines() {
        let e = Edge { access_log: AccessLog::Off, drain_seconds: Some(60), ..Edge::default() };
        assert_eq!(e.global_lines(), ["hard-stop-after 60s"]);
        assert_eq!(e.defaults_lines().len(), 5);
    }

    #[test]
    fn untrusted_clients_lose_their_forwarded_for() {
        let e = Edge::default();
        let f = e.frontend_lines();
        assert_eq!(f[0], "http-request del-header X-Forwarded-For");
        assert_eq!(f[2], "http-request set-header X-Forwarded-Proto %[ssl_fc,iif(https,http)]");
        let t = Edge {
            forwarded: Forwarded { enabled: true, trusted: vec!["10.0.0.0/8".parse().unwrap()] },
            ..Edge::default()
        };
        let f = t.frontend_lines();
        assert_eq!(f[0], "http-request del-header X-Forwarded-For unless { src 10.0.0.0/8 }");
        assert_eq!(
            f[2],
            "http-request set-header X-Forwarded-Proto %[ssl_fc,iif(https,http)] unless { src 10.0.0.0/8 } { req.hdr(x-forwarded-proto) -m found }"
        );
        let off = Edge { forwarded: Forwarded { enabled: false, trusted: vec![] }, ..Edge::default() };
        assert!(off.frontend_lines().is_empty());
    }

    #[test]
    fn hsts_on_tls_responses_only() {
        let e = Edge { hsts: Some(Hsts { max_age: 100, include_subdomains: true, preload: false }), ..Edge::default() };
        assert_eq!(
            e.frontend_lines().last().unwrap(),
            "http-response set-header Strict-Transport-Security 'max-age=100; includeSubDomains' if { ssl_fc }"
        );
    }
}
