//! `new_backend` (HAProxy 3.4 only): a Service the pod has never served, i.e. a new backend
//! section with its servers and the map entry that routes a host to it, through `/v1/apply`
//! (`backend.add` + `map.load`: HTTP → ACK, no reload) against the same commands sent directly
//! on a plain HAProxy's master CLI (`add backend … from`, each `add server` as the agent makes
//! it, `publish backend`, the map transaction) plus a durable write of the two changed files.
//! It must never time the verification read-backs.

use std::time::Instant;

use haptic_e2e::free_port;
use haptic_haproxy::claim::diff_cfg;
use haptic_haproxy::cli::command;
use haptic_protocol::{BackendAdd, Mode, Op, RelPath};

use super::{BenchPod, Ctx};
use crate::error::{BenchError, Result};
use crate::floor::{durable_write, map_transaction, show_map, Plain};
use crate::report::Row;
use crate::stats::Samples;
use crate::workload::Desired;

const MAP: &str = "maps/hosts.map";
/// Servers per backend (the render's smallest slot count).
const SERVERS: usize = 4;

/// A config routing `host<i>.example` to `be_<i>` through [`MAP`], with `backends` backends of
/// [`SERVERS`] servers after a named `defaults` section; and its map.
fn routed(port: u16, backends: usize) -> (String, String) {
    let mut cfg = format!(
        "global\n    default-path config\n    stats timeout 30s\n\n\
         defaults haptic\n    mode http\n    timeout connect 5s\n    timeout client 10s\n    timeout server 10s\n\n\
         frontend fe_main\n    bind 127.0.0.1:{port}\n\
         \x20   http-request set-var(txn.be) req.hdr(host),lower,map({MAP},be_none)\n\
         \x20   use_backend %[var(txn.be)]\n\n\
         backend be_none\n    http-request return status 404\n"
    );
    let mut map = String::new();
    for b in 0..backends {
        cfg.push_str(&format!("\nbackend be_{b}\n"));
        for s in 0..SERVERS {
            cfg.push_str(&format!("    server SRV_{s} 127.0.0.1:{} weight 100\n", 10_000 + s));
        }
        map.push_str(&format!("host{b}.example be_{b}\n"));
    }
    (cfg, map)
}

/// Whether `hap` lists backend `name` and routes its host there.
async fn serves(hap: &haptic_e2e::process::Haproxy, b: usize) -> Result<bool> {
    let listed = hap.worker_cmd("show backend").await?;
    let routed =
        show_map(hap, MAP).await?.iter().any(|(k, v)| *k == format!("host{b}.example") && *v == format!("be_{b}"));
    Ok(listed.lines().any(|l| l == format!("be_{b}")) && routed)
}

/// The floor: the agent's commands for `add`, sent directly, then the map and the files.
async fn floor(plain: &Plain, add: &BackendAdd, cfg: &str, map: &str) -> Result<()> {
    let hap = &plain.hap;
    let (add_cmd, publish) = command::add_backend(add).map_err(|e| BenchError::Unexpected(e.to_string()))?;
    let expect = |what: &str, reply: String, want: &[&str]| {
        if want.iter().any(|w| reply.contains(w)) {
            Ok(())
        } else {
            Err(BenchError::Unexpected(format!("{what}: {reply}")))
        }
    };
    expect(
        &add_cmd,
        hap.master_cmd(&format!("experimental-mode on; @1 {add_cmd}")).await?,
        command::BACKEND_REGISTERED,
    )?;
    for s in &add.servers {
        for (i, cmd) in command::add_server(s).map_err(|e| BenchError::Unexpected(e.to_string()))?.iter().enumerate() {
            let reply = hap.worker_cmd(cmd).await?;
            if i == 0 {
                expect(cmd, reply, command::SERVER_REGISTERED)?;
            } else if !reply.trim().is_empty() {
                return Err(BenchError::Unexpected(format!("{cmd}: {reply}")));
            }
        }
    }
    expect(
        &publish,
        hap.master_cmd(&format!("experimental-mode on; @1 {publish}")).await?,
        command::BACKEND_PUBLISHED,
    )?;
    let entries = haptic_haproxy::cfg::parse_map_file(map);
    map_transaction(hap, MAP, &entries).await?;
    durable_write(&plain.cfg(), cfg.as_bytes())?;
    durable_write(&plain.dir.join(MAP), map.as_bytes())
}

/// `new_backend`: see the module. Goal ≤ 2× the direct commands (the agent adds the claim check,
/// the tree swap and the state it keeps).
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    if ctx.bin.version < (3, 4, 0) {
        return Ok(Vec::new());
    }
    let first = if ctx.quick { 20 } else { 100 };
    let mut pod = BenchPod::start(ctx, "0s").await?;
    let mut d = Desired::new();
    let pod_port = free_port();
    let (cfg, map) = routed(pod_port, first);
    d.set("haproxy.cfg", cfg.clone());
    d.set(MAP, map.clone());
    pod.apply_complete(&d).await?;
    let floor_port = free_port();
    let (fcfg, fmap) = routed(floor_port, first);
    let plain = Plain::start(&ctx.bin, &[("haproxy.cfg", fcfg.as_bytes()), (MAP, fmap.as_bytes())]).await?;

    let (mut h, mut f, mut wrong) = (Samples::new(), Samples::new(), Vec::new());
    let mut prev_cfg = cfg;
    for i in 0..ctx.warmup() + ctx.reps() {
        let n = first + i + 1;
        let (cfg, map) = routed(pod_port, n);
        let diff = diff_cfg(&prev_cfg, &cfg);
        let mut batch = diff.backend_ops();
        if diff.backends_added.len() != 1 || !diff.runtime_eligible() {
            return Err(BenchError::Unexpected(format!(
                "the new section is not one backend.add: {:?}",
                diff.reload_reasons
            )));
        }
        let add = diff.backends_added[0].clone();
        batch.push(Op::MapLoad { path: RelPath::new(MAP).map_err(|e| BenchError::Unexpected(e.to_string()))? });
        d.set("haproxy.cfg", cfg.clone());
        d.set(MAP, map.clone());
        let body = pod.body(&d, Mode::Runtime, false, |p| p == "haproxy.cfg" || p == MAP, vec![batch]);
        let (ack, took) = pod.timed_apply(body, &d).await?;
        if ack.mode != Mode::Runtime {
            wrong.push(format!("iteration {i}: landed as {} ({:?})", ack.mode, ack.reasons));
        }
        if !serves(pod.pod.haproxy(), n - 1).await? {
            wrong.push(format!("iteration {i}: be_{} not listed or not routed", n - 1));
        }
        prev_cfg = cfg;
        // floor
        let (fcfg, fmap) = routed(floor_port, n);
        let t = Instant::now();
        floor(&plain, &add, &fcfg, &fmap).await?;
        let ftook = t.elapsed();
        if !serves(&plain.hap, n - 1).await? {
            return Err(BenchError::Unexpected(format!("floor: be_{} not served", n - 1)));
        }
        if i >= ctx.warmup() {
            h.push_ms(took);
            f.push_ms(ftook);
        }
    }
    let metric = format!("{first} backends + 1, {SERVERS} servers");
    let mut row =
        Row::repeated("new_backend", &metric, &ctx.label, &h, Some(&f), "ms").verified(&wrong).goal_ratio(2.0);
    row.add_note("floor: add backend / add server / publish backend / the map transaction on the master CLI, plus a durable write of haproxy.cfg and the map");
    Ok(vec![row])
}
