//! Paced reloads and the deployment timeout on a real fleet (HAProxy 2.6, 3.0, 3.2 and 3.4): a render the
//! pods can take at runtime is never held behind their scheduled reload, and a deployment stuck
//! on a pod that never answers is cancelled by the deployment timeout and retried.

mod common;

use std::time::Duration;

use common::*;
use haptic_controller::status::DeploymentResult;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::wait::poll;
use haptic_e2e::{free_port, on_each_version, HaproxyBin};
use haptic_protocol::{PlanId, StateResponse};

const MAP: &str = "a.example be_app\n";

/// Polls every pod's own state until `f` holds for all of them (or panics after [`DEADLINE`]).
async fn pods_until(what: &str, fleet: &Fleet, f: impl Fn(&StateResponse) -> bool) -> Vec<StateResponse> {
    let check = || async {
        let states = fleet.states().await;
        if states.iter().all(&f) {
            Ok(states)
        } else {
            Err(format!("{states:#?}"))
        }
    };
    poll(what, DEADLINE, check).await.unwrap_or_else(|e| panic!("{e}\n{}", fleet.logs()))
}

fn applied(s: &StateResponse) -> Option<PlanId> {
    s.applied.as_ref().map(|a| a.plan_id)
}

on_each_version!(runtime_renders_reach_the_pods_before_their_scheduled_reload, worker_threads = 4);

async fn runtime_renders_reach_the_pods_before_their_scheduled_reload(bin: HaproxyBin) {
    eprintln!("=== {}", bin.label());
    // One reload a minute: longer than any deadline here, so nothing below can pass by
    // waiting for the reload slot.
    let opts = PodOpts { min_reload_interval: "60s".into(), ..Default::default() };
    let fleet = Fleet::start(&bin, 2, opts).await;
    let work = Work::new();
    let cfg_dir = work.cfg_dir();
    let mut cfg = Cfg::new(free_port());
    let r1 = write_render(&cfg_dir, &cfg.files(MAP));
    let ctl = start(settings(&fleet, &cfg_dir, &work.state_dir(), "ctl-a", Duration::from_secs(3600))).await;
    // The first reload of each pod runs at once.
    converged(&ctl, &fleet, r1.plan_id()).await;

    // A frontend change: every pod swaps its tree and schedules the reload a minute out.
    cfg.timeout_client = 6;
    let r2 = write_render(&cfg_dir, &cfg.files(MAP));
    pods_until("r2 applied with its reload scheduled", &fleet, |s| {
        applied(s) == Some(r2.plan_id()) && s.pending_reload.is_some()
    })
    .await;
    wait_until("the deployment of r2 ended", &ctl, &fleet, |s| {
        (s.controller.target == Some(r2.plan_id()) && s.controller.deployments >= 2).then_some(())
    })
    .await;

    // An endpoint change right after: runtime on top of the scheduled plan, so it goes out at
    // once instead of waiting for the reload slot (a minute away, past the deadline).
    cfg.servers[0].0 = 9401;
    let r3 = write_render(&cfg_dir, &cfg.files(MAP));
    let states = pods_until("r3 applied on every pod", &fleet, |s| applied(s) == Some(r3.plan_id())).await;
    for s in &states {
        assert!(s.pending_reload.is_some(), "the reload was still scheduled: {s:?}");
        assert_eq!(s.running.as_ref().map(|r| r.plan_id), Some(r1.plan_id()), "{s:?}");
    }
    wait_until("every pod ACKed r3 at runtime", &ctl, &fleet, |s| {
        s.pods
            .iter()
            .all(|p| p.applied == Some(r3.plan_id()) && p.mode == Some(haptic_protocol::Mode::Runtime))
            .then_some(())
    })
    .await;
    ctl.stop().await;
}

on_each_version!(a_stuck_deployment_is_cancelled_by_the_deployment_timeout_and_retried, worker_threads = 4);

async fn a_stuck_deployment_is_cancelled_by_the_deployment_timeout_and_retried(bin: HaproxyBin) {
    // A pod whose agent accepts connections and never answers.
    let black_hole = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hole_url = format!("http://{}", black_hole.local_addr().unwrap());
    let hole = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = black_hole.accept().await {
            held.push(c);
        }
    });
    eprintln!("=== {}", bin.label());
    let fleet = Fleet::start(&bin, 1, PodOpts::default()).await;
    let work = Work::new();
    let cfg_dir = work.cfg_dir();
    let cfg = Cfg::new(free_port());
    let r1 = write_render(&cfg_dir, &cfg.files(MAP));
    let mut s = settings(&fleet, &cfg_dir, &work.state_dir(), "ctl-a", Duration::from_secs(3600));
    s.agents = vec![fleet.pods[0].url(), hole_url.clone()];
    s.common.deployment_timeout = Duration::from_secs(2);
    s.common.sync_timeout = Duration::from_secs(600);
    let ctl = start(s).await;
    // The deployment cannot end (the hole never answers within the sync timeout): the safety
    // net cancels it, and the retry finds the real pod on the render.
    wait_until("two deployments timed out", &ctl, &fleet, |_| {
        (metric(&ctl, "haptic_deployments_total{result=\"timeout\"}") >= 2.0).then_some(())
    })
    .await;
    let real = fleet.pods[0].url();
    wait_until("the real pod converged", &ctl, &fleet, |s| {
        s.pods
            .iter()
            .find(|p| p.url == real)
            .filter(|p| p.phase == haptic_controller::status::Phase::Converged && p.running == Some(r1.plan_id()))
            .map(|_| ())
    })
    .await;
    let st = ctl.status();
    assert_eq!((st.converged, st.total), (1, 2), "{st:?}");
    assert_eq!(st.controller.last_deployment, Some(DeploymentResult::Timeout), "{st:?}");
    ctl.stop().await;
    hole.abort();
}
