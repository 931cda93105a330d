//! Conflicts and recovery on a real fleet (3 pods, HAProxy 2.6, 3.0, 3.2 and 3.4): `missing_parts`,
//! an apply behind the controller's back (`stale_epoch` then `prev_mismatch`), a controller
//! restart that reloads nothing, drift repair, and a second controller that stands down.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use haptic_controller::blob;
use haptic_controller::client::ApplyAnswer;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::{free_port, on_each_version, HaproxyBin};
use haptic_protocol::api::Part;
use haptic_protocol::{ApplyRequest, Fence, Mode};

const MAP: &str = "a.example be_app\n";

on_each_version!(conflicts_restart_drift_and_a_second_controller, worker_threads = 4);

async fn conflicts_restart_drift_and_a_second_controller(bin: HaproxyBin) {
    eprintln!("=== {}", bin.label());
    let fleet = Fleet::start(&bin, 3, PodOpts::default()).await;
    let work = Work::new();
    let cfg_dir = work.cfg_dir();
    let state_dir = work.state_dir();
    let mut cfg = Cfg::new(free_port());
    let r1 = write_render(&cfg_dir, &cfg.files(MAP));
    let ctl = start(settings(&fleet, &cfg_dir, &state_dir, "ctl-a", Duration::from_secs(3600))).await;
    converged(&ctl, &fleet, r1.plan_id()).await;

    // missing_parts: a file vanishes from pod 1's live tree; the next apply does not send it
    // (the pod is known to hold it), the agent names it, the controller resends exactly it.
    let map_on_1 = fleet.pods[1].root().join("current/maps/hosts.map");
    std::fs::remove_file(&map_on_1).unwrap();
    cfg.servers[0].0 = 9101;
    let r2 = write_render(&cfg_dir, &cfg.files(MAP));
    converged(&ctl, &fleet, r2.plan_id()).await;
    assert!(metric(&ctl, "haptic_apply_conflicts_total{conflict=\"missing_parts\"}") >= 1.0);
    assert_eq!(std::fs::read_to_string(&map_on_1).unwrap(), MAP);

    // An apply behind the controller's back with the controller's own epoch and a higher seq.
    let epoch = ctl.status().controller.epoch;
    let mut rogue_cfg = cfg.clone();
    rogue_cfg.servers[1].1 = 77;
    let rogue_dir = work.path().join("rogue");
    std::fs::create_dir(&rogue_dir).unwrap();
    let rogue = write_render(&rogue_dir, &rogue_cfg.files(MAP));
    let req = ApplyRequest {
        fence: Fence { epoch, seq: 1_000_000, holder: "ctl-a".into() },
        baseline: Some(r2.plan_id()),
        plan_id: rogue.plan_id(),
        mode: Mode::Reload,
        reasons: vec!["behind the controller's back".into()],
        files: rogue.manifest().to_vec(),
        parts: rogue.files().map(|(p, b)| (p.clone(), Part::from_bytes(b))).collect::<BTreeMap<_, _>>(),
        batches: vec![],
        blob: blob::encode(&rogue),
    };
    let answer = fleet.apply(0, &req).await;
    assert!(matches!(answer, ApplyAnswer::Ack(_)), "{answer:?}");
    cfg.servers[0].0 = 9102;
    let r3 = write_render(&cfg_dir, &cfg.files(MAP));
    let s = converged(&ctl, &fleet, r3.plan_id()).await;
    assert!(metric(&ctl, "haptic_apply_conflicts_total{conflict=\"stale_epoch\"}") >= 1.0);
    assert!(metric(&ctl, "haptic_apply_conflicts_total{conflict=\"prev_mismatch\"}") >= 1.0);
    assert!(s.controller.epoch > epoch, "the controller lifted its own epoch above the pod's");
    assert_eq!(s.controller.stood_down, None);
    // Re-diffed against the rogue plan (decoded from its blob): still runtime.
    assert_eq!(s.pods.iter().find(|p| p.url == fleet.pods[0].url()).unwrap().mode, Some(Mode::Runtime), "{s:?}");
    ctl.stop().await;

    // Restart: a change made while the controller was down deploys without a reload,
    // because the baseline comes from the pods' blobs.
    let gens = fleet.generations().await;
    cfg.servers[0].0 = 9103;
    let r4 = write_render(&cfg_dir, &cfg.files(MAP));
    let ctl = start(settings(&fleet, &cfg_dir, &state_dir, "ctl-a", Duration::from_secs(1))).await;
    let s = converged(&ctl, &fleet, r4.plan_id()).await;
    assert!(s.pods.iter().all(|p| p.mode == Some(Mode::Runtime)), "{s:?}");
    assert_eq!(fleet.generations().await, gens, "the restarted controller reloaded a pod");
    assert!(s.controller.epoch > epoch + 1, "a restart claims a new term");

    // Drift: a file edited behind the controller's back is rewritten within one interval.
    let map_on_2 = fleet.pods[2].root().join("current/maps/hosts.map");
    std::fs::remove_file(&map_on_2).unwrap();
    std::fs::write(&map_on_2, "evil.example be_app\n").unwrap();
    wait_until("drift repaired", &ctl, &fleet, |_| (metric(&ctl, "haptic_drift_repairs_total") >= 1.0).then_some(()))
        .await;
    assert_eq!(std::fs::read_to_string(&map_on_2).unwrap(), MAP);
    let verified = fleet.state(2, true).await;
    assert_eq!(verified.files, r4.manifest());
    converged(&ctl, &fleet, r4.plan_id()).await;

    // A second controller with another identity is refused with stale_epoch and stands down.
    let other_dir = work.path().join("render-b");
    std::fs::create_dir(&other_dir).unwrap();
    let mut other = cfg.clone();
    other.servers[0].0 = 9200;
    write_render(&other_dir, &other.files(MAP));
    let b = start(settings(&fleet, &other_dir, &work.path().join("state-b"), "ctl-b", Duration::from_secs(3600))).await;
    let why = wait_until("controller b stood down", &b, &fleet, |s| {
        s.controller.stood_down.clone().filter(|_| metric(&b, "haptic_deployments_total{result=\"stood_down\"}") >= 1.0)
    })
    .await;
    assert!(why.contains("ctl-a"), "{why}");
    assert!(metric(&b, "haptic_apply_conflicts_total{conflict=\"stale_epoch\"}") >= 1.0);
    assert!(b.status().pods.iter().all(|p| p.phase == haptic_controller::status::Phase::StoodDown));
    for st in fleet.states().await {
        assert_eq!(st.applied.map(|a| a.plan_id), Some(r4.plan_id()), "controller b changed a pod");
    }
    // ... and the first one keeps deploying.
    cfg.servers[0].0 = 9104;
    let r5 = write_render(&cfg_dir, &cfg.files(MAP));
    converged(&ctl, &fleet, r5.plan_id()).await;
    b.stop().await;
    ctl.stop().await;
}
