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
    wait_converged_on_current_pods, worker_pids, Cluster, ClusterError, Result,
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
    /// The number in the body the fleet serves (`v1`, `v2`, …).
    version: u32,
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

/// The steps of the shared scenarios, in the order a run takes them. The first deploy is not
/// among them: every run starts with it, since every step needs a converged fleet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Endpoints scaled up and down through the config: runtime, no reload.
    Endpoints,
    /// A map change: runtime.
    Map,
    /// A frontend change: exactly one paced reload per pod.
    Reload,
    /// A broken config refused by the gate while the fleet serves the last good plan; then fixed.
    Broken,
    /// A file edited in a pod, rewritten by the next drift pass.
    Drift,
    /// HAProxy pods scaled n -> n+2 -> n.
    ScalePods,
    /// The agent container restarted: HAProxy untouched.
    AgentRestart,
    /// The leader killed: another replica leads, no pod reloaded.
    Failover,
    /// HAProxy's worker killed: restarted on the current plan.
    WorkerKill,
    /// Every HAProxy pod replaced.
    ReplacePods,
    /// Traffic under endpoint churn: no failed request.
    Churn,
}

impl Step {
    /// Every step, in run order.
    pub const ALL: [Step; 11] = [
        Step::Endpoints,
        Step::Map,
        Step::Reload,
        Step::Broken,
        Step::Drift,
        Step::ScalePods,
        Step::AgentRestart,
        Step::Failover,
        Step::WorkerKill,
        Step::ReplacePods,
        Step::Churn,
    ];

    /// The name `HAPTIC_E2E_STEPS` selects it by.
    pub fn name(self) -> &'static str {
        match self {
            Step::Endpoints => "endpoints",
            Step::Map => "map",
            Step::Reload => "reload",
            Step::Broken => "broken",
            Step::Drift => "drift",
            Step::ScalePods => "scale-pods",
            Step::AgentRestart => "agent-restart",
            Step::Failover => "failover",
            Step::WorkerKill => "worker-kill",
            Step::ReplacePods => "replace-pods",
            Step::Churn => "churn",
        }
    }
}

/// Which steps a run takes: all of them, or the ones named in `HAPTIC_E2E_STEPS`
/// (comma-separated; the shared steps' names and the real-cluster ones).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection(Option<std::collections::BTreeSet<String>>);

/// The environment variable that selects steps.
pub const STEPS_VAR: &str = "HAPTIC_E2E_STEPS";

impl Selection {
    /// Every step.
    pub fn all() -> Self {
        Selection(None)
    }

    /// The steps named in `spec` (comma-separated, blanks ignored, empty = all); a name not in
    /// `known` is an error that lists the known ones.
    pub fn parse(spec: &str, known: &[&str]) -> Result<Self> {
        let names: std::collections::BTreeSet<String> =
            spec.split(',').map(str::trim).filter(|n| !n.is_empty()).map(String::from).collect();
        if names.is_empty() {
            return Ok(Selection::all());
        }
        if let Some(bad) = names.iter().find(|n| !known.contains(&n.as_str())) {
            return Err(ClusterError(format!("{STEPS_VAR}: no step {bad:?}; the steps are {}", known.join(", "))));
        }
        Ok(Selection(Some(names)))
    }

    /// The selection in `HAPTIC_E2E_STEPS` (all steps when unset), checked against `known`.
    pub fn from_env(known: &[&str]) -> Result<Self> {
        match std::env::var(STEPS_VAR) {
            Ok(spec) => Selection::parse(&spec, known),
            Err(_) => Ok(Selection::all()),
        }
    }

    /// Whether the step called `name` runs.
    pub fn wants(&self, name: &str) -> bool {
        self.0.as_ref().is_none_or(|names| names.contains(name))
    }
}

/// The names of the shared steps.
pub fn step_names() -> Vec<&'static str> {
    Step::ALL.iter().map(|s| s.name()).collect()
}

/// Runs every scenario on `c`, which starts with `n` HAProxy pods, two controller replicas and
/// no `HAProxyConfig` yet, or the chart's (its `podSelector` and `agent` are kept). `agent_port` is the agents' port for `spec.agent.port`.
pub async fn run_all<C: Cluster>(c: &mut C, n: usize, agent_port: u16, narrate: bool) -> Result<()> {
    run_selected(c, n, agent_port, narrate, &Selection::all()).await
}

/// Runs the first deploy, then the steps `selection` wants, in run order (as [`run_all`]).
pub async fn run_selected<C: Cluster>(
    c: &mut C,
    n: usize,
    agent_port: u16,
    narrate: bool,
    selection: &Selection,
) -> Result<()> {
    let want =
        Desired { body: "v1".into(), slots: vec![Some(9001), None, None], map: "a.example a\n".into(), broken: false };
    let mut r = Run { c, n, want, narrate, step: 0, version: 1 };
    r.first_deploy(agent_port).await?;
    for step in Step::ALL.into_iter().filter(|s| selection.wants(s.name())) {
        match step {
            Step::Endpoints => r.endpoints().await?,
            Step::Map => r.map().await?,
            Step::Reload => r.reload().await?,
            Step::Broken => r.broken().await?,
            Step::Drift => r.drift().await?,
            Step::ScalePods => r.scale_pods().await?,
            Step::AgentRestart => r.agent_restart().await?,
            Step::Failover => r.failover().await?,
            Step::WorkerKill => r.worker_kill().await?,
            Step::ReplacePods => r.replace_pods().await?,
            Step::Churn => r.churn().await?,
        }
    }
    Ok(())
}

impl<C: Cluster> Run<'_, C> {
    /// A new body, `v2`, `v3`, …, for a change every pod must serve.
    fn next_body(&mut self) -> String {
        self.version += 1;
        format!("v{}", self.version)
    }

    /// 1. First deploy (over the chart's own first plan on a real cluster).
    async fn first_deploy(&mut self, agent_port: u16) -> Result<()> {
        let client = self.c.client();
        let earlier =
            status(&client, self.c.namespace()).await.ok().map(|s| s["planId"].clone()).filter(|p| !p.is_null());
        self.push().await?;
        put_haproxy_config(&client, self.c.namespace(), agent_port, "4s").await?;
        let s = self.converged(self.n, earlier.as_ref()).await?;
        self.serves(&self.want.body).await?;
        let n = self.n;
        Run::<C>::ensure(s["deployedToPods"].as_array().map_or(0, Vec::len) == n, || format!("{s:#}"))?;
        self.step("first deploy: every pod converged and serves the render").await
    }

    async fn endpoints(&mut self) -> Result<()> {
        let pids = worker_pids(self.c).await?;
        for slots in [vec![Some(9001), Some(9002), Some(9003)], vec![Some(9001), None, None]] {
            let before = self.status().await?["planId"].clone();
            self.want.slots = slots;
            self.push().await?;
            let s = self.converged(self.n, Some(&before)).await?;
            let modes = Run::<C>::modes(&s);
            Run::<C>::ensure(modes.iter().all(|m| m == "runtime"), || format!("modes {modes:?}"))?;
            Run::<C>::ensure(worker_pids(self.c).await? == pids, || "an endpoint change reloaded a pod".into())?;
        }
        self.step("endpoints scaled up and down: runtime, same worker pids").await
    }

    async fn map(&mut self) -> Result<()> {
        let pids = worker_pids(self.c).await?;
        let before = self.status().await?["planId"].clone();
        let extra = format!("m{}.example b\n", self.step);
        self.want.map.push_str(&extra);
        self.push().await?;
        let s = self.converged(self.n, Some(&before)).await?;
        Run::<C>::ensure(Run::<C>::modes(&s).iter().all(|m| m == "runtime"), || format!("{s:#}"))?;
        Run::<C>::ensure(worker_pids(self.c).await? == pids, || "a map change reloaded a pod".into())?;
        self.step("map change: runtime, same worker pids").await
    }

    async fn reload(&mut self) -> Result<()> {
        let reloads = self.reloads().await?;
        let before = self.status().await?["planId"].clone();
        self.want.body = self.next_body();
        self.push().await?;
        let s = self.converged(self.n, Some(&before)).await?;
        self.serves(&self.want.body).await?;
        Run::<C>::ensure(Run::<C>::modes(&s).iter().all(|m| m == "reload"), || format!("{s:#}"))?;
        let after = self.reloads().await?;
        for (p, n) in &after {
            Run::<C>::ensure(*n == reloads.get(p).copied().unwrap_or(0) + 1, || {
                format!("pod {p}: reloads {reloads:?} -> {after:?}")
            })?;
        }
        self.step("frontend change: exactly one reload per pod").await
    }

    /// A broken config: refused by the gate, the fleet keeps serving, HAProxy's words shown;
    /// then fixed, and the fleet moves on.
    async fn broken(&mut self) -> Result<()> {
        let client = self.c.client();
        let good = self.status().await?["planId"].clone();
        self.want.broken = true;
        self.push().await?;
        let ns = self.c.namespace().to_string();
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
        self.serves(&self.want.body).await?;
        Run::<C>::ensure(s["lastGoodPlanId"] == good, || format!("{s:#}"))?;
        self.step("broken config: refused, the fleet keeps serving the last good plan").await?;
        self.want.broken = false;
        self.want.body = self.next_body();
        self.push().await?;
        self.converged(self.n, Some(&good)).await?;
        self.serves(&self.want.body).await?;
        self.step("config fixed: the fleet moves on").await
    }

    /// A file edited in a pod is rewritten by the next drift pass.
    async fn drift(&mut self) -> Result<()> {
        let pods = self.c.haproxy_pods().await?;
        let victim = pods[0].clone();
        let before_at = self.c.agent_state(&victim).await?["applied"]["at"].clone();
        self.c.edit_file_in_pod(&victim, "maps/hosts.map", "edited.behind the-back\n").await?;
        eventually("the drift pass to rewrite the edited pod", Duration::from_secs(60), || async {
            let st = self.c.agent_state(&victim).await.ok()?;
            (st["applied"]["at"] != before_at).then_some(())
        })
        .await?;
        self.converged(self.n, None).await?;
        self.step("drift: the edited file was rewritten").await
    }

    async fn scale_pods(&mut self) -> Result<()> {
        let n = self.n;
        self.c.scale_haproxy(n + 2).await?;
        self.converged(n + 2, None).await?;
        self.serves(&self.want.body).await?;
        self.c.scale_haproxy(n).await?;
        self.converged(n, None).await?;
        self.step(&format!(
            "HAProxy pods scaled {n} -> {} -> {n}: new pods converged, removed pods left the status",
            n + 2
        ))
        .await
    }

    /// The agent container restarts: HAProxy untouched, the pod still converged.
    async fn agent_restart(&mut self) -> Result<()> {
        let pids = worker_pids(self.c).await?;
        let p0 = self.c.haproxy_pods().await?[0].clone();
        self.c.restart_agent(&p0).await?;
        self.converged(self.n, None).await?;
        Run::<C>::ensure(worker_pids(self.c).await? == pids, || "an agent restart reloaded HAProxy".into())?;
        self.step("agent container restarted: HAProxy untouched").await
    }

    /// The leader is killed: the other replica takes over without a reload.
    async fn failover(&mut self) -> Result<()> {
        let pids = worker_pids(self.c).await?;
        let old = self.status().await?["leader"].clone();
        let killed = self.c.kill_leader().await?;
        eventually("another leader", Duration::from_secs(60), || async {
            let s = self.status().await.ok()?;
            (s["leader"]["identity"] != killed.as_str() && s["leader"]["epoch"].as_u64()? > old["epoch"].as_u64()?)
                .then_some(())
        })
        .await?;
        self.converged(self.n, None).await?;
        let after = worker_pids(self.c).await?;
        Run::<C>::ensure(after == pids, || format!("the failover reloaded a pod: worker pids {pids:?} -> {after:?}"))?;
        self.step("leader killed: another replica leads, no pod reloaded").await
    }

    /// HAProxy's worker killed: the container restarts on the latest plan (the agent reloads a
    /// HAProxy that came back, to know what its worker runs).
    async fn worker_kill(&mut self) -> Result<()> {
        let p0 = self.c.haproxy_pods().await?[0].clone();
        self.c.kill_haproxy_worker(&p0).await?;
        let s = self.converged(self.n, None).await?;
        self.serves(&self.want.body).await?;
        // The agent learns what the new HAProxy runs by its own reload, once its health watcher
        // sees the master back: the fleet's status may say converged before that.
        let plan = s["planId"].clone();
        let c = &self.c;
        let last = std::sync::Mutex::new(Value::Null);
        eventually("the agent to report the restarted HAProxy running the plan", Duration::from_secs(60), || async {
            let st = c.agent_state(&p0).await.ok()?;
            let on_plan = st["running"]["plan_id"] == plan;
            *last.lock().unwrap_or_else(|e| e.into_inner()) = st;
            on_plan.then_some(())
        })
        .await
        .map_err(|e| ClusterError(format!("{e}: {:#}", last.lock().unwrap_or_else(|e| e.into_inner()))))?;
        self.step("HAProxy worker killed: restarted on the current plan").await
    }

    /// Every HAProxy pod replaced (a rolling update).
    async fn replace_pods(&mut self) -> Result<()> {
        self.c.replace_all_haproxy().await?;
        // The replacements keep the pods' names: wait for a status that lists the new pods.
        wait_converged_on_current_pods(&self.c.client(), self.c.namespace(), self.n).await?;
        self.serves(&self.want.body).await?;
        self.step("every HAProxy pod replaced: the new ones converged").await
    }

    /// Six endpoint changes; through each, requests go to every pod until the fleet has
    /// converged on it (and at least `MIN_ROUNDS` rounds were sent), zero failed.
    async fn churn(&mut self) -> Result<()> {
        const CHANGES: usize = 6;
        const MIN_ROUNDS: usize = 20;
        const MAX_ROUNDS: usize = 2000;
        let (mut ok, mut failed) = (0u64, Vec::new());
        let pods = self.c.haproxy_pods().await?;
        let body = self.want.body.clone();
        for change in 1..=CHANGES {
            let before = self.status().await?["planId"].clone();
            self.want.slots =
                if change % 2 == 1 { vec![Some(9001), Some(9005), None] } else { vec![Some(9001), None, None] };
            self.push().await?;
            let mut rounds = 0;
            while rounds < MAX_ROUNDS {
                for p in &pods {
                    match self.c.get(p, "/hello").await {
                        Ok((200, b)) if b == body => ok += 1,
                        other => failed.push(format!("change {change}, {p}: {other:?}")),
                    }
                }
                rounds += 1;
                if rounds >= MIN_ROUNDS && converged_on(&self.status().await?, self.n, Some(&before)) {
                    break;
                }
            }
            // Past the request bound the fleet gets the usual deadline to converge, without traffic.
            self.converged(self.n, Some(&before)).await?;
        }
        Run::<C>::ensure(failed.is_empty(), || format!("{} failed: {failed:?}", failed.len()))?;
        println!("   traffic under churn: {ok} requests, 0 failed, {CHANGES} endpoint changes");
        self.step("traffic under endpoint churn: no failed request").await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_selection_names_known_steps_only_and_empty_means_all() {
        let known = step_names();
        assert_eq!(Selection::parse("", &known).unwrap(), Selection::all());
        let s = Selection::parse(" map, churn ,", &known).unwrap();
        assert!(s.wants("map") && s.wants("churn") && !s.wants("reload"));
        let err = Selection::parse("map,nope", &known).unwrap_err().to_string();
        assert!(err.contains("no step \"nope\"") && err.contains("endpoints, map, reload"), "{err}");
        assert!(Selection::all().wants("anything"));
    }
}
