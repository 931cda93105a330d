//! Runtime-API op kinds carried in `/v1/apply` batches.
//!
//! Owns the op vocabulary (`server.set`, `server.add`, `server.del`, `map.replace`, `map.load`,
//! `acl.replace`, `cert.set`, `cafile.set`), its JSON form and the checks every decoded op passes (names a CLI
//! line can carry, IP literals, ports). Later kinds extend it without breaking old peers: an
//! unknown kind decodes to [`Op::Unknown`], which an agent refuses cleanly. It must never run an
//! op.

use std::fmt;
use std::net::{IpAddr, SocketAddr};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::path::RelPath;

/// The kind of an op, as named on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum OpKind {
    /// `server.set`: a server's address, port, weight or state.
    ServerSet,
    /// `server.add`: a new server in an existing backend.
    ServerAdd,
    /// `server.del`: a server taken out of its backend.
    ServerDel,
    /// `map.replace`: atomically replace a map file's entries.
    MapReplace,
    /// `map.load`: atomically replace a map's entries with those of its file in the new tree
    /// (API 1.1: the entries travel once, as the file).
    MapLoad,
    /// `acl.replace`: atomically replace an ACL file's patterns.
    AclReplace,
    /// `cert.set`: replace a loaded certificate from the tree.
    CertSet,
    /// `backend.add`: a new backend, created from a named `defaults` section with its servers,
    /// then published (API 1.2; HAProxy 3.4).
    BackendAdd,
    /// `cafile.set`: replace a loaded CA file (`ca-file`) from the tree (API 1.3).
    CaFileSet,
}

impl OpKind {
    /// Every kind this protocol version knows.
    pub const ALL: [OpKind; 9] = [
        OpKind::ServerSet,
        OpKind::ServerAdd,
        OpKind::ServerDel,
        OpKind::MapReplace,
        OpKind::MapLoad,
        OpKind::AclReplace,
        OpKind::CertSet,
        OpKind::BackendAdd,
        OpKind::CaFileSet,
    ];

    /// The wire name, e.g. `server.set`.
    pub fn as_str(self) -> &'static str {
        match self {
            OpKind::ServerSet => "server.set",
            OpKind::ServerAdd => "server.add",
            OpKind::ServerDel => "server.del",
            OpKind::MapReplace => "map.replace",
            OpKind::MapLoad => "map.load",
            OpKind::AclReplace => "acl.replace",
            OpKind::CertSet => "cert.set",
            OpKind::BackendAdd => "backend.add",
            OpKind::CaFileSet => "cafile.set",
        }
    }

    /// Looks a wire name up; `None` for kinds this version does not know.
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

impl fmt::Display for OpKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The administrative state a `server.set` puts a server in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ServerState {
    /// Takes traffic.
    Ready,
    /// Takes no new sessions except persistent ones.
    Drain,
    /// In maintenance: takes no traffic.
    Maint,
}

impl ServerState {
    /// The word HAProxy's `set server … state` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            ServerState::Ready => "ready",
            ServerState::Drain => "drain",
            ServerState::Maint => "maint",
        }
    }
}

/// `server.set`: changes one server of a backend; absent fields stay as they are.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSet {
    /// The backend's name.
    pub backend: String,
    /// The server's name.
    pub server: String,
    /// The new IP address.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub addr: Option<String>,
    /// The new port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<u16>,
    /// The new weight (0–256).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// The new administrative state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ServerState>,
}

/// Whether `name` can name a backend or a server on a CLI line: non-empty, at most
/// [`MAX_NAME_LEN`] bytes of ASCII letters, digits, `_`, `-`, `.` and `:`.
pub fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_NAME_LEN
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | ':'))
}

/// The longest backend or server name an op may carry.
pub const MAX_NAME_LEN: usize = 128;

/// The largest weight HAProxy takes.
pub const MAX_WEIGHT: u32 = 256;

fn check_names(backend: &str, server: &str) -> Result<(), String> {
    for (what, name) in [("backend", backend), ("server", server)] {
        if !valid_name(name) {
            return Err(format!(
                "{what} name {name:?} is not 1-{MAX_NAME_LEN} ASCII letters, digits, '_', '-', '.' or ':'"
            ));
        }
    }
    Ok(())
}

/// `server.add`: a new server in an existing backend, as its `server` line in the new config
/// says. The server is registered with its address, weight and parameters, its health checks are
/// turned on when it has `check`, and it takes traffic unless `state` is `maint` (the config's
/// `disabled`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerAdd {
    /// The backend's name.
    pub backend: String,
    /// The new server's name.
    pub server: String,
    /// Its IP address.
    pub addr: IpAddr,
    /// Its port (not 0).
    pub port: u16,
    /// Its weight (0–256), when the config writes one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight: Option<u32>,
    /// `ready` (takes traffic) or `maint` (the config says `disabled`); never `drain`.
    pub state: ServerState,
    /// The `server` line's other parameters, as config tokens in order (e.g. `["check", "inter",
    /// "2s"]`). Which ones an agent sends to HAProxy is HAProxy knowledge (`haptic-haproxy`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub params: Vec<String>,
}

impl ServerAdd {
    /// The address and port.
    pub fn socket_addr(&self) -> SocketAddr {
        SocketAddr::new(self.addr, self.port)
    }

    /// Checks what the wire form cannot: names, port, weight, state and parameter tokens.
    pub fn validate(&self) -> Result<(), String> {
        check_names(&self.backend, &self.server)?;
        if self.port == 0 {
            return Err("port 0 is not a server port".into());
        }
        if let Some(w) = self.weight.filter(|w| *w > MAX_WEIGHT) {
            return Err(format!("weight {w} is over {MAX_WEIGHT}"));
        }
        if self.state == ServerState::Drain {
            return Err("state drain cannot be written in a config; a new server is ready or maint".into());
        }
        for (i, p) in self.params.iter().enumerate() {
            let ok = !p.is_empty()
                && p.len() <= MAX_NAME_LEN
                && p.chars().all(|c| c.is_ascii_graphic() && !matches!(c, ';' | '#' | '\\' | '"' | '\''));
            if !ok {
                return Err(format!("parameter {i} ({p:?}) is not a plain config token"));
            }
        }
        Ok(())
    }
}

/// `server.del`: takes a server out of its backend (into maintenance, then deleted once no
/// connection uses it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerDel {
    /// The backend's name.
    pub backend: String,
    /// The server's name.
    pub server: String,
}

impl ServerDel {
    /// Checks the names.
    pub fn validate(&self) -> Result<(), String> {
        check_names(&self.backend, &self.server)
    }
}

/// `backend.add`: a backend the new config gains, as its section says: created from the named
/// `defaults` section it follows, given its servers (each as a `server.add`), then published so
/// rules can route to it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendAdd {
    /// The backend's name.
    pub backend: String,
    /// The named `defaults` section it is created from.
    pub defaults: String,
    /// Its servers, in config order; each names this backend.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub servers: Vec<ServerAdd>,
}

impl BackendAdd {
    /// Checks the names and every server (which must name this backend).
    pub fn validate(&self) -> Result<(), String> {
        for (what, name) in [("backend", &self.backend), ("defaults", &self.defaults)] {
            if !valid_name(name) {
                return Err(format!(
                    "{what} name {name:?} is not 1-{MAX_NAME_LEN} ASCII letters, digits, '_', '-', '.' or ':'"
                ));
            }
        }
        for s in &self.servers {
            if s.backend != self.backend {
                return Err(format!("server {} names backend {:?}, not {:?}", s.server, s.backend, self.backend));
            }
            s.validate()?;
        }
        Ok(())
    }
}

/// One runtime-API operation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Change one server.
    ServerSet(ServerSet),
    /// Add one server to a backend.
    ServerAdd(ServerAdd),
    /// Delete one server from its backend.
    ServerDel(ServerDel),
    /// Replace a map's entries with exactly `entries` (key, value).
    MapReplace {
        /// The map file's path in the tree.
        path: RelPath,
        /// The complete new entries.
        entries: Vec<(String, String)>,
    },
    /// Replace a map's entries with exactly those of the map file at `path` in the new tree.
    MapLoad {
        /// The map file's path in the tree.
        path: RelPath,
    },
    /// Replace an ACL file's patterns with exactly `patterns`.
    AclReplace {
        /// The ACL file's path in the tree.
        path: RelPath,
        /// The complete new patterns.
        patterns: Vec<String>,
    },
    /// Replace a loaded certificate with the PEM now at `path` in the tree.
    CertSet {
        /// The certificate file's path in the tree.
        path: RelPath,
    },
    /// Create and publish a backend with its servers.
    BackendAdd(BackendAdd),
    /// Replace a loaded CA file with the certificates now at `path` in the tree.
    CaFileSet {
        /// The CA file's path in the tree.
        path: RelPath,
    },
    /// A kind this version does not know; kept so it can be refused by name.
    Unknown {
        /// The kind's wire name.
        op: String,
        /// The whole op as received.
        raw: serde_json::Value,
    },
}

impl Op {
    /// The known kind, or `None` for [`Op::Unknown`].
    pub fn kind(&self) -> Option<OpKind> {
        match self {
            Op::ServerSet(_) => Some(OpKind::ServerSet),
            Op::ServerAdd(_) => Some(OpKind::ServerAdd),
            Op::ServerDel(_) => Some(OpKind::ServerDel),
            Op::MapReplace { .. } => Some(OpKind::MapReplace),
            Op::MapLoad { .. } => Some(OpKind::MapLoad),
            Op::AclReplace { .. } => Some(OpKind::AclReplace),
            Op::CertSet { .. } => Some(OpKind::CertSet),
            Op::BackendAdd(_) => Some(OpKind::BackendAdd),
            Op::CaFileSet { .. } => Some(OpKind::CaFileSet),
            Op::Unknown { .. } => None,
        }
    }

    /// The wire name of the kind, known or not.
    pub fn kind_name(&self) -> &str {
        match self {
            Op::Unknown { op, .. } => op,
            other => other.kind().map(OpKind::as_str).unwrap_or("?"),
        }
    }

    /// The tree file this op covers, for file-backed kinds.
    pub fn path(&self) -> Option<&RelPath> {
        match self {
            Op::MapReplace { path, .. }
            | Op::MapLoad { path }
            | Op::AclReplace { path, .. }
            | Op::CertSet { path }
            | Op::CaFileSet { path } => Some(path),
            _ => None,
        }
    }

    /// A short human description for reasons and logs.
    pub fn describe(&self) -> String {
        match self {
            Op::ServerSet(s) => format!("server.set {}/{}", s.backend, s.server),
            Op::ServerAdd(s) => format!("server.add {}/{} {}", s.backend, s.server, s.socket_addr()),
            Op::ServerDel(s) => format!("server.del {}/{}", s.backend, s.server),
            Op::MapReplace { path, entries } => format!("map.replace {path} ({} entries)", entries.len()),
            Op::MapLoad { path } => format!("map.load {path}"),
            Op::AclReplace { path, patterns } => format!("acl.replace {path} ({} patterns)", patterns.len()),
            Op::CertSet { path } => format!("cert.set {path}"),
            Op::CaFileSet { path } => format!("cafile.set {path}"),
            Op::BackendAdd(b) => format!("backend.add {} ({} servers)", b.backend, b.servers.len()),
            Op::Unknown { op, .. } => format!("unknown op {op:?}"),
        }
    }
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct MapReplaceWire {
    path: RelPath,
    entries: Vec<(String, String)>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct AclReplaceWire {
    path: RelPath,
    patterns: Vec<String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PathWire {
    path: RelPath,
}

fn with_tag<T: Serialize>(kind: &str, body: &T) -> Result<serde_json::Value, serde_json::Error> {
    let mut v = serde_json::to_value(body)?;
    if let serde_json::Value::Object(m) = &mut v {
        let mut out = serde_json::Map::new();
        out.insert("op".into(), serde_json::Value::String(kind.into()));
        out.append(m);
        return Ok(serde_json::Value::Object(out));
    }
    Ok(v)
}

impl Serialize for Op {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::Error;
        let v = match self {
            Op::ServerSet(x) => with_tag("server.set", x),
            Op::ServerAdd(x) => with_tag("server.add", x),
            Op::ServerDel(x) => with_tag("server.del", x),
            Op::MapReplace { path, entries } => {
                with_tag("map.replace", &MapReplaceWire { path: path.clone(), entries: entries.clone() })
            }
            Op::AclReplace { path, patterns } => {
                with_tag("acl.replace", &AclReplaceWire { path: path.clone(), patterns: patterns.clone() })
            }
            Op::MapLoad { path } => with_tag("map.load", &PathWire { path: path.clone() }),
            Op::CertSet { path } => with_tag("cert.set", &PathWire { path: path.clone() }),
            Op::CaFileSet { path } => with_tag("cafile.set", &PathWire { path: path.clone() }),
            Op::BackendAdd(x) => with_tag("backend.add", x),
            Op::Unknown { raw, .. } => Ok(raw.clone()),
        }
        .map_err(S::Error::custom)?;
        v.serialize(s)
    }
}

impl<'de> Deserialize<'de> for Op {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = serde_json::Value::deserialize(d)?;
        let serde_json::Value::Object(mut m) = raw.clone() else {
            return Err(D::Error::custom("an op must be a JSON object"));
        };
        let Some(serde_json::Value::String(kind)) = m.remove("op") else {
            return Err(D::Error::custom("an op needs a string field \"op\""));
        };
        let body = serde_json::Value::Object(m);
        let err = |e: serde_json::Error| D::Error::custom(format!("op {kind}: {e}"));
        Ok(match kind.as_str() {
            "server.set" => Op::ServerSet(serde_json::from_value(body).map_err(err)?),
            "server.add" => {
                let a: ServerAdd = serde_json::from_value(body).map_err(err)?;
                a.validate().map_err(|e| D::Error::custom(format!("op {kind}: {e}")))?;
                Op::ServerAdd(a)
            }
            "server.del" => {
                let d: ServerDel = serde_json::from_value(body).map_err(err)?;
                d.validate().map_err(|e| D::Error::custom(format!("op {kind}: {e}")))?;
                Op::ServerDel(d)
            }
            "map.replace" => {
                let w: MapReplaceWire = serde_json::from_value(body).map_err(err)?;
                Op::MapReplace { path: w.path, entries: w.entries }
            }
            "acl.replace" => {
                let w: AclReplaceWire = serde_json::from_value(body).map_err(err)?;
                Op::AclReplace { path: w.path, patterns: w.patterns }
            }
            "map.load" => {
                let w: PathWire = serde_json::from_value(body).map_err(err)?;
                Op::MapLoad { path: w.path }
            }
            "cert.set" => {
                let w: PathWire = serde_json::from_value(body).map_err(err)?;
                Op::CertSet { path: w.path }
            }
            "cafile.set" => {
                let w: PathWire = serde_json::from_value(body).map_err(err)?;
                Op::CaFileSet { path: w.path }
            }
            "backend.add" => {
                let b: BackendAdd = serde_json::from_value(body).map_err(err)?;
                b.validate().map_err(|e| D::Error::custom(format!("op {kind}: {e}")))?;
                Op::BackendAdd(b)
            }
            _ => Op::Unknown { op: kind, raw },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_kind_decodes_and_round_trips() {
        let j = r#"{"op":"frontend.add","name":"fe_x"}"#;
        let op: Op = serde_json::from_str(j).unwrap();
        assert_eq!(op.kind(), None);
        assert_eq!(op.kind_name(), "frontend.add");
        let back: serde_json::Value = serde_json::to_value(&op).unwrap();
        assert_eq!(back, serde_json::from_str::<serde_json::Value>(j).unwrap());
    }

    #[test]
    fn known_kind_with_bad_fields_is_an_error() {
        assert!(serde_json::from_str::<Op>(r#"{"op":"server.set","backend":"b"}"#).is_err());
        assert!(serde_json::from_str::<Op>(r#"{"op":"map.replace","path":"../x","entries":[]}"#).is_err());
        assert!(serde_json::from_str::<Op>(r#"{"op":"map.load","path":"maps/a.map","entries":[]}"#).is_err());
        assert!(serde_json::from_str::<Op>(r#"{"op":"server.set","backend":"b","server":"s","bogus":1}"#).is_err());
    }

    #[test]
    fn map_load_names_the_file_only() {
        let j = r#"{"op":"map.load","path":"maps/hosts.map"}"#;
        let op: Op = serde_json::from_str(j).unwrap();
        assert_eq!(op, Op::MapLoad { path: RelPath::new("maps/hosts.map").unwrap() });
        assert_eq!((op.kind(), op.describe()), (Some(OpKind::MapLoad), "map.load maps/hosts.map".into()));
        assert_eq!(serde_json::to_value(&op).unwrap(), serde_json::from_str::<serde_json::Value>(j).unwrap());
    }

    #[test]
    fn server_add_and_del_round_trip() {
        let j = r#"{"op":"server.add","backend":"be_app","server":"SRV_3","addr":"10.0.0.3","port":8080,"weight":10,"state":"ready","params":["check","inter","2s"]}"#;
        let op: Op = serde_json::from_str(j).unwrap();
        assert_eq!(op.kind(), Some(OpKind::ServerAdd));
        assert_eq!(op.describe(), "server.add be_app/SRV_3 10.0.0.3:8080");
        assert_eq!(serde_json::to_value(&op).unwrap(), serde_json::from_str::<serde_json::Value>(j).unwrap());
        let v6 = r#"{"op":"server.add","backend":"b","server":"s","addr":"::1","port":80,"state":"maint"}"#;
        let Op::ServerAdd(a) = serde_json::from_str::<Op>(v6).unwrap() else { panic!() };
        assert_eq!((a.socket_addr().to_string(), a.weight, a.params.len()), ("[::1]:80".into(), None, 0));
        let d: Op = serde_json::from_str(r#"{"op":"server.del","backend":"be_app","server":"SRV_1"}"#).unwrap();
        assert_eq!((d.kind_name(), d.describe()), ("server.del", "server.del be_app/SRV_1".into()));
    }

    #[test]
    fn backend_add_round_trips_and_refuses_a_stranger_server() {
        let j = r#"{"op":"backend.add","backend":"be_new","defaults":"haptic","servers":[{"backend":"be_new","server":"SRV_1","addr":"10.0.0.3","port":8080,"state":"ready"},{"backend":"be_new","server":"SRV_2","addr":"127.0.0.1","port":1,"state":"maint"}]}"#;
        let op: Op = serde_json::from_str(j).unwrap();
        assert_eq!((op.kind(), op.describe()), (Some(OpKind::BackendAdd), "backend.add be_new (2 servers)".into()));
        assert_eq!(serde_json::to_value(&op).unwrap(), serde_json::from_str::<serde_json::Value>(j).unwrap());
        let stranger =
            j.replacen(r#""backend":"be_new","server":"SRV_2""#, r#""backend":"be_other","server":"SRV_2""#, 1);
        let e = serde_json::from_str::<Op>(&stranger).unwrap_err().to_string();
        assert!(e.contains("names backend \"be_other\""), "{e}");
        let e = serde_json::from_str::<Op>(&j.replace(r#""defaults":"haptic""#, r#""defaults":"a b""#)).unwrap_err();
        assert!(e.to_string().contains("defaults name \"a b\""), "{e}");
    }

    #[test]
    fn bad_server_add_and_del_say_what_is_wrong() {
        let add = |extra: &str| {
            format!(r#"{{"op":"server.add","backend":"b","server":"s","port":80,"state":"ready",{extra}}}"#)
        };
        for (body, want) in [
            (add(r#""addr":"app.local""#), "invalid IP address"),
            (add(r#""addr":"10.0.0.1:80""#), "invalid IP address"),
            (add(r#""addr":"10.0.0.1","weight":300"#), "weight 300 is over 256"),
            (add(r#""addr":"10.0.0.1","params":["a b"]"#), "not a plain config token"),
            (add(r#""addr":"10.0.0.1","params":["x;y"]"#), "not a plain config token"),
            (add(r#""addr":"10.0.0.1","bogus":1"#), "unknown field"),
            (add(r#""addr":"10.0.0.1""#).replace(r#""state":"ready""#, r#""state":"drain""#), "state drain"),
            (add(r#""addr":"10.0.0.1""#).replace(r#""port":80"#, r#""port":0"#), "port 0"),
            (add(r#""addr":"10.0.0.1""#).replace(r#""server":"s""#, r#""server":"a/b""#), "server name \"a/b\""),
            (r#"{"op":"server.del","backend":"be x","server":"s"}"#.into(), "backend name \"be x\""),
            (r#"{"op":"server.del","backend":"b"}"#.into(), "missing field `server`"),
        ] {
            let e = serde_json::from_str::<Op>(&body).unwrap_err().to_string();
            assert!(e.contains(want), "{body}: {e}");
        }
        assert!(valid_name("a.b-c:d_9") && !valid_name("") && !valid_name(&"a".repeat(MAX_NAME_LEN + 1)));
    }
}
