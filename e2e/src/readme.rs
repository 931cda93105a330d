//! The README's walk-throughs as data. Owns reading `README.md`'s fenced blocks, splitting a
//! `console` block into the commands it runs and the output it shows, and deciding whether a
//! command's real output is the one shown (words that differ from run to run, such as addresses,
//! ages and pod names, match their kind; a differing address is remembered so that later commands
//! use the real one). It must never run anything: `e2e/tests/readme_cluster.rs` runs the steps.
//!
//! Hand-written: a README is a handful of fenced blocks; a Markdown parser crate would give the
//! same blocks with more to learn.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::LazyLock;

use regex::Regex;

/// One fenced block: its info string (`console`, `sh`, `yaml`), its text, and the prose between
/// the previous block and this one (where a YAML block's file name is given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    pub lang: String,
    pub body: String,
    pub lead: String,
}

/// Every fenced block of a Markdown text, in order.
pub fn blocks(md: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lead = String::new();
    let mut open: Option<(String, String)> = None;
    for line in md.lines() {
        match (&mut open, line.strip_prefix("```")) {
            (None, Some(info)) => open = Some((info.trim().to_string(), String::new())),
            (Some(_), Some(rest)) if rest.trim().is_empty() => {
                let (lang, body) = open.take().unwrap_or_default();
                out.push(Block { lang, body, lead: std::mem::take(&mut lead) });
            }
            (Some((_, body)), _) => {
                body.push_str(line);
                body.push('\n');
            }
            (None, None) => {
                lead.push_str(line);
                lead.push('\n');
            }
        }
    }
    out
}

/// The file a YAML block is saved as: the last `` `NAME.yaml` `` in the prose before it.
pub fn yaml_name(b: &Block) -> Option<String> {
    static NAME: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"`([A-Za-z0-9_.-]+\.ya?ml)`").unwrap());
    NAME.captures_iter(&b.lead).last().map(|c| c[1].to_string())
}

/// One command of a `console` block (`$ ` lines; a line ending in `\` continues; a line that is
/// only a comment is no output) or of an `sh` block (every line that is not a comment), with the
/// output the README shows under it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The command without its trailing comment or `&`, continuations joined.
    pub command: String,
    /// Ended in `&`: runs in the background while the later steps run.
    pub background: bool,
    /// The lines shown under it (empty when none are).
    pub shown: Vec<String>,
}

/// The steps of a `console` or `sh` block.
pub fn steps(b: &Block) -> Vec<Step> {
    let console = b.lang == "console";
    let mut out: Vec<Step> = Vec::new();
    let mut pending: Option<String> = None;
    for line in b.body.lines() {
        if let Some(head) = pending.take() {
            push_command(&mut out, &mut pending, format!("{head} {}", line.trim()));
            continue;
        }
        match line.strip_prefix("$ ") {
            Some(cmd) => push_command(&mut out, &mut pending, cmd.to_string()),
            None if !console && !line.trim().is_empty() && !line.trim_start().starts_with('#') => {
                push_command(&mut out, &mut pending, line.to_string());
            }
            None if console && !line.trim().is_empty() && !line.trim_start().starts_with('#') => {
                if let Some(last) = out.last_mut() {
                    last.shown.push(line.to_string());
                }
            }
            None => {}
        }
    }
    out
}

fn push_command(out: &mut Vec<Step>, pending: &mut Option<String>, line: String) {
    let text = strip_comment(&line);
    let text = text.trim_end();
    if let Some(head) = text.strip_suffix('\\') {
        *pending = Some(head.trim_end().to_string());
        return;
    }
    let (command, background) = match text.strip_suffix('&') {
        Some(c) if !c.ends_with('&') => (c.trim_end().to_string(), true),
        _ => (text.to_string(), false),
    };
    out.push(Step { command, background, shown: Vec::new() });
}

/// A shell line without its comment: from the first `#` that starts a word outside quotes.
pub fn strip_comment(line: &str) -> String {
    let mut quote: Option<char> = None;
    let mut prev = ' ';
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '#' && prev.is_whitespace() => return line[..i].trim_end().to_string(),
            None => {}
        }
        prev = c;
    }
    line.to_string()
}

/// Why a command's real output is not the one shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Mismatch {
    #[error("{actual} line(s) of output where the README shows {shown}")]
    Lines { shown: usize, actual: usize },
    #[error("line {line}: {actual:?} where the README shows {shown:?}")]
    Line { line: usize, shown: String, actual: String },
}

/// Whether `actual` is the output `shown`: the same lines, each with the same words, where a word
/// may differ only as an address, an age, a pod's generated suffix or a generated hex id does.
/// Returns each shown address with the real one, for [`substitute`].
pub fn matches(shown: &[String], actual: &str) -> Result<BTreeMap<String, String>, Mismatch> {
    let real: Vec<&str> = actual.lines().filter(|l| !l.trim().is_empty()).collect();
    if real.len() != shown.len() {
        return Err(Mismatch::Lines { shown: shown.len(), actual: real.len() });
    }
    let mut seen = BTreeMap::new();
    for (i, (s, a)) in shown.iter().zip(&real).enumerate() {
        let bad = || Mismatch::Line { line: i + 1, shown: s.clone(), actual: a.to_string() };
        let (sw, aw): (Vec<&str>, Vec<&str>) = (s.split_whitespace().collect(), a.split_whitespace().collect());
        if sw.len() != aw.len() {
            return Err(bad());
        }
        for (x, y) in sw.iter().zip(&aw) {
            match alike(x, y) {
                Some(Alike::Address) => {
                    seen.insert(x.to_string(), y.to_string());
                }
                Some(Alike::Same | Alike::Volatile) => {}
                None => return Err(bad()),
            }
        }
    }
    Ok(seen)
}

enum Alike {
    Same,
    Address,
    Volatile,
}

fn alike(shown: &str, real: &str) -> Option<Alike> {
    static AGE: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[0-9]+[smhd]([0-9]+[smh])?$").unwrap());
    static POD: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^(.+)-[a-z0-9]{5,10}-[a-z0-9]{5}$").unwrap());
    static HEX: LazyLock<Regex> = LazyLock::new(|| Regex::new(r"^[0-9a-f]{8,}$").unwrap());
    if shown == real {
        return Some(Alike::Same);
    }
    if shown.parse::<Ipv4Addr>().is_ok() && real.parse::<Ipv4Addr>().is_ok() {
        return Some(Alike::Address);
    }
    let prefix = |s: &str| POD.captures(s).map(|c| c[1].to_string());
    let volatile = (AGE.is_match(shown) && AGE.is_match(real))
        || (HEX.is_match(shown) && HEX.is_match(real))
        || prefix(shown).is_some_and(|p| prefix(real) == Some(p));
    volatile.then_some(Alike::Volatile)
}

/// `command` with every shown address replaced by the real one seen so far.
pub fn substitute(command: &str, seen: &BTreeMap<String, String>) -> String {
    seen.iter().fold(command.to_string(), |c, (shown, real)| c.replace(shown.as_str(), real))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MD: &str = "# T\n\nRun it (`web.yaml`):\n\n```yaml\nkind: Service\n```\n\n```console\n$ kubectl apply -f web.yaml   # comment\n$ kubectl get ingress web\nNAME   ADDRESS      AGE\nweb    10.0.0.140   2s\n$ curl -H 'Host: a#b' http://10.0.0.140/ \\\n    --fail\nweb-7cbdc466d4-gw5rs\n$ kubectl port-forward svc/x 8080:80 &   # background\n      # a comment line, no output\n```\n\n```sh\n# a comment\nscripts/demo.sh            # add --once\n```\n";

    #[test]
    fn blocks_come_with_their_language_and_the_prose_before_them() {
        let b = blocks(MD);
        assert_eq!(b.iter().map(|b| b.lang.as_str()).collect::<Vec<_>>(), ["yaml", "console", "sh"]);
        assert_eq!(b[0].body, "kind: Service\n");
        assert_eq!(yaml_name(&b[0]).as_deref(), Some("web.yaml"));
        assert_eq!(yaml_name(&b[1]), None);
    }

    #[test]
    fn console_steps_join_continuations_drop_comments_and_keep_what_is_shown() {
        let b = blocks(MD);
        let s = steps(&b[1]);
        assert_eq!(s.len(), 4);
        assert_eq!(s[0], Step { command: "kubectl apply -f web.yaml".into(), background: false, shown: vec![] });
        assert_eq!(s[1].shown, ["NAME   ADDRESS      AGE", "web    10.0.0.140   2s"]);
        assert_eq!(s[2].command, "curl -H 'Host: a#b' http://10.0.0.140/ --fail");
        assert_eq!(s[2].shown, ["web-7cbdc466d4-gw5rs"]);
        assert!(s[3].background && s[3].command == "kubectl port-forward svc/x 8080:80");
        let sh = steps(&b[2]);
        assert_eq!(sh, [Step { command: "scripts/demo.sh".into(), background: false, shown: vec![] }]);
    }

    #[test]
    fn output_matches_when_only_addresses_ages_pod_suffixes_and_ids_differ() {
        let shown = ["NAME   ADDRESS      AGE".to_string(), "web    10.0.0.140   2s".to_string()];
        let seen = matches(&shown, "NAME   ADDRESS   AGE\nweb    10.0.0.7   3m12s\n").unwrap();
        assert_eq!(seen.get("10.0.0.140").map(String::as_str), Some("10.0.0.7"));
        assert_eq!(substitute("curl http://10.0.0.140/", &seen), "curl http://10.0.0.7/");
        assert!(matches(&["web-7cbdc466d4-gw5rs".into()], "web-5d9f8b7c6-x2k9q\n").is_ok());
        assert!(matches(&["edge 47fba09921d5 2/2".into()], "edge 0123456789ab 2/2").is_ok());
    }

    #[test]
    fn output_differs_when_a_word_or_a_line_differs() {
        let shown = ["NAME   ADDRESS      AGE".to_string(), "web    10.0.0.140   2s".to_string()];
        // No address yet: a word is missing.
        assert!(matches(&shown, "NAME   ADDRESS   AGE\nweb    2s\n").is_err());
        assert_eq!(matches(&shown, "NAME ADDRESS AGE\n"), Err(Mismatch::Lines { shown: 2, actual: 1 }));
        assert!(matches(&["hello from haptic".into()], "404 page not found").is_err());
        assert!(matches(&["web-7cbdc466d4-gw5rs".into()], "api-7cbdc466d4-gw5rs").is_err());
        assert!(matches(&["edge 2/2".into()], "edge 1/2").is_err());
    }
}
