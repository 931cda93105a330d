//! Credential rotation for `/v1`: the accepted credentials, re-read from `--credentials-file`
//! while the agent runs.
//!
//! Owns one credential (`user:password`, compared in constant time), the set of accepted
//! credentials (the current one, and the previous one until its grace window ends) and the task
//! that polls the credentials file (a mounted Secret changes under a running pod: the kubelet
//! swaps the volume's `..data` link). It must never log a credential,
//! never drop the current credential because the file is unreadable or malformed for a moment
//! (the last good one stays), and never accept the previous one past its window.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use base64::Engine as _;
use subtle::ConstantTimeEq;
use tokio::time::Instant;
use tracing::info;

use crate::error::AgentError;

/// `user:password` for HTTP Basic auth.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    expected: Vec<u8>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Credentials(..)")
    }
}

impl Credentials {
    /// From a `user:password` line.
    pub fn from_line(line: &str) -> Result<Self, AgentError> {
        let line = line.trim_end_matches(['\n', '\r']);
        match line.split_once(':') {
            Some((u, p)) if !u.is_empty() && !p.is_empty() => Ok(Self { expected: line.as_bytes().to_vec() }),
            Some(_) => Err(AgentError::Credentials("user and password must not be empty".into())),
            None => Err(AgentError::Credentials("expected one line `user:password`".into())),
        }
    }

    /// Reads the credentials file (its first line).
    pub fn from_file(path: &std::path::Path) -> Result<Self, AgentError> {
        let text = std::fs::read_to_string(path).map_err(|e| AgentError::io("read credentials", path, e))?;
        Self::from_line(text.lines().next().unwrap_or_default())
    }

    /// Whether an `Authorization` header value carries these credentials (constant time).
    pub fn accepts(&self, header: Option<&str>) -> bool {
        let Some(h) = header else { return false };
        let Some(b64) = h.strip_prefix("Basic ").or_else(|| h.strip_prefix("basic ")) else { return false };
        let Ok(given) = base64::engine::general_purpose::STANDARD.decode(b64.trim()) else { return false };
        given.ct_eq(&self.expected).into()
    }
}

/// What is accepted at one moment. Pure data; [`Accepted::rotate`] and [`Accepted::accepts_at`]
/// are the decisions.
#[derive(Debug, Clone)]
pub struct Accepted {
    current: Credentials,
    /// The credential replaced by the last rotation and when it stops being accepted.
    previous: Option<(Credentials, Instant)>,
}

impl Accepted {
    /// Only `current`.
    pub fn new(current: Credentials) -> Self {
        Self { current, previous: None }
    }

    /// `new` becomes current; the replaced one stays accepted until `now + grace`. Returns
    /// whether anything changed (the same credential read again is no rotation).
    pub fn rotate(&mut self, new: Credentials, now: Instant, grace: Duration) -> bool {
        if new == self.current {
            return false;
        }
        let old = std::mem::replace(&mut self.current, new);
        self.previous = (!grace.is_zero()).then(|| (old, now + grace));
        true
    }

    /// Whether the `Authorization` header value `header` is accepted at `now`: the current
    /// credential, or the previous one inside its window.
    pub fn accepts_at(&self, header: Option<&str>, now: Instant) -> bool {
        // Both are compared, so the time taken does not tell which one matched.
        let cur = self.current.accepts(header);
        let prev = matches!(&self.previous, Some((p, until)) if now < *until && p.accepts(header));
        cur | prev
    }
}

/// The accepted credentials, shared by the HTTP handlers and the watch task.
#[derive(Debug, Clone)]
pub struct CredentialSet(Arc<RwLock<Accepted>>);

impl From<Credentials> for CredentialSet {
    fn from(c: Credentials) -> Self {
        Self(Arc::new(RwLock::new(Accepted::new(c))))
    }
}

impl CredentialSet {
    /// Whether `header` carries an accepted credential now.
    pub fn accepts(&self, header: Option<&str>) -> bool {
        self.0.read().unwrap_or_else(|e| e.into_inner()).accepts_at(header, Instant::now())
    }

    /// Makes `new` current (the replaced one is accepted for `grace` more). Returns whether it
    /// was a change.
    pub fn rotate(&self, new: Credentials, grace: Duration) -> bool {
        self.0.write().unwrap_or_else(|e| e.into_inner()).rotate(new, Instant::now(), grace)
    }

    /// Polls `path` every `every`; a changed, valid credential becomes current and the replaced
    /// one stays accepted for `grace`. An unreadable or malformed file keeps the last good
    /// credential (warned once per distinct error). The task runs until aborted.
    pub fn spawn_watch(&self, path: PathBuf, every: Duration, grace: Duration) -> tokio::task::JoinHandle<()> {
        let set = self.clone();
        crate::poll::spawn_poll(every, "credentials file unusable, keeping the last good one", move || {
            let c = Credentials::from_file(&path).map_err(|e| e.to_string())?;
            if set.rotate(c, grace) {
                info!(file = %path.display(), grace = %humantime::format_duration(grace),
                    "credentials rotated: the previous credential is accepted for the grace window");
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_auth() {
        let c = Credentials::from_line("admin:s3cret\n").unwrap();
        assert!(c.accepts(Some(&basic("admin:s3cret"))));
        assert!(!c.accepts(Some(&basic("admin:s3cre"))));
        assert!(!c.accepts(Some(&basic("admin:s3cretX"))));
        assert!(!c.accepts(Some("Bearer x")));
        assert!(!c.accepts(None));
        assert!(Credentials::from_line("nocolon").is_err());
        assert!(Credentials::from_line("admin:").is_err(), "an empty password is refused");
        assert!(Credentials::from_line(":pw").is_err());
    }

    fn basic(s: &str) -> String {
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(s))
    }

    #[test]
    fn the_previous_credential_is_accepted_only_inside_its_window() {
        let t0 = Instant::now();
        let grace = Duration::from_secs(60);
        let mut a = Accepted::new(Credentials::from_line("u:old").unwrap());
        assert!(a.accepts_at(Some(&basic("u:old")), t0));
        assert!(!a.rotate(Credentials::from_line("u:old").unwrap(), t0, grace), "same credential: no rotation");
        assert!(a.rotate(Credentials::from_line("u:new").unwrap(), t0, grace));
        let inside = t0 + Duration::from_secs(59);
        assert!(a.accepts_at(Some(&basic("u:new")), inside));
        assert!(a.accepts_at(Some(&basic("u:old")), inside));
        assert!(!a.accepts_at(Some(&basic("u:other")), inside));
        assert!(!a.accepts_at(None, inside));
        let after = t0 + grace;
        assert!(a.accepts_at(Some(&basic("u:new")), after));
        assert!(!a.accepts_at(Some(&basic("u:old")), after), "past the window");
        // A second rotation: only the one just replaced is the previous.
        assert!(a.rotate(Credentials::from_line("u:third").unwrap(), inside, grace));
        assert!(a.accepts_at(Some(&basic("u:new")), inside));
        assert!(!a.accepts_at(Some(&basic("u:old")), inside));
        // A zero grace window accepts only the new one at once.
        assert!(a.rotate(Credentials::from_line("u:fourth").unwrap(), inside, Duration::ZERO));
        assert!(!a.accepts_at(Some(&basic("u:third")), inside));
    }
}
