//! Fleet cases through a real standalone controller: `fleet_runtime` and `fleet_reload` (time
//! until every pod converged, against one pod's direct apply of the same change), `burst`
//! (reloads done and convergence after 100 reload-needing renders in 10 s), `traffic_under_churn`
//! (failed requests while runtime and reload changes deploy) and the controller's footprint.
//! Renders are written atomically into the controller's config directory; convergence is read
//! from its `GET /status` and then verified pod by pod. It must never apply to a fleet pod
//! behind the controller's back.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use haptic_e2e::{free_port, http_get};
use haptic_protocol::{Mode, Op, ServerSet};

use super::{BenchPod, Ctx};
use crate::error::{BenchError, Result};
use crate::fleet_kit::{Controller, FleetPod, Upstream, PASSWORD, PORT_ENV, SETTLE, USER};
use crate::floor::{durable_write, parse_server_addr};
use crate::proc_mem::{cpu_seconds, mib, peak, rss};
use crate::report::Row;
use crate::stats::Samples;
use crate::workload::{CfgModel, Desired};

/// The pacing interval of the fleet's agents (the product default).
const INTERVAL: Duration = Duration::from_secs(2);
/// Servers of `be_0` that take traffic and move between the two upstreams.
const BE0_SERVERS: usize = 10;

struct Fleet {
    pods: Vec<FleetPod>,
    ctl: Controller,
    model: CfgModel,
    render_dir: std::path::PathBuf,
    up: [u16; 2],
    last_reload: Instant,
    floor: BenchPod,
    floor_model: CfgModel,
    floor_desired: Desired,
    _upstreams: [Upstream; 2],
    _tmp: tempfile::TempDir,
}

impl Fleet {
    fn desired(&self) -> Desired {
        let mut d = Desired::new();
        d.set("haproxy.cfg", self.model.render());
        d
    }

    /// Writes the current model as the render; returns its plan id text.
    fn write_render(&self) -> Result<String> {
        let d = self.desired();
        durable_write(&self.render_dir.join("haproxy.cfg"), d.get("haproxy.cfg").unwrap_or_default())?;
        Ok(d.plan().to_string())
    }

    /// Moves `be_0/s<k>` to the other upstream in the fleet model; returns the new address.
    fn toggle(&mut self, k: usize) -> (String, u16) {
        let cur = self.model.addr_of(0, k).1;
        let port = if cur == self.up[0] { self.up[1] } else { self.up[0] };
        let a = ("127.0.0.1".to_string(), port);
        self.model.overrides.insert((0, k), a.clone());
        a
    }

    /// Checks every pod: applied == running == `plan`, the mode, and what HAProxy runs.
    async fn verify(&self, plan: &str, mode: Option<Mode>) -> Vec<String> {
        let mut wrong = Vec::new();
        let gen = format!("cfggen={}", self.model.gen);
        for (i, p) in self.pods.iter().enumerate() {
            match p.api.state(false).await {
                Ok(s) => {
                    let applied = s.applied.as_ref().map(|a| a.plan_id.to_string());
                    let running = s.running.as_ref().map(|r| r.plan_id.to_string());
                    if applied.as_deref() != Some(plan) || running.as_deref() != Some(plan) {
                        wrong.push(format!("pod {i}: applied {applied:?} running {running:?}, wanted {plan}"));
                    }
                    if let (Some(m), Some(a)) = (mode, s.applied.as_ref()) {
                        if a.mode != m {
                            wrong.push(format!("pod {i}: landed as {}, wanted {m}", a.mode));
                        }
                    }
                }
                Err(e) => wrong.push(format!("pod {i}: state: {e}")),
            }
            match p.worker_cmd("show info").await {
                Ok(t) if t.lines().any(|l| l.trim() == format!("description: {gen}")) => {}
                Ok(_) => wrong.push(format!("pod {i}: worker does not run {gen}")),
                Err(e) => wrong.push(format!("pod {i}: show info: {e}")),
            }
            match p.worker_cmd("show servers state be_0").await {
                Ok(t) => {
                    for k in 0..BE0_SERVERS {
                        let want = self.model.addr_of(0, k);
                        let got = parse_server_addr(&t, &format!("s{k}"));
                        if got.as_ref() != Some(&want) {
                            wrong.push(format!("pod {i}: be_0/s{k} is {got:?}, wanted {want:?}"));
                        }
                    }
                }
                Err(e) => wrong.push(format!("pod {i}: show servers state: {e}")),
            }
        }
        wrong
    }

    /// Waits until the fleet's pacing allows an immediate reload again.
    async fn pacing_gap(&self) {
        let ready = self.last_reload + INTERVAL + Duration::from_millis(150);
        tokio::time::sleep_until(ready.into()).await;
    }
}

async fn start_fleet(ctx: &Ctx, pods_wanted: usize) -> Result<Fleet> {
    let tmp = tempfile::Builder::new().prefix("haptic-bench-fleet-").tempdir().map_err(BenchError::io("tempdir"))?;
    let creds = tmp.path().join("credentials");
    std::fs::write(&creds, format!("{USER}:{PASSWORD}\n")).map_err(BenchError::io("write credentials"))?;
    let upstreams = [Upstream::start().await?, Upstream::start().await?];
    let up = [upstreams[0].port, upstreams[1].port];
    let mut pods = Vec::new();
    for _ in 0..pods_wanted {
        pods.push(FleetPod::start(&ctx.bin, "2s").await?);
    }
    let mut model = CfgModel::new(0, 20, BE0_SERVERS);
    model.port_env = Some(PORT_ENV.into());
    model.proxy_to_be0 = true;
    for k in 0..BE0_SERVERS {
        model.overrides.insert((0, k), ("127.0.0.1".into(), up[0]));
    }
    model.gen = 1;
    let render_dir = tmp.path().join("render");
    std::fs::create_dir_all(&render_dir).map_err(BenchError::io("mkdir render"))?;
    let agents: Vec<String> = pods.iter().map(|p| p.url.clone()).collect();
    // The floor pod: the same config (its own literal port), applied to directly.
    let mut floor_model = model.clone();
    floor_model.port_env = None;
    floor_model.http_port = free_port();
    let mut floor = BenchPod::start(ctx, "0s").await?;
    let mut floor_desired = Desired::new();
    floor_desired.set("haproxy.cfg", floor_model.render());
    floor.apply_complete(&floor_desired).await?;
    let ctl = Controller::start(&ctx.bin, tmp.path(), &render_dir, &creds, &agents).await?;
    let mut fleet = Fleet {
        pods,
        ctl,
        model,
        render_dir,
        up,
        last_reload: Instant::now(),
        floor,
        floor_model,
        floor_desired,
        _upstreams: upstreams,
        _tmp: tmp,
    };
    let plan = fleet.write_render()?;
    let n = fleet.pods.len();
    fleet.ctl.wait_converged(&plan, n, Duration::from_secs(120)).await?;
    fleet.last_reload = Instant::now();
    let wrong = fleet.verify(&plan, None).await;
    if !wrong.is_empty() {
        return Err(BenchError::Unexpected(format!("initial deployment: {}", wrong.join("; "))));
    }
    Ok(fleet)
}

/// `reps` runtime changes (after `warmup` unmeasured ones) through the controller: the time from
/// writing the render until every pod runs it; every change verified on every pod.
async fn runtime_round(f: &mut Fleet, warmup: usize, reps: usize) -> Result<(Samples, Vec<String>)> {
    let n = f.pods.len();
    let (mut h, mut wrong) = (Samples::new(), Vec::new());
    for i in 0..warmup + reps {
        f.toggle(i % BE0_SERVERS);
        let t = Instant::now();
        let plan = f.write_render()?;
        let done = f.ctl.wait_converged(&plan, n, Duration::from_secs(60)).await?;
        let took = done - t;
        wrong.extend(f.verify(&plan, Some(Mode::Runtime)).await.into_iter().map(|w| format!("change {i}: {w}")));
        if i >= warmup {
            h.push_ms(took);
        }
    }
    Ok((h, wrong))
}

/// One pod's direct runtime applies of the same kind of change (the fleet cases' floor).
async fn floor_runtime(f: &mut Fleet, warmup: usize, reps: usize) -> Result<Samples> {
    let mut fl = Samples::new();
    for i in 0..warmup + reps {
        let k = i % BE0_SERVERS;
        let cur = f.floor_model.addr_of(0, k).1;
        let port = if cur == f.up[0] { f.up[1] } else { f.up[0] };
        f.floor_model.overrides.insert((0, k), ("127.0.0.1".into(), port));
        f.floor_desired.set("haproxy.cfg", f.floor_model.render());
        let op = Op::ServerSet(ServerSet {
            backend: "be_0".into(),
            server: format!("s{k}"),
            addr: Some("127.0.0.1".into()),
            port: Some(port),
            weight: None,
            state: None,
        });
        let body = f.floor.body(&f.floor_desired, Mode::Runtime, false, |_| false, vec![vec![op]]);
        let t = Instant::now();
        let ack = f.floor.api.apply_raw(body).await?.ack()?;
        let ftook = t.elapsed();
        f.floor.current = Some(f.floor_desired.plan());
        if ack.mode != Mode::Runtime {
            return Err(BenchError::Unexpected(format!("floor pod landed as {}", ack.mode)));
        }
        if i >= warmup {
            fl.push_ms(ftook);
        }
    }
    Ok(fl)
}

/// `runtime_while_reload_pending`: every pod reloads, then gets a render needing another reload
/// (scheduled for the end of its pacing interval); an endpoint change is then written and timed
/// until every pod has applied it and its worker serves the new address, which must not wait for
/// the reload slot. The fleet then converges (the reload folds the change in) before the next one.
async fn runtime_while_pending(f: &mut Fleet, warmup: usize, reps: usize) -> Result<(Samples, Vec<String>)> {
    let n = f.pods.len();
    let wait = Duration::from_secs(60);
    let (mut h, mut wrong) = (Samples::new(), Vec::new());
    for i in 0..warmup + reps {
        f.pacing_gap().await;
        f.model.gen += 1;
        let plan = f.write_render()?;
        f.ctl.wait_converged(&plan, n, wait).await?;
        f.last_reload = Instant::now();
        f.model.gen += 1;
        let plan = f.write_render()?;
        f.ctl.wait_applied(&plan, n, wait).await?;
        let k = i % BE0_SERVERS;
        let want = f.toggle(k);
        let t = Instant::now();
        let plan = f.write_render()?;
        let done = f.ctl.wait_applied(&plan, n, wait).await?;
        let took = done - t;
        if done >= f.last_reload + INTERVAL {
            wrong.push(format!("change {i}: applied only after the pods' reload slot ({took:?})"));
        }
        for (j, p) in f.pods.iter().enumerate() {
            match p.worker_cmd("show servers state be_0").await {
                Ok(text) if parse_server_addr(&text, &format!("s{k}")).as_ref() == Some(&want) => {}
                Ok(_) => wrong.push(format!("change {i}: pod {j} does not serve be_0/s{k} at {want:?}")),
                Err(e) => wrong.push(format!("change {i}: pod {j}: {e}")),
            }
        }
        f.ctl.wait_converged(&plan, n, wait).await?;
        f.last_reload = Instant::now();
        wrong.extend(f.verify(&plan, None).await.into_iter().map(|w| format!("change {i}: {w}")));
        if i >= warmup {
            h.push_ms(took);
        }
    }
    Ok((h, wrong))
}

/// `fleet_scale`: `fleet_runtime` on fleets of 3, 16 and 64 pods (each its own controller with
/// `--max-parallel 16`), one fleet at a time, and the controller's CPU time per pod-apply.
pub async fn scale(ctx: &Ctx) -> Result<Vec<Row>> {
    let sizes: &[usize] = if ctx.quick { &[3, 6] } else { &[3, 16, 64] };
    let (warmup, reps) = if ctx.quick { (1, 4) } else { (2, 10) };
    let mut rows = Vec::new();
    let mut base: Option<Samples> = None;
    let largest = sizes.iter().copied().max().unwrap_or(0);
    for &n in sizes {
        let started = Instant::now();
        let mut f = start_fleet(ctx, n).await?;
        let setup = started.elapsed();
        let floor = match &base {
            Some(b) => b.clone(),
            None => floor_runtime(&mut f, warmup, reps).await?,
        };
        let pid = f.ctl.pid();
        let pod_pids: Vec<u32> = f.pods.iter().flat_map(FleetPod::pids).collect();
        let pods_cpu = || pod_pids.iter().filter_map(|p| cpu_seconds(*p)).sum::<f64>();
        let (cpu0, pods0) = (cpu_seconds(pid), pods_cpu());
        let (h, wrong) = runtime_round(&mut f, warmup, reps).await?;
        let (cpu1, pods1) = (cpu_seconds(pid), pods_cpu());
        let metric = format!("{n} pods");
        let mut r = Row::repeated("fleet_scale", &metric, &ctx.label, &h, Some(&floor), "ms").verified(&wrong);
        if base.is_none() {
            r.add_note(format!("floor: one pod's direct runtime apply; fleet set up in {:.1} s", setup.as_secs_f64()));
        } else {
            r.add_note(format!(
                "floor: the {}-pod fleet's time; fleet set up in {:.1} s",
                sizes[0],
                setup.as_secs_f64()
            ));
            if n == largest {
                r = r.goal_ratio(4.0);
            }
        }
        rows.push(r);
        if let (Some(a), Some(b)) = (cpu0, cpu1) {
            let applies = ((warmup + reps) * n) as f64;
            let mut r = Row::single(
                "fleet_scale",
                &format!("controller CPU per pod-apply, {n} pods"),
                &ctx.label,
                (b - a) * 1e3 / applies,
                None,
                "ms",
            );
            r.add_note(format!(
                "controller user+system CPU over {} runtime changes to {n} pods (its gate's haproxy -c children not included), / {applies} pod-applies",
                warmup + reps
            ));
            rows.push(r);
            // What the pods themselves spend: on this machine's cores, the least wall time one
            // change to every pod can take, whatever the controller does.
            let per_apply = (pods1 - pods0) * 1e3 / applies;
            let cores = std::thread::available_parallelism().map_or(1, |c| c.get());
            let mut r = Row::single(
                "fleet_scale",
                &format!("agents + HAProxy CPU per pod-apply, {n} pods"),
                &ctx.label,
                per_apply,
                None,
                "ms",
            );
            r.add_note(format!(
                "agent and HAProxy (master + worker) user+system CPU over the same changes, / {applies} pod-applies; \
                 {n} pods x {per_apply:.2} ms on {cores} core(s): one change to every pod needs at least {:.1} ms",
                n as f64 * per_apply / cores as f64
            ));
            rows.push(r);
        }
        if base.is_none() {
            base = Some(h);
        }
        drop(f);
    }
    Ok(rows)
}

/// Runs whichever fleet cases are wanted.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let fleet_wanted =
        ["fleet_runtime", "runtime_while_reload_pending", "fleet_reload", "burst", "traffic_under_churn"]
            .iter()
            .any(|c| ctx.wants(c));
    if !fleet_wanted && !ctx.wants("footprint") {
        return Ok(vec![]);
    }
    let mut f = start_fleet(ctx, ctx.pods).await?;
    let n = f.pods.len();
    let mut rows = Vec::new();
    let metric = format!("{n} pods");
    if ctx.wants("fleet_runtime") || ctx.wants("runtime_while_reload_pending") {
        rows.extend(runtime_cases(ctx, &mut f, &metric).await?);
    }
    let mut floor_reload = Samples::new();
    if ctx.wants("fleet_reload") || ctx.wants("burst") {
        let reload_rows;
        (floor_reload, reload_rows) = reload_cases(ctx, &mut f, &metric).await?;
        rows.extend(reload_rows);
    }
    if ctx.wants("burst") {
        rows.extend(burst(ctx, &mut f, &floor_reload).await?);
    }
    if ctx.wants("traffic_under_churn") {
        rows.push(traffic_under_churn(ctx, &mut f).await?);
    }
    if ctx.wants("footprint") {
        rows.extend(footprint(ctx, &f));
    }
    Ok(rows)
}

/// `fleet_runtime` and `runtime_while_reload_pending`, each against its floor.
async fn runtime_cases(ctx: &Ctx, f: &mut Fleet, metric: &str) -> Result<Vec<Row>> {
    let pending_wanted = ctx.wants("runtime_while_reload_pending");
    let label = ctx.label.clone();
    let mut rows = Vec::new();

    // The floor first, while the fleet is idle: one pod, the same changes, applied directly.
    let fl = floor_runtime(f, ctx.warmup(), ctx.reps()).await?;
    let (h, wrong) = runtime_round(f, ctx.warmup(), ctx.reps()).await?;
    let mut r = Row::repeated("fleet_runtime", metric, &label, &h, Some(&fl), "ms").verified(&wrong).goal_ratio(1.5);
    r.add_note(format!(
        "floor: one pod's direct runtime apply of the same change, measured while the fleet is idle; controller --settle {SETTLE}"
    ));
    if ctx.wants("fleet_runtime") {
        rows.push(r);
    }
    if pending_wanted {
        let reps = if ctx.quick { 3 } else { 10 };
        let (hp, wrong) = runtime_while_pending(f, 1, reps).await?;
        let mut r = Row::repeated("runtime_while_reload_pending", metric, &label, &hp, Some(&h), "ms")
            .verified(&wrong)
            .goal_ratio(2.0);
        r.add_note(
            "render -> every pod applied the endpoint change (ACKed, address live in the worker) while each pod \
             has a paced reload scheduled; floor: fleet_runtime of the same run",
        );
        rows.push(r);
    }
    Ok(rows)
}

/// The reload floor (one pod, no pacing) and, when wanted, `fleet_reload` against it.
async fn reload_cases(ctx: &Ctx, f: &mut Fleet, metric: &str) -> Result<(Samples, Vec<Row>)> {
    let (label, n) = (ctx.label.clone(), f.pods.len());
    let mut floor_reload = Samples::new();
    let mut rows = Vec::new();

    let reps = if ctx.wants("fleet_reload") { ctx.warmup() + if ctx.quick { 5 } else { ctx.reps() } } else { 3 };
    // The floor first, while the fleet is idle: one pod (no pacing), the same change.
    for i in 0..reps {
        f.floor_model.gen += 1;
        f.floor_desired.set("haproxy.cfg", f.floor_model.render());
        let body = f.floor.body(&f.floor_desired, Mode::Reload, false, |_| false, vec![]);
        let t = Instant::now();
        let ack = f.floor.api.apply_raw(body).await?.ack()?;
        let ftook = t.elapsed();
        f.floor.current = Some(f.floor_desired.plan());
        if ack.mode != Mode::Reload {
            return Err(BenchError::Unexpected(format!("floor pod landed as {}", ack.mode)));
        }
        if i >= ctx.warmup() {
            floor_reload.push_ms(ftook);
        }
    }
    let (mut h, mut wrong) = (Samples::new(), Vec::new());
    for i in 0..reps {
        f.pacing_gap().await;
        f.model.gen += 1;
        let t = Instant::now();
        let plan = f.write_render()?;
        let done = f.ctl.wait_converged(&plan, n, Duration::from_secs(60)).await?;
        f.last_reload = Instant::now();
        let took = done - t;
        wrong.extend(f.verify(&plan, Some(Mode::Reload)).await.into_iter().map(|w| format!("change {i}: {w}")));
        if i >= ctx.warmup() {
            h.push_ms(took);
        }
    }
    if ctx.wants("fleet_reload") {
        let mut r = Row::repeated("fleet_reload", metric, &label, &h, Some(&floor_reload), "ms")
            .verified(&wrong)
            .goal_ratio(1.5);
        r.add_note("floor: one pod's direct reload apply of the same change, measured while the fleet is idle");
        rows.push(r);
    }
    Ok((floor_reload, rows))
}

/// `burst`: many reload-needing renders in a short span; reloads per pod against the pacing ideal.
async fn burst(ctx: &Ctx, f: &mut Fleet, floor_reload: &Samples) -> Result<Vec<Row>> {
    let (label, n) = (ctx.label.clone(), f.pods.len());
    let mut rows = Vec::new();

    let (renders, span) = if ctx.quick { (20usize, Duration::from_secs(2)) } else { (100, Duration::from_secs(10)) };
    let ideal = (span.as_secs_f64() / INTERVAL.as_secs_f64()).ceil() as u32 + 1;
    f.pacing_gap().await;
    let mut before = Vec::new();
    for p in &f.pods {
        before.push(p.reloads().await?);
    }
    let start = Instant::now();
    let step = span / renders as u32;
    let mut plan = String::new();
    for j in 0..renders {
        tokio::time::sleep_until((start + step * j as u32).into()).await;
        f.model.gen += 1;
        plan = f.write_render()?;
    }
    let last = Instant::now();
    let done = f.ctl.wait_converged(&plan, n, Duration::from_secs(90)).await?;
    f.last_reload = Instant::now();
    let conv = done - last;
    let mut counts = Vec::new();
    for (p, b) in f.pods.iter().zip(&before) {
        counts.push(p.reloads().await?.saturating_sub(*b));
    }
    let max = counts.iter().copied().max().unwrap_or(0);
    let mean = counts.iter().map(|c| f64::from(*c)).sum::<f64>() / counts.len().max(1) as f64;
    let wrong = f.verify(&plan, Some(Mode::Reload)).await;
    let mut r = Row::single("burst", "reloads per pod", &label, f64::from(max), Some(f64::from(ideal)), "reloads")
        .verified(&wrong)
        .goal_max(f64::from(ideal));
    r.add_note(format!(
        "{renders} reload-needing renders in {:.0} s, {n} pods, min interval 2s: max {max}, mean {mean:.1} reloads per pod",
        span.as_secs_f64()
    ));
    rows.push(r);
    let mut r =
        Row::single("burst", "last render -> converged", &label, conv.as_secs_f64() * 1e3, floor_reload.p50(), "ms")
            .verified(&wrong);
    r.add_note("floor: one pod's direct reload apply of the same config");
    rows.push(r);
    Ok(rows)
}

/// `traffic_under_churn`: bounded request loops through every pod while runtime and reload
/// changes deploy; every request must succeed.
async fn traffic_under_churn(ctx: &Ctx, f: &mut Fleet) -> Result<Row> {
    let (label, n) = (ctx.label.clone(), f.pods.len());

    let (runtime_changes, reload_changes) = if ctx.quick { (10usize, 2usize) } else { (100, 10) };
    let stop = Arc::new(AtomicBool::new(false));
    let max_per_pod: u64 = 200_000;
    let deadline = Instant::now() + Duration::from_secs(if ctx.quick { 60 } else { 300 });
    let mut loops = Vec::new();
    for p in &f.pods {
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], p.port));
        let stop = stop.clone();
        loops.push(tokio::spawn(async move {
            let (mut ok, mut failed, mut errors) = (0u64, 0u64, Vec::new());
            while !stop.load(Ordering::Relaxed) && ok + failed < max_per_pod && Instant::now() < deadline {
                match http_get(addr, "/").await {
                    Ok((200, body)) if body == "ok" => ok += 1,
                    other => {
                        failed += 1;
                        if errors.len() < 3 {
                            errors.push(format!("{addr}: {other:?}"));
                        }
                    }
                }
            }
            (ok, failed, errors)
        }));
    }
    let total_changes = runtime_changes + reload_changes;
    let every = total_changes / reload_changes.max(1);
    let mut wrong = Vec::new();
    let t = Instant::now();
    let mut k = 0;
    for j in 0..total_changes {
        let reload = (j + 1) % every == 0;
        if reload {
            f.model.gen += 1;
        } else {
            f.toggle(k % BE0_SERVERS);
            k += 1;
        }
        let plan = f.write_render()?;
        let res = f.ctl.wait_converged(&plan, n, Duration::from_secs(60)).await;
        if reload {
            f.last_reload = Instant::now();
        }
        if let Err(e) = res {
            wrong.push(format!("change {j}: {e}"));
            break;
        }
    }
    let churn = t.elapsed();
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut failed, mut errors) = (0u64, 0u64, Vec::new());
    for l in loops {
        let (o, fl, e) = l.await.map_err(|e| BenchError::Unexpected(format!("load loop: {e}")))?;
        ok += o;
        failed += fl;
        errors.extend(e);
    }
    let plan = f.desired().plan().to_string();
    wrong.extend(f.verify(&plan, None).await);
    if failed > 0 {
        wrong.push(format!(
            "{failed} failed requests, e.g. {}",
            errors.iter().take(3).cloned().collect::<Vec<_>>().join(" | ")
        ));
    }
    let mut r = Row::single("traffic_under_churn", "failed requests", &label, failed as f64, Some(0.0), "req")
        .verified(&wrong)
        .goal_max(0.0);
    r.add_note(format!(
        "{} requests through {n} pods while {runtime_changes} runtime + {reload_changes} reload changes deployed in {:.1} s",
        ok + failed,
        churn.as_secs_f64()
    ));
    Ok(r)
}

/// `footprint`: controller and agent RSS after the fleet cases.
fn footprint(ctx: &Ctx, f: &Fleet) -> Vec<Row> {
    let (label, n) = (ctx.label.clone(), f.pods.len());
    let mut rows = Vec::new();

    let pid = f.ctl.pid();
    let mut r = Row::single("footprint", "controller", &label, mib(rss(pid).unwrap_or(0)), None, "MiB");
    r.add_note(format!(
        "controller RSS with {n} pods after the fleet cases (peak {:.1} MiB); render {:.3} MiB",
        mib(peak(pid).unwrap_or(0)),
        mib(f.desired().total_bytes())
    ));
    rows.push(r);
    let agents: Vec<f64> = f.pods.iter().filter_map(|p| p.agent_pid().and_then(rss)).map(mib).collect();
    if !agents.is_empty() {
        let mut r = Row::single(
            "footprint",
            "fleet agent",
            &label,
            agents.iter().sum::<f64>() / agents.len() as f64,
            None,
            "MiB",
        );
        r.add_note("mean agent RSS in the fleet after the fleet cases");
        rows.push(r);
    }
    rows
}
