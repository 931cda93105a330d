//! Request mirroring: HAProxy has no mirror action, so a Lua action of haptic's own
//! (`lua/haptic_mirror.lua`) copies a request and sends the copy, from a task of its own,
//! through an abstract socket to the `haptic_mirror` frontend, which hands it to the backend
//! the action names. The request itself never waits for its copy.
//!
//! Owns the script, its path in the tree, the socket's name and the `http-request` line that
//! copies a policy's requests. It must never put an object's text in the line: the backend is a
//! checked section name of ours and the share is two Rust integers.

use crate::model::{Mirror, Model};
use crate::RenderError;
use haptic_haproxy::names::is_section_name;

/// The script, as the tree holds it.
pub const SCRIPT: &str = include_str!("../lua/haptic_mirror.lua");
/// Where the tree holds it (relative to `haproxy.cfg`).
pub const SCRIPT_PATH: &str = "lua/haptic_mirror.lua";
/// The environment variable `global` sets to the socket's name; the script reads it.
pub const SOCKET_ENV: &str = "HAPTIC_MIRROR_SOCKET";

/// Whether some policy of `model` copies requests: the script, `global`'s lines and the
/// `haptic_mirror` frontend are written only then.
pub fn used(model: &Model) -> bool {
    model.policies.iter().any(|p| !p.policy.mirrors.is_empty())
}

/// Where the `haptic_mirror` frontend of `model`'s config listens, the script sending its
/// copies there: an abstract socket named after the first bind, so two HAProxy processes of
/// one network namespace (tests on one host) never take each other's.
pub fn socket(model: &Model) -> String {
    match model.frontends.iter().flat_map(|f| &f.binds).next() {
        Some(b) => format!("abns@haptic-mirror-{}", std::net::SocketAddr::new(b.address, b.port)),
        None => "abns@haptic-mirror".to_string(),
    }
}

/// The `http-request` line copying the requests `when` selects to `m.backend`, for `m.share` of
/// them (none for a share of 0).
pub fn line(m: &Mirror, when: &str) -> Result<Option<String>, RenderError> {
    if !is_section_name(&m.backend) {
        return Err(RenderError::Template(format!("{:?} is not a backend name", m.backend)));
    }
    let share = match m.share {
        None => String::new(),
        Some((n, d)) if n >= d => String::new(),
        Some((0, _)) => return Ok(None),
        Some((n, d)) => format!(" {{ rand({d}) lt {n} }}"),
    };
    Ok(Some(format!("http-request lua.haptic_mirror {} if {when}{share}", m.backend)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_script_sends_to_the_socket_the_frontend_binds() {
        assert!(SCRIPT.contains(&format!("local SOCKET = os.getenv(\"{SOCKET_ENV}\")")));
        assert!(SCRIPT.contains("core.register_action(\"haptic_mirror\""));
    }

    #[test]
    fn a_share_is_a_draw_and_none_or_all_is_every_request() {
        let m = |share| Mirror { backend: "ns_svc_80".into(), share };
        let when = "{ var(txn.policy) -m str p1 }";
        assert_eq!(
            line(&m(None), when).unwrap().unwrap(),
            "http-request lua.haptic_mirror ns_svc_80 if { var(txn.policy) -m str p1 }"
        );
        assert_eq!(line(&m(Some((100, 100))), when).unwrap(), line(&m(None), when).unwrap());
        assert_eq!(line(&m(Some((0, 100))), when).unwrap(), None);
        assert!(line(&m(Some((25, 50))), when).unwrap().unwrap().ends_with("p1 } { rand(50) lt 25 }"));
        let bad = Mirror { backend: "a b".into(), share: None };
        assert!(line(&bad, when).is_err());
    }
}
