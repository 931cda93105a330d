//! The bootstrap `haproxy.cfg`: what HAProxy runs before the first apply.
//!
//! Owns that config's text: one frontend on the health bind answering `/healthz` 200 and
//! `/ready` 503 (a pod turns Ready only once a real config answers `/ready` 200). It must never
//! write the file: the agent's `init` does.

/// A health bind that cannot go into a `bind` line as one word.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad --health-bind {0:?}: expected ADDR:PORT or :PORT")]
pub struct BadHealthBind(pub String);

/// The bootstrap `haproxy.cfg` for a health bind such as `:8404` or `127.0.0.1:8404`.
pub fn config(health_bind: &str) -> Result<String, BadHealthBind> {
    let bind = health_bind.trim();
    if bind.is_empty() || bind.chars().any(|c| c.is_whitespace() || c.is_control() || c == '#') || !bind.contains(':') {
        return Err(BadHealthBind(health_bind.to_string()));
    }
    Ok(format!(
        "# haptic bootstrap: replaced by the first apply.\n\
         global\n\
         \x20   default-path config\n\
         \x20   description cfggen=bootstrap\n\
         \n\
         defaults\n\
         \x20   mode http\n\
         \x20   timeout connect 5s\n\
         \x20   timeout client 30s\n\
         \x20   timeout server 30s\n\
         \n\
         frontend haptic_health\n\
         \x20   bind {bind}\n\
         \x20   http-request return status 200 content-type text/plain string \"ok\" if {{ path /healthz }}\n\
         \x20   http-request return status 503 content-type text/plain string \"not ready: no config applied yet\" if {{ path /ready }}\n\
         \x20   http-request return status 404 content-type text/plain string \"not found\"\n"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_bind_is_one_word_with_a_port() {
        for bad in ["", "bad bind", "8404", ":84#04", "1.2.3.4:1\nbind :1"] {
            assert_eq!(config(bad), Err(BadHealthBind(bad.to_string())), "{bad:?}");
        }
        let cfg = config(" 127.0.0.1:8404 ").unwrap();
        assert!(cfg.contains("\n    bind 127.0.0.1:8404\n"), "{cfg}");
        assert!(cfg.contains("default-path config"), "{cfg}");
    }
}
