//! The names the rendered config and its map files share: the map files and the `txn`
//! variables.
//!
//! Owns one table of each: [`MapFile`] (a map's path relative to the config, `maps/….map`) and
//! [`Var`] (a transaction variable, `txn.…`). The map builder writes files by [`MapFile::path`],
//! the view's lines name variables by [`Var`], and the template sees both tables as `maps` and
//! `txn` ([`map_table`], [`var_table`]), so a name is written once. It must never hold a name
//! that comes from an object.

use std::collections::BTreeMap;
use std::fmt;

/// Declares a closed set of names, each with its key in the template's table.
macro_rules! names {
    ($(#[$doc:meta])* $ty:ident, $prefix:literal, $suffix:literal { $($(#[$vdoc:meta])* $v:ident => $key:literal,)* }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $ty {
            $($(#[$vdoc])* $v,)*
        }

        impl $ty {
            /// Every one, in declaration order.
            pub const ALL: &'static [$ty] = &[$($ty::$v,)*];

            /// Its key in the template's table.
            pub const fn key(self) -> &'static str {
                match self {
                    $($ty::$v => $key,)*
                }
            }

            /// The name the config reads.
            pub const fn name(self) -> &'static str {
                match self {
                    $($ty::$v => concat!($prefix, $key, $suffix),)*
                }
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

names! {
    /// A map file the render writes (see the map builder for each one's keys and values).
    MapFile, "maps/", ".map" {
        /// Exact host (Gateway: `host@port`, `@port`) → host id.
        Hosts => "hosts",
        /// `.suffix` of a one-label wildcard → host id.
        Wildcards => "wildcards",
        /// `.suffix@port` of a Gateway hostname wildcard → host id.
        Suffixes => "suffixes",
        /// Bind port → Gateway listener port.
        Ports => "ports",
        /// `host@port` and `@port` → HTTPS listener id.
        Listeners => "listeners",
        /// `.suffix@port` → HTTPS listener id.
        ListenerSuffixes => "listener_suffixes",
        /// `<host id><path>` → rule id.
        PathsExact => "paths_exact",
        /// `<host id><prefix>/` → rule id.
        PathsPrefix => "paths_prefix",
        /// `^<host id>~(?i:<regex>)` → rule id.
        PathsRegex => "paths_regex",
        /// Rule id → backend name.
        Rules => "rules",
        /// Rule id → policy id.
        Policies => "policies",
        /// Policy id → its server timeout in ms, for the policies that set one.
        PolicyTimeouts => "policy_timeouts",
        /// Rule id → rewrite id.
        Rewrites => "rewrites",
        /// Rule id → canary selector id.
        Canaries => "canaries",
        /// Rule id → its canary's backend.
        CanaryBackends => "canary_backends",
        /// Rule id → its main backend.
        MainBackends => "main_backends",
        /// SNI host → `mode tcp` backend.
        Passthrough => "passthrough",
        TlsTerminate => "tls_terminate",
    }
}

names! {
    /// A transaction variable the rendered frontends set and read.
    Var, "txn.", "" {
        /// The request's host, lower case, without a port.
        Host => "host",
        /// The request's path (after normalisation).
        Path => "path",
        /// The Gateway listener port the request arrived on.
        ListenerPort => "lport",
        /// The key a host table is looked up by.
        HostKey => "hkey",
        /// The host table's id.
        HostId => "hostid",
        /// The key the SNI's HTTPS listener is looked up by.
        SniKey => "skey",
        /// The HTTPS listener the SNI selects.
        SniListener => "sl",
        /// The key the Host's HTTPS listener is looked up by.
        HostListenerKey => "lkey",
        /// The HTTPS listener the Host selects.
        HostListener => "hl",
        /// The host id and path, the exact and prefix maps' lookup key.
        PathKey => "pkey",
        /// The rule the request matched.
        Rule => "rule",
        /// The random draw of a split rule.
        Pick => "pick",
        /// The backend the request goes to.
        Backend => "backend",
        /// The rule's canary selector id.
        Canary => "canary",
        /// The rule's policy id.
        Policy => "policy",
        /// The rule's rewrite id.
        Rewrite => "rewrite",
        /// Set when a CORS policy's origin matches.
        Cors => "cors",
        /// The request's Origin header, for a CORS answer.
        Origin => "origin",
        /// The backend an SNI passes TLS through to.
        PassthroughBackend => "pt",
        Terminate => "term",
        /// The port the client used, for `X-Forwarded-Port`: the Host header's, else the scheme's.
        ClientPort => "cport",
        /// The backend a mirrored copy of a request goes to, in the mirror frontend.
        Mirror => "mirror",
    }
}

/// The map files as the template sees them: `maps.<key>` → `maps/<key>.map`.
pub fn map_table() -> BTreeMap<&'static str, &'static str> {
    MapFile::ALL.iter().map(|m| (m.key(), m.name())).collect()
}

/// The variables as the template sees them: `txn.<key>` → `txn.<key>`.
pub fn var_table() -> BTreeMap<&'static str, &'static str> {
    Var::ALL.iter().map(|v| (v.key(), v.name())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_distinct_and_words_haproxy_reads_whole() {
        for (all, prefix) in [(map_table(), "maps/"), (var_table(), "txn.")] {
            let names: std::collections::BTreeSet<&str> = all.values().copied().collect();
            assert_eq!(names.len(), all.len(), "{all:?}");
            for n in names {
                assert!(n.starts_with(prefix), "{n}");
                assert!(n.bytes().all(|b| b.is_ascii_lowercase() || b == b'_' || b == b'.' || b == b'/'), "{n}");
            }
        }
        assert_eq!(MapFile::PathsExact.to_string(), "maps/paths_exact.map");
        assert_eq!(Var::HostId.to_string(), "txn.hostid");
    }
}
