//! The end-to-end scenarios, written once against [`Cluster`] and run on every backend.
//!
//! Each step asserts on traffic, on the resource's per-pod status and on HAProxy's worker pids
//! (through the agents), never on timing. With `narrate`, the status table is printed after
//! every step (the Kubernetes demo). It must never reach past the trait and the apiserver.

use std::collections::BTreeMap;
use std::time::Duration;

use serde_json::Value;

use super::{
    condition, converged_on, eventually, put_config_map, put_haproxy_config, status, status_table, wait_converged,
    worker_pids, Cluster, ClusterError, Result,
};

/// The scenarios' configuration: a body, server slots and a map.
#[derive(Debug, Clone)]
struct Desired {
    body: String,
    /// Server slots: `Some(port)` enabled on that port, `None` parked (disabled).
    slots: Vec<Option<u16>>,
    map: String,
    broken: bool,
}

impl Desired {
    fn text(&self, bind: &str, health: Option<&str>) -> String {
        let mut s = format!(
            "global\n    default-path config\n\n\
             defaults\n    mode http\n    timeout connect 2s\n    timeout client 5s\n    timeout server 5s\n\n\
             frontend fe_main\n    {bind}\n\
             \x20   http-request return status 200 content-type text/plain string \"{}\" if {{ path /hello }}\n\
             \x20   http-request return status 200 content-type text/plain lf-string \"%[req.hdr(host),lower,map(maps/hosts.map,none)]\" if {{ path /route }}\n\
             {}\
             \x20   default_backend be_app\n\n\
             backend be_app\n    balance roundrobin\n",
            self.body,
            if self.broken { "    this-is-not-a-keyword at-all\n" } else { "" }
        );
        for (i, slot) in self.slots.iter().enumerate() {
            match slot {
                Some(p) => s.push_str(&format!("    server s{} 127.0.0.1:{p} weight 10\n", i + 1)),
                None => s.push_str(&format!("    server s{} 127.0.0.1:1 weight 10 disabled\n", i + 1)),
            }
        }
        if let Some(h) = health {
            s.push('\n');
            s.push_str(h);
        }
        s
    }
}

struct Run<'a, C: Cluster> {
    c: &'a mut C,
    n: usize,
    want: Desired,
    narrate: bool,
    step: usize,
}

impl<C: Cluster> Run<'_, C> {
    async fn push(&mut self) -> Result<()> {
        let client = self.c.client();
        let text = self.want.text(&self.c.bind_line(), self.c.health_frontend().as_deref());
        put_config_map(&client, self.c.namespace(), &text, &self.want.map).await
    }

    async fn status(&self) -> Result<Value> {
        status(&self.c.client(), self.c.namespace()).await
    }

    async fn converged(&self, n: usize, not: Option<&Value>) -> Result<Value> {
        wait_converged(&self.c.client(), self.c.namespace(), n, not).await
    }

    async fn step(&mut self, title: &str) -> Result<()> {
        self.step += 1;
        if self.narrate {
            println!("\n== {}. {title}", self.step);
            // On a real cluster the demo shows what an operator types, too.
            if let Some(kubectl) = std::env::var_os("HAPTIC_KUBECTL") {
                let out = std::process::Command::new(kubectl).args(["-n", self.c.namespace(), "get", "hapc"]).output();
                if let Ok(o) = out {
                    println!("$ kubectl get hapc\n{}", String::from_utf8_lossy(&o.stdout).trim_end());
                }
            }
            println!("{}", status_table(&self.status().await?));
        } else {
            println!("ok {}. {title}", self.step);
        }
        Ok(())
    }

    /// Every pod answers `/hello` with `body`.
    async fn serves(&self, body: &str) -> Result<()> {
        for p in self.c.haproxy_pods().await? {
            let got = self.c.get(&p, "/hello").await?;
            if got != (200, body.to_string()) {
                return Err(ClusterError(format!("pod {p} answered {got:?}, wanted 200 {body:?}")));
            }
        }
        Ok(())
    }

    fn modes(s: &Value) -> Vec<String> {
        s["deployedToPods"]
            .as_array()
            .map(|v| v.iter().map(|p| p["mode"].as_str().unwrap_or("-").to_string()).collect())
            .unwrap_or_default()
    }

    fn ensure(ok: bool, what: impl FnOnce() -> String) -> Result<()> {
        if ok {
            Ok(())
        } else {
            Err(ClusterError(what()))
        }
    }

    async fn reloads(&self) -> Result<BTreeMap<String, u64>> {
        let mut out = BTreeMap::new();
        for p in self.c.haproxy_pods().await? {
            out.insert(p.clone(), self.c.agent_state(&p).await?["haproxy"]["reloads"].as_u64().unwrap_or(0));
        }
        Ok(out)
    }
}

/// Runs every scenario on `c`, which starts with `n` HAProxy pods, two controller replicas and
/// no `HAProxyConfig` yet, or the chart's (its `podSelector` and `agent` are kept). `agent_port` is the agents' port for `spec.agent.port`.
pub async fn run_all<C: Cluster>(c: &mut C, n: usize, agent_port: u16, narrate: bool) -> Result<()> {
    let want =
        Desired { body: "v1".into(), slots: vec![Some(9001), None, None], map: "a.example a\n".into(), broken: false };
    let mut r = Run { c, n, want, narrate, step: 0 };

    // 1. First deploy (over the chart's own first plan on a real cluster).
    let client = r.c.client();
    let earlier = status(&client, r.c.namespace()).await.ok().map(|s| s["planId"].clone()).filter(|p| !p.is_null());
    r.push().await?;
    put_haproxy_config(&client, r.c.namespace(), agent_port, "4s").await?;
    let s = r.converged(r.n, earlier.as_ref()).await?;
    r.serves("v1").await?;
    Run::<C>::ensure(s["deployedToPods"].as_array().map_or(0, Vec::len) == n, || format!("{s:#}"))?;
    r.step("first deploy: every pod converged and serves the render").await?;
    let pids = worker_pids(r.c).await?;

    // 2. Endpoint scale-up and scale-down through the config: runtime, no reload.
    for slots in [vec![Some(9001), Some(9002), Some(9003)], vec![Some(9001), None, None]] {
        let before = r.status().await?["planId"].clone();
        r.want.slots = slots;
        r.push().await?;
        let s = r.converged(r.n, Some(&before)).await?;
        let modes = Run::<C>::modes(&s);
        Run::<C>::ensure(modes.iter().all(|m| m == "runtime"), || format!("modes {modes:?}"))?;
        Run::<C>::ensure(worker_pids(r.c).await? == pids, || "an endpoint change reloaded a pod".into())?;
    }
    r.step("endpoints scaled up and down: runtime, same worker pids").await?;

    // 3. A map change: runtime.
    let before = r.status().await?["planId"].clone();
    r.want.map = "a.example a\nb.example b\n".into();
    r.push().await?;
    let s = r.converged(r.n, Some(&before)).await?;
    Run::<C>::ensure(Run::<C>::modes(&s).iter().all(|m| m == "runtime"), || format!("{s:#}"))?;
    Run::<C>::ensure(worker_pids(r.c).await? == pids, || "a map change reloaded a pod".into())?;
    r.step("map change: runtime, same worker pids").await?;

    // 4. A frontend change: one paced reload per pod.
    let reloads = r.reloads().await?;
    let before = r.status().await?["planId"].clone();
    r.want.body = "v2".into();
    r.push().await?;
    let s = r.converged(r.n, Some(&before)).await?;
    r.serves("v2").await?;
    Run::<C>::ensure(Run::<C>::modes(&s).iter().all(|m| m == "reload"), || format!("{s:#}"))?;
    let after = r.reloads().await?;
    for (p, n) in &after {
        Run::<C>::ensure(*n == reloads.get(p).copied().unwrap_or(0) + 1, || {
            format!("pod {p}: reloads {reloads:?} -> {after:?}")
        })?;
    }
    r.step("frontend change: exactly one reload per pod").await?;

    // 5. A broken config: refused by the gate, the fleet keeps serving, HAProxy's words shown.
    let good = r.status().await?["planId"].clone();
    r.want.broken = true;
    r.push().await?;
    let ns = r.c.namespace().to_string();
    let s = eventually("Validated=False", Duration::from_secs(60), || {
        let client = client.clone();
        let ns = ns.clone();
        async move {
            let s = status(&client, &ns).await.ok()?;
            condition(&s, "Validated").is_some_and(|c| c["status"] == "False").then_some(s)
        }
    })
    .await?;
    let words = condition(&s, "Validated").map(|c| c["message"].to_string()).unwrap_or_default();
    Run::<C>::ensure(words.contains("[ALERT]"), || format!("no HAProxy words in {words}"))?;
    r.serves("v2").await?;
    Run::<C>::ensure(s["lastGoodPlanId"] == good, || format!("{s:#}"))?;
    r.step("broken config: refused, the fleet keeps serving the last good plan").await?;
    r.want.broken = false;
    r.want.body = "v3".into();
    r.push().await?;
    r.converged(r.n, Some(&good)).await?;
    r.serves("v3").await?;
    r.step("config fixed: the fleet moves on").await?;

    // 6. Drift: a file edited in a pod is rewritten by the next drift pass.
    let pods = r.c.haproxy_pods().await?;
    let victim = pods[0].clone();
    let before_at = r.c.agent_state(&victim).await?["applied"]["at"].clone();
    r.c.edit_file_in_pod(&victim, "maps/hosts.map", "edited.behind the-back\n").await?;
    eventually("the drift pass to rewrite the edited pod", Duration::from_secs(60), || async {
        let st = r.c.agent_state(&victim).await.ok()?;
        (st["applied"]["at"] != before_at).then_some(())
    })
    .await?;
    r.converged(r.n, None).await?;
    r.step("drift: the edited file was rewritten").await?;

    // 7. HAProxy pods scale n -> n+2 -> n.
    r.c.scale_haproxy(n + 2).await?;
    r.converged(n + 2, None).await?;
    r.serves("v3").await?;
    r.c.scale_haproxy(n).await?;
    r.converged(r.n, None).await?;
    r.step(&format!("HAProxy pods scaled {n} -> {} -> {n}: new pods converged, removed pods left the status", n + 2))
        .await?;

    // 8. Agent container restart: HAProxy untouched, pod still converged.
    let pids = worker_pids(r.c).await?;
    let p0 = r.c.haproxy_pods().await?[0].clone();
    r.c.restart_agent(&p0).await?;
    r.converged(r.n, None).await?;
    Run::<C>::ensure(worker_pids(r.c).await? == pids, || "an agent restart reloaded HAProxy".into())?;
    r.step("agent container restarted: HAProxy untouched").await?;

    // 9. The leader is killed: the other replica takes over without a reload.
    let pids = worker_pids(r.c).await?;
    let old = r.status().await?["leader"].clone();
    let killed = r.c.kill_leader().await?;
    let s = eventually("another leader", Duration::from_secs(60), || async {
        let s = r.status().await.ok()?;
        (s["leader"]["identity"] != killed.as_str() && s["leader"]["epoch"].as_u64()? > old["epoch"].as_u64()?)
            .then_some(s)
    })
    .await?;
    let _ = s;
    r.converged(r.n, None).await?;
    let after = worker_pids(r.c).await?;
    Run::<C>::ensure(after == pids, || format!("the failover reloaded a pod: worker pids {pids:?} -> {after:?}"))?;
    r.step("leader killed: another replica leads, no pod reloaded").await?;

    // 10. HAProxy worker killed: the container restarts on the latest plan (after the failover
    // step: the agent reloads a HAProxy that came back, to know what its worker runs).
    let p0 = r.c.haproxy_pods().await?[0].clone();
    r.c.kill_haproxy_worker(&p0).await?;
    let s = r.converged(r.n, None).await?;
    r.serves("v3").await?;
    let st = r.c.agent_state(&p0).await?;
    Run::<C>::ensure(st["running"]["plan_id"] == s["planId"], || format!("{st:#}"))?;
    r.step("HAProxy worker killed: restarted on the current plan").await?;

    // 11. Every HAProxy pod replaced (a rolling update).
    let before: Vec<String> = r.c.haproxy_pods().await?;
    r.c.replace_all_haproxy().await?;
    let s = r.converged(r.n, None).await?;
    r.serves("v3").await?;
    let _ = (before, s);
    r.step("every HAProxy pod replaced: the new ones converged").await?;

    // 12. Traffic under churn: six endpoint changes; through each, requests go to every pod until
    // the fleet has converged on it (and at least `MIN_ROUNDS` rounds were sent), zero failed.
    const CHANGES: usize = 6;
    const MIN_ROUNDS: usize = 20;
    const MAX_ROUNDS: usize = 2000;
    let (mut ok, mut failed) = (0u64, Vec::new());
    let pods = r.c.haproxy_pods().await?;
    for change in 1..=CHANGES {
        let before = r.status().await?["planId"].clone();
        r.want.slots = if change % 2 == 1 { vec![Some(9001), Some(9005), None] } else { vec![Some(9001), None, None] };
        r.push().await?;
        let mut rounds = 0;
        while rounds < MAX_ROUNDS {
            for p in &pods {
                match r.c.get(p, "/hello").await {
                    Ok((200, b)) if b == "v3" => ok += 1,
                    other => failed.push(format!("change {change}, {p}: {other:?}")),
                }
            }
            rounds += 1;
            if rounds >= MIN_ROUNDS && converged_on(&r.status().await?, r.n, Some(&before)) {
                break;
            }
        }
        // Past the request bound the fleet gets the usual deadline to converge, without traffic.
        r.converged(r.n, Some(&before)).await?;
    }
    Run::<C>::ensure(failed.is_empty(), || format!("{} failed: {failed:?}", failed.len()))?;
    println!("   traffic under churn: {ok} requests, 0 failed, {CHANGES} endpoint changes");
    r.step("traffic under endpoint churn: no failed request").await?;
    Ok(())
}
