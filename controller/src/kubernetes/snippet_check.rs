//! Each allowed snippet checked alone with `haproxy -c`, so a snippet HAProxy refuses refuses
//! only its own object, never the whole render at the gate.
//!
//! Owns running one check contained ([`haptic_sandbox`]) and the verdicts kept by the digest of
//! the config checked. It must never decide what a refusal does to the render, nor let a check
//! that cannot run refuse anything.

use std::collections::BTreeMap;
use std::time::Duration;

use haptic_haproxy::check_output::{summarize, Checked, Summary};
use tracing::warn;

/// How many snippet verdicts are kept, by the content of the config checked.
const SNIPPET_VERDICTS_KEPT: usize = 256;

/// The longest one snippet's `haproxy -c` may take; past it the snippet is refused.
const SNIPPET_CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// `haproxy -c` verdicts on allowed snippets checked alone, by the digest of the config checked:
/// `None` passed, `Some` refused with HAProxy's words about the snippet's own lines. The last
/// [`SNIPPET_VERDICTS_KEPT`] are kept, so a snippet that comes back is not checked again.
#[derive(Debug)]
pub(crate) struct SnippetVerdicts {
    by_config: haptic_sandbox::Lru<haptic_protocol::Digest, Option<String>>,
}

impl Default for SnippetVerdicts {
    fn default() -> Self {
        SnippetVerdicts { by_config: haptic_sandbox::Lru::new(SNIPPET_VERDICTS_KEPT) }
    }
}

impl SnippetVerdicts {
    /// The snippets of `checks` that `haproxy -c` (`bin`) refuses, checking each new one once.
    /// A check that cannot run refuses nothing (the gate still checks the whole render) and is
    /// tried again next time.
    pub(crate) async fn refused(
        &mut self,
        bin: &std::path::Path,
        checks: &[haptic_render::SnippetCheck],
    ) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for c in checks {
            let key = haptic_protocol::Digest::of(c.config.as_bytes());
            let verdict = match self.by_config.get(&key) {
                Some(v) => v,
                None => match check_snippet(bin, c).await.map(|s| s.words()) {
                    Ok(v) => {
                        if let Some(why) = &v {
                            warn!("haproxy -c refuses the snippet of {}: {why}", c.object);
                        }
                        self.by_config.insert(key, v.clone());
                        v
                    }
                    Err(e) => {
                        warn!("could not check the snippet of {}: {e}", c.object);
                        None
                    }
                },
            };
            if let Some(why) = verdict {
                out.insert(c.snippet.clone(), why);
            }
        }
        out
    }
}

/// Runs `haproxy -c` contained ([`haptic_sandbox`]) over one snippet's check config, alone in a
/// temp dir: its summary, whose findings are HAProxy's alerts about the snippet's own lines
/// (numbered from the snippet's first line, redacted and capped by
/// `haptic_haproxy::check_output`), never its other output. A check that does not finish within
/// [`SNIPPET_CHECK_TIMEOUT`] or writes too much refuses the snippet.
async fn check_snippet(bin: &std::path::Path, c: &haptic_render::SnippetCheck) -> Result<Summary, String> {
    let dir = tempfile::Builder::new().prefix("haptic-snippet-").tempdir().map_err(|e| e.to_string())?;
    tokio::fs::write(dir.path().join("check.cfg"), &c.config).await.map_err(|e| e.to_string())?;
    let run = haptic_sandbox::Run::check(bin, dir.path(), "check.cfg", SNIPPET_CHECK_TIMEOUT);
    let out = tokio::task::spawn_blocking(move || haptic_sandbox::run(run))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    let checked = Checked::Snippet { config: &c.config, snippet: &c.snippet, file: "check.cfg" };
    Ok(summarize(checked, crate::gate::ending(&out.end), &out.output, Some(&dir.path().to_string_lossy())))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines of a refusal's alerts (none for a run that passed, timed out or said too much).
    fn lines(s: &Summary) -> Vec<Option<u32>> {
        match s {
            Summary::Refused { findings, .. } => findings.iter().map(|f| f.line).collect(),
            _ => Vec::new(),
        }
    }

    #[tokio::test]
    async fn each_new_snippet_is_checked_once_and_a_refused_one_is_named() {
        let Some(bin) = haptic_e2e::haproxy_bins().into_iter().next() else { return };
        let check = |name: &str, snippet: &str| haptic_render::SnippetCheck {
            object: haptic_render::ObjectRef { kind: "Ingress".into(), namespace: "shop".into(), name: name.into() },
            snippet: snippet.into(),
            config: haptic_haproxy::snippet::check_config(snippet),
        };
        let checks = [
            check("good", "    http-response set-header X-Good yes\n"),
            check("broken", "    http-response set-header X-Only-A-Name\n"),
        ];
        let mut v = SnippetVerdicts::default();
        let refused = v.refused(&bin.path, &checks).await;
        assert_eq!(refused.keys().collect::<Vec<_>>(), [&checks[1].snippet], "{refused:?}");
        // Numbered from the snippet's own first line, not the check config's.
        let summary = check_snippet(&bin.path, &checks[1]).await.unwrap();
        assert_eq!(lines(&summary), [Some(1)], "{summary:?}");
        // Known snippets are not checked again (a binary that cannot run changes nothing).
        let again = v.refused(std::path::Path::new("/nonexistent/haproxy"), &checks).await;
        assert_eq!(again, refused);
        // Only the snippets asked about are answered; a new one that cannot be checked refuses
        // nothing and is not kept.
        let later = v.refused(std::path::Path::new("/nonexistent/haproxy"), &[check("new", "    x y\n")]).await;
        assert!(later.is_empty() && v.by_config.len() == 2, "{later:?}");
    }

    /// A snippet that makes HAProxy read a file outside its check directory is refused without
    /// the file's content reaching its words, `/dev/zero` is refused at once (not by the
    /// deadline), and the benign twin passes: on every HAProxy version.
    #[tokio::test]
    async fn a_snippet_check_reads_no_file_and_echoes_none() {
        let base = tempfile::tempdir().unwrap();
        let secret = base.path().join("token");
        std::fs::write(&secret, "root:x:0:0:s3cr3t\n").unwrap();
        let check = |snippet: String| haptic_render::SnippetCheck {
            object: haptic_render::ObjectRef { kind: "Ingress".into(), namespace: "a".into(), name: "a".into() },
            config: haptic_haproxy::snippet::check_config(&snippet),
            snippet,
        };
        for bin in haptic_e2e::haproxy_bins() {
            for file in [secret.display().to_string(), "/etc/passwd".into(), "/dev/zero".into()] {
                let c = check(format!("    acl x src -f {file}\n    http-request deny if x\n"));
                let summary = check_snippet(&bin.path, &c).await.unwrap();
                let why = summary.words().unwrap_or_else(|| panic!("{file} passed"));
                // The file's content is nowhere in what a namespace user is shown.
                assert!(!why.contains("s3cr3t") && !why.contains("root:x"), "{}: {why}", bin.label());
                let first = lines(&summary).first().copied().flatten();
                assert_eq!(first, Some(1), "{}: {file}: refused at once, from the snippet's own line", bin.label());
            }
            let ok = check("    acl x src 10.0.0.1\n    http-request deny if x\n".into());
            assert!(check_snippet(&bin.path, &ok).await.unwrap().passed(), "{}", bin.label());
        }
    }
}
