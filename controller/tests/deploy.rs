//! Deploying to a real fleet (3 pods: HAProxy 2.6, 3.0, 3.2 and 3.4 + the agent): runtime endpoint and
//! map changes without reloads, paced frontend reloads, render bursts, the gate.

mod common;

use std::time::Duration;

use common::*;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::{free_port, on_each_version, HaproxyBin};
use haptic_protocol::Mode;

on_each_version!(runtime_reloads_bursts_and_the_gate, worker_threads = 4);

async fn runtime_reloads_bursts_and_the_gate(bin: HaproxyBin) {
    eprintln!("=== {}", bin.label());
    let opts = PodOpts { min_reload_interval: "2s".into(), ..Default::default() };
    let fleet = Fleet::start(&bin, 3, opts).await;
    let work = Work::new();
    let cfg_dir = work.cfg_dir();
    let mut cfg = Cfg::new(free_port());
    let r1 = write_render(&cfg_dir, &cfg.files("a.example be_app\n"));
    let ctl = start(settings(&fleet, &cfg_dir, &work.state_dir(), "ctl-a", Duration::from_secs(3600))).await;

    // First deploy: from the bootstrap tree, a reload.
    converged(&ctl, &fleet, r1.plan_id()).await;
    let gens = fleet.generations().await;

    // Endpoints only: every pod ACKs runtime, no worker pid changes anywhere.
    cfg.servers = vec![(9011, 20, false), (9002, 10, false)];
    let r2 = write_render(&cfg_dir, &cfg.files("a.example be_app\n"));
    let s = converged(&ctl, &fleet, r2.plan_id()).await;
    for p in &s.pods {
        assert_eq!(p.mode, Some(Mode::Runtime), "{}: {:?}", p.pod, p.reasons);
        assert!(p.reasons.iter().any(|r| r.contains("SRV_1")), "{:?}", p.reasons);
    }
    assert_eq!(fleet.generations().await, gens, "an endpoint change reloaded a pod");

    // Map contents: runtime too.
    let r3 = write_render(&cfg_dir, &cfg.files("a.example be_app\nb.example be_app\n"));
    let s = converged(&ctl, &fleet, r3.plan_id()).await;
    assert!(s.pods.iter().all(|p| p.mode == Some(Mode::Runtime)), "{s:?}");
    assert_eq!(fleet.generations().await, gens, "a map change reloaded a pod");
    assert!(metric(&ctl, "haptic_reloads_avoided_total") >= 6.0);

    // A `defaults` change: one verified (paced) reload per pod, counted under its cause.
    let defaults_before = metric(&ctl, "haptic_reload_causes_total{cause=\"defaults\"}");
    cfg.timeout_client = 6;
    let r4 = write_render(&cfg_dir, &cfg.files("a.example be_app\nb.example be_app\n"));
    let s = converged(&ctl, &fleet, r4.plan_id()).await;
    assert!(s.pods.iter().all(|p| p.mode == Some(Mode::Reload)), "{s:?}");
    let after = fleet.generations().await;
    for (i, (b, a)) in gens.iter().zip(&after).enumerate() {
        assert_eq!(a.1, b.1 + 1, "pod {i}: exactly one reload");
        assert_ne!(a.0, b.0, "pod {i}: a new worker");
    }
    assert_eq!(metric(&ctl, "haptic_reload_causes_total{cause=\"defaults\"}") - defaults_before, 3.0);
    assert_eq!(metric(&ctl, "haptic_reload_causes_total{cause=\"frontend\"}"), 0.0);

    // Ten renders while a deployment is in flight: they coalesce in the one pending slot, and
    // the fleet ends on the last with two deployments. Pod 0's agent is stopped (SIGSTOP)
    // through the burst, so the first deployment stays in flight, however fast the machine;
    // it resumes once the gate has passed the last render (which was then the pending one).
    let before = ctl.status().controller.deployments;
    let agent0 = nix::unistd::Pid::from_raw(fleet.pods[0].agent_pid().expect("pod 0's agent runs") as i32);
    nix::sys::signal::kill(agent0, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let mut last = r4.clone();
    for n in 0..10u32 {
        cfg.timeout_client = 10 + n;
        last = write_render(&cfg_dir, &cfg.files("a.example be_app\nb.example be_app\n"));
        tokio::time::sleep(Duration::from_millis(100)).await; // pacing the writer, not synchronising
    }
    let last_id = last.plan_id();
    wait_until("the gate passed the last render", &ctl, &fleet, |s| (s.gate.last_good == Some(last_id)).then_some(()))
        .await;
    nix::sys::signal::kill(agent0, nix::sys::signal::Signal::SIGCONT).unwrap();
    converged(&ctl, &fleet, last.plan_id()).await;
    let deployments = ctl.status().controller.deployments - before;
    eprintln!("ten renders -> {deployments} deployments");
    assert!(deployments <= 2, "{deployments} deployments for 10 renders: one in flight, the latest pending");

    // A broken render: refused by the gate, no pod changes, the fleet pinned and serving.
    let good = fleet.states().await;
    let before = ctl.status();
    let mut broken = cfg.clone();
    broken.broken = true;
    let bad = write_render(&cfg_dir, &broken.files("a.example be_app\nb.example be_app\n"));
    wait_until("the gate pinned", &ctl, &fleet, |s| {
        (s.gate.pinned && s.gate.last_refused.as_ref().is_some_and(|r| r.plan_id == bad.plan_id())).then_some(())
    })
    .await;
    let refusal = ctl.status().gate.last_refused.unwrap().output;
    assert!(refusal.contains("no-such-algorithm") || refusal.contains("balance"), "{refusal}");
    // Whatever the optimistic dispatch did, every pod ends on the last good plan.
    wait_until("pods back on the last good plan", &ctl, &fleet, |s| {
        (s.controller.target == Some(last.plan_id())).then_some(())
    })
    .await;
    let now = fleet.states().await;
    for (g, n) in good.iter().zip(&now) {
        assert_eq!(n.applied.as_ref().map(|a| a.plan_id), g.applied.as_ref().map(|a| a.plan_id));
        assert_eq!(n.haproxy.worker_pid, g.haproxy.worker_pid, "a pod changed for a broken render");
    }
    // The optimistic dispatch reached the pods, whose own `haproxy -c` refused it: a NACK in
    // HAProxy's words on every pod, counted per pod.
    let s = ctl.status();
    for p in &s.pods {
        let err = p.last_error.as_deref().unwrap_or_default();
        assert!(err.contains("balance"), "{}: {err:?}", p.pod);
        assert_eq!(metric(&ctl, &format!("haptic_apply_rejected_total{{haproxy_pod=\"{}\"}}", p.pod)), 1.0);
        // The refused apply changed nothing on the pod: its last apply, mode and reasons are
        // still those of the plan it runs; the refusal is its error.
        let was = before.pods.iter().find(|b| b.pod == p.pod).unwrap();
        assert_eq!((&p.last_apply_at, p.mode, &p.reasons), (&was.last_apply_at, was.mode, &was.reasons), "{}", p.pod);
    }
    assert_eq!(metric(&ctl, "haptic_gate_pinned"), 1.0);
    assert!(metric(&ctl, "haptic_gate_rejections_total") >= 1.0);
    let (st, body) = haptic_e2e::http_get(format!("127.0.0.1:{}", cfg.fe).parse().unwrap(), "/").await.unwrap();
    assert_eq!(st, 503, "the fleet keeps serving (no server answers on the slots): {body}");

    // The next good render deploys and unpins.
    cfg.servers = vec![(9021, 30, false), (9002, 10, false)];
    let r5 = write_render(&cfg_dir, &cfg.files("a.example be_app\nb.example be_app\n"));
    converged(&ctl, &fleet, r5.plan_id()).await;
    wait_until("unpinned", &ctl, &fleet, |s| (!s.gate.pinned).then_some(())).await;
    assert_eq!(metric(&ctl, "haptic_gate_pinned"), 0.0);

    // The admin server answers the same status over HTTP.
    let url = format!("http://{}/status", ctl.admin_addr());
    let v: serde_json::Value = reqwest::get(&url).await.unwrap().json().await.unwrap();
    assert_eq!(v["total"], 3);
    assert_eq!(v["converged"], 3);
    assert!(v["gate"]["pinned"] == false && v["pods"].as_array().unwrap().len() == 3, "{v}");
    let m = reqwest::get(format!("http://{}/metrics", ctl.admin_addr())).await.unwrap().text().await.unwrap();
    assert!(m.contains("haptic_deployments_total{result=\"success\"}"), "{m}");
    assert_eq!(reqwest::get(format!("http://{}/healthz", ctl.admin_addr())).await.unwrap().status(), 200);
    ctl.stop().await;
}
