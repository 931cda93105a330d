//! `render_scale`: the render layer at growing sizes: Ingress paths over Services with ten
//! endpoints each, translated and rendered (`haptic_render::render`), against the floor of
//! parsing the rendered config once (`haptic_haproxy::cfg::parse`, which the gate and the plan
//! diff pay for every render anyway). Also checks that moving one endpoint re-renders into a
//! change the runtime claim takes as one server change, and at the largest size times that
//! change as the controller pays for it: the render and the diff of the two configs, once by a
//! whole render and once by the endpoint-only render ([`Incremental`], checked to give the whole
//! render's bytes). Pure CPU: no HAProxy, run once for all versions. It must never link the
//! controller crate.

use std::hint::black_box;
use std::sync::Arc;
use std::time::Instant;

use haptic_haproxy::cfg::parse;
use haptic_haproxy::claim::{diff_cfg, diff_indexed, CfgDiff, IndexedCfg, NewCfg};
use haptic_render::ingress::{Incremental, IngressInput, INGRESS_CONTROLLER};
use haptic_render::{render, Templates};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde_json::json;

use super::Ctx;
use crate::error::{BenchError, Result};
use crate::report::{linear_goal, Row};
use crate::stats::Samples;

/// Per-path cost may grow at most this much from the smallest to the largest size and still
/// count as linear (allowing for caches on a shared machine).
const LINEAR_SLACK: f64 = 2.0;
/// Paths per Ingress (one host each).
const PATHS_PER_INGRESS: usize = 10;
/// Endpoints per Service.
const ENDPOINTS: usize = 10;

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a well-formed object")
}

/// `paths` Ingress paths over `services` Services (ten endpoints each), under the class `haptic`.
fn input(paths: usize, services: usize) -> IngressInput {
    let class: IngressClass = from_json(json!({
        "metadata": {"name": "haptic"}, "spec": {"controller": INGRESS_CONTROLLER}
    }));
    let ingresses = (0..paths.div_ceil(PATHS_PER_INGRESS))
        .map(|i| {
            let paths: Vec<_> = (0..PATHS_PER_INGRESS)
                .map(|p| i * PATHS_PER_INGRESS + p)
                .take_while(|n| *n < paths)
                .map(|n| {
                    json!({"path": format!("/p{n}"), "pathType": "Prefix",
                           "backend": {"service": {"name": format!("svc-{}", n % services), "port": {"number": 80}}}})
                })
                .collect();
            Arc::new(from_json::<Ingress>(json!({
                "metadata": {"name": format!("ing-{i}"), "namespace": "bench",
                             "creationTimestamp": "2026-01-01T00:00:00Z"},
                "spec": {"ingressClassName": "haptic",
                         "rules": [{"host": format!("h{i}.example.com"), "http": {"paths": paths}}]}
            })))
        })
        .collect();
    let svcs = (0..services)
        .map(|s| {
            Arc::new(from_json::<Service>(json!({
                "metadata": {"name": format!("svc-{s}"), "namespace": "bench"},
                "spec": {"ports": [{"port": 80, "targetPort": 8080}]}
            })))
        })
        .collect();
    let slices = (0..services)
        .map(|s| {
            let eps: Vec<_> = (0..ENDPOINTS)
                .map(|e| {
                    json!({"addresses": [format!("10.{}.{}.{}", s / 250, s % 250, e + 1)],
                           "conditions": {"ready": true}})
                })
                .collect();
            Arc::new(from_json::<EndpointSlice>(json!({
                "metadata": {"name": format!("svc-{s}-1"), "namespace": "bench",
                             "labels": {"kubernetes.io/service-name": format!("svc-{s}")}},
                "addressType": "IPv4", "ports": [{"port": 8080}], "endpoints": eps
            })))
        })
        .collect();
    IngressInput { class, ingresses, services: svcs, endpoint_slices: slices, ..Default::default() }
}

fn cfg_of(r: &haptic_render::Render) -> String {
    String::from_utf8_lossy(&r.files["haproxy.cfg"]).into_owned()
}

/// Runs the render at every size.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let sizes: &[usize] = if ctx.quick { &[100, 1_000] } else { &[100, 1_000, 10_000] };
    let templates = Templates::default();
    let mut rows = Vec::new();
    let mut per_path = Vec::new();
    let mut diff_rows = Vec::new();
    for &paths in sizes {
        let services = paths.min(1_000);
        let mut inp = input(paths, services);
        let fail = |e: haptic_render::RenderError| BenchError::Unexpected(format!("render of {paths} paths: {e}"));
        // Warm-up, also deciding the repetitions: ≥ 20 below a second, else 5.
        let t = Instant::now();
        let first = render(&inp, &templates).map_err(fail)?;
        let reps = if t.elapsed().as_secs_f64() < 1.0 { ctx.reps() } else { 5 };
        let mut wrong: Vec<String> =
            first.verdicts.iter().filter(|v| !v.accepted()).map(|v| format!("refused: {v:?}")).collect();
        let old = cfg_of(&first);
        // One endpoint moves: the next render keeps every other endpoint in its slot, and the
        // runtime claim sees one server change.
        // Both renders plan against the slots of the first, as the controller plans against
        // the last slot map the pods acknowledged.
        inp.previous_slots = first.slots.clone();
        let before = inp.clone();
        let moved = &mut Arc::make_mut(&mut inp.endpoint_slices[services / 2]).endpoints[3].addresses[0];
        *moved = "10.255.0.1".into();
        let second = render(&inp, &templates).map_err(fail)?;
        let d = diff_cfg(&old, &cfg_of(&second));
        if !d.runtime_eligible() || d.servers.len() != 1 {
            wrong.push(format!(
                "one endpoint moved: {} server changes, reasons {:?}",
                d.servers.len(),
                d.reload_reasons
            ));
        }
        let (mut h, mut f, mut hd) = (Samples::new(), Samples::new(), Samples::new());
        for _ in 0..reps {
            let t = Instant::now();
            let r = black_box(render(black_box(&inp), &templates).map_err(fail)?);
            h.push_ms(t.elapsed());
            // What the controller pays per change: the render and its diff against the last one.
            let d = black_box(diff_cfg(&old, &cfg_of(&r)));
            hd.push_ms(t.elapsed());
            drop((r, d));
            let t = Instant::now();
            let c = black_box(parse(black_box(&old)));
            f.push_ms(t.elapsed());
            drop(c);
        }
        per_path.push(h.p50().unwrap_or(0.0) / paths as f64);
        let metric = format!("{paths} paths / {services} svc / {} ep", services * ENDPOINTS);
        let mut r = Row::repeated("render_scale", &metric, "none", &h, Some(&f), "ms").verified(&wrong);
        let bytes: usize = first.files.values().map(Vec::len).sum();
        r.add_note(format!(
            "{:.2} MiB rendered ({} files); {:.1} us per path",
            bytes as f64 / (1024.0 * 1024.0),
            first.files.len(),
            h.p50().unwrap_or(0.0) * 1000.0 / paths as f64
        ));
        rows.push(r);
        if paths == sizes[sizes.len() - 1] {
            let old_index = IndexedCfg::parse(&old);
            let changed = Change { before: &before, after: &inp, old: &old, old_index: &old_index, want: &second };
            let hi = incremental(&changed, &templates, reps, &mut wrong)?;
            let m = format!("{metric}: one endpoint moved, render + diff");
            let mut r = Row::repeated("render_scale", &m, "none", &hd, Some(&f), "ms").verified(&wrong);
            r.add_note("a whole render (not incremental) and the runtime claim's diff of the two configs");
            diff_rows.push(r);
            let m = format!("{metric}: one endpoint moved, incremental render + diff");
            let mut r = Row::repeated("render_scale", &m, "none", &hi, Some(&f), "ms").verified(&wrong);
            r.add_note(
                "the endpoint-only render (translation, maps and the config cut around its servers kept) and the controller's diff (the changed lines against its index of the last config), checked to equal the whole render",
            );
            diff_rows.push(r);
        }
    }
    linear_goal(&mut rows, &per_path, LINEAR_SLACK, "path");
    rows.extend(diff_rows);
    Ok(rows)
}

/// One endpoint moved: the input `before` and `after` it, the config rendered of `before`, and
/// the whole render of `after`.
struct Change<'a> {
    before: &'a IngressInput,
    after: &'a IngressInput,
    old: &'a str,
    /// `old` parsed and indexed by line, as the controller keeps its baseline's config.
    old_index: &'a IndexedCfg,
    want: &'a haptic_render::Render,
}

/// The diff the controller makes of a new config against its baseline's (`diff_cfg_cached`):
/// the changed lines compared against the kept index, and the index of the new config made for
/// the next change.
fn controller_diff(old_index: &IndexedCfg, old: &str, new: &str) -> (CfgDiff, IndexedCfg) {
    let (d, next) = diff_indexed(old_index, old, new);
    let next = match next {
        NewCfg::Parsed(p) => p,
        edits => {
            let mut p = old_index.clone();
            p.update(edits);
            p
        }
    };
    (d, next)
}

/// Times the endpoint-only render of `c.after` and its diff against `c.old`, as the controller
/// pays for them with an [`Incremental`] that last rendered `c.before` after an earlier endpoint
/// change; each render must reuse the translation, fill the kept skeleton and give the whole
/// render's bytes, verdicts and slots (else into `wrong`).
fn incremental(c: &Change<'_>, templates: &Templates, reps: usize, wrong: &mut Vec<String>) -> Result<Samples> {
    let fail = |e: haptic_render::RenderError| BenchError::Unexpected(format!("incremental render: {e}"));
    let mut samples = Samples::new();
    for _ in 0..reps {
        // The translation, then endpoint changes back and forth: the first runs the template
        // and cuts the skeleton, the next (timed) fill it, as a run of endpoint churn does.
        let mut inc = Incremental::new();
        for i in [c.before, c.after, c.before] {
            inc.render(i, templates).map_err(fail)?;
        }
        let t = Instant::now();
        let r = black_box(inc.render(black_box(c.after), templates).map_err(fail)?);
        let d = black_box(controller_diff(c.old_index, c.old, &cfg_of(&r)));
        samples.push_ms(t.elapsed());
        if !inc.reused() || !inc.filled() {
            wrong.push("the incremental render translated or ran the template again on an endpoint change".into());
        }
        if r != *c.want {
            wrong.push("the incremental render differs from the whole render".into());
        }
        if !d.0.runtime_eligible() || d.0.servers.len() != 1 {
            wrong.push(format!(
                "the controller's diff: {} server changes, {:?}",
                d.0.servers.len(),
                d.0.reload_reasons
            ));
        }
        drop((r, d));
    }
    wrong.dedup();
    Ok(samples)
}
