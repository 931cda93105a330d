//! Property tests of the protocol's invariants: plan ids ignore order, invalid paths never
//! exist, messages round-trip through JSON, and the fence order is monotonic.

use haptic_protocol::api::{Ack, Mode, ReloadState, ReloadStatus};
use haptic_protocol::fence::{decide, FenceDecision};
use haptic_protocol::{plan_id, Digest, Fence, FileEntry, PlanId, RelPath};
use proptest::prelude::*;

fn component() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._-]{1,20}".prop_filter("not . or ..", |c| c != "." && c != "..")
}

fn rel_path() -> impl Strategy<Value = String> {
    prop::collection::vec(component(), 1..=8).prop_map(|c| c.join("/"))
}

fn manifest() -> impl Strategy<Value = Vec<FileEntry>> {
    prop::collection::btree_map(rel_path(), any::<Vec<u8>>(), 0..12).prop_map(|mut m| {
        // A valid manifest has no file that is also a directory of another (`a` and `a/b`:
        // `plan_id` refuses that, see `file_dir_clash_is_refused_in_any_order`).
        m.insert("haproxy.cfg".into(), Vec::new());
        let dirs: Vec<String> = m.keys().map(|p| format!("{p}/")).collect();
        m.retain(|p, _| !dirs.iter().any(|d| p.starts_with(d.as_str())));
        let mut files: Vec<FileEntry> = m
            .into_iter()
            .map(|(p, b)| FileEntry { path: RelPath::new(p).unwrap(), digest: Digest::of(&b), size: b.len() as u64 })
            .filter(|f| !f.path.is_haproxy_cfg())
            .collect();
        files.push(FileEntry { path: RelPath::haproxy_cfg(), digest: Digest::of(b"global\n"), size: 7 });
        files
    })
}

fn fence() -> impl Strategy<Value = Fence> {
    (0u64..4, 0u64..6, prop::sample::select(vec!["a", "b"])).prop_map(|(epoch, seq, h)| Fence {
        epoch,
        seq,
        holder: h.into(),
    })
}

proptest! {
    #[test]
    fn plan_id_ignores_order(files in manifest(), seed in any::<u64>()) {
        let mut shuffled = files.clone();
        let n = shuffled.len();
        for i in 0..n {
            let j = (seed.wrapping_mul(6364136223846793005).wrapping_add(i as u64) % n as u64) as usize;
            shuffled.swap(i, j);
        }
        prop_assert_eq!(plan_id(&files).unwrap(), plan_id(&shuffled).unwrap());
    }

    #[test]
    fn file_dir_clash_is_refused_in_any_order(
        files in manifest(),
        dir in component(),
        rest in prop::collection::vec(component(), 1..=7).prop_map(|c| c.join("/")),
        at in any::<usize>(),
    ) {
        let mut files = files;
        let file = FileEntry { path: RelPath::new(dir.clone()).unwrap(), digest: Digest::of(b"f"), size: 1 };
        let under = FileEntry { path: RelPath::new(format!("{dir}/{rest}")).unwrap(), digest: Digest::of(b"g"), size: 1 };
        files.retain(|f| f.path != file.path && f.path != under.path);
        let i = at % (files.len() + 1);
        files.insert(i, under);
        files.insert(at % (files.len() + 1), file);
        prop_assert!(plan_id(&files).is_err());
    }

    #[test]
    fn valid_paths_round_trip(p in rel_path()) {
        let rp = RelPath::new(p.clone()).unwrap();
        let json = serde_json::to_string(&rp).unwrap();
        prop_assert_eq!(serde_json::from_str::<RelPath>(&json).unwrap(), rp);
    }

    #[test]
    fn traversal_forms_are_refused(prefix in rel_path(), suffix in rel_path(), form in 0usize..9) {
        let bad = match form {
            0 => format!("{prefix}/../{suffix}"),
            1 => format!("{prefix}/./{suffix}"),
            2 => format!("/{prefix}"),
            3 => format!("{prefix}//{suffix}"),
            4 => format!("{prefix}\0{suffix}"),
            5 => format!("{}/{suffix}", "x".repeat(256)),
            6 => std::iter::repeat_n(prefix.clone(), 9).collect::<Vec<_>>().join("/") + "/x/y/z/w/v/u/t/s/r",
            7 => String::new(),
            _ => format!("../{suffix}"),
        };
        prop_assert!(RelPath::new(bad.clone()).is_err(), "accepted {:?}", bad);
        prop_assert!(serde_json::from_value::<RelPath>(serde_json::Value::String(bad)).is_err());
    }

    #[test]
    fn manifests_round_trip(files in manifest()) {
        let json = serde_json::to_string(&files).unwrap();
        let back: Vec<FileEntry> = serde_json::from_str(&json).unwrap();
        prop_assert_eq!(plan_id(&back).unwrap(), plan_id(&files).unwrap());
        prop_assert_eq!(back, files);
    }

    #[test]
    fn acks_round_trip(reasons in prop::collection::vec(".{0,30}", 0..4), due in prop::option::of(0u64..10_000), scheduled in any::<bool>()) {
        let p = PlanId(Digest::of(b"x"));
        let ack = Ack {
            applied: p,
            running: Some(p),
            mode: if scheduled { Mode::Reload } else { Mode::Runtime },
            reasons,
            reload: Some(ReloadStatus { state: if scheduled { ReloadState::Scheduled } else { ReloadState::Done }, due_in_ms: due }),
        };
        let back: Ack = serde_json::from_str(&serde_json::to_string(&ack).unwrap()).unwrap();
        prop_assert_eq!(back, ack);
    }

    /// Feeding the agent's fence rule any sequence of applies: once a fence is accepted, no fence
    /// lower than it (smaller epoch, or same epoch and seq not above) is ever accepted again.
    #[test]
    fn fence_is_monotonic(incoming in prop::collection::vec((fence(), 0u8..3), 1..40)) {
        let plans: Vec<PlanId> = (0..3u8).map(|i| PlanId(Digest::of(&[i]))).collect();
        let mut seen: Option<Fence> = None;
        let mut last: Option<(Fence, PlanId)> = None;
        let mut accepted: Vec<Fence> = Vec::new();
        for (f, pi) in incoming {
            let plan = plans[pi as usize];
            let d = decide(seen.as_ref(), last.as_ref().map(|(f, p)| (f, p)), &f, &plan);
            if d == FenceDecision::Accept {
                for a in &accepted {
                    prop_assert!(f.epoch > a.epoch || (f.epoch == a.epoch && f.seq > a.seq), "{:?} accepted after {:?}", f, a);
                }
                accepted.push(f.clone());
                seen = Some(f.clone());
                last = Some((f, plan));
            } else if d == FenceDecision::ExactRetry {
                prop_assert_eq!(Some((f, plan)), last.clone());
            }
        }
    }
}
