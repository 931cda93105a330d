//! Property tests of the config comparison.
use haptic_haproxy::claim::diff_cfg;
use proptest::prelude::*;

proptest! {
    /// A config diffed against itself (with comments and spacing changed) has nothing to do.
    #[test]
    fn cfg_diff_of_itself_is_empty(servers in prop::collection::vec((1u8..255, 1u16..65535, 0u32..256), 1..20)) {
        let mut cfg = String::from("global\n  default-path config\nbackend be\n  balance roundrobin\n");
        for (i, (ip, port, w)) in servers.iter().enumerate() {
            cfg.push_str(&format!("  server s{i} 10.0.0.{ip}:{port} weight {w}\n"));
        }
        let noisy = cfg.replace("  ", "\t ").replace('\n', "   # c\n");
        prop_assert!(diff_cfg(&cfg, &noisy).is_empty());
    }
}
