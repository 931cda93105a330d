//! The benchmark cases, grouped by the setup they share, and the context every case gets (the
//! HAProxy binary, quick mode, repetition counts, a pod kit). Each case returns table rows and
//! marks a row wrong when haptic's answer fails verification; it must never hide a wrong answer
//! behind a fast figure.

pub mod agent_cases;
pub mod fleet;
pub mod k8s;
pub mod k8s_attach;
pub mod k8s_change;
pub mod k8s_churn;
pub mod k8s_endpoints;
pub mod k8s_gateway;
pub mod k8s_propagate;
pub mod k8s_sweep;
pub mod new_backend;
pub mod plan_diff;
pub mod real_cluster;
pub mod real_routes;
pub mod regex_path;
pub mod render_scale;
pub mod route_fleet;
pub mod tree50;

use std::sync::Arc;

use haptic_e2e::pod::{Pod, PodOpts};
use haptic_e2e::HaproxyBin;
use haptic_protocol::{Ack, Mode, Op, PlanId};

use crate::agent_api::AgentApi;
use crate::error::Result;
use crate::workload::{Desired, Fencer};

/// Every case name, in run order.
pub const ALL: &[&str] = &[
    "plan_diff",
    "render_scale",
    "runtime_apply",
    "reload_apply",
    "map_replace",
    "new_backend",
    "regex_path",
    "verify_state",
    "delta_transfer",
    "footprint",
    "fleet_runtime",
    "runtime_while_reload_pending",
    "fleet_reload",
    "burst",
    "traffic_under_churn",
    "fleet_scale",
    "k8s_runtime",
    "endpoint_churn",
    "gateway_route",
    "attach_routes",
    "propagate_routes",
    "change_under_load",
    "sweep",
    // Only when named (`--only churn_routes`): its churn alone takes 15 minutes.
    "churn_routes",
    // Only when named (`--only real_cluster`): needs root and takes the machine's cluster.
    "real_cluster",
    // Only when named (`--only real_routes`): needs root, takes the machine's cluster, and runs
    // the route-scale cases there (with `churn_routes`' 15 minutes unless told otherwise).
    "real_routes",
];

/// What every case gets.
#[derive(Debug, Clone)]
pub struct Ctx {
    /// Small sizes and fewer repetitions.
    pub quick: bool,
    /// The HAProxy binary of this round.
    pub bin: HaproxyBin,
    /// Its version label for rows (e.g. `3.0.11`).
    pub label: String,
    /// Which cases run (already validated names).
    pub only: Option<Vec<String>>,
    /// Pods in fleet cases.
    pub pods: usize,
    /// Where `sweep` writes its steps (JSON), if anywhere.
    pub sweep_json: Option<std::path::PathBuf>,
}

impl Ctx {
    /// Whether case `name` is selected.
    pub fn wants(&self, name: &str) -> bool {
        self.only.as_ref().is_none_or(|o| o.iter().any(|n| n == name))
    }

    /// Whether case `name` was named with `--only` (for the cases a full run leaves out).
    pub fn named(&self, name: &str) -> bool {
        self.only.as_ref().is_some_and(|o| o.iter().any(|n| n == name))
    }

    /// Measured repetitions of a sub-second case.
    pub fn reps(&self) -> usize {
        if self.quick {
            6
        } else {
            20
        }
    }

    /// Warm-up repetitions (excluded from the figures).
    pub fn warmup(&self) -> usize {
        if self.quick {
            1
        } else {
            3
        }
    }
}

/// A pod (HAProxy + agent) with a client and the plan it has applied.
#[derive(Debug)]
pub struct BenchPod {
    /// The pod (killed on drop).
    pub pod: Pod,
    /// Its API.
    pub api: AgentApi,
    /// The plan the agent has applied, as the bench knows it.
    pub current: Option<PlanId>,
    fencer: Arc<Fencer>,
}

impl BenchPod {
    /// Starts a pod with `--min-reload-interval interval`.
    pub async fn start(ctx: &Ctx, interval: &str) -> Result<Self> {
        let agent = crate::fleet_kit::sibling_bin("haptic-agent", "HAPTIC_AGENT_BIN")?;
        let opts = PodOpts { min_reload_interval: interval.into(), agent_bin: Some(agent), ..PodOpts::default() };
        let pod = Pod::start(&ctx.bin, opts).await?;
        let (u, p) = pod.credentials();
        let api = AgentApi::new(&pod.url(), u, p)?;
        Ok(Self { pod, api, current: None, fencer: Arc::new(Fencer::new(1)) })
    }

    /// Sends an apply body for `d`, timing HTTP request → ACK; the ACKed plan becomes current.
    pub async fn timed_apply(&mut self, body: Vec<u8>, d: &Desired) -> Result<(Ack, std::time::Duration)> {
        let t = std::time::Instant::now();
        let ans = self.api.apply_raw(body).await?;
        let took = t.elapsed();
        let ack = ans.ack()?;
        self.current = Some(d.plan());
        Ok((ack, took))
    }

    /// The agent's pid.
    pub fn agent_pid(&self) -> Option<u32> {
        self.pod.agent_pid()
    }

    /// The next apply request body for `d`: against the current plan (or complete state when
    /// `complete`), sending the files `send` selects.
    pub fn body(
        &self,
        d: &Desired,
        mode: Mode,
        complete: bool,
        send: impl Fn(&str) -> bool,
        batches: Vec<Vec<Op>>,
    ) -> Vec<u8> {
        let baseline = if complete { None } else { self.current };
        AgentApi::body(&d.request(self.fencer.next(), baseline, mode, send, batches))
    }

    /// Sends the complete state of `d` with a reload and requires an ACK.
    pub async fn apply_complete(&mut self, d: &Desired) -> Result<Ack> {
        let body = self.body(d, Mode::Reload, true, |_| true, vec![]);
        let ack = self.api.apply_raw(body).await?.ack()?;
        self.current = Some(d.plan());
        Ok(ack)
    }
}
