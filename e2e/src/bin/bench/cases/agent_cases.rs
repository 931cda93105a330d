//! Single-pod cases against one agent and a plain HAProxy floor side by side, interleaved
//! iteration by iteration so both see the same machine noise: `runtime_apply`, `reload_apply`
//! and `map_replace`. It must never time the verification read-backs.

use std::time::Instant;

use haptic_e2e::free_port;
use haptic_protocol::{Mode, Op, ReloadState, ServerSet};

use super::{BenchPod, Ctx};
use crate::error::{BenchError, Result};
use crate::floor::{description, durable_write, haproxy_check, map_transaction, server_addr, show_map, Plain};
use crate::report::Row;
use crate::stats::Samples;
use crate::workload::{map_text, rel, CfgModel, Desired};

/// The address server `be_0/s0` gets in iteration `i` (always a new one).
fn addr_for(i: usize) -> (String, u16) {
    (if i.is_multiple_of(2) { "127.0.0.2" } else { "127.0.0.3" }.to_string(), 10_000 + (i % 5000) as u16)
}

/// One agent pod and one plain HAProxy floor, each on its own frontend port, both loaded with
/// `model`'s config (and one more file, if given).
struct Rig {
    pod: BenchPod,
    d: Desired,
    plain: Plain,
    fmodel: CfgModel,
}

async fn rig(ctx: &Ctx, model: &CfgModel, extra: Option<(&str, String)>) -> Result<Rig> {
    let mut pod = BenchPod::start(ctx, "0s").await?;
    let mut d = Desired::new();
    d.set("haproxy.cfg", model.render());
    if let Some((name, text)) = &extra {
        d.set(name, text.clone());
    }
    pod.apply_complete(&d).await?;
    let mut fmodel = model.clone();
    fmodel.http_port = free_port();
    let cfg = fmodel.render();
    let mut files = vec![("haproxy.cfg", cfg.as_bytes())];
    if let Some((name, text)) = &extra {
        files.push((name, text.as_bytes()));
    }
    let plain = Plain::start(&ctx.bin, &files).await?;
    Ok(Rig { pod, d, plain, fmodel })
}

/// `runtime_apply`: one `server.set` through `/v1/apply` (HTTP → ACK) against the same `set
/// server` on the master CLI plus a durable write of the changed `haproxy.cfg` (goal ≤ 2×), and
/// against that `set server` alone, the bare socket (goal ≤ 5×).
pub async fn runtime_apply(ctx: &Ctx) -> Result<Vec<Row>> {
    let (backends, servers) = if ctx.quick { (20, 10) } else { (100, 10) };
    let mut model = CfgModel::new(free_port(), backends, servers);
    let Rig { mut pod, mut d, plain, mut fmodel } = rig(ctx, &model, None).await?;

    let (mut h, mut f, mut bare, mut wrong) = (Samples::new(), Samples::new(), Samples::new(), Vec::new());
    for i in 0..ctx.warmup() + ctx.reps() {
        let (ip, port) = addr_for(i);
        // haptic
        model.overrides.insert((0, 0), (ip.clone(), port));
        d.set("haproxy.cfg", model.render());
        let op = Op::ServerSet(ServerSet {
            backend: "be_0".into(),
            server: "s0".into(),
            addr: Some(ip.clone()),
            port: Some(port),
            weight: None,
            state: None,
        });
        let body = pod.body(&d, Mode::Runtime, false, |_| false, vec![vec![op]]);
        let (ack, took) = pod.timed_apply(body, &d).await?;
        if ack.mode != Mode::Runtime {
            wrong.push(format!("iteration {i}: landed as {} ({:?})", ack.mode, ack.reasons));
        }
        let got = server_addr(pod.pod.haproxy(), "be_0", "s0").await?;
        if got != (ip.clone(), port) {
            wrong.push(format!("iteration {i}: be_0/s0 is {got:?}, wanted {ip}:{port}"));
        }
        // floor
        fmodel.overrides.insert((0, 0), (ip.clone(), port));
        let text = fmodel.render();
        let t = Instant::now();
        let reply = plain.hap.worker_cmd(&format!("set server be_0/s0 addr {ip} port {port}")).await?;
        let socket_took = t.elapsed();
        durable_write(&plain.cfg(), text.as_bytes())?;
        let ftook = t.elapsed();
        if server_addr(&plain.hap, "be_0", "s0").await? != (ip.clone(), port) {
            return Err(BenchError::Unexpected(format!("floor: set server did not apply: {reply}")));
        }
        if i >= ctx.warmup() {
            h.push_ms(took);
            f.push_ms(ftook);
            bare.push_ms(socket_took);
        }
    }
    let metric = format!("{backends}x{servers}");
    let row = Row::repeated("runtime_apply", &metric, &ctx.label, &h, Some(&f), "ms").verified(&wrong).goal_ratio(2.0);
    let mut socket =
        Row::repeated("runtime_apply", &format!("{metric}, vs the bare socket"), &ctx.label, &h, Some(&bare), "ms")
            .verified(&wrong)
            .goal_ratio(5.0);
    socket.add_note("floor: the same `set server` on the master CLI alone, no durable write");
    Ok(vec![row, socket])
}

/// `reload_apply`: an apply needing a reload (500 backends × 10 servers) → ACK `done`, against a
/// durable write + `haproxy -c` + master CLI `reload` + verification done directly.
pub async fn reload_apply(ctx: &Ctx) -> Result<Vec<Row>> {
    let (backends, servers) = if ctx.quick { (100, 10) } else { (500, 10) };
    let mut model = CfgModel::new(free_port(), backends, servers);
    let Rig { mut pod, mut d, plain, mut fmodel } = rig(ctx, &model, None).await?;

    let (mut h, mut f, mut wrong) = (Samples::new(), Samples::new(), Vec::new());
    for i in 0..ctx.warmup() + ctx.reps() {
        let gen = i as u64 + 1;
        model.gen = gen;
        d.set("haproxy.cfg", model.render());
        let body = pod.body(&d, Mode::Reload, false, |_| false, vec![]);
        let (ack, took) = pod.timed_apply(body, &d).await?;
        if ack.mode != Mode::Reload || ack.reload.as_ref().map(|r| r.state) != Some(ReloadState::Done) {
            wrong.push(format!("iteration {i}: ACK mode {} reload {:?}", ack.mode, ack.reload));
        }
        let desc = description(pod.pod.haproxy()).await?;
        if desc != format!("cfggen={gen}") {
            wrong.push(format!("iteration {i}: worker runs {desc:?}, wanted cfggen={gen}"));
        }
        // floor
        fmodel.gen = gen;
        let text = fmodel.render();
        let t = Instant::now();
        durable_write(&plain.cfg(), text.as_bytes())?;
        haproxy_check(&ctx.bin.path, &plain.dir).await?;
        let outcome = plain.hap.reload_verified().await?;
        let ftook = t.elapsed();
        if !matches!(outcome, haptic_e2e::ReloadOutcome::Reloaded { .. })
            || description(&plain.hap).await? != format!("cfggen={gen}")
        {
            return Err(BenchError::Unexpected(format!("floor reload failed: {outcome:?}")));
        }
        if i >= ctx.warmup() {
            h.push_ms(took);
            f.push_ms(ftook);
        }
    }
    let row = Row::repeated("reload_apply", &format!("{backends}x{servers}"), &ctx.label, &h, Some(&f), "ms")
        .verified(&wrong)
        .goal_ratio(1.3);
    Ok(vec![row])
}

/// Compares a live map with the entries it should hold (order-insensitive).
fn map_mismatch(mut got: Vec<(String, String)>, want: &[(String, String)]) -> Option<String> {
    let mut want = want.to_vec();
    got.sort();
    want.sort();
    if got == want {
        return None;
    }
    let first = got.iter().zip(&want).find(|(a, b)| a != b);
    Some(format!("show map has {} entries (wanted {}), first difference {first:?}", got.len(), want.len()))
}

/// `map_replace`: `map.load` of a 100,000-entry map file against the same chunked `prepare` / `add map
/// @ver` / `commit map` sent straight to the socket.
pub async fn map_replace(ctx: &Ctx) -> Result<Vec<Row>> {
    let n = if ctx.quick { 10_000 } else { 100_000 };
    let name = "maps/hosts.map";
    let mut model = CfgModel::new(free_port(), 2, 2);
    model.map = Some(name.into());
    let Rig { mut pod, mut d, plain, .. } = rig(ctx, &model, Some((name, map_text(n, "v0_")))).await?;

    let (mut h, mut f, mut wrong) = (Samples::new(), Samples::new(), Vec::new());
    let reps = ctx.reps();
    for i in 0..ctx.warmup() + reps {
        let text = map_text(n, &format!("v{}_", i + 1));
        let entries = haptic_haproxy::cfg::parse_map_file(&text);
        d.set(name, text.clone());
        // The map travels once, as its file (API 1.1).
        let op = Op::MapLoad { path: rel(name) };
        let body = pod.body(&d, Mode::Runtime, false, |p| p == name, vec![vec![op]]);
        let (ack, took) = pod.timed_apply(body, &d).await?;
        if ack.mode != Mode::Runtime {
            wrong.push(format!("iteration {i}: landed as {} ({:?})", ack.mode, ack.reasons));
        }
        if let Some(m) = map_mismatch(show_map(pod.pod.haproxy(), name).await?, &entries) {
            wrong.push(format!("iteration {i}: {m}"));
        }
        // floor
        let t = Instant::now();
        map_transaction(&plain.hap, name, &entries).await?;
        let ftook = t.elapsed();
        if let Some(m) = map_mismatch(show_map(&plain.hap, name).await?, &entries) {
            return Err(BenchError::Unexpected(format!("floor map transaction: {m}")));
        }
        if i >= ctx.warmup() {
            h.push_ms(took);
            f.push_ms(ftook);
        }
    }
    let row = Row::repeated("map_replace", &format!("{n} entries"), &ctx.label, &h, Some(&f), "ms")
        .verified(&wrong)
        .goal_ratio(1.5);
    Ok(vec![row])
}
