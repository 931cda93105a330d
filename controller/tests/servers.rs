//! A backend growing and shrinking deploys at runtime (`server.add` / `server.del`) to a real
//! fleet (2 pods of HAProxy + the agent), on HAProxy 2.6, 3.0, 3.2 and 3.4, each its own test case: no
//! worker changes, and traffic reaches exactly the servers the config names.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::*;
use haptic_e2e::net::Responder;
use haptic_e2e::pod::PodOpts;
use haptic_e2e::{free_port, http_get, on_each_version, HaproxyBin};
use haptic_protocol::Mode;

/// Sends requests to `fe` (every pod binds it) until each body in `want` answered, at most 200;
/// no other body may answer. A failure names the request and carries every agent's log.
async fn answered_by(fleet: &Fleet, fe: u16, want: &[&str]) {
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], fe));
    let want: BTreeSet<String> = want.iter().map(|s| s.to_string()).collect();
    let mut seen = BTreeSet::new();
    for i in 0..200 {
        let answer = http_get(addr, "/").await;
        let body = match &answer {
            Ok((200, body)) if want.contains(body) => body.clone(),
            other => panic!("request {i}: {other:?}, only 200 from {want:?} may answer\n{}", fleet.logs()),
        };
        seen.insert(body);
        if seen == want {
            return;
        }
    }
    panic!("only {seen:?} of {want:?} answered in 200 requests\n{}", fleet.logs());
}

on_each_version!(servers_added_and_removed_deploy_as_runtime, worker_threads = 4);
async fn servers_added_and_removed_deploy_as_runtime(bin: HaproxyBin) {
    let label = bin.label();
    let fleet = Fleet::start(&bin, 2, PodOpts::default()).await;
    let (a, b, c) = (Responder::start("A").await, Responder::start("B").await, Responder::start("C").await);
    let work = Work::new();
    let cfg_dir = work.cfg_dir();
    let mut cfg = Cfg::new(free_port());
    cfg.servers = vec![(a.port, 10, false)];
    let r1 = write_render(&cfg_dir, &cfg.files("a.example be_app\n"));
    let ctl = start(settings(&fleet, &cfg_dir, &work.state_dir(), "ctl-a", Duration::from_secs(3600))).await;
    converged(&ctl, &fleet, r1.plan_id()).await;
    answered_by(&fleet, cfg.fe, &["A"]).await;
    let gens = fleet.generations().await;

    // Two servers more: runtime on every pod, the same workers, and both take traffic.
    cfg.servers = vec![(a.port, 10, false), (b.port, 10, false), (c.port, 10, false)];
    let r2 = write_render(&cfg_dir, &cfg.files("a.example be_app\n"));
    let s = converged(&ctl, &fleet, r2.plan_id()).await;
    for p in &s.pods {
        assert_eq!(p.mode, Some(Mode::Runtime), "{label} {}: {:?}\n{}", p.pod, p.reasons, fleet.logs());
        assert!(p.reasons.iter().any(|r| r.starts_with("backend be_app: server SRV_3 added")), "{:?}", p.reasons);
    }
    assert_eq!(fleet.generations().await, gens, "{label}: adding servers reloaded a pod\n{}", fleet.logs());
    answered_by(&fleet, cfg.fe, &["A", "B", "C"]).await;

    // Back to one (a different one): runtime again, and only it answers.
    cfg.servers = vec![(c.port, 10, false)];
    let r3 = write_render(&cfg_dir, &cfg.files("a.example be_app\n"));
    let s = converged(&ctl, &fleet, r3.plan_id()).await;
    for p in &s.pods {
        assert_eq!(p.mode, Some(Mode::Runtime), "{label} {}: {:?}\n{}", p.pod, p.reasons, fleet.logs());
    }
    assert_eq!(fleet.generations().await, gens, "{label}: removing servers reloaded a pod\n{}", fleet.logs());
    // SRV_1 now points at C (a server.set), SRV_2 and SRV_3 are gone.
    answered_by(&fleet, cfg.fe, &["C"]).await;
    ctl.stop().await;
}
