//! Bounded property-based "fuzzing" of the apply decoder and the path rules (cargo-fuzz needs a
//! nightly toolchain and libfuzzer): arbitrary bytes and JSON-shaped requests never panic, and
//! whatever decodes keeps the path rules. `scripts/fuzz.sh` runs these with many more cases.

use haptic_protocol::{ApplyRequest, RelPath};
use proptest::prelude::*;
use serde_json::{json, Value};

fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        "[ -~]{0,20}".prop_map(Value::String),
        prop::sample::select(vec!["haproxy.cfg", "../x", "a/b", "sha256:", "reload", "runtime", "utf8", "base64"])
            .prop_map(|s| Value::String(s.into())),
    ];
    leaf.prop_recursive(4, 32, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(
                prop::sample::select(vec![
                    "fence", "epoch", "seq", "holder", "baseline", "plan_id", "mode", "reasons", "files", "path",
                    "digest", "size", "parts", "batches", "op", "blob", "utf8", "base64",
                ])
                .prop_map(String::from),
                inner,
                0..6
            )
            .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    #[test]
    fn apply_decoder_never_panics_on_bytes(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Ok(mut req) = serde_json::from_slice::<ApplyRequest>(&bytes) {
            let _ = req.check();
            let _ = req.take_checked_parts();
        }
    }

    #[test]
    fn apply_decoder_never_panics_on_json_shapes(v in json_value()) {
        if let Ok(mut req) = serde_json::from_value::<ApplyRequest>(v) {
            for f in &req.files {
                prop_assert!(RelPath::new(f.path.as_str()).is_ok());
            }
            let _ = req.check();
            let _ = req.take_checked_parts();
        }
    }

    #[test]
    fn path_rules_never_panic_and_accepted_paths_are_safe(s in any::<String>(), t in "[a-z./_-]{0,40}") {
        for p in [&s, &t] {
            if let Ok(r) = RelPath::new(p.clone()) {
                let r = r.as_str();
                prop_assert!(!r.starts_with('/') && !r.contains('\0') && r.len() <= 1024);
                prop_assert!(r.split('/').all(|c| !c.is_empty() && c != "." && c != ".."));
            }
        }
    }
}
