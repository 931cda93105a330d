//! A small, forgiving reader of `haproxy.cfg` text, and of map and ACL files.
//!
//! Owns splitting a config into sections of normalized lines (comments and extra whitespace
//! removed), reading `server` lines, finding which tree files a config references, and parsing
//! map/ACL file contents. It is not a validator (HAProxy's `-c` is) and must never do I/O.

use std::collections::BTreeSet;
use std::net::IpAddr;

use haptic_protocol::RelPath;

/// Keywords that open a section.
pub const SECTION_KEYWORDS: &[&str] = &[
    "global",
    "defaults",
    "frontend",
    "backend",
    "listen",
    "resolvers",
    "peers",
    "userlist",
    "mailers",
    "program",
    "http-errors",
    "ring",
    "cache",
    "log-forward",
    "crt-store",
    "traces",
    "acme",
];

/// One section: its header and its normalized body lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// The section keyword, e.g. `backend`.
    pub kind: String,
    /// The section name, if it has one.
    pub name: Option<String>,
    /// The whole normalized header line.
    pub header: String,
    /// The normalized body lines, each as its tokens.
    pub lines: Vec<Vec<String>>,
}

impl Section {
    /// `kind name` (or just `kind`) for reasons.
    pub fn label(&self) -> String {
        match &self.name {
            Some(n) => format!("{} {n}", self.kind),
            None => self.kind.clone(),
        }
    }

    /// Whether servers in this section are a backend's servers.
    pub fn has_servers(&self) -> bool {
        self.kind == "backend" || self.kind == "listen"
    }
}

/// A parsed config: lines before any section, then the sections in order.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Config {
    /// Normalized lines before the first section header.
    pub preamble: Vec<Vec<String>>,
    /// The sections, in file order.
    pub sections: Vec<Section>,
}

/// Splits one config line into tokens, dropping comments; quotes and escapes are kept verbatim
/// inside their token so meaning is preserved. Returns an empty vector for blank lines.
pub fn tokenize(line: &str) -> Vec<String> {
    if !line.contains(['"', '\'', '\\', '#']) {
        // The common case: nothing quoted, escaped or commented.
        return line.split_whitespace().map(str::to_string).collect();
    }
    tokenize_quoted(line)
}

fn tokenize_quoted(line: &str) -> Vec<String> {
    let mut tokens = Vec::new();
    let mut cur = String::new();
    let mut in_token = false;
    let mut quote: Option<char> = None;
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (_, '\\') => {
                cur.push(c);
                if let Some(n) = chars.next() {
                    cur.push(n);
                }
                in_token = true;
            }
            (Some(q), c) if c == q => {
                cur.push(c);
                quote = None;
            }
            (Some(_), c) => cur.push(c),
            (None, '"' | '\'') => {
                cur.push(c);
                quote = Some(c);
                in_token = true;
            }
            (None, '#') => break,
            (None, c) if c.is_whitespace() => {
                if in_token {
                    tokens.push(std::mem::take(&mut cur));
                    in_token = false;
                }
            }
            (None, c) => {
                cur.push(c);
                in_token = true;
            }
        }
    }
    if in_token {
        tokens.push(cur);
    }
    tokens
}

/// Parses config text into a preamble and sections.
pub fn parse(text: &str) -> Config {
    parse_with_slots(text, |_| {})
}

/// Where one line of config text went in its [`Config`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LineSlot {
    /// A blank or comment-only line.
    Blank,
    /// A line before the first section.
    Preamble,
    /// The header of the section with this index.
    Header(u32),
    /// Body line `line` of section `section`.
    Body {
        /// The section's index.
        section: u32,
        /// The line's index in the section's body.
        line: u32,
    },
}

/// [`parse`], calling `slot` once per line of `text` (in the order of `str::lines`) with where
/// that line went.
pub fn parse_with_slots(text: &str, mut slot: impl FnMut(LineSlot)) -> Config {
    let mut cfg = Config::default();
    for line in text.lines() {
        let tokens = tokenize(line);
        if tokens.is_empty() {
            slot(LineSlot::Blank);
            continue;
        }
        if SECTION_KEYWORDS.contains(&tokens[0].as_str()) {
            slot(LineSlot::Header(cfg.sections.len() as u32));
            cfg.sections.push(Section {
                kind: tokens[0].clone(),
                name: tokens.get(1).cloned(),
                header: tokens.join(" "),
                lines: Vec::new(),
            });
        } else if let Some((i, s)) = cfg.sections.iter_mut().enumerate().next_back() {
            slot(LineSlot::Body { section: i as u32, line: s.lines.len() as u32 });
            s.lines.push(tokens);
        } else {
            slot(LineSlot::Preamble);
            cfg.preamble.push(tokens);
        }
    }
    cfg
}

/// A `server` line, split into the parts the runtime API can change and the rest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerLine {
    /// The server's name.
    pub name: String,
    /// The address token as written.
    pub addr_token: String,
    /// The IP, when the address is an IP literal (with or without port).
    pub ip: Option<IpAddr>,
    /// The port, when written as a plain number.
    pub port: Option<u16>,
    /// The `weight` parameter, if written.
    pub weight: Option<u32>,
    /// Whether the server carries `disabled`.
    pub disabled: bool,
    /// Every other parameter, in order.
    pub rest: Vec<String>,
}

impl ServerLine {
    /// The weight HAProxy uses: the written one or the default 1.
    pub fn effective_weight(&self) -> u32 {
        self.weight.unwrap_or(1)
    }

    /// Whether the server takes new traffic: not `disabled`, and a weight above 0. A `backup`
    /// server counts: it takes traffic when the others are gone.
    pub fn takes_traffic(&self) -> bool {
        !self.disabled && self.effective_weight() > 0
    }

    /// Whether the address is something the runtime API can set (an IP and an optional plain port).
    pub fn addr_is_runtime_settable(&self) -> bool {
        self.ip.is_some()
    }
}

/// Reads a `server` line's tokens; `None` if the line is not a `server` line.
pub fn parse_server(tokens: &[String]) -> Option<ServerLine> {
    if tokens.first().map(String::as_str) != Some("server") || tokens.len() < 3 {
        return None;
    }
    let addr_token = tokens[2].clone();
    let (ip, port) = plain_word(&addr_token).map_or((None, None), parse_addr);
    let mut weight = None;
    let mut disabled = false;
    let mut rest = Vec::new();
    let mut it = tokens[3..].iter();
    while let Some(t) = it.next() {
        match t.as_str() {
            "weight" => match it.next() {
                Some(w) => match w.parse::<u32>() {
                    Ok(n) if weight.is_none() => weight = Some(n),
                    _ => {
                        rest.push(t.clone());
                        rest.push(w.clone());
                    }
                },
                None => rest.push(t.clone()),
            },
            "disabled" => disabled = true,
            "enabled" => disabled = false,
            _ => rest.push(t.clone()),
        }
    }
    Some(ServerLine { name: tokens[1].clone(), addr_token, ip, port, weight, disabled, rest })
}

/// The word HAProxy reads from `token` when the quoting adds nothing but delimiters: the token
/// itself when it has no quote or backslash, the inside of `'…'` (HAProxy takes it verbatim),
/// or of `"…"` without `\` or `$` inside (no escape or variable to expand). `None` otherwise:
/// the caller then treats the word as not understood.
pub fn plain_word(token: &str) -> Option<&str> {
    let special = |t: &str| t.contains(['"', '\'', '\\']);
    if let Some(inner) = token.strip_prefix('\'').and_then(|t| t.strip_suffix('\'')) {
        return (!inner.contains('\'')).then_some(inner);
    }
    if let Some(inner) = token.strip_prefix('"').and_then(|t| t.strip_suffix('"')) {
        return (!special(inner) && !inner.contains('$')).then_some(inner);
    }
    (!special(token)).then_some(token)
}

fn parse_addr(s: &str) -> (Option<IpAddr>, Option<u16>) {
    let s = s.strip_prefix("ipv4@").or_else(|| s.strip_prefix("ipv6@")).unwrap_or(s);
    if let Ok(ip) = s.parse::<IpAddr>() {
        return (Some(ip), None);
    }
    let Some((host, port)) = s.rsplit_once(':') else { return (None, None) };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let plain_port = !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit());
    match (host.parse::<IpAddr>(), port.parse::<u16>()) {
        (Ok(ip), Ok(port)) if plain_port && port != 0 => (Some(ip), Some(port)),
        _ => (None, None),
    }
}

/// A TCP address a `bind` line listens on: an IP (`None` for any address) and a port.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct TcpBind {
    /// The address; `None` for `*`, `::` written as empty or a bare `:port`.
    pub ip: Option<IpAddr>,
    /// The port.
    pub port: u16,
}

/// Every plain TCP address the config's `bind` lines listen on (IPv4/IPv6 literals or any
/// address, single ports and port ranges). Unix sockets, `fd@`, `sockpair@`, QUIC, names and
/// environment variables are skipped: this feeds a best-effort pre-check, not a validator.
pub fn tcp_binds(config: &Config) -> BTreeSet<TcpBind> {
    let mut out = BTreeSet::new();
    for section in config.sections.iter().filter(|s| s.kind == "frontend" || s.kind == "listen" || s.kind == "peers") {
        for line in section.lines.iter().filter(|l| l.first().map(String::as_str) == Some("bind")) {
            let Some(addrs) = line.get(1) else { continue };
            for addr in addrs.split(',') {
                out.extend(parse_bind_addr(addr));
            }
        }
    }
    out
}

fn parse_bind_addr(addr: &str) -> Vec<TcpBind> {
    let addr = addr.strip_prefix("ipv4@").or_else(|| addr.strip_prefix("ipv6@")).or(Some(addr));
    let Some(addr) = addr.filter(|a| !a.contains('@') && !a.starts_with('/') && !a.contains('$')) else {
        return Vec::new();
    };
    let Some((host, ports)) = addr.rsplit_once(':') else { return Vec::new() };
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let ip = match host {
        "" | "*" | "::" | "0.0.0.0" => None,
        h => match h.parse::<IpAddr>() {
            Ok(ip) => Some(ip),
            Err(_) => return Vec::new(),
        },
    };
    let (lo, hi) = ports.split_once('-').unwrap_or((ports, ports));
    match (lo.parse::<u16>(), hi.parse::<u16>()) {
        (Ok(lo), Ok(hi)) if lo > 0 && lo <= hi && hi - lo < 1024 => {
            (lo..=hi).map(|port| TcpBind { ip, port }).collect()
        }
        _ => Vec::new(),
    }
}

/// The TCP binds of `new` on ports that `old` does not listen on at all: the ones a reload must
/// newly acquire. A port the running config already holds is left out, since HAProxy passes its
/// own listeners to the new worker.
pub fn new_tcp_binds(old: &Config, new: &Config) -> Vec<TcpBind> {
    let held: BTreeSet<u16> = tcp_binds(old).into_iter().map(|b| b.port).collect();
    tcp_binds(new).into_iter().filter(|b| !held.contains(&b.port)).collect()
}

/// Returns which of `candidates` the config text references (by relative path, or through a
/// referenced parent directory such as `crt certs/`).
pub fn referenced_paths<'a>(cfg_text: &str, candidates: impl IntoIterator<Item = &'a RelPath>) -> BTreeSet<RelPath> {
    let mut out = BTreeSet::new();
    for p in candidates {
        if p.is_haproxy_cfg() {
            continue;
        }
        let s = p.as_str();
        let mut refs = contains_token(cfg_text, s);
        let mut dir = s;
        while !refs {
            let Some((parent, _)) = dir.rsplit_once('/') else { break };
            refs = contains_token(cfg_text, parent) || contains_token(cfg_text, &format!("{parent}/"));
            dir = parent;
        }
        if refs {
            out.insert(p.clone());
        }
    }
    out
}

fn contains_token(text: &str, needle: &str) -> bool {
    let before_ok = |c: Option<char>| c.is_none_or(|c| c.is_whitespace() || "(,\"'@=".contains(c));
    let after_ok = |c: Option<char>| c.is_none_or(|c| c.is_whitespace() || "),\"'".contains(c));
    text.match_indices(needle)
        .any(|(i, _)| before_ok(text[..i].chars().next_back()) && after_ok(text[i + needle.len()..].chars().next()))
}

/// Parses a map file into `(key, value)` entries the way HAProxy loads it: blank lines and
/// `#` comment lines skipped, the key is the first word, the value the rest of the line.
pub fn parse_map_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(|c: char| c.is_whitespace()) {
            Some((k, v)) => (k.to_string(), v.trim().to_string()),
            None => (l.to_string(), String::new()),
        })
        .collect()
}

/// Parses an ACL pattern file: one pattern a line, blank and `#` lines skipped.
pub fn parse_acl_file(text: &str) -> Vec<String> {
    text.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_server_address_is_the_same_address() {
        let line = |a: &str| parse_server(&tokenize(&format!("server s1 {a} weight 5"))).unwrap();
        for quoted in ["'10.0.0.1:8080'", "\"10.0.0.1:8080\"", "10.0.0.1:8080"] {
            let s = line(quoted);
            assert_eq!((s.ip, s.port), (Some("10.0.0.1".parse().unwrap()), Some(8080)), "{quoted}");
            assert!(s.addr_is_runtime_settable());
        }
        for unclear in ["\"$ADDR:80\"", "\"10.0.0.1\\:80\"", "'10.0.0.1':80", "10.0.0.1\\:80"] {
            assert!(!line(unclear).addr_is_runtime_settable(), "{unclear}");
        }
        assert_eq!(plain_word("'a b'"), Some("a b"));
        assert_eq!(plain_word("'it''s'"), None);
    }

    #[test]
    fn tokenizer_drops_comments_keeps_quotes() {
        assert_eq!(tokenize("  bind  :80   # web"), vec!["bind", ":80"]);
        assert_eq!(
            tokenize("http-request return string \"a # b\""),
            vec!["http-request", "return", "string", "\"a # b\""]
        );
        assert_eq!(tokenize("acl x path_beg /a\\ b"), vec!["acl", "x", "path_beg", "/a\\ b"]);
        assert!(tokenize("   # only a comment").is_empty());
    }

    proptest::proptest! {
        #[test]
        fn fast_path_agrees_with_the_full_tokenizer(line in "[a-z0-9 \t:.#\"'\\\\-]{0,40}") {
            proptest::prop_assert_eq!(tokenize(&line), tokenize_quoted(&line));
        }
    }

    #[test]
    fn sections_and_servers() {
        let cfg = parse("global\n  daemon\n\nbackend be_app\n  balance roundrobin\n  server s1 10.0.0.1:8080 weight 5 disabled check\n");
        assert_eq!(cfg.sections.len(), 2);
        let be = &cfg.sections[1];
        assert_eq!(be.label(), "backend be_app");
        let s = parse_server(&be.lines[1]).unwrap();
        assert_eq!(s.name, "s1");
        assert_eq!(s.ip, Some("10.0.0.1".parse().unwrap()));
        assert_eq!(s.port, Some(8080));
        assert_eq!(s.weight, Some(5));
        assert!(s.disabled);
        assert_eq!(s.rest, vec!["check"]);
        let h = parse_server(&tokenize("server s2 app.example:80")).unwrap();
        assert!(!h.addr_is_runtime_settable());
    }

    #[test]
    fn references() {
        let files: Vec<RelPath> =
            ["maps/hosts.map", "maps/unused.map", "certs/a.pem", "errors/503.http", "haproxy.cfg"]
                .iter()
                .map(|p| RelPath::new(*p).unwrap())
                .collect();
        let cfg = "frontend f\n use_backend %[req.hdr(host),map(maps/hosts.map,be_x)]\n bind :443 ssl crt certs/\n";
        let got: Vec<String> = referenced_paths(cfg, &files).into_iter().map(|p| p.to_string()).collect();
        assert_eq!(got, vec!["certs/a.pem", "maps/hosts.map"]);
    }

    #[test]
    fn bind_addresses() {
        let old = parse("frontend a\n  bind :80\n  bind 127.0.0.1:8443 ssl crt certs/\n");
        let new = parse(
            "frontend a\n  bind :80,127.0.0.2:81\n  bind [::1]:9000-9001\n  bind unix@/run/x.sock\n  bind ipv4@*:8443\n  bind \"${PORT}\"\nlisten l\n  bind 10.0.0.1:82\n",
        );
        let ip = |s: &str| Some(s.parse::<IpAddr>().unwrap());
        let got = new_tcp_binds(&old, &new);
        assert_eq!(
            got,
            vec![
                TcpBind { ip: ip("10.0.0.1"), port: 82 },
                TcpBind { ip: ip("127.0.0.2"), port: 81 },
                TcpBind { ip: ip("::1"), port: 9000 },
                TcpBind { ip: ip("::1"), port: 9001 },
            ]
        );
        assert!(tcp_binds(&new).contains(&TcpBind { ip: None, port: 8443 }));
    }

    #[test]
    fn map_and_acl_files() {
        assert_eq!(
            parse_map_file("# c\n\na.example be_a\nb.example   be b \n"),
            vec![("a.example".into(), "be_a".into()), ("b.example".into(), "be b".into())]
        );
        assert_eq!(parse_acl_file("10.0.0.0/8\n\n# x\n 192.168.0.1 \n"), vec!["10.0.0.0/8", "192.168.0.1"]);
    }
}
