//! Bounded property-based "fuzzing" of the apply decoder and the path rules (cargo-fuzz needs a
//! nightly toolchain and libfuzzer): arbitrary bytes and JSON-shaped requests never panic, and
//! whatever decodes keeps the path rules; valid requests, mutated once, get past decoding to the
//! checks, and whatever passes those keeps the contract. `scripts/fuzz.sh` runs these with many more cases.

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

/// A well-formed apply request: files with valid paths, the matching plan id, parts of some of
/// them (utf8 or base64), op batches and a blob.
fn valid_request() -> impl Strategy<Value = ApplyRequest> {
    use haptic_protocol::{plan_id, Digest, Fence, FileEntry, Mode, Op, Part, ServerSet};
    (
        prop::collection::btree_map(
            "(maps|certs|files)/[a-z]{1,8}\\.(map|pem|txt)",
            (prop::collection::vec(any::<u8>(), 0..64), any::<bool>()),
            0..6,
        ),
        prop::collection::vec(any::<u8>(), 1..64),
        (any::<u64>(), any::<u64>(), "[a-z0-9-]{1,20}"),
        prop::sample::select(vec![Mode::Reload, Mode::Runtime, Mode::FileOnly]),
        prop::collection::vec(("[a-z_]{1,8}", "[a-z_]{1,8}", proptest::option::of(0u32..=256)), 0..4),
        any::<bool>(),
    )
        .prop_map(|(others, cfg, (epoch, seq, holder), mode, servers, with_baseline)| {
            let mut files = vec![("haproxy.cfg".to_string(), (cfg, true))];
            files.extend(others);
            let entries: Vec<FileEntry> = files
                .iter()
                .map(|(p, (b, _))| FileEntry {
                    path: RelPath::new(p.clone()).unwrap(),
                    digest: Digest::of(b),
                    size: b.len() as u64,
                })
                .collect();
            let parts = files
                .iter()
                .filter(|(_, (_, send))| *send)
                .map(|(p, (b, _))| (RelPath::new(p.clone()).unwrap(), Part::from_bytes(b)))
                .collect();
            let ops = servers
                .into_iter()
                .map(|(backend, server, weight)| {
                    Op::ServerSet(ServerSet { backend, server, addr: None, port: None, weight, state: None })
                })
                .collect::<Vec<_>>();
            let id = plan_id(&entries).unwrap();
            ApplyRequest {
                fence: Fence { epoch, seq, holder },
                baseline: with_baseline.then_some(id),
                plan_id: id,
                mode,
                reasons: vec!["fuzz".into()],
                files: entries,
                parts,
                batches: if ops.is_empty() { vec![] } else { vec![ops] },
                blob: json!({"schema": 1}),
            }
        })
}

/// One change to a request's JSON: a key removed, a value replaced, a digest or size or path
/// or plan id altered, a part's bytes changed.
#[derive(Debug, Clone)]
enum Mutation {
    Remove(usize),
    Replace(usize, Value),
    Digest(usize, usize),
    Size(usize, i64),
    Path(usize, String),
    PlanId(usize),
    PartBytes(usize, String),
    None,
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        any::<usize>().prop_map(Mutation::Remove),
        (any::<usize>(), json_value()).prop_map(|(i, v)| Mutation::Replace(i, v)),
        (any::<usize>(), any::<usize>()).prop_map(|(i, j)| Mutation::Digest(i, j)),
        (any::<usize>(), -2i64..3).prop_map(|(i, d)| Mutation::Size(i, d)),
        (
            any::<usize>(),
            prop::sample::select(vec!["../x", "/etc/passwd", "a//b", "a/./b", "", "maps/x.map", "haproxy.cfg"])
                .prop_map(String::from)
        )
            .prop_map(|(i, p)| Mutation::Path(i, p)),
        any::<usize>().prop_map(Mutation::PlanId),
        (any::<usize>(), "[ -~]{0,8}").prop_map(|(i, s)| Mutation::PartBytes(i, s)),
        Just(Mutation::None),
    ]
}

fn mutate(v: &mut Value, m: &Mutation) {
    const KEYS: [&str; 9] = ["fence", "baseline", "plan_id", "mode", "reasons", "files", "parts", "batches", "blob"];
    let files = v["files"].as_array().map_or(0, Vec::len).max(1);
    match m {
        Mutation::Remove(i) => {
            v.as_object_mut().unwrap().remove(KEYS[i % KEYS.len()]);
        }
        Mutation::Replace(i, new) => v[KEYS[i % KEYS.len()]] = new.clone(),
        Mutation::Digest(i, j) => {
            if let Some(d) = v["files"][i % files]["digest"].as_str() {
                let mut d: Vec<char> = d.chars().collect();
                let at = 7 + j % (d.len() - 7);
                d[at] = if d[at] == '0' { '1' } else { '0' };
                v["files"][i % files]["digest"] = json!(d.into_iter().collect::<String>());
            }
        }
        Mutation::Size(i, d) => {
            if let Some(s) = v["files"][i % files]["size"].as_i64() {
                v["files"][i % files]["size"] = json!(s + d);
            }
        }
        Mutation::Path(i, p) => v["files"][i % files]["path"] = json!(p),
        Mutation::PlanId(i) => v["plan_id"] = v["files"][i % files]["digest"].clone(),
        Mutation::PartBytes(i, s) => {
            if let Some(parts) = v["parts"].as_object_mut() {
                let n = parts.len().max(1);
                if let Some((_, part)) = parts.iter_mut().nth(i % n) {
                    *part = json!({"utf8": s});
                }
            }
        }
        Mutation::None => {}
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

    /// Valid requests decode and check; after one mutation they still never panic, and whatever
    /// passes the checks keeps the contract: the plan id is the files' id, every part is listed
    /// and hashes to its digest and size, every path keeps the path rules.
    #[test]
    fn mutated_valid_requests_never_pass_broken(req in valid_request(), m in mutation()) {
        let v = serde_json::to_value(&req).unwrap();
        let back: ApplyRequest = serde_json::from_value(v.clone()).unwrap();
        prop_assert_eq!(&back, &req);
        prop_assert!(back.check().is_ok(), "{:?}", back.check());
        let mut bad = v;
        mutate(&mut bad, &m);
        if let Ok(mut req) = serde_json::from_value::<ApplyRequest>(bad) {
            let checked = req.check();
            let taken = req.take_checked_parts();
            prop_assert_eq!(checked.is_ok(), taken.is_ok());
            if let Ok(parts) = taken {
                prop_assert_eq!(haptic_protocol::plan_id(&req.files).ok(), Some(req.plan_id));
                for (path, bytes) in &parts {
                    let f = req.files.iter().find(|f| &f.path == path);
                    prop_assert!(f.is_some_and(|f| f.digest == haptic_protocol::Digest::of(bytes) && f.size == bytes.len() as u64));
                }
                for f in &req.files {
                    prop_assert!(RelPath::new(f.path.as_str()).is_ok());
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    /// A request encoded once without its fence, then given any fence, decodes to exactly the
    /// request with that fence: what a writer sends many agents is what each would get alone.
    #[test]
    fn an_encoded_apply_with_any_fence_is_the_request_with_that_fence(
        req in valid_request(),
        fences in prop::collection::vec((any::<u64>(), any::<u64>(), any::<String>()), 1..4),
    ) {
        let encoded = haptic_protocol::api::EncodedApply::new(&req).unwrap();
        for (epoch, seq, holder) in fences {
            let fence = haptic_protocol::Fence { epoch, seq, holder };
            let body = encoded.with_fence(&fence).unwrap();
            let back: ApplyRequest = serde_json::from_slice(&body).unwrap();
            prop_assert_eq!(&back, &ApplyRequest { fence, ..req.clone() });
        }
    }
}
