//! Pure generators of the benchmark's inputs: `haproxy.cfg` texts of any size, map files, and
//! the desired file sets (digests, plan ids, apply requests) built from them. It must never do
//! I/O or talk to a process.

use std::collections::BTreeMap;

use haptic_protocol::{ApplyRequest, Digest, Fence, FileEntry, Mode, Op, Part, PlanId, RelPath};

/// The shape of a generated `haproxy.cfg`.
#[derive(Debug, Clone)]
pub struct CfgModel {
    /// The frontend's port on 127.0.0.1.
    pub http_port: u16,
    /// How many backends (`be_0` … ).
    pub backends: usize,
    /// Servers per backend (`s0` … ).
    pub servers: usize,
    /// The `description cfggen=<gen>` marker: changing it needs a reload and is visible in
    /// `show info`.
    pub gen: u64,
    /// The default server address.
    pub server_addr: (String, u16),
    /// Per-server address overrides `(backend, server) -> (ip, port)`.
    pub overrides: BTreeMap<(usize, usize), (String, u16)>,
    /// A map file the frontend loads (`map(<path>,none)`), if any.
    pub map: Option<String>,
    /// Whether the frontend forwards to `be_0` (traffic cases) instead of answering itself.
    pub proxy_to_be0: bool,
    /// Bind the frontend to `127.0.0.1:${VAR}` (each pod's HAProxy gets its own port from its
    /// environment, so one render serves a whole local fleet) instead of `http_port`.
    pub port_env: Option<String>,
}

impl CfgModel {
    /// A config with `backends × servers` servers all pointing at `127.0.0.1:9`.
    pub fn new(http_port: u16, backends: usize, servers: usize) -> Self {
        Self {
            http_port,
            backends,
            servers,
            gen: 0,
            server_addr: ("127.0.0.1".into(), 9),
            overrides: BTreeMap::new(),
            map: None,
            proxy_to_be0: false,
            port_env: None,
        }
    }

    /// The address of server `s` of backend `b`.
    pub fn addr_of(&self, b: usize, s: usize) -> (String, u16) {
        self.overrides.get(&(b, s)).cloned().unwrap_or_else(|| self.server_addr.clone())
    }

    /// Renders the config text.
    pub fn render(&self) -> String {
        let mut out = String::with_capacity(64 + self.backends * (40 + self.servers * 48));
        out.push_str(&format!(
            "global\n    default-path config\n    description cfggen={}\n    stats timeout 30s\n\n\
             defaults\n    mode http\n    timeout connect 5s\n    timeout client 10s\n    timeout server 10s\n\n\
             frontend fe_main\n    bind {}\n",
            self.gen,
            match &self.port_env {
                Some(var) => format!("\"127.0.0.1:${{{var}}}\""),
                None => format!("127.0.0.1:{}", self.http_port),
            }
        ));
        if let Some(m) = &self.map {
            out.push_str(&format!("    http-request set-header x-route %[req.hdr(host),lower,map({m},none)]\n"));
        }
        if self.proxy_to_be0 {
            out.push_str("    default_backend be_0\n");
        } else {
            out.push_str("    http-request return status 200 content-type text/plain string \"hello\"\n");
        }
        for b in 0..self.backends {
            out.push_str(&format!("\nbackend be_{b}\n    balance roundrobin\n"));
            for s in 0..self.servers {
                let (ip, port) = self.addr_of(b, s);
                out.push_str(&format!("    server s{s} {ip}:{port} weight 100\n"));
            }
        }
        out
    }
}

/// A map file of `n` entries `host<i>.example <value prefix><i % 97>`.
pub fn map_text(n: usize, value_prefix: &str) -> String {
    let mut s = String::with_capacity(n * 32);
    for i in 0..n {
        s.push_str(&format!("host{i}.example {value_prefix}{}\n", i % 97));
    }
    s
}

/// A map file of about `bytes` bytes (for large-tree cases); `salt` makes its content unique.
pub fn filler_map(bytes: usize, salt: &str) -> String {
    let mut s = String::with_capacity(bytes + 64);
    let mut i = 0usize;
    while s.len() < bytes {
        s.push_str(&format!("k{salt}-{i:08}.example.org backend_{salt}_{:04}\n", i % 1000));
        i += 1;
    }
    s
}

/// Groups `key value` lines into payloads of at most `limit` bytes (the agent's chunking).
pub fn map_chunks(entries: &[(String, String)], limit: usize) -> Vec<String> {
    let mut chunks = Vec::new();
    let mut cur = String::new();
    for (k, v) in entries {
        let line = format!("{k} {v}\n");
        if !cur.is_empty() && cur.len() + line.len() > limit {
            chunks.push(std::mem::take(&mut cur));
        }
        cur.push_str(&line);
    }
    if !cur.is_empty() {
        chunks.push(cur);
    }
    chunks
}

/// A desired file set with cached digests.
#[derive(Debug, Clone, Default)]
pub struct Desired {
    files: BTreeMap<RelPath, (FileEntry, Vec<u8>)>,
}

/// Parses a path the bench itself generates.
pub fn rel(p: &str) -> RelPath {
    RelPath::new(p).unwrap_or_else(|e| panic!("bench generated a bad path {p:?}: {e}"))
}

impl Desired {
    /// An empty set.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets (adds or replaces) one file.
    pub fn set(&mut self, path: &str, bytes: impl Into<Vec<u8>>) {
        let bytes = bytes.into();
        let path = rel(path);
        let entry = FileEntry { path: path.clone(), digest: Digest::of(&bytes), size: bytes.len() as u64 };
        self.files.insert(path, (entry, bytes));
    }

    /// The bytes of one file.
    pub fn get(&self, path: &str) -> Option<&[u8]> {
        self.files.get(&rel(path)).map(|(_, b)| b.as_slice())
    }

    /// The manifest.
    pub fn manifest(&self) -> Vec<FileEntry> {
        self.files.values().map(|(e, _)| e.clone()).collect()
    }

    /// The plan id.
    pub fn plan(&self) -> PlanId {
        haptic_protocol::plan_id(&self.manifest()).expect("the bench's desired sets always hold haproxy.cfg")
    }

    /// Total bytes of every file.
    pub fn total_bytes(&self) -> u64 {
        self.files.values().map(|(e, _)| e.size).sum()
    }

    /// The largest file's size.
    pub fn largest(&self) -> u64 {
        self.files.values().map(|(e, _)| e.size).max().unwrap_or(0)
    }

    /// An apply request sending the files `send` selects (haproxy.cfg is always sent).
    pub fn request(
        &self,
        fence: Fence,
        baseline: Option<PlanId>,
        mode: Mode,
        send: impl Fn(&str) -> bool,
        batches: Vec<Vec<Op>>,
    ) -> ApplyRequest {
        let parts = self
            .files
            .iter()
            .filter(|(p, _)| p.is_haproxy_cfg() || send(p.as_str()))
            .map(|(p, (_, b))| (p.clone(), Part::from_bytes(b)))
            .collect();
        ApplyRequest {
            fence,
            baseline,
            plan_id: self.plan(),
            mode,
            reasons: vec!["bench".into()],
            files: self.manifest(),
            parts,
            batches,
            blob: serde_json::Value::Null,
        }
    }
}

/// Hands out strictly increasing fences of one holder.
#[derive(Debug)]
pub struct Fencer {
    epoch: u64,
    seq: std::sync::atomic::AtomicU64,
}

impl Fencer {
    /// Epoch `epoch` of holder `bench`, starting at seq 1.
    pub fn new(epoch: u64) -> Self {
        Self { epoch, seq: std::sync::atomic::AtomicU64::new(0) }
    }

    /// The next fence.
    pub fn next(&self) -> Fence {
        let seq = self.seq.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        Fence { epoch: self.epoch, seq, holder: "bench".into() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use haptic_haproxy::claim::diff_cfg;

    #[test]
    fn one_override_is_one_runtime_server_change() {
        let mut m = CfgModel::new(8080, 20, 10);
        let old = m.render();
        m.overrides.insert((3, 7), ("127.0.0.2".into(), 8081));
        let d = diff_cfg(&old, &m.render());
        assert!(d.runtime_eligible(), "{:?}", d.reload_reasons);
        assert_eq!(d.servers.len(), 1);
        assert_eq!((d.servers[0].backend.as_str(), d.servers[0].server.as_str()), ("be_3", "s7"));
        m.gen += 1;
        assert!(!diff_cfg(&old, &m.render()).runtime_eligible());
        m.port_env = Some("PORT".into());
        assert!(m.render().contains("bind \"127.0.0.1:${PORT}\"\n"));
    }

    #[test]
    fn maps_and_chunks() {
        let t = map_text(1000, "v");
        assert_eq!(t.lines().count(), 1000);
        let entries = haptic_haproxy::cfg::parse_map_file(&t);
        assert_eq!(entries.len(), 1000);
        let chunks = map_chunks(&entries, 1024);
        assert!(chunks.iter().all(|c| c.len() <= 1024 && !c.contains("\n\n")));
        assert_eq!(chunks.concat(), t);
        assert!(filler_map(10_000, "a").len() >= 10_000);
    }

    #[test]
    fn requests_carry_the_plan_and_chosen_parts() {
        let mut d = Desired::new();
        d.set("haproxy.cfg", CfgModel::new(1, 1, 1).render());
        d.set("maps/a.map", "k v\n");
        d.set("maps/b.map", "k w\n");
        let f = Fencer::new(1);
        let r = d.request(f.next(), None, Mode::FileOnly, |p| p == "maps/a.map", vec![]);
        assert_eq!(r.plan_id, d.plan());
        assert_eq!(r.parts.len(), 2);
        assert!(r.check().is_ok());
        assert!(f.next().seq > r.fence.seq);
        assert_eq!(d.largest(), d.get("haproxy.cfg").unwrap().len() as u64);
    }
}
