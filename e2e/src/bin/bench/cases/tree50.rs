//! Cases over one pod holding a large tree (50 map files, 50 MB in all; the config loads none of
//! them, so changing one lands as `file_only`): the agent's memory footprint while the tree is
//! applied, `verify_state` against `sha256sum`, and `delta_transfer` against a full-state push.
//! It must never hold more than two copies of the tree in the bench itself.

use std::time::Instant;

use haptic_e2e::free_port;
use haptic_protocol::{FileEntry, Mode};

use super::{BenchPod, Ctx};
use crate::error::{BenchError, Result};
use crate::floor::sha256sum;
use crate::proc_mem::{mib, peak, reset_peak, rss};
use crate::report::Row;
use crate::stats::Samples;
use crate::workload::{filler_map, CfgModel, Desired};

fn sorted(mut v: Vec<FileEntry>) -> Vec<FileEntry> {
    v.sort_by(|a, b| a.path.as_str().cmp(b.path.as_str()));
    v
}

/// Runs whichever of `footprint` (agent part), `verify_state` and `delta_transfer` are wanted.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let (files, size) = if ctx.quick { (10, 256 * 1024) } else { (50, 1024 * 1024) };
    let mut rows = Vec::new();
    let model = CfgModel::new(free_port(), 2, 2);
    let mut d = Desired::new();
    d.set("haproxy.cfg", model.render());
    for i in 0..files {
        d.set(&format!("maps/m{i:02}.map"), filler_map(size, &format!("{i}")));
    }
    let tree_mib = mib(d.total_bytes());
    let mut pod = BenchPod::start(ctx, "0s").await?;
    let pid = pod.agent_pid().ok_or_else(|| BenchError::Unexpected("cannot find the agent's pid".into()))?;
    // The agent has answered /readyz; let its first probe settle before reading idle memory.
    let idle = rss(pid).unwrap_or(0);
    let reset = reset_peak(pid);
    let t = Instant::now();
    pod.apply_complete(&d).await?;
    let first_apply = t.elapsed();
    let peak_bytes = peak(pid).unwrap_or(0);
    if ctx.wants("footprint") {
        let mut r = Row::single("footprint", "agent_idle", &ctx.label, mib(idle), None, "MiB");
        r.add_note("RSS after start, before the first apply");
        rows.push(r);
        let floor = mib(idle + d.largest());
        let growth = peak_bytes.saturating_sub(idle);
        let mut r = Row::single("footprint", "agent_peak", &ctx.label, mib(peak_bytes), Some(floor), "MiB")
            .goal("peak - idle <= 2 x largest file", growth <= 2 * d.largest());
        r.add_note(format!(
            "complete apply of {files} files, {tree_mib:.0} MiB, largest {:.1} MiB, took {} ms; peak grew {:.1} MiB over idle{}",
            mib(d.largest()),
            first_apply.as_millis(),
            mib(growth),
            if reset { "" } else { " (peak not resettable: since start)" }
        ));
        rows.push(r);
    }
    let state = pod.api.state(true).await?;
    if sorted(state.files.clone()) != sorted(d.manifest()) {
        return Err(BenchError::Unexpected(
            "after the complete apply, the verified state differs from the tree".into(),
        ));
    }

    if ctx.wants("verify_state") {
        rows.push(verify_state(ctx, &pod, &d, files, tree_mib).await?);
    }
    if ctx.wants("delta_transfer") {
        rows.extend(delta_transfer(ctx, &mut pod, &mut d, files, size).await?);
    }
    Ok(rows)
}

/// `verify_state`: `GET /v1/state?verify` against `sha256sum` over the same live files.
async fn verify_state(ctx: &Ctx, pod: &BenchPod, d: &Desired, files: usize, tree_mib: f64) -> Result<Row> {
    let live = pod.pod.root().join("current");
    let names: Vec<String> = d.manifest().iter().map(|f| f.path.as_str().to_string()).collect();
    let (mut h, mut f, mut wrong) = (Samples::new(), Samples::new(), Vec::new());
    for i in 0..ctx.warmup() + ctx.reps() {
        let t = Instant::now();
        let st = pod.api.state(true).await?;
        let took = t.elapsed();
        if !st.verified || sorted(st.files) != sorted(d.manifest()) {
            wrong.push(format!("iteration {i}: verified={} or files differ from the tree", st.verified));
        }
        let t = Instant::now();
        let sums = sha256sum(&live, &names)?;
        let ftook = t.elapsed();
        for fe in d.manifest() {
            let want = fe.digest.hex();
            if !sums.iter().any(|(p, dg)| p == fe.path.as_str() && *dg == want) {
                return Err(BenchError::Unexpected(format!("sha256sum disagrees on {}", fe.path)));
            }
        }
        if i >= ctx.warmup() {
            h.push_ms(took);
            f.push_ms(ftook);
        }
    }
    Ok(Row::repeated("verify_state", &format!("{files} files, {tree_mib:.0} MiB"), &ctx.label, &h, Some(&f), "ms")
        .verified(&wrong)
        .goal_ratio(1.5))
}

/// `delta_transfer`: one changed file sent alone against the whole tree pushed as complete state.
async fn delta_transfer(ctx: &Ctx, pod: &mut BenchPod, d: &mut Desired, files: usize, size: usize) -> Result<Vec<Row>> {
    let (mut hb, mut fb, mut ht, mut ft, mut wrong) =
        (Samples::new(), Samples::new(), Samples::new(), Samples::new(), Vec::new());
    let reps = ctx.reps();
    for i in 0..ctx.warmup() + reps {
        // haptic: change one file, send only it.
        let path = format!("maps/m{:02}.map", i % files);
        d.set(&path, filler_map(size, &format!("d{i}")));
        let body = pod.body(d, Mode::FileOnly, false, |p| p == path, vec![]);
        let bytes = body.len();
        let t = Instant::now();
        let ack = pod.api.apply_raw(body).await?.ack()?;
        let took = t.elapsed();
        pod.current = Some(d.plan());
        if ack.mode != Mode::FileOnly {
            wrong.push(format!("delta {i}: landed as {} ({:?})", ack.mode, ack.reasons));
        }
        let st = pod.api.state(false).await?;
        if st.applied.as_ref().map(|a| a.plan_id) != Some(d.plan()) {
            wrong.push(format!("delta {i}: applied plan is not the desired one"));
        }
        // floor: the same kind of change, pushed as complete state.
        d.set(&path, filler_map(size, &format!("f{i}")));
        let body = pod.body(d, Mode::FileOnly, true, |_| true, vec![]);
        let fbytes = body.len();
        let t = Instant::now();
        let fack = pod.api.apply_raw(body).await?.ack()?;
        let ftook = t.elapsed();
        pod.current = Some(d.plan());
        if fack.applied != d.plan() {
            return Err(BenchError::Unexpected("full-state push did not land".into()));
        }
        if i >= ctx.warmup() {
            hb.push(mib(bytes as u64));
            fb.push(mib(fbytes as u64));
            ht.push_ms(took);
            ft.push_ms(ftook);
        }
    }
    let st = pod.api.state(true).await?;
    if sorted(st.files) != sorted(d.manifest()) {
        wrong.push("after the deltas, the verified tree differs from the desired one".into());
    }
    Ok(vec![
        Row::repeated("delta_transfer", "bytes on the wire", &ctx.label, &hb, Some(&fb), "MiB").verified(&wrong),
        Row::repeated("delta_transfer", "time to ACK", &ctx.label, &ht, Some(&ft), "ms").verified(&wrong),
    ])
}
