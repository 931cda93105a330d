//! `bench`: measures haptic against the physical floor, side by side in one run (BENCHMARKS.md).
//!
//! `cargo run --release -p haptic-e2e --bin bench -- [--quick] [--only NAME]... [--json FILE]
//! [--markdown FILE] [--haproxy PATH]...` runs real HAProxy (every installed version, or the
//! given binaries), real agents and a real controller on 127.0.0.1, prints one row per figure
//! with haptic's figure, the floor's, their ratio and p50/p99, and exits non-zero if any answer
//! was wrong or a case could not run. The agent and controller binaries must be built into the
//! same target dir first: `cargo build --release -p haptic-agent -p haptic-controller`.
//!
//! This file owns flags, the run order and the exit code; it must never measure anything itself.
#![forbid(unsafe_code)]

mod agent_api;
mod cases;
mod error;
mod fleet_kit;
mod floor;
mod proc_mem;
mod report;
mod stats;
mod workload;

/// The controller's allocator, so the in-process render figures are the product's.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{bail, Context as _};
use clap::Parser;
use haptic_e2e::{haproxy_bins, HaproxyBin};

use crate::cases::Ctx;
use crate::report::Row;

/// Benchmarks haptic against what HAProxy itself allows, measured in the same run.
#[derive(Debug, Parser)]
#[command(name = "bench")]
struct Args {
    /// Small sizes and fewer repetitions (finishes in under two minutes).
    #[arg(long)]
    quick: bool,
    /// Run only this case (repeatable): plan_diff, render_scale, runtime_apply, reload_apply, new_backend (3.4),
    /// map_replace, regex_path, verify_state, delta_transfer, fleet_runtime, runtime_while_reload_pending,
    /// fleet_reload, burst, traffic_under_churn, fleet_scale, k8s_runtime, endpoint_churn, gateway_route, attach_routes, propagate_routes, change_under_load, sweep, footprint; only when
    /// named: churn_routes (15 minutes of churn), real_cluster (root; brings scripts/cluster.sh's cluster up and down) and
    /// real_routes (root; attach_routes, propagate_routes, sweep and churn_routes on that cluster).
    #[arg(long = "only", value_name = "NAME")]
    only: Vec<String>,
    /// Write one JSON object per figure and HAProxy version to FILE (a JSON array).
    #[arg(long, value_name = "FILE")]
    json: Option<PathBuf>,
    /// Write the results as a Markdown table to FILE.
    #[arg(long, value_name = "FILE")]
    markdown: Option<PathBuf>,
    /// HAProxy binary to run against (repeatable; default: HAPTIC_HAPROXY_BINS or both installed versions).
    #[arg(long = "haproxy", value_name = "PATH")]
    haproxy: Vec<PathBuf>,
    /// Pods in the fleet and Kubernetes cases (default 3; `fleet_scale` runs 3, 16 and 64).
    #[arg(long)]
    pods: Option<usize>,
    /// Write `sweep`'s steps (routes, latency, memory) to FILE as JSON, for `sweep-plot`.
    #[arg(long, value_name = "FILE")]
    sweep_json: Option<PathBuf>,
}

fn bins(args: &Args) -> anyhow::Result<Vec<HaproxyBin>> {
    if args.haproxy.is_empty() {
        return Ok(haproxy_bins());
    }
    args.haproxy
        .iter()
        .map(|p| {
            // Pods run HAProxy from other working directories: make the path absolute.
            let p = std::path::absolute(p).with_context(|| format!("--haproxy {}", p.display()))?;
            HaproxyBin::probe(&p).map_err(anyhow::Error::msg)
        })
        .collect()
}

fn version_label(b: &HaproxyBin) -> String {
    let (x, y, z) = b.version;
    format!("{x}.{y}.{z}")
}

async fn run(args: Args) -> anyhow::Result<bool> {
    for n in &args.only {
        if !cases::ALL.contains(&n.as_str()) {
            bail!("unknown case {n:?}; cases: {}", cases::ALL.join(", "));
        }
    }
    let bins = bins(&args)?;
    let started = Instant::now();
    let only = (!args.only.is_empty()).then(|| args.only.clone());
    let pods = args.pods.unwrap_or(3);
    let mut out = Results::default();
    println!("{}", report::header());
    let sweep_json = args.sweep_json.clone();
    let base = Ctx { quick: args.quick, bin: bins[0].clone(), label: "none".into(), only, pods, sweep_json };
    if base.wants("plan_diff") {
        out.record("plan_diff", "none", cases::plan_diff::run(&base).await);
    }
    if base.wants("render_scale") {
        out.record("render_scale", "none", cases::render_scale::run(&base).await);
    }
    for bin in &bins {
        let ctx = Ctx { bin: bin.clone(), label: version_label(bin), ..base.clone() };
        eprintln!("# {} ({})", bin.label(), bin.path.display());
        run_version(&ctx, &mut out).await;
    }
    // The real cluster (scripts/cluster.sh) runs HAProxy 3.0 from the image: once, its
    // standalone floor on the last (newest) HAProxy here.
    if base.named("real_cluster") {
        if let Some(bin) = bins.last() {
            let ctx = Ctx { bin: bin.clone(), label: version_label(bin), ..base.clone() };
            let t = Instant::now();
            let res = cases::real_cluster::run(&ctx).await;
            eprintln!("#   real_cluster: {:.1} s", t.elapsed().as_secs_f64());
            out.record("real_cluster", &ctx.label, res);
        }
    }
    // The route-scale cases on the real cluster: the image's HAProxy, once.
    if base.named("real_routes") {
        let t = Instant::now();
        let res = cases::real_routes::run(&base).await;
        eprintln!("#   real_routes: {:.1} s", t.elapsed().as_secs_f64());
        out.record("real_routes", "image", res);
    }
    eprintln!("# total {:.1} s", started.elapsed().as_secs_f64());
    if let Some(path) = &args.json {
        std::fs::write(path, serde_json::to_string_pretty(&out.rows)?)
            .with_context(|| format!("write {}", path.display()))?;
    }
    if let Some(path) = &args.markdown {
        std::fs::write(path, report::markdown(&out.rows)).with_context(|| format!("write {}", path.display()))?;
    }
    Ok(out.summarise())
}

/// Every case of one HAProxy version that `ctx` wants, in order.
async fn run_version(ctx: &Ctx, out: &mut Results) {
    type Fut<'a> = std::pin::Pin<Box<dyn std::future::Future<Output = error::Result<Vec<Row>>> + 'a>>;
    let groups: Vec<(&str, &[&str], Fut<'_>)> = vec![
        ("runtime_apply", &["runtime_apply"], Box::pin(cases::agent_cases::runtime_apply(ctx))),
        ("reload_apply", &["reload_apply"], Box::pin(cases::agent_cases::reload_apply(ctx))),
        ("map_replace", &["map_replace"], Box::pin(cases::agent_cases::map_replace(ctx))),
        ("new_backend", &["new_backend"], Box::pin(cases::new_backend::run(ctx))),
        ("regex_path", &["regex_path"], Box::pin(cases::regex_path::run(ctx))),
        (
            "tree (footprint/verify_state/delta_transfer)",
            &["footprint", "verify_state", "delta_transfer"],
            Box::pin(cases::tree50::run(ctx)),
        ),
        (
            "fleet (fleet_runtime/runtime_while_reload_pending/fleet_reload/burst/traffic_under_churn/footprint)",
            &[
                "fleet_runtime",
                "runtime_while_reload_pending",
                "fleet_reload",
                "burst",
                "traffic_under_churn",
                "footprint",
            ],
            Box::pin(cases::fleet::run(ctx)),
        ),
        ("fleet_scale", &["fleet_scale"], Box::pin(cases::fleet::scale(ctx))),
    ];
    for (name, members, fut) in groups {
        if members.iter().any(|m| ctx.wants(m)) {
            let t = Instant::now();
            let res = fut.await;
            eprintln!("#   {name}: {:.1} s", t.elapsed().as_secs_f64());
            out.record(name, &ctx.label, res);
        }
    }
    if ctx.wants("k8s_runtime") {
        // Against the standalone fleet_runtime of this run and version.
        let standalone = out
            .rows
            .iter()
            .find(|r| r.case == "fleet_runtime" && r.haproxy == ctx.label && r.correct)
            .map(|r| r.haptic);
        let t = Instant::now();
        let res = cases::k8s::run(ctx, standalone).await;
        eprintln!("#   k8s_runtime: {:.1} s", t.elapsed().as_secs_f64());
        out.record("k8s_runtime", &ctx.label, res);
    }
    if ctx.wants("endpoint_churn") {
        let t = Instant::now();
        let res = cases::k8s_endpoints::run(ctx).await;
        eprintln!("#   endpoint_churn: {:.1} s", t.elapsed().as_secs_f64());
        out.record("endpoint_churn", &ctx.label, res);
    }
    if ctx.wants("gateway_route") {
        let t = Instant::now();
        let res = cases::k8s_gateway::run(ctx).await;
        eprintln!("#   gateway_route: {:.1} s", t.elapsed().as_secs_f64());
        out.record("gateway_route", &ctx.label, res);
    }
    if ctx.wants("attach_routes") {
        let t = Instant::now();
        let res = cases::k8s_attach::run(ctx).await;
        eprintln!("#   attach_routes: {:.1} s", t.elapsed().as_secs_f64());
        out.record("attach_routes", &ctx.label, res);
    }
    if ctx.wants("propagate_routes") {
        let t = Instant::now();
        let res = cases::k8s_propagate::run(ctx).await;
        eprintln!("#   propagate_routes: {:.1} s", t.elapsed().as_secs_f64());
        out.record("propagate_routes", &ctx.label, res);
    }
    if ctx.wants("change_under_load") {
        let t = Instant::now();
        let res = cases::k8s_change::run(ctx).await;
        eprintln!("#   change_under_load: {:.1} s", t.elapsed().as_secs_f64());
        out.record("change_under_load", &ctx.label, res);
    }
    if ctx.wants("sweep") {
        let t = Instant::now();
        let res = cases::k8s_sweep::run(ctx).await;
        eprintln!("#   sweep: {:.1} s", t.elapsed().as_secs_f64());
        out.record("sweep", &ctx.label, res);
    }
    if ctx.named("churn_routes") {
        let t = Instant::now();
        let res = cases::k8s_churn::run(ctx).await;
        eprintln!("#   churn_routes: {:.1} s", t.elapsed().as_secs_f64());
        out.record("churn_routes", &ctx.label, res);
    }
}

/// The rows measured so far and the cases that failed.
#[derive(Debug, Default)]
struct Results {
    rows: Vec<Row>,
    failed: Vec<String>,
}

impl Results {
    fn record(&mut self, name: &str, label: &str, res: error::Result<Vec<Row>>) {
        match res {
            Ok(new) => {
                for r in new {
                    println!("{}", report::line(&r));
                    self.rows.push(r);
                }
            }
            Err(e) => {
                println!("{name:<20} {label:<9} ERROR: {e}");
                self.failed.push(format!("{name} on {label}: {e}"));
            }
        }
    }

    /// Prints wrong rows, failed cases and missed goals; true when nothing was wrong or failed.
    fn summarise(&self) -> bool {
        let wrong: Vec<&Row> = self.rows.iter().filter(|r| !r.correct).collect();
        for r in &wrong {
            eprintln!("WRONG: {} {} {}: {}", r.case, r.haproxy, r.metric, r.note);
        }
        for f in &self.failed {
            eprintln!("FAILED: {f}");
        }
        let missed: Vec<&Row> = self.rows.iter().filter(|r| r.meets_goal == Some(false)).collect();
        if cfg!(debug_assertions) {
            // A debug build is a smoke run: it shows every case works and measures correctly, and
            // says nothing about speed.
            eprintln!(
                "# untimed smoke run (debug build): speed goals are judged only in a release run \
                 (cargo run --release -p haptic-e2e --bin bench){}",
                if missed.is_empty() { "" } else { "; debug timings miss some of them, as expected" }
            );
        } else {
            for r in &missed {
                eprintln!("goal missed: {} {} {} ({})", r.case, r.haproxy, r.metric, r.goal.as_deref().unwrap_or(""));
            }
        }
        wrong.is_empty() && self.failed.is_empty()
    }
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("bench: cannot start the runtime: {e}");
            return ExitCode::from(2);
        }
    };
    match rt.block_on(run(args)) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("bench: {e:#}");
            ExitCode::from(2)
        }
    }
}
