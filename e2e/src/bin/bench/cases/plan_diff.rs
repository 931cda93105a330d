//! `plan_diff`: the structural diff at the heart of the controller's plan diff
//! (`haptic_haproxy::claim::diff_cfg`) at growing sizes with one changed server, against the
//! floor of parsing the config once (`haptic_haproxy::cfg::parse`). It shows whether the cost
//! grows linearly. Pure CPU: no HAProxy, run once for all versions. It must never link the
//! controller crate.

use std::hint::black_box;
use std::time::Instant;

use haptic_haproxy::cfg::parse;
use haptic_haproxy::claim::diff_cfg;

use super::Ctx;
use crate::error::Result;
use crate::report::{linear_goal, Row};
use crate::stats::Samples;
use crate::workload::CfgModel;

/// Per-backend cost may grow at most this much from the smallest to the largest size and still
/// count as linear (allowing for caches on a shared machine).
const LINEAR_SLACK: f64 = 2.0;

/// Runs the diff at every size.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let sizes: &[usize] = if ctx.quick { &[200, 1_000, 5_000] } else { &[1_000, 10_000, 50_000] };
    let mut rows = Vec::new();
    let mut per_backend = Vec::new();
    for &backends in sizes {
        let mut model = CfgModel::new(8080, backends, 10);
        let old = model.render();
        model.overrides.insert((backends / 2, 5), ("127.0.0.9".into(), 8081));
        let new = model.render();
        // Warm-up, also deciding the repetitions: ≥ 20 below a second, else 5.
        let t = Instant::now();
        let d = diff_cfg(&old, &new);
        let reps = if t.elapsed().as_secs_f64() < 1.0 { ctx.reps() } else { 5 };
        let mut wrong = Vec::new();
        let want_backend = format!("be_{}", backends / 2);
        if !d.runtime_eligible()
            || d.servers.len() != 1
            || d.servers[0].backend != want_backend
            || d.servers[0].server != "s5"
            || d.servers[0].op().addr.as_deref() != Some("127.0.0.9")
        {
            wrong.push(format!("diff found {:?} / {:?}", d.servers.len(), d.reload_reasons));
        }
        let _ = black_box(parse(&old));
        let (mut h, mut f) = (Samples::new(), Samples::new());
        for _ in 0..reps {
            let t = Instant::now();
            let d = black_box(diff_cfg(black_box(&old), black_box(&new)));
            h.push_ms(t.elapsed());
            drop(d);
            let t = Instant::now();
            let c = black_box(parse(black_box(&old)));
            f.push_ms(t.elapsed());
            drop(c);
        }
        per_backend.push(h.p50().unwrap_or(0.0) / backends as f64);
        let mut r =
            Row::repeated("plan_diff", &format!("{}k x 10", backends as f64 / 1000.0), "none", &h, Some(&f), "ms")
                .verified(&wrong);
        r.add_note(format!(
            "{:.2} MiB config; {:.2} us per backend",
            old.len() as f64 / (1024.0 * 1024.0),
            h.p50().unwrap_or(0.0) * 1000.0 / backends as f64
        ));
        rows.push(r);
    }
    linear_goal(&mut rows, &per_backend, LINEAR_SLACK, "backend");
    Ok(rows)
}
