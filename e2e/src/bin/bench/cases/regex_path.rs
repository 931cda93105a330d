//! `regex_path`: what the costliest regex path the render accepts costs real HAProxy against a
//! 4 KiB request path, next to a plain prefix lookup of the same path, paired in one run. Both
//! requests miss every route and are answered 404 by HAProxy itself, so the difference is the
//! regex map's work. The pattern is [`WORST`]: `.*` backtracks over the whole path and at every
//! dot the alternation is tried (the overlap rule of `haptic_haproxy::regex` refuses the
//! patterns that cost more than the path's length times the pattern's). It also checks that the
//! regex and the prefix route each serve a matching path. It must never link the controller
//! crate.

use std::net::SocketAddr;
use std::time::Instant;

use haptic_e2e::net::{free_port, http_request, Responder};
use haptic_e2e::process::{Haproxy, HaproxyOpts};
use haptic_render::ingress::{IngressInput, Settings, INGRESS_CONTROLLER};
use haptic_render::{render, Templates};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::{Ingress, IngressClass};
use serde_json::json;

use super::Ctx;
use crate::error::{BenchError, Result};
use crate::report::Row;
use crate::stats::Samples;

/// The costliest accepted regex path measured.
pub const WORST: &str = r"/.*\.(?:js|css|png|svg|woff)$";
/// Requests per sample (the sample is their mean).
const PER_SAMPLE: usize = 20;

fn from_json<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a well-formed object")
}

/// Host `r.example.com` with [`WORST`] under `use-regex`, host `p.example.com` with the prefix
/// `/p`, both to one Service on `port`.
fn input(http_port: u16, port: u16) -> IngressInput {
    let class: IngressClass =
        from_json(json!({"metadata": {"name": "haptic"}, "spec": {"controller": INGRESS_CONTROLLER}}));
    let backend = json!({"service": {"name": "web", "port": {"number": 80}}});
    let ing = |name: &str, host: &str, path: &str, regex: bool| -> Ingress {
        let ann = if regex { json!({"nginx.ingress.kubernetes.io/use-regex": "true"}) } else { json!({}) };
        from_json(json!({
            "metadata": {"name": name, "namespace": "bench", "annotations": ann},
            "spec": {"ingressClassName": "haptic", "rules": [{"host": host, "http": {"paths": [
                {"path": path, "pathType": "ImplementationSpecific", "backend": backend}]}}]}
        }))
    };
    let svc: Service = from_json(json!({
        "metadata": {"name": "web", "namespace": "bench"}, "spec": {"ports": [{"port": 80, "targetPort": 8080}]}
    }));
    let eps: EndpointSlice = from_json(json!({
        "metadata": {"name": "web-1", "namespace": "bench", "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4", "ports": [{"port": port}], "endpoints": [{"addresses": ["127.0.0.1"]}]
    }));
    IngressInput {
        class,
        ingresses: vec![
            ing("regex", "r.example.com", WORST, true).into(),
            ing("prefix", "p.example.com", "/p", false).into(),
        ],
        services: vec![svc.into()],
        endpoint_slices: vec![eps.into()],
        settings: Settings { bind_address: [127, 0, 0, 1].into(), http_port, min_slots: 1, ..Settings::default() },
        ..Default::default()
    }
}

fn get(host: &str, path: &str) -> String {
    format!("GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
}

/// One sample: the mean of [`PER_SAMPLE`] requests, each checked to answer `want`.
async fn sample(addr: SocketAddr, req: &str, want: u16, wrong: &mut Vec<String>) -> Result<std::time::Duration> {
    let t = Instant::now();
    for _ in 0..PER_SAMPLE {
        let (status, _) = http_request(addr, req)
            .await
            .map_err(|e| BenchError::Io { what: "regex_path request".into(), source: e })?;
        if status != want && wrong.len() < 3 {
            wrong.push(format!("{}: {status}, not {want}", req.lines().nth(1).unwrap_or_default()));
        }
    }
    Ok(t.elapsed() / PER_SAMPLE as u32)
}

/// Runs the case on `ctx`'s HAProxy.
pub async fn run(ctx: &Ctx) -> Result<Vec<Row>> {
    let web = Responder::start("web").await;
    let http_port = free_port();
    let r = render(&input(http_port, web.port), &Templates::default())
        .map_err(|e| BenchError::Unexpected(format!("render: {e}")))?;
    let mut wrong: Vec<String> = r.verdicts.iter().filter(|v| !v.accepted()).map(|v| format!("{v:?}")).collect();
    let dir = tempfile::tempdir().map_err(|e| BenchError::Io { what: "tempdir".into(), source: e })?;
    for (path, bytes) in &r.files {
        let p = dir.path().join(path);
        let io = |e| BenchError::Io { what: format!("write {}", p.display()), source: e };
        std::fs::create_dir_all(p.parent().unwrap_or(dir.path())).map_err(io)?;
        std::fs::write(&p, bytes).map_err(|e| BenchError::Io { what: format!("write {}", p.display()), source: e })?;
    }
    let _h = Haproxy::start(&ctx.bin, HaproxyOpts::new(dir.path())).await?;
    let addr = SocketAddr::from(([127, 0, 0, 1], http_port));
    // Both routes serve a matching path.
    sample(addr, &get("r.example.com", "/static/app.css"), 200, &mut wrong).await?;
    sample(addr, &get("p.example.com", "/p/x"), 200, &mut wrong).await?;
    // 4 KiB of `.cs`: a dot every third byte, each followed by a near-miss of `css`.
    let long = format!("/{}", ".cs".repeat(4095 / 3));
    let (slow, fast) = (get("r.example.com", &long), get("p.example.com", &long));
    let (mut h, mut f) = (Samples::new(), Samples::new());
    for i in 0..ctx.warmup() + ctx.reps() {
        let a = sample(addr, &slow, 404, &mut wrong).await?;
        let b = sample(addr, &fast, 404, &mut wrong).await?;
        if i >= ctx.warmup() {
            h.push_ms(a);
            f.push_ms(b);
        }
    }
    let mut row =
        Row::repeated("regex_path", "4 KiB path: worst accepted regex vs prefix", &ctx.label, &h, Some(&f), "ms")
            .verified(&wrong);
    row.add_note(format!("regex {WORST}; {} B path; {PER_SAMPLE} requests per sample; both answered 404", long.len()));
    Ok(vec![row])
}
