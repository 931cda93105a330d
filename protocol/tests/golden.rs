//! Golden JSON fixtures for every `/v1` message, checked in both directions: the fixture decodes
//! into the expected value, and that value encodes back to exactly the fixture's JSON.

use std::collections::BTreeMap;

use haptic_protocol::api::*;
use haptic_protocol::{
    plan_id, Digest, Fence, FileEntry, Op, PlanId, RelPath, ServerAdd, ServerDel, ServerSet, ServerState,
};
use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::{json, Value};

fn fixture(name: &str) -> Value {
    let path = format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

/// Decodes the fixture, compares with `expected`, and re-encodes to the same JSON.
fn both_ways<T: Serialize + DeserializeOwned + PartialEq + std::fmt::Debug>(name: &str, expected: &T) {
    let fx = fixture(name);
    let decoded: T = serde_json::from_value(fx.clone()).unwrap();
    assert_eq!(&decoded, expected, "{name}: decoded value");
    assert_eq!(serde_json::to_value(expected).unwrap(), fx, "{name}: encoded JSON");
}

const CFG: &str = "global\n  default-path config\n";
const MAP: &[u8] = b"a.example be_a\n";

fn files() -> Vec<FileEntry> {
    vec![
        FileEntry { path: RelPath::haproxy_cfg(), digest: Digest::of(CFG.as_bytes()), size: CFG.len() as u64 },
        FileEntry { path: RelPath::new("maps/hosts.map").unwrap(), digest: Digest::of(MAP), size: MAP.len() as u64 },
    ]
}

fn pid() -> PlanId {
    plan_id(&files()).unwrap()
}

fn base() -> PlanId {
    PlanId(Digest::of(b"previous"))
}

fn fence(seq: u64) -> Fence {
    Fence { epoch: 5, seq, holder: "ctrl-a".into() }
}

#[test]
fn state() {
    // The state of an API 1.0 agent (before `map.load`): still read as it was.
    let expected = StateResponse {
        api: ApiVersion { major: 1, minor: 0 },
        agent: AgentInfo { version: "0.1.0".into() },
        haproxy: HaproxyInfo {
            version: "3.0.11".into(),
            running: true,
            master_pid: Some(12),
            worker_pid: Some(40),
            reloads: 3,
        },
        capabilities: Capabilities {
            runtime_batches: true,
            ops: ["server.set", "map.replace", "acl.replace", "cert.set"].map(String::from).to_vec(),
        },
        fence: Some(fence(17)),
        applied: Some(AppliedInfo {
            plan_id: pid(),
            blob: json!({"schema": 1}),
            mode: Mode::Reload,
            at: "2026-11-29T12:00:00Z".into(),
        }),
        running: Some(RunningInfo { plan_id: pid() }),
        pending_reload: Some(PendingReload { plan_id: pid(), due_in_ms: 800 }),
        files: files(),
        verified: false,
        last_error: None,
        last_warnings: vec![],
    };
    both_ways("state.json", &expected);
}

#[test]
fn apply() {
    let expected = ApplyRequest {
        fence: fence(18),
        baseline: Some(base()),
        plan_id: pid(),
        mode: Mode::Runtime,
        reasons: vec!["backend be_app: server SRV_2 address 10.0.0.6:8080 -> 10.0.0.7:8080".into()],
        files: files(),
        parts: BTreeMap::from([
            (RelPath::haproxy_cfg(), Part::Utf8(CFG.into())),
            (RelPath::new("maps/hosts.map").unwrap(), Part::Base64("YS5leGFtcGxlIGJlX2EK".into())),
        ]),
        batches: vec![vec![
            Op::ServerSet(ServerSet {
                backend: "be_app".into(),
                server: "SRV_2".into(),
                addr: Some("10.0.0.7".into()),
                port: Some(8080),
                weight: Some(100),
                state: Some(ServerState::Ready),
            }),
            Op::ServerAdd(ServerAdd {
                backend: "be_app".into(),
                server: "SRV_3".into(),
                addr: "10.0.0.8".parse().unwrap(),
                port: 8080,
                weight: Some(10),
                state: ServerState::Ready,
                params: vec!["check".into(), "inter".into(), "2s".into()],
            }),
            Op::ServerDel(ServerDel { backend: "be_app".into(), server: "SRV_1".into() }),
            Op::MapReplace {
                path: RelPath::new("maps/hosts.map").unwrap(),
                entries: vec![("a.example".into(), "be_a".into())],
            },
            Op::AclReplace { path: RelPath::new("maps/allow.acl").unwrap(), patterns: vec!["10.0.0.0/8".into()] },
            Op::CertSet { path: RelPath::new("certs/site.pem").unwrap() },
        ]],
        blob: json!({"schema": 1}),
    };
    both_ways("apply.json", &expected);
    let parts = expected.check().unwrap();
    assert_eq!(parts[&RelPath::new("maps/hosts.map").unwrap()], MAP);
    let mut moved = expected.clone();
    assert_eq!(moved.take_checked_parts().unwrap(), parts);
    assert!(moved.parts.is_empty());
}

#[test]
fn acks() {
    both_ways(
        "ack_done.json",
        &Ack {
            applied: pid(),
            running: Some(pid()),
            mode: Mode::Reload,
            reasons: vec!["frontend fe: line changed".into()],
            reload: Some(ReloadStatus { state: ReloadState::Done, due_in_ms: None }),
        },
    );
    both_ways(
        "ack_scheduled.json",
        &Ack {
            applied: pid(),
            running: Some(base()),
            mode: Mode::Reload,
            reasons: vec![],
            reload: Some(ReloadStatus { state: ReloadState::Scheduled, due_in_ms: Some(1200) }),
        },
    );
    both_ways(
        "ack_runtime.json",
        &Ack { applied: pid(), running: Some(pid()), mode: Mode::Runtime, reasons: vec![], reload: None },
    );
}

#[test]
fn conflicts_nack_error() {
    both_ways(
        "conflict_stale.json",
        &Conflict {
            error: "fence 4/1 (ctrl-a) is not newer than 5/17 (ctrl-a)".into(),
            conflict: ConflictKind::StaleEpoch,
            fence: Some(fence(17)),
            actual_baseline: Some(pid()),
            missing: vec![],
        },
    );
    both_ways(
        "conflict_missing.json",
        &Conflict {
            error: "2 desired files are neither present nor sent".into(),
            conflict: ConflictKind::MissingParts,
            fence: Some(fence(18)),
            actual_baseline: Some(base()),
            missing: vec![RelPath::new("certs/a.pem").unwrap(), RelPath::new("maps/hosts.map").unwrap()],
        },
    );
    both_ways(
        "nack.json",
        &Nack {
            error: "haproxy -c refused the config".into(),
            rejected: true,
            haproxy_output: "[ALERT]    (11588) : config : parsing [haproxy.cfg:28] : unknown keyword 'bogus'\n".into(),
            reason: "check".into(),
        },
    );
    both_ways("error.json", &ErrorBody { error: "path \"../x\" has a '.' or '..' component".into() });
}

#[test]
fn apply_checks_refuse_bad_requests() {
    let mut req: ApplyRequest = serde_json::from_value(fixture("apply.json")).unwrap();
    req.plan_id = base();
    assert!(matches!(req.check(), Err(ApplyError::PlanIdMismatch { .. })));

    let mut req: ApplyRequest = serde_json::from_value(fixture("apply.json")).unwrap();
    req.parts.insert(RelPath::haproxy_cfg(), Part::Utf8("global\n  default-path origin\n".into()));
    assert!(matches!(req.check(), Err(ApplyError::PartDigest { .. })));

    let mut req: ApplyRequest = serde_json::from_value(fixture("apply.json")).unwrap();
    req.parts.insert(RelPath::new("extra.txt").unwrap(), Part::Utf8("x".into()));
    assert!(matches!(req.check(), Err(ApplyError::UnlistedPart(_))));
    assert!(matches!(req.take_checked_parts(), Err(ApplyError::UnlistedPart(_))));

    let mut req: ApplyRequest = serde_json::from_value(fixture("apply.json")).unwrap();
    req.files.push(req.files[0].clone());
    assert!(matches!(req.check(), Err(ApplyError::Plan(_))));

    let mut req: ApplyRequest = serde_json::from_value(fixture("apply.json")).unwrap();
    req.blob = json!("x".repeat(MAX_BLOB_BYTES));
    assert!(matches!(req.check(), Err(ApplyError::BlobTooLarge(_))));

    let mut req: ApplyRequest = serde_json::from_value(fixture("apply.json")).unwrap();
    req.fence.holder = "h".repeat(254);
    assert!(matches!(req.check(), Err(ApplyError::HolderTooLong(254))));
    req.fence.holder = "h".repeat(253);
    assert!(req.check().is_ok());

    let mut bad = fixture("apply.json");
    bad["files"][1]["path"] = json!("../etc/passwd");
    assert!(serde_json::from_value::<ApplyRequest>(bad).is_err());
    let mut bad = fixture("apply.json");
    bad["plan_id"] = json!("sha256:ABC");
    assert!(serde_json::from_value::<ApplyRequest>(bad).is_err());
}

#[test]
fn unknown_op_kind_decodes_in_a_request() {
    let mut v = fixture("apply.json");
    v["batches"][0][0] = json!({"op": "frontend.add", "name": "fe_new"});
    let req: ApplyRequest = serde_json::from_value(v).unwrap();
    assert_eq!(req.ops().next().unwrap().kind(), None);
    assert_eq!(req.ops().next().unwrap().kind_name(), "frontend.add");
}

#[test]
fn unknown_enum_values_from_a_newer_minor_decode() {
    let mut v = fixture("apply.json");
    v["mode"] = json!("turbo");
    let req: ApplyRequest = serde_json::from_value(v).unwrap();
    assert_eq!(req.mode, Mode::Unknown);
    let ack: Ack = serde_json::from_value(json!({"applied": pid(), "running": null, "mode": "turbo", "reasons": [],
        "reload": {"state": "queued", "due_in_ms": 5}}))
    .unwrap();
    assert_eq!((ack.mode, ack.reload.unwrap().state), (Mode::Unknown, ReloadState::Unknown));
    let c: Conflict = serde_json::from_value(json!({"error": "x", "conflict": "lease_lost", "fence": null,
        "actual_baseline": null}))
    .unwrap();
    assert_eq!(c.conflict, ConflictKind::Unknown);
}

#[test]
fn versions() {
    assert!(API_VERSION.compatible_with(&ApiVersion { major: 1, minor: 7 }));
    assert!(!API_VERSION.compatible_with(&ApiVersion { major: 2, minor: 0 }));
}
