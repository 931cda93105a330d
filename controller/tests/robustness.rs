//! The controller on a real fleet when things go wrong (2 pods, HAProxy 2.6, 3.0, 3.2 and 3.4; pod 1 is
//! reached through a real proxy on 127.0.0.1 that can lose answers, hold applies and report
//! other capabilities, or let another writer in first): version skew, the exact retry of an
//! apply whose answer was lost, `unknown_baseline` from a wiped pod, `max_parallel`, the
//! pessimistic latch, and a second `prev_mismatch`.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use common::proxy::Proxy;
use common::*;
use haptic_controller::app::Running;
use haptic_controller::blob;
use haptic_controller::gate::GateMode;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::{free_port, on_each_version, HaproxyBin};
use haptic_protocol::api::Part;
use haptic_protocol::{ApplyRequest, Fence, Mode, PlanId};

const MAP: &str = "a.example be_app\n";

/// An agent that cannot run `map.replace` nor `map.load` (an older agent, as far as the
/// controller can tell).
fn without_map_replace(v: &mut serde_json::Value) {
    if let Some(ops) = v["capabilities"]["ops"].as_array_mut() {
        ops.retain(|o| o != "map.replace" && o != "map.load");
    }
}

fn pod_status<'a>(
    s: &'a haptic_controller::status::FleetStatus,
    url: &str,
) -> &'a haptic_controller::status::PodStatus {
    s.pods.iter().find(|p| p.url == url).unwrap_or_else(|| panic!("no pod {url} in {s:?}"))
}

on_each_version!(skew_lost_answers_wiped_pods_max_parallel_and_the_pessimistic_gate, worker_threads = 4);

async fn skew_lost_answers_wiped_pods_max_parallel_and_the_pessimistic_gate(bin: HaproxyBin) {
    eprintln!("=== {}", bin.label());
    let mut fleet = Fleet::start(&bin, 2, PodOpts::default()).await;
    let proxy = Proxy::start(fleet.pods[1].addr()).await;
    // The controller knows pod 1 only through the proxy, and meets it first as an agent
    // without map.replace.
    proxy.rules(|r| r.rewrite_state = Some(without_map_replace));
    let work = Work::new();
    let cfg_dir = work.cfg_dir();
    let state_dir = work.state_dir();
    let mut cfg = Cfg::new(free_port());
    let r1 = write_render(&cfg_dir, &cfg.files(MAP));
    let mut s = settings(&fleet, &cfg_dir, &state_dir, "ctl-a", Duration::from_secs(3600));
    s.agents = vec![proxy.url(), fleet.pods[0].url()];
    let ctl = start(s.clone()).await;
    converged(&ctl, &fleet, r1.plan_id()).await;

    // Version skew: a map change is runtime for pod 0 and the complete state and a reload for
    // pod 1, which cannot run map.replace — never a refusal.
    let r2 = write_render(&cfg_dir, &cfg.files("a.example be_app\nb.example be_app\n"));
    let st = converged(&ctl, &fleet, r2.plan_id()).await;
    assert_eq!(pod_status(&st, &fleet.pods[0].url()).mode, Some(Mode::Runtime), "{st:?}");
    let p1 = pod_status(&st, &proxy.url());
    assert_eq!(p1.mode, Some(Mode::Reload), "{st:?}");
    assert!(p1.reasons.iter().any(|r| r.contains("agent cannot run map.replace")), "{:?}", p1.reasons);
    assert_eq!(metric(&ctl, "haptic_agent_version_skew_total"), 1.0);
    proxy.rules(|r| r.rewrite_state = None);
    lost_answer_is_retried_exactly(&Rig { fleet: &fleet, proxy: &proxy, cfg_dir: &cfg_dir }, &ctl, &mut cfg).await;

    // unknown_baseline: pod 0 loses its tree (a new volume); the controller still composes
    // against what it last knew, the agent answers unknown_baseline, the controller sends the
    // complete state.
    fleet.pods[0].stop_agent().await;
    let root = fleet.pods[0].root().to_path_buf();
    std::fs::remove_dir_all(&root).unwrap();
    let init = std::process::Command::new(agent_bin())
        .args(["init", "--root"])
        .arg(&root)
        .args(["--health-bind", fleet.pods[0].health_bind()])
        .output()
        .unwrap();
    assert!(init.status.success(), "{}", String::from_utf8_lossy(&init.stderr));
    fleet.pods[0].restart_agent().await.unwrap();
    cfg.servers[0].0 = 9112;
    let r4 = write_render(&cfg_dir, &cfg.files("a.example be_app\nb.example be_app\n"));
    let st = converged(&ctl, &fleet, r4.plan_id()).await;
    assert_eq!(metric(&ctl, "haptic_apply_conflicts_total{conflict=\"unknown_baseline\"}"), 1.0);
    let p0 = pod_status(&st, &fleet.pods[0].url());
    assert_eq!(p0.mode, Some(Mode::Reload), "{st:?}");
    assert!(p0.reasons.iter().any(|r| r.contains("no applied plan")), "{:?}", p0.reasons);
    assert_eq!(fleet.state(0, true).await.files, r4.manifest(), "pod 0 holds the whole render again");
    ctl.stop().await;

    // max_parallel 1, pessimistic gate (a restart with the same identity and state).
    let mut s = s.clone();
    s.common.max_parallel = 1;
    s.common.gate = GateMode::Pessimistic;
    let ctl = start(s).await;
    converged(&ctl, &fleet, r4.plan_id()).await;
    let rig = Rig { fleet: &fleet, proxy: &proxy, cfg_dir: &cfg_dir };
    let r5 = max_parallel_holds_the_next_pod(&rig, &ctl, &mut cfg).await;
    let fixed = pessimistic_gate_keeps_a_broken_render_off(&rig, &ctl, &cfg, r5).await;
    another_writer_before_each_apply(&rig, &ctl, &work, &fixed).await;
    ctl.stop().await;
}

/// The fleet, the proxy in front of pod 1 and the render directory of one run.
#[derive(Clone, Copy)]
struct Rig<'a> {
    fleet: &'a Fleet,
    proxy: &'a Proxy,
    cfg_dir: &'a Path,
}

/// The answer to an apply is lost after it landed: the controller sends the very same
/// apply again and the agent answers it with the same ACK — the pod never fails.
async fn lost_answer_is_retried_exactly(rig: &Rig<'_>, ctl: &Running, cfg: &mut Cfg) {
    let Rig { fleet, proxy, cfg_dir } = *rig;
    let applies_before = proxy.applies_seen();
    let reloads_before = fleet.state(1, false).await.haproxy.reloads;
    proxy.rules(|r| r.drop_apply_answers = 1);
    cfg.servers[0].0 = 9111;
    let r3 = write_render(cfg_dir, &cfg.files("a.example be_app\nb.example be_app\n"));
    let st = converged(ctl, fleet, r3.plan_id()).await;
    assert_eq!(proxy.answers_dropped(), 1);
    assert_eq!(metric(ctl, "haptic_apply_retries_total"), 1.0);
    assert_eq!(pod_status(&st, &proxy.url()).mode, Some(Mode::Runtime), "{st:?}");
    assert_eq!(proxy.applies_seen(), applies_before + 2, "the apply and its retry");
    // A new fence for the same plan would have met the landed plan: prev_mismatch. The exact
    // retry got the landed apply's ACK.
    assert_eq!(metric(ctl, "haptic_apply_conflicts_total{conflict=\"prev_mismatch\"}"), 0.0);
    assert_eq!(fleet.state(1, false).await.haproxy.reloads, reloads_before, "runtime, landed once");
    for result in ["failed", "partial", "timeout"] {
        let m = format!("haptic_deployments_total{{result=\"{result}\"}}");
        assert_eq!(metric(ctl, &m), 0.0, "{m}");
    }
}

/// With `max_parallel` 1 and pod 1's apply held in flight, pod 0 (after it in the list) gets
/// nothing until the held one is answered. Returns the plan the fleet converged on.
async fn max_parallel_holds_the_next_pod(rig: &Rig<'_>, ctl: &Running, cfg: &mut Cfg) -> PlanId {
    let Rig { fleet, proxy, cfg_dir } = *rig;
    proxy.rules(|r| r.hold_applies = true);
    let seq0 = fleet.state(0, false).await.fence.unwrap().seq;
    cfg.servers[0].0 = 9113;
    let r5 = write_render(cfg_dir, &cfg.files("a.example be_app\nb.example be_app\n"));
    poll("pod 1's apply held at the proxy", || proxy.held() == 1).await;
    // The other pod's apply would follow within milliseconds without the limit; with it, it
    // cannot come before the held one is answered. (An absence is only ever seen for a
    // while: this window can make the test miss a broken limit, never fail a working one.)
    let window = Instant::now() + Duration::from_secs(2);
    while Instant::now() < window {
        assert_eq!(fleet.state(0, false).await.fence.unwrap().seq, seq0, "pod 0 got an apply beside a held one");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    proxy.release();
    converged(ctl, fleet, r5.plan_id()).await;
    r5.plan_id()
}

/// Pessimistic: a broken render never reaches a pod; the fleet stays on the last good one
/// (`r5`) until a fixed render unpins the gate. Returns the fixed config.
async fn pessimistic_gate_keeps_a_broken_render_off(rig: &Rig<'_>, ctl: &Running, cfg: &Cfg, r5: PlanId) -> Cfg {
    let Rig { fleet, proxy, cfg_dir } = *rig;
    let fences: Vec<_> = fleet.states().await.into_iter().map(|s| s.fence).collect();
    let applies = proxy.applies_seen();
    let mut broken = cfg.clone();
    broken.broken = true;
    let bad = write_render(cfg_dir, &broken.files("a.example be_app\nb.example be_app\n"));
    wait_until("the gate refused the broken render", ctl, fleet, |s| {
        (s.gate.pinned && s.gate.last_refused.as_ref().is_some_and(|r| r.plan_id == bad.plan_id())).then_some(())
    })
    .await;
    let st = ctl.status();
    assert_eq!(st.controller.target, Some(r5));
    assert_eq!(st.converged, 2);
    assert_eq!(fleet.states().await.into_iter().map(|s| s.fence).collect::<Vec<_>>(), fences, "a pod got an apply");
    assert_eq!(proxy.applies_seen(), applies);
    for p in &st.pods {
        assert_eq!(metric(ctl, &format!("haptic_apply_rejected_total{{haproxy_pod=\"{}\"}}", p.pod)), 0.0);
    }
    let mut fixed = cfg.clone();
    fixed.servers[1].1 = 40;
    let r6 = write_render(cfg_dir, &fixed.files("a.example be_app\nb.example be_app\n"));
    converged(ctl, fleet, r6.plan_id()).await;
    wait_until("unpinned", ctl, fleet, |s| (!s.gate.pinned).then_some(())).await;
    fixed
}

/// Another writer changes pod 1 right before each of the controller's applies would land
/// (with the controller's own holder, so the controller lifts its epoch and goes on): the
/// first prev_mismatch re-reads and re-diffs, the second sends the complete state.
async fn another_writer_before_each_apply(rig: &Rig<'_>, ctl: &Running, work: &Work, fixed: &Cfg) {
    let Rig { fleet, proxy, cfg_dir } = *rig;
    let rogue = |n: u32| {
        let mut c = fixed.clone();
        c.servers[1].1 = 50 + n;
        let dir = work.path().join(format!("rogue{n}"));
        std::fs::create_dir(&dir).unwrap();
        let r = write_render(&dir, &c.files("a.example be_app\nb.example be_app\n"));
        let req = ApplyRequest {
            fence: Fence { epoch: 0, seq: 0, holder: String::new() },
            baseline: None,
            plan_id: r.plan_id(),
            mode: Mode::Reload,
            reasons: vec![format!("another writer ({n})")],
            files: r.manifest().to_vec(),
            parts: r.files().map(|(p, b)| (p.clone(), Part::from_bytes(b))).collect::<BTreeMap<_, _>>(),
            batches: vec![],
            blob: blob::encode(&r),
        };
        serde_json::to_value(&req).unwrap()
    };
    let mismatches = metric(ctl, "haptic_apply_conflicts_total{conflict=\"prev_mismatch\"}");
    proxy.rules(|r| r.inject = [rogue(1), rogue(2)].into());
    let mut last = fixed.clone();
    last.servers[0].0 = 9114;
    let r7 = write_render(cfg_dir, &last.files("a.example be_app\nb.example be_app\n"));
    let st = converged(ctl, fleet, r7.plan_id()).await;
    assert_eq!(proxy.inject_left(), 0, "both writers got in");
    assert_eq!(metric(ctl, "haptic_apply_conflicts_total{conflict=\"prev_mismatch\"}") - mismatches, 2.0);
    let p1 = pod_status(&st, &proxy.url());
    assert_eq!(p1.mode, Some(Mode::Reload), "{st:?}");
    assert!(p1.reasons.iter().any(|r| r.contains("changed again while re-diffing")), "{:?}", p1.reasons);
    assert_eq!(st.controller.stood_down, None);
}

/// Polls `f` until it holds (or panics after [`DEADLINE`]).
async fn poll(what: &str, mut f: impl FnMut() -> bool) {
    let check = || {
        let held = if f() { Ok(()) } else { Err("not yet".to_string()) };
        async move { held }
    };
    haptic_e2e::wait::eventually(what, DEADLINE, check).await
}
